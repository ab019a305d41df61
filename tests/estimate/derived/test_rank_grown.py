"""Rank forms of a deeper stack: where the layer growth's checks pass (ZeRO-2 with the optimizer
offloaded, tensor parallelism, ZeRO-3 with the optimizer or the parameters offloaded, no
checkpointing — the modules a peak lists are ordered by their layer-indexed names' first births,
which the growth carries as a second link per birth and checks on its check trace) the form is
grown from traces of a few layers; where they do not (ZeRO-3 without offload: partitions of the
whole model on the device, one more layer changes their sizes) it comes from full traces.
Either way: the trace engine's answer."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("transformers")

from tests.conftest import TINY_LLAMA
from tests.estimate.derived.test_rank import WIDE, assert_same_answers, train_job

from memfit.estimate import derived
from memfit.estimate.derived import cache
from memfit.models import resolve_model

DEEP = {**WIDE, "num_hidden_layers": 8}


@pytest.fixture(scope="module")
def deep(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("deep")
    (folder / "config.json").write_text(json.dumps(DEEP))
    return resolve_model(str(folder))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("job", "grown"),
    [
        (dict(shard="zero2", offload="optimizer"), True),
        (dict(gpus=2, tp=2), True),
        (dict(shard="zero3", offload="params"), True),
        (dict(shard="zero3", offload="optimizer"), True),
        (dict(shard="zero3"), False),
    ],
)
def test_a_deep_rank_form_is_grown_where_its_checks_pass_and_exact_either_way(
    deep: Any, job: dict[str, Any], grown: bool
) -> None:
    w = train_job(1, checkpointing="none", **job)
    assert_same_answers(deep, w)
    form = derived._FORMS[cache.variant_key(DEEP, w)]
    assert ("growth" in form) is grown


#: A stack wide enough that ZeRO-3's prefetch budget binds as on an 8B model (Qwen3-8B's
#: widths): each layer's last projection prefetches the next layer's attention projections, not
#: its MLP, and the last layer prefetches nothing (the LM head is over the budget), so the events
#: one more layer inserts begin inside a layer and link into the layer before; the first layer
#: is an event shorter (it frees no earlier layer's output).
PREFETCHED = {**TINY_LLAMA, "hidden_size": 4096, "intermediate_size": 12288,
              "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 16384,
              "num_hidden_layers": 8}  # fmt: skip


@pytest.fixture(scope="module")
def prefetched(tmp_path_factory: pytest.TempPathFactory) -> Any:
    folder = tmp_path_factory.mktemp("prefetched")
    (folder / "config.json").write_text(json.dumps(PREFETCHED))
    return resolve_model(str(folder))


@pytest.mark.slow
@pytest.mark.parametrize("offload", ["optimizer", "params"])
def test_a_zero3_form_grows_where_its_prefetch_starts_one_more_layer_inside_a_layer(
    prefetched: Any, offload: str
) -> None:
    w = train_job(1, checkpointing="none", shard="zero3", offload=offload)
    assert_same_answers(prefetched, w)
    form = derived._FORMS[cache.variant_key(PREFETCHED, w)]
    assert "growth" in form
