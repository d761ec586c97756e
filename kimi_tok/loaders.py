"""Getting a Tokenizer: the embedded Kimi K3 vocabulary, a ``tiktoken.model`` file or model
directory, or a ``tiktoken.Encoding``."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from .engine import Policy
from .tokenizer import Tokenizer
from .vocab import (KIMI_K3_SHA256, KIMI_PATTERN, embedded_kimi_k3, read_model, read_special_tokens_json,
                    vocabulary_from_ranks)
from .vocab.files import read_chat_template
from .vocab.kimi_k3 import kimi_k3_special_tokens

__all__ = ["kimi_k3", "load", "from_tiktoken"]


def kimi_k3(
    n_jobs: int | None = None,
    segment_cache_bytes: int | None = Policy.segment_cache_bytes,
    *,
    backend: str | None = None,
    hash_routing: bool = False,
    policy: Policy | None = None,
) -> Tokenizer:
    """The Kimi K3 tokenizer from the vocabulary shipped in the package (sha256-checked).

    ``n_jobs``: threads one long call may use (default: ``KIMI_TOK_N_JOBS`` or the cores, at most
    8); ``segment_cache_bytes``: budget of the exact segment cache (0 or None: off); ``backend``:
    ``"threads"`` (default, or ``KIMI_TOK_BACKEND``) or ``"processes"``; ``hash_routing``: route
    unknown pieces by hash over the threads. Or a whole ``policy``. The result is cached per
    arguments: later calls return the same (thread-safe) Tokenizer.

    >>> kimi_tok.kimi_k3().encode("hello world").ids
    [22931, 2695]
    """
    if policy is None:  # checked before the cache: n_jobs=True or 2.0 must not hit the entry of 1 or 2
        policy = Policy.from_env(n_jobs, segment_cache_bytes, backend, hash_routing)
    elif not isinstance(policy, Policy):
        raise TypeError(f"policy must be a kimi_tok.Policy, not {type(policy).__name__}")
    return _kimi_k3(policy)


@lru_cache(maxsize=8)
def _kimi_k3(policy: Policy) -> Tokenizer:
    vocabulary, specials = embedded_kimi_k3()
    tok = Tokenizer(vocabulary, specials, KIMI_PATTERN, name="kimi_k3", policy=policy)
    tok._origin = (rebuild_kimi_k3, (KIMI_K3_SHA256,))
    return tok


def rebuild_kimi_k3(sha256: str, policy: dict) -> Tokenizer:
    """An unpickled ``kimi_k3()`` Tokenizer: this package's copy, if it is the same vocabulary."""
    if sha256 != KIMI_K3_SHA256:
        raise ValueError(f"the pickled Kimi K3 Tokenizer has vocabulary sha256 {sha256}; this kimi_tok ships "
                         f"{KIMI_K3_SHA256}: install the same kimi_tok version on both sides")
    return kimi_k3(policy=Policy(**policy))


kimi_k3.cache_clear = _kimi_k3.cache_clear  # type: ignore[attr-defined]


def load(
    path: str | Path,
    pattern: str | None = None,
    special_tokens: dict[str, int] | str | Path | None = None,
    *,
    policy: Policy | None = None,
) -> Tokenizer:
    """A Tokenizer from a ``tiktoken.model`` file or a model directory.

    A directory holds ``tiktoken.model`` and (optionally) ``tokenizer_config.json``, whose
    ``added_tokens_decoder`` gives the special tokens. ``special_tokens`` may be a ``{text: id}``
    dict or the path of a ``special_tokens.json``. Without either, the Kimi K3 vocabulary (known
    by its sha256) gets its 256 special tokens; any other file gets none, as in tiktoken. The
    Kimi pattern is the default ``pattern``. A directory's chat template (``chat_template.jinja``
    or the config's ``chat_template``) becomes ``tok.chat_template``.

    >>> tok = kimi_tok.load("../shared/kimi-k3/tiktoken.model")  # doctest: +SKIP
    >>> tok.encode("<|open|>", allow_special=True).ids  # doctest: +SKIP
    [163587]
    """
    if not isinstance(path, (str, Path)):
        raise TypeError(f"path must be a str or Path, not {type(path).__name__}")
    if pattern is not None and not isinstance(pattern, str):
        raise TypeError(f"pattern must be a str, not {type(pattern).__name__}")
    vocabulary, config_specials, sha256 = read_model(Path(path))
    if isinstance(special_tokens, (str, Path)):
        special_tokens = read_special_tokens_json(Path(special_tokens))
    elif special_tokens is None:
        special_tokens = config_specials if config_specials is not None else (
            kimi_k3_special_tokens() if sha256 == KIMI_K3_SHA256 else {})
    elif not isinstance(special_tokens, dict):
        raise TypeError(f"special_tokens must be a dict or a path, not {type(special_tokens).__name__}")
    tok = Tokenizer(vocabulary, special_tokens, pattern or KIMI_PATTERN, name=Path(path).stem, policy=policy)
    tok.chat_template = read_chat_template(Path(path)) if Path(path).is_dir() else None
    tok._origin = _file_origin(str(Path(path).absolute()), sha256, tok)
    return tok


def _file_origin(path: str, sha256: str, tok: Tokenizer) -> tuple:
    """How to make ``tok`` again from its file (K3's 256 special tokens go as None: they are known)."""
    k3_specials = sha256 == KIMI_K3_SHA256 and tok.special_tokens == kimi_k3_special_tokens()
    return rebuild_loaded, (path, sha256, tok.pattern, None if k3_specials else tok.special_tokens)


def rebuild_loaded(path: str, sha256: str, pattern: str, special_tokens: dict[str, int] | None,
                   policy: dict) -> Tokenizer:
    """An unpickled ``load()`` Tokenizer: ``load(path)`` again, one per process for each, if the
    file still has ``sha256`` (``ValueError`` naming it otherwise); ``special_tokens`` None: K3's."""
    specials = tuple((special_tokens if special_tokens is not None else kimi_k3_special_tokens()).items())
    return _loaded(path, sha256, pattern, specials, Policy(**policy))


@lru_cache(maxsize=8)
def _loaded(path: str, sha256: str, pattern: str, specials: tuple, policy: Policy) -> Tokenizer:
    tok = load(path, pattern, dict(specials), policy=policy)
    found = tok._origin[1][1]
    if found != sha256:
        raise ValueError(f"{path}: the vocabulary changed since the Tokenizer was pickled "
                         f"(sha256 {found}, expected {sha256})")
    return tok


def from_tiktoken(encoding, *, policy: Policy | None = None) -> Tokenizer:
    """Wrap a ``tiktoken.Encoding``: same vocabulary, pattern and special tokens.

    >>> kimi_tok.from_tiktoken(tiktoken.get_encoding("cl100k_base"))  # doctest: +SKIP
    """
    try:
        ranks = encoding._mergeable_ranks
        specials = encoding._special_tokens
        pattern = encoding._pat_str
    except AttributeError:
        raise TypeError(f"expected a tiktoken.Encoding, not {type(encoding).__name__}") from None
    return Tokenizer(vocabulary_from_ranks(ranks), specials, pattern, name=encoding.name, policy=policy)
