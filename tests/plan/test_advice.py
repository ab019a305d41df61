"""GPU advice: every catalog GPU can be planned, the cost per 1M tokens follows from the price and
the predicted speed, and each --rank orders the advice by what it names."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.conftest import TINY_LLAMA
from tests.plan.conftest import closed_form_estimate

from memfit.errors import SpecError
from memfit.hardware import get_gpu, list_gpus
from memfit.hardware.prices import GPUPrice, PriceTable, bundled_prices
from memfit.plan import PlanRequest, plan, recommend_gpus
from memfit.plan.advice import RANKS, rank_advice
from memfit.plan.cost import Rates

GPUS = ("T4", "A10G", "L4", "L40S", "RTX-4060-Ti-16GB", "H100-80GB")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    d = tmp_path_factory.mktemp("advice") / "model"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(TINY_LLAMA))
    return str(d)


def _request(**kw: object) -> PlanRequest:
    return PlanRequest(seq_len=256, global_batch=8, confirm="none", **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def advice(model_dir: str):
    return recommend_gpus(
        model_dir,
        _request(),
        gpus=[get_gpu(n) for n in GPUS],
        estimator=closed_form_estimate,
        prices=bundled_prices(),
    )


def test_every_gpu_the_catalog_lists_has_the_rates_plan_needs():
    for gpu in list_gpus():
        Rates.of(gpu)  # raises SpecError for a GPU without compute rate or bandwidth


def test_a10g_plans(model_dir: str):
    p = plan(model_dir, _request(), gpu="A10G", estimator=closed_form_estimate)
    assert p.recommended is not None and p.recommended.cost.tokens_per_s > 0


def test_cost_per_million_tokens_is_the_hourly_price_over_the_tokens_per_hour(advice):
    a = next(x for x in advice if x.gpu == "A10G")
    assert a.usd_per_hour == pytest.approx(1.006 * a.gpus)
    expected = 1.006 * a.gpus / (a.best.cost.tokens_per_s * 3600) * 1e6
    assert a.usd_per_million_tokens == pytest.approx(expected)
    row = a.to_json()
    assert row["usd_per_million_tokens"] == pytest.approx(expected)
    assert row["token_kind"] == "training" and row["price"]["provider"] == "AWS"


def test_cost_rank_is_sorted_by_cost_per_token_with_unpriced_gpus_last_and_named(advice):
    assert advice.rank == "cost"
    costs = [a.usd_per_million_tokens for a in advice]
    priced = [c for c in costs if c is not None]
    assert priced == sorted(priced) and costs[: len(priced)] == priced
    assert [a.gpu for a in advice if a.usd_per_million_tokens is None] == ["RTX-4060-Ti-16GB"]
    assert any("RTX-4060-Ti-16GB (GeForce card" in n for n in advice.notes)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.one_of(st.none(), st.floats(0.01, 20.0)), min_size=6, max_size=6))
def test_any_prices_give_a_cost_order_by_cost_per_token(advice, usd: list[float | None]):
    table = PriceTable(
        {
            name: GPUPrice(gpu=name, usd_per_hour=u, reason=None if u else "none", origin="test")
            for name, u in zip(GPUS, usd)
        }
    )
    ranked = rank_advice(advice, "cost", prices=table)
    keys = [(a.usd_per_million_tokens is None, a.usd_per_million_tokens or 0.0) for a in ranked]
    assert keys == sorted(keys)
    assert sorted(a.gpu for a in ranked) == sorted(a.gpu for a in advice)


def test_speed_rank_is_fastest_first_and_memory_rank_most_free_memory_first(advice):
    speed = rank_advice(advice, "speed")
    rates = [a.best.cost.tokens_per_s for a in speed]
    assert rates == sorted(rates, reverse=True)
    memory = rank_advice(advice, "memory")
    free = [round(a.free_share, 3) for a in memory]
    assert free == sorted(free, reverse=True)


def test_a_gpu_without_rates_is_listed_in_the_notes_with_the_reason(model_dir: str):
    no_rates = dataclasses.replace(
        get_gpu("L4"), name="NoRates-24GB", memory_bandwidth_gbps=None, bf16_dense_tflops=None,
        fp16_dense_tflops=None, fp32_tflops=None,
    )  # fmt: skip
    out = recommend_gpus(model_dir, _request(), gpus=[no_rates], estimator=closed_form_estimate)
    assert list(out) == []
    assert "NoRates-24GB" in out.notes[0] and "without a published compute rate" in out.notes[0]


def test_an_unknown_rank_is_refused(model_dir: str):
    with pytest.raises(SpecError, match=r"rank \('price'\) must be one of cost, speed, memory"):
        recommend_gpus(model_dir, _request(), gpus=[], rank="price")
    assert RANKS == ("cost", "speed", "memory")


def test_inference_costs_are_per_generated_token(model_dir: str):
    out = recommend_gpus(
        model_dir,
        PlanRequest(mode="infer", seq_len=128, batch_size=4, new_tokens=32, confirm="none"),
        gpus=[get_gpu("L4")],
        estimator=closed_form_estimate,
    )
    assert out[0].token_kind == "generated" and out[0].usd_per_million_tokens is not None


@pytest.mark.parametrize("command", [["plan", "gpt2", "--recommend-gpu"], ["upgrade", "gpt2"]])
def test_a_bad_price_file_stops_plan_and_upgrade_before_the_scan(
    tmp_path, capsys: pytest.CaptureFixture[str], command: list[str]
):
    from memfit.cli import main

    bad = tmp_path / "prices.json"
    bad.write_text('{"H1000": 2}')
    gpu = ["--gpu", "T4"] if command[0] == "upgrade" else []
    argv = [*command, *gpu, "--prices", str(bad)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown GPU 'H1000'" in err and "prices.json" in err


def test_an_unknown_rank_on_the_command_line_is_exit_2(capsys: pytest.CaptureFixture[str]):
    from memfit.cli import main

    with pytest.raises(SystemExit) as info:
        main(["plan", "gpt2", "--recommend-gpu", "--rank", "price"])
    assert info.value.code == 2 and "invalid choice: 'price'" in capsys.readouterr().err


def test_the_text_shows_price_cost_and_the_rank_and_a_slice_keeps_them(advice):
    from memfit.report.advice import render_advice

    text = render_advice(advice[:3])
    assert text.startswith("ranked by cost: cheapest per 1M training tokens first")
    assert "$/hour" in text.splitlines()[1] and "$/1M tok" in text.splitlines()[1]
    assert "RTX-4060-Ti-16GB (GeForce card" in text  # the unpriced note survives the slice
    speed = render_advice(rank_advice(advice, "speed")[:2])
    assert speed.startswith("ranked by speed: fastest first")


def test_re_ranking_does_not_repeat_the_unpriced_note(advice):
    twice = rank_advice(rank_advice(advice, "cost"), "cost", prices=bundled_prices())
    assert sum("without a price" in n for n in twice.notes) == 1
    assert not any("without a price" in n for n in rank_advice(advice, "speed").notes)


def test_at_equal_risk_one_result_changing_change_beats_two_stacked() -> None:
    """issue 29: Llama-3.1-8B LoRA r16 at 1024 tokens on a T4 fits only quantized. int8 weights
    plus 8-bit states of the adapters (two changes, 0.06 GiB under the limit) tied on risk with
    QLoRA's 4-bit base (one change, 4 GiB under) and won by the order they were found; a plan
    with one result-changing change is recommended."""
    request = PlanRequest(
        seq_len=1024, batch_size=1, lora_ranks=(16,), lora_asked=True, confirm="none"
    )
    p = plan("llama-3.1-8b", request, gpu="T4")
    rec = p.recommended
    assert rec is not None and rec.settings.quant in ("nf4", "nf4-dq", "int8")
    assert rec.settings.optimizer == "adamw" and len(rec.risk_reasons) == 1
    same_risk = [o for o in p.alternatives if o.risk_level == rec.risk_level and o is not rec]
    for o in same_risk:  # no option of the same risk and speed with fewer changes was passed over
        assert len(o.risk_reasons) >= len(rec.risk_reasons) or o.cost.step_s > rec.cost.step_s
