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


# --- constructs the line editor must round-trip or refuse (issue 33) -------------------------

import pytest  # noqa: E402

from memfit.jobfiles.edit import EditRefusedError, plan_edits  # noqa: E402
from memfit.jobfiles.edit_check import check_edit  # noqa: E402


def _edit(text: str, keys: list) -> str:
    new = set_yaml(text, keys, source="job.yml")
    check_edit(text, new, keys, is_yaml=True, source="job.yml")
    return new


def test_an_anchor_that_an_alias_repeats_is_refused_naming_the_line():
    text = "base_model: gpt2\nmicro_batch_size: &mb 4\neval_batch_size: *mb\n"
    with pytest.raises(
        EditRefusedError, match=r"job.yml line 2: micro_batch_size carries the anchor &mb.*by hand"
    ):
        _edit(text, [("micro_batch_size", 2)])


def test_an_anchor_no_alias_uses_is_kept_and_the_value_changed():
    out = _edit("micro_batch_size: &mb 4  # per GPU\nx: 1\n", [("micro_batch_size", 2)])
    assert out == "micro_batch_size: &mb 2  # per GPU\nx: 1\n"
    assert yaml.safe_load(out) == {"micro_batch_size": 2, "x": 1}


def test_editing_an_anchored_block_that_a_merge_key_reuses_is_refused():
    text = "base: &b\n  micro: 4\ntrain:\n  <<: *b\n  lr: 1\n"
    with pytest.raises(
        EditRefusedError, match=r"train\.micro = 2 instead of 4.*by hand: base.micro: 2"
    ):
        _edit(text, [("base.micro", 2)])
    # setting the key under the merge overrides it there only: valid, and only that key changes
    assert yaml.safe_load(_edit(text, [("train.micro", 2)]))["train"] == {"micro": 2, "lr": 1}


def test_a_key_inside_a_flow_mapping_is_refused_naming_the_construct():
    text = "checkpoint_dir: x\ntrain: {micro_batch_size: 4, epochs: 1}\n"
    with pytest.raises(
        EditRefusedError,
        match=r"job.yml line 2: train is written as a flow mapping"
        r".*set train.micro_batch_size: 2 by hand",
    ):
        _edit(text, [("train.micro_batch_size", 2)])


def test_keys_go_before_a_document_end_marker():
    text = "---\nbase_model: gpt2\nmicro_batch_size: 4\n...\n# notes after the document\n"
    out = _edit(text, [("micro_batch_size", 2), ("gradient_checkpointing", True)])
    assert out == (
        "---\nbase_model: gpt2\nmicro_batch_size: 2\ngradient_checkpointing: true\n...\n"
        "# notes after the document\n"
    )


def test_values_over_several_lines_are_refused():
    with pytest.raises(EditRefusedError, match="spans several lines"):
        _edit("optim: |\n  adamw\nx: 1\n", [("optim", "adamw_8bit")])
    with pytest.raises(EditRefusedError, match="spans several lines"):
        _edit("optimizer:\n  _component_: x\n", [("optimizer", "adamw")])


def test_a_quoted_key_is_replaced_not_added_twice():
    out = _edit('"micro_batch_size": 4\nx: 1\n', [("micro_batch_size", 2)])
    assert out == '"micro_batch_size": 2\nx: 1\n'


def test_a_string_yaml_would_misread_is_quoted():
    assert yaml.safe_load(_edit("optim: adamw\n", [("optim", "yes")])) == {"optim": "yes"}
    assert yaml.safe_load(_edit("optim: adamw\n", [("optim", "a #b")])) == {"optim": "a #b"}


def test_an_edit_that_changes_another_key_is_refused():
    with pytest.raises(EditRefusedError, match=r"would leave y = \(absent\) instead of 2"):
        check_edit("x: 1\ny: 2\n", "x: 3\n", [("x", 3)], is_yaml=True, source="job.yml")
    with pytest.raises(EditRefusedError, match="would not parse at line"):
        check_edit("x: 1\n", "x: [3\n", [("x", 3)], is_yaml=True, source="job.yml")


def test_a_json_parent_that_is_not_an_object_is_refused():
    with pytest.raises(EditRefusedError, match=r"zero_optimization is 'auto', not an object"):
        set_json('{"zero_optimization": "auto"}', [("zero_optimization.stage", 3)])


def test_a_refused_edit_is_shown_instead_of_its_diff(tmp_path):
    from memfit.jobfiles import read_job

    f = tmp_path / "job.yml"
    f.write_text(
        "base_model: gpt2\nsequence_len: 64\nmicro_batch_size: &mb 4\neval_batch_size: *mb\n"
    )
    job = read_job([f])
    edits, _ = plan_edits(job.files, {"batch_size": 2}, {})
    assert edits[0].refused and edits[0].new_text == edits[0].old_text
    assert edits[0].diff().startswith(f"memfit cannot edit {f}: {f} line 3: micro_batch_size")


@pytest.mark.parametrize(
    ("precision", "dtype"), [("bf16-true", "bfloat16"), ("16-true", "float16")]
)
def test_a_16_bit_base_is_written_as_the_trl_load_dtype(tmp_path, precision, dtype):
    """The fix's precision (memfit's names: ``16-true`` on a GPU without bf16) becomes TRL's
    ``model_init_kwargs.dtype`` where the file has that key."""
    from memfit.jobfiles import read_job

    f = tmp_path / "sft.yaml"
    f.write_text(
        "model_name_or_path: gpt2\nuse_peft: true\nlora_r: 16\nbf16: true\n"
        "model_init_kwargs:\n  dtype: float32\n"
    )
    job = read_job([f])
    edits, unexpressed = plan_edits(job.files, {"precision": precision}, {})
    assert not unexpressed and len(edits) == 1
    assert yaml.safe_load(edits[0].new_text)["model_init_kwargs"]["dtype"] == dtype
