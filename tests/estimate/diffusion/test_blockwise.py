"""A component traced with its stacks cut to four blocks gives the whole trace's record (issue 32).

Each case builds a tiny component with diffusers' / transformers' own classes and more blocks
than are kept, traces it whole (the record memfit kept before) and cut, and compares the
records: the activation peak, the output bytes, the cuDNN allowance and every event, with the
storage keys renamed in order of first appearance (keys are arbitrary counters)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("diffusers")

import torch  # noqa: E402
from tests.estimate.diffusion.test_pipeline import CLIP, FLUX, T5, job, tiny_flux  # noqa: E402

from memfit.estimate.diffusion import blockwise  # noqa: E402
from memfit.estimate.diffusion.pipeline import build_component  # noqa: E402
from memfit.estimate.diffusion.pipelines import (  # noqa: E402
    _encoder_call,
    _trace_cut_record,
    _trace_record,
    estimate_pipeline,  # noqa: E402
)


def _renamed(events: list[list[Any]]) -> list[tuple[str, int, int]]:
    names: dict[int, int] = {}
    return [(k, names.setdefault(key, len(names)), n) for k, key, n in events]


def _flux_inputs(b: int = 1, img: int = 16, seq: int = 8) -> Any:
    dt = torch.bfloat16
    return lambda: {
        "hidden_states": torch.empty(b, img, 16, dtype=dt),
        "encoder_hidden_states": torch.empty(b, seq, 32, dtype=dt),
        "pooled_projections": torch.empty(b, 32, dtype=dt),
        "timestep": torch.empty(b, dtype=dt),
        "img_ids": torch.empty(img, 3, dtype=dt),
        "txt_ids": torch.empty(seq, 3, dtype=dt),
        "guidance": torch.empty(b, dtype=torch.float32),
    }


def _ids(n: int) -> Any:
    return lambda: {"input_ids": torch.zeros(1, n, dtype=torch.long)}


FLUX_DEEP = {**FLUX, "num_layers": 7, "num_single_layers": 9}
CASES = {
    "flux": (("diffusers", "FluxTransformer2DModel", FLUX_DEEP), _flux_inputs()),
    "t5": (("transformers", "T5EncoderModel", {**T5, "num_layers": 8}), _ids(12)),
    "clip": (("transformers", "CLIPTextModel", {**CLIP, "num_hidden_layers": 6}), _ids(77)),
}  # fmt: skip


def _build(spec: tuple[str, str, dict[str, Any]]) -> torch.nn.Module:
    return build_component(*spec).to(torch.bfloat16)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_stack_cut_to_four_blocks_gives_the_whole_trace_event_for_event(name: str) -> None:
    spec, inputs = CASES[name]
    whole = _trace_record(_build(spec), inputs, _encoder_call)
    model = _build(spec)
    assert blockwise.stacks_of(model), "the case must have a stack longer than the kept blocks"
    cut = _trace_cut_record(model, inputs, _encoder_call)
    assert cut is not None, "the middle blocks repeat one pattern"
    assert len(cut["events"]) == len(whole["events"])
    assert _renamed(cut["events"]) == _renamed(whole["events"])
    assert (cut["activation"], cut["output"], cut["workspace"]) == (
        whole["activation"], whole["output"], whole["workspace"]
    )  # fmt: skip
    # the cut model runs four blocks per stack, not all of them
    assert not blockwise.stacks_of(model)


def test_the_peak_read_from_the_events_is_the_tracker_peak() -> None:
    spec, inputs = CASES["t5"]
    whole = _trace_record(_build(spec), inputs, _encoder_call)
    assert blockwise.peak_bytes([tuple(e) for e in whole["events"]]) == whole["activation"]


def test_blocks_whose_allocations_outlive_the_next_are_traced_whole() -> None:
    # every block keeps one allocation alive (like output_hidden_states): not one pattern
    events: list[tuple[str, int, int]] = []
    marks = []
    key = 0
    for _ in range(blockwise.KEPT):
        marks.append(len(events))
        events += [("a", key, 512), ("a", key + 1, 1024), ("f", key + 1, 0)]
        key += 2
    events += [("f", k, 0) for k in range(0, key, 2)]
    assert blockwise.expand(events, marks, [blockwise.Cut("layers", 9)]) is None


def test_a_repeating_block_is_copied_with_new_keys_freeing_the_copy_before() -> None:
    # block i: allocates its output (freeing block i-1's output) and a transient
    events: list[tuple[str, int, int]] = [("a", 100, 512)]  # the stack's input
    marks = []
    prev, key = 100, 0
    for _ in range(blockwise.KEPT):
        marks.append(len(events))
        events += [("a", key, 2048), ("a", key + 1, 512), ("f", key, 0), ("f", prev, 0)]
        prev, key = key + 1, key + 2
    events.append(("f", prev, 0))
    full = blockwise.expand(events, marks, [blockwise.Cut("layers", blockwise.KEPT + 2)])
    assert full is not None
    assert len(full) == len(events) + 2 * 4  # two more blocks of four events
    live: set[int] = set()
    for kind, k, _ in full:
        if kind == "a":
            assert k not in live
            live.add(k)
        else:
            live.remove(k)  # every free names a live allocation
    assert not live
    assert blockwise.peak_bytes(full) == 512 + 2048 + 512


def test_an_encoder_that_returns_every_layers_hidden_states_is_traced_whole() -> None:
    # SDXL / SD3 call their CLIPs with output_hidden_states=True: each layer's output is kept
    spec, inputs = CASES["clip"]

    def call(m: Any, **kw: Any) -> Any:
        return m(**kw, output_hidden_states=True)

    assert _trace_cut_record(_build(spec), inputs, call) is None


def test_a_deep_flux_pipeline_runs_five_blocks_per_stack_for_the_whole_traces_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from memfit.estimate.diffusion import pipelines

    root = tiny_flux(tmp_path)
    deep = {"transformer": FLUX_DEEP, "text_encoder_2": {**T5, "num_layers": 8},
            "text_encoder": {**CLIP, "num_hidden_layers": 6}}  # fmt: skip
    for comp, cfg in deep.items():
        (root / comp / "config.json").write_text(json.dumps(cfg))
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")  # in-process memos only
    calls: list[str] = []

    def count(module: torch.nn.Module, _args: Any) -> None:
        if type(module).__name__ in ("FluxTransformerBlock", "FluxSingleTransformerBlock"):
            calls.append(type(module).__name__)

    def run() -> Any:
        monkeypatch.setattr(pipelines, "_TRACES", {})
        monkeypatch.setattr(pipelines, "_MODELS", {})
        calls.clear()
        handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
        try:
            return estimate_pipeline(root, job(height=64, width=64), name="deep")
        finally:
            handle.remove()

    cut = run()
    assert len(calls) == 2 * blockwise.KEPT  # five of 7 double-stream, five of 9 single
    with monkeypatch.context() as m:
        m.setattr(blockwise, "stacks_of", lambda model: [])  # every component traced whole
        whole = run()
    assert len(calls) == 7 + 9
    assert cut == whole
