"""One resource rule at every edge (issue 33, items 3 and 5): every count, size, depth and number
is checked where it enters, the message names the limit, and every failure is exit 2 with one
line — never a traceback, a hang or unbounded memory.

Three layers: in-process cases of each class (argv flags, model configs, YAML job files, model
names, output paths), ``main``'s last resort for what no reader refuses by name, and subprocess
cases under a memory limit (``RLIMIT_AS``) and a timeout for what only a real process shows
(memory blow-ups, Ctrl-C, an ASCII terminal, a full disk, a missing extra). The generated sweep
over every typed option of every subcommand is ``@pytest.mark.slow``; a fixed subset runs by
default.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.fuzz.test_fuzz_cli import SUBPARSERS, assert_clean, run

from memfit.cli import entry
from memfit.cli import models as cli_models
from memfit.errors import ModelConfigError, SpecError
from memfit.models.model_spec import COUNT_LIMITS, ModelSpec
from memfit.spec import VllmConfig
from memfit.spec.rules import MAX_GPUS, MAX_MODEL_LAYERS, MAX_RUN_STEPS
from memfit.spec.seqrun import StepPlan

LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "num_hidden_layers": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "torch_dtype": "bfloat16",
}
#: (file name, keys over the small llama config, a word the refusal must hold)
CONFIGS: list[tuple[str, dict[str, Any], str]] = [
    ("layers-1e9.json", {"num_hidden_layers": 10**9}, "MAX_MODEL_LAYERS"),
    ("layers-4e6.json", {"num_hidden_layers": 4 * 10**6}, "MAX_MODEL_LAYERS"),
    (
        "heads.json",
        {"hidden_size": 2**30, "num_attention_heads": 2**30, "num_key_value_heads": 2**30},
        "MAX_HEADS",
    ),
    ("vocab.json", {"vocab_size": 2**31 - 1}, "MAX_VOCAB"),
    (
        "experts.json",
        {"model_type": "mixtral", "num_local_experts": 10**9, "num_experts_per_tok": 2},
        "MAX_EXPERTS",
    ),
    ("dtype.json", {"torch_dtype": "float1024"}, "not a torch dtype"),
    ("rope.json", {"rope_scaling": {"type": "nosuch", "factor": 2.0}}, "not a RoPE type"),
    ("rope-str.json", {"rope_scaling": "linear"}, "must be a mapping"),
    ("text-config.json", {"text_config": "hello"}, "text_config"),
]


def _yaml_bomb() -> str:
    lines = ['a: &a ["x","x","x","x","x","x","x","x","x"]']
    for prev, name in zip("abcdefgh", "bcdefghi", strict=True):
        lines.append(f"{name}: &{name} [{','.join(['*' + prev] * 9)}]")
    return "\n".join(lines) + "\nper_device_train_batch_size: 1\nmodel_name_or_path: gpt2\n"


HF_HEAD = "per_device_train_batch_size: 1\nmodel_name_or_path: gpt2\n"
#: (file name, text, a word the refusal must hold; None: any clean exit)
JOB_FILES: list[tuple[str, str, str | None]] = [
    ("bomb.yaml", _yaml_bomb(), "MAX_YAML_NODES"),
    ("deep-100.yaml", HF_HEAD + "x: " + "[" * 100 + "]" * 100 + "\n", "MAX_YAML_DEPTH"),
    ("deep-1000.yaml", HF_HEAD + "x: " + "[" * 1000 + "]" * 1000 + "\n", "YAML"),
    ("aliases.yaml", HF_HEAD + "s: &s 1\nl: [" + ", ".join(["*s"] * 10_001) + "]\n", "ALIASES"),
    ("cycle.yaml", HF_HEAD + "c: &c [*c]\n", "MAX_YAML_NODES"),
    ("mixed-keys.yaml", HF_HEAD + "1: a\nnull: b\n[1, 2]: c\n", None),
    ("ds-auto.json", '{"zero_optimization": "auto", "train_micro_batch_size_per_gpu": 1}', None),
    ("vllm-2mb.txt", "vllm serve gpt2 --x " + "a" * 2_000_000 + "\n", "MAX_COMMAND_CHARS"),
]


class Hostile:
    def __init__(self, root: Path) -> None:
        self.root = root
        for name, keys, _ in CONFIGS:
            (root / name).write_text(json.dumps({**LLAMA, **keys}))
        for name, text, _ in JOB_FILES:
            (root / name).write_text(text)
        (root / "bigint.json").write_text(
            '{"model_type": "llama", "num_hidden_layers": 9' + "9" * 5000 + "}"
        )
        (root / "big-scalar.yaml").write_text(HF_HEAD + "x: " + "a" * 2_000_000 + "\n")

    def __call__(self, name: str) -> str:
        return str(self.root / name)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Hostile:
    return Hostile(tmp_path_factory.mktemp("hostile"))


def refused(argv: list[str], word: str, capsys: pytest.CaptureFixture[str]) -> str:
    rc, out, err = run(argv, capsys)
    assert_clean(rc, out, err, argv)
    assert rc == 2, (argv, rc, out[-300:], err)
    assert word in err, (argv, err)
    assert len(err) < 1200, (argv, len(err))  # a refused value is quoted cut, not in full
    return err


# -- counts and numbers on the command line --------------------------------------------------
FLAG_CASES: list[tuple[str, str]] = [
    ("vllm gpt2 --gpu H100 --pipeline-parallel-size 2147483648", "MAX_GPUS"),
    ("vllm gpt2 --gpu H100 --tensor-parallel-size 99999999", "MAX_GPUS"),
    ("vllm gpt2 --gpu H100 --gpus 70000", "MAX_GPUS"),
    ("vllm gpt2 --gpu H100 --pp 1e20", "whole number"),
    ("vllm gpt2 --gpu H100 --cpu-offload-gb nan", "finite"),
    ("vllm gpt2 --gpu H100 --gpu-memory-utilization inf", "finite"),
    ("vllm gpt2 --gpu H100 --gpu-memory-utilization 1e400", "finite"),
    ("web --port 70000", "port"),
    ("web --port 0", "1 or more"),
    ("estimate gpt2 --engine analytic --seq-dist 1,1,inf", "finite"),
    ("estimate gpt2 --engine analytic --seq-dist nan,1,100", "finite"),
    ("estimate gpt2 --seq-dist 300,100,1024 --run-steps 1000000000", "MAX_RUN_STEPS"),
    ("plan gpt2 --gpu L4 --headroom inf", "--headroom"),
    ("plan gpt2 --gpu L4 --headroom nan%", "--headroom"),
    ("upgrade gpt2 --gpu L4 --throughput-target=-inf", "finite"),
    ("monitor --interval nan -- true", "finite"),
    ("estimate gpt2 --seq " + "1" + "0" * 5000, "at most 40 digits"),
    ("estimate gpt2 --batch -" + "9" * 4400, "at most 40 digits"),
    ("check x.yaml --seq " + "9" * 41, "at most 40 digits"),
]


@pytest.mark.parametrize(("line", "word"), FLAG_CASES, ids=[c[0][:50] for c in FLAG_CASES])
def test_a_count_or_number_past_its_limit_is_refused_naming_the_limit(
    line: str, word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    refused(line.split(), word, capsys)


def test_a_huge_integer_is_quoted_cut_not_echoed_in_full(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(["estimate", "gpt2", "--seq", "7" * 5000], "5,000 characters", capsys)
    assert "7" * 100 not in err


# -- model configs: the config reader's problems list ----------------------------------------
@pytest.mark.parametrize(("name", "keys", "word"), CONFIGS, ids=[c[0] for c in CONFIGS])
def test_a_config_past_a_limit_or_of_an_unknown_kind_is_refused_by_every_command(
    name: str, keys: dict[str, Any], word: str, hostile: Hostile, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ["estimate", hostile(name), "--engine", "analytic"],
        ["vllm", hostile(name), "--gpu", "H100"],
    ):
        started = time.monotonic()
        refused(argv, word, capsys)
        assert time.monotonic() - started < 20, argv  # refused before any engine loops


@pytest.mark.parametrize("field", sorted(COUNT_LIMITS))
def test_each_model_count_limit_is_checked_and_named(field: str) -> None:
    upper, rule = COUNT_LIMITS[field]
    spec = ModelSpec.from_config(LLAMA)
    values = {f: getattr(spec, f) for f in ("hidden_size", "n_layers", "n_heads", "vocab_size")}
    with pytest.raises(SpecError, match=rf"{field} \({upper + 1:,}\) .*at most {upper:,} .*{rule}"):
        ModelSpec(model_type="llama", **{**values, field: upper + 1})


def test_a_model_at_the_layer_limit_is_read() -> None:
    spec = ModelSpec.from_config({**LLAMA, "num_hidden_layers": MAX_MODEL_LAYERS})
    assert spec.n_layers == MAX_MODEL_LAYERS
    with pytest.raises(ModelConfigError, match="num_hidden_layers .*MAX_MODEL_LAYERS"):
        ModelSpec.from_config({**LLAMA, "num_hidden_layers": MAX_MODEL_LAYERS + 1})


def test_the_library_refuses_the_same_limits_as_the_flags() -> None:
    with pytest.raises(SpecError, match="MAX_GPUS"):
        VllmConfig(pipeline_parallel_size=MAX_GPUS + 1)
    with pytest.raises(SpecError, match="finite"):
        VllmConfig(cpu_offload_gb=float("nan"))
    with pytest.raises(SpecError, match="--run-steps"):
        StepPlan(batch_size=1, n_steps=MAX_RUN_STEPS + 1)
    with pytest.raises(SpecError, match="samples replayed"):
        StepPlan(batch_size=1 << 20, n_steps=100)


def test_a_config_with_a_5000_digit_integer_is_refused_by_its_reader(
    hostile: Hostile, capsys: pytest.CaptureFixture[str]
) -> None:
    refused(["estimate", hostile("bigint.json"), "--engine", "analytic"], "digits", capsys)


# -- YAML and command job files ---------------------------------------------------------------
@pytest.mark.parametrize(("name", "text", "word"), JOB_FILES, ids=[c[0] for c in JOB_FILES])
def test_a_hostile_job_file_is_refused_or_read_in_bounded_time(
    name: str, text: str, word: str | None, hostile: Hostile, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["check", hostile(name), "--gpu", "L4", "--seq", "128"]
    started = time.monotonic()
    if word is None:
        rc, out, err = run(argv, capsys)
        assert_clean(rc, out, err, argv)
    else:
        refused(argv, word, capsys)
    assert time.monotonic() - started < 20, argv


def test_a_2_mb_yaml_job_file_is_read_in_linear_time(
    hostile: Hostile, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["check", hostile("big-scalar.yaml"), "--gpu", "L4", "--seq", "128"]
    started = time.monotonic()
    rc, out, err = run(argv, capsys)
    assert_clean(rc, out, err, argv)
    assert time.monotonic() - started < 20  # shlex over the whole text took 56 s


# -- names and paths the OS refuses -----------------------------------------------------------
NAME_CASES = [
    ("a" * 300, "unknown model"),
    ("org/" + "a" * 300, "unknown model"),
    ("~nosuchuser-memfit/x", "no user"),
]


@pytest.mark.parametrize(("model", "word"), NAME_CASES, ids=["300-chars", "org-300", "~user"])
def test_a_model_name_the_os_cannot_look_up_is_refused_in_one_line(
    model: str, word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    refused(["estimate", model, "--engine", "analytic"], word, capsys)


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="Linux /proc")
def test_a_kernel_file_as_the_model_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, out, err = run(["estimate", "/proc/self/mem", "--engine", "analytic"], capsys)
    assert_clean(rc, out, err, ["/proc/self/mem"])
    assert rc == 2


def test_a_report_to_dev_full_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["estimate", "gpt2", "--engine", "analytic", "--html", "/dev/full"]
    rc, out, err = run(argv, capsys)
    assert_clean(rc, out, err, argv)
    assert rc == 2


def test_a_read_only_job_file_with_write_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "train.yaml"
    job.write_text(HF_HEAD + "max_length: 4096\nper_device_train_batch_size: 64\n")
    job.chmod(0o444)
    argv = ["check", str(job), "--gpu", "T4", "--write"]
    rc, out, err = run(argv, capsys)
    assert_clean(rc, out, err, argv)
    assert job.read_text().startswith(HF_HEAD)


# -- main's last resort: one line for what no reader refuses by name --------------------------
# (the command is replaced in its module: main registers a command's handler from its module
# when it runs it, memfit.cli.entry.COMMAND_MODULES)
def _raising(exc: BaseException) -> Any:
    def command(_args: argparse.Namespace) -> int:
        raise exc

    return command


LAST_RESORT: list[tuple[BaseException, int, str]] = [
    (OSError(28, "No space left on device"), 2, "No space left on device (errno 28)"),
    (PermissionError(13, "Permission denied", "/x/out.html"), 2, "Permission denied: /x/out.html"),
    (RecursionError("maximum recursion depth exceeded"), 2, "nests too deeply"),
    (ModuleNotFoundError("No module named 'torch'", name="torch"), 2, "memfit[trace]"),
    (ModuleNotFoundError("No module named 'diffusers'", name="diffusers"), 2, "memfit[diffusion]"),
    (ValueError("Exceeds the limit (4300 digits)"), 2, "4300 digits"),
    (ZeroDivisionError("division by zero"), 2, "internal error: ZeroDivisionError"),
]


@pytest.mark.parametrize(
    ("exc", "code", "word"), LAST_RESORT, ids=[type(c[0]).__name__ for c in LAST_RESORT]
)
def test_main_turns_what_no_reader_refused_into_one_line_and_exit_2(
    exc: BaseException,
    code: int,
    word: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.delenv("MEMFIT_DEBUG")
    monkeypatch.setattr(cli_models, "cmd_models", _raising(exc))
    assert entry.main(["models"]) == code
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and err.startswith("memfit: error: "), err
    assert word in err and "Traceback" not in err
    if isinstance(exc, ZeroDivisionError):
        assert "bug in memfit" in err and "MEMFIT_DEBUG=1" in err


def test_memfit_debug_lets_an_unexpected_exception_raise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_models, "cmd_models", _raising(ZeroDivisionError("x")))
    with pytest.raises(ZeroDivisionError):
        entry.main(["models"])  # the fuzz conftest sets MEMFIT_DEBUG=1


def test_ctrl_c_exits_130_with_nothing_printed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(cli_models, "cmd_models", _raising(KeyboardInterrupt()))
    assert entry.main(["models"]) == 130
    assert capsys.readouterr().err == ""


# -- real processes: memory and time bounds, signals, terminals, disks --------------------------
MEMORY_LIMIT_BYTES = 3 * 1024**3  # the cases that took 6 to 16.6 GB before their limits


def memfit_process(
    args: list[str], *, env: dict[str, str] | None = None, prelude: str = "", **kw: Any
) -> subprocess.Popen[str]:
    """``python -m memfit ARGS`` (after ``prelude``) in this checkout, under RLIMIT_AS."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))

    code = f"{prelude}\nimport runpy, sys\nsys.argv = ['memfit', *sys.argv[1:]]\n"
    code += "runpy.run_module('memfit', run_name='__main__')"
    src = str(Path(__file__).resolve().parents[2] / "src")
    full_env = {**os.environ, "PYTHONPATH": src, **(env or {})}
    full_env.pop("MEMFIT_DEBUG", None)
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=full_env,
        preexec_fn=limit,
        text=True,
        stdout=kw.pop("stdout", subprocess.PIPE),
        stderr=subprocess.PIPE,
        **kw,
    )


def finished(proc: subprocess.Popen[str], timeout_s: float = 60) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, out or "", err


def assert_one_line(rc: int, err: str, word: str) -> None:
    assert rc == 2, (rc, err[-500:])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("memfit: error:"), err[-800:]
    assert word in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "word"),
    [
        (["vllm", "{layers-1e9.json}", "--gpu", "H100"], "MAX_MODEL_LAYERS"),
        (["check", "{bomb.yaml}", "--gpu", "L4", "--seq", "512"], "MAX_YAML_NODES"),
    ],
    ids=["vllm-1e9-layers", "check-yaml-bomb"],
)
def test_what_took_gigabytes_is_refused_under_a_3_gb_limit(
    args: list[str], word: str, hostile: Hostile
) -> None:
    argv = [hostile(a[1:-1]) if a.startswith("{") else a for a in args]
    assert_one_line(*finished(memfit_process(argv))[::2], word)


def test_ctrl_c_in_a_real_run_exits_130_without_a_traceback() -> None:
    # a command that says it is running, then works until interrupted: the signal lands inside
    # main() every time, whatever the machine's load
    # (SIGINT restored to Python's handler: a test run started in the background by a
    # non-interactive shell inherits SIGINT ignored, which a user's terminal never does)
    prelude = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import sys, time, memfit.cli.models as m\n"
        "def busy(_args):\n"
        "    print('running', flush=True)\n"
        "    time.sleep(120)\n"
        "m.cmd_models = busy"
    )
    proc = memfit_process(["models"], prelude=prelude)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "running"
    proc.send_signal(signal.SIGINT)
    rc, _out, err = finished(proc)
    assert rc == 130, (rc, err[-500:])
    assert err == "", err[-500:]


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"}, {"LANG": "C", "LC_ALL": "C"}])
def test_an_ascii_terminal_gets_the_table_not_a_unicode_error(env: dict[str, str]) -> None:
    proc = memfit_process(["estimate", "gpt2", "--engine", "analytic", "--gpu", "L4"], env=env)
    rc, out, err = finished(proc)
    assert rc == 0, err[-500:]
    assert "batch 1" in out and "Traceback" not in err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_json_to_a_full_disk_is_one_line_and_exit_2() -> None:
    with open("/dev/full", "w") as full:
        proc = memfit_process(["estimate", "gpt2", "--engine", "analytic", "--json"], stdout=full)
        rc, _out, err = finished(proc)
    assert_one_line(rc, err, "No space left on device")
    assert "Exception ignored" not in err


def test_a_missing_torch_names_the_extra_to_install() -> None:
    proc = memfit_process(
        ["estimate", "flux.1-dev", "--mode", "infer"],
        prelude="import sys; sys.modules['torch'] = None",  # import torch -> ModuleNotFoundError
    )
    rc, _out, err = finished(proc)
    assert_one_line(rc, err, "pip install 'memfit[diffusion]'")  # a pipeline: torch + diffusers


# -- the generated sweep: every typed option of every subcommand, hostile numbers ---------------
HOSTILE_NUMBERS = ["inf", "-inf", "nan", "1e400", "-1e400", "1" + "0" * 4400, "-" + "9" * 30]
HOSTILE_NUMBERS += ["0x10", "1_0", " 7", "", "٣", "1e3", str(2**63), str(2**31), "-0"]
TYPED = ("integer", "positive_int", "non_negative_int", "count_at_most", "port", "finite_float")


def _typed_options() -> list[tuple[str, str]]:
    out = []
    for name, sub in sorted(SUBPARSERS.items()):
        for action in sub._actions:
            if action.option_strings and getattr(action.type, "__name__", "") in TYPED:
                out.append((name, action.option_strings[-1]))
    return out


TYPED_OPTIONS = _typed_options()


def _parses_or_exits_2(name: str, flag: str, value: str) -> None:
    parser = entry.build_parser()
    try:
        positional = [] if name in ("web", "gpus", "models") else ["x"]
        parser.parse_args([name, f"{flag}={value}", *positional])  # before a REMAINDER
    except SystemExit as exc:
        assert exc.code == 2, (name, flag, value, exc.code)


def test_every_typed_option_refuses_a_non_finite_or_huge_number_by_argparse(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert len(TYPED_OPTIONS) > 20  # the sweep reaches the options, not an empty list
    for name, flag in TYPED_OPTIONS:
        for value in ("inf", "nan", "1" + "0" * 4400):
            _parses_or_exits_2(name, flag, value)
            err = capsys.readouterr().err
            assert err.count("memfit: error:") == 1 and len(err) < 600, (name, flag, value, err)


@pytest.mark.slow
def test_the_full_sweep_of_typed_options_and_hostile_numbers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cases = 0
    for name, flag in TYPED_OPTIONS:
        for value in HOSTILE_NUMBERS:
            _parses_or_exits_2(name, flag, value)
            err = capsys.readouterr().err
            assert "Traceback" not in err and len(err) < 600, (name, flag, value, err)
            cases += 1
    assert cases == len(TYPED_OPTIONS) * len(HOSTILE_NUMBERS)
