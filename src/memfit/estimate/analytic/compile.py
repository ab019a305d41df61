"""``--compile``: what a transformer block saves for backward under ``torch.compile``.

torchtitan compiles each TransformerBlock (``apply_compile``: ``transformer_block.compile(
fullgraph=True)``, after activation checkpointing wraps it; torchtitan
``torchtitan/distributed/compile.py`` at b5bcd76), torchtune each layer (``compile: True``), HF
Trainer the model (``torch_compile=True``). AOTAutograd traces the block's forward and backward
as one graph and :func:`torch._functorch.partitioners.min_cut_rematerialization_partition`
(what Inductor calls) chooses what the forward keeps: a min cut that keeps the 16-bit inputs of
RMSNorm and recomputes its fp32 copies, recomputes SiLU from the gate, and so on. Eager autograd
keeps what each op's backward asks for.

Measured, not guessed: ``benchmarks/compile_saved.py`` runs one HF decoder layer of each model
type below eagerly and compiled (``memfit.estimate.trace.compile_saved``, torch 2.13 CPU, bf16,
SDPA) at five shapes and fits the bytes kept per token as ``a·h + b·kv + c·ffn + d·heads + e``
(hidden, K/V width, MLP width, attention heads for the fp32 softmax statistics, a constant for
the fp32 norm statistics) — exactly, as every term is a whole tensor per token — then checks the
fit at Llama-3.1-8B's proportions (``benchmarks/results/compile_saved.md``).
:data:`SAVED_PER_TOKEN` holds those coefficients; ``tests/estimate/analytic/test_compile.py``
measures a tiny block again and compares.

How the engines use them: the analytic engine scales the activation component of a layer's
profile by the ratio compile / eager of the fitted bytes at the model's own widths (forward
points and the passes' net changes by the saved set's ratio, a backward point's rise — the
layer a checkpoint recomputes — by the recomputed set's, :func:`recompute_ratio`); the per-rank
closed form takes off the tensors the measurement drops that it counts (:func:`dropped`,
``parallel.memory.compile_dropped_elements``). Under ``full`` checkpointing (and host
checkpoints) compile changes nothing between blocks: the checkpoint keeps the block's input
either way; only the recomputed layer is compiled. Inductor's fused kernels also lower
transient peaks inside a block (not modelled: the eager transients stay, an over-estimate).
"""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from memfit.errors import NotModelledError
from memfit.estimate.analytic.graph import ACTS, Vec
from memfit.estimate.analytic.step import BlockProfile
from memfit.spec import WorkloadSpec


def _f(*coeffs: int) -> tuple[Fraction, ...]:
    return tuple(Fraction(c) for c in coeffs)


#: The policies a ratio is measured for (memfit's ``--checkpointing`` names); ``full`` and
#: ``offload`` keep only the block's input, which compile does not change.
MEASURED_POLICIES = ("none", "selective", "selective-op")
UNCHANGED_POLICIES = ("full", "offload")
#: Precisions (as run: ``WorkloadSpec.run_precision``) whose blocks compute in the 16-bit dtype
#: the measurement ran (FSDP2's bf16 / fp16 policy runs ``*-mixed`` as ``*-true``); autocast
#: (``*-mixed`` without FSDP2) and fp32 are not measured.
MEASURED_PRECISIONS = ("bf16-true", "16-true")

#: Bytes kept per token, coefficients of (h, kv, ffn, heads, 1), per model type and
#: (mode, checkpointing); fitted exactly by ``benchmarks/compile_saved.py`` (torch 2.13.0+cpu,
#: transformers 5.23.0; ``benchmarks/results/compile_saved.md``, where the fit reproduces a
#: sixth shape to the byte). Qwen3 is left out: its per-head q/k norms need more terms (the
#: check shape misses by 1 KiB).
_LLAMA = {
    ("eager", "none"): _f(20, 4, 8, 4, 8),
    ("compile", "none"): _f(12, 4, 6, 4, 8),
    ("eager", "selective"): _f(10, 4, 4, 4, 0),
    ("compile", "selective"): _f(8, 4, 4, 4, 0),
    ("eager", "selective-op"): _f(8, 2, 2, 4, 0),
    ("compile", "selective-op"): _f(6, 2, 2, 4, 0),
}
SAVED_PER_TOKEN: dict[str, dict[tuple[str, str], tuple[Fraction, ...]]] = {
    "llama": _LLAMA,
    "mistral": dict(_LLAMA),  # measured: the same coefficients (MistralDecoderLayer)
    "qwen2": {  # biased q/k/v: aten.addmm, which the selective policies do not save
        ("eager", "none"): _f(20, 4, 8, 4, 8),
        ("compile", "none"): _f(12, 4, 6, 4, 8),
        ("eager", "selective"): _f(8, 0, 4, 4, 0),
        ("compile", "selective"): _f(6, 0, 4, 4, 0),
        ("eager", "selective-op"): _f(6, 0, 2, 4, 0),
        ("compile", "selective-op"): _f(6, 0, 2, 4, 0),
    },
}
#: What the measured compile - eager differences are, by tensor, in bytes per token of a
#: 16-bit layer as (h, kv, ffn, heads, 1) coefficients (:func:`dropped`). Without checkpointing:
#: each RMSNorm's fp32 copy of its input and its fp32 normalised product (eager: ``to(float32)``
#: saved by ``pow`` and ``mul``, the product by the weight's ``mul``; compiled: the 16-bit input
#: and output, the rest recomputed), :data:`FP32_NORM_COPIES`, and the SiLU output (recomputed
#: from the gate), ``-2 ffn``. Under a selective policy: the block's last linear output where
#: the policy saved it (it marks it ``MUST_SAVE``; the partitioner keeps only what the
#: backward graph reads, and no backward reads it), ``-2 h``: Qwen2's biased q/k/v projections
#: run ``aten.addmm``, which the per-op policy does not count, so its 4th ``aten.mm`` (w2) is
#: recomputed, not saved, and compile drops nothing there.
FP32_NORM_COPIES = _f(-8, 0, 0, 0, 0)


def dropped(model_type: str, checkpointing: str) -> tuple[Fraction, ...]:
    """compile - eager bytes per token of a layer, as (h, kv, ffn, heads, 1) coefficients."""
    table = SAVED_PER_TOKEN[model_type]
    pairs = zip(table[("compile", checkpointing)], table[("eager", checkpointing)], strict=True)
    return tuple(c - e for c, e in pairs)


def compile_problem(
    model_type: str,
    *,
    precision: str,
    checkpointing: str,
    attention: str,
    moe: bool,
    lora: bool,
    frozen: bool = False,
) -> str | None:
    """Why ``--compile`` is not modelled for this job (None: it is)."""
    if checkpointing in UNCHANGED_POLICIES:
        return None
    if checkpointing == "selective-layer":
        return (
            "compile with checkpointing 'selective-layer': torch.compile's saved set is not "
            "modelled for a mix of checkpointed and plain blocks; use --checkpointing full or "
            "none, or drop --compile"
        )
    if model_type not in SAVED_PER_TOKEN:
        measured = ", ".join(sorted(SAVED_PER_TOKEN))
        return (
            f"compile with model_type {model_type!r}: memfit measured torch.compile's saved "
            f"set for {measured} decoder layers only; use --checkpointing full (compile then "
            "changes nothing memfit models) or drop --compile"
        )
    if precision not in MEASURED_PRECISIONS:
        return (
            f"compile with precision {precision!r}: torch.compile's saved set was measured on "
            "16-bit blocks (bf16-true / 16-true, or *-mixed under --shard fsdp); use one, "
            "--checkpointing full, or drop --compile"
        )
    if attention == "eager":
        return "compile with attention 'eager': measured with SDPA; use --attention sdpa/flash"
    if moe or lora or frozen:
        what = "a MoE layer" if moe else "LoRA adapters" if lora else "frozen layers"
        return (
            f"compile with {what}: torch.compile's saved set was measured on dense, fully "
            "trained decoder layers; use --checkpointing full or drop --compile"
        )
    return None


def workload_compile_problem(
    model_type: str, wl: WorkloadSpec, *, moe: bool, checkpointing: str | None = None
) -> str | None:
    """:func:`compile_problem` of ``wl`` on a layer of ``model_type`` (``checkpointing``: that
    policy instead of the job's, e.g. "none" for the layer full checkpointing recomputes)."""
    return compile_problem(
        model_type,
        precision=wl.run_precision,
        checkpointing=wl.checkpointing if checkpointing is None else checkpointing,
        attention=wl.attention,
        moe=moe,
        lora=wl.lora_rank is not None,
        frozen=wl.freeze_layers > 0,
    )


def raise_if_not_modelled(model_type: str, wl: WorkloadSpec, *, moe: bool, engine: str) -> None:
    """NotModelledError naming :func:`workload_compile_problem`'s reason, where there is one."""
    problem = workload_compile_problem(model_type, wl, moe=moe)
    if problem is not None:
        raise NotModelledError(problem, engine=engine)


def saved_per_token(
    model_type: str, mode: str, checkpointing: str, *, hidden: int, kv: int, ffn: int, heads: int
) -> Fraction:
    """Bytes one layer keeps per token (fitted, :data:`SAVED_PER_TOKEN`)."""
    coeffs = SAVED_PER_TOKEN[model_type][(mode, checkpointing)]
    return sum(
        (c * v for c, v in zip(coeffs, (hidden, kv, ffn, heads, 1), strict=True)), Fraction(0)
    )


def compile_ratio(
    model_type: str, checkpointing: str, *, hidden: int, kv: int, ffn: int, heads: int
) -> float:
    """compile / eager bytes a layer keeps for backward (1.0 where compile changes nothing
    memfit models: full checkpointing)."""
    if checkpointing in UNCHANGED_POLICIES:
        return 1.0
    dims = {"hidden": hidden, "kv": kv, "ffn": ffn, "heads": heads}
    compiled = saved_per_token(model_type, "compile", checkpointing, **dims)
    eager = saved_per_token(model_type, "eager", checkpointing, **dims)
    return float(compiled / eager)


def compile_note(checkpointing: str, *, ratio: float | None = None) -> str:
    """The line an estimate under ``--compile`` carries: what it changed (``ratio``: the
    analytic engine's compile / eager factor on a layer's activations)."""
    where = "benchmarks/results/compile_saved.md"
    if checkpointing in UNCHANGED_POLICIES:
        head = (
            f"compile under {checkpointing} checkpointing: the blocks keep their input either "
            "way (saved activations unchanged)"
        )
        head += (
            "; the layer recomputed in backward is counted as compiled where that layer is measured"
        )
    elif ratio is not None:
        head = (
            f"compile: each layer keeps x{ratio:.3f} of the activations eager autograd keeps "
            f"under checkpointing {checkpointing} (AOTAutograd's min-cut partitioner, measured "
            f"on the model type's HF layer: {where})"
        )
    else:
        head = (
            f"compile under checkpointing {checkpointing}: the tensors AOTAutograd's min-cut "
            f"partitioner does not keep (measured: {where}) are taken off each layer"
        )
    return head + "; Inductor's smaller transients inside a block are not modelled (over-estimate)"


def recompute_ratio(
    model_type: str, checkpointing: str, *, hidden: int, kv: int, ffn: int, heads: int
) -> float | None:
    """compile / eager bytes of what a checkpointed layer recomputes in backward (what it keeps
    without checkpointing less what the policy keeps; None: nothing is recomputed)."""
    if checkpointing == "none":
        return None
    policy = "none" if checkpointing in UNCHANGED_POLICIES else checkpointing
    dims = {"hidden": hidden, "kv": kv, "ffn": ffn, "heads": heads}
    kept = {
        mode: saved_per_token(model_type, mode, "none", **dims)
        - (saved_per_token(model_type, mode, policy, **dims) if policy != "none" else 0)
        for mode in ("eager", "compile")
    }
    return float(kept["compile"] / kept["eager"])


def scale_acts(v: Vec, ratio: float, rise_ratio: float | None = None) -> Vec:
    """``v`` with its activation component scaled by ``ratio`` (by ``rise_ratio`` where it is
    positive: a backward point's rise is the recomputed layer)."""
    out = list(v)
    r = rise_ratio if rise_ratio is not None and v[ACTS] > 0 else ratio
    out[ACTS] = round(v[ACTS] * r)
    return (out[0], out[1], out[2], out[3], out[4], out[5])


def compiled_profile(
    prof: BlockProfile, ratio: float, recompute: float | None = None
) -> BlockProfile:
    """A layer's :class:`~memfit.estimate.analytic.step.BlockProfile` under compile: the
    activation component of every forward point and the passes' net changes scaled by
    ``ratio`` (what the layer keeps); a backward point's by ``ratio`` where the layer's saved
    tensors are being released and by ``recompute`` where the activations rise above the
    backward's start (a checkpointed layer recomputed: its recomputed set, compiled)."""
    if ratio == 1.0 and recompute in (None, 1.0):
        return prof
    return replace(
        prof,
        fwd=[scale_acts(p, ratio) for p in prof.fwd],
        fwd_end=scale_acts(prof.fwd_end, ratio),
        bwd=[scale_acts(p, ratio, recompute) for p in prof.bwd],
        bwd_end=scale_acts(prof.bwd_end, ratio),
    )


__all__ = [
    "MEASURED_POLICIES",
    "FP32_NORM_COPIES",
    "SAVED_PER_TOKEN",
    "UNCHANGED_POLICIES",
    "compile_note",
    "compile_problem",
    "compile_ratio",
    "dropped",
    "compiled_profile",
    "raise_if_not_modelled",
    "workload_compile_problem",
    "recompute_ratio",
    "saved_per_token",
]
