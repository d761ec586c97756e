"""Any tiktoken-style pattern: translated to PCRE2 syntax and run with PCRE2 JIT.

tiktoken's patterns are written for the Rust ``regex``/``fancy-regex`` crates; ``to_pcre2``
translates the differences (class intersections, scripts, ``\\s``, ``$``). The pre-tokenizer
builds a Python object per match, so it is the path for patterns other than Kimi's, whose
compiled scanner the fused kernels run (``kimi_scanner``).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import pcre2

from .unicode_classes import WHITESPACE_CLASS

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
    scan_table = None  # pieces come from Python: the fused kernels cannot run it

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
