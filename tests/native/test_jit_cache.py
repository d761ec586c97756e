"""numba's kernel cache is dropped whole when a module that holds compiled code (or one such a
module imports) changes, and kept when any other module changes (jit.py)."""

from __future__ import annotations

import hashlib
import os

import pytest
from numba.core import config

from kimi_tok.native import jit


def _package(tmp_path):
    """A tree like the package's: ``a.py`` holds a kernel and imports ``b.py``; ``c.py`` holds none."""
    package = tmp_path / "pkg"
    (package / "__pycache__").mkdir(parents=True)
    (package / "a.py").write_text("from .jit import kernel\nfrom .b import Y\n")
    (package / "b.py").write_text("Y = 2\n")
    (package / "c.py").write_text("Z = 1\n")
    return package


def _cached_kernels(package):
    cache = package / "__pycache__"
    for name in ("a.kernel-3.py311.nbi", "a.kernel-3.py311.1.nbc"):
        (cache / name).write_bytes(b"compiled")
    (cache / "a.cpython-311.pyc").write_bytes(b"bytecode")
    return cache


def test_the_compiled_modules_are_the_kernel_modules_and_what_they_import(tmp_path):
    package = _package(tmp_path)
    assert jit.compiled_modules(package) == [package / "a.py", package / "b.py"]


def test_unchanged_sources_keep_the_cached_kernels(tmp_path):
    package = _package(tmp_path)
    jit.drop_stale_kernel_caches(package)  # first import: writes the stamp
    cache = _cached_kernels(package)
    assert jit.drop_stale_kernel_caches(package) is False
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        ["a.kernel-3.py311.nbi", "a.kernel-3.py311.1.nbc", "a.cpython-311.pyc", jit.STAMP_NAME])


def test_an_edit_to_a_module_a_kernel_imports_drops_every_cached_kernel(tmp_path):
    package = _package(tmp_path)
    jit.drop_stale_kernel_caches(package)
    cache = _cached_kernels(package)
    before = (cache / jit.STAMP_NAME).read_text()
    (package / "b.py").write_text("Y = 3  # a kernel in a.py may inline this\n")
    assert jit.drop_stale_kernel_caches(package) is True
    assert sorted(p.name for p in cache.iterdir()) == ["a.cpython-311.pyc", jit.STAMP_NAME]
    after = (cache / jit.STAMP_NAME).read_text()
    assert after == f"{jit.tree_stamp(package)}\n{jit.sources_stamp(package)}\n" != before
    assert jit.drop_stale_kernel_caches(package) is False  # stamped: nothing more to drop


def test_a_new_timestamp_alone_counts_as_an_edit(tmp_path):
    package = _package(tmp_path)
    jit.drop_stale_kernel_caches(package)
    _cached_kernels(package)
    stat = (package / "a.py").stat()
    os.utime(package / "a.py", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert jit.drop_stale_kernel_caches(package) is True


def test_an_edit_to_a_module_without_compiled_code_keeps_the_kernels(tmp_path):
    package = _package(tmp_path)
    jit.drop_stale_kernel_caches(package)
    cache = _cached_kernels(package)
    (package / "c.py").write_text("Z = 2  # no kernel reads this\n")
    assert jit.drop_stale_kernel_caches(package) is False
    assert (cache / "a.kernel-3.py311.nbi").exists()
    # the new tree is stamped: the next import only compares ``stat`` results
    assert (cache / jit.STAMP_NAME).read_text().split("\n")[0] == jit.tree_stamp(package)


def test_an_older_stamp_drops_the_kernels_once(tmp_path):
    package = _package(tmp_path)
    cache = _cached_kernels(package)
    (cache / jit.STAMP_NAME).write_text("0" * 64)  # the one-line stamp of earlier versions
    assert jit.drop_stale_kernel_caches(package) is True
    assert jit.drop_stale_kernel_caches(package) is False


def test_with_numba_cache_dir_the_kernels_there_are_guarded(tmp_path, monkeypatch):
    package = _package(tmp_path)
    numba_cache = tmp_path / "numba-cache"
    monkeypatch.setattr(config, "CACHE_DIR", str(numba_cache))
    # numba's folder for a source folder: its name and the SHA-1 of its path (caching.py)
    folder = numba_cache / f"pkg_{hashlib.sha1(str(package).encode()).hexdigest()}"
    assert jit.kernel_cache_dirs(package) == [folder]
    jit.drop_stale_kernel_caches(package)
    folder.mkdir(parents=True)
    (folder / "a.kernel-3.py311.nbi").write_bytes(b"compiled")
    assert jit.drop_stale_kernel_caches(package) is False
    (package / "b.py").write_text("Y = 4\n")
    assert jit.drop_stale_kernel_caches(package) is True
    assert not (folder / "a.kernel-3.py311.nbi").exists()
    assert not (package / "__pycache__" / jit.STAMP_NAME).exists()  # the stamp is kept beside those kernels


def test_a_read_only_tree_is_left_alone(tmp_path):
    package = _package(tmp_path)
    cache = _cached_kernels(package)
    cache.chmod(0o555)
    try:
        if os.access(cache, os.W_OK):
            pytest.skip("running as root: permissions do not stop writes")
        assert jit.drop_stale_kernel_caches(package) is False
        assert (cache / "a.kernel-3.py311.nbi").exists()
    finally:
        cache.chmod(0o755)


def test_the_package_itself_is_stamped():
    stamp = jit._stamp_file(jit.PACKAGE_DIR).read_text().split("\n")
    assert stamp[1] == jit.sources_stamp()
