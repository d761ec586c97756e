"""Pre-tokenization: cut text runs into the pieces that BPE merges.

Two interchangeable pre-tokenizers read the same input (a UTF-8 buffer and the
text runs between special tokens) and write the same output (piece end offsets
per run, CSR style):

* ``KimiScanner`` - the Kimi K3 pattern as a compiled numba scanner. Each regex
  alternative is one small function below; character classes come from the
  PCRE2-generated flag table (``unicode_classes``). No regex engine and no Python
  object per piece. Proven identical to the PCRE2 JIT regex by the tests.
* ``RegexPreTokenizer`` - any tiktoken-style pattern, translated to PCRE2 syntax
  (``to_pcre2``) and run with PCRE2 JIT through the ``pcre2`` package. Generic but
  it builds a Python object per match: the fallback for non-Kimi patterns.

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

from functools import lru_cache

import numpy as np
import pcre2

from .hugepages import in_huge_pages
from .jit import index, kernel, leaf, leaf_inline
from .unicode_classes import (
    HAN,
    HAN_CLASS,
    LETTER,
    LOWERISH,
    NUMBER,
    UPPERISH,
    WHITESPACE,
    WHITESPACE_CLASS,
    code_point_flags,
)
from .utf8 import ASCII_END, code_point_at, sequence_length

KIMI_PATTERN = (
    r"[\p{Han}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)

NO_MATCH = -1
CR = 0x0D
LF = 0x0A
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


# ---------------------------------------------------------------------------
# The compiled Kimi scanner
# ---------------------------------------------------------------------------


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
    """The common ASCII pieces, matched byte by byte: a word with an optional prefix (2-3) and a
    digit group (4). ``NO_MATCH`` for anything else, or where a non-ASCII byte could change the
    match: the caller then runs the alternatives in order (and finds the same piece for these)."""
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
    return NO_MATCH


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


@leaf
def _scan_all(buf, run_start, run_end, run_special, table, first_piece, piece_end):
    n_pieces = 0
    for r in range(run_start.shape[0]):
        first_piece[index(r)] = n_pieces
        if run_special[index(r)] >= 0:
            continue
        i = run_start[index(r)]
        end = run_end[index(r)]
        while i < end:
            i = next_piece_end(buf, i, end, table)
            piece_end[index(n_pieces)] = i
            n_pieces += 1
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
    """The Kimi K3 pattern, compiled (the default for the Kimi pattern)."""

    pattern = KIMI_PATTERN
    splits_after_newline = True  # see split_at_safe_points

    def __init__(self) -> None:
        self.table = in_huge_pages([code_point_flags()])[0]  # probed by code point: see hugepages.py

    def scan(self, buf, run_start, run_end, run_special):
        return scan_runs(buf, run_start, run_end, run_special, self.table)


# ---------------------------------------------------------------------------
# Generic patterns: translation to PCRE2 and the PCRE2 JIT pre-tokenizer
# ---------------------------------------------------------------------------

GENERAL_CATEGORIES = {
    "L", "Lu", "Ll", "Lt", "Lm", "Lo", "M", "Mn", "Mc", "Me", "N", "Nd", "Nl", "No",
    "P", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "S", "Sm", "Sc", "Sk", "So",
    "Z", "Zs", "Zl", "Zp", "C", "Cc", "Cf", "Cs", "Co", "Cn", "Any",
    "Letter", "Mark", "Number", "Punctuation", "Symbol", "Separator", "Other",
}
WORD_CLASS_ITEMS = r"\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}"  # Rust regex's \w


def _property(name: str, negated: bool) -> str:
    """``\\p{Han}`` means Script=Han for tiktoken but Script_Extensions for PCRE2."""
    if name not in GENERAL_CATEGORIES and ":" not in name and "=" not in name:
        try:
            pcre2.compile(rf"\p{{sc:{name}}}")
            name = f"sc:{name}"
        except pcre2.error:
            pass
    return ("\\P{" if negated else "\\p{") + name + "}"


def _escape(pattern: str, i: int, in_class: bool) -> tuple[str, int]:
    """Translate the escape at ``pattern[i] == '\\'``; returns (text, next index)."""
    c = pattern[i + 1]
    if c in "pP":
        if pattern[i + 2] == "{":
            close = pattern.index("}", i + 3)
            return _property(pattern[i + 3 : close], c == "P"), close + 1
        return _property(pattern[i + 2], c == "P"), i + 3
    if c == "s":
        return WHITESPACE_CLASS, i + 2
    if c == "S":
        return WHITESPACE_CLASS.replace("\\p", "\\P"), i + 2
    if c == "d":
        return r"\p{Nd}", i + 2
    if c == "D":
        return r"\P{Nd}", i + 2
    if c == "w":
        return (WORD_CLASS_ITEMS if in_class else f"[{WORD_CLASS_ITEMS}]"), i + 2
    if c == "W":
        if in_class:
            raise ValueError(r"pattern: \W inside a character class is not supported")
        return f"[^{WORD_CLASS_ITEMS}]", i + 2
    if c == "x" and pattern[i + 2] == "{":
        close = pattern.index("}", i + 3)
        return _literal(chr(int(pattern[i + 3 : close], 16))), close + 1
    return pattern[i : i + 2], i + 2


def _literal(ch: str) -> str:
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x80 else ch


def _class_end(pattern: str, i: int) -> int:
    """Index just after the character class opening at ``pattern[i] == '['``."""
    depth = 0
    j = i
    while j < len(pattern):
        c = pattern[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            depth += 1
            if pattern[j + 1 : j + 2] == "^":
                j += 1
            if pattern[j + 1 : j + 2] == "]":
                j += 1  # a leading ']' is literal
        elif c == "]":
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise ValueError(f"pattern: unterminated character class at offset {i}")


def _split_top_level(body: str, sep: str) -> list[str]:
    parts, depth, j, last = [], 0, 0, 0
    while j < len(body):
        c = body[j]
        if c == "\\":
            j += 2
            continue
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        elif depth == 0 and body.startswith(sep, j):
            parts.append(body[last:j])
            j += len(sep)
            last = j
            continue
        j += 1
    parts.append(body[last:])
    return parts


def _translate_class(cls: str) -> str:
    """``[...]`` in Rust syntax -> PCRE2; ``&&`` becomes an extended class ``(?[ a & b ])``."""
    negated = cls.startswith("[^")
    body = cls[2:-1] if negated else cls[1:-1]
    operands = _split_top_level(body, "&&")
    if len(operands) > 1:
        if negated:
            raise ValueError("pattern: a negated class with && is not supported")
        parts = [_translate_class(op if _is_whole_class(op) else f"[{op}]") for op in operands]
        return "(?[ " + " & ".join(parts) + " ])"
    out, j = [], 0
    while j < len(body):
        c = body[j]
        if c == "\\":
            text, j = _escape(body, j, in_class=True)
            out.append(text)
        elif c == "[":
            end = _class_end(body, j)
            out.append(_translate_class(body[j:end]))
            j = end
        else:
            out.append(c)
            j += 1
    return ("[^" if negated else "[") + "".join(out) + "]"


def _is_whole_class(text: str) -> bool:
    return text.startswith("[") and _class_end(text, 0) == len(text)


def to_pcre2(pattern: str) -> str:
    """Translate a tiktoken (Rust ``regex``/``fancy-regex``) pattern to PCRE2 syntax.

    Differences handled: ``&&`` class intersections (PCRE2 extended classes),
    ``\\p{Script}`` (Script, not Script_Extensions), ``\\s`` (Unicode White_Space,
    without U+180E), Unicode ``\\d``/``\\w``, ``\\x{...}`` and ``$`` (end of text).

    >>> to_pcre2(r"\\p{Han}+|\\s+")
    '\\\\p{sc:Han}+|\\\\p{White_Space}+'
    """
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            text, i = _escape(pattern, i, in_class=False)
            out.append(text)
        elif c == "[":
            end = _class_end(pattern, i)
            out.append(_translate_class(pattern[i:end]))
            i = end
        elif c == "$":
            out.append(r"\z")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


@lru_cache(maxsize=32)
def compile_pcre2(pattern: str):
    """The tiktoken ``pattern`` compiled with PCRE2 JIT; ``ValueError`` if it does not compile."""
    try:
        return pcre2.compile(to_pcre2(pattern), jit=True)
    except (pcre2.error, ValueError, IndexError) as e:
        raise ValueError(f"pattern does not compile for PCRE2: {e}") from None


class RegexPreTokenizer:
    """Any tiktoken-style pattern through PCRE2 JIT (one Python object per match)."""

    splits_after_newline = False  # nothing is proven for an arbitrary pattern

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        self.regex = compile_pcre2(pattern)

    def split(self, text: str) -> list[str]:
        """The pieces of ``text`` (for tests and teaching)."""
        return [m.group() for m in self.regex.finditer(text)]

    def scan(self, buf, run_start, run_end, run_special):
        n_runs = run_start.shape[0]
        first_piece = np.empty(n_runs + 1, dtype=np.int64)
        ends: list[int] = []
        raw = buf.tobytes()
        for r in range(n_runs):
            first_piece[r] = len(ends)
            if run_special[r] >= 0:
                continue
            offset = int(run_start[r])
            for piece in self.split(raw[offset : int(run_end[r])].decode("utf-8")):
                offset += len(piece.encode("utf-8"))
                ends.append(offset)
        first_piece[n_runs] = len(ends)
        return first_piece, np.array(ends, dtype=np.int64)


def pretokenizer_for(pattern: str):
    """The compiled scanner for the Kimi pattern, PCRE2 JIT for any other."""
    if pattern == KIMI_PATTERN:
        return KimiScanner()
    return RegexPreTokenizer(pattern)

