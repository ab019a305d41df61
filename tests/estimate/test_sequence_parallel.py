"""Tensor + sequence parallel activation closed forms against Korthikanti et al. 2022 (Table 2)
and Megatron-core's ``compute_activation_memory`` (NVIDIA/Megatron-LM d98e8a6,
megatron/training/theoretical_memory_usage.py), both re-derived here term by term."""

from __future__ import annotations

import pytest

from memfit.errors import SpecError
from memfit.estimate.sequence_parallel import tp_activation_bytes

# GPT-3 175B as in Korthikanti et al. §5 (s 2048, h 12288, a 96, 96 layers, t 8)
S, B, H, A, L, V, T = 2048, 1, 12288, 96, 96, 51200, 8
SBH = S * B * H


def _gpt3(**kw: object):  # type: ignore[no-untyped-def]
    args = dict(seq_len=S, micro_batch=B, hidden=H, n_heads=A, n_layers=L, vocab=V, tp=T)
    return tp_activation_bytes(**{**args, **kw})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sp", "recompute", "per_layer"),
    [
        (False, "none", SBH * (10 + 24 / T + 5 * A * S / (H * T))),
        (True, "none", SBH / T * (34 + 5 * A * S / H)),
        (False, "selective", SBH * (10 + 24 / T)),
        (True, "selective", SBH * 34 / T),
        (False, "full", 2 * SBH),
        (True, "full", 2 * SBH / T),
    ],
)
def test_per_layer_bytes_are_korthikanti_table_2(sp: bool, recompute: str, per_layer: float):
    got = _gpt3(sequence_parallel=sp, recompute=recompute)
    assert got.per_layer_bytes == round(per_layer)
    assert got.layers_bytes == round(per_layer * L)


def test_sequence_parallel_shards_the_ten_units_plain_tp_replicates():
    plain = _gpt3(sequence_parallel=False).per_layer_bytes
    sp = _gpt3(sequence_parallel=True).per_layer_bytes
    assert plain - sp == pytest.approx(10 * SBH * (1 - 1 / T), abs=1)


def test_first_stage_total_is_megatron_cores_compute_activation_memory():
    ffn, pp = 4 * H + 1024, 1  # a non-4h FFN exercises 18 + 4 ffn/h
    megatron = SBH * (18 + 4 * ffn / H) * L
    megatron += 8 * S * B * pp + SBH * pp
    megatron += SBH * 4 * (1 + V / H)
    megatron /= T
    got = _gpt3(sequence_parallel=True, ffn_hidden=ffn)
    assert got.total_bytes == pytest.approx(megatron, abs=4)


def test_without_loss_parallel_every_rank_holds_the_whole_fp32_logits():
    split = _gpt3(sequence_parallel=True, loss_parallel=True).output_bytes
    whole = _gpt3(sequence_parallel=True, loss_parallel=False).output_bytes
    assert whole - split == round(4 * S * B * V * (1 - 1 / T))


def test_bad_layouts_are_refused_with_the_rule():
    with pytest.raises(SpecError, match=r"splits the sequence \(2050\) over tp \(8\)"):
        _gpt3(seq_len=2050, sequence_parallel=True)
    with pytest.raises(SpecError, match=r"recompute \('some'\) must be one of"):
        _gpt3(recompute="some")
