"""Hub ids: cached copies, simulated downloads and simulated failures. No test touches the network.

``memfit.models.hub.download_config`` is the only function that would; tests replace it, or the
``huggingface_hub``/``urllib`` call beneath it, with fakes.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

import pytest

from memfit.errors import HubUnavailableError, ModelConfigError, SpecError, UnknownModelError
from memfit.models import hub, resolve_model
from memfit.models.bundled import CONFIGS_DIR

CONFIG = json.loads((CONFIGS_DIR / "qwen2.5-0.5b.json").read_text(encoding="utf-8"))
HF_ID = "someorg/some-model"


@pytest.fixture
def no_network(monkeypatch):
    """Make any download attempt fail the test, and count attempts."""

    def refuse(hf_id, *, token, offline):
        raise AssertionError(f"tried to download {hf_id}")

    monkeypatch.setattr(hub, "download_config", refuse)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


@pytest.fixture
def fake_download(monkeypatch):
    calls = []

    def download(hf_id, *, token, offline):
        calls.append({"hf_id": hf_id, "token": token, "offline": offline})
        return json.dumps(CONFIG)

    monkeypatch.setattr(hub, "download_config", download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return calls


def test_a_cached_config_is_used_without_network(tmp_path, no_network):
    path = hub.cached_config_path(HF_ID, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(CONFIG), encoding="utf-8")
    source = resolve_model(HF_ID, cache_dir=tmp_path)
    assert (source.origin, source.name, source.config) == ("hub", HF_ID, CONFIG)
    assert source.config_path == str(tmp_path / "someorg--some-model" / "config.json")
    assert source.source_url == f"https://huggingface.co/{HF_ID}/blob/main/config.json"


def test_a_download_is_cached_and_not_repeated(tmp_path, fake_download):
    first = resolve_model(HF_ID, cache_dir=tmp_path)
    second = resolve_model(HF_ID, cache_dir=tmp_path)
    assert first.config == second.config == CONFIG
    assert len(fake_download) == 1
    assert json.loads((tmp_path / "someorg--some-model" / "config.json").read_text()) == CONFIG


def test_hf_token_is_handed_to_the_download(tmp_path, fake_download, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    resolve_model(HF_ID, cache_dir=tmp_path)
    assert fake_download == [{"hf_id": HF_ID, "token": "hf_secret", "offline": False}]


def test_memfit_cache_dir_environment_variable_sets_the_cache_root(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMFIT_CACHE_DIR", str(tmp_path))
    assert hub.hub_cache_dir() == tmp_path / "hub"
    assert hub.hub_cache_dir(tmp_path / "explicit") == tmp_path / "explicit"


def test_the_default_cache_is_under_the_home_directory(monkeypatch, tmp_path):
    monkeypatch.delenv("MEMFIT_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub.hub_cache_dir() == tmp_path / ".cache" / "memfit" / "hub"


def test_an_html_error_page_is_not_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(hub, "download_config", lambda *a, **k: "<html>Rate limited</html>")
    with pytest.raises(
        ModelConfigError, match=r"downloaded for 'someorg/some-model'.*invalid JSON"
    ):
        resolve_model(HF_ID, cache_dir=tmp_path)
    assert not hub.cached_config_path(HF_ID, tmp_path).exists()


def test_a_corrupt_cached_copy_says_to_delete_it(tmp_path, no_network):
    path = hub.cached_config_path(HF_ID, tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text('{"model_type": "qwen2", "hidd', encoding="utf-8")
    with pytest.raises(ModelConfigError, match="memfit's cached copy of .*delete it to download"):
        resolve_model(HF_ID, cache_dir=tmp_path)


def _hub_error(cls, message="simulated"):
    """An instance of a huggingface_hub HTTP error without the HTTP response it usually wraps."""
    error = cls.__new__(cls)
    Exception.__init__(error, message)
    return error


@pytest.fixture
def fake_hf_hub(monkeypatch):
    """Replace huggingface_hub.hf_hub_download; the test sets ``.error`` to raise and sees calls."""
    huggingface_hub = pytest.importorskip("huggingface_hub")

    class Fake:
        error: BaseException | None = None
        calls: list[dict] = []

        def __call__(self, repo_id, filename, **kwargs):
            self.calls.append({"repo_id": repo_id, "filename": filename, **kwargs})
            if self.error is not None:
                raise self.error
            raise AssertionError("set .error")

    fake = Fake()
    fake.calls = []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return fake


def test_offline_mode_fails_with_a_way_to_pass_a_local_file(tmp_path, fake_hf_hub, monkeypatch):
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fake_hf_hub.error = LocalEntryNotFoundError("not in cache")
    with pytest.raises(HubUnavailableError) as info:
        resolve_model(HF_ID, cache_dir=tmp_path)
    message = str(info.value)
    assert "HF_HUB_OFFLINE is set" in message and repr(HF_ID) in message
    assert "memfit estimate path/to/config.json" in message and "\n" not in message
    assert fake_hf_hub.calls[0]["local_files_only"] is True
    assert fake_hf_hub.calls[0]["filename"] == "config.json"


def test_no_connection_is_a_hub_unavailable_error(tmp_path, fake_hf_hub):
    from huggingface_hub.errors import LocalEntryNotFoundError

    fake_hf_hub.error = LocalEntryNotFoundError("connection error")
    with pytest.raises(HubUnavailableError, match=r"could not fetch config.json .*no connection"):
        resolve_model(HF_ID, cache_dir=tmp_path)


def test_a_gated_repository_explains_how_to_get_access(tmp_path, fake_hf_hub):
    from huggingface_hub.errors import GatedRepoError

    fake_hf_hub.error = _hub_error(GatedRepoError)
    with pytest.raises(HubUnavailableError, match=r"gated or private.*set HF_TOKEN.*memfit estim"):
        resolve_model(HF_ID, cache_dir=tmp_path)


def test_a_missing_repository_is_an_unknown_model(tmp_path, fake_hf_hub):
    from huggingface_hub.errors import RepositoryNotFoundError

    fake_hf_hub.error = _hub_error(RepositoryNotFoundError)
    with pytest.raises(
        UnknownModelError, match=r"no repository 'someorg/some-model'.*\(404\)"
    ) as e:
        resolve_model(HF_ID, cache_dir=tmp_path)
    assert not isinstance(e.value, HubUnavailableError)


def test_a_repository_without_config_json_says_so(tmp_path, fake_hf_hub):
    from huggingface_hub.errors import RemoteEntryNotFoundError

    fake_hf_hub.error = _hub_error(RemoteEntryNotFoundError)
    with pytest.raises(UnknownModelError, match="has no config.json"):
        resolve_model(HF_ID, cache_dir=tmp_path)


def test_a_server_error_is_a_hub_unavailable_error(tmp_path, fake_hf_hub):
    from huggingface_hub.errors import HfHubHTTPError

    fake_hf_hub.error = _hub_error(HfHubHTTPError, "500 Server Error")
    with pytest.raises(HubUnavailableError, match=r"\(HfHubHTTPError: 500 Server Error\)"):
        resolve_model(HF_ID, cache_dir=tmp_path)


@pytest.fixture
def without_huggingface_hub(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import now raises ImportError
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def _urlopen_raising(error):
    def urlopen(request, timeout):
        raise error

    return urlopen


@pytest.mark.parametrize(
    ("error", "kind", "pattern"),
    [
        (urllib.error.URLError("Name or service not known"), HubUnavailableError, "not known"),
        (urllib.error.HTTPError("u", 404, "Not Found", {}, None), UnknownModelError, r"\(404\)"),
        (urllib.error.HTTPError("u", 401, "Unauthorized", {}, None), HubUnavailableError, "gated"),
        (urllib.error.HTTPError("u", 503, "Unavailable", {}, None), HubUnavailableError, "503"),
    ],
)
def test_without_huggingface_hub_urllib_failures_map_onto_the_error_tree(
    tmp_path, monkeypatch, without_huggingface_hub, error, kind, pattern
):
    monkeypatch.setattr(urllib.request, "urlopen", _urlopen_raising(error))
    with pytest.raises(kind, match=pattern):
        resolve_model(HF_ID, cache_dir=tmp_path)


def test_without_huggingface_hub_urllib_sends_the_token(
    tmp_path, monkeypatch, without_huggingface_hub
):
    seen = {}

    class Response:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def read(self, n=-1):
            return json.dumps(CONFIG).encode()

    def urlopen(request, timeout):
        seen["url"], seen["auth"] = request.full_url, request.get_header("Authorization")
        return Response()

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert resolve_model(HF_ID, cache_dir=tmp_path).config == CONFIG
    assert seen == {
        "url": f"https://huggingface.co/{HF_ID}/resolve/main/config.json",
        "auth": "Bearer hf_secret",
    }


def test_without_huggingface_hub_offline_mode_makes_no_request(
    tmp_path, monkeypatch, without_huggingface_hub
):
    monkeypatch.setattr(urllib.request, "urlopen", _urlopen_raising(AssertionError("network")))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(HubUnavailableError, match="HF_HUB_OFFLINE is set"):
        resolve_model(HF_ID, cache_dir=tmp_path)


def test_an_unwritable_cache_says_how_to_move_it(tmp_path, fake_download):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    with pytest.raises(SpecError, match=r"cannot write memfit's hub cache .*MEMFIT_CACHE_DIR"):
        resolve_model(HF_ID, cache_dir=blocker)


@pytest.mark.parametrize(
    ("variant", "base"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),  # an alias of the base
        ("mistralai/Mistral-7B-Instruct-v0.1", "mistral-7b-v0.1"),  # version after the suffix
        ("google/gemma-2-9b-it", "gemma-2-9b"),
    ],
)
def test_an_unreachable_variant_names_its_bundled_base(tmp_path, fake_hf_hub, variant, base):
    from huggingface_hub.errors import LocalEntryNotFoundError

    fake_hf_hub.error = LocalEntryNotFoundError("connection error")
    with pytest.raises(HubUnavailableError) as info:
        resolve_model(variant, cache_dir=tmp_path)
    message = str(info.value)
    assert f"memfit ships the config of its base model, {base} " in message
    assert f"`{base}` sizes the same layers offline" in message and "\n" not in message


def test_an_unreachable_model_without_a_bundled_base_gets_no_base_hint(tmp_path, fake_hf_hub):
    from huggingface_hub.errors import LocalEntryNotFoundError

    fake_hf_hub.error = LocalEntryNotFoundError("connection error")
    for hf_id in ("someone/tiny-model-Instruct", "someone/model-without-suffix"):
        with pytest.raises(HubUnavailableError) as info:
            resolve_model(hf_id, cache_dir=tmp_path)
        assert "base model" not in str(info.value)
