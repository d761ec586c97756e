"""Checks of a vocabulary's special tokens: texts, ids, and where they may lie."""

from __future__ import annotations

MAX_TOKEN_ID = 1 << 24  # far above any BPE vocabulary; keeps the dense decoder tables small


def check_special_tokens(special_tokens: dict[str, int] | None, n_ranks: int) -> dict[str, int]:
    """``special_tokens`` as a new dict, checked: str texts, distinct non-negative int ids above the
    ``n_ranks`` mergeable ranks and below ``MAX_TOKEN_ID``; ``ValueError`` names the bad token."""
    special_tokens = dict(special_tokens or {})
    for text, id_ in special_tokens.items():
        if not isinstance(text, str):
            raise ValueError(f"special token {text!r}: the text must be a str, not {type(text).__name__}")
        if isinstance(id_, bool) or not isinstance(id_, int) or id_ < 0:
            raise ValueError(f"special token {text!r}: id must be a non-negative int, got {id_!r}")
        if id_ >= MAX_TOKEN_ID:
            raise ValueError(
                f"special token {text!r}: id {id_} is too large (ids must be below {MAX_TOKEN_ID:,}: "
                "the decoder tables are dense)"
            )
        if id_ < n_ranks:
            raise ValueError(f"special token {text!r}: id {id_} collides with a mergeable rank")
    if len(set(special_tokens.values())) != len(special_tokens):
        raise ValueError("special tokens: two tokens share one id")
    return special_tokens
