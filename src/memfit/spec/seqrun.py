"""A variable-length training run (torch-free): the sample lengths (:class:`SeqDist`), how
samples become steps (:class:`StepPlan`), and the job that joins them to a training step
(:class:`SeqRun`).

``memfit estimate --seq-dist`` builds a :class:`SeqRun`: its ``workload`` is the step (its
``seq_len`` is not used: each step is padded to its own batch's longest sample, up to
``dist.max_len``), its ``dist`` the lengths and the rest the data collator's and sampler's
settings. :mod:`memfit.estimate.seqrun` replays the run; :mod:`memfit.plan.seq_fit` solves and
plans over it. ``--seq-dist`` text and histogram files are read by
:func:`memfit.estimate.seqrun.dist.parse_seq_dist`.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from memfit.spec.rules import MAX_RUN_SAMPLES, MAX_RUN_STEPS, raise_if
from memfit.spec.workload import WorkloadSpec

#: Default number of steps replayed (``--run-steps``).
DEFAULT_STEPS = 1000


@dataclass(frozen=True, kw_only=True)
class SeqDist:
    """Sample lengths: ``lengths`` with their ``weights`` (a histogram), or a clipped normal
    (``mean``, ``std``) when ``lengths`` is empty. ``max_len`` is the truncation limit."""

    max_len: int
    mean: float = 0.0
    std: float = 0.0
    lengths: tuple[int, ...] = ()
    weights: tuple[int, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        problems = []
        if self.max_len < 1:
            problems.append(f"max_len ({self.max_len}) must be >= 1 token")
        if not self.lengths:
            if not (math.isfinite(self.mean) and 1 <= self.mean <= self.max_len):
                problems.append(f"mean ({self.mean}) must be between 1 and max ({self.max_len})")
            if not (math.isfinite(self.std) and self.std >= 0):
                problems.append(f"std ({self.std}) must be >= 0")
        else:
            if len(self.lengths) != len(self.weights):
                problems.append("lengths and weights must have the same number of entries")
            if any(n < 1 for n in self.lengths):
                problems.append(f"lengths ({min(self.lengths)}) must be >= 1 token")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                problems.append("weights must be >= 0 with a positive total")
        raise_if(problems)

    def sample(self, rng: random.Random, n: int) -> list[int]:
        """``n`` sample lengths (after truncation to ``max_len``)."""
        if self.lengths:
            drawn = rng.choices(self.lengths, weights=self.weights, k=n)
            return [min(x, self.max_len) for x in drawn]
        return [min(max(1, round(rng.gauss(self.mean, self.std))), self.max_len) for _ in range(n)]


@dataclass(frozen=True, kw_only=True)
class StepPlan:
    """How samples become steps: the collator's ``pad_to_multiple_of``, packing, grouping."""

    batch_size: int
    n_steps: int = DEFAULT_STEPS
    seed: int = 0
    pad_to_multiple_of: int | None = None
    packing: bool = False
    group_by_length: bool = False

    def __post_init__(self) -> None:
        problems = []
        if self.batch_size < 1:
            problems.append(f"batch_size ({self.batch_size}) must be >= 1")
        if self.n_steps < 1:
            problems.append(f"n_steps ({self.n_steps}) must be >= 1 (--steps)")
        elif self.n_steps > MAX_RUN_STEPS:
            problems.append(
                f"n_steps ({self.n_steps:,}) must be at most {MAX_RUN_STEPS:,} (--run-steps)"
            )
        elif self.batch_size >= 1 and self.n_steps * self.batch_size > MAX_RUN_SAMPLES:
            problems.append(
                f"n_steps x batch_size ({self.n_steps:,} x {self.batch_size:,}) must be at most "
                f"{MAX_RUN_SAMPLES:,} samples replayed; pass fewer --run-steps"
            )
        if self.pad_to_multiple_of is not None and self.pad_to_multiple_of < 1:
            problems.append(f"pad_to_multiple_of ({self.pad_to_multiple_of}) must be >= 1")
        raise_if(problems)


@dataclass(frozen=True, kw_only=True)
class SeqRun:
    """A training run over samples of ``dist``'s lengths: ``workload`` is one step (its batch is
    the run's; its ``seq_len`` is replaced by each step's padded length), the other fields say
    how the samples become steps (:class:`StepPlan`, whose ``batch_size`` is the workload's)."""

    workload: WorkloadSpec
    dist: SeqDist
    n_steps: int = DEFAULT_STEPS
    seed: int = 0
    pad_to_multiple_of: int | None = None
    packing: bool = False
    group_by_length: bool = False

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.workload, WorkloadSpec):
            problems.append(
                f"workload ({self.workload!r}) must be a WorkloadSpec: pass "
                "memfit.WorkloadSpec(batch_size=..., ...)"
            )
        elif not self.workload.is_train:
            problems.append(
                f"workload.mode ({self.workload.mode!r}): a variable-length run models training; "
                "use mode 'train'"
            )
        if not isinstance(self.dist, SeqDist):
            problems.append(f"dist ({self.dist!r}) must be a SeqDist")
        raise_if(problems)
        _ = self.steps  # the step plan checks n_steps and pad_to_multiple_of

    @property
    def steps(self) -> StepPlan:
        """How the samples become steps, at the workload's batch size."""
        return StepPlan(
            batch_size=self.workload.batch_size,
            n_steps=self.n_steps,
            seed=self.seed,
            pad_to_multiple_of=self.pad_to_multiple_of,
            packing=self.packing,
            group_by_length=self.group_by_length,
        )

    @property
    def longest_step(self) -> int:
        """The longest step's length: ``dist.max_len`` padded up to ``pad_to_multiple_of``."""
        k = self.pad_to_multiple_of or 1
        return -(-self.dist.max_len // k) * k
