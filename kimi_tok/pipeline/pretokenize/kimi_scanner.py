"""The Kimi K3 pattern as a compiled numba scanner (``KimiScanner``).

Each regex alternative is one small function below; character classes come from the
PCRE2-generated flag table (``unicode_classes``). No regex engine and no Python object
per piece; the tests check it piece for piece against the PCRE2 JIT regex on every code
point in context.

The Kimi pattern (leftmost-first alternation, backtracking semantics)::

    1 [\\p{Han}]+
    2 [^\\r\\n\\p{L}\\p{N}]?  UPPERISH*  LOWERISH+  CONTRACTION?
    3 [^\\r\\n\\p{L}\\p{N}]?  UPPERISH+  LOWERISH*  CONTRACTION?
    4 \\p{N}{1,3}
    5  ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*
    6 \\s*[\\r\\n]+
    7 \\s+(?!\\S)
    8 \\s+
"""

from __future__ import annotations

import numpy as np

from ...native.hugepages import in_huge_pages
from ...native.jit import index, kernel, leaf, leaf_inline
from ...native.simd import (BLOCK_BYTES, ascii_classes, cyrillic_classes, extended_additional_classes, greek_classes,
                            han_classes, hangul_classes, highest_set_bit, kana_letters, latin1_classes,
                            latin_extended_classes, lead_groups, lowest_set_bit, punctuation_classes, rtl_letters,
                            rtl_symbols, wide_symbols)
from ...native.utf8 import ASCII_END, code_point_at, sequence_length
from ...vocab.kimi_k3 import KIMI_PATTERN
from .unicode_classes import HAN, LETTER, LOWERISH, NUMBER, UPPERISH, WHITESPACE, code_point_flags

NO_MATCH = -1
CR = 0x0D
LF = 0x0A
TAB = 0x09  # tab .. carriage return (0x09-0x0D) and space: the ASCII White_Space
SPACE = 0x20
APOSTROPHE = 0x27
ASCII_CASE_BIT = 0x20  # 'A' | 0x20 == 'a'
LONG_S_LEAD, LONG_S_TRAIL = 0xC5, 0xBF  # U+017F (long s) folds to 's' under (?i)
LOWER_S, LOWER_T, LOWER_M, LOWER_D = ord("s"), ord("t"), ord("m"), ord("d")
LOWER_R, LOWER_V, LOWER_E, LOWER_L = ord("r"), ord("v"), ord("e"), ord("l")
LOWER_A, LOWER_Z = ord("a"), ord("z")
UPPER_A, UPPER_Z = ord("A"), ord("Z")
DIGIT_0, DIGIT_9 = ord("0"), ord("9")
MAX_DIGITS = 3


@leaf
def _flags(buf, i, table):
    return table[index(code_point_at(buf, i))]


# numba note: predicates below compare flags with ``!= 0`` explicitly; ``and``/``not``
# on integer flags compiled to code 20-40x slower (measured) than these comparisons.


@leaf
def _has(buf, i, table, flag):
    return (table[index(code_point_at(buf, i))] & flag) != 0


@leaf
def _advance(buf, i):
    return i + sequence_length(buf[index(i)])


@leaf_inline
def _run_end(buf, i, end, table, flag):
    """End of the longest run from ``i`` of characters having ``flag``."""
    while i < end and _has(buf, i, table, flag):
        i = _advance(buf, i)
    return i


@leaf
def _is_newline(byte):
    return (byte == CR) | (byte == LF)


@leaf_inline
def _is_prefix(buf, i, table):
    """``[^\\r\\n\\p{L}\\p{N}]``"""
    if _is_newline(buf[index(i)]):
        return False
    return not _has(buf, i, table, LETTER | NUMBER)


@leaf_inline
def _is_symbol(buf, i, table):
    """``[^\\s\\p{L}\\p{N}]``"""
    return not _has(buf, i, table, WHITESPACE | LETTER | NUMBER)


@leaf
def _lower_ascii(byte):
    return byte | ASCII_CASE_BIT


@leaf_inline
def _contraction_end(buf, i, end):
    """``(?i:'s|'t|'re|'ve|'m|'ll|'d)?`` at ``i``: its end, or ``i`` when absent."""
    if i + 1 >= end or buf[index(i)] != APOSTROPHE:
        return i
    first = _lower_ascii(buf[index(i + 1)])
    if first == LOWER_S or first == LOWER_T or first == LOWER_M or first == LOWER_D:
        return i + 2
    if i + 2 < end:
        if buf[index(i + 1)] == LONG_S_LEAD and buf[index(i + 2)] == LONG_S_TRAIL:
            return i + 3
        second = _lower_ascii(buf[index(i + 2)])
        if (first == LOWER_R or first == LOWER_V) and second == LOWER_E:
            return i + 3
        if first == LOWER_L and second == LOWER_L:
            return i + 3
    return i


@leaf_inline
def _match_lower_word(buf, start, end, table):
    """Alternative 2 after its prefix: ``UPPERISH* LOWERISH+ CONTRACTION?``.

    ``UPPERISH*`` is greedy, so it first takes the whole upperish run; when no
    lowerish character follows, backtracking hands back characters until one
    that is also lowerish (Lm, Lo, M) can start ``LOWERISH+``.
    """
    i = start
    last_lower_end = NO_MATCH
    while i < end:
        f = _flags(buf, i, table)
        if (f & UPPERISH) == 0:
            break
        i = _advance(buf, i)
        if (f & LOWERISH) != 0:
            last_lower_end = i
    if i < end and _has(buf, i, table, LOWERISH):
        word_end = _run_end(buf, i, end, table, LOWERISH)
    elif last_lower_end != NO_MATCH:
        word_end = last_lower_end
    else:
        return NO_MATCH
    return _contraction_end(buf, word_end, end)


@leaf_inline
def _match_upper_word(buf, start, end, table):
    """Alternative 3 after its prefix: ``UPPERISH+ LOWERISH* CONTRACTION?``."""
    if start >= end or not _has(buf, start, table, UPPERISH):
        return NO_MATCH
    i = _run_end(buf, start, end, table, UPPERISH)
    i = _run_end(buf, i, end, table, LOWERISH)
    return _contraction_end(buf, i, end)


@leaf_inline
def _match_number(buf, start, end, table):
    """Alternative 4: ``\\p{N}{1,3}``."""
    i = start
    for _ in range(MAX_DIGITS):
        if i >= end or not _has(buf, i, table, NUMBER):
            break
        i = _advance(buf, i)
    return i if i > start else NO_MATCH


@leaf_inline
def _match_symbols(buf, start, end, table):
    """Alternative 5: `` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*``."""
    i = start
    if buf[index(i)] == SPACE and i + 1 < end and _is_symbol(buf, i + 1, table):
        i += 1
    elif not _is_symbol(buf, i, table):
        return NO_MATCH
    while i < end and _is_symbol(buf, i, table):
        i = _advance(buf, i)
    while i < end and _is_newline(buf[index(i)]):
        i += 1
    return i


@leaf_inline
def _match_whitespace(buf, start, end, table):
    """Alternatives 6-8 on a whitespace run starting at ``start``.

    6 ``\\s*[\\r\\n]+`` ends just after the run's last newline, if it has one;
    7 ``\\s+(?!\\S)`` takes the run, minus its last character when a
      non-space follows (so that character can prefix the next word);
    8 ``\\s+`` takes the whole run.
    """
    i = start
    last_newline_end = NO_MATCH
    last_char_start = start
    while i < end and _has(buf, i, table, WHITESPACE):
        last_char_start = i
        if _is_newline(buf[index(i)]):
            last_newline_end = i + 1
        i = _advance(buf, i)
    if last_newline_end != NO_MATCH:
        return last_newline_end
    if i < end and last_char_start > start:
        return last_char_start
    return i


@leaf
def _is_ascii_digit(byte):
    return byte >= DIGIT_0 and byte <= DIGIT_9


@leaf_inline
def _ascii_word_end(buf, i, end):
    """Alternatives 2-3 from the ASCII letter at ``i`` (after any prefix) when the word is ASCII.

    ``[A-Z]*[a-z]+`` (2) if a lowercase letter follows the uppercase run, else ``[A-Z]+`` (3),
    then the contraction. ``NO_MATCH`` when the letters stop at a non-ASCII byte: a non-ASCII
    letter or mark could continue the word, so the caller takes the general path.
    """
    upper_end = i
    while upper_end < end and buf[index(upper_end)] >= UPPER_A and buf[index(upper_end)] <= UPPER_Z:
        upper_end += 1
    lower_end = upper_end
    while lower_end < end and buf[index(lower_end)] >= LOWER_A and buf[index(lower_end)] <= LOWER_Z:
        lower_end += 1
    if lower_end < end and buf[index(lower_end)] >= ASCII_END:
        return NO_MATCH
    return _contraction_end(buf, lower_end, end)


@leaf_inline
def _ascii_piece_end(buf, start, end):
    """ASCII pieces, matched byte by byte: a word with an optional prefix (2-3), a digit group (4),
    symbols (5) and whitespace (6-8). ``NO_MATCH`` where a non-ASCII byte could change the match:
    the caller then runs the alternatives in order (and finds the same piece for these)."""
    first = buf[index(start)]
    if first >= ASCII_END:
        return NO_MATCH
    if _is_ascii_letter(first):
        return _ascii_word_end(buf, start, end)
    if _is_ascii_digit(first):
        i = start + 1
        while i < end and i - start < MAX_DIGITS and _is_ascii_digit(buf[index(i)]):
            i += 1
        if i < end and i - start < MAX_DIGITS and buf[index(i)] >= ASCII_END:
            return NO_MATCH  # a non-ASCII digit could extend the group
        return i
    # any other ASCII character but a newline is a prefix ``[^\r\n\p{L}\p{N}]`` for a word
    if start + 1 < end and not _is_newline(first) and _is_ascii_letter(buf[index(start + 1)]):
        return _ascii_word_end(buf, start + 1, end)
    if start + 1 < end and buf[index(start + 1)] >= ASCII_END:
        return NO_MATCH  # a non-ASCII letter could follow the prefix
    if _is_ascii_space(first):
        if first == SPACE and start + 1 < end and _is_ascii_symbol(buf[index(start + 1)]):
            return _ascii_symbols_end(buf, start + 1, end)  # 5: `` ?[^\s\p{L}\p{N}]+``
        return _ascii_whitespace_end(buf, start, end)
    return _ascii_symbols_end(buf, start, end)


@leaf
def _is_ascii_space(byte):
    """``\\s`` among ASCII bytes: tab, line feed, vertical tab, form feed, carriage return, space."""
    return (byte >= TAB and byte <= CR) | (byte == SPACE)


@leaf
def _is_ascii_symbol(byte):
    """``[^\\s\\p{L}\\p{N}]`` among ASCII bytes."""
    return byte < ASCII_END and not _is_ascii_space(byte) and not _is_ascii_letter(byte) and not _is_ascii_digit(byte)


@leaf_inline
def _ascii_symbols_end(buf, i, end):
    """Alternative 5 from the ASCII symbol at ``i``: the symbols, then any newlines; ``NO_MATCH`` if the
    symbols stop at a non-ASCII byte (a non-ASCII symbol could continue them)."""
    while i < end and _is_ascii_symbol(buf[index(i)]):
        i += 1
    if i < end and buf[index(i)] >= ASCII_END:
        return NO_MATCH
    while i < end and _is_newline(buf[index(i)]):
        i += 1
    return i


@leaf_inline
def _ascii_whitespace_end(buf, start, end):
    """Alternatives 6-8 on a run of ASCII whitespace (as ``_match_whitespace``); ``NO_MATCH`` if the
    run stops at a non-ASCII byte (non-ASCII whitespace could continue it)."""
    i = start
    last_newline_end = NO_MATCH
    while i < end and _is_ascii_space(buf[index(i)]):
        if _is_newline(buf[index(i)]):
            last_newline_end = i + 1
        i += 1
    if i < end and buf[index(i)] >= ASCII_END:
        return NO_MATCH
    if last_newline_end != NO_MATCH:
        return last_newline_end
    if i < end and i - 1 > start:
        return i - 1
    return i


@leaf_inline
def next_piece_end(buf, start, end, table):
    """End of the piece that the Kimi pattern matches at ``start`` (``start < end``)."""
    j = _ascii_piece_end(buf, start, end)
    if j != NO_MATCH:
        return j
    f = _flags(buf, start, table)
    if (f & HAN) != 0:
        return _run_end(buf, start, end, table, HAN)
    after_first = _advance(buf, start)
    has_prefix = _is_prefix(buf, start, table) and after_first < end
    if has_prefix:
        j = _match_lower_word(buf, after_first, end, table)
        if j != NO_MATCH:
            return j
    j = _match_lower_word(buf, start, end, table)
    if j != NO_MATCH:
        return j
    if has_prefix:
        j = _match_upper_word(buf, after_first, end, table)
        if j != NO_MATCH:
            return j
    j = _match_upper_word(buf, start, end, table)
    if j != NO_MATCH:
        return j
    if (f & NUMBER) != 0:
        return _match_number(buf, start, end, table)
    j = _match_symbols(buf, start, end, table)
    if j != NO_MATCH:
        return j
    if (f & WHITESPACE) != 0:
        return _match_whitespace(buf, start, end, table)
    return after_first  # unreachable: every character matches some alternative


@leaf
def count_text_bytes(run_start, run_end, run_special):
    total = 0
    for r in range(run_start.shape[0]):
        if run_special[r] < 0:
            total += run_end[r] - run_start[r]
    return total


# -- 64 bytes at a time ---------------------------------------------------------------------------
#
# Where the text is ASCII, where each piece starts follows from each byte's class and its neighbours' (a window of
# four bytes), so the starts of a 64-byte window are computed as bit masks (``native.simd.ascii_classes``) and
# read off with ``tzcnt``, with no branch per byte. Bit ``k`` is byte ``base + k``, where ``base`` is three bytes
# before the piece start ``pos`` the window begins at; the starts of bits 4..60 are final (each needs bytes
# k-3..k+1; what bytes 0-2 decide, bit 3 being a start already decides, so a character cut there does not matter).
# The letters U+00C0-U+00FF but U+00D7 and U+00F7 (``C3 xx``: German, French, Spanish, ...) take part as two
# letter bytes of their case: the rules below depend on the classes of the letters in a run, never on how many
# there are, and no piece starts at a letter's second byte (a letter after a letter of the same case). So do the
# letters of one case of Latin Extended-A and -B, Greek and Cyrillic (two bytes) and Latin Extended Additional
# (three bytes: Vietnamese) that ``native.simd`` lists; a window computes the classes of a script only where one
# of its lead bytes is (``lead_groups``). The symbols among U+00A1-U+00BF (``C2 xx``: guillemets, section sign,
# ...), the Hebrew and Arabic punctuation ``native.simd.RTL_SYMBOLS`` lists, U+2010-U+2027 (``E2 80 xx``: dashes,
# quotation marks, the ellipsis) and the CJK and full-width symbols ``native.simd.WIDE_SYMBOLS`` lists (、。「」（），：)
# take part as symbol bytes; a prefix of one such character ends at its last byte, the byte before the letter it
# goes with. Hangul syllables (three bytes, ``hangul_classes``), kana (``kana_letters``; not the voicing marks,
# which are symbols after a symbol) and the Hebrew and Arabic letters (two bytes, ``rtl_letters``; not their
# marks) are letters of both cases (Lo, Lm): they take part as lowercase ones, which gives the same pieces unless
# an uppercase letter follows one (in ``한Bc`` the ``B`` continues the piece, in ``한B`` it starts one: a look
# ahead), so the window's starts end before such a letter. The Han ideographs U+3400-U+4DBF and U+4E00-U+9FFF
# (three bytes, ``han_classes``) are a class of their own, neither letters, digits, whitespace nor symbols. A
# no-break space (U+00A0, ``C2 A0``: French puts one before ``:`` and inside guillemets) with no whitespace right
# before or after it is a blank of its own: it starts a piece, is a prefix that ends at its second byte, and, not
# being the space, joins no symbol after it. Any other byte of 0x80 or more (another character, or one the
# window's end cuts) ends them two bytes before it. The rules, with ``prev`` the byte before (and as in the
# alternatives):
#
# * a letter starts a piece unless the letter before is a lowercase one and it is not uppercase (2-3),
#   or the byte before is a prefix ``[^\r\n\p{L}\p{N}]`` that itself starts a piece: a blank always
#   does (the last blank of a run before a non-blank; 7), a symbol when no symbol or space is before it;
# * a digit starts a piece at the start of its run and every third digit after (4);
# * a symbol starts one unless a symbol or a space is before it (5);
# * a newline starts one after a letter or a digit; after a symbol it belongs to the symbol's piece, after
#   whitespace to the whitespace's (5-6);
# * a blank starts one at the start of its run; right after a newline of a symbol's piece; right after
#   another newline unless blanks from it reach a newline (whitespace's piece ends at its run's last
#   newline; a run that goes on past the window, or reaches a character the window does not class, which may
#   be whitespace, is final at its start only); and as the last blank of a run of two or more before a
#   non-blank (7);
# * a contraction ``'s 't 'm 'd 're 've 'll`` (either case) right after a word's letter belongs to the
#   word, and a piece starts right after it;
# * an ideograph starts a piece unless an ideograph is before it (1); whatever follows one starts a piece
#   by the rules above.

WINDOW_LOOKBACK = 3
WINDOW_FIRST_BIT, WINDOW_LAST_BIT = 4, 60
FOURTH_BIT = np.uint64(1 << WINDOW_LOOKBACK)  # the window's first byte: a piece start
FINAL_BITS = np.uint64(((1 << (WINDOW_LAST_BIT + 1)) - 1) & ~((1 << WINDOW_FIRST_BIT) - 1))
LOW_THREE_BITS = np.uint64(7)
LOWER_CASE = 0x20
MAX_WINDOW_SKIP = 1 << 12  # text that is not ASCII is tried again after at most this many bytes


@leaf_inline
def _bit(k):
    return np.uint64(1) << np.uint64(k)


@leaf_inline
def _contractions(buf, base, candidates):
    """``(inside, after)``: the bytes of the contractions starting at the apostrophes ``candidates``
    (bits of the window at ``base``), and the bytes right after them."""
    inside = np.uint64(0)
    after = np.uint64(0)
    while candidates != 0:
        k = lowest_set_bit(candidates)
        candidates &= candidates - np.uint64(1)
        if (inside >> np.uint64(k - 1)) & np.uint64(1):
            continue  # the letter before is a contraction's own: no word ends there
        first = buf[index(base + k + 1)] | LOWER_CASE
        second = buf[index(base + k + 2)] | LOWER_CASE
        if first == LOWER_S or first == LOWER_T or first == LOWER_M or first == LOWER_D:
            inside |= np.uint64(3) << np.uint64(k)
            after |= _bit(k + 2)
        elif ((first == LOWER_R or first == LOWER_V) and second == LOWER_E) or (first == LOWER_L and second == LOWER_L):
            inside |= np.uint64(7) << np.uint64(k)
            after |= _bit(k + 3)
    return inside, after


@leaf_inline
def hangul_syllables(buf, base):
    """The first bytes of the Hangul syllables U+AC00-U+D77F that lie wholly in the window at ``base``."""
    full_lead, first_lead, last_lead, continuation, high_second, low_second = hangul_classes(buf, base)
    one = np.uint64(1)
    lead = full_lead | (first_lead & (high_second >> one)) | (last_lead & (low_second >> one))
    return lead & (continuation >> one) & (continuation >> np.uint64(2))


@leaf_inline
def _blanks_reaching(blank, stop):
    """The blanks from which a run of blanks reaches a byte of ``stop`` (within the window), as bits: the
    runs right before those bytes, found in six doubling steps."""
    reaches = blank & (stop >> np.uint64(1))
    through = blank  # bit k: the bits k.. k + step - 1 are all blanks
    step = np.uint64(1)
    for _ in range(6):
        reaches |= (reaches >> step) & through
        through &= through >> step
        step <<= np.uint64(1)
    return reaches


@leaf_inline
def han_ideographs(buf, base):
    """The first bytes of the Han ideographs U+3400-U+4DBF and U+4E00-U+9FFF that lie wholly in the window
    at ``base``."""
    full_lead, e3_lead, e4_lead, continuation, from_90, gap = han_classes(buf, base)
    one = np.uint64(1)
    lead = full_lead | (e3_lead & (from_90 >> one)) | (e4_lead & ~(gap >> one))
    return lead & (continuation >> one) & (continuation >> np.uint64(2))


@leaf_inline
def _window_starts(buf, base):
    """The piece starts in bits ``WINDOW_FIRST_BIT..limit`` of the window at ``base`` (whose bit
    ``WINDOW_LOOKBACK`` is a piece start), ``limit`` (< ``WINDOW_FIRST_BIT``: not here) and the bit of
    the first byte of a character the window does not class (``BLOCK_BYTES`` if none)."""
    high, upper, lower, digit, newline, space, blank, apostrophe = ascii_classes(buf, base)
    one = np.uint64(1)
    white = blank | newline
    limit = WINDOW_LAST_BIT
    unclassed_at = BLOCK_BYTES
    ideograph = han = unclassed = symbol_second = no_break_second = punctuation = both_cases = np.uint64(0)
    if high != 0:  # the characters of the lead groups below are classed; others end the window's starts
        latin1_leads, punctuation_leads, hangul_leads, han_leads, latin_extended_leads, greek_leads, cyrillic_leads, \
            additional_leads, kana_leads, fullwidth_leads, rtl_leads = lead_groups(buf, base)
        early = high & ~LOW_THREE_BITS & (_bit(WINDOW_FIRST_BIT + 2) - one)
        if early != 0:
            known = (latin1_leads | punctuation_leads | hangul_leads | han_leads | latin_extended_leads | greek_leads
                     | cyrillic_leads | additional_leads | kana_leads | fullwidth_leads | rtl_leads)
            if (known & _bit(lowest_set_bit(early))) == 0:  # the first character after the window's start
                return np.uint64(0), -1, 0  # no start could be final (Thai, Devanagari, ...)
        if latin1_leads != 0:
            lead, upper_tail, lower_tail, symbol_lead, symbol_tail, space_tail = latin1_classes(buf, base)
            upper_tail &= lead << one
            lower_tail &= lead << one
            upper |= upper_tail | (upper_tail >> one)
            lower |= lower_tail | (lower_tail >> one)
            symbol_second = symbol_tail & (symbol_lead << one)  # second bytes of two-byte symbols
            # no-break spaces (first bytes) with neither whitespace nor another one right before or after: each is
            # a blank that starts a piece, a prefix, and joins no symbol; its second byte starts nothing
            no_break = symbol_lead & (space_tail >> one)
            around = white | no_break | (no_break << one)
            no_break &= ~(around << one) & ~(around >> np.uint64(2))
            blank |= no_break
            white |= no_break | (no_break << one)
            no_break_second = no_break << one
        if latin_extended_leads != 0:
            first_upper, first_lower = latin_extended_classes(buf, base)
            upper |= first_upper | (first_upper << one)
            lower |= first_lower | (first_lower << one)
        if greek_leads != 0:
            first_upper, first_lower = greek_classes(buf, base)
            upper |= first_upper | (first_upper << one)
            lower |= first_lower | (first_lower << one)
        if cyrillic_leads != 0:
            first_upper, first_lower = cyrillic_classes(buf, base)
            upper |= first_upper | (first_upper << one)
            lower |= first_lower | (first_lower << one)
        if additional_leads != 0:
            first_upper, first_lower = extended_additional_classes(buf, base)
            upper |= first_upper | (first_upper << one) | (first_upper << np.uint64(2))
            lower |= first_lower | (first_lower << one) | (first_lower << np.uint64(2))
        if punctuation_leads != 0:  # three-byte symbols (first bytes)
            punct_lead, punct_second, punct_third = punctuation_classes(buf, base)
            punctuation = punct_lead & (punct_second >> one) & (punct_third >> np.uint64(2))
        if (kana_leads | fullwidth_leads) != 0:
            punctuation |= wide_symbols(buf, base)[0]
        if hangul_leads != 0:  # three-byte letters of both cases (first bytes)
            both_cases = hangul_syllables(buf, base)
        if kana_leads != 0:
            both_cases |= kana_letters(buf, base)[0]
        lower |= both_cases | (both_cases << one) | (both_cases << np.uint64(2))
        both_cases_ahead = both_cases << np.uint64(3)  # the byte after a three-byte letter of both cases
        if rtl_leads != 0:  # Hebrew and Arabic: two-byte letters of both cases, two-byte symbols
            rtl = rtl_letters(buf, base)[0]
            lower |= rtl | (rtl << one)
            both_cases_ahead |= rtl << np.uint64(2)
            symbol_second |= rtl_symbols(buf, base)[0] << one
        if han_leads != 0:
            ideograph = han_ideographs(buf, base)
            han = ideograph | (ideograph << one) | (ideograph << np.uint64(2))
        # bytes of other characters, or of ones the window's end cuts: a start needs the byte after it
        symbol_bytes = symbol_second | (symbol_second >> one) | punctuation | (punctuation << one) | (
            punctuation << np.uint64(2))
        unclassed = high & ~(upper | lower | han | symbol_bytes | white) & ~LOW_THREE_BITS
        if unclassed != 0:
            unclassed_at = lowest_set_bit(unclassed)
            limit = unclassed_at - 2
        ahead = both_cases_ahead & upper  # an uppercase letter right after a letter of both cases
        if ahead != 0:
            limit = min(limit, lowest_set_bit(ahead) - 1)
        if limit < WINDOW_FIRST_BIT:
            return np.uint64(0), -1, 0
    letter = upper | lower
    symbol = ~(letter | digit | white | han)
    if (white >> np.uint64(BLOCK_BYTES - 1)) != 0:  # a whitespace run going on past the window: only its start is final
        rest = ~white & (_bit(BLOCK_BYTES - 1) - one)
        limit = min(limit, highest_set_bit(rest) + 1) if rest != 0 else 0
    candidates = apostrophe & (letter << one) & ~LOW_THREE_BITS & ~_bit(WINDOW_LOOKBACK)
    inside = np.uint64(0)
    after = np.uint64(0)
    if candidates != 0:
        late = candidates >> np.uint64(WINDOW_LAST_BIT - 1)
        if late != 0:  # a contraction that may end past the window: stop before it
            limit = min(limit, WINDOW_LAST_BIT - 2 + lowest_set_bit(late))
            candidates &= _bit(WINDOW_LAST_BIT - 1) - one
        inside, after = _contractions(buf, base, candidates)
    symbol_start = symbol & ~(symbol << one) & ~(space << one)
    prefix_start = blank | ((symbol_start | after | FOURTH_BIT) & symbol)
    # a letter right after a prefix of one character goes with it: a prefix ends at its character's last byte
    two_byte_second = symbol_second | no_break_second
    prefix_last = ((prefix_start & ~((two_byte_second >> one) | punctuation))
                   | ((prefix_start << one) & two_byte_second) | ((prefix_start & punctuation) << np.uint64(2)))
    letter_start = letter & ((upper & (lower << one)) | (~(letter << one) & ~(prefix_last << one)))
    digit_start = (digit & ~(digit << one)) | (digit & FOURTH_BIT)
    digit_start &= ~LOW_THREE_BITS
    group = digit_start
    while group != 0:  # every third digit of a run
        group = (group << np.uint64(3)) & digit & (digit << one) & (digit << np.uint64(2))
        digit_start |= group
    # newlines right after symbols, but for a run from the window's first byte: a piece starts there (the bytes
    # before it, which this window may not class, end no symbol's piece past it)
    absorbed = newline & ~(newline + (newline & ((symbol & ~LOW_THREE_BITS) << one)))
    newline_start = newline & ~(white << one) & ~absorbed
    blank_start = blank & (~(white << one) | (newline << one) | ((blank << one) & ~(white >> one)))
    # a blank right after a newline starts a piece unless blanks from it reach another newline (whitespace's piece
    # ends at its run's last newline); where they reach a character the window does not class, which may be
    # whitespace (U+0085, U+00A0, U+3000, ...), that is not known here, and the window's starts end before it
    after_newline = blank & ((newline & ~absorbed) << one)
    if ((blank << one) & newline) != 0:
        blank_start &= ~(_blanks_reaching(blank, newline) & after_newline)
    if unclassed != 0 and after_newline != 0:
        unknown = _blanks_reaching(blank, unclassed) & after_newline & FINAL_BITS
        if unknown != 0:
            limit = min(limit, lowest_set_bit(unknown) - 1)
    han_start = ideograph & ~(han << one)  # a run of ideographs is a piece of its own
    starts = (letter_start | digit_start | symbol_start | newline_start | blank_start | han_start | after
              | FOURTH_BIT) & ~inside
    return starts & FINAL_BITS, limit, unclassed_at


@leaf_inline
def _scan_text_run(buf, start, end, table, piece_end, n_pieces):
    """The pieces of the text run ``buf[start:end]``: their ends from ``piece_end[n_pieces]`` on;
    returns the new count. Windows of 64 bytes where they fit, ``next_piece_end`` elsewhere."""
    pos = start
    next_window = start + WINDOW_LOOKBACK  # a window starts 3 bytes into the run, and ends inside it
    skip = BLOCK_BYTES
    while pos < end:
        if pos >= next_window and pos - WINDOW_LOOKBACK + BLOCK_BYTES <= end:
            base = pos - WINDOW_LOOKBACK
            starts, limit, unclassed_at = _window_starts(buf, base)
            if limit >= WINDOW_FIRST_BIT:
                if unclassed_at == BLOCK_BYTES:
                    skip = BLOCK_BYTES
                elif unclassed_at + sequence_length(buf[index(base + unclassed_at)]) <= BLOCK_BYTES:
                    next_window = base + unclassed_at + 1  # past a character windows do not class
                # else a character the window's end cuts: the next window, from this one's last start, holds it
                starts &= (_bit(limit + 1) - np.uint64(1))
                if starts != 0:
                    while starts != 0:
                        k = lowest_set_bit(starts)
                        starts &= starts - np.uint64(1)
                        piece_end[index(n_pieces)] = base + k
                        n_pieces += 1
                    pos = piece_end[index(n_pieces - 1)]
                    continue
            else:  # no window for a while (longer after each window that was not)
                next_window = base + skip
                skip = min(2 * skip, MAX_WINDOW_SKIP)
        pos = next_piece_end(buf, pos, end, table)
        piece_end[index(n_pieces)] = pos
        n_pieces += 1
    return n_pieces


@leaf
def _scan_all(buf, run_start, run_end, run_special, table, first_piece, piece_end):
    n_pieces = 0
    for r in range(run_start.shape[0]):
        first_piece[index(r)] = n_pieces
        if run_special[index(r)] >= 0:
            continue
        n_pieces = _scan_text_run(buf, run_start[index(r)], run_end[index(r)], table, piece_end, n_pieces)
    first_piece[index(run_start.shape[0])] = n_pieces
    return n_pieces


@kernel
def scan_runs(buf, run_start, run_end, run_special, table):
    """Pieces of every text run: ``(first_piece[n_runs + 1], piece_end[n_pieces])``."""
    first_piece = np.empty(run_start.shape[0] + 1, dtype=np.int64)
    piece_end = np.empty(max(count_text_bytes(run_start, run_end, run_special), 1), dtype=np.int64)
    n_pieces = _scan_all(buf, run_start, run_end, run_special, table, first_piece, piece_end)
    return first_piece, piece_end[:n_pieces]


@leaf
def _is_ascii_letter(byte):
    return (byte | ASCII_CASE_BIT) >= LOWER_A and (byte | ASCII_CASE_BIT) <= LOWER_Z


@leaf
def _safe_point_at_or_after(buf, i, end):
    """First ``p`` in ``[i, end)`` just after a newline and before an ASCII letter, or ``end``."""
    for p in range(max(i, 1), end):
        if buf[index(p - 1)] == LF and _is_ascii_letter(buf[index(p)]):
            return p
    return end


@leaf
def _split_all(buf, sub_start, sub_end, sub_allow, unit_bytes, unit_start, unit_end, unit_allow):
    n = 0
    for k in range(sub_start.shape[0]):
        start = sub_start[k]
        end = sub_end[k]
        while end - start > unit_bytes:
            p = _safe_point_at_or_after(buf, start + unit_bytes, end)
            if p == end:
                break
            unit_start[n], unit_end[n], unit_allow[n] = start, p, sub_allow[k]
            n += 1
            start = p
        unit_start[n], unit_end[n], unit_allow[n] = start, end, sub_allow[k]
        n += 1
    return n


@kernel
def split_at_safe_points(buf, sub_start, sub_end, sub_allow, unit_bytes):
    """Cut sub-strings into units of about ``unit_bytes`` where the Kimi pattern always cuts.

    Just after a newline and before an ASCII letter every piece ends: the piece
    holding the newline ends there (``\\s*[\\r\\n]+`` ends at the last newline of
    a whitespace run, `` ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*`` at the last newline after
    symbols, and no other alternative matches a newline), and a newline cannot
    prefix the letter's piece. So encoding the units one by one gives the same
    pieces, provided no special token contains a newline (the caller checks).
    Units let threads share one long sub-string.
    """
    total = 0
    for k in range(sub_start.shape[0]):
        total += sub_end[k] - sub_start[k]
    capacity = sub_start.shape[0] + total // unit_bytes + 1
    unit_start = np.empty(capacity, dtype=np.int64)
    unit_end = np.empty(capacity, dtype=np.int64)
    unit_allow = np.empty(capacity, dtype=np.bool_)
    n = _split_all(buf, sub_start, sub_end, sub_allow, unit_bytes, unit_start, unit_end, unit_allow)
    return unit_start[:n], unit_end[:n], unit_allow[:n]


class KimiScanner:
    """The Kimi K3 pattern, compiled (the pre-tokenizer of the Kimi pattern)."""

    pattern = KIMI_PATTERN
    splits_after_newline = True  # see split_at_safe_points

    def __init__(self) -> None:
        self.scan_table = in_huge_pages([code_point_flags()])[0]  # probed by code point: see hugepages.py

    def scan(self, buf, run_start, run_end, run_special):
        return scan_runs(buf, run_start, run_end, run_special, self.scan_table)
