"""Every Unicode scalar value (0..0x10FFFF without surrogates), alone and in small contexts.

Three properties per context:

* ids: each sample encoded alone by the reference == kimi_tok on all samples as segments
  (batched ~50k segments per call, so memory stays low);
* pieces: the compiled Kimi scanner (``scan_runs``) cuts each sample exactly where the
  PCRE2 JIT regex (``RegexPreTokenizer(KIMI_PATTERN).split``) does;
* the ``PY_SPACE`` flag of the code-point table equals ``str.isspace()`` everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest

from kimi_tok import KIMI_PATTERN
from kimi_tok.pipeline.pretokenize import RegexPreTokenizer
from kimi_tok.pipeline.pretokenize.kimi_scanner import scan_runs
from kimi_tok.pipeline.pretokenize.unicode_classes import (
    HAN,
    LETTER,
    N_CODE_POINTS,
    NUMBER,
    PY_SPACE,
    WHITESPACE,
    code_point_flags,
)
from tests.parity import assert_batched_parity
from tests.reference import MAX_RUN_CHARS

SCALAR_VALUES = [c for c in range(N_CODE_POINTS) if not 0xD800 <= c <= 0xDFFF]

CONTEXTS = {
    "alone": "{c}",
    "between-letters": "a{c}b",
    "after-space": " {c}",
    "before-space": "{c} ",
    "between-digits": "1{c}2",
    "after-apostrophe": "x'{c}",
    "repeated": "{c}{c}{c}",
    "after-newline": "\n{c}",
    "upper-context": "A{c}B",
    "before-contraction": "{c}'ll",
}


def samples_for(context: str) -> list[str]:
    template = CONTEXTS[context]
    return [template.format(c=chr(cp)) for cp in SCALAR_VALUES]


@pytest.mark.parametrize("context", list(CONTEXTS))
def test_ids_of_every_code_point(tok, ref, context):
    """Each code point in ``context``: kimi_tok's ids == the reference's, sample by sample."""
    samples = samples_for(context)
    assert max(map(len, samples)) <= MAX_RUN_CHARS  # so tiktoken-safe chunking never cuts a sample
    encode_one = ref.enc.encode_ordinary  # == Reference.encode(s, False) for these short samples
    assert encode_one(samples[0x41]) == ref.encode(samples[0x41], False)
    assert_batched_parity(tok, encode_one, samples, label=f"context {context!r}")


def pcre2_piece_ends(samples: list[str], starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first_piece, piece_end) in the layout of ``scan_runs``, from the PCRE2 JIT regex."""
    split = RegexPreTokenizer(KIMI_PATTERN).split
    first_piece = np.empty(len(samples) + 1, dtype=np.int64)
    ends: list[int] = []
    for k, sample in enumerate(samples):
        first_piece[k] = len(ends)
        offset = int(starts[k])
        for piece in split(sample):
            offset += len(piece.encode("utf-8"))
            ends.append(offset)
    first_piece[len(samples)] = len(ends)
    return first_piece, np.array(ends, dtype=np.int64)


@pytest.mark.parametrize("context", list(CONTEXTS))
def test_scanner_pieces_of_every_code_point(context):
    """The compiled scanner gives exactly the PCRE2 pieces for each code point in ``context``."""
    samples = samples_for(context)
    encoded = [s.encode("utf-8") for s in samples]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    run_end = np.cumsum(lengths)
    run_start = run_end - lengths
    buf = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    run_special = np.full(len(samples), -1, dtype=np.int64)
    first_piece, piece_end = scan_runs(buf, run_start, run_end, run_special, code_point_flags())
    want_first, want_end = pcre2_piece_ends(samples, run_start)
    if np.array_equal(first_piece, want_first) and np.array_equal(piece_end, want_end):
        return
    # Name the first sample whose pieces differ.
    for k, sample in enumerate(samples):
        got = piece_end[first_piece[k]:first_piece[k + 1]] - run_start[k]
        want = want_end[want_first[k]:want_first[k + 1]] - run_start[k]
        if not np.array_equal(got, want):
            raise AssertionError(
                f"context {context!r}: sample {sample!r} (U+{SCALAR_VALUES[k]:04X}): scanner piece ends "
                f"{got.tolist()}, PCRE2 piece ends {want.tolist()} "
                f"(PCRE2 pieces {RegexPreTokenizer(KIMI_PATTERN).split(sample)!r})"
            )
    raise AssertionError(f"context {context!r}: piece arrays differ but no sample does")  # pragma: no cover


def test_py_space_flag_is_str_isspace():
    """The PY_SPACE flag (used by the 25k-run cut) is Python's str.isspace for every code point."""
    flags = code_point_flags()
    assert flags.shape == (N_CODE_POINTS,) and flags.dtype == np.uint8
    expected = np.fromiter((chr(c).isspace() for c in range(N_CODE_POINTS)), dtype=np.bool_, count=N_CODE_POINTS)
    got = (flags & PY_SPACE) != 0
    bad = np.flatnonzero(got != expected)
    assert bad.size == 0, f"PY_SPACE differs from str.isspace at {[hex(int(c)) for c in bad[:20]]}"


def test_flag_table_sanity():
    """Spot checks of the other flags (documented in unicode_classes.py)."""
    flags = code_point_flags()

    def has(ch, flag):
        return bool(flags[ord(ch)] & flag)

    assert has("中", HAN) and has("\U00031350", HAN) and has("\U0002ebf0", HAN)
    assert not has("\u3001", HAN)  # Common script, Han only by Script_Extensions
    assert has("a", LETTER) and has("中", LETTER) and not has("1", LETTER)
    assert has("1", NUMBER) and has("Ⅻ", NUMBER) and has("½", NUMBER)
    assert has(" ", WHITESPACE) and has("\xa0", WHITESPACE) and has("\u3000", WHITESPACE)
    assert not has("\x1c", WHITESPACE) and has("\x1c", PY_SPACE)  # regex \s vs str.isspace
    assert not has("\u180e", WHITESPACE)
    with pytest.raises(ValueError):
        flags[0] = 0  # the shared table is read-only


# ---------------------------------------------------------------------------------------------
# Every vocabulary token: BPE on pieces that are tokens, pairs of tokens, and longer words
# ---------------------------------------------------------------------------------------------


def vocabulary_texts(ref) -> list[str]:
    """The text of every mergeable token whose bytes are valid UTF-8 (rank order)."""
    texts = []
    for rank in range(ref.enc.n_vocab - len(ref.enc._special_tokens)):
        try:
            texts.append(ref.enc.decode_single_token_bytes(rank).decode("utf-8"))
        except UnicodeDecodeError:
            pass
    return texts


@pytest.fixture(scope="module")
def token_texts(ref):
    texts = vocabulary_texts(ref)
    assert len(texts) > 100_000
    return texts


VOCAB_CONTEXTS = {
    "alone": lambda texts, k: texts[k],
    "twice": lambda texts, k: texts[k] * 2,
    "with-next": lambda texts, k: texts[k] + texts[(k + 1) % len(texts)],
    "with-far": lambda texts, k: texts[k] + texts[(k * 7919 + 13) % len(texts)] + texts[(k * 104_729 + 7) % len(texts)],
}


@pytest.mark.parametrize("context", list(VOCAB_CONTEXTS))
def test_every_vocabulary_token(tok, ref, token_texts, context):
    """Each token's text (alone, twice, glued to other tokens) has the reference's ids."""
    make = VOCAB_CONTEXTS[context]
    samples = [make(token_texts, k) for k in range(len(token_texts))]
    assert_batched_parity(tok, ref.enc.encode_ordinary, samples, label=f"vocabulary {context!r}")


def test_glued_letter_tokens_across_the_short_piece_size(tok, ref, token_texts):
    """Words glued from 2-12 lowercase letter tokens: pieces of ~4-80 bytes, many merge orders.

    bpe.py merges pieces of up to 32 bytes in a scratch buffer and longer ones with a heap;
    both must give tiktoken's lowest-rank, leftmost-first merges.
    """
    rng = np.random.default_rng(1234)
    letters = [t for t in token_texts if t.isascii() and t.isalpha() and t.islower()]
    samples = []
    for _ in range(60_000):
        parts = rng.choice(len(letters), size=int(rng.integers(2, 13)))
        samples.append("".join(letters[p] for p in parts))
    lengths = np.array([len(s) for s in samples])
    assert (lengths <= 32).any() and (lengths > 32).any()
    assert_batched_parity(tok, ref.enc.encode_ordinary, samples, label="glued letter tokens")
