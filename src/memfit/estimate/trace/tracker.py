"""Exact accounting of tensor memory: a TorchDispatchMode that sees every storage born and dying.

Every ATen op output passes through :meth:`StorageTracker.__torch_dispatch__`; each new untyped
storage is registered once (keyed by identity, weakly) and its bytes are added to the running total;
a ``weakref`` callback subtracts them when the storage dies. Storage resizes (FSDP frees unsharded
parameters with ``UntypedStorage.resize_(0)``) are tracked too. This works identically for real
tensors and for FakeTensors, which is what lets tests compare a fake trace with a real CPU run.

Categories (parameters, gradients, …) are resolved when a result is read, not when a storage is
born: a buffer created by the autograd engine that later becomes ``param.grad`` counts as a
gradient. Storages nobody labels are ``activations`` if born in a forward-like phase and
``temporary`` otherwise.

The tracker also records the module whose ``forward`` was running when a storage was born (global
module hooks, a name stack), so the peak can be attributed to modules.
"""

from __future__ import annotations

import contextvars
import itertools
import weakref
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from memfit.estimate.result import COMPONENTS
from memfit.estimate.trace import storage_patch

#: Phases whose unlabelled storages are activations (kept for backward or part of a forward pass).
FORWARD_PHASES = ("forward", "prefill", "decode", "init")


#: Set by the CUDA emulation (``cuda_emulation.cuda_kernel_workspaces``): ``rule(func, args,
#: kwargs)`` gives the request sizes of the blocks a CUDA kernel takes from the caching allocator
#: for the duration of the op (freed in reverse order) that CPU kernels do not. None: no rule.
OP_WORKSPACES: contextvars.ContextVar[Callable[..., tuple[int, ...]] | None] = (
    contextvars.ContextVar("memfit_op_workspaces", default=None)
)

_PRIM_DEVICE = torch.ops.prim.device.default
_FakeTensor = torch._subclasses.fake_tensor.FakeTensor

#: What ``.item()`` returns for a fake tensor (float / integer-or-bool).
_FAKE_SCALAR = {True: 1.0, False: 1}


def _is_fake(t: Any) -> bool:
    return isinstance(t, torch._subclasses.FakeTensor)


@dataclass
class _Storage:
    n_bytes: int
    phase: str
    module: str
    label: str | None
    ref: weakref.ref[Any] | None  # None: a kernel workspace, freed by the tracker itself


@dataclass(frozen=True)
class Snapshot:
    """The live storages at one instant (a peak): their keys and the total bytes."""

    total_bytes: int
    keys: tuple[int, ...]
    phase: str


class StorageTracker(TorchDispatchMode):
    """Track live tensor storages. Enter *inside* FakeTensorMode when tracing fake tensors.

    ``device_type``: only storages on this device type count (AdamW keeps ``step`` on the CPU for
    example, and a fake trace uses CPU fake tensors to stand for CUDA ones: pass ``"cpu"`` then and
    keep the host-side scalars out by labelling them with :meth:`ignore`).
    ``record_events``: keep the ("a", key, n_bytes) / ("f", key, 0) sequence for allocator replay.
    """

    def __init__(
        self, *, device_type: str | None = None, record_events: bool = True, round_to: int = 512
    ) -> None:
        super().__init__()
        self.round_to = round_to
        self.device_type = device_type
        self.events: list[tuple[str, int, int]] | None = [] if record_events else None
        self._key_of: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._counter = itertools.count()
        self.storages: dict[int, _Storage] = {}
        self.live: dict[int, int] = {}
        self.current_bytes = 0
        self.phase = "init"
        self.peak = Snapshot(0, (), "init")
        self.phase_peaks: dict[str, Snapshot] = {}
        #: (phase, number of events so far) at each ``set_phase``: where each step starts.
        self.phase_marks: list[tuple[str, int]] = []
        self.n_ops = 0
        self._ignored: set[int] = set()
        self._module_stack: list[str] = []
        self._module_names: dict[int, str] = {}
        self._hook_handles: list[Any] = []

    # ----------------------------------------------------------------- registration
    def track(self, t: torch.Tensor, label: str | None = None) -> int | None:
        """Register ``t``'s storage (if new) and optionally force its label. Returns its key."""
        if is_traceable_wrapper_subclass(t):
            key = None
            inner_names, _ = t.__tensor_flatten__()
            for name in inner_names:
                inner = getattr(t, name)
                if isinstance(inner, torch.Tensor):
                    key = self.track(inner, label)
            return key
        if self.device_type is not None and t.device.type != self.device_type:
            return None
        storage = t.untyped_storage()
        key = self._key_of.get(storage)
        if key is None:
            key = next(self._counter)
            n_bytes = self._rounded(storage.nbytes())
            self._key_of[storage] = key
            module = self._module_stack[-1] if self._module_stack else self._outside_owner()
            ref = weakref.ref(storage, partial(self._on_free_ref, key))
            self.storages[key] = _Storage(n_bytes, self.phase, module, label, ref)
            self._set_live(key, n_bytes)
        elif label is not None:
            self.storages[key].label = label
        return key

    def _rounded(self, n_bytes: int) -> int:
        """CUDA's caching allocator hands out multiples of 512 B (``kMinBlockSize``)."""
        r = self.round_to
        return -(-n_bytes // r) * r if r > 1 else n_bytes

    def _outside_owner(self) -> str:
        """Owner of a storage born outside any module: the autograd node running it in backward
        (``(backward) MmBackward0``), else the phase (the loss, the optimizer step)."""
        node = torch._C._current_autograd_node() if self.phase == "backward" else None
        if node is not None:
            return f"(backward) {node.name()}"
        return f"({self.phase}, outside modules)"

    def label(self, tensors: Iterable[Any], label: str) -> None:
        """Force ``label`` (one of COMPONENTS) on the storages of ``tensors``."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self.track(t, label)

    def ignore(self, tensors: Iterable[Any]) -> None:
        """Stop counting these storages (host-side scalars standing in for CPU tensors)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                key = self.track(t)
                if key is not None and key in self.live:
                    self._ignored.add(key)
                    self._set_live(key, 0)

    def _set_live(self, key: int, n_bytes: int) -> None:
        old = self.live.get(key, 0)
        if key in self._ignored:
            n_bytes = 0
        self.live[key] = n_bytes
        self.current_bytes += n_bytes - old
        if self.events is not None:
            if old:
                self.events.append(("f", key, 0))
            if n_bytes:
                self.events.append(("a", key, n_bytes))
        if n_bytes > old:
            self._check_peak()

    def _on_free_ref(self, key: int, _ref: Any) -> None:
        self._on_free(key)

    def _on_free(self, key: int) -> None:
        n_bytes = self.live.pop(key, None)
        if n_bytes is None:
            return
        self.current_bytes -= n_bytes
        if self.events is not None and n_bytes:
            self.events.append(("f", key, 0))

    def _check_peak(self) -> None:
        cur = self.current_bytes
        if cur > self.peak.total_bytes:
            self.peak = Snapshot(cur, tuple(self.live), self.phase)
        ph = self.phase_peaks.get(self.phase)
        if ph is None or cur > ph.total_bytes:
            self.phase_peaks[self.phase] = Snapshot(cur, tuple(self.live), self.phase)

    def set_phase(self, phase: str) -> None:
        self.phase = phase
        if self.events is not None:
            self.phase_marks.append((phase, len(self.events)))
        self._check_peak()

    # ----------------------------------------------------------------- modules
    def watch_modules(self, model: torch.nn.Module) -> None:
        """Attribute storages to the innermost running module of ``model`` (by qualified name)."""
        self._module_names.update({id(m): name for name, m in model.named_modules()})
        pre = torch.nn.modules.module.register_module_forward_pre_hook(self._enter_module)
        post = torch.nn.modules.module.register_module_forward_hook(self._exit_module)
        self._hook_handles += [pre, post]

    def _enter_module(self, module: torch.nn.Module, _args: Any) -> None:
        name = self._module_names.get(id(module))
        if name is not None:
            self._module_stack.append(name)

    def _exit_module(self, module: torch.nn.Module, _args: Any, _out: Any) -> None:
        if self._module_names.get(id(module)) is not None and self._module_stack:
            self._module_stack.pop()

    def owner_of_parameters(self, model: torch.nn.Module) -> None:
        """Attribute parameters (and later their grads/states) to the module that owns them."""
        for mod_name, mod in model.named_modules():
            for p in mod.parameters(recurse=False):
                key = self.track(p)
                if key is not None:
                    self.storages[key].module = mod_name

    # ----------------------------------------------------------------- dispatch
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is _PRIM_DEVICE and type(args[0]) is _FakeTensor:
            # ``t.device`` (six in ten of a fake trace's dispatches, from autograd and model
            # code): what FakeTensorMode answers (``fake_tensor._device_handler``), without the
            # round trip through its dispatch; counted as an op as that round trip is
            out = (
                torch.device("meta")
                if args[0].fake_mode.in_kernel_invocation
                else args[0].fake_device
            )
            self.n_ops += 1
        else:
            if func is torch.ops.aten._local_scalar_dense.default and _is_fake(args[0]):
                # ``.item()`` on a fake tensor has no value. Optimizers such as Adafactor use it
                # only for step sizes, never for shapes: any positive value leaves the
                # allocations unchanged.
                return _FAKE_SCALAR[args[0].dtype.is_floating_point]
            out = func(*args, **(kwargs or {}))
            self.n_ops += 1
            if isinstance(out, torch.Tensor):  # most ops: one tensor, no tree to flatten
                self.track(out)
            else:
                flat, _ = tree_flatten(out)
                for t in flat:
                    if isinstance(t, torch.Tensor):
                        self.track(t)
        rule = OP_WORKSPACES.get()
        if rule is not None:
            sizes = rule(func, args, kwargs or {})
            if sizes:
                self._workspaces(sizes)
        return out

    def _workspaces(self, sizes: tuple[int, ...]) -> None:
        """Blocks a kernel allocates after its outputs and frees before it returns (temporary)."""
        module = self._module_stack[-1] if self._module_stack else self._outside_owner()
        keys = []
        for n in sizes:
            key = next(self._counter)
            n_bytes = self._rounded(n)
            self.storages[key] = _Storage(n_bytes, self.phase, module, "temporary", None)
            self._set_live(key, n_bytes)
            keys.append(key)
        for key in reversed(keys):
            self._on_free(key)

    def on_storage_resize(self, storage: Any, size: int) -> None:
        """Called by the shared ``UntypedStorage.resize_`` patch (storage_patch.py)."""
        key = self._key_of.get(storage)
        if key is not None and key in self.live:
            n_bytes = self._rounded(size)
            self.storages[key].n_bytes = max(self.storages[key].n_bytes, n_bytes)
            self._set_live(key, n_bytes)

    def __enter__(self) -> StorageTracker:
        storage_patch.subscribe(self)  # one reference-counted patch, undone in any exit order
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        storage_patch.unsubscribe(self)
        for h in self._hook_handles:
            h.remove()
        self._hook_handles.clear()
        super().__exit__(*exc)

    # ----------------------------------------------------------------- reading results
    def component_of(self, key: int) -> str:
        st = self.storages[key]
        if st.label is not None:
            return st.label
        return "activations" if st.phase.startswith(FORWARD_PHASES) else "temporary"

    def breakdown(self, snap: Snapshot) -> dict[str, int]:
        out = dict.fromkeys(COMPONENTS, 0)
        for key in snap.keys:
            n = self._live_size_at(key)
            out[self.component_of(key)] += n
        return out

    def _live_size_at(self, key: int) -> int:
        return 0 if key in self._ignored else self.storages[key].n_bytes

    def by_module(self, snap: Snapshot) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for key in snap.keys:
            st = self.storages[key]
            out[st.module or "(top-level forward, e.g. the loss)"] += self._live_size_at(key)
        return dict(out)

    def iter_live(self) -> Iterator[tuple[int, int]]:
        return iter(self.live.items())
