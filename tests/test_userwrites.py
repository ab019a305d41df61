"""The one writer of user-named files: atomic, the original kept, modes and links kept, special
and read-only files refused, several files all or nothing, every OSError one line (exit 2)."""

from __future__ import annotations

import errno
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import memfit
from memfit.cli import main
from memfit.userfiles import UserFileError
from memfit.userwrites import write_files, write_text

EXAMPLES = Path(__file__).parent / "jobfiles" / "examples"
SRC = str(Path(memfit.__file__).parents[1])


def test_the_file_is_replaced_with_its_mode_and_the_original_kept(tmp_path):
    f = tmp_path / "job.yml"
    f.write_text("a: 1\n")
    f.chmod(0o640)
    [w] = write_files([(f, "a: 2\n")], what="job file", backup=True, expected=["a: 1\n"])
    assert f.read_text() == "a: 2\n" and stat.S_IMODE(f.stat().st_mode) == 0o640
    assert w.backup == str(tmp_path / "job.yml.memfit-orig")
    assert Path(w.backup).read_text() == "a: 1\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yml", "job.yml.memfit-orig"]


def test_an_existing_backup_is_never_overwritten(tmp_path):
    f = tmp_path / "job.yml"
    f.write_text("v1\n")
    write_files([(f, "v2\n")], what="job file", backup=True)
    write_files([(f, "v3\n")], what="job file", backup=True)  # v2 goes to .memfit-orig.1
    write_files([(f, "v4\n")], what="job file", backup=True)
    assert (tmp_path / "job.yml.memfit-orig").read_text() == "v1\n"
    assert (tmp_path / "job.yml.memfit-orig.1").read_text() == "v2\n"
    assert (tmp_path / "job.yml.memfit-orig.2").read_text() == "v3\n"
    f.write_text("v1\n")  # the same bytes as the first backup: it is reused
    [w] = write_files([(f, "v5\n")], what="job file", backup=True)
    assert w.backup == str(tmp_path / "job.yml.memfit-orig")


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    target = tmp_path / "shared" / "base.yml"
    target.parent.mkdir()
    target.write_text("a: 1\n")
    link = tmp_path / "job.yml"
    link.symlink_to(target)
    [w] = write_files([(link, "a: 2\n")], what="job file", backup=True)
    assert link.is_symlink() and target.read_text() == "a: 2\n"
    assert w.path == str(target) and w.backup == str(target) + ".memfit-orig"


def test_a_new_file_gets_the_umask_mode_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "page.html", "<html/>", what="--html page")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "page.html").stat().st_mode) == 0o644


def test_a_fifo_is_refused_up_front_without_hanging(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    code = (
        "import sys\nfrom memfit.userwrites import write_text\nfrom memfit.errors import "
        "MemfitError\ntry:\n    write_text(sys.argv[1], 'x', what='--html page')\nexcept "
        "MemfitError as e:\n    print(e)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code, str(fifo)],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    assert "is a FIFO (named pipe): memfit writes only regular files" in run.stdout
    assert stat.S_ISFIFO(fifo.stat().st_mode)


@pytest.mark.parametrize("path", ["/dev/null", "/proc/self/comm", "/dev/stdout"])
def test_devices_and_kernel_files_are_refused(path):
    with pytest.raises(UserFileError, match="memfit writes only regular files"):
        write_text(path, "x", what="--html page")


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(UserFileError, match="is a directory: memfit writes only regular files"):
        write_text(tmp_path, "x", what="report")


def test_a_read_only_file_is_refused_and_left_alone(tmp_path):
    f = tmp_path / "job.yml"
    f.write_text("a: 1\n")
    f.chmod(0o444)
    with pytest.raises(UserFileError, match=r"is read-only \(mode 0444\): make it writable"):
        write_files([(f, "a: 2\n")], what="job file", backup=True)
    assert f.read_text() == "a: 1\n" and list(tmp_path.iterdir()) == [f]


def test_a_file_changed_since_memfit_read_it_is_not_overwritten(tmp_path):
    f = tmp_path / "job.yml"
    f.write_text("a: 1  # edited meanwhile\n")
    with pytest.raises(UserFileError, match="changed since memfit read it"):
        write_files([(f, "a: 2\n")], what="job file", backup=True, expected=["a: 1\n"])
    assert f.read_text() == "a: 1  # edited meanwhile\n"


def test_a_missing_folder_is_one_line_naming_what_to_do(tmp_path):
    with pytest.raises(UserFileError, match=r"No such file or directory — the folder does not"):
        write_text(tmp_path / "nope" / "page.html", "x", what="--html page")


def test_two_files_are_all_or_nothing_when_the_second_rename_fails(tmp_path, monkeypatch):
    a, b = tmp_path / "a.yml", tmp_path / "b.json"
    a.write_text("a: 1\n")
    b.write_text('{"b": 1}\n')
    real = os.replace
    calls = []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(UserFileError, match=r"cannot write job file .*b.json.*nothing was changed"):
        write_files([(a, "a: 2\n"), (b, '{"b": 2}\n')], what="job file", backup=True)
    monkeypatch.undo()
    assert a.read_text() == "a: 1\n" and b.read_text() == '{"b": 1}\n'  # a was put back
    assert not [p for p in tmp_path.iterdir() if ".memfit-tmp." in p.name]


@pytest.mark.parametrize(
    ("err", "hint"),
    [
        (errno.ENOSPC, "the disk is full"),
        (errno.EROFS, "the file system is read-only"),
        (errno.EACCES, "no permission to write the folder"),
        (errno.EFBIG, r"the file-size limit \(ulimit -f\)"),
    ],
)
def test_os_errors_become_one_line_with_the_next_step(tmp_path, monkeypatch, err, hint):
    f = tmp_path / "job.yml"
    f.write_text("a: 1\n")

    def fail(*args, **kwargs):
        raise OSError(err, os.strerror(err))

    monkeypatch.setattr(os, "write", fail)
    with pytest.raises(UserFileError, match=f"{os.strerror(err)} — {hint}.*nothing was changed"):
        write_files([(f, "a: 2\n")], what="job file", backup=True)
    monkeypatch.undo()
    assert f.read_text() == "a: 1\n" and list(tmp_path.iterdir()) == [f]


def test_a_utf8_bom_is_kept(tmp_path):
    f = tmp_path / "job.yml"
    f.write_bytes(b"\xef\xbb\xbfa: 1\n")
    write_files([(f, "a: 2\n")], what="job file", backup=True, expected=["a: 1\n"])
    assert f.read_bytes() == b"\xef\xbb\xbfa: 2\n"


# --- through the CLI --------------------------------------------------------------------------


def test_check_write_on_a_read_only_file_is_exit_2_one_line(tmp_path, capsys):
    f = tmp_path / "axolotl.yml"
    shutil.copy(EXAMPLES / "axolotl-llama3-qlora.yml", f)
    f.chmod(0o444)
    before = f.read_bytes()
    assert main(["check", str(f), "--gpu", "RTX-4090", "--write"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is read-only (mode 0444)" in err[0] and "Traceback" not in err[0]
    assert f.read_bytes() == before


def test_check_write_refuses_an_unsafe_yaml_edit_and_writes_nothing(tmp_path, capsys):
    f = tmp_path / "axolotl.yml"
    text = (EXAMPLES / "axolotl-llama3-qlora.yml").read_text()
    text = text.replace("micro_batch_size: 2", "micro_batch_size: &mb 2\neval_batch_size: *mb")
    f.write_text(text)
    assert main(["check", str(f), "--gpu", "RTX-4090"]) == 1  # the refusal is shown with the fix
    out = capsys.readouterr().out
    assert "memfit cannot edit" in out and "apply with --write" not in out
    assert "not written: edit the keys above by hand" in out
    assert main(["check", str(f), "--gpu", "RTX-4090", "--write"]) == 2
    err = capsys.readouterr().err
    assert "micro_batch_size carries the anchor &mb" in err and "by hand" in err
    assert "no file was written" in err
    assert f.read_text() == text and list(tmp_path.iterdir()) == [f]


def test_html_to_a_fifo_is_exit_2_not_a_hang(tmp_path):
    fifo = tmp_path / "page.html"
    os.mkfifo(fifo)
    run = subprocess.run(
        [sys.executable, "-m", "memfit", "estimate", "gpt2", "--html", str(fifo)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, PYTHONPATH=SRC),
    )
    assert run.returncode == 2 and "is a FIFO" in run.stderr and "Traceback" not in run.stderr
