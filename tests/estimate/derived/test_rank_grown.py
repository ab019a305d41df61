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
