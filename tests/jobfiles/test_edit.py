"""The edit keeps the user's file as they wrote it, changing only the keys it must."""

from __future__ import annotations

import json

import yaml

from memfit.jobfiles.edit import set_json, set_yaml

YAML = """# my run
model:
  _component_: torchtune.models.llama3_1.lora_llama3_1_8b
  lora_rank: 8  # small

batch_size: 4
optimizer:
  _component_: torch.optim.AdamW
  lr: 3e-4
"""


def test_a_yaml_key_is_replaced_in_place_with_its_comment():
    out = set_yaml(YAML, [("model.lora_rank", 16), ("batch_size", 2)])
    assert "  lora_rank: 16  # small\n" in out and "\nbatch_size: 2\n" in out
    assert out.startswith("# my run\n")
    assert len(out.splitlines()) == len(YAML.splitlines())


def test_a_missing_yaml_key_is_added_under_its_block():
    out = set_yaml(
        YAML,
        [
            ("optimizer._component_", "bitsandbytes.optim.AdamW8bit"),
            ("enable_activation_checkpointing", True),
            ("a.b.c", 1),
        ],
    )
    data = yaml.safe_load(out)
    assert data["optimizer"]["_component_"] == "bitsandbytes.optim.AdamW8bit"
    assert "lr" in data["optimizer"]
    assert data["enable_activation_checkpointing"] is True
    assert data["a"] == {"b": {"c": 1}}
    assert data["model"]["lora_rank"] == 8


def test_json_keeps_its_indentation_and_key_order():
    text = (
        '{\n    "zero_optimization": {\n        "stage": 2\n    },\n'
        '    "bf16": {"enabled": "auto"}\n}\n'
    )
    out = set_json(
        text,
        [("zero_optimization.stage", 3), ("zero_optimization.offload_optimizer.device", "cpu")],
    )
    data = json.loads(out)
    assert data["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    assert list(data) == ["zero_optimization", "bf16"]
    assert '\n    "zero_optimization"' in out and out.endswith("}\n")
