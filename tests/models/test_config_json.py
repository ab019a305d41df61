"""Broken, foreign and remote-code config.json files fail with messages that say what to do."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from memfit.errors import ModelConfigError
from memfit.models import resolve_model
from memfit.models.bundled import CONFIGS_DIR
from memfit.models.config_json import MAX_CONFIG_BYTES, builtin_model_types, check_config

LLAMA = json.loads((CONFIGS_DIR / "llama-3.2-1b.json").read_text(encoding="utf-8"))


def _write(tmp_path, content: str | bytes, name: str = "config.json"):
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def test_a_truncated_config_reports_path_position_and_next_step(tmp_path):
    text = json.dumps(LLAMA, indent=2)
    path = _write(tmp_path, text[: len(text) // 2])
    with pytest.raises(ModelConfigError) as info:
        resolve_model(str(path))
    message = str(info.value)
    assert str(path) in message
    assert "invalid JSON at line" in message and "(char " in message
    assert "ends early (truncated?)" in message
    assert "re-download it or pass another file" in message


def test_malformed_json_gives_line_and_column(tmp_path):
    path = _write(tmp_path, '{\n  "model_type": "llama",\n  "hidden_size": 64,,\n}')
    with pytest.raises(ModelConfigError, match=r"line 3, column 21 \(char 47\): Expecting prop"):
        resolve_model(str(path))


def test_an_empty_file_is_reported_as_empty(tmp_path):
    path = _write(tmp_path, "  \n")
    with pytest.raises(ModelConfigError, match=r"config\.json: the file is empty; re-download"):
        resolve_model(str(path))


def test_json_that_is_not_an_object_is_rejected(tmp_path):
    path = _write(tmp_path, "[1, 2, 3]")
    with pytest.raises(ModelConfigError, match=r"the JSON is a list, but a config\.json is an obj"):
        resolve_model(str(path))


def test_binary_data_is_reported_as_not_utf8(tmp_path):
    path = _write(tmp_path, b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ModelConfigError, match=r"not UTF-8 text \(byte 0\)"):
        resolve_model(str(path))


def test_an_oversized_file_is_refused_before_reading(tmp_path):
    path = _write(tmp_path, b" " * (MAX_CONFIG_BYTES + 1))
    with pytest.raises(ModelConfigError, match="is larger than 16,777,216 bytes"):
        resolve_model(str(path))


def test_a_config_without_model_type_is_rejected(tmp_path):
    path = _write(tmp_path, json.dumps({"hidden_size": 64, "num_hidden_layers": 2}))
    with pytest.raises(ModelConfigError, match=r"no model_type .*fix the file or pass another"):
        resolve_model(str(path))


def test_every_structural_problem_is_reported_together():
    bad = {
        **LLAMA,
        "hidden_size": 0,
        "num_hidden_layers": True,
        "vocab_size": "32000",
        "num_attention_heads": 30,
        "num_key_value_heads": 7,
    }
    bad.pop("head_dim")
    with pytest.raises(ModelConfigError) as info:
        check_config(bad, where="x.json", trust_remote_code=False)
    message = str(info.value)
    assert message.startswith("x.json: 4 problems: ")
    assert "hidden_size (0) must be a positive integer" in message
    assert "num_hidden_layers (True) must be a positive integer" in message
    assert "vocab_size ('32000') must be a positive integer" in message
    assert "num_key_value_heads (7) must divide num_attention_heads (30)" in message


def test_heads_must_divide_the_width_unless_head_dim_is_given():
    config = {**LLAMA, "hidden_size": 2000, "num_attention_heads": 32, "num_key_value_heads": 8}
    check_config(config, where="x", trust_remote_code=False)  # head_dim 64 is given
    config.pop("head_dim")
    with pytest.raises(ModelConfigError, match=r"num_attention_heads \(32\) must divide hidden_si"):
        check_config(config, where="x", trust_remote_code=False)


def test_gpt2_spellings_are_checked_too():
    config = {"model_type": "gpt2", "n_embd": 100, "n_head": 12, "n_layer": -1}
    with pytest.raises(ModelConfigError, match=r"n_layer \(-1\).*n_head \(12\) must divide n_embd"):
        check_config(config, where="x", trust_remote_code=False)


def test_nested_text_and_vision_configs_are_checked_with_their_prefix():
    config = {"model_type": "clip", "vision_config": {"hidden_size": 1024, "num_hidden_layers": 0}}
    with pytest.raises(ModelConfigError, match=r"vision_config\.num_hidden_layers \(0\)"):
        check_config(config, where="x", trust_remote_code=False)


def test_a_non_string_model_type_is_rejected():
    with pytest.raises(ModelConfigError, match=r"model_type \(7\) must be a non-empty string"):
        check_config({"model_type": 7}, where="x", trust_remote_code=False)


REMOTE = {
    "model_type": "my_new_arch",
    "architectures": ["MyNewArchForCausalLM"],
    "auto_map": {"AutoConfig": "configuration_new.NewConfig"},
    "hidden_size": 64,
}


def test_remote_code_architectures_need_trust_remote_code(tmp_path):
    pytest.importorskip("transformers")
    path = _write(tmp_path, json.dumps(REMOTE))
    with pytest.raises(ModelConfigError) as info:
        resolve_model(str(path))
    message = str(info.value)
    assert "model_type 'my_new_arch' is not built into transformers" in message
    assert "configuration_new.NewConfig" in message
    assert "Pass --trust-remote-code" in message and "only if you trust that repository" in message


def test_trust_remote_code_lets_a_remote_code_config_through(tmp_path):
    path = _write(tmp_path, json.dumps(REMOTE))
    source = resolve_model(str(path), trust_remote_code=True)
    assert (source.model_type, source.trust_remote_code) == ("my_new_arch", True)


def test_builtin_model_types_read_from_source_match_transformers_own_mapping():
    transformers_auto = pytest.importorskip("transformers.models.auto.configuration_auto")
    builtin_model_types.cache_clear()
    with pytest.MonkeyPatch.context() as mp:  # force the read-from-source path
        mp.delitem(sys.modules, "transformers.models.auto.configuration_auto")
        from_source = builtin_model_types()
    builtin_model_types.cache_clear()
    assert from_source == frozenset(transformers_auto.CONFIG_MAPPING_NAMES)
    assert {"llama", "falcon", "phi3", "gpt_bigcode", "t5"} <= from_source


def test_without_transformers_remote_code_cannot_be_decided_and_is_let_through(monkeypatch):
    builtin_model_types.cache_clear()
    monkeypatch.delitem(sys.modules, "transformers.models.auto.configuration_auto", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    try:
        assert builtin_model_types() is None
        check_config(REMOTE, where="x", trust_remote_code=False)
    finally:
        builtin_model_types.cache_clear()
