"""numba's kernel cache is dropped whole when any module of the package changes (jit.py)."""

from __future__ import annotations

import os

import pytest

from kimi_tok.native import jit


def _package(tmp_path):
    package = tmp_path / "pkg"
    (package / "__pycache__").mkdir(parents=True)
    (package / "a.py").write_text("x = 1\n")
    (package / "b.py").write_text("y = 2\n")
    return package


def _cached_kernels(package):
    cache = package / "__pycache__"
    for name in ("a.kernel-3.py311.nbi", "a.kernel-3.py311.1.nbc"):
        (cache / name).write_bytes(b"compiled")
    (cache / "a.cpython-311.pyc").write_bytes(b"bytecode")
    return cache


def test_unchanged_sources_keep_the_cached_kernels(tmp_path):
    package = _package(tmp_path)
    jit.drop_stale_kernel_caches(package)  # first import: writes the stamp
    cache = _cached_kernels(package)
    assert jit.drop_stale_kernel_caches(package) is False
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        ["a.kernel-3.py311.nbi", "a.kernel-3.py311.1.nbc", "a.cpython-311.pyc", jit.STAMP_NAME])


def test_an_edit_to_any_module_drops_every_cached_kernel(tmp_path):
    package = _package(tmp_path)
    jit.drop_stale_kernel_caches(package)
    cache = _cached_kernels(package)
    before = (cache / jit.STAMP_NAME).read_text()
    (package / "b.py").write_text("y = 3  # a kernel in a.py may inline this\n")
    assert jit.drop_stale_kernel_caches(package) is True
    assert sorted(p.name for p in cache.iterdir()) == ["a.cpython-311.pyc", jit.STAMP_NAME]
    assert (cache / jit.STAMP_NAME).read_text() == jit.sources_stamp(package) != before
    assert jit.drop_stale_kernel_caches(package) is False  # stamped: nothing more to drop


def test_a_new_timestamp_alone_counts_as_an_edit(tmp_path):
    package = _package(tmp_path)
    jit.drop_stale_kernel_caches(package)
    _cached_kernels(package)
    stat = (package / "a.py").stat()
    os.utime(package / "a.py", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    assert jit.drop_stale_kernel_caches(package) is True


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
    assert (jit.PACKAGE_DIR / "__pycache__" / jit.STAMP_NAME).read_text() == jit.sources_stamp()
