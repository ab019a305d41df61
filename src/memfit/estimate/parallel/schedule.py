"""Which layers each pipeline rank holds and how many micro-batches' activations it keeps.

A pipeline of ``pp`` ranks cuts the model into ``C = pp * v`` chunks (``v`` chunks per rank:
1 for GPipe and 1F1B, ``pp_virtual_stages`` for interleaved 1F1B, 2 for the V schedules).

**Layers per chunk** as torchtitan splits them (``generate_llm_fqn_per_model_part`` in
``torchtitan/distributed/pipeline_parallel.py``, pytorch/torchtitan fb3b230): the embeddings
and the norm + output head each weigh one layer (``input_weight = output_weight = 1``); the
``L + 2`` weighted layers are spread evenly, the first ``(L + 2) % C`` chunks taking one more;
chunk 0 then gives one to the embeddings and the last chunk one to the head.

**Which rank holds a chunk**: looped schedules put chunk ``c`` on rank ``c % pp``; the V
schedules (ZBV, DualPipeV) put chunks ``r`` and ``2 pp - 1 - r`` on rank ``r``
(``generate_stage_to_rank_mapping(style="v")`` in ``torch/distributed/pipelining/_utils.py``),
so rank 0 holds both the embeddings and the head.

**Micro-batches in flight** — the forwards a rank has run whose backward has not freed their
activations, at its worst moment, in units of (one micro-batch x one chunk), with ``m`` the
micro-batches per step:

=================  ==========================================  ================================
schedule           in flight on rank ``r``                     source
=================  ==========================================  ================================
gpipe              ``m`` (all forwards, then all backwards)    ``ScheduleGPipe``
1f1b               ``min(m, pp - r)``                          ``Schedule1F1B`` warm-up
                                                               ``pp - 1 - r`` forwards, + 1
interleaved-1f1b   ``min(m v, (v - 1) pp + 2 (pp - 1 - r)      Megatron ``schedules.py`` /
                   + 1)`` chunk-micro-batches                  torch ``ScheduleInterleaved1F1B``
                                                               warm-up; equals Megatron's
                                                               ``1 + (pp-1)/(pp v)`` penalty
zbv                ``min(2 m, 2 pp)``                          torch ``ScheduleZBVZeroBubble``:
                                                               warm-up ``2 (pp - r) - 1`` F0,
                                                               ``r`` x (F1, F0), then F1 I1 W1
dualpipev          ``min(2 m, 2 pp + 1)``                      torch ``ScheduleDualPipeV`` /
                                                               DeepSeek DualPipe: ``2 (pp-r-1)``
                                                               F0, ``r + 1`` x (F0 F1), then an
                                                               F overlapped with a B (+1)
=================  ==========================================  ================================

(torch: ``torch/distributed/pipelining/schedules.py`` at pytorch/pytorch 00722e6; Megatron:
``megatron/training/theoretical_memory_usage.py`` at NVIDIA/Megatron-LM 00caa53, whose
``interleaved_schedule_memory_penalty`` the interleaved row reproduces for rank 0; DualPipe:
deepseek-ai/DualPipe README 89f5de1, "Activation: PP+1" for DualPipe.)

Under 1F1B the first rank keeps the most micro-batches; the last keeps one but computes the
loss over the vocabulary; :mod:`memfit.estimate.parallel.memory` weighs both per rank.

**Moments of the step** (:func:`rank_actions`, :func:`backward_moments`): the forwards and
backwards a rank runs, in torch.distributed.pipelining's order (``Schedule1F1B._step_microbatches``;
``ScheduleInterleaved1F1B._calculate_single_rank_operations`` with ``_get_warmup_ops`` and
``_get_1f1b_rank_ops``; torch 2.13 ``torch/distributed/pipelining/schedules.py``), and at each
backward which chunks hold what: the chunk-micro-batches in flight per chunk, and which chunks
FSDP2 keeps gathered with unsharded gradients. A stage's gradients stay unsharded from its first
backward until its last one, after which the schedule's ``REDUCE_GRAD`` action runs
``perform_reduce_grad`` (``post_backward`` with ``set_reshard_after_backward(True)``:
reduce-scatter, reshard; ``_add_reduce_grad`` in ``schedules.py``, ``stage.py``), so under an
interleaved schedule whose backwards finish one chunk before starting the next (one round:
``micro_batches <= pp``) a rank never holds two chunks' unsharded gradients at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

#: torchtitan's weights of the embeddings and of the norm + output head when it splits layers
#: into stages (``input_weight``, ``output_weight`` of ``generate_llm_fqn_per_model_part``).
EMBEDDING_LAYER_WEIGHT = 1
HEAD_LAYER_WEIGHT = 1


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """One model chunk (pipeline stage): its index, its transformer layers, whether it holds
    the embeddings or the head."""

    index: int
    first_layer: int
    n_layers: int
    embedding: bool
    head: bool


@dataclass(frozen=True, kw_only=True)
class Moment:
    """One backward of a rank's step (module docstring): per local chunk, the micro-batches
    whose activations are saved (the one running its backward included) and whether FSDP2
    holds the chunk's unsharded gradients (from its first backward to its last)."""

    in_flight: tuple[int, ...]
    grads: tuple[bool, ...]


@dataclass(frozen=True, kw_only=True)
class RankStages:
    """What pipeline rank ``rank`` holds and keeps: its chunks and the chunk-micro-batches of
    activations in flight at its worst moment (each micro-batch of a chunk counted once)."""

    rank: int
    chunks: tuple[Chunk, ...]
    in_flight: int
    #: chunk-micro-batches in flight per chunk at one moment (:class:`Moment`); None: the
    #: worst-moment total ``in_flight`` spread evenly over the chunks
    chunk_in_flight: tuple[int, ...] | None = None
    #: every backward of the step in torch's order (empty for the V schedules)
    moments: tuple[Moment, ...] = ()

    @property
    def n_layers(self) -> int:
        return sum(c.n_layers for c in self.chunks)

    @property
    def embedding(self) -> bool:
        return any(c.embedding for c in self.chunks)

    @property
    def head(self) -> bool:
        return any(c.head for c in self.chunks)

    @property
    def layers(self) -> list[int]:
        """The global indices of this rank's transformer layers."""
        return [c.first_layer + i for c in self.chunks for i in range(c.n_layers)]

    @property
    def in_flight_layers(self) -> float:
        """Layer-micro-batches of saved activations: in-flight chunk-micro-batches times the
        mean layers of this rank's chunks (or, at a :class:`Moment`, each chunk's own)."""
        if self.chunk_in_flight is not None:
            return float(sum(n * c.n_layers for n, c in zip(self.chunk_in_flight, self.chunks,
                                                              strict=True)))  # fmt: skip
        return self.in_flight * self.n_layers / len(self.chunks)

    def at(self, moment: Moment) -> RankStages:
        """This rank as it stands at ``moment``."""
        return replace(self, in_flight=sum(moment.in_flight), chunk_in_flight=moment.in_flight)


def chunks_per_rank(schedule: str, virtual_stages: int) -> int:
    if schedule in ("zbv", "dualpipev"):
        return 2
    if schedule == "interleaved-1f1b":
        return virtual_stages
    return 1


def split_layers(n_layers: int, n_chunks: int) -> list[int]:
    """Transformer layers per chunk, torchtitan's split (module docstring)."""
    if n_chunks == 1:
        return [n_layers]
    weighted = n_layers + EMBEDDING_LAYER_WEIGHT + HEAD_LAYER_WEIGHT
    base, extra = divmod(weighted, n_chunks)
    counts = [base + (1 if i < extra else 0) for i in range(n_chunks)]
    counts[0] -= EMBEDDING_LAYER_WEIGHT
    counts[-1] -= HEAD_LAYER_WEIGHT
    return counts


def rank_of_chunk(chunk: int, pp: int, schedule: str) -> int:
    if schedule in ("zbv", "dualpipev"):
        return chunk if chunk < pp else 2 * pp - 1 - chunk
    return chunk % pp


def in_flight(schedule: str, *, rank: int, pp: int, micro_batches: int, virtual: int) -> int:
    """Chunk-micro-batches of activations rank ``rank`` holds at its worst (module table)."""
    m = micro_batches
    if pp == 1:
        return 1  # no pipeline: one micro-batch at a time (gradient accumulation frees each)
    if schedule == "gpipe":
        return m
    if schedule == "1f1b":
        return min(m, pp - rank)
    if schedule == "interleaved-1f1b":
        return min(m * virtual, (virtual - 1) * pp + 2 * (pp - 1 - rank) + 1)
    if schedule == "zbv":
        return min(2 * m, 2 * pp)
    if schedule == "dualpipev":
        return min(2 * m, 2 * pp + 1)
    raise ValueError(f"pp_schedule ({schedule!r}) has no in-flight rule")


def rank_actions(
    schedule: str, *, rank: int, pp: int, micro_batches: int, virtual: int
) -> list[tuple[bool, int]] | None:
    """``(is_forward, local chunk)`` of every compute action rank ``rank`` runs, in
    torch.distributed.pipelining's order (module docstring); None for the V schedules, which
    :func:`in_flight` answers by formula. Micro-batches run in order within a chunk.

    - ``gpipe``: every forward, then every backward (``ScheduleGPipe``).
    - ``1f1b``: ``min(m, pp - rank)`` forwards, then one backward and one forward while
      forwards remain, then the backwards (``Schedule1F1B._step_microbatches``).
    - ``interleaved-1f1b``: ``rounds = max(1, m // pp)``, ``per_round = m // rounds``;
      ``warmup = min((v - 1) per_round + 2 (pp - 1 - rank), m v)`` forwards, then a forward
      and a backward per step, then the backwards; the forward of op ``k`` runs local chunk
      ``(k // per_round) % v``, its backward chunk ``v - 1 - ((k - warmup) // per_round) % v``
      (``_get_warmup_ops``, ``_get_1f1b_rank_ops``)."""
    m = micro_batches
    if schedule == "gpipe" or pp == 1:
        return [(True, 0)] * m + [(False, 0)] * m
    if schedule == "1f1b":
        warm = min(m, pp - rank)
        return [(True, 0)] * warm + [(False, 0), (True, 0)] * (m - warm) + [(False, 0)] * warm
    if schedule != "interleaved-1f1b":
        return None
    per_round = m // max(1, m // pp)
    total = m * virtual
    warm = min((virtual - 1) * per_round + 2 * (pp - 1 - rank), total)
    out: list[tuple[bool, int]] = []
    for k in range(total + warm):
        if k < total:
            out.append((True, (k // per_round) % virtual))
        if k >= warm:
            out.append((False, virtual - 1 - ((k - warm) // per_round) % virtual))
    return out


def backward_moments(actions: list[tuple[bool, int]], n_chunks: int) -> tuple[Moment, ...]:
    """At each backward of ``actions``: the chunk-micro-batches in flight per chunk (the one
    being backpropagated included) and the chunks whose unsharded gradients are live (from
    the chunk's first backward to its last, this one included)."""
    last = {c: i for i, (fwd, c) in enumerate(actions) if not fwd}
    live = [0] * n_chunks
    started = [False] * n_chunks
    moments = []
    for i, (fwd, c) in enumerate(actions):
        if fwd:
            live[c] += 1
            continue
        started[c] = True
        grads = tuple(started[k] and last[k] >= i for k in range(n_chunks))
        moments.append(Moment(in_flight=tuple(live), grads=grads))
        live[c] -= 1
    return tuple(moments)


def pipeline_ranks(
    n_layers: int, *, pp: int, schedule: str, virtual_stages: int, micro_batches: int
) -> list[RankStages]:
    """Every pipeline rank's chunks and in-flight micro-batches (module docstring)."""
    v = chunks_per_rank(schedule, virtual_stages) if pp > 1 else 1
    n_chunks = pp * v
    if n_chunks > 1 and n_layers + EMBEDDING_LAYER_WEIGHT + HEAD_LAYER_WEIGHT < n_chunks:
        raise ValueError(
            f"{n_layers} layers cannot fill {n_chunks} pipeline chunks (pp {pp} x {v} per rank) "
            "(torchtitan's split needs a weighted layer per chunk); use a smaller --pp"
        )
    counts = split_layers(n_layers, n_chunks)
    held: dict[int, list[Chunk]] = {r: [] for r in range(pp)}
    first = 0
    for c, n in enumerate(counts):
        chunk = Chunk(
            index=c, first_layer=first, n_layers=n, embedding=c == 0, head=c == n_chunks - 1
        )
        held[rank_of_chunk(c, pp, schedule)].append(chunk)
        first += n
    ranks = []
    for r in range(pp):
        actions = rank_actions(schedule, rank=r, pp=pp, micro_batches=micro_batches, virtual=v)
        ranks.append(
            RankStages(
                rank=r,
                chunks=tuple(held[r]),
                in_flight=in_flight(
                    schedule, rank=r, pp=pp, micro_batches=micro_batches, virtual=v
                ),
                moments=backward_moments(actions, v) if actions is not None else (),
            )
        )
    return ranks


__all__ = [
    "Chunk",
    "Moment",
    "RankStages",
    "backward_moments",
    "chunks_per_rank",
    "in_flight",
    "pipeline_ranks",
    "rank_actions",
    "rank_of_chunk",
    "split_layers",
]
