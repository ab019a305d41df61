"""Gradient accumulation over micro-batches: autograd adds into an existing ``.grad`` in place
(``AccumulateGrad``: ``variable_grad += new_grad`` when grad mode is off, torch's
``autograd/functions/accumulate_grad.h``), with or without the tracker's dispatch mode, so the
trace's accumulated step allocates no second gradient per parameter. (What a dispatch mode does
change is ``InputBuffer::accumulate`` inside one backward: docs/accuracy.md §18.)"""

from __future__ import annotations

import contextlib

import pytest
import torch

from memfit.estimate.trace.tracker import StorageTracker


def tiny_llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=100,
    )
    return LlamaForCausalLM(cfg)


@pytest.mark.parametrize("tracked", [False, True])
def test_a_second_micro_batch_adds_into_the_gradients_in_place(tracked: bool) -> None:
    model = tiny_llama()
    ids = torch.randint(0, 100, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()
    before = {n: (p.grad.data_ptr(), p.grad.clone()) for n, p in model.named_parameters()}
    tracker = StorageTracker(device_type="cpu") if tracked else contextlib.nullcontext()
    with tracker:
        model(input_ids=ids, labels=ids).loss.backward()
    for name, p in model.named_parameters():
        ptr, first = before[name]
        assert p.grad.data_ptr() == ptr, name  # the same storage: added in place
        torch.testing.assert_close(p.grad, 2 * first)  # and it did accumulate
