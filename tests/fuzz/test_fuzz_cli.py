"""argv fuzzing of every subcommand through ``memfit.cli.entry`` in-process.

Two layers: the issue's cases (issue 17) as explicit seeds with the exact exit code and a word of
the message each must give, then hypothesis-generated command lines for every subcommand built
from the parser itself (its options, their choices and types), each of which must end with exit
0, 1 or 2, a single ``memfit: error:`` line on stderr for 2, and never an unexpected exception.
"""

from __future__ import annotations

import argparse
import traceback
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.fuzz.conftest import Files, run_log_reader_is_bounded

from memfit.cli import main
from memfit.cli.entry import build_parser


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """(exit code, stdout, stderr); an exception other than SystemExit fails with its trace."""
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors and --help
        rc = exc.code if isinstance(exc.code, int) else 2
    except BaseException:
        pytest.fail(f"memfit {' '.join(argv)!r} raised:\n{traceback.format_exc()}")
    out, err = capsys.readouterr()
    return rc, out, err


def assert_clean(rc: int, out: str, err: str, argv: list[str]) -> None:
    assert rc in (0, 1, 2), (argv, rc, err)
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    assert "internal error" not in err, (argv, err)  # main's last resort: a memfit bug
    if rc == 2 and err.strip():
        errors = [line for line in err.splitlines() if line.startswith("memfit: error:")]
        assert len(errors) == 1, (argv, err)


# -- the issue's cases, each with its exit code and a word of its message -------------------------
SEEDS: list[tuple[str, int, str]] = [
    ("plan gpt2 --gpu L4 --alternatives -1", 2, "--alternatives"),
    ("estimate gpt2 --top -5", 2, "--top"),
    ("estimate gpt2 --lora-rank 8 --lora-targets nope", 2, "match no linear module"),
    ("fit gpt2 --gpu L4 --solve batch --lora-rank 8 --lora-targets nope", 2, "no linear module"),
    (f"estimate gpt2 --lora-rank {10**30}", 2, "wider than any model"),
    ("plan gpt2 --gpu L4 --mode infer --lora-rank 8", 2, "training technique"),
    ("estimate code:interact", 2, "--allow-code"),
    ("estimate builtins:breakpoint", 2, "--allow-code"),
    ("plan code:interact --gpu L4", 2, "--allow-code"),
    ("fit code:interact --gpu L4 --solve batch", 2, "--allow-code"),
    ("upgrade code:interact --gpu L4", 2, "--allow-code"),
    ("doctor code:interact --gpu L4", 2, "--allow-code"),
    ("bench --device tpu", 2, "device ('tpu')"),
    ("bench tiny-opt -o /nonexistent-folder/out.json --device cpu", 2, "does not exist"),
    ("estimate gpt2 --batch 0", 2, "batch_size"),
    ("estimate gpt2 --seq 99999999999", 2, "seq_len"),
    ("estimate gpt2 --gpu no-such-gpu", 2, "no-such-gpu"),
    ("snapshot /nonexistent.pickle", 2, "/nonexistent.pickle"),
]


@pytest.mark.parametrize(("line", "code", "word"), SEEDS, ids=[s[0][:60] for s in SEEDS])
def test_the_issues_cases_exit_with_their_code_and_message(
    line: str, code: int, word: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = line.split()
    rc, out, err = run(argv, capsys)
    assert_clean(rc, out, err, argv)
    assert rc == code, (line, rc, out[-300:], err)
    assert word in err, (line, err)


FILE_COMMANDS = [
    ("estimate", "{path} --engine analytic"),
    ("plan", "{path} --gpu L4 --confirm none"),
    ("fit", "{path} --gpu L4 --solve batch"),
    ("doctor", "{path} --gpu L4"),
    ("upgrade", "{path} --gpu L4"),
    ("snapshot", "{path}"),
    ("report-estimate", "report {log} --estimate {path}"),
    ("diagnose", "diagnose {path}"),
    ("report", "report {path}"),
]


@pytest.mark.parametrize(("name", "template"), FILE_COMMANDS, ids=[c[0] for c in FILE_COMMANDS])
def test_every_file_argument_refuses_fifos_devices_and_junk_with_exit_2(
    name: str, template: str, files: Files, tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    if name in ("diagnose", "report") and not run_log_reader_is_bounded():
        pytest.skip("the run-log reader is the monitor lane's; it is bounded once merged")
    log = tmp_path / "run.jsonl"
    log.write_text('{"type": "start", "t": 0}\n')
    for path in files.all():
        line = template.format(path=path, log=log)
        argv = line.split() if line.split()[0] in ("report", "diagnose") else [name, *line.split()]
        rc, out, err = run(argv, capsys)
        assert_clean(rc, out, err, argv)
        assert rc == 2, (argv, rc, out[-300:], err)


# -- generated command lines for every subcommand ------------------------------------------------
MODELS = ["gpt2", "opt-125m", "llama-3.2-1b", "GPT2", "nope-model", "org/name", "code:interact", ""]
TEXTS = ["", "0", "-1", "x", "1e9", "nan", "L4", "H100", "q,v", "all-linear", "24GB", "5%", "abc,"]
FLOATS = ["0.5", "0", "-1", "inf", "-inf", "nan", "1e400", "1e308", "0.9", "1" + "0" * 400]
INTS = st.one_of(
    st.integers(-3, 70), st.sampled_from([0, 2**31, 2**63, 10**30, -(2**40)]), st.just(4096)
)
#: Subcommands whose positionals are files or a child command (not a MODEL).
POSITIONALS: dict[str, Any] = {
    "snapshot": st.sampled_from(["/nonexistent.pickle", "/tmp"]),
    "report": st.sampled_from(["/nonexistent.jsonl"]),
    "diagnose": st.sampled_from(["/nonexistent.jsonl"]),
    "monitor": st.just("--"),
}
#: Options whose value is a path the command would write or read: only harmless ones.
PATH_OPTIONS = {"--log", "--report", "--png", "--md", "--output", "-o", "--estimate", "--html"}


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


SUBPARSERS = _subparsers()


def _value(action: argparse.Action) -> st.SearchStrategy[str]:
    if action.choices:
        return st.one_of(st.sampled_from([str(c) for c in action.choices]), st.sampled_from(TEXTS))
    if set(action.option_strings) & PATH_OPTIONS:
        return st.sampled_from(["/nonexistent-folder/x", "/tmp"])
    if action.type in (int,) or getattr(action.type, "__name__", "") in (
        "integer",
        "positive_int",
        "non_negative_int",
        "count_at_most",
        "port",
    ):
        return st.one_of(INTS.map(str), st.sampled_from(TEXTS))
    if getattr(action.type, "__name__", "") == "finite_float":
        return st.one_of(st.sampled_from(FLOATS), st.sampled_from(TEXTS))
    return st.one_of(st.sampled_from(TEXTS), INTS.map(str))


@st.composite
def argv_for(draw: st.DrawFn, name: str) -> list[str]:
    sub = SUBPARSERS[name]
    argv = [name]
    options = [a for a in sub._actions if a.option_strings and a.dest != "help"]
    for action in draw(st.lists(st.sampled_from(options), max_size=5, unique_by=id)):
        flag = action.option_strings[-1]
        if action.nargs == 0:
            argv.append(flag)
        else:
            argv += [flag, draw(_value(action))]
    positionals = [a for a in sub._actions if not a.option_strings]
    if positionals:
        argv.append(draw(POSITIONALS.get(name, st.sampled_from(MODELS))))
    if name in ("estimate", "plan", "fit", "upgrade", "doctor") and draw(st.booleans()):
        argv += ["--gpu", draw(st.sampled_from(["L4", "H100", "T4", "A100-80GB", "nope"]))]
    return argv


FAST = settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)


@pytest.mark.parametrize("name", sorted(SUBPARSERS))
def test_generated_command_lines_exit_0_1_or_2_without_a_traceback(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    @FAST
    @given(argv=argv_for(name))
    def check(argv: list[str]) -> None:
        rc, out, err = run(argv, capsys)
        assert_clean(rc, out, err, argv)

    check()


# -- valid small jobs the analytic engine models: never "0" or "nothing fits" ---------------------
SMALL_JOB = st.fixed_dictionaries(
    {
        "--batch": st.integers(1, 8).map(str),
        "--seq": st.sampled_from(["128", "512", "1024"]),
        "--precision": st.sampled_from(["bf16", "fp32", "amp-bf16"]),
    },
    optional={
        "--lora-rank": st.sampled_from(["8", "16"]),
        "--checkpointing": st.sampled_from(["full", "none"]),
        "--optimizer": st.sampled_from(["adamw", "sgd", "adamw-8bit"]),
    },
)


@FAST
@given(job=SMALL_JOB, model=st.sampled_from(["gpt2", "opt-125m", "llama-3.2-1b"]))
def test_a_small_valid_job_fits_a_big_gpu_and_is_never_answered_0(
    job: dict[str, str], model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    flags = [x for kv in job.items() for x in kv]
    rc, out, err = run(["estimate", model, "--gpu", "H100", "--json", *flags], capsys)
    assert (rc, err) == (0, "")
    assert '"peak_allocated_bytes": 0' not in out
    rc, out, err = run(["fit", model, "--gpu", "H100", "--solve", "batch", *flags], capsys)
    assert rc == 0, err
    assert "fits H100: 0" not in out
    plan_flags = ["--seq", job["--seq"], "--batch", job["--batch"], "--confirm", "none"]
    rc, out, err = run(["plan", model, "--gpu", "H100", *plan_flags], capsys)
    assert rc == 0, err
    assert "NOTHING FITS" not in out.upper()
