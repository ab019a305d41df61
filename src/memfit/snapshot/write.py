"""Write a snapshot pickle as a stream, opcode for opcode what ``pickle.dump`` (protocol 4, the C
pickler) writes for the same dict, except that the FRAME opcodes (a reading hint) are left out.

Used to make snapshots of hundreds of MB for tests and benchmarks without holding them in memory:
events come from iterators and are forgotten once written; only objects that later events share
(frames, keys, file names) stay in the memo, as in torch's own snapshots.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Any, BinaryIO

_BATCH = 1000  # the C pickler's BATCHSIZE for APPENDS / SETITEMS


class Stream:
    """A list written from an iterator (its items are not kept in the memo)."""

    def __init__(self, items: Iterable[Any]) -> None:
        self.items = items


class PickleStreamWriter:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.memo: dict[int, int] = {}
        self._held: list[Any] = []  # keep memoized objects alive so their ids stay unique
        self.n_memo = 0

    def dump(self, obj: Any) -> None:
        self.f.write(b"\x80\x04")
        self.save(obj)
        self.f.write(b".")

    def _memoize(self, obj: Any, keep: bool) -> None:
        self.f.write(b"\x94")
        if keep:
            self.memo[id(obj)] = self.n_memo
            self._held.append(obj)
        self.n_memo += 1

    def save(self, obj: Any, keep: bool = True) -> None:
        w = self.f.write
        t = type(obj)
        if t is int:
            if 0 <= obj < 256:
                w(b"K" + bytes((obj,)))
            elif 0 <= obj < 65536:
                w(b"M" + struct.pack("<H", obj))
            elif -(2**31) <= obj < 2**31:
                w(b"J" + struct.pack("<i", obj))
            else:
                # encode_long in Modules/_pickle.c: bit length // 8 + 1 bytes, two's complement
                data = obj.to_bytes((obj.bit_length() >> 3) + 1, "little", signed=True)
                w(b"\x8a" + bytes((len(data),)) + data)
            return
        if obj is None:
            w(b"N")
            return
        if t is bool:
            w(b"\x88" if obj else b"\x89")
            return
        if t is float:
            w(b"G" + struct.pack(">d", obj))
            return
        idx = self.memo.get(id(obj))
        if idx is not None:
            w(b"h" + bytes((idx,)) if idx < 256 else b"j" + struct.pack("<I", idx))
            return
        if t is str:
            data = obj.encode("utf-8", "surrogatepass")
            if len(data) < 256:
                w(b"\x8c" + bytes((len(data),)) + data)
            else:
                w(b"X" + struct.pack("<I", len(data)) + data)
            self._memoize(obj, keep)
        elif t is dict:
            w(b"}")
            self._memoize(obj, keep)
            self._batches([x for kv in obj.items() for x in kv], pairs=True)
        elif t is list:
            w(b"]")
            self._memoize(obj, keep)
            self._batches(obj, pairs=False)
        elif t is Stream:
            w(b"]")
            self._memoize(obj, keep=False)
            self._batches(obj.items, pairs=False, keep_items=False)
        elif t is tuple and len(obj) <= 3:
            if not obj:
                w(b")")
                return
            for x in obj:
                self.save(x, keep)
            w(b"\x84\x85\x86\x87"[len(obj) : len(obj) + 1])
            self._memoize(obj, keep)
        else:
            raise TypeError(f"a snapshot holds no {t.__name__}")

    def _batches(self, items: Iterable[Any], *, pairs: bool, keep_items: bool = True) -> None:
        """``batch_list_exact`` / ``batch_dict_exact`` of Modules/_pickle.c: one item alone gets
        APPEND / SETITEM, otherwise MARK … APPENDS / SETITEMS per 1000."""
        step = 2 if pairs else 1
        one, many = (b"s", b"u") if pairs else (b"a", b"e")
        it: Iterator[Any] = iter(items)
        first = [x for _, x in zip(range(2 * step), it, strict=False)]
        if not first:
            return
        if len(first) == step:
            for x in first:
                self.save(x, keep_items)
            self.f.write(one)
            return
        pending = first
        while pending:
            self.f.write(b"(")
            n = 0
            for x in pending:
                self.save(x, keep_items)
                n += 1
            for x in it:
                self.save(x, keep_items)
                n += 1
                if n == _BATCH * step:
                    break
            self.f.write(many)
            pending = [x for _, x in zip(range(1), it, strict=False)] if n == _BATCH * step else []
