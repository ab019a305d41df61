"""A symbolic autograd tape: which tensors one block of a model allocates, saves and frees.

The analytic engine describes each model family as a short program of tensor ops (``ops.py``,
``blocks.py``). Recording the program builds a :class:`Graph` of :class:`Node` s; :meth:`Graph.
forward` and :meth:`Graph.backward` then replay it the way PyTorch's autograd runs it:

* forward: every op allocates its outputs; a tensor is freed after its last use unless a node saved
  it for backward (``SavedVariable``) or the program holds it (a Python local, a returned value);
* backward: nodes run in reverse creation order (autograd's sequence-number priority); a node
  allocates the gradients of its inputs (and a kernel workspace) while its incoming gradients and
  saved tensors are still alive, then releases them (``release_variables`` with
  ``retain_graph=False``). A second gradient for the same tensor is summed into the first
  (``InputBuffer::accumulate``: one transient allocation). A leaf's first gradient becomes
  ``param.grad`` (AccumulateGrad steals it).

Sizes are exact byte counts. The result of a replay is a :class:`Profile`: the live bytes at every
allocation, *relative to the start of the block*, by component. The engine composes blocks
(embeddings, ``L`` identical layers, the head and loss) by adding profiles, which is exact for
identical layers (the same argument as the trace engine's layer extrapolation) and independent of
``L`` in cost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

#: Bytes per element (torch dtypes: float32, bfloat16, float16, int64, bool/uint8).
DTYPE_BYTES = {"f32": 4, "bf16": 2, "f16": 2, "i64": 8, "i32": 4, "bool": 1, "u8": 1}

#: Components, in ``memfit.estimate.result.COMPONENTS`` order, as vector indices.
PARAMS, GRADS, STATES, ACTS, KV, TEMP = range(6)
N_COMP = 6

Vec = tuple[int, int, int, int, int, int]
ZERO: Vec = (0, 0, 0, 0, 0, 0)


def vadd(a: Vec, b: Vec) -> Vec:
    return (a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3], a[4] + b[4], a[5] + b[5])


def vscale(a: Vec, k: int) -> Vec:
    return (a[0] * k, a[1] * k, a[2] * k, a[3] * k, a[4] * k, a[5] * k)


def vsub(a: Vec, b: Vec) -> Vec:
    return (a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3], a[4] - b[4], a[5] - b[5])


_sub = vsub


def _relative(points: list[Vec], base: Vec) -> list[Vec]:
    """``[vsub(p, base) for p in points]``, inline (a planner search shifts ~10^5 points)."""
    b0, b1, b2, b3, b4, b5 = base
    return [(p[0] - b0, p[1] - b1, p[2] - b2, p[3] - b3, p[4] - b4, p[5] - b5) for p in points]


def one(comp: int, n_bytes: int) -> Vec:
    v = [0] * N_COMP
    v[comp] = n_bytes
    return (v[0], v[1], v[2], v[3], v[4], v[5])


class Storage:
    """A block of device memory; views share one."""

    __slots__ = ("n_bytes", "comp", "refs", "live")

    def __init__(self, n_bytes: int, comp: int) -> None:
        self.n_bytes = n_bytes
        self.comp = comp
        self.refs = 0  # live tensors viewing it
        self.live = False


class Tensor:
    """A tensor of the program: ``numel`` elements of ``dtype``; ``rg``: requires grad."""

    __slots__ = (
        "numel",
        "dtype",
        "storage",
        "rg",
        "leaf",
        "n_uses",
        "n_savers",
        "held",
        "grad",
        "external",
        "alive",
        "trainable",
        "shape",
        "sum_out_of_place",
        "hold_grad",
        "release_buffered",
        "is_embedding",
        "stored_bytes",
    )

    def __init__(self, numel: int, dtype: str, *, rg: bool, storage: Storage | None = None):
        self.numel = numel
        self.dtype = dtype
        self.storage = storage or Storage(numel * DTYPE_BYTES[dtype], ACTS)
        self.rg = rg
        self.leaf = False  # a parameter: its first gradient becomes .grad
        self.n_uses = 0  # forward uses still to come
        self.n_savers = 0  # backward nodes still to run that saved it
        self.held = False  # the program keeps a reference (lives until the block's end)
        self.grad: Storage | None = None
        self.external = False  # created outside this block (its memory is the caller's)
        self.alive = False
        self.trainable = False
        self.shape: tuple[int, ...] = ()
        self.sum_out_of_place = False  # an existing .grad is replaced by old + new
        self.hold_grad = False  # its gradient waits in an input buffer past this block
        self.release_buffered = False  # frees the gradient another block buffered for it
        self.is_embedding = False  # an nn.Embedding weight
        self.stored_bytes: int | None = (
            None  # a quantized layer's stored bytes (else numel x dtype)
        )

    @property
    def n_bytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]


@dataclass(slots=True)
class Node:
    """One op. ``saves``: tensors autograd keeps for its backward. ``grad_to``: inputs that get a
    gradient (default: the inputs that require grad). ``bwd_workspace``: bytes the backward kernel
    allocates for its duration. ``fwd_workspace``: likewise in forward. ``matmul``: a selective
    checkpointing policy stores its outputs. ``mm``: the matmul is a linear layer's ``aten.mm``
    (torchtitan's per-op policy saves every other one: :func:`sac_stored`). ``passthrough``: the
    backward hands its incoming gradient itself to each input of the output's size and dtype
    (``AddBackward0``)."""

    inputs: list[Tensor]
    outputs: list[Tensor]
    saves: list[Tensor]
    grad_to: list[Tensor] | None = None
    bwd_workspace: int = 0
    fwd_workspace: int = 0
    matmul: bool = False
    rg: bool = False
    passthrough: bool = False
    mm: bool = False
    #: a saved tensor the backward writes the first input's gradient into (``torch.matmul(...,
    #: out=X)``: Unsloth's fused LoRA kernels): that storage becomes the gradient, no allocation
    grad_into: Tensor | None = None
    #: ``bwd_workspace`` is the bias gradient's reduction staging, run after the input's and
    #: the weight's gradients (``AddmmBackward0``: the bias ``sum`` last); in a recomputed
    #: block the saved tensors unpacked from the checkpoint are gone by then (see
    #: :meth:`Graph.backward`)
    late_staging: bool = False


#: Selective checkpointing policies of :meth:`Graph.forward`: ``matmul`` stores every matmul and
#: attention kernel's outputs (memfit's ``selective``); ``alternate-mm`` stores the attention
#: kernels' outputs and every other linear ``aten.mm`` output, the 1st, 3rd, ... of the block
#: (torchtitan's per-op SAC, ``--checkpointing selective-op``: ``_custom_policy`` counts
#: ``aten.mm`` per checkpointed block and recomputes each even-numbered one; its ``_save_list``
#: holds ``aten.mm``, the flash / efficient SDPA kernels and ``reduce_scatter_tensor``, torchtitan
#: ``torchtitan/parallelisms/parallelize_llama.py`` at 9dec370; ``SelectiveAC`` in
#: ``torchtitan/distributed/activation_checkpoint.py`` at b5bcd76 keeps the rule).
SAC_POLICIES = ("matmul", "alternate-mm")


def sac_stored(nodes: list[Node], policy: str) -> list[bool]:
    """Whether selective checkpointing under ``policy`` (:data:`SAC_POLICIES`) stores each node's
    outputs in the forward."""
    if policy == "matmul":
        return [n.matmul for n in nodes]
    out, n_mm = [], 0
    for n in nodes:
        if n.mm:
            n_mm += 1
            out.append(n_mm % 2 == 1)
        else:
            out.append(n.matmul)
    return out


@dataclass
class Profile:
    """Live bytes relative to the block's start, at each allocation: ``fwd``/``bwd`` points and
    the net change at the end of each pass (``fwd_end``, ``bwd_end``)."""

    fwd: list[Vec] = field(default_factory=list)
    fwd_end: Vec = ZERO
    bwd: list[Vec] = field(default_factory=list)
    bwd_end: Vec = ZERO

    def fwd_peak(self) -> Vec:
        return max(self.fwd, key=sum, default=ZERO)

    def bwd_peak(self) -> Vec:
        return max(self.bwd, key=sum, default=ZERO)


class Graph:
    """Records a block's ops, then replays forward and backward (see the module docstring)."""

    def __init__(self, *, grad_enabled: bool) -> None:
        self.grad_enabled = grad_enabled
        self.nodes: list[Node] = []
        self.params: list[Tensor] = []
        self._live: list[int] = [0] * N_COMP
        self._points: list[Vec] = []
        #: index of the first forward / backward point of a node using each parameter (by id)
        self.fwd_point_of: dict[int, int] = {}
        self.bwd_point_of: dict[int, int] = {}
        #: Held tensors whose last reference goes once backward has passed the later blocks
        #: (a mask every layer's backward still reads): freed when this block's backward starts.
        self.freed_at_backward: list[Tensor] = []
        #: A recomputation (:meth:`recomputation`): the index of the first node it does not run,
        #: the tensors the checkpoint keeps (its inputs, stored outputs the recomputation does
        #: not reach) and the node whose release of its saved tensors frees them.
        self._stop: int | None = None
        self._until_stop: list[Tensor] = []
        self._kept: list[Tensor] = []
        self._first_saver: Node | None = None
        self._last_saver: Node | None = None
        #: The optimizer steps each parameter inside backward (``optimizer_in_bwd``): a new
        #: ``.grad`` lives for its own node's point only, with the bytes the per-parameter step
        #: allocates (``step_temp_bytes(param)``), then the hook's ``zero_grad`` frees it.
        self.step_in_backward = False
        self.step_temp_bytes: Callable[[Tensor], int] = lambda t: 0
        #: The forward's allocations and frees in the program's order, ``("a", key, n_bytes)``
        #: / ``("f", key, n_bytes)`` (a storage's ``id``; a free of the block's input carries
        #: its bytes, whose allocation the caller's block made), as the trace's StorageTracker
        #: records them: kept where a program asks for its reserved bytes by the caching
        #: allocator's replay (:mod:`memfit.estimate.analytic.replay`); None: not kept.
        self.events: list[tuple[str, int, int]] | None = None

    # ------------------------------------------------------------------ recording
    def external(self, numel: int, dtype: str, *, rg: bool = False, comp: int = ACTS) -> Tensor:
        """A tensor that exists before the block (its input, a shared mask): not counted unless the
        block frees it."""
        t = Tensor(numel, dtype, rg=rg, storage=Storage(numel * DTYPE_BYTES[dtype], comp))
        t.external = True
        return t

    def input(self, numel: int, dtype: str, *, rg: bool, comp: int = ACTS) -> Tensor:
        """The block's input: alive when the block starts (counted by the caller), freed by the
        block after its last use unless saved or held (its bytes then leave the profile)."""
        t = Tensor(numel, dtype, rg=rg and self.grad_enabled)
        t.storage.comp = comp
        t.alive = True
        t.storage.refs = 1
        t.storage.live = True
        self._live[comp] += t.storage.n_bytes
        return t

    def param(
        self, numel: int, dtype: str, *, trainable: bool, shape: tuple[int, ...] = ()
    ) -> Tensor:
        t = Tensor(numel, dtype, rg=trainable and self.grad_enabled, storage=Storage(0, PARAMS))
        t.leaf = True
        t.external = True
        t.trainable = trainable
        t.shape = shape or (numel,)
        self.params.append(t)
        return t

    def op(
        self,
        inputs: list[Tensor],
        outputs: list[tuple[int, str]] | list[Tensor],
        *,
        saves: list[Tensor] | None = None,
        differentiable: bool = True,
        grad_to: list[Tensor] | None = None,
        bwd_workspace: int = 0,
        fwd_workspace: int = 0,
        matmul: bool = False,
        view_of: Tensor | None = None,
        passthrough: bool = False,
        mm: bool = False,
        late_staging: bool = False,
    ) -> list[Tensor]:
        # (loops and Node's fields by position: a planner search records ~10^4 ops, issue 32)
        rg = False
        if self.grad_enabled and differentiable:
            for t in inputs:
                if t.rg:
                    rg = True
                    break
        outs: list[Tensor] = []
        shared = view_of.storage if view_of is not None else None
        for o in outputs:
            if isinstance(o, Tensor):
                o.rg = rg
                outs.append(o)
            else:
                outs.append(Tensor(o[0], o[1], rg=rg, storage=shared))
        kept = [t for t in saves if t is not None] if rg and saves else []
        node = Node(
            list(inputs),
            outs,
            kept,
            grad_to,
            bwd_workspace,
            fwd_workspace,
            matmul,
            rg,
            passthrough,
            mm,
        )  # fmt: skip
        if late_staging:
            node.late_staging = True
        self.nodes.append(node)
        return outs

    def hold(self, *tensors: Tensor) -> None:
        """The program keeps these alive until the block ends (returned values, module outputs the
        caller keeps)."""
        for t in tensors:
            t.held = True

    def touch(self, *tensors: Tensor) -> None:
        """A Python local still referenced here: extend the tensors' lifetime to this point."""
        self.nodes.append(Node(inputs=list(tensors), outputs=[], saves=[]))

    def recomputation(self, inputs: list[Tensor], *, stored: bool | str = False) -> None:
        """Make this recording of a checkpointed block its recomputation in backward, as
        ``torch.utils.checkpoint`` runs it with ``use_reentrant=False``; :meth:`backward` then
        replays it:

        * the recomputation runs when backward first needs a saved tensor: at the last node
          that saves any (the nodes after it have run their backward by then);
        * nothing the recomputed forward makes outlives it but what autograd saves (the
          checkpoint's unpack hooks hand those out): what the block holds (its return value, a
          module's returned locals) is dropped when the recomputation ends;
        * the checkpoint keeps the block's ``inputs`` (its arguments, for the recomputation)
          until the last saved tensor of the block is released: once the backward of its first
          node that saves anything is done (the last reference to the checkpoint's frame goes
          with that node's saved variables). An external input among them is one this
          checkpoint is the last to keep: freed then too;
        * early stop (on by default): the recomputation raises once the last tensor the forward
          saved has been saved again (``_recomputation_hook.pack_hook``). A node packs its saved
          inputs before its kernel runs and its saved outputs after: the last saving node runs
          only if it saves one of its outputs, and no later node runs (their backward still
          does). Selective checkpointing (``stored``) stops at the same tensor: the matmul
          outputs its policy stored in the forward are there already (the recomputation takes
          them from the checkpoint's cache), those of the nodes not reached stay in the cache,
          freed with the inputs.

        Tensors made outside the block are the forward's own: a hold on them stands."""
        self._until_stop = [
            t
            for node in self.nodes
            for t in node.outputs
            if t.held and not t.alive and not t.external
        ]
        for t in inputs:
            if t.external:  # counted by the caller until this checkpoint lets go of it
                t.external = False
                t.alive = True
                t.storage.refs += 1
                self._alloc(t.storage)
            if not t.held:
                t.held = True
                self._kept.append(t)
        savers = [i for i, n in enumerate(self.nodes) if n.saves]
        self._stop = 0
        if savers:
            self._first_saver = self.nodes[savers[0]]
            self._last_saver = node = self.nodes[savers[-1]]
            saves_output = any(s is t for s in node.saves for t in node.outputs)
            self._stop = savers[-1] + 1 if saves_output else savers[-1]
        if stored:
            keep = sac_stored(self.nodes, "matmul" if stored is True else str(stored))
            for i, node in enumerate(self.nodes):
                for t in node.outputs if keep[i] else []:
                    if not t.alive:  # counted by the caller since the forward
                        t.alive = True
                        t.storage.refs += 1
                        self._alloc(t.storage)
                        if i >= self._stop:  # not reached: the checkpoint's cache keeps it
                            t.held = True
                            self._kept.append(t)

    # ------------------------------------------------------------------ replay helpers
    def _alloc(self, storage: Storage) -> None:
        if not storage.live:
            storage.live = True
            self._live[storage.comp] += storage.n_bytes
            if self.events is not None:
                self.events.append(("a", id(storage), storage.n_bytes))

    def _release(self, storage: Storage) -> None:
        if storage.live:
            storage.live = False
            self._live[storage.comp] -= storage.n_bytes
            if self.events is not None:
                self.events.append(("f", id(storage), storage.n_bytes))

    def _point(self) -> None:
        v = self._live
        self._points.append((v[0], v[1], v[2], v[3], v[4], v[5]))

    def _now(self) -> Vec:
        v = self._live
        return (v[0], v[1], v[2], v[3], v[4], v[5])

    def _drop(self, t: Tensor) -> None:
        """``t`` is no longer referenced by the program: free its storage with its last view."""
        if not t.alive:
            return
        t.alive = False
        t.storage.refs -= 1
        if t.storage.refs <= 0 and not t.external:
            self._release(t.storage)

    # ------------------------------------------------------------------ forward
    def forward(self, *, save_policy: str = "all") -> tuple[list[Vec], Vec]:
        """Replay the forward pass. ``save_policy``: ``all`` (autograd saves), ``none`` (a
        checkpointed block: nothing saved), ``matmul`` / ``alternate-mm`` (selective
        checkpointing: the outputs :func:`sac_stored` names are stored). Returns the points and
        the net change, relative to the start.

        Selective checkpointing stores a matmul's outputs whether or not they require grad
        (``torch.utils.checkpoint._CachingTorchDispatchMode`` asks only the policy): the frozen
        base projection of a LoRA layer whose input needs no gradient is kept too."""
        base = self._now()
        self._points = []
        self._replay(save_policy)
        return _relative(self._points, base), _sub(self._now(), base)

    def _replay(self, save_policy: str) -> None:
        """The forward's allocations and frees, as points appended to ``_points`` (a
        recomputation: up to its early stop)."""
        stop = len(self.nodes) if self._stop is None else self._stop
        for node in self.nodes:
            for t in node.inputs:
                t.n_uses += 1
            if save_policy == "all":
                for t in node.saves:
                    t.n_savers += 1
        if save_policy in SAC_POLICIES:
            for node, keep in zip(self.nodes, sac_stored(self.nodes, save_policy), strict=True):
                for t in node.outputs if keep else []:
                    t.n_savers += 1
        for i, node in enumerate(self.nodes):
            if i >= stop:  # a recomputation stopped early: uses end, nothing is made
                for t in node.inputs:
                    t.n_uses -= 1
                    if t.n_uses == 0 and t.n_savers == 0 and not t.held and not t.external:
                        self._drop(t)
                continue
            for t in node.outputs:
                if not t.alive:
                    t.alive = True
                    t.storage.refs += 1
                    if not t.external:
                        self._alloc(t.storage)
            if node.fwd_workspace:
                self._live[TEMP if not self.grad_enabled else ACTS] += node.fwd_workspace
                if self.events is not None:
                    self.events.append(("a", id(node), node.fwd_workspace))
            if node.outputs or node.fwd_workspace:
                self._point()
                for t in node.inputs:
                    if t.leaf:
                        self.fwd_point_of.setdefault(id(t), len(self._points) - 1)
            if node.fwd_workspace:
                self._live[TEMP if not self.grad_enabled else ACTS] -= node.fwd_workspace
                if self.events is not None:
                    self.events.append(("f", id(node), node.fwd_workspace))
            for t in node.inputs:
                t.n_uses -= 1
                if t.n_uses == 0 and t.n_savers == 0 and not t.held and not t.external:
                    self._drop(t)
            for t in node.outputs:
                if t.n_uses == 0 and t.n_savers == 0 and not t.held:
                    self._drop(t)
        for t in self._until_stop:  # a recomputation ends: its locals go
            t.held = False
            if t.n_uses == 0 and t.n_savers == 0:
                self._drop(t)
        self._until_stop = []

    # ------------------------------------------------------------------ backward
    def backward(self, outputs: list[Tensor], *, existing_grads: bool = False) -> list[Vec]:
        """Replay backward from gradients of ``outputs`` (allocated by the caller, i.e. already
        counted). ``existing_grads``: parameters already hold a gradient (accumulation, or
        ``zero_grad(set_to_none=False)``): new ones are summed in place. A recomputation
        (:meth:`recomputation`) runs when backward reaches its last saving node."""
        points: list[Vec] = []
        self._points = points  # the recomputation's forward points go here too (_replay)
        base = self._now()
        for t in self.freed_at_backward:
            t.held = False
            self._drop(t)
        for t in outputs:
            t.grad = Storage(t.n_bytes, TEMP)
            t.grad.live = True
            t.grad.refs = 1
        recomputed = False
        for node in reversed(self.nodes):
            if node is self._last_saver:  # the first unpack: the checkpoint recomputes
                self._replay("all")
                recomputed = True
            if not node.rg:
                continue
            for t in node.outputs:
                if t.grad is not None:
                    break
            else:  # no incoming gradient
                self._release_saved(node)
                continue
            late = recomputed and node.late_staging
            if node.bwd_workspace and not late:
                self._live[TEMP] += node.bwd_workspace
            transient: list[Storage] = []
            passed = node.outputs[0] if node.passthrough else None
            for t in node.grad_to if node.grad_to is not None else node.inputs:
                if not t.rg:
                    continue
                if passed is not None and passed.grad is not None and _takes(t, passed):
                    t.grad = passed.grad  # the incoming gradient itself: no allocation
                    t.grad.refs += 1
                    continue
                if node.grad_into is not None and t is node.inputs[0] and t.grad is None:
                    t.grad = self._take_over(node.grad_into.storage)
                    continue
                if t.leaf:
                    g = Storage(t.n_bytes, GRADS)
                    self._alloc(g)
                    fresh = t.grad is None and not existing_grads and not t.sum_out_of_place
                    if self.step_in_backward and fresh:
                        # post-accumulate-grad hook: step this parameter, then zero_grad
                        transient.append(g)
                        step_temp = Storage(self.step_temp_bytes(t), TEMP)
                        self._alloc(step_temp)
                        transient.append(step_temp)
                    elif t.grad is not None or existing_grads or t.sum_out_of_place:
                        g.comp = TEMP
                        self._live[GRADS] -= g.n_bytes
                        self._live[TEMP] += g.n_bytes
                        if not t.hold_grad:
                            transient.append(g)
                        if t.sum_out_of_place:
                            s = Storage(t.n_bytes, TEMP)
                            self._alloc(s)
                            transient.append(s)
                        if t.release_buffered:
                            buffered = Storage(t.n_bytes, TEMP)
                            buffered.live = True
                            transient.append(buffered)
                    else:
                        t.grad = g
                elif t.grad is None:
                    t.grad = Storage(t.n_bytes, TEMP)
                    t.grad.refs = 1
                    self._alloc(t.grad)
                elif t.grad.refs > 1:
                    # InputBuffer::accumulate: the buffered gradient is shared, so the sum goes
                    # into the new one (in place) and the buffer lets go of the shared one
                    g = Storage(t.n_bytes, TEMP)
                    g.refs = 1
                    self._alloc(g)
                    self._unref_grad(t.grad)
                    t.grad = g
                else:
                    g = Storage(t.n_bytes, TEMP)
                    self._alloc(g)
                    transient.append(g)
            v = self._live
            points.append((v[0], v[1], v[2], v[3], v[4], v[5]))
            for t in node.inputs:
                if t.leaf:
                    self.bwd_point_of.setdefault(id(t), len(points) - 1)
            if late and node.bwd_workspace:
                self._late_staging(node)
            elif node.bwd_workspace:
                self._live[TEMP] -= node.bwd_workspace
            for g in transient:
                self._release(g)
            for t in node.outputs:
                if t.grad is not None:
                    self._unref_grad(t.grad)
                    t.grad = None
            self._release_saved(node)
        self._release_kept()
        return _relative(self._points, base) + [_sub(self._now(), base)]

    def _late_staging(self, node: Node) -> None:
        """A recomputed block's ``AddmmBackward0`` with a trainable bias: the input's and the
        weight's gradients are made, then the saved tensors the node alone held die (a
        checkpoint's saved tensor is unpacked into the node's locals, its last owner: the
        checkpoint's frame lets go of it on unpack, torch ``utils/checkpoint.py``
        ``_checkpoint_hook.unpack_hook``), then the bias's ``sum`` takes its reduction staging.
        Seen in the trace (docs/accuracy.md, "Whisper training and inference on the fast
        path"): without checkpointing the ``SavedVariable`` keeps the input until the node's
        variables are released, after the staging."""
        for t in node.saves:
            s = t.storage
            alone = t.n_savers == 1 and t.n_uses == 0 and not t.held and s.refs <= 1
            if alone and not t.external and not t.leaf:
                self._release(s)
        v = self._live
        v[TEMP] += node.bwd_workspace
        self._points.append((v[0], v[1], v[2], v[3], v[4], v[5]))
        v[TEMP] -= node.bwd_workspace

    def _take_over(self, s: Storage) -> Storage:
        """A saved tensor's live storage becomes a gradient (held until its last holder lets
        go, as a gradient: counted as a temporary from here on)."""
        s.refs += 1
        if s.live and s.comp != TEMP:
            self._live[s.comp] -= s.n_bytes
            self._live[TEMP] += s.n_bytes
        s.comp = TEMP
        return s

    def _unref_grad(self, g: Storage) -> None:
        """A holder of gradient ``g`` lets go of it: freed with its last holder."""
        g.refs -= 1
        if g.refs <= 0:
            self._release(g)

    def _release_saved(self, node: Node) -> None:
        for t in node.saves:
            t.n_savers -= 1
            if t.n_savers == 0 and t.n_uses == 0 and not t.held:
                self._drop(t)
        node.saves = []
        if node is self._first_saver:
            self._release_kept()

    def _release_kept(self) -> None:
        """A recomputed block's checkpoint is gone: free what it kept."""
        for t in self._kept:
            t.held = False
            if t.n_savers == 0 and t.n_uses == 0:
                self._drop(t)
        self._kept = []


def _takes(t: Tensor, out: Tensor) -> bool:
    """``t`` has no gradient yet and takes ``out``'s as it is (same size and dtype: no
    reduction, no cast). Not a parameter: AccumulateGrad copies a gradient others share."""
    return not t.leaf and t.grad is None and t.numel == out.numel and t.dtype == out.dtype
