"""benchmarks/gpu_issue19.py parses its arguments and skips cleanly where there is no CUDA."""

from __future__ import annotations

import pytest
from benchmarks import gpu_issue19 as g19


def test_out_is_required() -> None:
    with pytest.raises(SystemExit) as exc:
        g19.parse_args([])
    assert exc.value.code == 2


def test_arguments_parse() -> None:
    args = g19.parse_args(["--out", "d", "--quick", "--steps", "50", "--no-predict"])
    assert (args.out, args.quick, args.steps, args.no_predict) == ("d", True, 50, True)


def test_without_cuda_it_says_so_and_exits_0(tmp_path, capsys, monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert g19.main(["--out", str(tmp_path / "o")]) == 0
    assert "no CUDA device; nothing measured" in capsys.readouterr().err
    assert not (tmp_path / "o" / "gpu_issue19.json").exists()


def test_the_run_uses_lengths_memfit_replays() -> None:
    from memfit.estimate.seqdist import StepPlan, parse_seq_dist, step_lengths

    dist = parse_seq_dist(str(g19.RUN["seq_dist"]))
    plan = StepPlan(batch_size=int(g19.RUN["batch"]), n_steps=20, seed=int(g19.RUN["seed"]))
    lengths = step_lengths(dist, plan)
    assert len(lengths) == 20 and max(lengths) <= dist.max_len
