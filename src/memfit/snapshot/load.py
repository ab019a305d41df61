"""Read a PyTorch CUDA memory snapshot pickle safely, whole or as a stream.

A snapshot (``torch.cuda.memory._dump_snapshot()``: ``pickle.dump`` of the dict that
``torch.cuda.memory._snapshot()`` returns, built in ``THCPModule_memorySnapshot``,
``torch/csrc/cuda/Module.cpp``; or ``torch::cuda::_memory_snapshot_pickled()`` from C++, written by
the TorchScript pickler in ``torch/csrc/cuda/memory_snapshot.cpp``) holds only dicts, lists,
tuples (``segment_pool_id``, ``pool_id``), str, int, float (``garbage_collection_threshold``),
bool and None. No class is ever named in it, so both readers here refuse every global: a pickle
that names one (``os.system``, ``builtins.eval``…) is rejected before anything is called.

Whole (``load_snapshot``): ``pickle.Unpickler`` with ``find_class`` refusing everything. Fast (C),
but the objects take several times the file's size in RAM.

Stream (``stream_snapshot``): an opcode interpreter in two passes over the file. Pass 1 checks every
opcode against the allowed set and records which memo slots are ever read back (``BINGET``).
Pass 2 builds objects, keeps in the memo only those slots (frames, keys and file names, shared by
many events) and hands every segment and every trace event to a callback as soon as it is complete
instead of appending it to its list, so nothing proportional to the number of events stays in
memory.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO, cast

from memfit.errors import SnapshotError
from memfit.userfiles import SNAPSHOT_MAX_BYTES, UserFileError, open_regular

#: Files at least this large are streamed by ``read_snapshot(path)`` unless told otherwise: the
#: C unpickler holds the whole object tree (measured in benchmarks/results/snapshot_memory.md).
STREAM_FROM_BYTES = 32 * 1024 * 1024

_NOT_A_SNAPSHOT = (
    "a torch memory snapshot holds only dicts, lists, strings and numbers, so this file is not one "
    "(or it was altered); nothing in it was executed"
)


class _RefusingUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        raise SnapshotError(
            f"refused to load: the pickle asks for {module}.{name}; {_NOT_A_SNAPSHOT}"
        )

    def persistent_load(self, pid: Any) -> Any:
        raise SnapshotError(f"refused to load: the pickle holds a persistent id; {_NOT_A_SNAPSHOT}")


#: What a broken or hostile pickle can raise inside the unpickler (besides our own SnapshotError).
_PICKLE_FAILURES = (
    pickle.UnpicklingError,
    EOFError,
    MemoryError,
    OverflowError,
    TypeError,
    ValueError,
    KeyError,
    IndexError,
    AttributeError,
    RecursionError,
    struct.error,
)


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """The snapshot dict, loaded whole with a pickle reader that refuses every global."""
    path = Path(path)
    with _reading(path) as f:
        obj = _RefusingUnpickler(_Clamped(f)).load()
    return _check_root(path, obj)


class _Clamped:
    """The file as the C unpickler reads it, buffered, with every ``read(n)`` clamped to the
    file's size: a length field claiming 2**60 bytes cannot make it allocate them."""

    def __init__(self, f: BinaryIO) -> None:
        self.size = _size(f)
        self.f = io.BufferedReader(f, _CHUNK_BYTES)  # type: ignore[arg-type,type-var]

    def read(self, n: int = -1) -> bytes:
        return self.f.read(self.size if n is None or n < 0 or n > self.size else n)

    def readline(self, limit: int = -1) -> bytes:
        return self.f.readline(self.size if limit < 0 or limit > self.size else limit)

    def readinto(self, b: Any) -> int:
        return self.f.readinto(b)


def _size(f: BinaryIO | IO[bytes]) -> int:
    return os.fstat(f.fileno()).st_size


@contextlib.contextmanager
def _reading(path: Path) -> Iterator[BinaryIO]:
    """``path`` opened for reading (a regular file of at most ``SNAPSHOT_MAX_BYTES``, through
    :func:`memfit.userfiles.open_regular`: a FIFO or a device is refused, never read); whatever
    goes wrong while it is read becomes a :class:`SnapshotError` naming the file."""
    try:
        with open_regular(path, what="snapshot") as f:
            if _size(f) > SNAPSHOT_MAX_BYTES:
                raise SnapshotError(
                    f"{_size(f):,} bytes is more than the {SNAPSHOT_MAX_BYTES:,} memfit reads "
                    "for a snapshot: is it the right file?"
                )
            yield cast(BinaryIO, f)  # a raw FileIO: a BinaryIO in all but name
    except SnapshotError as exc:
        raise SnapshotError(f"{path}: {exc}") from None
    except UserFileError as exc:  # missing, a directory, a FIFO, a device
        raise SnapshotError(str(exc)) from None
    except OSError as exc:
        raise SnapshotError(f"cannot read snapshot {path}: {exc.strerror or exc}") from None
    except _PICKLE_FAILURES as exc:
        raise SnapshotError(
            f"{path}: not a readable pickle ({type(exc).__name__}: {exc})"
        ) from None


def _check_root(path: Path, obj: Any) -> dict[str, Any]:
    if not isinstance(obj, dict) or not isinstance(obj.get("segments"), list):
        kind = type(obj).__name__
        keys = f" with keys {sorted(map(str, obj))[:6]}" if isinstance(obj, dict) else ""
        raise SnapshotError(
            f"{path}: not a torch memory snapshot: the pickle holds a {kind}{keys}; expected the "
            "dict of torch.cuda.memory._snapshot() with 'segments' (and 'device_traces'), "
            "written by torch.cuda.memory._dump_snapshot(path)"
        )
    return obj


# -- the streaming reader ---------------------------------------------------------------------

# Opcode argument kinds: fixed byte counts 0-8, or one of these.
_LINE, _LEN1, _LEN4, _LEN8, _REFUSED = 0xF0, 0xF1, 0xF2, 0xF4, 0xFF

# The opcodes of pickle protocols 0-5 that build dicts, lists, tuples, str, int, float, bool, None.
_ALLOWED: dict[bytes, int] = {
    b"\x80": 1,  # PROTO
    b"\x95": 8,  # FRAME (a length hint; the framed bytes follow in line)
    b".": 0,  # STOP
    b"(": 0,  # MARK
    b"0": 0,  # POP
    b"1": 0,  # POP_MARK
    b"2": 0,  # DUP
    b"}": 0,  # EMPTY_DICT
    b"]": 0,  # EMPTY_LIST
    b")": 0,  # EMPTY_TUPLE
    b"d": 0,  # DICT
    b"l": 0,  # LIST
    b"t": 0,  # TUPLE
    b"\x85": 0,  # TUPLE1
    b"\x86": 0,  # TUPLE2
    b"\x87": 0,  # TUPLE3
    b"s": 0,  # SETITEM
    b"u": 0,  # SETITEMS
    b"a": 0,  # APPEND
    b"e": 0,  # APPENDS
    b"\x94": 0,  # MEMOIZE
    b"q": 1,  # BINPUT
    b"r": 4,  # LONG_BINPUT
    b"p": _LINE,  # PUT
    b"h": 1,  # BINGET
    b"j": 4,  # LONG_BINGET
    b"g": _LINE,  # GET
    b"K": 1,  # BININT1
    b"M": 2,  # BININT2
    b"J": 4,  # BININT
    b"\x8a": _LEN1,  # LONG1
    b"\x8b": _LEN4,  # LONG4
    b"I": _LINE,  # INT (also I00 / I01 for booleans)
    b"L": _LINE,  # LONG
    b"G": 8,  # BINFLOAT
    b"F": _LINE,  # FLOAT
    b"N": 0,  # NONE
    b"\x88": 0,  # NEWTRUE
    b"\x89": 0,  # NEWFALSE
    b"\x8c": _LEN1,  # SHORT_BINUNICODE
    b"X": _LEN4,  # BINUNICODE
    b"\x8d": _LEN8,  # BINUNICODE8
    b"V": _LINE,  # UNICODE
}
_ARG_KIND = bytearray([_REFUSED]) * 256
for _op, _kind in _ALLOWED.items():
    _ARG_KIND[_op[0]] = _kind

_OPCODE_NAMES = {op.code.encode("latin-1")[0]: op.name for op in __import__("pickletools").opcodes}

_CHUNK_BYTES = 1 << 20
#: The longest protocol-0 text argument (INT, FLOAT, UNICODE, PUT, GET) read; torch writes
#: protocol 2+ binary opcodes, so a real snapshot has none this long.
_MAX_LINE_BYTES = 16 << 20


class _Reader:
    """Buffered access to the pickle bytes: ``need(n)`` makes n bytes available at ``pos``."""

    __slots__ = ("f", "buf", "pos", "consumed", "size")

    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.buf = b""
        self.pos = 0
        self.consumed = 0  # bytes of the file before buf[0]
        self.size = _size(f)  # no argument can be longer than the file

    def fill(self, n: int) -> None:
        """Make up to n bytes available (fewer only at the end of the file)."""
        rest = self.buf[self.pos :]
        more = self.f.read(max(_CHUNK_BYTES, n - len(rest)))
        self.consumed += self.pos
        self.buf = rest + more
        self.pos = 0

    def need(self, n: int) -> None:
        if n < 0 or self.offset() + n > self.size:
            raise self._bad_length(n)
        if self.pos + n > len(self.buf):
            self.fill(n)
            if len(self.buf) < n:
                raise SnapshotError(
                    f"the pickle ends early, at byte {self.offset() + len(self.buf)}"
                )

    def skip(self, n: int) -> None:
        """Move past n bytes (a long string in pass 1) without reading them all into memory."""
        if n < 0 or self.offset() + n > self.size:
            raise self._bad_length(n)
        if self.pos + n <= len(self.buf):
            self.pos += n
            return
        beyond = n - (len(self.buf) - self.pos)
        self.f.seek(beyond, io.SEEK_CUR)
        self.consumed += len(self.buf) + beyond
        self.buf, self.pos = b"", 0

    def length(self, n: int) -> int:
        """A length field: never negative, never past the end of the file."""
        if n < 0 or self.offset() + n > self.size:
            raise self._bad_length(n)
        return n

    def _bad_length(self, n: int) -> SnapshotError:
        if n < 0:
            return SnapshotError(
                f"malformed pickle: a negative length ({n}) at byte {self.offset()}"
            )
        return SnapshotError(
            f"the pickle ends early: an argument of {n:,} bytes at byte {self.offset()} "
            f"and the file has {self.size:,}"
        )

    def line(self) -> bytes:
        """The text up to the next newline, at most ``_MAX_LINE_BYTES``; the buffer doubles
        while it looks (so a long line costs linear, not quadratic, time)."""
        searched = self.pos
        while True:
            end = self.buf.find(b"\n", searched)
            if end >= 0:
                out = self.buf[self.pos : end]
                self.pos = end + 1
                return out
            have = len(self.buf) - self.pos
            if have > _MAX_LINE_BYTES:
                raise SnapshotError(
                    f"malformed pickle: a text argument longer than {_MAX_LINE_BYTES:,} bytes "
                    f"at byte {self.offset()}"
                )
            searched, before = len(self.buf), self.pos
            self.need(min(2 * have + 1, self.size - self.offset()))
            searched += self.pos - before  # need() may move the unread bytes to the start
            if len(self.buf) - self.pos <= have:
                raise SnapshotError(f"the pickle ends early, at byte {self.offset() + have}")

    def offset(self) -> int:
        return self.consumed + self.pos


def _refuse(r: _Reader, op: int) -> SnapshotError:
    at = r.offset() - 1
    what = _OPCODE_NAMES.get(op, f"an unknown opcode ({op:#04x})")
    if op == ord("c"):  # GLOBAL names its target: say which
        try:
            module = r.line().decode("utf-8", "replace")
            what = f"GLOBAL {module}.{r.line().decode('utf-8', 'replace')}"
        except SnapshotError:
            pass
    return SnapshotError(f"refused to load: the pickle uses {what} at byte {at}; {_NOT_A_SNAPSHOT}")


def _scan(f: BinaryIO) -> set[int]:
    """Pass 1: check every opcode; return the memo slots that some GET reads."""
    r = _Reader(f)
    kinds = _ARG_KIND
    got: set[int] = set()
    unpack_i = struct.Struct("<i").unpack_from
    unpack_q = struct.Struct("<q").unpack_from
    while True:
        if r.pos + 9 > len(r.buf):  # the longest fixed argument plus the opcode
            r.fill(9)
            if r.pos >= len(r.buf):
                raise SnapshotError(f"the pickle ends early, at byte {r.offset()} (no STOP)")
        buf = r.buf
        op = buf[r.pos]
        r.pos += 1
        kind = kinds[op]
        if kind <= 8:
            if r.pos + kind > len(r.buf):
                r.need(kind)
            if op == 0x68:  # BINGET
                got.add(r.buf[r.pos])
            elif op == 0x6A:  # LONG_BINGET
                got.add(unpack_i(r.buf, r.pos)[0])
            elif op == 0x2E:  # STOP
                return got
            r.pos += kind
        elif kind == _LEN1:
            r.need(1)
            r.skip(1 + r.buf[r.pos])
        elif kind == _LEN4:
            r.need(4)
            r.skip(4 + r.length(unpack_i(r.buf, r.pos)[0]))
        elif kind == _LEN8:
            r.need(8)
            r.skip(8 + r.length(unpack_q(r.buf, r.pos)[0]))
        elif kind == _LINE:
            text = r.line()
            if op == 0x67:  # GET
                got.add(int(text))
        else:
            raise _refuse(r, op)


# Roles of the lists whose items go to a callback instead of into the list.
_SEGMENTS, _TRACES, _TRACE = 1, 2, 3

SegmentFn = Callable[[dict[str, Any]], None]
EventFn = Callable[[int, dict[str, Any]], None]


class _Builder:
    """Pass 2: the unpickler's stack machine for the allowed opcodes, with a sparse memo and the
    three streamed lists (``segments``, ``device_traces`` and each device's event list)."""

    def __init__(self, kept: set[int], on_segment: SegmentFn, on_event: EventFn) -> None:
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.kept = kept
        self.memo: dict[int, Any] = {}
        self.memo_len = 0
        self.roles: dict[int, tuple[int, int]] = {}  # id(list) -> (role, device)
        self.n_traces = 0
        self.on_segment = on_segment
        self.on_event = on_event

    def pop_mark(self) -> list[Any]:
        if not self.marks:
            raise SnapshotError("malformed pickle: an opcode needs a MARK and there is none")
        m = self.marks.pop()
        items = self.stack[m:]
        del self.stack[m:]
        return items

    def put(self, i: int) -> None:
        if i in self.kept:
            self.memo[i] = self.stack[-1]
        self.memo_len = max(self.memo_len, i + 1)

    def get(self, i: int) -> Any:
        try:
            return self.memo[i]
        except KeyError:
            raise SnapshotError(f"malformed pickle: memo slot {i} read before it is set") from None

    def new_list(self, items: list[Any]) -> list[Any]:
        lst: list[Any] = []
        stack, marks = self.stack, self.marks
        role = None
        if (
            len(stack) >= 2
            and type(stack[0]) is dict
            and stack[-1] in ("segments", "device_traces")
        ):
            # the value after the key "segments" / "device_traces" of the root dict
            at_root = (marks == [1] and len(stack) % 2 == 0) or (not marks and len(stack) == 2)
            if at_root:
                role = (_SEGMENTS, 0) if stack[-1] == "segments" else (_TRACES, 0)
        else:
            holder = stack[marks[-1] - 1] if marks and marks[-1] >= 1 else None
            roles = self.roles
            if (stack and roles.get(id(stack[-1]), (0,))[0] == _TRACES) or (
                holder is not None and roles.get(id(holder), (0,))[0] == _TRACES
            ):
                role = (_TRACE, self.n_traces)  # one list of events per device, in order
                self.n_traces += 1
        if role is not None:
            self.roles[id(lst)] = role
        self.add_items(lst, items)
        return lst

    def add_items(self, lst: list[Any], items: list[Any]) -> None:
        role = self.roles.get(id(lst))
        if role is None or role[0] == _TRACES:
            lst.extend(items)
        elif role[0] == _SEGMENTS:
            for seg in items:
                self.on_segment(seg)
        else:
            device = role[1]
            for ev in items:
                self.on_event(device, ev)


def _parse(f: BinaryIO, kept: set[int], on_segment: SegmentFn, on_event: EventFn) -> Any:
    """Pass 2: build the objects; stream segments and trace events to the callbacks."""
    r = _Reader(f)
    b = _Builder(kept, on_segment, on_event)
    stack, marks = b.stack, b.marks
    unpack_i = struct.Struct("<i").unpack_from
    unpack_h = struct.Struct("<H").unpack_from
    unpack_d = struct.Struct(">d").unpack_from
    unpack_q = struct.Struct("<q").unpack_from
    while True:
        if r.pos + 9 > len(r.buf):
            r.fill(9)
            if r.pos >= len(r.buf):
                raise SnapshotError(f"the pickle ends early, at byte {r.offset()} (no STOP)")
        buf = r.buf
        op = buf[r.pos]
        r.pos += 1
        if op == 0x68:  # BINGET
            stack.append(b.get(buf[r.pos]))
            r.pos += 1
        elif op == 0x4B:  # BININT1
            stack.append(buf[r.pos])
            r.pos += 1
        elif op == 0x94:  # MEMOIZE
            if b.memo_len in b.kept:
                b.memo[b.memo_len] = stack[-1]
            b.memo_len += 1
        elif op == 0x8A:  # LONG1
            n = buf[r.pos]
            r.need(1 + n)
            stack.append(int.from_bytes(r.buf[r.pos + 1 : r.pos + 1 + n], "little", signed=True))
            r.pos += 1 + n
        elif op == 0x4A:  # BININT
            stack.append(unpack_i(buf, r.pos)[0])
            r.pos += 4
        elif op == 0x4D:  # BININT2
            stack.append(unpack_h(buf, r.pos)[0])
            r.pos += 2
        elif op == 0x7D:  # EMPTY_DICT
            stack.append({})
        elif op == 0x28:  # MARK
            marks.append(len(stack))
        elif op == 0x75:  # SETITEMS
            items = b.pop_mark()
            d = stack[-1]
            for k in range(0, len(items) - 1, 2):
                d[items[k]] = items[k + 1]
        elif op == 0x8C or op == 0x58 or op == 0x8D:  # SHORT_BINUNICODE / BINUNICODE(8)
            if op == 0x8C:
                n, head = buf[r.pos], 1
            elif op == 0x58:
                n, head = r.length(unpack_i(buf, r.pos)[0]), 4
            else:
                n, head = r.length(unpack_q(buf, r.pos)[0]), 8
            r.need(head + n)
            start = r.pos + head
            stack.append(r.buf[start : start + n].decode("utf-8", "surrogatepass"))
            r.pos = start + n
        elif op == 0x5D:  # EMPTY_LIST
            stack.append(b.new_list([]))
        elif op == 0x65:  # APPENDS
            items = b.pop_mark()
            b.add_items(stack[-1], items)
        elif op == 0x61:  # APPEND
            item = stack.pop()
            b.add_items(stack[-1], [item])
        elif op == 0x6A:  # LONG_BINGET
            stack.append(b.get(unpack_i(buf, r.pos)[0]))
            r.pos += 4
        elif op == 0x71:  # BINPUT
            b.put(buf[r.pos])
            r.pos += 1
        elif op == 0x72:  # LONG_BINPUT
            b.put(unpack_i(buf, r.pos)[0])
            r.pos += 4
        elif op == 0x73:  # SETITEM
            v = stack.pop()
            k = stack.pop()
            stack[-1][k] = v
        elif op == 0x86:  # TUPLE2
            second = stack.pop()
            stack[-1] = (stack[-1], second)
        elif op == 0x85:  # TUPLE1
            stack[-1] = (stack[-1],)
        elif op == 0x87:  # TUPLE3
            third = stack.pop()
            second = stack.pop()
            stack[-1] = (stack[-1], second, third)
        elif op == 0x29:  # EMPTY_TUPLE
            stack.append(())
        elif op == 0x74:  # TUPLE
            stack.append(tuple(b.pop_mark()))
        elif op == 0x47:  # BINFLOAT
            stack.append(unpack_d(buf, r.pos)[0])
            r.pos += 8
        elif op == 0x4E:  # NONE
            stack.append(None)
        elif op == 0x88:  # NEWTRUE
            stack.append(True)
        elif op == 0x89:  # NEWFALSE
            stack.append(False)
        elif op == 0x95:  # FRAME
            r.pos += 8
        elif op == 0x80:  # PROTO
            r.pos += 1
        elif op == 0x2E:  # STOP
            if len(stack) != 1 or marks:
                raise SnapshotError("malformed pickle: STOP with a stack that is not one object")
            return stack[0]
        elif op == 0x8B:  # LONG4
            n = r.length(unpack_i(buf, r.pos)[0])
            r.need(4 + n)
            stack.append(int.from_bytes(r.buf[r.pos + 4 : r.pos + 4 + n], "little", signed=True))
            r.pos += 4 + n
        elif op == 0x64:  # DICT
            items = b.pop_mark()
            stack.append({items[k]: items[k + 1] for k in range(0, len(items) - 1, 2)})
        elif op == 0x6C:  # LIST
            stack.append(b.new_list(b.pop_mark()))
        elif op == 0x30:  # POP
            if marks and marks[-1] == len(stack):
                marks.pop()
            else:
                stack.pop()
        elif op == 0x31:  # POP_MARK
            b.pop_mark()
        elif op == 0x32:  # DUP
            stack.append(stack[-1])
        elif _ARG_KIND[op] == _LINE:
            _text_opcode(r, b, op)
        else:
            raise _refuse(r, op)


def _text_opcode(r: _Reader, b: _Builder, op: int) -> None:
    """The protocol-0 opcodes whose argument is a line of text."""
    text = r.line()
    if op == 0x70:  # PUT
        b.put(int(text))
    elif op == 0x67:  # GET
        b.stack.append(b.get(int(text)))
    elif op == 0x49:  # INT; I00 / I01 are False / True
        b.stack.append({b"00": False, b"01": True}[text] if text in (b"00", b"01") else int(text))
    elif op == 0x4C:  # LONG
        b.stack.append(int(text.rstrip(b"L")))
    elif op == 0x46:  # FLOAT
        b.stack.append(float(text))
    else:  # UNICODE
        b.stack.append(text.decode("raw-unicode-escape"))


def stream_snapshot(path: str | Path, on_segment: SegmentFn, on_event: EventFn) -> dict[str, Any]:
    """Read ``path`` in two passes, calling ``on_segment(segment)`` for each segment and
    ``on_event(device, event)`` for each trace event; return the rest of the root dict (the
    ``segments`` and per-device trace lists come back empty)."""
    path = Path(path)
    with _reading(path) as f:
        kept = _scan(f)
        f.seek(0)
        root = _parse(f, kept, on_segment, on_event)
    return _check_root(path, root)


def read_snapshot(
    path: str | Path, on_segment: SegmentFn, on_event: EventFn, *, stream: bool | None = None
) -> tuple[dict[str, Any], str]:
    """Feed a snapshot's segments and events to the callbacks; return (rest of root, reader).

    ``stream``: None picks by size (``STREAM_FROM_BYTES``), True / False force the reader.
    """
    path = Path(path)
    if stream is None:
        try:
            stream = path.stat().st_size >= STREAM_FROM_BYTES
        except OSError as exc:
            raise SnapshotError(f"cannot read snapshot {path}: {exc.strerror or exc}") from None
    if stream:
        return stream_snapshot(path, on_segment, on_event), "stream"
    root = load_snapshot(path)
    segments = root.pop("segments")
    for seg in segments:
        on_segment(seg)
    traces = root.get("device_traces") or []
    for device, events in enumerate(traces):
        for ev in events:
            on_event(device, ev)
    root["segments"] = []
    root["device_traces"] = [[] for _ in traces]
    return root, "whole"
