"""Every read of a user-named file goes through memfit.userfiles (the bounded reader).

The scan walks src/memfit's syntax trees for the calls that read a file — the builtin ``open``,
``os.open``, ``io.open``, ``<path>.open()``, ``.read_text()``, ``.read_bytes()``, ``json.load``,
``pickle.load``, ``yaml.load`` / ``yaml.safe_load`` — and fails on any that is not in the allow-list
below, each entry with its reason (writers, memfit's own package data, /proc). A new reader of a
user file must use ``memfit.userfiles`` instead (regular files only, size cap, time bound).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "memfit"

#: "path/under/memfit.py::function::call" -> why this read or open is not of a user file.
ALLOWED = {
    "userfiles.py::open_regular::os.open": "the bounded reader itself",
    "estimate/derived/workers.py::ticks::open": "the kernel's /proc/stat (idle CPU ticks), "
    "not a user file",
    "userfiles.py::open_regular::os.fdopen": "the bounded reader itself",
    "userfiles.py::iter_lines::os.fdopen": "the bounded reader itself (buffered lines)",
    "models/bundled.py::_index::read_text": "package data: memfit's own configs/index.json",
    "estimate/diffusion/derived.py::shipped::open": (
        "package data: memfit's own shipped pipeline forms (estimate/diffusion/forms/*.json.gz)"
    ),
    "estimate/diffusion/derived.py::shipped::json.load": (
        "parses memfit's own shipped pipeline forms (package data, gzip), not a user file"
    ),
    "models/config_json.py::builtin_model_types::read_text": (
        "transformers' installed source files (auto mappings), not a user file"
    ),
    "models/hub.py::_write_atomically::os.fdopen": "writes memfit's hub cache",
    "estimate/trace/frameworks/litgpt.py::model_config::yaml.safe_load": (
        "parses the text memfit.userfiles.read_text read (bounded), safe_load only"
    ),
    "bench/models.py::*::json.loads": "package data: the packaged bench model archive",
    "snapshot/generate.py::*::open": "writes a snapshot memfit generates",
    "estimate/allocator/jit.py::_mark_ready::open": (
        "writes the 'compiled' marker in memfit's private numba folder (not a user file)"
    ),
    "estimate/allocator/jit.py::warm_in_background::open": (
        "writes the background compile's lock in memfit's private numba folder (not a user file)"
    ),
    "monitor/log.py::*::open": "the run-log writer (the `monitor` lane)",
    "monitor/device.py::*::open": "/proc/<pid>/statm and /proc/<pid>/stat of this machine",
    "userwrites.py::_write_temp::os.open": (
        "the one writer of user-named files: creates its temp file (O_CREAT | O_EXCL, write-only)"
    ),
    "userwrites.py::_fsync_dir::os.open": "the writer opens the folder to fsync its rename",
    "cli/entry.py::_drop_stdout::os.open": (
        "opens os.devnull to replace a stdout whose flush failed (/dev/full): not a user file"
    ),
    "jobfiles/files.py::parse_text::yaml.safe_load": (
        "parses text userfiles.read_text read (parse), or memfit's edit of it, safe_load only"
    ),
    "jobfiles/edit_check.py::_load::yaml.safe_load": (
        "parses memfit's own edit of text userfiles.read_text read, to check it"
    ),
    "jobfiles/yaml_edit.py::yaml_scalar::yaml.safe_load": (
        "a value memfit writes, parsed to quote it where YAML would misread it"
    ),
    "estimate/derived/entry.py::write_entry::os.fdopen": "writes memfit's caches (atomic)",
    "estimate/derived/workers.py::_serve::open": "a trace worker's stdout to os.devnull (writes)",
    "hardware/prices.py::bundled_prices::read_text": "package data: memfit's own prices.json",
    "hardware/prices.py::read_price_file::yaml.safe_load": "parses text read by userfiles",
    "jobfiles/files.py::parse::yaml.safe_load": "parses text read by userfiles.read_text",
    "jobfiles/torchtune.py::apply_overrides::yaml.safe_load": "a key=value string from argv",
    "models/pipelines/__init__.py::_index::read_text": "package data: the pipelines' index.json",
    "monitor/log.py::_open_fd::os.open": "the run-log writer opens its own log (O_APPEND)",
    "monitor/log.py::_read_bytes::read_bytes": (
        "the old run-log reader: the `monitor` lane moves it onto userfiles.iter_lines"
    ),
}

READ_ATTRS = {"read_text", "read_bytes"}
LOADS = {("json", "load"), ("pickle", "load"), ("yaml", "load"), ("yaml", "safe_load")}


def _call_name(node: ast.Call) -> str | None:
    f = node.func
    if isinstance(f, ast.Name) and f.id == "open":
        return "open"
    if isinstance(f, ast.Attribute):
        base = f.value.id if isinstance(f.value, ast.Name) else None
        if f.attr in READ_ATTRS:
            return f.attr
        if (base, f.attr) in LOADS or (base in ("os", "io") and f.attr in ("open", "fdopen")):
            return f"{base}.{f.attr}"
        if f.attr == "open" and base not in ("Nvml", "cls", "webbrowser"):
            return "open"  # Path.open / path.open
    return None


class _Finder(ast.NodeVisitor):
    def __init__(self, rel: str) -> None:
        self.rel, self.where, self.found = rel, ["<module>"], []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.where.append(node.name)
        self.generic_visit(node)
        self.where.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Call(self, node: ast.Call) -> None:
        if call := _call_name(node):
            self.found.append((self.rel, self.where[-1], call, node.lineno))
        self.generic_visit(node)


def _readers() -> list[tuple[str, str, str, int]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        finder = _Finder(path.relative_to(SRC).as_posix())
        finder.visit(ast.parse(path.read_text(encoding="utf-8")))
        found += finder.found
    return found


def _allowed(rel: str, fn: str, call: str) -> bool:
    return f"{rel}::{fn}::{call}" in ALLOWED or f"{rel}::*::{call}" in ALLOWED


def test_no_file_is_read_outside_the_bounded_reader_or_the_allow_list() -> None:
    offenders = sorted(
        {
            f"{rel}:{line} {fn}() calls {call}"
            for rel, fn, call, line in _readers()
            if not _allowed(rel, fn, call)
        }
    )
    assert not offenders, (
        "read user files with memfit.userfiles (or add an ALLOWED entry with its reason):\n"
        + "\n".join(offenders)
    )


def test_the_scan_sees_the_calls_it_looks_for() -> None:
    # The scan itself must find the allow-listed reads (else it could pass by finding nothing).
    keys = {f"{rel}::{fn}::{call}" for rel, fn, call, _ in _readers()}
    assert "userfiles.py::open_regular::os.open" in keys
    assert "models/bundled.py::_index::read_text" in keys


def test_every_allow_list_entry_names_a_file_that_exists() -> None:
    assert [k for k in ALLOWED if not (SRC / k.split("::")[0]).is_file()] == []


def test_a_kernel_pseudo_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """issue 33: /proc/kmsg is a "regular" file that blocks until the kernel logs; a config or a
    job file's base_model naming it hung every reader. Refused up front, a link to it too."""
    import pytest

    from memfit.userfiles import UserFileError, read_text

    link = tmp_path / "config.json"
    link.symlink_to("/proc/kmsg")
    for path in ("/proc/kmsg", link, "/sys/kernel/notes"):
        with pytest.raises(UserFileError, match="kernel pseudo-file"):
            read_text(path, what="config")
    assert "MemTotal" in read_text("/proc/meminfo", what="meminfo", kernel_file=True)
