"""Pre-tokenization: cut text runs into the pieces that BPE merges.

Every pre-tokenizer reads the same input (a UTF-8 buffer and the text runs between special
tokens) and writes the same output (piece end offsets per run, CSR style). What the engine
and the fused kernels need of one is the ``PreTokenizer`` protocol:

* ``KimiScanner`` (``kimi_scanner``): the Kimi K3 pattern as a compiled numba scanner; its
  ``scan_table`` lets the fused kernels scan inside one compiled call;
* ``RegexPreTokenizer`` (``pcre2_pattern``): any other tiktoken pattern through PCRE2 JIT.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ...vocab.kimi_k3 import KIMI_PATTERN
from .kimi_scanner import KimiScanner
from .pcre2_pattern import RegexPreTokenizer, compile_pcre2, to_pcre2


class PreTokenizer(Protocol):
    pattern: str
    splits_after_newline: bool  # whether ``kimi_scanner.split_at_safe_points`` keeps every piece
    scan_table: np.ndarray | None  # the compiled scanner's code-point table; None: pieces need Python

    def scan(self, buf: np.ndarray, run_start: np.ndarray, run_end: np.ndarray,
             run_special: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(first_piece[n_runs + 1], piece_end[n_pieces])`` of the text runs."""


def pretokenizer_for(pattern: str) -> PreTokenizer:
    """The compiled scanner for the Kimi pattern, PCRE2 JIT for any other."""
    if pattern == KIMI_PATTERN:
        return KimiScanner()
    return RegexPreTokenizer(pattern)


__all__ = ["PreTokenizer", "KimiScanner", "RegexPreTokenizer", "pretokenizer_for", "compile_pcre2", "to_pcre2",
           "KIMI_PATTERN"]
