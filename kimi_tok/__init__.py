"""kimi_tok: the exact Kimi K3 tokenizer, fast, in Python + numba + PCRE2.

>>> import kimi_tok
>>> tok = kimi_tok.kimi_k3()
>>> tok.encode_segments([("<|open|>", True), ("hello world", False)]).ids
[163587, 22931, 2695]
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .core import Encoding, Tokenizer
from .load import embedded_kimi_k3, read_model, read_special_tokens_json, vocabulary_from_ranks
from .pretokenize import KIMI_PATTERN
from .parallel import check_backend, check_hash_routing, check_n_jobs
from .segment_cache import DEFAULT_BUDGET_BYTES, check_segment_cache_bytes

__all__ = ["Encoding", "Tokenizer", "kimi_k3", "load", "from_tiktoken", "KIMI_PATTERN"]
__version__ = "0.1.0"


def kimi_k3(
    n_jobs: int | None = None,
    segment_cache_bytes: int | None = DEFAULT_BUDGET_BYTES,
    *,
    backend: str | None = None,
    hash_routing: bool = False,
) -> Tokenizer:
    """The Kimi K3 tokenizer from the vocabulary shipped in the package (sha256-checked).

    ``n_jobs``: workers one long call may use (default: ``KIMI_TOK_N_JOBS`` or the
    cores, at most 8); ``backend``: ``"threads"`` (default, or ``KIMI_TOK_BACKEND``)
    or ``"processes"``; ``hash_routing``: route unknown pieces by hash over the threads
    (see ``Tokenizer``). ``segment_cache_bytes``: budget of the exact segment cache
    (0 turns it off). The result is cached per arguments: later calls return the
    same (thread-safe) Tokenizer.
    """
    # checked before the cache: an unhashable argument gets this message, not lru_cache's, and
    # n_jobs=True or 2.0 cannot hit the entry of n_jobs=1 or 2 (equal hashes)
    if n_jobs is not None:
        check_n_jobs(n_jobs)
    check_segment_cache_bytes(segment_cache_bytes)
    if backend is not None:
        check_backend(backend)
    check_hash_routing(hash_routing)
    return _kimi_k3(n_jobs, segment_cache_bytes, backend, hash_routing)


@lru_cache(maxsize=8)
def _kimi_k3(n_jobs: int | None, segment_cache_bytes: int | None, backend: str | None,
             hash_routing: bool) -> Tokenizer:
    vocabulary, specials = embedded_kimi_k3()
    return Tokenizer(vocabulary, specials, KIMI_PATTERN, name="kimi_k3", n_jobs=n_jobs,
                     segment_cache_bytes=segment_cache_bytes, backend=backend, hash_routing=hash_routing)


kimi_k3.cache_clear = _kimi_k3.cache_clear  # type: ignore[attr-defined]


def load(
    path: str | Path,
    pattern: str | None = None,
    special_tokens: dict[str, int] | str | Path | None = None,
) -> Tokenizer:
    """A Tokenizer from a ``tiktoken.model`` file or a model directory.

    A directory holds ``tiktoken.model`` and (optionally) ``tokenizer_config.json``,
    whose ``added_tokens_decoder`` gives the special tokens. ``special_tokens`` may
    be a ``{text: id}`` dict or the path of a ``special_tokens.json``; the Kimi
    pattern is the default ``pattern``.

    >>> tok = kimi_tok.load("../shared/kimi-k3/tiktoken.model",
    ...                     special_tokens="../shared/kimi-k3/special_tokens.json")
    """
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or Path, not {type(path).__name__}")
    if pattern is not None and not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, not {type(pattern).__name__}")
    vocabulary, config_specials = read_model(Path(path))
    if isinstance(special_tokens, (str, Path)):
        special_tokens = read_special_tokens_json(Path(special_tokens))
    elif special_tokens is None:
        special_tokens = config_specials or {}
    elif not isinstance(special_tokens, dict):
        raise TypeError(f"special_tokens must be a dict or a path, not {type(special_tokens).__name__}")
    return Tokenizer(vocabulary, special_tokens, pattern or KIMI_PATTERN, name=Path(path).stem)


def from_tiktoken(encoding) -> Tokenizer:
    """Wrap a ``tiktoken.Encoding``: same vocabulary, pattern and special tokens."""
    try:
        ranks = encoding._mergeable_ranks
        specials = encoding._special_tokens
        pattern = encoding._pat_str
    except AttributeError:
        raise TypeError(f"expected a tiktoken.Encoding, not {type(encoding).__name__}") from None
    return Tokenizer(vocabulary_from_ranks(ranks), specials, pattern, name=encoding.name)
