"""numba's cache is pickle: the kernel's machine code is read only from a folder memfit made
private (issue 33), and not at all with the disk caches off."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from memfit.estimate import allocator
from memfit.estimate.allocator import jit, kernel_cache
from memfit.estimate.derived import cache

ROOT = os.geteuid() == 0


@pytest.fixture
def private(tmp_path: Path) -> Path:
    folder = tmp_path / "numba-kernel"
    assert kernel_cache.problem(folder) is None
    return folder


def test_a_new_folder_is_created_private_and_accepted(private: Path) -> None:
    assert private.is_dir() and private.stat().st_mode & 0o777 == 0o700
    (private / "sub").mkdir()
    (private / "sub" / "kernel.nbi").write_bytes(b"x")
    assert kernel_cache.problem(private) is None


def test_a_folder_others_can_use_is_refused(private: Path) -> None:
    private.chmod(0o777)
    assert kernel_cache.problem(private) == ("has mode 777: only its owner may have access (700)")
    private.chmod(0o750)
    assert "has mode 750" in str(kernel_cache.problem(private))


def test_a_link_where_the_folder_should_be_is_refused(tmp_path: Path, private: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(private)
    assert kernel_cache.problem(link) == "is not a folder (a link or a file)"


def test_a_link_or_a_fifo_inside_is_refused(private: Path) -> None:
    (private / "index.nbi").symlink_to("/etc/passwd")
    assert "holds 'index.nbi', which is not a plain file" in str(kernel_cache.problem(private))
    (private / "index.nbi").unlink()
    os.mkfifo(private / "index.nbi")
    assert "holds 'index.nbi', which is not a plain file" in str(kernel_cache.problem(private))


def test_a_parent_others_can_write_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # not sticky: another user could rename the folder and plant their own
    assert f"has a parent {shared} that others can write (mode 777)" == (
        kernel_cache.problem(shared / "numba-kernel")
    )
    shared.chmod(0o1777)  # sticky, as /tmp: only the owner may rename it
    assert kernel_cache.problem(shared / "numba-kernel") is None


@pytest.mark.skipif(not ROOT, reason="needs root to give a file to another user")
def test_a_folder_or_a_file_of_another_user_is_refused(tmp_path: Path, private: Path) -> None:
    (private / "index.nbi").write_bytes(b"planted")
    os.chown(private / "index.nbi", 12345, 12345)
    assert "holds 'index.nbi', which belongs to user 12345" in str(kernel_cache.problem(private))
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 12345, 12345)
    assert kernel_cache.problem(theirs) == "belongs to user 12345, not to this user (0)"


@pytest.fixture
def fresh_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if it had not loaded the kernel (the module is imported again)."""
    monkeypatch.setattr(jit, "_KERNEL", [])
    monkeypatch.setattr(jit, "_WHY", [""])
    monkeypatch.delenv(jit.NO_JIT_ENV, raising=False)
    monkeypatch.delitem(sys.modules, "memfit.estimate.allocator.kernel", raising=False)
    monkeypatch.delattr(allocator, "kernel", raising=False)


def test_with_no_private_folder_numba_reads_nothing_and_python_replays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_kernel: None
) -> None:
    pytest.importorskip("numba")
    bad = tmp_path / "numba-kernel"
    bad.mkdir(mode=0o777)
    bad.chmod(0o777)
    (bad / "kernel.replay_default-1.py311.nbi").write_bytes(b"planted pickle")
    monkeypatch.setattr(kernel_cache, "candidates", lambda: [bad])
    import numba

    before = numba.config.CACHE_DIR
    assert jit.load_kernel() is None
    assert jit.describe() == (
        f"python (no private folder for numba's machine code: {bad} has mode 777: only its "
        "owner may have access (700))"
    )
    assert before == numba.config.CACHE_DIR
    assert "memfit.estimate.allocator.kernel" not in sys.modules


def test_no_cache_reads_no_machine_code_from_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_kernel: None
) -> None:
    folder = tmp_path / "numba-kernel"
    monkeypatch.setattr(kernel_cache, "candidates", lambda: [folder])
    with cache.disabled():
        assert jit.load_kernel() is None
        assert jit.describe() == "python (--no-cache: numba's machine code on disk is not read)"
    assert not folder.exists() and jit._KERNEL == []  # not decided for the whole process
    monkeypatch.setenv("MEMFIT_NO_CACHE", "1")
    assert jit.load_kernel() is None and not folder.exists()


def test_the_kernel_is_cached_only_in_memfits_own_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMFIT_CACHE_DIR", "/somewhere")
    here = Path(kernel_cache.__file__).resolve().parent
    assert kernel_cache.candidates() == [
        here / "__pycache__" / "numba-kernel",
        Path("/somewhere/numba-kernel"),
    ]
