"""The trace engine's answers kept on disk: a job traced once is not traced again (torch-free).

The derived engine keeps forms for the jobs it models; every job it refuses (sharded, offloaded,
multi-GPU, paged optimizer states, chunked prefill, ...) and every ``--engine trace`` estimate is
the trace engine's, seconds to minutes each, and a ``plan`` asks for tens of them. This cache
keeps each answer as one JSON file, under the derived cache's directory rules
(:mod:`memfit.estimate.derived.cache`: ``$MEMFIT_CACHE_DIR/trace``, else
``$XDG_CACHE_HOME/memfit/trace``, else ``~/.cache/memfit/trace``; atomic writes; JSON only,
never pickle). Each file carries its key and the sha256 of its payload and is read through the
bounded reader (:mod:`memfit.estimate.derived.entry`); a file that fails a check, or whose
record is not an answer (a field missing, a negative count), is a miss: traced again, the file
replaced, and the answer says so in one note (``cache entry trace/<key>.json was corrupt``).

**The key** hashes everything the answer depends on: the config.json (canonical JSON), the whole
workload (``repr`` of the frozen spec: batch size and micro-batch count included), the GPU record
(the allocator's cuBLAS workspaces and the kernels' workspaces are the GPU's, so the traced bytes
are too), the layer-extrapolation choice, the installed versions of memfit, torch,
transformers, peft, bitsandbytes, timm and diffusers (read from package metadata), the Python
version, memfit's own source files (size and modification time of each: an edited checkout is
a new key) and :data:`FORMAT`.

**What is kept**: the estimate, every field, exactly (:func:`encode` / :func:`decode`; a loaded
answer equals the fresh one but for ``trace["cached"] = True``, which says it came from here;
its ``model_name`` is the asking source's display name, the one thing of the answer the trace
takes from the name — so one config reached by another path or hub id shares the answer),
and a refusal the trace engine makes by its own rules (a :class:`NotModelledError` or a
:class:`SpecError`: the same job, libraries and code give the same refusal). Not kept: a
:class:`TraceError` (the run failed; it may be the environment's), a missing package, a factory
model (``pkg.mod:fn``: user code that can change without any key seeing it), a model with remote
code, and runs while a predicted snapshot is recorded (``--snapshot`` needs the run's history).

The same key rule (:func:`key_of`) keeps the other traced results that are not estimates
(:func:`cached_record`: a diffusion pipeline's per-component forward traces, and its components'
facts and weight layouts, :mod:`memfit.estimate.diffusion.built`; :func:`cached_answer`:
a whole diffusion pipeline estimate, so a repeated pipeline estimate neither traces nor builds
its components again), under ``installed diffusers`` too.

One switch bypasses it with the derived cache (``--no-cache``, ``MEMFIT_NO_CACHE=1``); deleting
the directory clears it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
from collections.abc import Callable
from typing import Any

from memfit.errors import NotModelledError, SpecError
from memfit.estimate.derived import cache
from memfit.estimate.derived.cache import source_fingerprint
from memfit.estimate.history import is_recording
from memfit.estimate.pipeline import with_notes
from memfit.estimate.result import FitVerdict, MemoryEstimate, ModuleBytes, PhasePeak
from memfit.spec import WorkloadSpec

#: Bumped when what is stored, or how an answer is read back, changes: older files are ignored.
FORMAT = 2  # 2: MemoryEstimate.confirmed
#: The sub-directory of the cache (:func:`memfit.estimate.derived.cache.cache_dir`).
KIND = "trace"
#: Packages the traced answer may depend on beyond the derived cache's (bitsandbytes' formats,
#: timm for the DETR-style backbones ``models.media.buildable`` swaps when it is absent,
#: diffusers for the pipelines' components).
EXTRA_VERSIONED = ("bitsandbytes", "timm", "diffusers")
#: The records inside an estimate, by the tag they are stored under.
_RECORDS: dict[str, type] = {"PhasePeak": PhasePeak, "ModuleBytes": ModuleBytes,
                             "FitVerdict": FitVerdict}  # fmt: skip


def cacheable(source: Any) -> bool:
    """Whether answers for ``source`` (a ``ModelSource``) may be kept: a config.json model
    without remote code, outside a snapshot recording, with the caches on."""
    return (
        source.origin != "factory"
        and source.config is not None
        and not source.trust_remote_code
        and cache.enabled()
        and not is_recording()
    )


def key_of(parts: dict[str, Any]) -> str:
    """THE key rule of every traced answer kept here: ``parts`` (what the traced job is) with
    :data:`FORMAT`, the installed library versions, the Python version and memfit's own source
    files (module docstring)."""
    text = json.dumps(
        {
            **parts,
            "format": FORMAT,
            "versions": cache.versions(EXTRA_VERSIONED),
            "python": platform.python_version(),
            "memfit_source": source_fingerprint(),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def trace_key(source: Any, workload: WorkloadSpec, gpu: Any, *, extrapolate: bool | None) -> str:
    """The key of the trace engine's answer for ``source`` running ``workload`` on ``gpu``."""
    return key_of(
        {
            "config": source.config,
            "workload": repr(workload),
            "gpu": repr(gpu),
            "extrapolate": extrapolate,
        }
    )


def cached_record(
    parts: dict[str, Any],
    run: Callable[[], dict[str, Any]],
    *,
    valid: Callable[[dict[str, Any]], bool],
) -> dict[str, Any]:
    """A traced result that is not a :class:`MemoryEstimate` (a diffusion component's forward
    trace): ``run()``'s JSON record, kept under :func:`key_of` ``parts`` in the same cache.
    An entry that fails the cache's checks, or that ``valid`` refuses, is rebuilt (traced again)
    and replaced, never used. With the caches off, ``run()`` alone."""
    if not cache.enabled() or is_recording():
        return run()
    key = key_of({"record": parts})
    data = cache.load(key, kind=KIND, fmt=FORMAT)
    if data is not None:
        kept = data.get("record")
        try:
            ok = isinstance(kept, dict) and valid(kept)
        except (KeyError, TypeError, ValueError):
            ok = False
        if ok and isinstance(kept, dict):
            return {**kept, "cached": True}
    record = run()
    cache.store(key, {"record": record}, kind=KIND, fmt=FORMAT)
    return record


def cached_trace(
    source: Any,
    workload: WorkloadSpec,
    gpu: Any,
    run: Callable[[], MemoryEstimate],
    *,
    extrapolate: bool | None = None,
) -> MemoryEstimate:
    """The trace engine's answer: from the cache where kept, else ``run()`` (the trace), kept."""
    if not cacheable(source):
        return run()
    key = trace_key(source, workload, gpu, extrapolate=extrapolate)
    problems: list[str] = []  # a corrupt entry met (cache.CORRUPT_NOTE): said in the notes
    data = cache.load(key, kind=KIND, fmt=FORMAT, problems=problems)
    if data is not None:
        found = _from_record(data)
        if isinstance(found, MemoryEstimate):
            return dataclasses.replace(found, model_name=source.name)
        if isinstance(found, SpecError):
            raise found
        cache.note_corrupt(problems, f"{KIND}/{key}.json", "a record of the wrong shape")
    try:
        est = with_notes(run(), problems)
    except SpecError as exc:  # NotModelledError included: a refusal by the engine's own rules
        if type(exc) in (SpecError, NotModelledError):
            cache.store(key, {"refusal": _refusal(exc)}, kind=KIND, fmt=FORMAT)
        raise
    try:  # kept without the corrupt-entry note: it is this run's, not the answer's
        record = {"estimate": encode(dataclasses.replace(est, notes=_without(est.notes, problems)))}
    except TypeError:  # a value JSON cannot hold exactly: not kept
        return est
    cache.store(key, record, kind=KIND, fmt=FORMAT)
    return est


def _without(notes: list[str], problems: list[str]) -> list[str]:
    return [n for n in notes if n not in problems]


def _refusal(exc: SpecError) -> dict[str, Any]:
    if isinstance(exc, NotModelledError):
        return {"type": "NotModelledError", "message": str(exc), "engine": exc.engine}
    return {"type": "SpecError", "message": str(exc), "problems": list(exc.problems)}


def _from_record(data: dict[str, Any]) -> MemoryEstimate | SpecError | None:
    """The answer a record holds, None where it is not one this version reads."""
    try:
        if "estimate" in data:
            est = decode(data["estimate"])
            if not _plausible(est):
                return None
            return dataclasses.replace(est, trace={**est.trace, "cached": True})
        r = data["refusal"]
        if r["type"] == "NotModelledError":
            return NotModelledError(str(r["message"]), engine=str(r["engine"]))
        if r["type"] == "SpecError":
            return SpecError(str(r["message"]), [str(p) for p in r["problems"]])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return None


def _plausible(est: MemoryEstimate) -> bool:
    """Whether the counts of a decoded answer are what an engine gives: whole, non-negative
    numbers (a record of the wrong shape, such as a negative activation, is not used)."""
    counts = [
        est.n_params,
        est.n_trainable_params,
        est.peak_allocated_bytes,
        est.peak_reserved_bytes,
        est.cuda_context_bytes,
        est.device_used_bytes,
        est.host_memory_bytes,
        est.unified_memory_bytes,
        *est.components.values(),
    ]
    return all(type(v) is int and v >= 0 for v in counts)


# ----------------------------------------------------------------------------- the codec
def encode(est: MemoryEstimate) -> dict[str, Any]:
    """``est`` as JSON values that :func:`decode` turns back into an equal estimate (tuples and
    the records inside are tagged). Raises TypeError for a value it cannot hold exactly."""
    return {f.name: _enc(getattr(est, f.name)) for f in dataclasses.fields(est)}


def decode(data: dict[str, Any]) -> MemoryEstimate:
    """The estimate :func:`encode` wrote (ValueError / TypeError / KeyError on anything else)."""
    names = {f.name for f in dataclasses.fields(MemoryEstimate)}
    if set(data) != names:
        raise ValueError(f"fields {sorted(set(data) ^ names)} differ from MemoryEstimate's")
    return MemoryEstimate(**{k: _dec(v) for k, v in data.items()})


def _enc(v: Any, records: dict[str, type] = _RECORDS) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        items = [_enc(x, records) for x in v]
        return items if isinstance(v, list) else {"__tuple__": items}
    if isinstance(v, dict):
        if not all(isinstance(k, str) and not k.startswith("__") for k in v):
            raise TypeError("a dict with a key that is not a plain string")
        return {k: _enc(x, records) for k, x in v.items()}
    tag = type(v).__name__
    if records.get(tag) is type(v) and dataclasses.is_dataclass(v):
        fields = {f.name: _enc(getattr(v, f.name), records) for f in dataclasses.fields(v)}
        return {"__record__": tag, "fields": fields}
    raise TypeError(f"cannot keep a {tag} in the trace cache")


def _dec(v: Any, records: dict[str, type] = _RECORDS) -> Any:
    if isinstance(v, list):
        return [_dec(x, records) for x in v]
    if not isinstance(v, dict):
        return v
    if "__tuple__" in v:
        return tuple(_dec(x, records) for x in v["__tuple__"])
    if "__record__" in v:
        cls = records[str(v["__record__"])]
        return cls(**{k: _dec(x, records) for k, x in v["fields"].items()})
    return {k: _dec(x, records) for k, x in v.items()}


def encode_record(obj: Any, records: dict[str, type]) -> dict[str, Any]:
    """A frozen dataclass ``obj`` (an answer that is not a :class:`MemoryEstimate`, e.g. a
    diffusion pipeline's) as tagged JSON values; ``records``: the dataclasses it may hold, by
    class name (its own class included). TypeError for a value it cannot hold exactly."""
    return _enc(obj, records)  # type: ignore[no-any-return]


def decode_record(data: Any, cls: type, records: dict[str, type]) -> Any:
    """The ``cls`` instance :func:`encode_record` wrote (ValueError / TypeError / KeyError on
    anything else: another class, a field missing or unknown)."""
    if not isinstance(data, dict) or data.get("__record__") != cls.__name__:
        raise ValueError(f"not a kept {cls.__name__}")
    return _dec(data, records)


def cached_answer(
    parts: dict[str, Any],
    run: Callable[[], Any],
    *,
    encode: Callable[[Any], dict[str, Any]],
    decode: Callable[[Any], Any],
) -> tuple[Any, bool]:
    """A whole traced answer that is not a :class:`MemoryEstimate` (a diffusion pipeline's
    estimate), kept under :func:`key_of` ``parts`` (THE key rule) in this cache: ``(answer,
    True)`` from the cache, else ``(run(), False)``, kept. ``decode`` raises (ValueError,
    TypeError, KeyError) or returns None on a record that is not a plausible answer: such an
    entry (corrupt, foreign, of another version) is rebuilt and replaced, never used. With the
    caches off (``--no-cache``) or while a snapshot is recorded, ``run()`` alone."""
    if not cache.enabled() or is_recording():
        return run(), False
    key = key_of({"answer": parts})
    data = cache.load(key, kind=KIND, fmt=FORMAT)
    if data is not None:
        try:
            found = decode(data.get("answer"))
        except (KeyError, TypeError, ValueError, AttributeError):
            found = None
        if found is not None:
            return found, True
    answer = run()
    try:
        record = {"answer": encode(answer)}
    except TypeError:  # a value JSON cannot hold exactly: not kept
        return answer, False
    cache.store(key, record, kind=KIND, fmt=FORMAT)
    return answer, False


__all__ = [
    "FORMAT",
    "cacheable",
    "cached_answer",
    "cached_record",
    "cached_trace",
    "decode",
    "decode_record",
    "encode",
    "encode_record",
    "key_of",
    "trace_key",
]
