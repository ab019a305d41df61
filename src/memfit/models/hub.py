"""Fetching one ``config.json`` from the Hugging Face hub, cached on disk.

Only ``config.json`` is ever downloaded (a few kB), never weights. Copies are kept under, in order
of precedence: the ``cache_dir`` argument, ``$MEMFIT_CACHE_DIR/hub``, ``~/.cache/memfit/hub``, as
``<org>--<name>/config.json``; a cached copy is used without touching the network.

The download itself is :func:`download_config`, the only function here that touches the network
(tests replace it). It uses ``huggingface_hub`` when installed (honouring ``HF_TOKEN``,
``HF_ENDPOINT`` and the huggingface cache) and plain ``urllib`` otherwise. With ``HF_HUB_OFFLINE``
set, nothing is requested: a copy already in the huggingface cache is used, else the fetch fails.

Failures map onto the error tree with one-line messages that say how to continue offline:
HubUnavailableError (no network, offline mode, gated or private repository) and UnknownModelError
(no such repository, or it has no config.json).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from memfit.errors import HubUnavailableError, ModelConfigError, SpecError, UnknownModelError
from memfit.models.bundled import BundledModel, find_bundled
from memfit.models.config_json import parse_config_text
from memfit.userfiles import CONFIG_MAX_BYTES, UserFileError, read_text

DEFAULT_ENDPOINT = "https://huggingface.co"
#: Seconds to wait for the hub before giving up (urllib path; huggingface_hub uses its own).
TIMEOUT_S = 10.0
LOCAL_COPY_HINT = "download config.json yourself and pass it: memfit estimate path/to/config.json"
_TRUE = {"1", "ON", "YES", "TRUE"}


def hub_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where fetched configs are kept (see the module docstring for the precedence)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    root = os.environ.get("MEMFIT_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "hub"
    return Path.home() / ".cache" / "memfit" / "hub"


def cached_config_path(hf_id: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return hub_cache_dir(cache_dir) / hf_id.replace("/", "--") / "config.json"


def source_url(hf_id: str) -> str:
    return f"https://huggingface.co/{hf_id}/blob/main/config.json"


def fetch_config(hf_id: str, *, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The path of a local copy of ``hf_id``'s config.json, downloading it on a cache miss.

    A download is checked to be a JSON object before it is cached, so an error page never
    poisons the cache.
    """
    path = cached_config_path(hf_id, cache_dir)
    if path.is_file():
        return path
    text = download_config(
        hf_id, token=os.environ.get("HF_TOKEN") or None, offline=_offline_requested()
    )
    parse_config_text(text, where=f"config.json downloaded for {hf_id!r}")
    try:
        _write_atomically(path, text)
    except OSError as e:
        raise SpecError(
            f"cannot write memfit's hub cache at {path.parent} ({e.strerror or e}); set "
            "MEMFIT_CACHE_DIR or pass cache_dir to a writable folder"
        ) from None
    return path


def _write_atomically(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so readers never see half a config."""
    import tempfile  # only when a downloaded config is kept

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)  # gone already after a successful rename


def _offline_requested() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE


def download_config(hf_id: str, *, token: str | None, offline: bool) -> str:
    """The text of ``hf_id``'s config.json; the only network access in memfit.models."""
    try:
        import huggingface_hub  # noqa: F401  (only probing whether it is installed)
    except ImportError:
        if offline:
            raise HubUnavailableError(
                f"HF_HUB_OFFLINE is set and {hf_id!r} is not in memfit's cache; "
                f"unset HF_HUB_OFFLINE, or {LOCAL_COPY_HINT}{_base_hint(hf_id)}"
            ) from None
        return _download_with_urllib(hf_id, token=token)
    return _download_with_hf_hub(hf_id, token=token, offline=offline)


#: Seconds to wait for a TCP connection to the hub before treating it as unreachable (without
#: this probe, huggingface_hub retries for ~25 s with a warning per retry).
HUB_CONNECT_TIMEOUT_S = 3.0


def _hub_reachable() -> bool:
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=HUB_CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False


def _download_with_hf_hub(hf_id: str, *, token: str | None, offline: bool) -> str:
    from huggingface_hub import errors, hf_hub_download

    # Unreachable hub: only huggingface's own cache can answer.
    cache_only = offline or not _hub_reachable()
    try:
        path = hf_hub_download(hf_id, "config.json", token=token, local_files_only=cache_only)
    except errors.GatedRepoError:
        raise _gated(hf_id) from None
    except errors.RepositoryNotFoundError:
        raise _not_found(hf_id) from None
    except errors.LocalEntryNotFoundError:
        if offline:
            raise HubUnavailableError(
                f"HF_HUB_OFFLINE is set and {hf_id!r} is in neither memfit's nor the huggingface "
                f"cache; unset HF_HUB_OFFLINE, or {LOCAL_COPY_HINT}{_base_hint(hf_id)}"
            ) from None
        raise _unreachable(hf_id, "no connection") from None
    except errors.EntryNotFoundError:
        raise _no_config(hf_id) from None
    except errors.HFValidationError as e:
        raise UnknownModelError(
            f"{hf_id!r} is not a valid hub id ({e}); {LOCAL_COPY_HINT}"
        ) from None
    except OSError as e:  # HfHubHTTPError (5xx, 403), OfflineModeIsEnabled, socket errors
        raise _unreachable(hf_id, f"{type(e).__name__}: {e}".splitlines()[0]) from None
    try:
        return read_text(str(path), what=f"config.json of {hf_id!r} in the huggingface cache")
    except UserFileError as e:
        raise ModelConfigError(str(e)) from None


def _download_with_urllib(hf_id: str, *, token: str | None) -> str:
    # urllib.request (http.client, ssl, email: ~0.03 s) is imported when memfit downloads, not
    # with every MODEL resolved from a bundled name or a path (issue 32)
    import urllib.error
    import urllib.request

    endpoint = os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")
    request = urllib.request.Request(f"{endpoint}/{hf_id}/resolve/main/config.json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
            body: bytes = response.read(CONFIG_MAX_BYTES + 1)
            if len(body) > CONFIG_MAX_BYTES:
                raise ModelConfigError(
                    f"the hub's config.json for {hf_id!r} is over {CONFIG_MAX_BYTES:,} bytes: "
                    f"not a config; {LOCAL_COPY_HINT}"
                )
    except urllib.error.HTTPError as e:
        if e.code in (401, 403):
            raise _gated(hf_id) from None
        if e.code == 404:
            raise _not_found(hf_id) from None
        raise _unreachable(hf_id, f"HTTP {e.code}") from None
    except (urllib.error.URLError, OSError) as e:
        raise _unreachable(hf_id, str(getattr(e, "reason", e))) from None
    return body.decode("utf-8", errors="replace")


def _gated(hf_id: str) -> HubUnavailableError:
    return HubUnavailableError(
        f"{hf_id!r} is gated or private on the hub: accept its terms at "
        f"https://huggingface.co/{hf_id} and set HF_TOKEN, or {LOCAL_COPY_HINT}"
    )


def _not_found(hf_id: str) -> UnknownModelError:
    return UnknownModelError(
        f"no repository {hf_id!r} on the Hugging Face hub (404); check the id, or {LOCAL_COPY_HINT}"
    )


def _no_config(hf_id: str) -> UnknownModelError:
    return UnknownModelError(
        f"{hf_id!r} on the hub has no config.json (GGUF or adapter-only repositories have none); "
        f"pass the base model instead, or {LOCAL_COPY_HINT}"
    )


def _unreachable(hf_id: str, why: str) -> HubUnavailableError:
    return HubUnavailableError(
        f"could not fetch config.json for {hf_id!r} from the Hugging Face hub ({why}); "
        f"{LOCAL_COPY_HINT}{_base_hint(hf_id)}"
    )


def _base_hint(hf_id: str) -> str:
    """Where the hub cannot be read: the bundled base model of an instruct / chat variant."""
    base = bundled_base(hf_id)
    if base is None:
        return ""
    return (
        f"; memfit ships the config of its base model, {base.name} ({base.hf_id}): an "
        "instruct / chat variant usually keeps the base's architecture (its context length "
        f"may differ), so `{base.name}` sizes the same layers offline"
    )


#: Suffixes of post-trained variants of a base model's hub id (``-Instruct``, ``-it``, ...),
#: with an optional version tail (``-Instruct-v0.1`` → ``-v0.1`` on the base).
_VARIANT = re.compile(r"-(instruct|it|chat|sft|dpo)(?=$|-)", re.IGNORECASE)


def bundled_base(hf_id: str) -> BundledModel | None:
    """The bundled model an instruct / chat variant's hub id names as its base
    (``meta-llama/Llama-3.1-70B-Instruct`` → llama-3.1-70b), None where none is bundled."""
    base_id = _VARIANT.sub("", hf_id, count=1)
    if base_id == hf_id:
        return None
    return find_bundled(base_id)
