"""What a rank record needs from the form's replay: phases that start at one
instant are all reported, a stored module order is the order a peak lists its modules in, and a
size the rank rewrite set may not grow with the batch."""

from __future__ import annotations

from typing import Any

import pytest

from memfit.errors import NotModelledError
from memfit.estimate.derived.compiled import compile_run
from memfit.estimate.derived.form import replay_run
from memfit.estimate.derived.record import check_fixed


def _run(**extra: Any) -> dict[str, Any]:
    # keys 0 (a, 1 KiB + 512 B per batch), 1 (b, 2 KiB) and 2 (a again, 2 KiB); the optimizer
    # phase starts and ends with no device event between (its work is in host RAM)
    return {
        "counts": {"layers": 1},
        "ev": [0 << 1, 1 << 1, 2 << 1, 2 << 1 | 1, 0 << 1 | 1],
        "a0": [1024, 2048, 2048],
        "a1": [512, 0, 0],
        "marks": [[0, "forward"], [3, "optimizer"], [3, "end"]],
        "comps": ["activations", "temporary"],
        "mods": ["layers.*.a", "layers.*.b"],
        "comp": [0, 1, 0],
        "mod": [0, 1, 0],
        "ignored": [],
        "const": {"n_params": 10, "n_trainable": 10},
        **extra,
    }


def test_phases_that_start_at_one_instant_are_all_reported() -> None:
    flat = replay_run(_run(), 2, ())
    assert flat["phase/optimizer/peak"] == 2048 + 2048 + 2048
    assert compile_run(_run()).flat(2, ()) == flat


def test_a_stored_module_order_is_the_order_a_peak_lists_its_modules_in() -> None:
    plain = replay_run(_run(), 2, ())
    mods = [k for k in plain if k.startswith("phase/forward/mod/")]
    assert mods == ["phase/forward/mod/layers.*.a", "phase/forward/mod/layers.*.b"]
    ordered = _run(order=[4, 0, 4])  # b's module was born first (layer-indexed names)
    flat = replay_run(ordered, 2, ())
    mods = [k for k in flat if k.startswith("phase/forward/mod/")]
    assert mods == ["phase/forward/mod/layers.*.b", "phase/forward/mod/layers.*.a"]
    assert list(compile_run(ordered).flat(2, ()).items()) == list(flat.items())
    assert {k: v for k, v in flat.items()} == plain  # the bytes are the same


def test_a_size_the_rank_rewrite_set_may_not_grow_with_the_batch() -> None:
    check_fixed([512, 0, 0], [1, 2])
    with pytest.raises(NotModelledError, match="1 sizes set by the multi-GPU rewrite depend"):
        check_fixed([512, 0, 0], [0, 2])
