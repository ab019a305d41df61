"""Turning the MODEL argument into a :class:`ModelSource`: its config, its ModelSpec, its origin.

Resolution order (the first that applies wins):

1. an existing path: a ``config.json`` file, or a folder holding one (its ``*.safetensors`` headers,
   or the shards ``model.safetensors.index.json`` names, are read for exact dtypes and counts);
2. a bundled name, any case, or the hub id of a bundled model (``meta-llama/Llama-2-7b-hf``);
3. ``package.module:function``: a factory that builds the model (recorded, never imported here),
   only where code is allowed (``allow_code=True``, ``--allow-code``, or inside
   :func:`allowing_code`): importing a module and calling a function runs arbitrary code, so a
   MODEL string never does it by surprise (docs/decisions.md, "Threat model");
4. a hub id ``org/name``: only its config.json is fetched, then cached (:mod:`memfit.models.hub`);
5. anything else is an UnknownModelError listing close bundled names and the accepted forms.

Nothing here imports torch or transformers at module level; transformers is imported lazily only
to decide whether a config with ``auto_map`` needs repository code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import os
import re
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit.errors import ModelConfigError, SpecError, UnknownModelError
from memfit.models import hub
from memfit.models.bundled import (
    BundledModel,
    bundled_names,
    find_bundled,
)
from memfit.models.config_json import check_config, read_config_file
from memfit.models.media import with_media
from memfit.models.model_spec import ModelSpec
from memfit.models.safetensors_header import (
    SafetensorsInfo,
    find_safetensors,
    summarize_safetensors,
)
from memfit.models.zoo import ZOO_PREFIXES, zoo_source
from memfit.spec.media import MediaSpec

__all__ = [
    "ModelSource",
    "allowing_code",
    "resolve_model",
    "take_media",
]  # the package re-exports the rest (memfit.models)

ORIGINS = ("bundled", "path", "hub", "factory")
#: ``pkg.module:function``: a dotted Python identifier, a colon, an identifier.
FACTORY_RE = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
)
#: One half of ``org/name`` as the hub allows it: up to 96 letters, digits and ``-_.``, starting
#: and ending with a letter or digit.
_HUB_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
HUB_ID_RE = re.compile(rf"^{_HUB_PART}/{_HUB_PART}$")
#: Whether ``package.module:function`` MODEL strings may be imported and called: False unless a
#: caller opts in (the CLI's ``--allow-code``, :func:`allowing_code`, ``allow_code=True``).
_ALLOW_CODE: ContextVar[bool] = ContextVar("memfit_allow_code", default=False)
ACCEPTED_FORMS = (
    "a bundled name (e.g. llama-3.1-8b), path/to/config.json or the folder holding it, "
    "org/name on the Hugging Face hub, or package.module:function that builds the model"
)


@dataclass(frozen=True, kw_only=True)
class ModelSource:
    """A resolved MODEL argument. ``config`` is the raw config.json dict (what transformers'
    ``AutoConfig`` is built from) and ``spec`` the :class:`ModelSpec` read from it once; both are
    None for a factory."""

    name: str  # display name
    origin: str  # "bundled" | "path" | "hub" | "factory"
    config: dict[str, Any] | None
    source_url: str | None
    config_path: str | None
    safetensors: SafetensorsInfo | None
    factory: str | None  # "pkg.module:fn" when origin == "factory"; never imported here
    trust_remote_code: bool = False
    spec: ModelSpec | None = None  # read from ``config`` when not given

    def __post_init__(self) -> None:
        problems = []
        if self.origin not in ORIGINS:
            problems.append(f"origin ({self.origin!r}) must be one of {', '.join(ORIGINS)}")
        if (self.origin == "factory") != (self.factory is not None):
            problems.append(
                f"factory ({self.factory!r}) must be set exactly when origin is 'factory'"
            )
        if (self.origin == "factory") != (self.config is None):
            problems.append("config must be None exactly when origin is 'factory'")
        if problems:
            raise SpecError.from_problems(problems)
        if self.spec is None and self.config is not None:
            object.__setattr__(self, "spec", read_spec(self.config, where=self.name))

    @classmethod
    def of_live_config(cls, config: dict[str, Any], *, name: str) -> ModelSource:
        """The source of a model already built in the user's process (its ``config.to_dict()``):
        no file, no hub."""
        return cls(
            name=name,
            origin="path",
            config=config,
            source_url=None,
            config_path=None,
            safetensors=None,
            factory=None,
        )

    @classmethod
    def of_factory(cls, text: str, *, trust_remote_code: bool = False) -> ModelSource:
        """The source of code memfit builds by name (``pkg.module:fn``, ``timm/NAME``): no
        config, nothing read from a file or the hub."""
        return cls(
            name=text,
            origin="factory",
            config=None,
            source_url=None,
            config_path=None,
            safetensors=None,
            factory=text,
            trust_remote_code=trust_remote_code,
        )

    @property
    def model_type(self) -> str | None:
        """The config's ``model_type`` ("llama", "t5", ...); None for a factory."""
        return self.spec.model_type if self.spec is not None else None


@contextlib.contextmanager
def allowing_code(enabled: bool = True) -> Iterator[None]:
    """Inside the block, ``package.module:function`` MODEL strings resolve to factories (every
    call that resolves a MODEL string: estimate, plan, fit, upgrade, doctor)."""
    if not isinstance(enabled, bool):
        raise SpecError(f"allow_code ({enabled!r}) must be True or False")
    token = _ALLOW_CODE.set(enabled)
    try:
        yield
    finally:
        _ALLOW_CODE.reset(token)


def resolve_model(
    model: str | os.PathLike[str],
    *,
    trust_remote_code: bool = False,
    cache_dir: str | os.PathLike[str] | None = None,
    allow_code: bool | None = None,
    media: MediaSpec | None = None,
) -> ModelSource:
    """Resolve a MODEL argument (see the module docstring for the order and the errors).
    ``allow_code``: whether a ``package.module:function`` factory may be named (None: what the
    enclosing :func:`allowing_code` says, by default no). ``media``: the image / audio inputs
    the model takes (the job's ``WorkloadSpec.media``; :func:`take_media`); not set: the
    config's."""
    if not isinstance(model, str | os.PathLike):
        raise SpecError(
            f"model ({model!r}) must be a MODEL string (a bundled name, a path, a hub id) or a "
            "ModelSource"
        )
    for name, flag in (("trust_remote_code", trust_remote_code), ("allow_code", allow_code)):
        if flag is not None and not isinstance(flag, bool):
            raise SpecError(f"{name} ({flag!r}) must be True or False")
    text = os.fspath(model).strip()
    if not text:
        raise UnknownModelError(f"the model name is empty; pass {ACCEPTED_FORMS}")
    source = _resolve(text, trust_remote_code, cache_dir, allow_code)
    return take_media(source, media, name=text)


def take_media(
    source: ModelSource, media: MediaSpec | None, *, name: str | None = None
) -> ModelSource:
    """``source`` built for the job's image inputs (``media``: ``WorkloadSpec.media``); as it is
    when the job sets none. Applying the same media twice gives the same source."""
    if media is None or not media.is_set:
        return source
    if source.config is None:
        raise SpecError(
            f"--image-size / --num-channels / --audio-seconds set the inputs of a Hugging Face "
            f"vision or speech model; {name or source.name!r} builds its own inputs (a factory "
            "or a timm / torchvision model: set them in its code, or drop the flags)"
        )
    config = with_media(source.config, media, name=source.name)
    if config == source.config:
        return source
    return dataclasses.replace(source, config=config, spec=None)


def _resolve(
    text: str,
    trust_remote_code: bool,
    cache_dir: str | os.PathLike[str] | None,
    allow_code: bool | None,
) -> ModelSource:
    try:
        path = Path(text).expanduser()
    except RuntimeError:  # "~name/..." with no such user
        raise UnknownModelError(
            f"no file or folder at {text[:80]!r}: there is no user {text.split('/')[0][1:80]!r} "
            f"whose home folder ~ could name; check the path, or pass {ACCEPTED_FORMS}"
        ) from None
    if _exists(path):
        return _from_path(path, trust_remote_code=trust_remote_code)
    bundled = find_bundled(text)
    if bundled is not None:
        return _from_bundled(bundled, trust_remote_code=trust_remote_code)
    if FACTORY_RE.match(text):
        if not (_ALLOW_CODE.get() if allow_code is None else allow_code):
            raise SpecError(
                f"model ({text!r}) names Python code (module:function): memfit would import "
                f"{text.split(':')[0]!r} and call {text.split(':')[1]!r}, which runs whatever "
                "that code does; if you wrote it and mean it, add --allow-code (Python: "
                "allow_code=True), else pass a bundled name, a config.json path or a hub id"
            )
        return ModelSource.of_factory(text, trust_remote_code=trust_remote_code)
    if _looks_like_path(text):
        raise UnknownModelError(
            f"no file or folder at {text!r} (looked in {path.absolute()}); check the path, or "
            f"pass {ACCEPTED_FORMS}"
        )
    if text.split("/", 1)[0] in ZOO_PREFIXES and "/" in text:
        return zoo_source(text)  # timm/NAME, torchvision/NAME: built by that library
    if HUB_ID_RE.match(text):
        return _from_hub(text, trust_remote_code=trust_remote_code, cache_dir=cache_dir)
    raise _unknown(text)


def _from_bundled(bundled: BundledModel, *, trust_remote_code: bool) -> ModelSource:
    config = read_config_file(bundled.config_path)
    where = f"bundled {bundled.name}"
    check_config(config, where=where, trust_remote_code=trust_remote_code)
    return ModelSource(
        spec=read_spec(config, where=where),
        name=bundled.name,
        origin="bundled",
        config=config,
        source_url=bundled.source_url,
        config_path=str(bundled.config_path),
        safetensors=None,
        factory=None,
        trust_remote_code=trust_remote_code,
    )


def _from_path(path: Path, *, trust_remote_code: bool) -> ModelSource:
    info: SafetensorsInfo | None = None
    if path.is_dir():
        config_file = path / "config.json"
        if not config_file.is_file():
            raise ModelConfigError(
                f"{path}: the folder has no config.json; pass the folder that holds the "
                "model's config.json, or the file itself (memfit estimate path/to/config.json)"
            )
        files = find_safetensors(path)
        name = path.resolve().name
    else:
        if path.suffix == ".safetensors":
            raise ModelConfigError(
                f"{path}: a weights file, not a config; pass the folder holding it and its "
                "config.json (memfit estimate path/to/folder)"
            )
        config_file, files = path, []
        parent = path.resolve().parent.name
        name = parent if path.name == "config.json" and parent else path.stem
    config = read_config_file(config_file)
    check_config(config, where=str(config_file), trust_remote_code=trust_remote_code)
    spec = read_spec(config, where=str(config_file))
    if files:
        info = summarize_safetensors(files)
    return ModelSource(
        spec=spec,
        name=name,
        origin="path",
        config=config,
        source_url=None,
        config_path=str(config_file),
        safetensors=info,
        factory=None,
        trust_remote_code=trust_remote_code,
    )


def _from_hub(
    hf_id: str, *, trust_remote_code: bool, cache_dir: str | os.PathLike[str] | None
) -> ModelSource:
    config_path = hub.fetch_config(hf_id, cache_dir=cache_dir)
    try:
        config = read_config_file(config_path)
    except ModelConfigError as e:
        raise ModelConfigError(
            f"{e} (this is memfit's cached copy of {hf_id}: delete it to download it again)"
        ) from None
    where = f"{hf_id} ({config_path})"
    check_config(config, where=where, trust_remote_code=trust_remote_code)
    return ModelSource(
        spec=read_spec(config, where=where),
        name=hf_id,
        origin="hub",
        config=config,
        source_url=hub.source_url(hf_id),
        config_path=str(config_path),
        safetensors=None,
        factory=None,
        trust_remote_code=trust_remote_code,
    )


def read_spec(config: dict[str, Any], *, where: str) -> ModelSpec:
    """``config``'s ModelSpec; its ModelConfigError says which file or model it came from."""
    try:
        return ModelSpec.from_config(config)
    except ModelConfigError as e:
        raise ModelConfigError(
            f"{where}: {str(e).removeprefix('config.json: ')}; fix the file or pass another one"
        ) from None


def _exists(path: Path) -> bool:
    """Path.exists() that answers False for names the OS cannot even look up (too long, NUL)."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _looks_like_path(text: str) -> bool:
    """Strings that can only mean a file: a hub id has one slash and no file extension."""
    return (
        text.startswith(("/", "./", "../", "~", ".\\"))
        or "\\" in text
        or text.count("/") > 1
        or text.endswith((".json", ".safetensors", ".bin", ".pt", ".gguf"))
    )


def close_bundled_matches(text: str, n: int = 3) -> list[str]:
    """Up to ``n`` bundled names closest to ``text`` (matching names, hub ids and aliases)."""
    found: list[str] = []
    for spelling in difflib.get_close_matches(text.lower(), bundled_names(), n=3 * n, cutoff=0.6):
        bundled = find_bundled(spelling)
        if bundled is not None and bundled.name not in found:
            found.append(bundled.name)
    return found[:n]


def _unknown(text: str) -> UnknownModelError:
    matches = close_bundled_matches(text)
    hint = f"did you mean {', '.join(matches)}? " if matches else ""
    return UnknownModelError(
        f"unknown model {text!r}: not an existing path, a bundled name, a module:function or a "
        f"hub id (org/name); {hint}pass {ACCEPTED_FORMS}"
    )
