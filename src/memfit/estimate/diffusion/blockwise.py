"""A component's forward traced with four of its repeated blocks, the middle block's allocations
repeated for the others (issue 32: the cold FLUX estimate).

A pipeline component's forward under ``no_grad`` runs one stack of identical blocks after
another, each block's output rebound to the loop's variable so the previous one dies:

* ``FluxTransformer2DModel.forward`` (diffusers 0.42, ``models/transformers/transformer_flux.py``):
  ``for index_block, block in enumerate(self.transformer_blocks): encoder_hidden_states,
  hidden_states = block(...)``, then the same over ``self.single_transformer_blocks``;
* ``T5Stack.forward`` (transformers 5.23, ``models/t5/modeling_t5.py``): ``for layer_module in
  self.block`` (layer 0 computes the position bias every later layer gets);
* ``CLIPEncoder.forward`` (transformers 5.23, ``models/clip/modeling_clip.py``): ``for
  encoder_layer in self.layers``.

So the allocations and frees of every block between the first and the last are one pattern:
the same sizes in the same order, each block freeing what the one before it left for it. memfit
traces each stack cut to its blocks 0, 1, 2, 3 and its last one (the first and the last may
differ — T5's layer 0 computes the position bias — and are kept), marks where each block starts
in the event list, and checks that blocks 2 and 3 are the same pattern — the same kinds and
sizes, every free naming the same allocation (by position) of the same block, its own or the
one before — and that nothing block 2 allocates outlives block 3 (an output that collects every
layer's hidden states does). Where that holds, block 3's events are repeated for the blocks cut
out, each copy with new storage keys, freeing what the copy before it allocated; the last block
then frees the last copy's. Anything else (a stack of four or
fewer, a pattern that does not repeat) is traced whole. The activation peak is read from the
expanded event list. ``tests/estimate/diffusion/test_blockwise.py`` compares the record with the
whole component's trace, event for event (keys renamed in order of appearance).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Event = tuple[str, int, int]

#: class name -> the dotted paths of its stacks of identical blocks, in forward order (module
#: docstring). A stack is cut to blocks 0, 1, 2, 3 and its last one.
BLOCK_STACKS: dict[str, tuple[str, ...]] = {
    "FluxTransformer2DModel": ("transformer_blocks", "single_transformer_blocks"),
    "T5EncoderModel": ("encoder.block",),
    # CLIPTextModel holds its encoder itself in transformers 5 (``text_model`` in 4.x); the
    # projection model wraps a CLIPTextModel as ``text_model``: the path that exists is cut
    "CLIPTextModel": ("encoder.layers", "text_model.encoder.layers"),
    "CLIPTextModelWithProjection": ("text_model.encoder.layers",),
}
#: blocks kept per stack: 0, 1, 2, 3 and the last
KEPT = 5


@dataclass(frozen=True)
class Cut:
    """One stack cut: how many blocks it had, and (filled by the trace) the event index where
    each kept block's forward starts."""

    path: str
    n_blocks: int


def stacks_of(model: Any) -> list[tuple[Cut, Any]]:
    """The stacks of ``model`` worth cutting (more than :data:`KEPT` blocks), with the
    ``ModuleList`` of each (a path the model does not have is skipped)."""
    found = []
    for path in BLOCK_STACKS.get(type(model).__name__, ()):
        blocks = model
        for part in path.split("."):
            blocks = getattr(blocks, part, None)
        if blocks is not None and len(blocks) > KEPT:
            found.append((Cut(path, len(blocks)), blocks))
    return found


def cut_(model: Any, stacks: list[tuple[Cut, Any]]) -> list[Any]:
    """Cut each stack of ``model`` in place to blocks 0, 1, 2, 3 and its last; returns the kept
    blocks, :data:`KEPT` per stack, in forward order (whose forward starts the caller marks)."""
    import torch

    kept: list[Any] = []
    for cut, blocks in stacks:
        keep = [*blocks[: KEPT - 1], blocks[cut.n_blocks - 1]]
        parent = model
        *head, last = cut.path.split(".")
        for part in head:
            parent = getattr(parent, part)
        setattr(parent, last, torch.nn.ModuleList(keep))
        kept += keep
    return kept


def _signature(events: Sequence[Event], start: int, end: int, born: dict[int, tuple[int, int]],
               n_born: dict[int, int], seg: int) -> list[tuple[Any, ...]] | None:  # fmt: skip
    """Events ``start:end`` (segment ``seg``) as kinds, sizes and which allocation each free
    names (of this segment or the one before, by position); None where a free names an older
    one. ``born`` (key -> (segment, position)) and ``n_born`` are updated."""
    sig: list[tuple[Any, ...]] = []
    for kind, key, n in events[start:end]:
        if kind == "a":
            born[key] = (seg, n_born.get(seg, 0))
            n_born[seg] = n_born.get(seg, 0) + 1
            sig.append(("a", n))
            continue
        s, j = born.pop(key, (-1, -1))
        if s not in (seg, seg - 1):
            return None
        sig.append(("f", s - seg, j))
    return sig


def expand(events: list[Event], marks: list[int], cuts: list[Cut]) -> list[Event] | None:
    """The events of the whole component from those of its cut trace (module docstring), or
    None where the middle blocks are not one pattern. ``marks``: :data:`KEPT` event indices per
    cut (where each kept block starts), in the order of ``cuts``."""
    out = list(events)
    # the later stack first: expanding it leaves the earlier stack's marks where they are
    for i in reversed(range(len(cuts))):
        got = _repeat(out, marks[KEPT * i : KEPT * (i + 1)], cuts[i].n_blocks - KEPT)
        if got is None:
            return None
        out = got
    return out


def _repeat(events: list[Event], marks: list[int], copies: int) -> list[Event] | None:
    """Block 3's events (``marks[3]:marks[4]``) repeated ``copies`` times before the last
    block's; None where blocks 2 and 3 are not one pattern."""
    if len(marks) != KEPT or marks != sorted(marks) or marks[-1] > len(events):
        return None
    born: dict[int, tuple[int, int]] = {}
    n_born: dict[int, int] = {}
    spans = enumerate(zip(marks, marks[1:], strict=False))
    sigs = [_signature(events, a, b, born, n_born, i) for i, (a, b) in spans]
    two, three = sigs[2], sigs[3]
    if two is None or three is None or two != three or any(s == 2 for s, _ in born.values()):
        return None  # not one pattern, or block 2 left something alive past block 3
    m3, m4 = marks[3], marks[4]
    template = events[m3:m4]
    block3 = [k for kind, k, _ in template if kind == "a"]  # block 3's allocations, in order
    position = {k: j for j, k in enumerate(block3)}
    alive = {k: j for k, (s, j) in born.items() if s == 3}  # ...still alive after it
    next_key = max((k for _, k, _ in events), default=0) + 1
    copied: list[Event] = []
    before = block3  # the allocations of the block before the copy
    for _ in range(copies):
        new = list(range(next_key, next_key + len(block3)))
        next_key += len(block3)
        for (kind, key, n), sig in zip(template, three, strict=True):
            if kind == "a":
                copied.append(("a", new[position[key]], n))
            else:  # ("f", 0 | -1, position): its own allocation, or the block before's
                copied.append(("f", (new if sig[1] == 0 else before)[sig[2]], 0))
        before = new
    return _tail(events, m4, before, alive, copied)


def _tail(
    events: list[Event], at: int, last: list[int], alive: dict[int, int], copied: list[Event]
) -> list[Event]:
    """The events before ``at`` (the last block's start), the copies, then the rest with block
    3's surviving allocations renamed to the last copy's (until each is freed)."""
    rename = {k: last[j] for k, j in alive.items()}
    rest: list[Event] = []
    for kind, key, n in events[at:]:
        if key in rename:
            new = rename[key]
            if kind == "f":
                del rename[key]
            rest.append((kind, new, n))
        else:
            rest.append((kind, key, n))
    return [*events[:at], *copied, *rest]


def peak_bytes(events: Sequence[Event]) -> int:
    """The most bytes alive at once over ``events``."""
    live: dict[int, int] = {}
    cur = best = 0
    for kind, key, n in events:
        if kind == "a":
            live[key] = n
            cur += n
            best = max(best, cur)
        else:
            cur -= live.pop(key, 0)
    return best
