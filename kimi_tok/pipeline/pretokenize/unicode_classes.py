"""Per-code-point character classes for the compiled Kimi pre-tokenizer.

One ``uint8`` of flags per code point (0..0x10FFFF), generated from PCRE2 10.47's
Unicode 16 tables by ``tools/gen_unicode_classes.py`` and shipped compressed in
``data/unicode_classes.npz``. A scanner that asks ``flags[cp] & LETTER`` needs no
regex engine and no Python object per character.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources

import numpy as np

N_CODE_POINTS = 0x110000

HAN = np.uint8(1)  # Script=Han (not Script_Extensions: U+3001 is not Han here)
LETTER = np.uint8(2)  # \p{L}
NUMBER = np.uint8(4)  # \p{N}
UPPERISH = np.uint8(8)  # [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
LOWERISH = np.uint8(16)  # [\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]
WHITESPACE = np.uint8(32)  # the regex's \s: Unicode White_Space (no U+180E)
PY_SPACE = np.uint8(64)  # Python's str.isspace(), used by tiktoken-safe chunking

FLAG_BITS = {
    "han": HAN,
    "letter": LETTER,
    "number": NUMBER,
    "upperish": UPPERISH,
    "lowerish": LOWERISH,
    "whitespace": WHITESPACE,
    "py_space": PY_SPACE,
}

# How each flag is spelled for PCRE2 (ALT_BSUX syntax); the same spellings
# appear in the PCRE2 translation of the Kimi pattern (see pretokenize.py).
HAN_CLASS = r"\p{sc:Han}"
WHITESPACE_CLASS = r"\p{White_Space}"
UPPERISH_CLASS = r"(?[ [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}] & [^\p{sc:Han}] ])"
LOWERISH_CLASS = r"(?[ [\p{Ll}\p{Lm}\p{Lo}\p{M}] & [^\p{sc:Han}] ])"

PCRE2_CLASS_OF_FLAG = {
    HAN: HAN_CLASS,
    LETTER: r"\p{L}",
    NUMBER: r"\p{N}",
    UPPERISH: UPPERISH_CLASS,
    LOWERISH: LOWERISH_CLASS,
    WHITESPACE: WHITESPACE_CLASS,
}


@lru_cache(maxsize=None)
def code_point_flags() -> np.ndarray:
    """The shipped flag table, read-only, one ``uint8`` per code point."""
    with resources.files("kimi_tok.data").joinpath("unicode_classes.npz").open("rb") as f:
        flags = np.load(f)["flags"]
    if flags.shape != (N_CODE_POINTS,) or flags.dtype != np.uint8:
        raise ValueError("kimi_tok/data/unicode_classes.npz is damaged: expected 0x110000 uint8 flags")
    flags.setflags(write=False)
    return flags
