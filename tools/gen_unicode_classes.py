"""Generate ``kimi_tok/data/unicode_classes.npz``: one flag byte per code point.

The compiled Kimi pre-tokenizer classifies characters by table look-up instead of
asking a regex engine. The flags are read off PCRE2 10.47 (the ``pcre2`` wheel,
Unicode 16) with the same class spellings the PCRE2 form of the pattern uses, so
the scanner and the PCRE2 JIT regex agree by construction; the tests then check
both against tiktoken on every code point.

Run from the repository root:  ``python tools/gen_unicode_classes.py``
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pcre2

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kimi_tok.pipeline.pretokenize.unicode_classes import (  # noqa: E402
    FLAG_BITS,
    N_CODE_POINTS,
    PCRE2_CLASS_OF_FLAG,
    PY_SPACE,
)

SURROGATES = range(0xD800, 0xE000)


def all_code_points_text() -> tuple[str, np.ndarray]:
    """Every code point but the surrogates, in order, and its code point per index."""
    cps = np.array([c for c in range(N_CODE_POINTS) if c not in SURROGATES], dtype=np.int64)
    return "".join(map(chr, cps.tolist())), cps


def flags_from_pcre2() -> np.ndarray:
    text, cps = all_code_points_text()
    flags = np.zeros(N_CODE_POINTS, dtype=np.uint8)
    for flag, cls in PCRE2_CLASS_OF_FLAG.items():
        pattern = pcre2.compile(cls + "+")
        for m in pattern.finditer(text):
            start, end = m.span()
            flags[cps[start:end]] |= flag
    space = np.fromiter((chr(c).isspace() for c in range(N_CODE_POINTS)), dtype=bool)
    flags[space] |= PY_SPACE
    return flags


def main() -> None:
    flags = flags_from_pcre2()
    out = ROOT / "kimi_tok" / "data" / "unicode_classes.npz"
    np.savez_compressed(
        out,
        flags=flags,
        unicode_version=np.array(str(getattr(pcre2, "__version__", "?"))),
        python_unicode=np.array(__import__("unicodedata").unidata_version),
    )
    counts = {name: int(((flags & bit) != 0).sum()) for name, bit in FLAG_BITS.items()}
    print(f"wrote {out} ({out.stat().st_size} bytes): {counts}")


if __name__ == "__main__":
    main()
