"""Sequence-length distributions of a fine-tuning run and the step shapes they produce (the
records, :class:`~memfit.spec.seqrun.SeqDist` and :class:`~memfit.spec.seqrun.StepPlan`, are in
spec/; here: reading ``--seq-dist`` and sampling the steps).

A run on real data does not repeat one shape: each micro-batch is padded to its own longest
sample. ``--seq-dist`` describes the lengths either as ``MEAN,STD,MAX`` or as a histogram file.

``MEAN,STD,MAX`` is a normal distribution *clipped* to ``[1, MAX]``, not truncated: a tokenizer
called with ``truncation=True, max_length=MAX`` cuts every longer sample to ``MAX`` tokens, so the
mass above the limit sits at the limit (the spike real fine-tuning sets show), and that is the
conservative reading: it gives the most full-length steps. A histogram file is JSON
(``{"length": count, ...}`` or ``[[length, count], ...]``) or CSV (``length,count`` lines, a
header line allowed), read through :mod:`memfit.userfiles`.

Step shapes follow transformers' ``DataCollatorWithPadding`` (``padding="longest"``): the step's
length is its batch's longest sample, rounded up to ``pad_to_multiple_of`` when set (the tokenizer's
``pad``, which rounds up even past ``max_length``). ``packing`` (TRL ``SFTConfig(packing=True)``)
fills every step to ``MAX`` tokens. ``group_by_length`` follows ``LengthGroupedSampler``
(transformers ``trainer_pt_utils.get_length_grouped_indices``): megabatches of 50 x batch
samples, each sorted by length, longest first, and the longest sample of all swapped into the
first place, so the first step is the longest.
"""

from __future__ import annotations

import csv
import io
import math
import random

from memfit.errors import SpecError
from memfit.spec.seqrun import SeqDist, StepPlan
from memfit.userfiles import UserFileError, parse_json, read_text

#: ``LengthGroupedSampler``'s megabatch factor (transformers ``get_length_grouped_indices``,
#: ``mega_batch_mult = min(len(lengths) // (batch_size * 4), 50)``, 50 for any real data set).
MEGABATCH_MULT = 50
#: Largest histogram file read (lengths are small integers; 16 MiB is millions of rows).
HISTOGRAM_MAX_BYTES = 16 * 1024 * 1024


def parse_seq_dist(text: str, *, max_len: int | None = None) -> SeqDist:
    """``MEAN,STD,MAX`` or the path of a histogram file (JSON or CSV of length -> count).

    ``max_len`` caps a histogram's lengths (the job's ``--seq``); default: its longest length."""
    parts = text.split(",")
    if (
        len(parts) == 3
        and not all(_is_number(p) for p in parts)
        and all(_is_float(p) for p in parts)
    ):
        raise SpecError(f"--seq-dist {text[:60]!r}: MEAN,STD,MAX must be finite numbers")
    if len(parts) == 3 and all(_is_number(p) for p in parts):
        mean, std, top = (float(p) for p in parts)
        if top != int(top):
            raise SpecError(f"--seq-dist max ({parts[2]}) must be a whole number of tokens")
        return SeqDist(mean=mean, std=std, max_len=int(top), source=text)
    if len(parts) > 1 and all(_is_number(p) for p in parts):
        raise SpecError(
            f"--seq-dist {text!r}: give three numbers MEAN,STD,MAX (e.g. 300,250,1024), "
            f"not {len(parts)}, or the path of a histogram file"
        )
    return _read_histogram(text, max_len)


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def _read_histogram(path: str, max_len: int | None) -> SeqDist:
    what = "--seq-dist histogram"
    body = read_text(path, what=what, max_bytes=HISTOGRAM_MAX_BYTES)
    if body.lstrip().startswith(("{", "[")):
        data = parse_json(body, what=what, source=path)
        rows = list(data.items()) if isinstance(data, dict) else data
    else:
        rows = [r for r in csv.reader(io.StringIO(body)) if r and any(c.strip() for c in r)]
        if rows and not _is_number(rows[0][0]):
            rows = rows[1:]  # a header line
    pairs: list[tuple[int, int]] = []
    for i, row in enumerate(rows if isinstance(rows, list) else []):
        try:
            length, count = row
            pairs.append((_whole(length), _whole(count)))
        except (TypeError, ValueError, OverflowError):
            raise UserFileError(
                f"{what} {path!r}: entry {i + 1} ({str(row)[:60]}) is not a pair of whole "
                'numbers length, count; write {"128": 40, ...} or CSV lines 128,40'
            ) from None
    if not pairs:
        raise UserFileError(
            f"{what} {path!r} has no length, count entries (or is not a file and not MEAN,STD,MAX)"
        )
    lengths, weights = zip(*pairs, strict=True)
    top = max_len or max(lengths)
    return SeqDist(max_len=top, lengths=tuple(lengths), weights=tuple(weights), source=path)


def _whole(value: object) -> int:
    number = float(str(value).strip())
    if number != int(number):
        raise ValueError(value)
    return int(number)


def step_lengths(dist: SeqDist, plan: StepPlan) -> list[int]:
    """The padded length of each step of the run, in order."""
    if plan.packing:
        return [dist.max_len] * plan.n_steps
    rng = random.Random(plan.seed)
    samples = dist.sample(rng, plan.n_steps * plan.batch_size)
    b = plan.batch_size
    if plan.group_by_length:
        samples = _length_grouped(samples, b)
    longest = [max(samples[i : i + b]) for i in range(0, len(samples), b)]
    k = plan.pad_to_multiple_of
    return [-(-n // k) * k for n in longest] if k else longest


def _length_grouped(samples: list[int], batch_size: int) -> list[int]:
    size = max(1, min(len(samples) // (batch_size * 4), MEGABATCH_MULT)) * batch_size
    megas = [sorted(samples[i : i + size], reverse=True) for i in range(0, len(samples), size)]
    first = max(range(len(megas)), key=lambda i: megas[i][0])
    megas[0][0], megas[first][0] = megas[first][0], megas[0][0]  # the longest sample first
    return [n for mega in megas for n in mega]
