"""The step cost priced once per :func:`memfit.plan.cost.train_cost_key` (issue 32): every
candidate of whole planner spaces gets the price a direct call gives it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from memfit.hardware import get_gpu
from memfit.models import resolve_model
from memfit.plan import search as search_mod
from memfit.plan.budget import Budget
from memfit.plan.cost import ModelFacts, Rates, train_cost_key, train_step_cost
from memfit.plan.engines import default_engines
from memfit.plan.request import PlanRequest
from memfit.plan.space import Settings, candidates

#: spaces that vary every field the price reads: full fine-tunes with their splits, LoRA at two
#: ranks with quantized bases and frozen layers, 2 GPUs (DDP, ZeRO, FSDP, offload), fp16 / fp32
REQUESTS = [
    ("llama-3.2-1b", "L4", PlanRequest(seq_len=2048, global_batch=8, precision="bf16-mixed")),
    ("qwen3-0.6b", "T4", PlanRequest(seq_len=1024, global_batch=4, precision="16-mixed")),
    ("llama-3.2-1b", "A100-40GB", PlanRequest(seq_len=1024, global_batch=8, gpus=2)),
    (
        "qwen3-0.6b",
        "RTX-4090",
        PlanRequest(seq_len=4096, global_batch=4, lora_ranks=(16, 64), precision="32-true"),
    ),
]


def _search(model: str, gpu_name: str, request: PlanRequest) -> search_mod._Search:
    source, gpu = resolve_model(model), get_gpu(gpu_name)
    budget = Budget.of(gpu, headroom=request.headroom)
    found = search_mod._Search(request, budget, default_engines(source, gpu), Rates.of(gpu), source)
    found.facts = ModelFacts.from_spec(source.spec, n_params=1_234_567_890)
    return found


@pytest.mark.parametrize(("model", "gpu", "request_"), REQUESTS)
def test_every_candidate_gets_its_direct_price(model: str, gpu: str, request_: PlanRequest) -> None:
    s = _search(model, gpu, request_)
    space = candidates(search_mod._space_options(request_, get_gpu(gpu), s.source))
    assert len({train_cost_key(c) for c in space}) < len(space)  # prices shared
    for c in space:
        direct = train_step_cost(
            c, s.facts, s.rates, seq_len=request_.seq_len, trainable_fraction=s._trainable(c)
        )
        assert s.cost(c) == direct, c.describe()


def test_selective_layer_option_is_in_the_key() -> None:
    """torchtitan's per-layer SAC reruns every N-th block: N changes the price and the key."""
    s = _search(*REQUESTS[0])
    every_2 = Settings(precision="bf16-mixed", checkpointing="selective-layer", optimizer="adamw")
    every_4 = replace(every_2, techniques=replace(every_2.techniques, selective_ac_option=4))
    assert train_cost_key(every_2) != train_cost_key(every_4)
    assert s.cost(every_2).step_s != s.cost(every_4).step_s


def test_new_facts_price_anew() -> None:
    """The baseline's parameter count replaces the facts: no price of the old ones is read."""
    s = _search(*REQUESTS[0])
    c = Settings(precision="bf16-mixed", optimizer="adamw", micro_batch=2)
    before = s.cost(c)
    s.facts = replace(s.facts, n_params=2 * s.facts.n_params)
    assert s.cost(c).step_s > before.step_s
