"""MXFP4 MoE experts as vLLM holds them after loading (gpt-oss), per rank and per MoE layer.

Read in vLLM's ``vllm/model_executor/layers/quantization/mxfp4.py`` (``Mxfp4Config``,
``Mxfp4MoEMethod.create_weights`` / ``process_weights_after_loading``, vllm-project/vllm at commit
007d5005) and ``quantization/utils/mxfp4_utils.py`` (``_swizzle_mxfp4``, commit 01b817db):

- ``Mxfp4Config.get_quant_method`` quantizes ``FusedMoE`` layers only: every ``LinearBase``
  (attention QKV / O, the router) gets ``UnquantizedLinearMethod``, attention and the embeddings /
  lm_head stay in the model dtype (the checkpoint's ``modules_to_not_convert`` says the same);
  attention sinks are one value per head.
- ``create_weights``: ``w13_weight`` (E, 2 I', H'/2) and ``w2_weight`` (E, H', I'/2) uint8 (two
  FP4 codes a byte), one uint8 E8M0 scale per 32 values (``w13_weight_scale`` (E, 2 I', H'/32),
  ``w2_weight_scale`` (E, H', I'/32)), biases (E, 2 I') and (E, H') in bf16. I' is the
  intermediate size per TP rank padded by backend (below), H' the hidden size padded.
- The backend (``get_mxfp4_backend``) follows the GPU: Hopper (SM90) runs triton_kernels
  (I' to 64; ``_swizzle_mxfp4`` stores the values in ``HopperMXValueLayout``, padded to 256 rows x
  64 bytes, the scales in ``HopperMXScaleLayout``, rows to ``32 x num_warps`` = 256 with
  ``num_warps`` 8, scale columns to 2; biases cast to fp32); Blackwell (SM100) with FlashInfer runs
  ``SM100_FI_MXFP4_BF16`` (I' and H' to 256, biases fp32); other GPUs of compute capability 8.0+
  run Marlin (I' to 128, H' to 256, biases bf16). ``Mxfp4Config.get_min_capability`` is 80.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.models import ModelSpec

__all__ = ["MXFP4_MIN_CAPABILITY", "Mxfp4Experts", "mxfp4_experts"]

#: ``Mxfp4Config.get_min_capability``.
MXFP4_MIN_CAPABILITY = 80
#: OCP MX: values per E8M0 scale.
MXFP4_BLOCK = 32
#: (I' alignment, H' alignment) by backend, ``Mxfp4MoEMethod.create_weights``.
BACKEND_PADDING = {"triton": (64, 1), "flashinfer-sm100": (256, 256), "marlin": (128, 256)}
#: triton_kernels Hopper layouts: values (rows, bytes) and scales (rows, columns) alignment.
HOPPER_VALUE_ALIGN = (256, 64)
HOPPER_SCALE_ALIGN = (256, 2)  # 32 x num_warps (8, vLLM's non-batched MoE), and 2


@dataclass(frozen=True, kw_only=True)
class Mxfp4Experts:
    """One MoE layer's routed experts on one rank: stored bytes, and the logical parameters
    (weights + biases, all experts) they replace in the model's count."""

    bytes_per_layer: int
    logical_params: int  # over all layers, unsplit (subtracted from the model's count)
    backend: str


def _up(x: int, a: int) -> int:
    return -(-x // a) * a


def backend_for(cc: tuple[int, int] | None) -> str:
    """vLLM's MXFP4 MoE backend on a GPU of compute capability ``cc`` (None: Hopper's)."""
    if cc is None or cc == (9, 0):
        return "triton"
    if cc[0] == 10:
        return "flashinfer-sm100"
    return "marlin"


def mxfp4_experts(spec: ModelSpec, *, tp: int, cc: tuple[int, int] | None) -> Mxfp4Experts:
    """The routed experts of an MXFP4 checkpoint on one rank (intermediate split over TP)."""
    text = spec.text or spec
    e = text.n_experts or 0
    h = text.hidden_size or 0
    i = text.expert_intermediate_size or text.intermediate_size or 0
    n_layers = text.n_layers or 0
    backend = backend_for(cc)
    pad_i, pad_h = BACKEND_PADDING[backend]
    ip, hp = _up(-(-i // tp), pad_i), _up(h, pad_h)
    bias_bytes = 4 if backend != "marlin" else 2
    if backend == "triton":
        rv, cv = HOPPER_VALUE_ALIGN
        rs, cs = HOPPER_SCALE_ALIGN
        values = _up(2 * ip, rv) * _up(hp // 2, cv) + _up(hp, rv) * _up(ip // 2, cv)
        scales = _up(2 * ip, rs) * _up(hp // MXFP4_BLOCK, cs)
        scales += _up(hp, rs) * _up(ip // MXFP4_BLOCK, cs)
    else:
        values = 2 * ip * hp // 2 + hp * ip // 2
        scales = 2 * ip * hp // MXFP4_BLOCK + hp * ip // MXFP4_BLOCK
    biases = (2 * ip + hp) * bias_bytes
    logical = n_layers * e * (3 * h * i + 2 * i + h)
    label = {
        "triton": "triton_kernels, Hopper layout",
        "flashinfer-sm100": "FlashInfer SM100",
        "marlin": "Marlin",
    }[backend]
    return Mxfp4Experts(
        bytes_per_layer=e * (values + scales + biases),
        logical_params=logical,
        backend=f"MXFP4 MoE backend: {label} (attention, router, embeddings, lm_head in bf16)",
    )
