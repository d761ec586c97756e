"""Seams: positions inside a piece that no token crosses, where a piece that misses the caches may be merged
in sections.

BPE only ever merges two adjacent parts into a token, so a merge that joins bytes on both sides of a
position makes a token that *crosses* it. Where no token can cross a position (a seam), no merge ever
does, and the piece's ids are the ids of the section before it followed by those of the section after
it, each merged alone. A Thai phrase is one piece of dozens of letters that rarely repeats, but its
seams leave sections of one or two letters that repeat all the time; so do Devanagari, Arabic and kana
runs (docs/performance.md, "Long pieces merged in sections").

Seams are decided per pair of adjacent characters ``a b`` (code points of two or three bytes, both in
one block of 128). A token crossing the position between them holds a non-empty suffix of ``a``
followed by a non-empty prefix of ``b``: all of ``a`` (and maybe more before it) or a proper suffix
of ``a`` (the token starts inside ``a``), and all of ``b`` or a proper prefix of it.
``build_seam_tables`` visits every way to split every token at a byte that starts a character and
marks each pair ``(a, b)`` that split could lie between, whatever bytes surround them, so between a
pair left unmarked there is a seam wherever it occurs. Sections are then merged as pieces of their
own: a section that is a token is that token only because BPE builds every token from its own bytes,
so the tables are left empty for a vocabulary where it does not.

Layout: ``seam_blocks[cp >> 7]`` is the first word of the block's table in ``seam_words``, or -1;
a block's table has ``CROSS_WORDS`` words of crossing bits (row ``a & 127``, two words per row,
bit ``b & 127``) and then one word per code point with the ids BPE makes of it alone
(``SOLO_COUNT_SHIFT``: count, then up to three 20-bit ids), so a section of one character is one load.
"""

from __future__ import annotations

import numpy as np

from ...native.jit import index, kernel, leaf
from ...native.utf8 import sequence_length, well_formed_code_point_at
from .char_starts import _solo, _utf8
from .tables import ID_BITS, ID_MASK, NO_MERGE

BLOCK_SHIFT = 7  # a block: 128 code points
BLOCK_SIZE = 1 << BLOCK_SHIFT
BLOCK_MASK = BLOCK_SIZE - 1
N_BLOCKS = 0x10000 >> BLOCK_SHIFT  # code points of two and three bytes
# Blocks with tables: alphabets, abugidas and kana (U+0080..U+30FF), where a block holds a script's letters.
# The CJK ideographs and Hangul syllables above span dozens of blocks each (no seam between blocks)
# and their characters start whole already (char_starts.py)
LAST_SEAM_CODE_POINT = 0x3100
MIN_TOKEN_CHARACTERS = 8  # a block gets a table when at least this many of its characters are tokens
ROW_WORDS = BLOCK_SIZE // 64
CROSS_WORDS = BLOCK_SIZE * ROW_WORDS
BLOCK_WORDS = CROSS_WORDS + BLOCK_SIZE
SOLO_COUNT_SHIFT = 60
MAX_SOLO_IDS = 3


@leaf
def seam_table_at(seam_blocks, cp):
    """The first word of the table of ``cp``'s block (``cp`` of two or three bytes), or -1."""
    return np.int64(seam_blocks[index(cp >> BLOCK_SHIFT)])


@leaf
def crosses(seam_words, table, a, b):
    """Whether a token may cross between ``a`` and ``b`` (two code points of the block at ``table``)."""
    low = b & BLOCK_MASK
    word = seam_words[index(table + (a & BLOCK_MASK) * ROW_WORDS + (low >> 6))]
    return (word >> np.uint64(low & 63)) & np.uint64(1) != 0


@leaf
def solo_count(seam_words, table, cp):
    return np.int64(seam_words[index(table + CROSS_WORDS + (cp & BLOCK_MASK))] >> np.uint64(SOLO_COUNT_SHIFT))


@leaf
def solo_id(seam_words, table, cp, k):
    word = seam_words[index(table + CROSS_WORDS + (cp & BLOCK_MASK))]
    return np.int64((word >> np.uint64(ID_BITS * k)) & np.uint64(ID_MASK))


@leaf
def _mark_candidates(token_bytes, start, end, suffix, first_block, n_blocks, block_at, masks, raw):
    """The code points of the blocks with tables that the fragment ``token_bytes[start:end]`` (continuation
    bytes only) may be a proper suffix of (``suffix``), or (a lead byte and too few continuation bytes) a
    proper prefix of, as bits in ``masks`` (``ROW_WORDS`` per block with a table, cleared first)."""
    for w in range(masks.shape[0]):
        masks[w] = 0
    n_frag = end - start
    for block in range(first_block, first_block + n_blocks):
        row = block_at[block]
        if row < 0:
            continue
        for low in range(BLOCK_SIZE):
            cp = (block << BLOCK_SHIFT) | low
            if cp >= 0xD800 and cp < 0xE000:
                continue
            n = _utf8(cp, raw)
            if n <= n_frag:
                continue
            same = True
            for k in range(n_frag):
                if raw[n - n_frag + k if suffix else k] != token_bytes[start + k]:
                    same = False
                    break
            if same:
                masks[row * ROW_WORDS + (low >> 6)] |= np.uint64(1) << np.uint64(low & 63)


@leaf
def _mark_one(cp, block_at, masks):
    """``masks`` (as ``_mark_candidates`` fills them) holding the one code point ``cp``."""
    masks.fill(0)
    row = block_at[cp >> BLOCK_SHIFT]
    if row >= 0:
        masks[row * ROW_WORDS + ((cp & BLOCK_MASK) >> 6)] = np.uint64(1) << np.uint64(cp & 63)


@leaf
def _char_ending_at(token_bytes, start, split):
    """The code point ending right before ``split`` when the bytes before it (from ``start``) hold its lead
    byte; -2 when they hold only continuation bytes (a fragment); -1 when they cannot be valid text."""
    q = split - 1
    while q >= start and token_bytes[q] >= 0x80 and token_bytes[q] < 0xC0:
        q -= 1
    if q < start:
        return np.int64(-2) if split - start <= 3 else np.int64(-1)
    width = sequence_length(token_bytes[q])
    if q + width != split:
        return np.int64(-1)
    return np.int64(well_formed_code_point_at(token_bytes, q, width))


@kernel
def build_seam_tables(tables, every_token_built):
    """``(seam_blocks, seam_words)`` for the vocabulary of ``tables`` (see the module docstring); no block has
    a table unless ``every_token_built`` (BPE of each token's bytes alone ends in that token)."""
    seam_blocks = np.full(N_BLOCKS, -1, dtype=np.int32)
    first_block = 1
    n_blocks = (LAST_SEAM_CODE_POINT >> BLOCK_SHIFT) - first_block
    if not every_token_built:
        return seam_blocks, np.zeros(0, dtype=np.uint64)
    raw = np.zeros(4, dtype=np.uint8)
    parts = np.zeros(4, dtype=np.int64)
    ends = np.zeros(4, dtype=np.int64)
    solo = np.zeros((n_blocks, BLOCK_SIZE), dtype=np.uint64)
    block_at = np.full(N_BLOCKS, -1, dtype=np.int64)  # row of a block with a table
    n_rows = 0
    for block in range(first_block, first_block + n_blocks):
        tokens = 0
        for low in range(BLOCK_SIZE):
            cp = (block << BLOCK_SHIFT) | low
            if cp < 0x80 or (cp >= 0xD800 and cp < 0xE000):
                continue
            n = _utf8(cp, raw)
            count, _ = _solo(tables, raw, n, parts, ends, NO_MERGE)
            if count > MAX_SOLO_IDS:
                continue
            value = np.uint64(count) << np.uint64(SOLO_COUNT_SHIFT)
            for k in range(count):
                value |= np.uint64(parts[k]) << np.uint64(ID_BITS * k)
            solo[block - first_block, low] = value
            tokens += count == 1
        if tokens >= MIN_TOKEN_CHARACTERS:
            block_at[block] = n_rows
            n_rows += 1
    seam_words = np.zeros(n_rows * BLOCK_WORDS, dtype=np.uint64)
    for block in range(first_block, first_block + n_blocks):
        row = block_at[block]
        if row >= 0:
            seam_blocks[block] = row * BLOCK_WORDS
            for low in range(BLOCK_SIZE):
                seam_words[row * BLOCK_WORDS + CROSS_WORDS + low] = solo[block - first_block, low]
    left_masks = np.zeros(n_rows * ROW_WORDS, dtype=np.uint64)
    right_masks = np.zeros(n_rows * ROW_WORDS, dtype=np.uint64)
    token_bytes = tables.token_bytes
    offsets = tables.token_offsets
    for t in range(offsets.shape[0] - 1):
        start, end = offsets[t], offsets[t + 1]
        for split in range(start + 1, end):
            lead = token_bytes[split]
            if lead >= 0x80 and lead < 0xC0:
                continue  # a token crosses between two characters only at a byte that starts one
            a = _char_ending_at(token_bytes, start, split)
            if a == -1 or a >= 0x10000:
                continue
            width = sequence_length(lead)
            b = np.int64(-2)
            if end - split >= width:
                b = np.int64(well_formed_code_point_at(token_bytes, split, width))
                if b < 0 or b >= 0x10000:
                    continue
            if a >= 0 and b >= 0:  # whole characters on both sides: one pair
                if a >> BLOCK_SHIFT == b >> BLOCK_SHIFT and block_at[a >> BLOCK_SHIFT] >= 0:
                    table = seam_blocks[a >> BLOCK_SHIFT]
                    row = table + (a & BLOCK_MASK) * ROW_WORDS + ((b & BLOCK_MASK) >> 6)
                    seam_words[row] |= np.uint64(1) << np.uint64(b & 63)
                continue
            # a fragment of a character on one side or both: every character it may belong to
            if a >= 0:
                _mark_one(a, block_at, left_masks)
            else:
                _mark_candidates(token_bytes, start, split, True, first_block, n_blocks, block_at, left_masks, raw)
            if b >= 0:
                _mark_one(b, block_at, right_masks)
            else:
                _mark_candidates(token_bytes, split, end, False, first_block, n_blocks, block_at, right_masks, raw)
            for block in range(first_block, first_block + n_blocks):
                row = block_at[block]
                if row < 0:
                    continue
                for low in range(BLOCK_SIZE):
                    if (left_masks[row * ROW_WORDS + (low >> 6)] >> np.uint64(low & 63)) & np.uint64(1):
                        for w in range(ROW_WORDS):
                            seam_words[row * BLOCK_WORDS + low * ROW_WORDS + w] |= right_masks[row * ROW_WORDS + w]
    return seam_blocks, seam_words
