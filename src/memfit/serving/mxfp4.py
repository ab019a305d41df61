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

By vLLM release (Hopper, triton backend; read in the v0.11.0-v0.34.0 sdists and the v0.14.1 /
v0.19.0 / v0.22.0 wheels, which vendor ``vllm/third_party/triton_kernels``):

- Which triton_kernels lays the values out: ``cmake/external_projects/triton_kernels.cmake``
  pins the tag, v3.5.0 in 0.12-0.16, v3.6.0 in 0.17-0.21, v3.5.1 from 0.22 (CUDA builds).
  v3.5.0 / v3.5.1 ``HopperMXValueLayout.swizzle_data`` pads the (N rows, K/2 bytes) values only
  to whole tile packs (16 rows, 32 bytes); v3.6.0 first pads both dims to 64 ("Pre-pad both
  matrix dims to multiples of 64"), so gpt-oss's 1440-byte rows (H/2 = 2880/2) grow to 1472.
  vLLM 0.10 / 0.11 bundle none (the user's triton_kernels; memfit takes v3.5.0's layout).
- The checkpoint's uint8 scales stay on the layer next to their swizzled copy until 0.26: the
  triton branch deletes only ``layer.w13_weight`` / ``w2_weight`` (quantization/mxfp4.py of
  0.11-0.18; ``Mxfp4MoEMethod._setup_kernel`` of 0.19-0.26 replaces the scale parameters only
  ``if self.mxfp4_backend not in TRITON_BACKENDS``); 0.27's
  ``fused_moe/oracle/mxfp4.py`` adds ``del layer.w13_weight_scale`` / ``w2_weight_scale``.
- With no release (SGLang's sizing): the layout of triton_kernels main
  (``_padded_shape``: 256 rows x 64 bytes), scales not kept, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.models import ModelSpec

__all__ = ["MXFP4_MIN_CAPABILITY", "Mxfp4Experts", "TritonLayout", "mxfp4_experts", "triton_layout"]

#: ``Mxfp4Config.get_min_capability``.
MXFP4_MIN_CAPABILITY = 80
#: OCP MX: values per E8M0 scale.
MXFP4_BLOCK = 32
#: (I' alignment, H' alignment) by backend, ``Mxfp4MoEMethod.create_weights``.
BACKEND_PADDING = {"triton": (64, 1), "flashinfer-sm100": (256, 256), "marlin": (128, 256)}
#: triton_kernels Hopper layouts: values (rows, bytes) and scales (rows, columns) alignment.
HOPPER_VALUE_ALIGN = (256, 64)
HOPPER_SCALE_ALIGN = (256, 2)  # 32 x num_warps (8, vLLM's non-batched MoE), and 2
#: triton_kernels ``HopperMXValueLayout`` (mma v3): rows and bytes of one tile pack.
HOPPER_VALUE_PACK = (16, 32)
#: triton_kernels v3.6.0's pre-pad of both value dims (rows, bytes).
HOPPER_VALUE_PREPAD_V36 = 64
#: (first vLLM minor release, the triton_kernels tag its CUDA build vendors).
TRITON_KERNELS_BY_MINOR = ((0, "v3.5.0"), (17, "v3.6.0"), (22, "v3.5.1"))
#: The first vLLM minor release that frees the checkpoint's scales after swizzling them.
SCALES_FREED_FROM_MINOR = 27


@dataclass(frozen=True, kw_only=True)
class TritonLayout:
    """How one vLLM release holds MXFP4 experts on Hopper (triton backend)."""

    tag: str  # the triton_kernels tag ("v3.6.0"), or "main" when no release is modelled
    scales_kept: bool  # the checkpoint's uint8 scales stay next to their swizzled copy


def triton_layout(minor: int | None) -> TritonLayout:
    """The triton_kernels layout and scale handling of vLLM ``0.<minor>`` (None: unpinned)."""
    if minor is None:
        return TritonLayout(tag="main", scales_kept=False)
    tag = [t for first, t in TRITON_KERNELS_BY_MINOR if minor >= first][-1]
    return TritonLayout(tag=tag, scales_kept=minor < SCALES_FREED_FROM_MINOR)


def _hopper_value_bytes(rows: int, row_bytes: int, tag: str) -> int:
    """Bytes of one expert's (rows x row_bytes) uint8 values after ``HopperMXValueLayout``."""
    if tag == "main":
        return _up(rows, HOPPER_VALUE_ALIGN[0]) * _up(row_bytes, HOPPER_VALUE_ALIGN[1])
    if tag == "v3.6.0":
        rows, row_bytes = (
            _up(rows, HOPPER_VALUE_PREPAD_V36),
            _up(row_bytes, HOPPER_VALUE_PREPAD_V36),
        )
    return _up(rows, HOPPER_VALUE_PACK[0]) * _up(row_bytes, HOPPER_VALUE_PACK[1])


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


def mxfp4_experts(
    spec: ModelSpec, *, tp: int, cc: tuple[int, int] | None, vllm_minor: int | None = None
) -> Mxfp4Experts:
    """The routed experts of an MXFP4 checkpoint on one rank (intermediate split over TP), as
    vLLM ``0.<vllm_minor>`` holds them after loading (None: no release pinned)."""
    text = spec.text or spec
    e = text.n_experts or 0
    h = text.hidden_size or 0
    i = text.expert_intermediate_size or text.intermediate_size or 0
    n_layers = text.n_layers or 0
    backend = backend_for(cc)
    pad_i, pad_h = BACKEND_PADDING[backend]
    ip, hp = _up(-(-i // tp), pad_i), _up(h, pad_h)
    bias_bytes = 4 if backend != "marlin" else 2
    kept = ""
    if backend == "triton":
        layout = triton_layout(vllm_minor)
        values = _hopper_value_bytes(2 * ip, hp // 2, layout.tag)
        values += _hopper_value_bytes(hp, ip // 2, layout.tag)
        rs, cs = HOPPER_SCALE_ALIGN
        scales = _up(2 * ip, rs) * _up(hp // MXFP4_BLOCK, cs)
        scales += _up(hp, rs) * _up(ip // MXFP4_BLOCK, cs)
        if layout.scales_kept:  # the loaded (E, N, K/32) scales, unpadded
            scales += 2 * ip * hp // MXFP4_BLOCK + hp * ip // MXFP4_BLOCK
            kept = ", its loaded scales kept"
        kept = f"; triton_kernels {layout.tag}{kept}"
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
        backend=(
            f"MXFP4 MoE backend: {label}{kept} (attention, router, embeddings, lm_head in bf16)"
        ),
    )
