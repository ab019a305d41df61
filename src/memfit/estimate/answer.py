"""The one answer shape: what every result record reads the same way, whatever the job's kind.

Five records answer "how much GPU memory": :class:`~memfit.estimate.result.MemoryEstimate` (a
text/vision step, any engine), :class:`~memfit.estimate.diffusion.answer.PipelineEstimate`
(a diffusion pipeline call), :class:`~memfit.estimate.diffusion.train.TrainEstimate` (a
diffusers training script), :class:`~memfit.estimate.seqrun.run.SeqRunEstimate` (a
variable-length training run) and :class:`~memfit.serving.startup.VllmStartup` (``vllm serve``
start-up). Each keeps its own detail (stages, phases, replays, KV blocks); each also reads as an
:class:`Answer`:

========================  ==========================================================
member                    meaning
========================  ==========================================================
``peak_allocated_bytes``  ``torch.cuda.max_memory_allocated()`` at the job's peak
``peak_reserved_bytes``   ``max_memory_reserved()`` (the caching allocator's segments);
                          None where the kind does not replay the allocator
``device_used_bytes``     what ``nvidia-smi`` shows for the process: reserved plus the CUDA
                          context (and, where the kind models them, workspaces outside
                          the allocator): the point value THE verdict judges
``ranges``                metric -> (low, high) bytes of a measured error; empty where
                          the kind has no measured range
``peak_components``       name -> bytes at the peak (the record's own ``components``
                          field keeps its kind-specific shape)
``notes``                 what the reader should know about the answer
``engine``                the engine that answered; ``engine_reason``: why
``verdict``               :class:`~memfit.estimate.verdict.Verdict` on the GPU asked
                          (:func:`memfit.estimate.verdict.judge`, the only "fits" rule),
                          None without a GPU or where the kind's question is another one
                          (``vllm serve`` answers "does it start", ``starts``)
``to_json()``             the record's JSON (field names are public)
========================  ==========================================================

``MemoryEstimate.fits`` (a :class:`~memfit.estimate.result.FitVerdict`) predates this protocol and
keeps its type; its :class:`~memfit.estimate.verdict.Verdict` is ``verdict`` here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from memfit.estimate.verdict import Verdict


@runtime_checkable
class Answer(Protocol):
    """The read-only surface every result record implements (module docstring)."""

    @property
    def peak_allocated_bytes(self) -> int: ...

    @property
    def peak_reserved_bytes(self) -> int | None: ...

    @property
    def device_used_bytes(self) -> int: ...

    @property
    def ranges(self) -> Mapping[str, tuple[int, int]]: ...

    @property
    def peak_components(self) -> Mapping[str, int]: ...

    @property
    def notes(self) -> Sequence[str]: ...

    @property
    def engine(self) -> str: ...

    @property
    def engine_reason(self) -> str | None: ...

    @property
    def verdict(self) -> Verdict | None: ...

    def to_json(self) -> dict[str, Any]: ...


if TYPE_CHECKING:  # mypy checks that each of the five records is an Answer (never run)
    from memfit.estimate.diffusion.pipeline import PipelineEstimate
    from memfit.estimate.diffusion.train import TrainEstimate
    from memfit.estimate.result import MemoryEstimate
    from memfit.estimate.seqrun.run import SeqRunEstimate
    from memfit.serving.startup import VllmStartup

    def _five_records_are_answers(
        a: MemoryEstimate, b: PipelineEstimate, c: TrainEstimate, d: SeqRunEstimate, e: VllmStartup
    ) -> tuple[Answer, ...]:
        return (a, b, c, d, e)

    from memfit.estimate.llamacpp import LlamaCppEstimate

    def _llamacpp_is_an_answer(f: LlamaCppEstimate) -> Answer:
        return f


__all__ = ["Answer"]
