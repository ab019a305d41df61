"""``memfit layouts``: every dp x tp x pp x cp layout of N GPUs, its peak GPU, exit codes."""

from __future__ import annotations

import json

from memfit.cli.entry import main


def test_layouts_json_lists_every_layout_with_its_peak(capsys):
    code = main(["layouts", "llama-3.1-8b", "--gpus", "8", "--global-batch", "16", "--seq",
                 "4096", "--gpu", "H100", "--json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    rows = out["layouts"]
    assert all(r["dp"] * r["tp"] * r["pp"] * r["cp"] == 8 for r in rows)
    assert any(r["pp"] > 1 for r in rows) and any(r["cp"] > 1 for r in rows)
    assert rows[0]["verdict"] == "fits"


def test_layouts_that_cannot_fit_exit_1(capsys):
    code = main(["layouts", "llama-3.1-70b", "--gpus", "2", "--global-batch", "2", "--seq",
                 "4096", "--gpu", "T4", "--quiet"])  # fmt: skip
    assert code == 1
    assert "0 fit on T4" in capsys.readouterr().out


def test_layouts_bad_input_exit_2(capsys):
    code = main(["layouts", "llama-3.1-8b", "--gpus", "8", "--global-batch", "16", "--seq",
                 "4096", "--gpu", "NOPE-GPU"])  # fmt: skip
    assert code == 2
    assert "Traceback" not in capsys.readouterr().err
