"""Diffusion pipelines without torch: each component's forward as a form derived from traces.

A component's forward, traced at batch ``b`` on latents of ``lh x lw``, allocates and frees the
same storages in the same order at every size; only their byte counts change. A form keeps that
sequence once (allocations and which allocation each free names) and each byte count as the
values the trace gave at the sample sizes, at three latent areas ``P = lh * lw``: a form for
batch 1 (a batch of one takes another code path in places: an op that copies at batch 2 is a
view at batch 1), and one for larger batches from batches 2 and 3. A count at another size is
read off the exact rational interpolation ``n(b, P) = A(P) + b B(P)``, ``A`` and ``B``
polynomials of degree at most 2 in ``P`` through the samples; a count that does not come out
whole and non-negative refuses the form (the trace answers). The samples are traced with each
storage's own bytes; the form rounds them up to 512 B as the trace does. The activation peak is
the peak over the events (as the block-wise trace computes it).

The forms, the component facts and the weight layouts of the bundled pipelines are derived by
``benchmarks/derive_pipeline_forms.py`` with the versions its header names and shipped in
``forms/<pipeline>.json.gz``; the same script traces the components again at sizes the forms were
not derived from and records where every record came out equal to the trace
(``benchmarks/results/pipeline_forms.md``, docs/accuracy.md). A job whose records are not all
shipped (another weight format a search did not record, VAE tiling, another prompt length...)
raises :class:`NotDerived`: the trace engine answers it.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Any

from memfit.estimate.diffusion.answer import NotDerived as NotDerived
from memfit.estimate.diffusion.answer import PipelineEstimate
from memfit.estimate.diffusion.assemble import ComponentFacts, assemble, switches
from memfit.estimate.diffusion.blockwise import peak_bytes
from memfit.estimate.diffusion.weights import WeightLayout, layout_from_record
from memfit.spec.diffusion import DiffusionJob

Event = tuple[str, int, int]
FORMS_DIR = Path(__file__).parent / "forms"
#: the denoisers' pipelines the derived engine composes, and their text encoders' stage
PIPELINES = ("FluxPipeline", "StableDiffusionXLPipeline", "StableDiffusion3Pipeline",
             "PixArtSigmaPipeline")  # fmt: skip


def canonical(parts: dict[str, Any]) -> str:
    return json.dumps(parts, sort_keys=True, default=str)


# -- the forms ------------------------------------------------------------------------------------
def canonical_events(events: Sequence[Event]) -> tuple[list[tuple[str, int]], list[int]]:
    """(the sequence: each allocation as ("a", its number), each free as ("f", the number of
    the allocation it frees); the allocations' bytes in order)."""
    number: dict[int, int] = {}
    seq: list[tuple[str, int]] = []
    sizes: list[int] = []
    for kind, key, n in events:
        if kind == "a":
            number[key] = len(sizes)
            seq.append(("a", len(sizes)))
            sizes.append(n)
        else:
            seq.append(("f", number.pop(key, -1)))
    return seq, sizes


def fit_form(
    samples: list[tuple[int, int, dict[str, Any]]], round_to: int = 1
) -> dict[str, Any] | None:
    """The form of one component from its records at ``(batch, P, record)`` samples (one batch,
    or two, at each of the areas), or None where the sequences differ (the code path changes
    with the size). ``round_to``: the records hold the storages' own bytes, and the trace rounds
    them up to this multiple (:func:`evaluate` does)."""
    seqs = [canonical_events([tuple(e) for e in r["events"]]) for _, _, r in samples]  # type: ignore[misc]
    if any(s != seqs[0][0] for s, _ in seqs[1:]):
        return None
    columns: dict[tuple[int, ...], int] = {}
    values = [list(v) for v in zip(*(sizes for _, sizes in seqs), strict=True)]
    values += [[r["output"] for *_, r in samples], [r["workspace"] for *_, r in samples]]
    refs = [columns.setdefault(tuple(v), len(columns)) for v in values]
    encoded = [refs[j] if kind == "a" else -1 - j for kind, j in seqs[0][0]]
    return {
        "samples": [[b, p] for b, p, _ in samples],
        "values": [list(v) for v in columns],
        "events": encoded,
        "output": refs[-2],
        "workspace": refs[-1],
        "round_to": round_to,
    }


def _weights(samples: list[list[int]], b: int, p: int) -> list[Fraction]:
    """Each sample's weight in the value at (b, p): linear in the batch between the two
    batches sampled at each area (or the one batch, which must be ``b``), Lagrange in the area
    across the distinct areas."""
    areas = sorted({s[1] for s in samples})
    batches = sorted({s[0] for s in samples})
    if len(batches) == 1 and b != batches[0]:
        raise NotDerived(f"a form of batch {batches[0]} only, asked batch {b}")
    w = [Fraction(0)] * len(samples)
    index = {(s[0], s[1]): i for i, s in enumerate(samples)}
    for pj in areas:
        lag = Fraction(1)
        for pk in areas:
            if pk != pj:
                lag *= Fraction(p - pk, pj - pk)
        if len(batches) == 1:
            w[index[(batches[0], pj)]] += lag
            continue
        lo, hi = batches[0], batches[-1]  # n(b) = n_lo + (b - lo) (n_hi - n_lo) / (hi - lo)
        w[index[(lo, pj)]] += lag * Fraction(hi - b, hi - lo)
        w[index[(hi, pj)]] += lag * Fraction(b - lo, hi - lo)
    return w


def _rounded(n: int, to: int) -> int:
    """The tracker's rounding of a storage (``StorageTracker._rounded``: CUDA's 512 B blocks)."""
    return -(-n // to) * to if to > 1 else n


def evaluate(form: dict[str, Any], b: int, p: int) -> tuple[int, int, list[Event], int]:
    """(activation peak, output bytes, events, workspace) of the form at batch ``b``, area
    ``p``; :class:`NotDerived` where a byte count does not come out whole and non-negative.
    The events' counts are the storages' own bytes, rounded as the trace rounds them."""
    w = _weights(form["samples"], b, p)
    counts: list[int] = []
    for col in form["values"]:
        v = sum((wi * x for wi, x in zip(w, col, strict=True) if x), Fraction(0))
        if v.denominator != 1 or v < 0:
            raise NotDerived(f"a byte count at batch {b}, area {p} is not whole: {v}")
        counts.append(int(v))
    to = int(form.get("round_to", 1))
    events: list[Event] = []
    n_alloc = 0
    for code in form["events"]:
        if code >= 0:
            events.append(("a", n_alloc, _rounded(counts[code], to)))
            n_alloc += 1
        else:
            events.append(("f", -1 - code, 0))
    return peak_bytes(events), counts[form["output"]], events, counts[form["workspace"]]


def form_for(forms: dict[str, Any], b: int) -> dict[str, Any]:
    """The form of batch ``b``: a batch of one can take another code path (an op that copies at
    batch 2 is a view at batch 1), so it has a form of its own."""
    form = forms.get("b1" if b == 1 else "bN")
    if form is None:
        raise NotDerived(f"no form for batch {b}")
    return form  # type: ignore[no-any-return]


# -- the shipped store ----------------------------------------------------------------------------
@cache
def shipped(name: str) -> dict[str, Any] | None:
    """The shipped forms of bundled pipeline ``name`` (its directory's name), or None."""
    path = FORMS_DIR / f"{name}.json.gz"
    if not path.is_file():
        return None
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = json.load(f)
    return data if isinstance(data, dict) else None


def form_key(component: list[Any], dtype: str, job: DiffusionJob, comp: str, legacy: bool) -> str:
    """What a component's forward depends on besides batch and area."""
    return canonical({"component": component, "dtype": dtype, "switches": switches(comp, job),
                      "legacy": legacy, "max_sequence_length": job.max_sequence_length,
                      "num_frames": job.num_frames})  # fmt: skip


def latent_area(pipeline: str, configs: dict[str, Any], job: DiffusionJob) -> int:
    """``lh * lw`` of the latents the recipe feeds the denoiser and the VAE
    (``pipelines._recipe``)."""
    vsf = 2 ** (len(configs["vae"].get("block_out_channels", [0, 0, 0, 0])) - 1)
    if pipeline == "FluxPipeline":
        return 2 * (job.height // (vsf * 2)) * 2 * (job.width // (vsf * 2))
    return (job.height // vsf) * (job.width // vsf)


def outline(
    pipeline: str, configs: dict[str, Any], job: DiffusionJob
) -> tuple[dict[str, str], dict[str, str]]:
    """({component: stage} in call order, {component: dtype name}) of one call, as
    ``pipelines._recipe`` makes them."""
    if pipeline in ("FluxPipeline", "StableDiffusionXLPipeline"):
        encoders = ["text_encoder", "text_encoder_2"]
    elif pipeline == "StableDiffusion3Pipeline":
        encoders = ["text_encoder", "text_encoder_2"]
        encoders += [] if job.drop_text_encoder_3 else ["text_encoder_3"]
    else:
        encoders = ["text_encoder"]
    denoiser = "unet" if pipeline == "StableDiffusionXLPipeline" else "transformer"
    stages = {**dict.fromkeys(encoders, "text_encode"), denoiser: "denoise", "vae": "vae_decode"}
    vae = job.vae_precision or job.precision
    upcast = configs["vae"].get("force_upcast", True)
    if pipeline == "StableDiffusionXLPipeline" and job.vae_precision is None:
        vae = "fp32" if job.precision == "fp16" and upcast else vae
    return stages, {c: vae if c == "vae" else job.precision for c in stages}


class DerivedSource:
    """The records of one call from a shipped store (:class:`~.assemble.Source`)."""

    def __init__(self, store: dict[str, Any], index: dict[str, Any], configs: dict[str, Any],
                 job: DiffusionJob, dtype_of: dict[str, str], area: int) -> None:  # fmt: skip
        self._store, self._index, self._configs, self._job = store, index, configs, job
        self._dtype_of, self._area = dtype_of, area

    def _component(self, comp: str) -> list[Any]:
        return [*self._index[comp], self._configs[comp]]

    def _get(self, table: str, key: str) -> Any:
        rec = self._store.get(table, {}).get(key)
        if rec is None:
            raise NotDerived(f"no shipped {table} record")
        return rec

    def facts(self, comp: str) -> ComponentFacts:
        r = self._get("facts", canonical({"component": self._component(comp), "facts": 1}))
        return ComponentFacts(
            n_params=int(r["n_params"]),
            keep_in_fp32=tuple(str(k) for k in r["keep_in_fp32"]),
            type_name=str(r["type_name"]),
            has_attention_slice=bool(r["has_attention_slice"]),
        )

    def layout(self, comp: str, legacy: bool, options: dict[str, Any],
               lay_args: dict[str, Any]) -> WeightLayout:  # fmt: skip
        key = canonical({"component": self._component(comp), "layout": options})
        return layout_from_record(self._get("layouts", key))

    def trace(self, comp: str, legacy: bool) -> tuple[int, int, list[Event], int]:
        key = form_key(self._component(comp), self._dtype_of[comp], self._job, comp, legacy)
        return evaluate(form_for(self._get("forms", key), self._job.batch), self._job.batch,
                        self._area)  # fmt: skip


def derived_from(store: dict[str, Any]) -> str:
    """The engine's own account of a shipped store (what the answer says)."""
    d = store["derivation"]
    versions = ", ".join(f"{k} {v}" for k, v in sorted(d["versions"].items()))
    return (
        f"derived from traces at {d['derived_at']} ({versions}); records equal to the trace at "
        f"{d['validated_at']} (benchmarks/results/pipeline_forms.md); --engine trace traces it"
    )


def derived_pipeline(
    root: Path, index: dict[str, Any], configs: dict[str, Any], job: DiffusionJob, *,
    name: str, gpu: Any = None,
) -> PipelineEstimate:  # fmt: skip
    """The estimate of one call of the bundled pipeline at ``root`` from its shipped forms, no
    torch; :class:`NotDerived` where a record is not shipped."""
    from dataclasses import replace

    pipeline = str(index.get("_class_name"))
    store = shipped(root.resolve().name)
    if store is None or pipeline not in PIPELINES or job.num_frames is not None:
        raise NotDerived("no shipped forms for this pipeline")
    if job.drop_text_encoder_3 and "text_encoder_3" not in index:
        raise NotDerived("--no-text-encoder-3 on a pipeline without one: the trace refuses it")
    stages, dtype_of = outline(pipeline, configs, job)
    if any(c not in index or c not in configs for c in stages):
        raise NotDerived("a component of the recipe is not in the tree")
    source = DerivedSource(store, index, configs, job, dtype_of,
                           latent_area(pipeline, configs, job))  # fmt: skip
    est = assemble(index, configs, job, name=name, gpu=gpu, stages=stages, dtype_of=dtype_of,
                   recipe_notes=[], source=source)  # fmt: skip
    return replace(est, derived_from=derived_from(store))
