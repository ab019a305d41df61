"""Where model descriptions come from: bundled configs, local files and folders, the hub, factories.

>>> from memfit.models import resolve_model
>>> source = resolve_model("llama-3.1-8b")        # bundled: no network
>>> source.origin, source.model_type
('bundled', 'llama')
>>> source.spec.n_kv_heads, source.spec.n_params       # the ModelSpec read from its config.json
(8, 8030261248)

Importing this package never imports torch or transformers (a test guards it).
"""

from memfit.models.bundled import BundledModel, list_bundled
from memfit.models.model_spec import ModelSpec, QuantizationConfig
from memfit.models.safetensors_header import SafetensorsInfo, read_safetensors_header
from memfit.models.source import ModelSource, allowing_code, resolve_model, take_media

__all__ = [
    "BundledModel",
    "ModelSource",
    "ModelSpec",
    "QuantizationConfig",
    "SafetensorsInfo",
    "allowing_code",
    "list_bundled",
    "read_safetensors_header",
    "resolve_model",
    "take_media",
]
