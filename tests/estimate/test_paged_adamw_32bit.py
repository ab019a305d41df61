"""bitsandbytes PagedAdamW32bit (HF ``optim="paged_adamw_32bit"``, axolotl / TRL
``optimizer: paged_adamw_32bit``): two fp32 states per parameter, paged for parameters of at
least 1e5 elements, AdamW's update."""

from __future__ import annotations

from memfit.estimate.optim_states import model_optimizer_state_bytes
from memfit.jobfiles.names import CLASS_OPTIMIZERS, HF_OPTIM_OF, HF_OPTIMIZERS
from memfit.plan.recipe import MEMORY_ONLY, changes
from memfit.plan.space import Settings


def test_paged_adamw_32bit_keeps_two_fp32_states_and_pages_the_large_ones() -> None:
    big, small = (1024, 1024), (256, 256)  # paging needs 1e5 elements
    got = model_optimizer_state_bytes("paged-adamw-32bit", [big, small], "bfloat16", round_to=1)
    assert got.total_bytes == 8 * (1024 * 1024 + 256 * 256)  # fp32 whatever the bf16 weights
    assert got.paged_bytes == 8 * 1024 * 1024
    assert got.shared_bytes == 0  # no quantization maps


def test_the_config_names_read_and_write_paged_adamw_32bit() -> None:
    assert HF_OPTIMIZERS["paged_adamw_32bit"] == "paged-adamw-32bit"
    assert HF_OPTIM_OF["paged-adamw-32bit"] == "paged_adamw_32bit"
    assert CLASS_OPTIMIZERS["bitsandbytes.optim.PagedAdamW32bit"] == "paged-adamw-32bit"


def test_plain_adamw_instead_of_the_paged_32bit_one_is_memory_only() -> None:
    recipe = Settings(precision="bf16-true", optimizer="paged-adamw-32bit", micro_batch=1)
    plan = Settings(precision="bf16-true", optimizer="adamw-fused", micro_batch=1)
    assert {c.kind for c in changes(plan, recipe, "train")} == {MEMORY_ONLY}
