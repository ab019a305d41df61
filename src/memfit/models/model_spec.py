"""ModelSpec: one typed description of a model, read once from its config.json.

>>> from memfit.models import ModelSpec, resolve_model
>>> spec = resolve_model("llama-3.1-8b").spec
>>> spec.hidden_size, spec.n_layers, spec.n_kv_heads, spec.tie_word_embeddings
(4096, 32, 8, False)

Every consumer (the analytic engine's :class:`~memfit.estimate.analytic.arch.Arch`, the trace
engine's layer plan, the planner's cost model, the task and position rules) reads these fields
instead of re-reading the dict with its own aliases and defaults. How keys become fields — the key
table, the per-family defaults of the transformers config classes, the registered readers — is in
:mod:`memfit.models.readers`. A field the config does not determine is None (unknown), never a
made-up number; family-specific knobs with no general meaning stay in the read-only ``raw`` view
(``spec.get("word_embed_proj_dim")``). Impossible values raise a ModelConfigError naming the key,
the value and the rule; a config of a family memfit has no reader for still resolves.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from memfit.errors import ModelConfigError, SpecError
from memfit.models import readers
from memfit.models.param_count import count_params
from memfit.spec.rules import MAX_EXPERTS, MAX_HEADS, MAX_MODEL_LAYERS, MAX_VOCAB

__all__ = ["ModelSpec", "QuantizationConfig"]

#: Keys whose presence says the model has rotary position embeddings (families without a reader).
ROPE_KEYS = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_emb_base")
#: Vision model types (image classification when traced; see :attr:`ModelSpec.task`).
VISION_TYPES = ("vit", "deit", "beit", "swin", "convnext", "dinov2", "resnet", "siglip")
_COUNTS: tuple[str, ...] = (
    "hidden_size",
    "n_layers",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "intermediate_size",
)
_COUNTS += ("vocab_size", "max_positions", "expert_intermediate_size")
_COUNTS += ("shared_expert_intermediate_size",)
_MAY_BE_ZERO = ("n_decoder_layers", "n_experts", "n_experts_per_token", "n_shared_experts")
#: The largest count a field may hold: torch sizes are int64 and a product of two widths must not
#: overflow it (``hidden_size`` 2**63 traced as an int64 overflow inside torch); 2**31 - 1 is
#: thousands of times any real model's width, depth or vocabulary.
MAX_COUNT = 2**31 - 1
#: Tighter limits for the counts an engine loops over or builds a list of (layers, heads,
#: experts) and the vocabulary, from :mod:`memfit.spec.rules` (each says why its value is safe):
#: a config past them is refused before any engine runs (1e9 layers took 16.6 GB and 4e6 layers
#: 105 s in the analytic engine before).
COUNT_LIMITS: dict[str, tuple[int, str]] = {
    "n_layers": (MAX_MODEL_LAYERS, "MAX_MODEL_LAYERS"),
    "n_decoder_layers": (MAX_MODEL_LAYERS, "MAX_MODEL_LAYERS"),
    "n_heads": (MAX_HEADS, "MAX_HEADS"),
    "n_kv_heads": (MAX_HEADS, "MAX_HEADS"),
    "n_experts": (MAX_EXPERTS, "MAX_EXPERTS"),
    "n_experts_per_token": (MAX_EXPERTS, "MAX_EXPERTS"),
    "n_shared_experts": (MAX_EXPERTS, "MAX_EXPERTS"),
    "vocab_size": (MAX_VOCAB, "MAX_VOCAB"),
}
#: ``torch_dtype`` / ``dtype`` values a checkpoint may name: the torch dtype names transformers
#: resolves with ``getattr(torch, name)`` (PreTrainedConfig), and "auto". Another name (e.g.
#: "float1024") made the trace engine fail with an AttributeError.
CONFIG_DTYPES = frozenset(
    {"auto", "float16", "half", "bfloat16", "float32", "float", "float64", "double"}
    | {"float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu"}
    | {"int8", "uint8", "int16", "int32", "int64", "bool"}
)
#: RoPE scaling types: transformers 5.23's ``modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (linear,
#: dynamic, yarn, longrope, llama3, proportional) and "default", plus the older names configs
#: still carry: "su" (Phi-3's name for longrope) and "mrope" (Qwen2-VL, read as default). Another
#: type made the trace engine fail with a KeyError inside transformers.
ROPE_TYPES = frozenset(
    {"default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional", "su", "mrope"}
)
_FLAGS = ("tie_word_embeddings", "mlp_gated", "qkv_bias", "o_bias", "mlp_bias")
_DROPOUTS = ("attention_dropout", "hidden_dropout", "embedding_dropout")
_INTS = frozenset(_COUNTS + _MAY_BE_ZERO + ("sliding_window",))
_BOOLS = frozenset(_FLAGS + ("is_encoder_decoder",))
_FLOATS = frozenset(
    _DROPOUTS + ("partial_rotary_factor", "attn_logit_softcapping", "final_logit_softcapping")
)


@dataclass(frozen=True, kw_only=True)
class QuantizationConfig:
    """A config.json's ``quantization_config``: its method and bit width where it says them."""

    method: str | None  # quant_method: "bitsandbytes", "gptq", "awq", "fp8"...
    bits: int | None  # bits, or 4 / 8 from bitsandbytes' load_in_4bit / load_in_8bit
    raw: Mapping[str, Any] = field(default_factory=dict, hash=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "raw", _frozen(self.raw))

    @classmethod
    def from_config(cls, q: Mapping[str, Any]) -> QuantizationConfig:
        bits = q.get("bits")
        if not isinstance(bits, int) or isinstance(bits, bool):
            bits = 4 if q.get("load_in_4bit") else 8 if q.get("load_in_8bit") else None
        method = q.get("quant_method")
        return cls(method=None if method is None else str(method), bits=bits, raw=_frozen(q))


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One model's dimensions and switches; None where the config does not determine them.

    ``n_layers`` is the (encoder's) layer count and ``n_decoder_layers`` an encoder-decoder's
    second stack; ``keys`` maps each field to the config.json key it was read from (absent when
    a default applied), e.g. ``keys["n_layers"]`` is the key the trace engine rewrites to trace
    fewer layers. ``text`` / ``vision`` are the towers of a multi-part model (CLIP, LLaVA).
    """

    model_type: str | None
    architectures: tuple[str, ...] = ()
    hidden_size: int | None = None
    n_layers: int | None = None
    n_decoder_layers: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    vocab_size: int | None = None
    max_positions: int | None = None
    tie_word_embeddings: bool | None = None
    hidden_act: str | None = None
    mlp_gated: bool | None = None
    qkv_bias: bool | None = None
    o_bias: bool | None = None
    mlp_bias: bool | None = None
    rotary_dim: int | None = None
    sliding_window: int | None = None
    layer_types: tuple[str, ...] | None = None
    n_experts: int | None = None
    n_experts_per_token: int | None = None
    expert_intermediate_size: int | None = None
    n_shared_experts: int | None = None
    shared_expert_intermediate_size: int | None = None
    is_encoder_decoder: bool = False
    dtype: str | None = None
    quantization: QuantizationConfig | None = None
    attention_dropout: float | None = None
    hidden_dropout: float | None = None
    embedding_dropout: float | None = None
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    text: ModelSpec | None = None
    vision: ModelSpec | None = None
    keys: Mapping[str, str] = field(default_factory=dict, hash=False, repr=False)
    raw: Mapping[str, Any] = field(default_factory=dict, hash=False, repr=False)

    def __post_init__(self) -> None:
        if problems := self._problems():
            raise SpecError.from_problems(problems)
        for name in ("keys", "raw"):
            object.__setattr__(self, name, _frozen(getattr(self, name)))

    def _problems(self) -> list[str]:
        out: list[str] = []
        for name in _COUNTS + _MAY_BE_ZERO:
            value, least = getattr(self, name), 0 if name in _MAY_BE_ZERO else 1
            if value is not None and (not _is_int(value) or value < least):
                rule = "a non-negative" if least == 0 else "a positive"
                out.append(f"{name} ({value!r}) must be {rule} integer")
            elif value is not None and value > MAX_COUNT and name != "max_positions":
                out.append(f"{name} ({value!r}) must be at most {MAX_COUNT:,} (2**31 - 1)")
            elif value is not None and name in COUNT_LIMITS and value > COUNT_LIMITS[name][0]:
                upper, rule = COUNT_LIMITS[name]
                out.append(
                    f"{self.keys.get(name, name)} ({value:,}) is more than any model has: at most "
                    f"{upper:,} "
                    f"(memfit.spec.rules.{rule})"
                )
        for name in _DROPOUTS:
            value = getattr(self, name)
            if value is not None and not (_is_number(value) and 0.0 <= value <= 1.0):
                out.append(f"{name} ({value!r}) must be a probability between 0 and 1")
        if out:
            return out
        heads, kv, top_k, n_e = (
            self.n_heads,
            self.n_kv_heads,
            self.n_experts_per_token,
            self.n_experts,
        )
        if heads and kv and heads % kv:
            out.append(f"n_kv_heads ({kv}) must divide n_heads ({heads})")
        if top_k and n_e and top_k > n_e:  # n_experts 0: a dense model, top-k unused
            out.append(f"n_experts_per_token ({top_k}) must not exceed n_experts ({n_e})")
        if self.rotary_dim is not None and self.head_dim and self.rotary_dim > self.head_dim:
            out.append(f"rotary_dim ({self.rotary_dim}) must not exceed head_dim ({self.head_dim})")
        return out

    # ------------------------------------------------------------------------------ reading
    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelSpec:
        """Read a config.json dict; ModelConfigError naming the key for impossible values."""
        model_type = config.get("model_type")
        values, keys = readers.read_fields(config)
        problems: list[str] = []
        kwargs = {n: _typed(n, keys.get(n, n), v, problems) for n, v in values.items()}
        problems += _shape_problems(config)
        if problems:
            raise ModelConfigError(_joined(problems))
        _derive(config, kwargs)
        archs = config.get("architectures")
        text, vision = _towers(config)
        try:
            return cls(
                model_type=model_type if isinstance(model_type, str) else None,
                architectures=tuple(archs) if isinstance(archs, list) else (),
                text=text,
                vision=vision,
                quantization=_quantization(config),
                keys=keys,
                raw=config,
                **{k: kwargs[k] for k in _FIELD_NAMES if k in kwargs},
            )
        except SpecError as e:
            raise ModelConfigError(f"config.json: {e}") from None

    @classmethod
    def of(cls, model: ModelSpec | Mapping[str, Any]) -> ModelSpec:
        """``model`` itself when it is a ModelSpec, else the spec of that config.json dict.
        The spec of a dict read recently is kept (:data:`SPECS_KEPT`): an analytic estimate
        asks for it four times, a plan search ~2 000 times (issue 32); it is reused only while
        the dict is the same object with the same contents (a copy taken when it was read is
        compared, so a dict changed in place since is read again)."""
        if isinstance(model, ModelSpec):
            return model
        kept = _SPECS.get(id(model))
        if kept is not None and kept[0] is model and kept[1] == model:
            _SPECS.move_to_end(id(model))
            return kept[2]
        spec = cls.from_config(model)
        _SPECS[id(model)] = (model, copy.deepcopy(dict(model)), spec)
        while len(_SPECS) > SPECS_KEPT:
            _SPECS.popitem(last=False)
        return spec

    def get(self, key: str, default: Any = None) -> Any:
        """The raw config.json value of ``key`` (a family knob with no general field)."""
        value = self.raw.get(key)
        return default if value is None else value

    def text_field(self, name: str) -> Any:
        """Field ``name`` of the text tower where the model has one with that field set (CLIP,
        LLaVA), else this spec's own: what a consumer modelling the language part reads."""
        value = getattr(self.text, name) if self.text is not None else None
        return getattr(self, name) if value is None else value

    @property
    def n_layers_key(self) -> str | None:
        """The config.json key the layer count was read from (None: a family default)."""
        return self.keys.get("n_layers")

    @property
    def context_limit(self) -> int | None:
        """The positions config.json itself gives (``max_position_embeddings`` /
        ``n_positions`` / ``max_sequence_length``); None where only a config class's default
        would say, since that is no promise about the model's context."""
        return self.max_positions if "max_positions" in self.keys else None

    @property
    def kv_dim(self) -> int | None:
        """Width of one token's keys (= of its values): K/V heads x head_dim."""
        if self.n_kv_heads is None or self.head_dim is None:
            return None
        return self.n_kv_heads * self.head_dim

    @property
    def task(self) -> str:
        """What ``task="auto"`` means for this model, from ``model_type`` and ``architectures``:
        ``clip``, ``image-cls``, ``object-detection`` (DETR), ``speech-seq2seq`` (Whisper),
        ``seq2seq``, ``causal-lm`` or ``seq-cls``."""
        archs = " ".join(self.architectures)
        if self.model_type == "clip":
            return "clip"
        if self.model_type == "whisper":
            return "speech-seq2seq"
        if self.model_type == "detr":
            return "object-detection"
        if self.model_type in VISION_TYPES or "ImageClassification" in archs:
            return "image-cls"
        if self.is_encoder_decoder:
            return "seq2seq"
        if "CausalLM" in archs or "LMHead" in archs:
            return "causal-lm"
        if "SequenceClassification" in archs or "MaskedLM" in archs or archs.endswith("Model"):
            return "seq-cls"
        return "causal-lm"

    @property
    def n_params(self) -> int | None:
        """Parameters of the model memfit builds for :attr:`task` (tied weights once), counted
        from this spec's layout; None for a family without a counter."""
        return self.param_count(self.task)

    def param_count(self, task: str) -> int | None:
        """Parameters of the ``task`` model (``causal-lm``, ``seq-cls``…); None where unknown."""
        return count_params(self, task)


_FIELD_NAMES = tuple(f.name for f in fields(ModelSpec))


def _derive(config: Mapping[str, Any], f: dict[str, Any]) -> None:
    """The rules every transformers config class applies: K/V heads default to the query heads,
    ``head_dim`` to ``hidden_size / heads``; the rotary width from ``partial_rotary_factor``."""
    h, heads = f.get("hidden_size"), f.get("n_heads")
    if f.get("n_kv_heads") is None:
        f["n_kv_heads"] = heads
    if f.get("head_dim") is None and h and heads and h % heads == 0:
        f["head_dim"] = h // heads
    partial = f.pop("partial_rotary_factor", None)
    known = str(config.get("model_type")) in readers.FAMILY_DEFAULTS
    if partial is None and not known and any(k in config for k in ROPE_KEYS):
        partial = 1.0
    if partial is not None and f.get("head_dim"):
        f["rotary_dim"] = int(f["head_dim"] * partial)
    if f.get("layer_types") is not None:
        f["layer_types"] = tuple(str(t) for t in f["layer_types"])
    if f.get("is_encoder_decoder") is None:
        f["is_encoder_decoder"] = False
    for name in ("max_positions", "sliding_window"):
        if f.get(name) is not None and f[name] <= 0:
            f[name] = None  # configs write 0 / -1 for "no limit"


def _shape_problems(config: Mapping[str, Any]) -> list[str]:
    """Keys whose value no engine can read: an unknown ``torch_dtype``, RoPE scaling of an
    unknown type, a tower config that is not a mapping."""
    out: list[str] = []
    for key in ("torch_dtype", "dtype"):
        value = config.get(key)
        if value is not None and not (isinstance(value, str) and value in CONFIG_DTYPES):
            out.append(
                f"{key} ({_short(value)}) is not a torch dtype; use one of bfloat16, float16, "
                "float32 (or another torch dtype name)"
            )
    for key in ("rope_scaling", "rope_parameters"):
        out += _rope_problems(key, config.get(key))
    for key in ("text_config", "vision_config", "text_config_dict", "vision_config_dict"):
        value = config.get(key)
        if value is not None and not isinstance(value, Mapping):
            out.append(f"{key} ({_short(value)}) must be a mapping of config keys or null")
    return out


def _rope_problems(key: str, value: Any) -> list[str]:
    """A ``rope_scaling`` / ``rope_parameters`` value: null, one mapping with its type, or (per
    layer type, transformers 5) a mapping of such mappings."""
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [f"{key} ({_short(value)}) must be a mapping (e.g. {{'rope_type': 'linear'}})"]
    if "rope_type" not in value and "type" not in value:
        nested = [(f"{key}.{k}", v) for k, v in value.items() if isinstance(v, Mapping)]
        return [p for k, v in nested for p in _rope_problems(k, v)]
    kind = value.get("rope_type", value.get("type"))
    if isinstance(kind, str) and kind in ROPE_TYPES:
        return []
    return [
        f"{key} type ({_short(kind)}) is not a RoPE type: one of {', '.join(sorted(ROPE_TYPES))}"
    ]


def _short(value: Any) -> str:
    """``repr(value)`` cut to 40 characters for a message."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}… ({len(text):,} characters)"


def _typed(name: str, key: str, value: Any, problems: list[str]) -> Any:
    """``value`` as the field's type; a problem naming the config key when it cannot be. A list
    or mapping where one number is expected (per-layer head counts of repository-code models)
    and a boolean sliding window are not one value: unknown, None."""
    if value is None or (isinstance(value, list | dict) and name != "layer_types"):
        return None
    if name == "sliding_window" and isinstance(value, bool):
        return None
    if name in _INTS:
        if not (_is_int(value) or (_is_number(value) and float(value).is_integer())):
            problems.append(f"{key} ({value!r}) must be an integer")
            return None
        least = 0 if name in _MAY_BE_ZERO else 1
        if name not in ("max_positions", "sliding_window") and value < least:
            rule = "a non-negative" if least == 0 else "a positive"
            problems.append(f"{key} ({value!r}) must be {rule} integer")
        return int(value)
    elif name in _BOOLS:
        if isinstance(value, bool) or (_is_int(value) and value in (0, 1)):
            return bool(value)
        problems.append(f"{key} ({value!r}) must be true or false")
    elif name in _FLOATS:
        if _is_number(value):
            if name == "partial_rotary_factor" and not 0.0 < value <= 1.0:
                problems.append(f"{key} ({value!r}) must be a fraction in (0, 1]")
            elif name in _DROPOUTS and not 0.0 <= value <= 1.0:
                problems.append(f"{key} ({value!r}) must be a probability between 0 and 1")
            return float(value)
        problems.append(f"{key} ({value!r}) must be a number")
    elif name == "layer_types":
        if isinstance(value, list | tuple):
            return value
        problems.append(f"{key} ({value!r}) must be a list of layer kinds")
    elif name in ("hidden_act", "dtype"):
        return str(value)
    else:
        return value
    return None


def _towers(config: Mapping[str, Any]) -> tuple[ModelSpec | None, ModelSpec | None]:
    """The sub-specs of ``text_config`` / ``vision_config``. CLIP's towers follow
    ``CLIPConfig.__post_init__``: ``<key>_dict`` overrides ``<key>``, nulls take the tower
    config class's defaults (``clip_text_model`` / ``clip_vision_model``)."""
    out: list[ModelSpec | None] = []
    for key in ("text_config", "vision_config"):
        sub = config.get(key)
        if config.get("model_type") == "clip":
            merged = {**(sub or {}), **(config.get(key + "_dict") or {})}
            sub = {k: v for k, v in merged.items() if v is not None}
            sub.setdefault("model_type", f"clip_{key.split('_')[0]}_model")
        if not isinstance(sub, Mapping):
            out.append(None)
            continue
        try:
            out.append(ModelSpec.from_config(sub))
        except ModelConfigError as e:
            raise ModelConfigError(f"{key}: {e}") from None
    return out[0], out[1]


def _quantization(config: Mapping[str, Any]) -> QuantizationConfig | None:
    q = config.get("quantization_config")
    return QuantizationConfig.from_config(q) if isinstance(q, Mapping) else None


#: How many config dicts' specs :meth:`ModelSpec.of` keeps (least recently used dropped first);
#: each entry holds the dict (so its id is not reused while kept) and a deep copy of it.
SPECS_KEPT = 64
_SPECS: OrderedDict[int, tuple[Mapping[str, Any], dict[str, Any], ModelSpec]] = OrderedDict()


def _frozen(value: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only view of a copy of ``value`` (nested dicts stay as transformers reads them)."""
    return MappingProxyType(dict(value))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _joined(problems: list[str]) -> str:
    if len(problems) == 1:
        return f"config.json: {problems[0]}"
    return f"config.json: {len(problems)} problems: {'; '.join(problems)}"
