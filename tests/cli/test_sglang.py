"""`memfit sglang`: SGLang's start-up lines, starts / fails as an exit code, JSON, pasted flags."""

from __future__ import annotations

import json

import pytest

from memfit.cli import main


def test_a_setup_that_starts_prints_sglangs_lines_and_exits_0(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["sglang", "llama-3.1-8b", "--gpu", "H100"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "Load weight end." in out and "KV Cache is allocated. #tokens: " in out
    assert "mem_fraction_static 0.835" in out and "STARTS" in out


def test_a_setup_that_fails_exits_1_with_sglangs_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["sglang", "llama-3.1-8b", "--gpu", "L40S", "--mem-fraction-static", "0.3"])
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAILS: RuntimeError: Not enough memory. Please try to increase" in out
    assert "smallest --mem-fraction-static" in out


def test_bad_input_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["sglang", "llama-3.1-8b", "--gpu", "H100", "--kv-cache-dtype", "int3"])
    err = capsys.readouterr().err
    assert rc == 2 and "--kv-cache-dtype ('int3') must be one of" in err


def test_a_missing_model_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["sglang", "--gpu", "H100"])
    assert rc == 2 and "needs a model: MODEL or --model-path" in capsys.readouterr().err


def test_a_pasted_launch_server_line_parses_and_ignores_what_does_not_change_memory(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["sglang", "--model-path", "llama-3.1-70b", "--tp", "4", "--gpu", "H100",
            "--host", "0.0.0.0", "--port", "30000", "--trust-remote-code",
            "--mem-fraction-static", "0.85", "--context-length", "32768", "--json"]  # fmt: skip
    rc = main(argv)
    record = json.loads(capsys.readouterr().out)
    assert rc == 0 and record["runtime"] == "sglang" and record["starts"] is True
    assert record["mem_fraction_static"] == 0.85 and record["context_length"] == 32768
    assert record["command"] == (
        "python -m sglang.launch_server --model-path meta-llama/Llama-3.1-70B --tp-size 4 "
        "--mem-fraction-static 0.85 --context-length 32768"
    )


def test_check_hands_a_launch_server_line_to_the_sglang_door(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    line = tmp_path / "serve.sh"
    line.write_text(
        "# our server\npython3 -m sglang.launch_server \\\n  --model-path llama-3.1-8b \\\n"
        "  --mem-fraction-static 0.85 --port 30000 --trust-remote-code\n"
    )
    rc = main(["check", str(line), "--gpu", "L40S", "--json"])
    checked = json.loads(capsys.readouterr().out)
    main(["sglang", "llama-3.1-8b", "--gpu", "L40S", "--mem-fraction-static", "0.85", "--json"])
    direct = json.loads(capsys.readouterr().out)
    assert rc == 0 and checked == direct


def test_check_refuses_a_flag_sglang_does_not_take(
    capsys: pytest.CaptureFixture[str], tmp_path
) -> None:
    line = tmp_path / "serve.sh"
    line.write_text("python -m sglang.launch_server --model-path llama-3.1-8b --bogus 3\n")
    with pytest.raises(SystemExit) as exit_:  # argparse's exit, as for the whole command line
        main(["check", str(line), "--gpu", "L40S"])
    assert exit_.value.code == 2 and "unrecognized arguments: --bogus" in capsys.readouterr().err


@pytest.mark.parametrize(("gpu", "fp8"), [("T4", False), ("A100-80GB", False), ("H100", True)])
def test_the_way_out_names_fp8_only_for_a_gpu_that_has_it(
    capsys: pytest.CaptureFixture[str], gpu: str, fp8: bool
) -> None:
    """Weights that do not fit: FP8 weights are named only where the GPU has FP8 (never a
    precision the GPU lacks); elsewhere a 4-bit AWQ / GPTQ checkpoint."""
    code = main(["sglang", "llama-3.1-70b", "--gpu", gpu])
    out = capsys.readouterr().out
    assert code == 1
    way_out = next(line for line in out.splitlines() if "no --mem-fraction-static" in line)
    assert ("--quantization fp8" in way_out) is fp8
    assert ("4-bit AWQ / GPTQ" in way_out) is not fp8
