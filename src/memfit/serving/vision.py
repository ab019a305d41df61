"""The vision tower and projector vLLM loads with a multimodal checkpoint, per rank.

vLLM builds the towers of the checkpoints it serves from their ``vision_config`` (read in the
v0.34.0 sdist, the same layers as the v0.19 line the logs ran):

- Gemma 3 (``vllm/model_executor/models/gemma3_mm.py``, ``siglip.py``): a SigLIP encoder without
  its head — patch convolution with bias and a position embedding (replicated), per layer
  ``QKVParallelLinear`` / ``RowParallelLinear`` attention and ``ColumnParallelLinear`` /
  ``RowParallelLinear`` MLP, all with biases, two LayerNorms, the post LayerNorm — and
  ``Gemma3MultiModalProjector``'s ``mm_input_projection_weight`` (vision hidden x text hidden) and
  its RMSNorm, both replicated.
- Mistral 3 (``mistral3.py``, ``pixtral.py`` ``PixtralHFVisionModel``): a bias-free patch
  convolution, ``ln_pre``, per layer split q/k/v/o and a gated SiLU MLP (gate/up/down) with two
  RMSNorms; the projector's RMSNorm, the patch merger (``nn.Linear(hidden x merge^2, hidden)``,
  replicated) and ``linear_1`` / ``linear_2`` (vision -> text hidden -> text hidden, split;
  biases when ``multimodal_projector_bias``).

Biases of split layers are counted whole (a few KiB). The tower stays in the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from memfit.models import ModelSpec

__all__ = ["MULTIMODAL_CHECKPOINTS", "VisionTower", "served_spec", "vision_tower"]

_GEMMA3_MM = {
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "mm_tokens_per_image": 256,
    "vision_config": {
        "hidden_size": 1152,
        "image_size": 896,
        "intermediate_size": 4304,
        "model_type": "siglip_vision_model",
        "num_attention_heads": 16,
        "num_hidden_layers": 27,
        "patch_size": 14,
        "vision_use_head": False,
    },
}
_MISTRAL3_MM = {
    "architectures": ["Mistral3ForConditionalGeneration"],
    "model_type": "mistral3",
    "spatial_merge_size": 2,  # Mistral3Config's defaults (the hub file leaves them out)
    "multimodal_projector_bias": False,
    "vision_config": {
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 1024,
        "image_size": 1540,
        "intermediate_size": 4096,
        "model_type": "pixtral",
        "num_attention_heads": 16,
        "num_channels": 3,
        "num_hidden_layers": 24,
        "patch_size": 14,
    },
}
#: Hub checkpoints whose bundled config is their text tower only (models/configs/index.json says
#: "the vision tower and projector are not bundled") while vLLM serves the whole multimodal
#: model: the top level of their config.json, which :func:`served_spec` puts around the text
#: config. Gemma 3: huggingface.co/google/gemma-3-{4b,12b,27b}-it config.json (one vision_config
#: for the three; copies in public test fixtures, e.g. a GEMMA3_27B_CONFIG and a gemma-3-4b-it
#: C# test). Mistral-Small-3.1: huggingface.co/mistralai/Mistral-Small-3.1-24B-Instruct-2503
#: config.json (copy: TensorRT-LLM's mistral_small_3_1_24b_config fixture, the one the bundled
#: text config was taken from).
MULTIMODAL_CHECKPOINTS: dict[str, dict[str, object]] = {
    "google/gemma-3-4b-it": _GEMMA3_MM,
    "google/gemma-3-12b-it": _GEMMA3_MM,
    "google/gemma-3-27b-it": _GEMMA3_MM,
    "mistralai/Mistral-Small-3.1-24B-Instruct-2503": _MISTRAL3_MM,
}


def served_spec(spec: ModelSpec, hf_id: str) -> ModelSpec:
    """The model vLLM serves for the checkpoint ``hf_id``: ``spec`` itself, or, for a bundled
    text tower of a multimodal checkpoint (:data:`MULTIMODAL_CHECKPOINTS`), the multimodal model
    around it (its quantization_config moved to the top level, where the checkpoint has it)."""
    top = MULTIMODAL_CHECKPOINTS.get(hf_id)
    if top is None or spec.vision is not None or spec.text is not None or not spec.raw:
        return spec
    text = dict(spec.raw)
    quant = text.pop("quantization_config", None)
    config: dict[str, object] = {**top, "text_config": text}
    if spec.dtype is not None:
        config["torch_dtype"] = spec.dtype
    if quant is not None:
        config["quantization_config"] = quant
    return ModelSpec.from_config(config)


@dataclass(frozen=True, kw_only=True)
class VisionTower:
    """Parameters of a vision tower + projector: split across TP ranks, and on every rank."""

    kind: str
    split_params: int
    replicated_params: int

    def rank_params(self, tp: int) -> int:
        return self.split_params // tp + self.replicated_params

    @property
    def n_params(self) -> int:
        return self.split_params + self.replicated_params


def _int(spec: ModelSpec, key: str, default: int) -> int:
    value = spec.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def vision_tower(spec: ModelSpec) -> VisionTower | None:
    """The tower vLLM loads for ``spec``'s ``vision_config``; None without one, or for a tower
    kind memfit does not count (the caller says so)."""
    vis, text = spec.vision, spec.text or spec
    if vis is None or vis.hidden_size is None or vis.n_layers is None or not text.hidden_size:
        return None
    h, n, ht = vis.hidden_size, vis.n_layers, text.hidden_size
    f = vis.intermediate_size or 4 * h
    patch, channels = _int(vis, "patch_size", 14), _int(vis, "num_channels", 3)
    if vis.model_type == "siglip_vision_model" and spec.model_type == "gemma3":
        positions = (_int(vis, "image_size", 224) // patch) ** 2
        split = n * (4 * h * h + 2 * h * f)
        per_layer_small = 4 * h + f + h + 2 * 2 * h  # q/k/v/o and fc biases, two LayerNorms
        embed = channels * patch * patch * h + h + positions * h
        replicated = n * per_layer_small + embed + 2 * h + h * ht + h
        return VisionTower(kind="SigLIP", split_params=split, replicated_params=replicated)
    if vis.model_type == "pixtral" and spec.model_type == "mistral3":
        merge = _int(spec, "spatial_merge_size", 2)
        bias = bool(spec.get("multimodal_projector_bias"))
        split = n * (4 * h * h + 3 * h * f) + h * ht + ht * ht
        replicated = (
            n * 2 * h + channels * patch * patch * h + h  # norms, patch conv, ln_pre
            + h + h * merge * merge * h  # projector norm, patch merger
            + (2 * ht if bias else 0)
        )  # fmt: skip
        return VisionTower(kind="Pixtral", split_params=split, replicated_params=replicated)
    return None
