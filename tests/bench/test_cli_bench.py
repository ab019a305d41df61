"""``memfit bench`` and ``memfit quality``: exit codes and --json keys."""

from __future__ import annotations

import json

import pytest

from memfit.cli import main


def test_bench_json_has_rows_with_measurement_and_estimate(capsys, tmp_path) -> None:
    out = tmp_path / "b.json"
    code = main(
        [
            "bench",
            "tiny-opt",
            "--techniques",
            "lora",
            "--steps",
            "1",
            "--seq",
            "32",
            "--device",
            "cpu",
            "--json",
            "-o",
            str(out),
        ]
    )
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert [r["name"] for r in printed["rows"]] == ["baseline", "lora"]  # one technique: no combo
    lora = printed["rows"][1]
    assert lora["measured_peak_bytes"] < printed["rows"][0]["measured_peak_bytes"]
    assert lora["estimated_peak_bytes"] > 0 and lora["saving_agreement"] is not None


def test_bench_rejects_an_unknown_technique_with_exit_2(capsys) -> None:
    assert main(["bench", "tiny-opt", "--techniques", "warp-drive"]) == 2
    assert "technique 'warp-drive' is not one of sdpa, bf16" in capsys.readouterr().err


def test_quality_passes_with_defaults_and_fails_a_strict_gate_with_exit_1(capsys) -> None:
    assert main(["quality", "tiny-opt", "--quant", "int8", "--seq", "32", "--json"]) == 0
    ok = json.loads(capsys.readouterr().out)
    assert ok["passed"] is True and ok["kl"] > 0
    assert {"kl", "top1", "cosine", "thresholds", "failures"} <= set(ok)
    assert main(["quality", "tiny-opt", "--seq", "32", "--max-kl", "0", "--min-cosine", "1"]) == 1
    text = capsys.readouterr().out
    assert "FAIL" in text and "> max_kl 0" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["quality", "tiny-opt", "--quant", "int3"], "quant ('int3') must be one of int8"),
        (["quality", "tiny-opt", "--min-top1", "95"], "must be at most 1"),
    ],
)
def test_quality_bad_input_exits_2_with_the_reason(capsys, argv, message) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_threshold_that_is_not_a_number_is_an_argparse_error_exit_2(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["quality", "tiny-opt", "--min-top1", "x"])
    assert exc.value.code == 2
    assert "expected a number or 'none'" in capsys.readouterr().err


def test_the_parser_lists_the_bench_techniques_and_gate_defaults() -> None:
    from memfit.bench import TECHNIQUES, gate
    from memfit.cli import bench as cli_bench
    from memfit.cli.bench import TECHNIQUE_NAMES

    assert (cli_bench.DEFAULT_MAX_KL, cli_bench.DEFAULT_MIN_COSINE) == (
        gate.DEFAULT_MAX_KL,
        gate.DEFAULT_MIN_COSINE,
    )
    assert tuple(TECHNIQUES) == TECHNIQUE_NAMES
