"""Generated hostile inputs by class (issue 33): malformed snapshots, run logs with junk
estimates and records, output paths that are not regular files or name another format.

Each generator is deterministic (seeded) and returns every case of its class; the tests take a
fixed subset by default (:func:`subset`) and all of them under ``-m slow``;
``benchmarks/fuzz_summary.py`` runs them all and counts handled / failed per class.

A case is *handled* when the command ends with exit 0, 1 or 2, never raises (the fuzz suite sets
``MEMFIT_DEBUG=1``, so main's last resort re-raises instead of hiding a bug), prints exactly one
``memfit: error:`` line for 2, and takes less than :data:`CASE_TIME_LIMIT_S`.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import pickle
import random
import socket
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memfit.userwrites import FORMAT_OF_SUFFIX

#: Each in-process case must end within this (the largest file here is a few KB; the slowest
#: clean case measured on the 2-core box was ~0.3 s).
CASE_TIME_LIMIT_S = 10.0
#: The default run takes every N-th case of a class; ``-m slow`` takes all.
FAST_STRIDE = 25

#: Values a broken or altered file holds where a number, list or dict belongs.
JUNK: list[Any] = [
    None,
    True,
    "x",
    "1e9",
    -1,
    2**70,
    10**400,
    1e308,
    float("nan"),
    float("inf"),
    [1, [2, [3]]],
    {"a": {"b": [None]}},
    (1, 2),
    b"by",
    3.5,
    [],
]


@dataclass(frozen=True)
class Case:
    """One generated input: ``argv`` for ``memfit.cli.main`` after writing ``files``."""

    name: str
    argv: list[str]
    files: dict[str, bytes]
    expect_rc: tuple[int, ...] = (0, 1, 2)
    #: For exit 2: text the error must hold (``{dir}`` replaced), so that a refusal for another
    #: reason (the fuzz suite's stub of a real run) does not count as this one.
    expect_err: str = ""


def subset(cases: list[Case], slow: bool) -> list[Case]:
    return cases if slow else cases[::FAST_STRIDE]


# -- snapshots ---------------------------------------------------------------------------------
FRAME = {"filename": "train.py", "line": 12, "name": "forward"}
BASE_SNAPSHOT: dict[str, Any] = {
    "segments": [
        {
            "device": 0,
            "address": 0,
            "total_size": 2048,
            "allocated_size": 512,
            "active_size": 512,
            "requested_size": 512,
            "stream": 0,
            "segment_type": "large",
            "blocks": [
                {
                    "address": 0,
                    "size": 512,
                    "requested_size": 500,
                    "state": "active_allocated",
                    "frames": [FRAME],
                },
                {"address": 512, "size": 1536, "state": "inactive", "history": [{"real_size": 1}]},
            ],
        }
    ],
    "device_traces": [
        [
            {
                "action": "alloc",
                "addr": 0,
                "size": 512,
                "stream": 0,
                "frames": [FRAME],
                "time_us": 1,
            },
            {"action": "oom", "size": 4096, "device_free": 0, "frames": [FRAME], "time_us": 2},
        ]
    ],
    "allocator_settings": {"garbage_collection_threshold": 0.0},
}


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _paths(v, (*prefix, i))


def _replaced(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    out = copy.deepcopy(obj)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


def snapshot_structure_cases() -> list[Case]:
    """Every place in a snapshot (root, lists, records, fields) replaced by every junk value,
    read whole and as a stream (``--json`` for the stream: the JSON writer sees every value)."""
    cases = []
    for path in _paths(BASE_SNAPSHOT):
        for i, value in enumerate(JUNK):
            data = pickle.dumps(_replaced(BASE_SNAPSHOT, path, value), protocol=4)
            where = "/".join(map(str, path)) or "root"
            for extra in ([], ["--json"], ["--top", "1"]):
                cases.append(
                    Case(
                        f"{where}={i}{''.join(extra)}",
                        ["snapshot", "{dir}/s.pickle", *extra],
                        {"s.pickle": data},
                        expect_rc=(0, 2),
                    )
                )
    return cases


def snapshot_byte_cases() -> list[Case]:
    """The pickle cut at every length, and 300 seeded single-byte changes."""
    data = pickle.dumps(BASE_SNAPSHOT, protocol=4)
    cases = [
        Case(f"cut-{n}", ["snapshot", "{dir}/s.pickle"], {"s.pickle": data[:n]}, expect_rc=(2,))
        for n in range(len(data))  # the whole file is valid; every prefix is refused
    ]
    rng = random.Random(33)
    for k in range(300):
        at, byte = rng.randrange(len(data)), rng.randrange(256)
        flipped = data[:at] + bytes([byte]) + data[at + 1 :]
        cases.append(Case(f"flip-{k}", ["snapshot", "{dir}/s.pickle"], {"s.pickle": flipped}))
    for proto in (0, 2, 5):  # other protocols, junk roots
        for root in ([], "segments", {"segments": "x"}, {"device_traces": []}, 7):
            cases.append(
                Case(
                    f"root-{proto}-{root!r}",
                    ["snapshot", "{dir}/s.pickle"],
                    {"s.pickle": pickle.dumps(root, protocol=proto)},
                    expect_rc=(2,),
                )
            )
    return cases


# -- run logs ----------------------------------------------------------------------------------
GiB = 1024**3
T0 = 1_760_000_000.0
ESTIMATE = {
    "peak_allocated_bytes": 5 * GiB,
    "peak_reserved_bytes": 6 * GiB,
    "device_used_bytes": 7 * GiB,
    "engine": "analytic",
    "breakdown": {"weights_bytes": GiB},
}


def _start(estimate: Any) -> dict[str, Any]:
    return {
        "type": "start",
        "time": T0,
        "memfit_version": "0.1.0",
        "device": "cuda:0",
        "device_name": "NVIDIA L4",
        "device_total_bytes": 24 * GiB,
        "pid": 1,
        "argv": ["train.py"],
        "estimate": estimate,
    }


def _step(i: int) -> dict[str, Any]:
    return {
        "type": "step",
        "time": T0 + i,
        "step": i,
        "step_time_s": 0.5,
        "tokens": 1024,
        "samples": 8,
        "tokens_per_s": 2048.0,
        "samples_per_s": 16.0,
        "allocated_bytes": (1 + i % 3) * GiB,
        "peak_allocated_bytes": (2 + i % 3) * GiB,
        "reserved_bytes": 4 * GiB,
        "peak_reserved_bytes": 5 * GiB,
        "device_used_bytes": 6 * GiB,
        "utilization_pct": 97.0,
        "rss_bytes": GiB,
    }


def _dumps(value: Any) -> str:
    """JSON as a careless or hostile writer makes it: NaN / Infinity literals, huge integers,
    bytes and tuples as what a naive writer would put there."""

    def plain(v: Any) -> Any:
        if isinstance(v, bytes):
            return v.decode("latin-1")
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return v

    return json.dumps(plain(value))  # allow_nan: NaN and Infinity as literals


def _log(records: list[dict[str, Any]]) -> bytes:
    return ("\n".join(_dumps(r) for r in records) + "\n").encode()


def runlog_estimate_cases() -> list[Case]:
    """The estimate (in the start record, and as ``--estimate FILE``) with each receipt field,
    and the whole estimate, replaced by every junk value."""
    cases = []
    out = ["-o", "{dir}/out.html"]
    steps = [_step(i) for i in range(6)]
    for key in [*ESTIMATE, None]:
        for i, value in enumerate(JUNK):
            est = value if key is None else {**ESTIMATE, key: value}
            in_log = _log([_start(est), *steps])
            cases.append(
                Case(
                    f"start.estimate.{key}={i}",
                    ["report", "{dir}/run.jsonl", *out],
                    {"run.jsonl": in_log},
                    expect_rc=(0, 2),
                )
            )
            files = {"run.jsonl": _log([_start(None), *steps]), "est.json": _dumps(est).encode()}
            argv = ["report", "{dir}/run.jsonl", *out, "--estimate", "{dir}/est.json"]
            cases.append(Case(f"--estimate.{key}={i}", argv, files, expect_rc=(0, 2)))
    return cases


def runlog_record_cases() -> list[Case]:
    """Every field of a step record replaced by every junk value; lines cut short; records of
    the wrong type; the start record missing."""
    cases = []
    argv = ["report", "{dir}/run.jsonl", "-o", "{dir}/out.html"]
    for key in _step(0):
        for i, value in enumerate(JUNK):
            steps = [_step(n) for n in range(6)]
            steps[3] = {**steps[3], key: value}
            data = _log([_start(ESTIMATE), *steps])
            cases.append(Case(f"step.{key}={i}", argv, {"run.jsonl": data}, expect_rc=(0, 2)))
    whole = _log([_start(ESTIMATE), *[_step(n) for n in range(4)]])
    for n in range(0, len(whole), 7):
        cases.append(Case(f"cut-{n}", argv, {"run.jsonl": whole[:n]}, expect_rc=(0, 2)))
    for i, value in enumerate(JUNK):
        lines = whole + _dumps(value).encode() + b"\n"
        cases.append(Case(f"record={i}", argv, {"run.jsonl": lines}, expect_rc=(0, 2)))
    return cases


# -- output paths ------------------------------------------------------------------------------
#: (command, flag, the format it writes); each gets every special path and every wrong suffix.
OUTPUT_FLAGS = [
    (["estimate", "gpt2", "--engine", "analytic"], "--html", ".html"),
    (["plan", "gpt2", "--gpu", "L4", "--engine", "analytic"], "--html", ".html"),
    (["estimate", "gpt2", "--engine", "trace"], "--snapshot", ".pickle"),
    (["report", "{dir}/run.jsonl"], "-o", ".html"),
    (["report", "{dir}/run.jsonl"], "--png", ".png"),
    (["bench", "tiny-opt", "--device", "cpu"], "--output", ".json"),
    (["bench", "tiny-opt", "--device", "cpu"], "--png", ".png"),
    (["bench", "tiny-opt", "--device", "cpu"], "--md", ".md"),
]
SPECIAL_PATHS = ["{dir}/fifo", "{dir}/sock", "/dev/null", "/dev/zero", "/dev/full", "{dir}"]
SPECIAL_PATHS += ["/proc/self/status", "{dir}/link-to-fifo", "{dir}/link-to-null"]
SUFFIXES = [".html", ".htm", ".png", ".json", ".jsonl", ".md", ".pickle", ".svg", ".yaml"]


def make_special_files(root: Path) -> None:
    """A FIFO, a listening Unix socket's path and links to them, in ``root``."""
    with contextlib.suppress(FileExistsError):
        os.mkfifo(root / "fifo")
    if not (root / "sock").exists():
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(root / "sock"))
        s.close()  # the socket file stays: a path that is a socket
    for name, target in (("link-to-fifo", root / "fifo"), ("link-to-null", Path("/dev/null"))):
        with contextlib.suppress(FileExistsError):
            (root / name).symlink_to(target)


def output_path_cases() -> list[Case]:
    """Each output flag given a FIFO, a socket, devices, a folder, a kernel file, links to
    them, and a file whose suffix names another format: all refused up front, exit 2."""
    run_log = _log([_start(ESTIMATE), *[_step(i) for i in range(4)]])
    cases = []
    for command, flag, suffix in OUTPUT_FLAGS:
        targets = list(SPECIAL_PATHS)
        fmt = FORMAT_OF_SUFFIX[suffix]
        targets += ["{dir}/out" + s for s in SUFFIXES if FORMAT_OF_SUFFIX[s] != fmt]
        for target in targets:
            cases.append(
                Case(
                    f"{command[0]} {flag} {target.replace('{dir}', '.')}",
                    [*command, flag, target],
                    {"run.jsonl": run_log},
                    expect_rc=(2,),
                    expect_err=repr(target),  # the message quotes the path as given
                )
            )
    return cases


CLASSES = {
    "snapshot: a field, record or list of the wrong type or value": snapshot_structure_cases,
    "snapshot: cut short, a byte changed, another root": snapshot_byte_cases,
    "run log: the estimate (start record or --estimate) junk": runlog_estimate_cases,
    "run log: step fields junk, lines cut, junk records": runlog_record_cases,
    "output path: FIFO, socket, device, folder, wrong suffix": output_path_cases,
}


# -- running one case --------------------------------------------------------------------------
@dataclass(frozen=True)
class Outcome:
    rc: int | str  # "raised" when main raised
    stderr: str
    seconds: float

    def problem(self, case: Case, root: Path | None = None) -> str | None:
        """Why the case is not handled, or None (``root``: what ``{dir}`` stands for)."""
        if self.rc == "raised":
            return f"raised: {self.stderr[-300:]}"
        if self.rc not in case.expect_rc:
            return f"exit {self.rc}, expected {case.expect_rc}: {self.stderr[-300:]}"
        if "Traceback" in self.stderr or "internal error" in self.stderr:
            return f"traceback: {self.stderr[-300:]}"
        if self.rc == 2 and self.stderr.count("memfit: error:") != 1:
            return f"not one error line: {self.stderr[-300:]}"
        wanted = case.expect_err.replace("{dir}", str(root))
        if self.rc == 2 and wanted and wanted not in self.stderr:
            return f"refused for another reason (no {wanted}): {self.stderr[-300:]}"
        if self.seconds > CASE_TIME_LIMIT_S:
            return f"took {self.seconds:.1f} s (limit {CASE_TIME_LIMIT_S} s)"
        return None


def run_case(case: Case, root: Path) -> Outcome:
    """Write the case's files under ``root``, run ``memfit.cli.main`` in-process."""
    from memfit.cli import main

    for name, data in case.files.items():
        (root / name).write_bytes(data)
    argv = [a.replace("{dir}", str(root)) for a in case.argv]
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc: int | str = main(argv)
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 2
    except BaseException:  # noqa: BLE001 — the fuzz counts what a user would see as a traceback
        return Outcome("raised", traceback.format_exc(), time.perf_counter() - t0)
    return Outcome(rc, err.getvalue(), time.perf_counter() - t0)
