"""A search's first answer at batch 1 from batch 1's own traces: the estimate the whole form gives
at batch 1, field by field (but the form's own description), and where it does not settle the
search its traces are the form's first ones, never traced again."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

pytest.importorskip("transformers")

from memfit.estimate import derived
from memfit.estimate.derived import first, grown
from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.spec import WorkloadSpec

_DENSE = dict(model_type="granite", architectures=["GraniteForCausalLM"], num_hidden_layers=8,
              hidden_size=64, intermediate_size=128, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=512, max_position_embeddings=512)  # fmt: skip
_QLORA = WorkloadSpec(mode="train", batch_size=1, seq_len=32, precision="bf16-true",
                      checkpointing="full", lora_rank=4, quant="nf4")  # fmt: skip
#: What differs by design: how the form was made and how long it took.
_FORM_FIELDS = ("batch_points", "exact_at", "built_now", "build_s", "batch_one_only")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MEMFIT_TRACE_WORKERS", "1")  # one process: the trace count is exact
    derived._FORMS.clear()
    grown.KEPT.clear()


def _comparable(est: Any) -> dict[str, Any]:
    data = est.to_json()
    trace = dict(data["trace"])
    trace["derived"] = {k: v for k, v in trace["derived"].items() if k not in _FORM_FIELDS}
    trace.pop("wall_s")
    return {**data, "trace": trace}


def _source(tmp_path: Any) -> Any:
    import json

    path = tmp_path / "config.json"
    path.write_text(json.dumps(_DENSE))
    return resolve_model(str(path))


def _count_traces(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []
    real = grown.trace_units

    def counting(config: Any, workload: Any, var: Any, m: int, b: int, **kw: Any) -> Any:
        seen.append((m, b))
        return real(config, workload, var, m, b, **kw)

    monkeypatch.setattr(grown, "trace_units", counting)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize(
    "workload",
    [  # batch 1 squeezed (its own run in the form), and not (batch 1 on the line through 1, 2)
        _QLORA,
        WorkloadSpec(mode="infer", batch_size=1, seq_len=32, new_tokens=4, precision="bf16"),
    ],
)
def test_batch_ones_own_traces_give_the_forms_estimate_at_batch_1(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, workload: WorkloadSpec
) -> None:
    source, gpu = _source(tmp_path), get_gpu("L4")
    seen = _count_traces(monkeypatch)
    mine = derived.estimate_first(source, workload, gpu=gpu, settles=lambda e: True)
    assert mine is not None and mine.trace["derived"]["batch_one_only"] is True
    assert sorted(seen) == [(2, 1), (3, 1), (4, 1), (first.CHECK_UNITS, 1)]
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")  # the whole form, built from scratch
    derived._FORMS.clear()
    grown.KEPT.clear()
    want = derived.estimate_derived(source, workload, gpu=gpu)
    assert "growth" in derived._FORMS[next(iter(derived._FORMS))]
    assert _comparable(mine) == _comparable(want)


@pytest.mark.slow
def test_a_first_answer_that_does_not_settle_leaves_its_traces_to_the_form(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, gpu = _source(tmp_path), get_gpu("L4")
    w = _QLORA
    seen = _count_traces(monkeypatch)
    assert derived.estimate_first(source, w, gpu=gpu, settles=lambda e: False) is None
    first_ones = sorted(seen)
    assert first_ones == [(2, 1), (3, 1), (3, 2), (4, 1)]  # the pair, then the form's next
    seeded = [derived.estimate_derived(source, dataclasses.replace(w, batch_size=b), gpu=gpu)
              for b in (1, 3)]  # fmt: skip
    assert sorted(seen) == sorted(set(seen)), "a trace ran twice"
    assert len(seen) == 8  # the squeezed form's eight traces, four of them before
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")
    derived._FORMS.clear()
    fresh = [derived.estimate_derived(source, dataclasses.replace(w, batch_size=b), gpu=gpu)
             for b in (1, 3)]  # fmt: skip
    assert [_comparable(e) for e in seeded] == [_comparable(e) for e in fresh]


@pytest.mark.slow
def test_a_kept_batch_one_form_answers_again_without_tracing(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, gpu = _source(tmp_path), get_gpu("L4")
    w = WorkloadSpec(mode="infer", batch_size=1, seq_len=32, new_tokens=4, precision="bf16")
    once = derived.estimate_first(source, w, gpu=gpu, settles=lambda e: True)
    derived._FORMS.clear()
    seen = _count_traces(monkeypatch)
    again = derived.estimate_first(source, w, gpu=gpu, settles=lambda e: True)
    assert seen == [] and once is not None and again is not None
    assert again.trace["derived"]["built_now"] is False
    assert _comparable(again) == _comparable(once)
    # the batch-1 form is never the job's form: a batch-2 estimate builds the whole one
    assert not derived.is_cached(source, w)


def test_no_first_answer_at_another_batch_size_or_where_a_form_is_kept(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    source, gpu = _source(tmp_path), get_gpu("L4")
    seen = _count_traces(monkeypatch)
    w = WorkloadSpec(mode="infer", batch_size=2, seq_len=32, new_tokens=4, precision="bf16")
    assert derived.estimate_first(source, w, gpu=gpu, settles=lambda e: True) is None
    one = dataclasses.replace(w, batch_size=1)
    derived._FORMS[derived.cache.variant_key(source.config, one)] = {"refused": "kept"}
    assert derived.estimate_first(source, one, gpu=gpu, settles=lambda e: True) is None
    assert seen == []
