"""resolve_model: paths, folders with weights, factories, unknown names and ModelSource itself."""

from __future__ import annotations

import json

import pytest

from memfit.errors import ModelConfigError, SpecError, UnknownModelError
from memfit.models import ModelSource, resolve_model
from memfit.models.bundled import CONFIGS_DIR

GPT2 = json.loads((CONFIGS_DIR / "gpt2.json").read_text(encoding="utf-8"))


def _model_dir(tmp_path, name="my-gpt"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(GPT2), encoding="utf-8")
    return folder


def test_a_config_file_path_resolves_with_the_folder_as_display_name(tmp_path):
    folder = _model_dir(tmp_path)
    source = resolve_model(str(folder / "config.json"))
    assert (source.origin, source.name, source.model_type) == ("path", "my-gpt", "gpt2")
    assert source.config == GPT2
    assert source.config_path == str(folder / "config.json")
    assert source.safetensors is None and source.source_url is None


def test_a_differently_named_config_file_is_shown_by_its_stem(tmp_path):
    path = tmp_path / "tiny-gpt.json"
    path.write_text(json.dumps(GPT2), encoding="utf-8")
    assert resolve_model(path).name == "tiny-gpt"


def test_a_folder_with_safetensors_gets_exact_counts_from_the_headers(tmp_path):
    torch = pytest.importorskip("torch")
    save_file = pytest.importorskip("safetensors.torch").save_file
    folder = _model_dir(tmp_path)
    save_file(
        {
            "wte": torch.zeros(10, 8, dtype=torch.bfloat16),
            "ln.weight": torch.zeros(8, dtype=torch.float32),
            "ln.bias": torch.zeros(8, dtype=torch.float32),
        },
        str(folder / "model.safetensors"),
    )
    source = resolve_model(str(folder))
    assert (source.origin, source.name) == ("path", "my-gpt")
    assert source.safetensors.n_params == 96
    assert source.safetensors.dtype_counts == {"BF16": 80, "F32": 16}
    assert source.safetensors.total_bytes == 80 * 2 + 16 * 4
    assert source.safetensors.files == (str(folder / "model.safetensors"),)


def test_a_folder_without_weights_resolves_with_no_safetensors_info(tmp_path):
    source = resolve_model(str(_model_dir(tmp_path)))
    assert source.config == GPT2 and source.safetensors is None


def test_a_folder_without_config_json_says_what_to_pass(tmp_path):
    with pytest.raises(ModelConfigError, match="the folder has no config.json; pass the folder"):
        resolve_model(str(tmp_path))


def test_a_weights_file_passed_as_model_points_to_its_folder(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(ModelConfigError, match="a weights file, not a config; pass the folder"):
        resolve_model(str(path))


def test_an_existing_path_wins_over_a_bundled_name(tmp_path, monkeypatch):
    _model_dir(tmp_path, name="gpt2")
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({**GPT2, "n_layer": 2}))
    monkeypatch.chdir(tmp_path)
    source = resolve_model("gpt2")
    assert (source.origin, source.config["n_layer"]) == ("path", 2)


def test_module_function_syntax_is_recorded_as_a_factory_without_importing_it():
    source = resolve_model("not_installed_pkg.models.zoo:build_model", allow_code=True)
    assert (source.origin, source.factory) == (
        "factory",
        "not_installed_pkg.models.zoo:build_model",
    )
    assert source.config is None and source.model_type is None


@pytest.mark.parametrize("text", ["pkg:fn", "a.b.c:make_2", "_private.mod:_f"])
def test_factory_syntax_accepts_dotted_modules_and_identifiers(text):
    assert resolve_model(text, allow_code=True).origin == "factory"


@pytest.mark.parametrize("text", ["pkg:", ":fn", "pkg:fn:extra", "1pkg:fn", "pkg.:fn", "pkg:fn()"])
def test_strings_that_are_not_factories_are_not_taken_for_one(text):
    with pytest.raises(UnknownModelError, match="unknown model"):
        resolve_model(text)


def test_a_misspelled_name_lists_close_bundled_matches_and_accepted_forms():
    with pytest.raises(UnknownModelError) as info:
        resolve_model("lama-3.1-8b")
    message = str(info.value)
    assert "did you mean llama-3.1-8b" in message
    assert "path/to/config.json" in message and "org/name" in message
    assert "package.module:function" in message
    assert "\n" not in message


def test_close_matches_also_come_from_hub_ids():
    with pytest.raises(UnknownModelError, match="did you mean llama-2-7b"):
        resolve_model("meta-llama-Llama-2-7b-hf")  # a dash typed for the hub id's slash


def test_a_missing_path_is_reported_as_a_missing_path(tmp_path):
    missing = tmp_path / "nope" / "config.json"
    with pytest.raises(UnknownModelError, match=r"no file or folder at .*nope/config\.json"):
        resolve_model(str(missing))


def test_an_empty_name_is_rejected():
    with pytest.raises(UnknownModelError, match="the model name is empty"):
        resolve_model("   ")


def test_model_source_rejects_inconsistent_fields():
    with pytest.raises(SpecError, match=r"origin \('zoo'\) must be one of bundled, path, hub"):
        ModelSource(
            name="x",
            origin="zoo",
            config={},
            source_url=None,
            config_path=None,
            safetensors=None,
            factory=None,
        )
    with pytest.raises(SpecError, match="factory .* must be set exactly when origin is 'factory'"):
        ModelSource(
            name="x",
            origin="factory",
            config=None,
            source_url=None,
            config_path=None,
            safetensors=None,
            factory=None,
        )


def test_model_source_is_frozen():
    source = resolve_model("gpt2")
    with pytest.raises(AttributeError, match="cannot assign to field"):
        source.name = "other"  # type: ignore[misc]


def test_names_the_os_cannot_look_up_are_not_taken_for_paths():
    with pytest.raises(UnknownModelError, match="unknown model"):
        resolve_model("x" * 5000)
