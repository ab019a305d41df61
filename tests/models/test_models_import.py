"""``import memfit.models`` stays light: no torch, transformers or huggingface_hub."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import memfit.models

SRC = str(Path(memfit.models.__file__).resolve().parents[2])
HEAVY = ("torch", "transformers", "huggingface_hub")


def _modules_after(code: str) -> dict[str, bool]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")])}
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY}}}))"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_importing_memfit_models_imports_no_torch_transformers_or_hub():
    assert _modules_after("import memfit.models") == dict.fromkeys(HEAVY, False)


def test_resolving_a_bundled_config_without_auto_map_stays_torch_free():
    loaded = _modules_after("import memfit.models as m; m.resolve_model('llama-3.1-8b')")
    assert loaded == dict.fromkeys(HEAVY, False)


def test_public_api_is_exactly_the_documented_names():
    assert sorted(memfit.models.__all__) == [
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


def test_deciding_remote_code_for_auto_map_configs_does_not_import_torch():
    # falcon-7b and phi-3 carry auto_map but are built into transformers
    code = (
        "import memfit.models as m; m.resolve_model('falcon-7b'); m.resolve_model('phi-3-mini-4k')"
    )
    assert _modules_after(code) == dict.fromkeys(HEAVY, False)
