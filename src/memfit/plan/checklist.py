"""One checklist shape for ``upgrade`` and ``doctor``: a result per check, a job that declares them.

A checklist has a vocabulary and a job:

- the vocabulary is a :class:`CheckResult` subclass: the check ids with their titles, in the
  order the report lists them (``TITLES``), the statuses a check can take (``STATUSES``), which
  status flags a problem and which clears it, and the key names of its JSON form (``upgrade``'s
  items say ``id`` / ``status``, ``doctor``'s findings ``mistake`` / ``applies`` and give a
  ``next_step``; both keep the JSON they publish);
- the job is a :class:`Checklist` subclass holding what its checks share (estimates, plans,
  solves) and one method per id, marked :func:`check` and declared in the vocabulary's order;
  :meth:`Checklist.run` calls them in that order. A vocabulary id without its method, or a
  method out of order, fails when the class is defined.

Helpers both jobs use: :func:`has_rates` / :func:`rated_gpus` (the catalog GPUs the cost model
can rank, and a note naming the others), :func:`step_cost` and :func:`trainable_share` (the
cost model for a job's settings).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, cast

from memfit.errors import SpecError
from memfit.estimate.result import MemoryEstimate
from memfit.plan.cost import ModelFacts, Rates, StepCost, infer_cost, train_step_cost
from memfit.plan.space import Settings


@dataclass(frozen=True, kw_only=True)
class CheckResult:
    """One check's answer: its status, the evidence in words, the next step (checklists that
    give one), and the numbers behind it. Subclasses declare the vocabulary (class variables)."""

    id: str
    status: str
    evidence: str
    next_step: str | None = None
    numbers: dict[str, Any] = field(default_factory=dict)

    #: Check id -> title, in the order the checklist runs and lists them.
    TITLES: ClassVar[Mapping[str, str]] = {}
    STATUSES: ClassVar[tuple[str, ...]] = ()
    #: The status meaning "the problem is there", and the one meaning "checked: it is not".
    FLAGGED: ClassVar[str] = ""
    CLEAR: ClassVar[str] = ""
    #: JSON key names of the id and the status; whether a next step is part of every result.
    ID_KEY: ClassVar[str] = "id"
    STATUS_KEY: ClassVar[str] = "status"
    WITH_NEXT_STEP: ClassVar[bool] = False

    def __post_init__(self) -> None:
        p = []
        if self.id not in self.TITLES:
            p.append(f"{self.ID_KEY} ({self.id!r}) must be one of {', '.join(self.TITLES)}")
        if self.status not in self.STATUSES:
            p.append(
                f"{self.STATUS_KEY} ({self.status!r}) must be one of {', '.join(self.STATUSES)}"
            )
        if self.WITH_NEXT_STEP and self.next_step is None:
            p.append(f"next_step (None) must be given: every {type(self).__name__} has one")
        if not self.WITH_NEXT_STEP and self.next_step is not None:
            p.append(f"next_step ({self.next_step!r}) must be None: {type(self).__name__} has none")
        if p:
            raise SpecError.from_problems(p)

    @property
    def title(self) -> str:
        return self.TITLES[self.id]

    @property
    def flagged(self) -> bool:
        return self.status == self.FLAGGED

    @property
    def clear(self) -> bool:
        return self.status == self.CLEAR

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            self.ID_KEY: self.id,
            "title": self.title,
            self.STATUS_KEY: self.status,
            "evidence": self.evidence,
        }
        if self.WITH_NEXT_STEP:
            out["next_step"] = self.next_step
        out["numbers"] = dict(self.numbers)
        return out


R = TypeVar("R", bound=CheckResult)
F = TypeVar("F", bound=Callable[..., Any])
_CHECK = "__memfit_check__"


def check(method: F) -> F:
    """Mark a method of a :class:`Checklist` as a check; its name is the check's id."""
    setattr(method, _CHECK, True)
    return method


def find(results: list[R], check_id: str) -> R:
    """The result of ``check_id`` among ``results`` (``StopIteration`` if it is not there)."""
    return next(r for r in results if r.id == check_id)


class Checklist(Generic[R]):
    """A job's checks: the methods marked :func:`check`, one per id of ``result_type.TITLES``,
    declared in that order; :meth:`run` calls them in that order."""

    result_type: ClassVar[type[CheckResult]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if getattr(cls, "result_type", None) is None:
            return  # a partial declaration; its subclass names the vocabulary
        declared: list[str] = []
        for klass in reversed(cls.__mro__):
            marked = [n for n, v in vars(klass).items() if getattr(v, _CHECK, False)]
            declared += [n for n in marked if n not in declared]  # an override keeps its place
        expected = list(cls.result_type.TITLES)
        if declared != expected:
            raise TypeError(
                f"{cls.__name__} declares the checks {declared} but "
                f"{cls.result_type.__name__}.TITLES lists {expected}: declare one method per id, "
                "in that order"
            )

    @classmethod
    def checks(cls) -> tuple[str, ...]:
        return tuple(cls.result_type.TITLES)

    def run(self) -> list[R]:
        """Every check's result, in the declared order."""
        out = []
        for check_id in self.checks():
            result = getattr(self, check_id)()
            if not isinstance(result, self.result_type) or result.id != check_id:
                raise TypeError(
                    f"check {check_id} of {type(self).__name__} returned {result!r}, not a "
                    f"{self.result_type.__name__} with id {check_id!r}"
                )
            out.append(cast(R, result))
        return out


# -- what both checklists use --------------------------------------------------------------------
def has_rates(gpu: Any) -> bool:
    """The cost model needs a bandwidth and a 16-bit tensor rate (rows without published rates
    are skipped when recommending)."""
    rate = gpu.fp16_dense_tflops or gpu.bf16_dense_tflops
    return bool(gpu.memory_bandwidth_gbps and rate)


def rated_gpus(skipped: str) -> tuple[list[Any], str | None]:
    """The catalog GPUs the cost model can rank (:func:`has_rates`), and a note naming the
    others: ``"not {skipped} (no published compute rate or memory bandwidth ...): A10G"``."""
    from memfit.hardware import list_gpus

    gpus = list_gpus()
    no_rates = [g.name for g in gpus if not has_rates(g)]
    note = None
    if no_rates:
        note = (
            f"not {skipped} (no published compute rate or memory bandwidth in the catalog): "
            + ", ".join(no_rates)
        )
    return [g for g in gpus if has_rates(g)], note


def trainable_share(est: MemoryEstimate | None) -> float:
    """Trainable share of the parameters in an estimate (1 when there is none)."""
    return 1.0 if est is None else est.n_trainable_params / max(est.n_params, 1)


def step_cost(
    s: Settings,
    facts: ModelFacts,
    rates: Rates,
    *,
    mode: str,
    seq_len: int,
    new_tokens: int,
    trainable_fraction: float = 1.0,
) -> StepCost:
    """The roofline of settings ``s`` for the job (:mod:`memfit.plan.cost`): one optimizer step
    (training, ``trainable_fraction`` of the weights trained) or one batch of requests (the
    prompt then ``new_tokens`` decode steps)."""
    if mode == "infer":
        return infer_cost(s, facts, rates, seq_len=seq_len, new_tokens=new_tokens)
    return train_step_cost(s, facts, rates, seq_len=seq_len, trainable_fraction=trainable_fraction)


__all__ = [
    "CheckResult",
    "Checklist",
    "check",
    "find",
    "has_rates",
    "rated_gpus",
    "step_cost",
    "trainable_share",
]
