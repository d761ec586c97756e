"""SIMD for compiled code: 64 bytes classified at once into bit masks.

numba vectorizes plain loops, but a scanner needs per-byte classes as bits (bit ``k`` for byte
``at + k``) to find piece boundaries with word operations instead of a branch per byte.
``ascii_classes`` (with ``latin1_classes``, ``punctuation_classes``, ``latin_extended_classes``,
``greek_classes``, ``cyrillic_classes``, ``extended_additional_classes``, ``hangul_classes`` and
``han_classes``, ``kana_letters``, ``wide_symbols``, ``rtl_letters`` and ``rtl_symbols`` for characters beyond
ASCII, and ``lead_groups`` to tell which of those a block needs)
emit LLVM vector compares on one unaligned 64-byte load; LLVM lowers them to the machine's vector instructions
(AVX-512 mask compares, or AVX2 compares and ``vpmovmskb``).

The UTF-8 of a str's characters (``native.utf8``) takes two more: ``narrowed_block`` stores a block of code
units as bytes while they are ASCII, and ``utf8_block`` makes the UTF-8 of 16 of any width with one byte
compress where the CPU has one (``has_byte_compress``: AVX-512 VBMI2).
"""

from __future__ import annotations

from llvmlite import ir

from .jit import DeferredModule, intrinsic

types = DeferredModule("numba.core.types")  # read when numba types a call (it is imported by then)

BLOCK_BYTES = 64
N_CLASSES = 8  # the masks ascii_classes returns, in this order:
HIGH, UPPER, LOWER, DIGIT, NEWLINE, SPACE, BLANK, APOSTROPHE = range(N_CLASSES)


def _splat(value: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(8), BLOCK_BYTES), [value] * BLOCK_BYTES)


def _is_block_source(buf, at) -> bool:
    return (isinstance(buf, types.Array) and buf.dtype == types.uint8 and buf.layout == "C"
            and isinstance(at, types.Integer))


def _load_block(context, builder, sig, args):
    """The 64 bytes at ``buf[at]`` as one LLVM vector (an unaligned load)."""
    array = context.make_array(sig.args[0])(context, builder, args[0])
    offset = context.cast(builder, args[1], sig.args[1], types.intp)
    pointer = builder.gep(array.data, [offset])
    vector_type = ir.VectorType(ir.IntType(8), BLOCK_BYTES)
    return builder.load(builder.bitcast(pointer, vector_type.as_pointer()), align=1)


def _in_range(builder, v, low: int, count: int):
    return builder.icmp_unsigned("<", builder.sub(v, _splat(low)), _splat(count))


def _as_words(context, builder, sig, masks):
    """Vector compare results as a tuple of 64-bit words (bit ``k``: byte ``k``)."""
    words = [builder.bitcast(mask, ir.IntType(BLOCK_BYTES)) for mask in masks]
    return context.make_tuple(builder, sig.return_type, words)


def _block_masks(buf, at, count: int, masks_of):
    """An intrinsic's typing and codegen: ``count`` ``uint64`` masks of the 64 bytes at ``buf[at]``, each
    the bits of one vector compare that ``masks_of(builder, block)`` emits; None for other argument types."""
    if not _is_block_source(buf, at):
        return None

    def codegen(context, builder, sig, args):
        return _as_words(context, builder, sig, masks_of(builder, _load_block(context, builder, sig, args)))

    return types.UniTuple(types.uint64, count)(buf, at), codegen


@intrinsic
def ascii_classes(typingctx, buf, at):
    """Eight ``uint64`` masks of the 64 bytes ``buf[at:at + 64]`` (a C-contiguous ``uint8`` array; the
    caller keeps ``at + 64`` within it): bytes of 0x80 and up (``HIGH``), ``A-Z``, ``a-z``, ``0-9``,
    ``\\r`` or ``\\n``, the space, the ASCII blanks other than newlines (tab, vertical tab, form feed,
    space) and the apostrophe."""

    def masks_of(builder, v):
        def equal(byte: int):
            return builder.icmp_unsigned("==", v, _splat(byte))

        newline = builder.or_(equal(0x0A), equal(0x0D))
        space = equal(0x20)
        blank = builder.or_(builder.or_(space, equal(0x09)), builder.or_(equal(0x0B), equal(0x0C)))
        return [builder.icmp_signed("<", v, _splat(0)), _in_range(builder, v, 0x41, 26),
                _in_range(builder, v, 0x61, 26), _in_range(builder, v, 0x30, 10), newline, space, blank, equal(0x27)]

    return _block_masks(buf, at, N_CLASSES, masks_of)


LATIN1_LEAD = 0xC3  # the first byte of U+00C0-U+00FF, whose second bytes are 0x80-0xBF
MULTIPLY, DIVIDE = 0x97, 0xB7  # second bytes of U+00D7 and U+00F7 (symbols among the letters)
UPPER_TAIL, LOWER_TAIL = (0x80, 0x1F), (0x9F, 0x21)  # (first, count): U+00C0-U+00DE, U+00DF-U+00FF
LATIN1_SYMBOL_LEAD = 0xC2  # the first byte of U+0080-U+00BF
# second bytes of the symbols among U+00A1-U+00BF (neither letters, numbers nor White_Space), (first, count):
# U+00A1-U+00A9, U+00AB-U+00B1 (the guillemets, the soft hyphen), U+00B4, U+00B6-U+00B8, U+00BB, U+00BF; not
# U+00A0 (a space), U+00AA, U+00B5, U+00BA (letters), U+00B2, U+00B3, U+00B9, U+00BC-U+00BE (numbers)
LATIN1_SYMBOL_TAILS = ((0xA1, 9), (0xAB, 7), (0xB4, 1), (0xB6, 3), (0xBB, 1), (0xBF, 1))
NO_BREAK_SPACE_TAIL = 0xA0  # U+00A0 is C2 A0


@intrinsic
def latin1_classes(typingctx, buf, at):
    """Six ``uint64`` masks of the 64 bytes ``buf[at:at + 64]``, for the letters U+00C0-U+00FF
    (``C3 80``-``C3 BF`` in UTF-8; not U+00D7 and U+00F7, which are symbols) and the symbols among
    U+00A1-U+00BF (``C2 A1``-``C2 BF``, ``LATIN1_SYMBOL_TAILS``): bytes ``0xC3``, the second bytes of
    uppercase letters (``80``-``9E``) and those of lowercase ones (``9F``-``BF``), bytes ``0xC2``,
    the second bytes of those symbols and bytes ``A0`` (the no-break space's second byte). A second
    byte counts only where its first byte is right before it; the caller checks that."""

    def masks_of(builder, v):
        def not_equal(byte: int):
            return builder.icmp_unsigned("!=", v, _splat(byte))

        symbol_tail = _in_range(builder, v, *LATIN1_SYMBOL_TAILS[0])
        for first, count in LATIN1_SYMBOL_TAILS[1:]:
            symbol_tail = builder.or_(symbol_tail, _in_range(builder, v, first, count))
        return [builder.icmp_unsigned("==", v, _splat(LATIN1_LEAD)),
                builder.and_(_in_range(builder, v, *UPPER_TAIL), not_equal(MULTIPLY)),
                builder.and_(_in_range(builder, v, *LOWER_TAIL), not_equal(DIVIDE)),
                builder.icmp_unsigned("==", v, _splat(LATIN1_SYMBOL_LEAD)), symbol_tail,
                builder.icmp_unsigned("==", v, _splat(NO_BREAK_SPACE_TAIL))]

    return _block_masks(buf, at, 6, masks_of)


PUNCTUATION_LEAD, PUNCTUATION_SECOND = 0xE2, 0x80  # U+2000-U+203F
PUNCTUATION_THIRD = (0x90, 0x18)  # (first, count): U+2010-U+2027, dashes, quotation marks, bullets, the ellipsis


@intrinsic
def punctuation_classes(typingctx, buf, at):
    """Three ``uint64`` masks of the 64 bytes ``buf[at:at + 64]``, from which the caller finds the symbols
    U+2010-U+2027 (``E2 80 90``-``E2 80 A7``: neither letters, numbers nor White_Space; U+2028 and U+2029 are
    White_Space): bytes ``E2``, ``80`` and ``90``-``A7``."""
    return _block_masks(buf, at, 3, lambda builder, v: [
        builder.icmp_unsigned("==", v, _splat(PUNCTUATION_LEAD)),
        builder.icmp_unsigned("==", v, _splat(PUNCTUATION_SECOND)), _in_range(builder, v, *PUNCTUATION_THIRD)])


HANGUL_LEADS = (0xEB, 2)  # (first, count): EB and EC start U+B000-U+CFFF, all Hangul syllables
HANGUL_FIRST_LEAD, HANGUL_LAST_LEAD = 0xEA, 0xED  # ... EA with B0-BF (U+AC00-U+AFFF), ED with 80-9D (U+D000-U+D77F)
CONTINUATION, HIGH_CONTINUATION, LOW_CONTINUATION = (0x80, 0x40), (0xB0, 0x10), (0x80, 0x1E)


@intrinsic
def hangul_classes(typingctx, buf, at):
    """Six ``uint64`` masks of the 64 bytes ``buf[at:at + 64]``, from which the caller finds the
    Hangul syllables U+AC00-U+D77F (three bytes each; the rare U+D780-U+D7A3 are left out): bytes
    ``EB``-``EC``, ``EA``, ``ED``, continuation bytes (``80``-``BF``), ``B0``-``BF`` and ``80``-``9D``."""
    return _block_masks(buf, at, 6, lambda builder, v: [
        _in_range(builder, v, *HANGUL_LEADS), builder.icmp_unsigned("==", v, _splat(HANGUL_FIRST_LEAD)),
        builder.icmp_unsigned("==", v, _splat(HANGUL_LAST_LEAD)), _in_range(builder, v, *CONTINUATION),
        _in_range(builder, v, *HIGH_CONTINUATION), _in_range(builder, v, *LOW_CONTINUATION)])


HAN_LEADS = (0xE5, 5)  # (first, count): E5-E9 start U+5000-U+9FFF, all Han (Script=Han)
HAN_FIRST_LEAD, HAN_LAST_LEAD = 0xE3, 0xE9  # ... E3 with 90-BF (U+3400-U+3FFF), E4 but with B7 (U+4DC0-U+4DFF)
HAN_E4_GAP = 0xB7  # the second byte of E4 that starts the Yijing hexagrams, which are not Han
HAN_E3_SECOND = (0x90, 0x30)


@intrinsic
def han_classes(typingctx, buf, at):
    """Six ``uint64`` masks of the 64 bytes ``buf[at:at + 64]``, from which the caller finds the Han
    ideographs U+3400-U+4DBF and U+4E00-U+9FFF (three bytes each; every code point there is Script=Han):
    bytes ``E5``-``E9``, ``E3``, ``E4``, continuation bytes, ``90``-``BF`` and ``B7``."""
    return _block_masks(buf, at, 6, lambda builder, v: [
        _in_range(builder, v, *HAN_LEADS), builder.icmp_unsigned("==", v, _splat(HAN_FIRST_LEAD)),
        builder.icmp_unsigned("==", v, _splat(HAN_FIRST_LEAD + 1)), _in_range(builder, v, *CONTINUATION),
        _in_range(builder, v, *HAN_E3_SECOND), builder.icmp_unsigned("==", v, _splat(HAN_E4_GAP))])


UPPER, LOWER, EVEN, ODD = range(4)  # a letter range's case: upper, lower, or upper where the code point is even / odd
# Letters beyond Latin-1 that windows class, as (lead byte, first second byte, count, case); a two-byte code point's
# parity is its second byte's. Neither marks nor letters of both cases (Lm, Lo) are among them.
# Latin Extended-A (U+0100-U+017E; not U+017F, long s, which (?i) folds to s), and from Latin Extended-B the
# Vietnamese O and U with horn and the Romanian S and T with comma
LATIN_EXTENDED_LETTERS = (
    (0xC4, 0x80, 0x38, EVEN), (0xC4, 0xB8, 1, LOWER), (0xC4, 0xB9, 7, ODD), (0xC5, 0x80, 9, ODD),
    (0xC5, 0x89, 1, LOWER), (0xC5, 0x8A, 0x2E, EVEN), (0xC5, 0xB8, 1, UPPER), (0xC5, 0xB9, 6, ODD),
    (0xC6, 0xA0, 2, EVEN), (0xC6, 0xAF, 1, UPPER), (0xC6, 0xB0, 1, LOWER), (0xC8, 0x98, 4, EVEN),
)
GREEK_LETTERS = (  # U+0386-U+03CF
    (0xCE, 0x86, 1, UPPER), (0xCE, 0x88, 3, UPPER), (0xCE, 0x8C, 1, UPPER), (0xCE, 0x8E, 2, UPPER),
    (0xCE, 0x90, 1, LOWER), (0xCE, 0x91, 0x11, UPPER), (0xCE, 0xA3, 9, UPPER), (0xCE, 0xAC, 0x14, LOWER),
    (0xCF, 0x80, 0xF, LOWER), (0xCF, 0x8F, 1, UPPER),
)
CYRILLIC_LETTERS = (  # U+0400-U+0481, U+048A-U+04FF
    (0xD0, 0x80, 0x30, UPPER), (0xD0, 0xB0, 0x10, LOWER), (0xD1, 0x80, 0x20, LOWER), (0xD1, 0xA0, 0x20, EVEN),
    (0xD2, 0x80, 2, EVEN), (0xD2, 0x8A, 0x36, EVEN), (0xD3, 0x80, 1, UPPER), (0xD3, 0x81, 0xE, ODD),
    (0xD3, 0x8F, 1, LOWER), (0xD3, 0x90, 0x30, EVEN),
)
# Latin Extended Additional (U+1E00-U+1EFF, ``E1 B8 80``-``E1 BB BF``: Vietnamese), as (second byte, first third
# byte, count, case); the code point's parity is its third byte's
EXTENDED_ADDITIONAL_LEAD = 0xE1
EXTENDED_ADDITIONAL_LETTERS = (
    (0xB8, 0x80, 0x40, EVEN), (0xB9, 0x80, 0x40, EVEN), (0xBA, 0x80, 0x16, EVEN), (0xBA, 0x96, 8, LOWER),
    (0xBA, 0x9E, 1, UPPER), (0xBA, 0x9F, 1, LOWER), (0xBA, 0xA0, 0x20, EVEN), (0xBB, 0x80, 0x40, EVEN),
)
# Two-byte characters as (lead byte, first second byte, count): the Hebrew and Arabic letters (Lo, Lm: both cases,
# which windows take as Hangul syllables; not the marks) and their punctuation (with U+0600-U+060F, symbols too)
RTL_LETTERS = (
    (0xD7, 0x90, 0x1B), (0xD7, 0xAF, 4),  # U+05D0-U+05EA, U+05EF-U+05F2
    (0xD8, 0xA0, 0x20), (0xD9, 0x80, 0xB), (0xD9, 0xAE, 2), (0xD9, 0xB1, 0xF),  # U+0620-U+064A, U+066E-U+067F
    (0xDA, 0x80, 0x40), (0xDB, 0x80, 0x14), (0xDB, 0x95, 1), (0xDB, 0xA5, 2), (0xDB, 0xAE, 2), (0xDB, 0xBA, 3),
    (0xDB, 0xBF, 1),  # U+0680-U+06D3 and the letters among U+06D5-U+06FF
)
RTL_SYMBOLS = (
    (0xD6, 0xBE, 1), (0xD7, 0x80, 1), (0xD7, 0x83, 1), (0xD7, 0x86, 1), (0xD7, 0xB3, 2),  # maqaf, sof pasuq, geresh
    (0xD8, 0x80, 0x10), (0xD8, 0x9B, 5), (0xD9, 0xAA, 4), (0xDB, 0x94, 1),  # U+0600-U+060F, ؛ ؟ ٪ ۔
)
# Three-byte characters as (lead byte, second byte, first third byte, count). Kana: letters of both cases (Lo, Lm),
# which windows take as Hangul syllables; not the voicing marks U+3099-U+309A (marks are letters in a word and
# symbols after a symbol: `)゙` is one piece)
KANA_LEAD, FULLWIDTH_LEAD = 0xE3, 0xEF
KANA = (
    (KANA_LEAD, 0x81, 0x81, 0x3F), (KANA_LEAD, 0x82, 0x80, 0x17),  # U+3041-U+3096 hiragana
    (KANA_LEAD, 0x82, 0x9D, 3),  # U+309D-U+309F iteration marks, digraph yori
    (KANA_LEAD, 0x82, 0xA1, 0x1F), (KANA_LEAD, 0x83, 0x80, 0x3B), (KANA_LEAD, 0x83, 0xBC, 4),  # katakana
)
# CJK and full-width symbols: neither letters, numbers nor White_Space (not U+3000, the ideographic space)
WIDE_SYMBOLS = (
    (KANA_LEAD, 0x80, 0x81, 4), (KANA_LEAD, 0x80, 0x88, 0x19),  # U+3001-U+3004, U+3008-U+3020: 、。「」【】〜 ...
    (KANA_LEAD, 0x82, 0x9B, 2), (KANA_LEAD, 0x82, 0xA0, 1), (KANA_LEAD, 0x83, 0xBB, 1),  # ゛゜ ゠ ・
    (FULLWIDTH_LEAD, 0xBC, 0x81, 0xF), (FULLWIDTH_LEAD, 0xBC, 0x9A, 7),  # U+FF01-U+FF0F, U+FF1A-U+FF20: ！（），：？
    (FULLWIDTH_LEAD, 0xBC, 0xBB, 5), (FULLWIDTH_LEAD, 0xBD, 0x80, 1), (FULLWIDTH_LEAD, 0xBD, 0x9B, 0xB),
)
# Lead bytes, as (first, count), of the characters each class intrinsic finds, in the order lead_groups gives them
LEAD_GROUPS = (
    (LATIN1_SYMBOL_LEAD, 2),  # latin1_classes: C2, C3
    (PUNCTUATION_LEAD, 1),  # punctuation_classes
    (HANGUL_FIRST_LEAD, HANGUL_LAST_LEAD - HANGUL_FIRST_LEAD + 1),  # hangul_classes
    (HAN_FIRST_LEAD, HAN_LAST_LEAD - HAN_FIRST_LEAD + 1),  # han_classes
    (0xC4, 5),  # latin_extended_classes: C4-C8
    (0xCE, 2),  # greek_classes
    (0xD0, 4),  # cyrillic_classes
    (EXTENDED_ADDITIONAL_LEAD, 1),  # extended_additional_classes
    (KANA_LEAD, 1),  # kana_letters, wide_symbols
    (FULLWIDTH_LEAD, 1),  # wide_symbols
    (0xD6, 6),  # rtl_letters, rtl_symbols: D6-DB
)
N_LEAD_GROUPS = len(LEAD_GROUPS)


@intrinsic
def lead_groups(typingctx, buf, at):
    """``N_LEAD_GROUPS`` ``uint64`` masks of the 64 bytes ``buf[at:at + 64]``: the bytes of each range of
    ``LEAD_GROUPS``, which tell which class intrinsics a window needs."""
    return _block_masks(buf, at, N_LEAD_GROUPS, lambda builder, v: [
        _in_range(builder, v, first, count) for first, count in LEAD_GROUPS])


def _next_bytes(builder, v, n: int):
    """The block shifted down by ``n`` lanes: lane ``k`` holds byte ``k + n`` (zero past the block)."""
    lanes = ir.VectorType(ir.IntType(32), BLOCK_BYTES)
    return builder.shuffle_vector(v, _splat(0), ir.Constant(lanes, [k + n for k in range(BLOCK_BYTES)]))


def _either(builder, mask, other):
    return other if mask is None else mask if other is None else builder.or_(mask, other)


def _cased(builder, ranges, lead_of, tail):
    """(upper, lower) lane masks of the letters ``ranges`` describes, at their first bytes: ``lead_of(lead)`` the
    lanes whose letter starts with ``lead``, ``tail`` the byte that picks the letter (its parity the case)."""
    leads = {}
    upper = lower = None
    odd = builder.icmp_unsigned("!=", builder.and_(tail, _splat(1)), _splat(0))
    for lead, first, count, case in ranges:
        if lead not in leads:
            leads[lead] = lead_of(lead)
        hit = builder.and_(leads[lead], _in_range(builder, tail, first, count))
        if case == UPPER:
            upper = _either(builder, upper, hit)
        elif case == LOWER:
            lower = _either(builder, lower, hit)
        else:
            even_hit, odd_hit = builder.and_(hit, builder.not_(odd)), builder.and_(hit, odd)
            upper = _either(builder, upper, even_hit if case == EVEN else odd_hit)
            lower = _either(builder, lower, odd_hit if case == EVEN else even_hit)
    return [upper, lower]


def _two_byte_letters(buf, at, ranges):
    return _block_masks(buf, at, 2, lambda builder, v: _cased(
        builder, ranges, lambda lead: builder.icmp_unsigned("==", v, _splat(lead)), _next_bytes(builder, v, 1)))


@intrinsic
def latin_extended_classes(typingctx, buf, at):
    """Two ``uint64`` masks of the 64 bytes ``buf[at:at + 64]``: the first bytes of the uppercase and of the
    lowercase letters ``LATIN_EXTENDED_LETTERS`` lists (where both bytes lie in the 64)."""
    return _two_byte_letters(buf, at, LATIN_EXTENDED_LETTERS)


@intrinsic
def greek_classes(typingctx, buf, at):
    """As ``latin_extended_classes``, for ``GREEK_LETTERS``."""
    return _two_byte_letters(buf, at, GREEK_LETTERS)


@intrinsic
def cyrillic_classes(typingctx, buf, at):
    """As ``latin_extended_classes``, for ``CYRILLIC_LETTERS`` (apart from Greek's: computing both where either
    is read Greek 15% and Russian 5-10% slower in the scanner)."""
    return _two_byte_letters(buf, at, CYRILLIC_LETTERS)


@intrinsic
def extended_additional_classes(typingctx, buf, at):
    """As ``latin_extended_classes``, for the three-byte ``EXTENDED_ADDITIONAL_LETTERS``."""

    def masks_of(builder, v):
        second, third = _next_bytes(builder, v, 1), _next_bytes(builder, v, 2)
        lead = builder.and_(builder.icmp_unsigned("==", v, _splat(EXTENDED_ADDITIONAL_LEAD)),
                            _in_range(builder, third, *CONTINUATION))
        return _cased(builder, EXTENDED_ADDITIONAL_LETTERS,
                      lambda s: builder.and_(lead, builder.icmp_unsigned("==", second, _splat(s))), third)

    return _block_masks(buf, at, 2, masks_of)


def _characters(buf, at, ranges):
    """An intrinsic's typing and codegen: one mask, the first bytes of the characters ``ranges`` lists, each range
    as (lead byte, the second byte if the characters have three, first last byte, count)."""

    def masks_of(builder, v):
        bytes_at = [v, _next_bytes(builder, v, 1), _next_bytes(builder, v, 2)]
        found = None
        for *fixed, first, count in ranges:
            hit = _in_range(builder, bytes_at[len(fixed)], first, count)
            for k, byte in enumerate(fixed):
                hit = builder.and_(hit, builder.icmp_unsigned("==", bytes_at[k], _splat(byte)))
            found = _either(builder, found, hit)
        return [found]

    return _block_masks(buf, at, 1, masks_of)


@intrinsic
def rtl_letters(typingctx, buf, at):
    """One ``uint64`` mask (a tuple of one) of the 64 bytes ``buf[at:at + 64]``: the first bytes of the Hebrew and
    Arabic letters ``RTL_LETTERS`` lists (where both bytes lie in the 64)."""
    return _characters(buf, at, RTL_LETTERS)


@intrinsic
def rtl_symbols(typingctx, buf, at):
    """As ``rtl_letters``, for the symbols ``RTL_SYMBOLS`` lists."""
    return _characters(buf, at, RTL_SYMBOLS)


@intrinsic
def kana_letters(typingctx, buf, at):
    """One ``uint64`` mask (a tuple of one) of the 64 bytes ``buf[at:at + 64]``: the first bytes of the kana
    ``KANA`` lists (where the whole character lies in the 64)."""
    return _characters(buf, at, KANA)


@intrinsic
def wide_symbols(typingctx, buf, at):
    """As ``kana_letters``, for the symbols ``WIDE_SYMBOLS`` lists."""
    return _characters(buf, at, WIDE_SYMBOLS)


def _zero_count(builder, word, name: str):
    """LLVM's ``cttz``/``ctlz`` of a nonzero 64-bit word (zero is undefined: one instruction)."""
    flag = ir.IntType(1)
    fn = builder.module.declare_intrinsic(name, [ir.IntType(64), flag])
    return builder.call(fn, [word, ir.Constant(flag, 1)])


def _is_word(word) -> bool:
    return isinstance(word, types.Integer) and word.bitwidth == 64


@intrinsic
def lowest_set_bit(typingctx, word):
    """The index of the lowest set bit of a nonzero ``uint64`` (``tzcnt``)."""
    if not _is_word(word):
        return None
    return types.int64(word), lambda context, builder, sig, args: _zero_count(builder, args[0], "llvm.cttz")


@intrinsic
def highest_set_bit(typingctx, word):
    """The index of the highest set bit of a nonzero ``uint64`` (63 - ``lzcnt``)."""
    if not _is_word(word):
        return None

    def codegen(context, builder, sig, args):
        return builder.sub(ir.Constant(ir.IntType(64), 63), _zero_count(builder, args[0], "llvm.ctlz"))

    return types.int64(word), codegen


def _is_transcoding(units, at, out, out_at) -> bool:
    """Whether the arguments are code units (a C-contiguous ``uint8``, ``uint16`` or ``uint32`` array, as a str
    stores its characters), an index, a C-contiguous ``uint8`` output and an index in it."""
    return (isinstance(units, types.Array) and units.dtype in (types.uint8, types.uint16, types.uint32)
            and units.layout == "C" and isinstance(out, types.Array) and out.dtype == types.uint8
            and out.layout == "C" and isinstance(at, types.Integer) and isinstance(out_at, types.Integer))


def _units_and_target(context, builder, sig, args, lanes: int):
    """``(the lanes units at units[at] as one vector (an unaligned load), a pointer to out[out_at])`` for the
    arguments ``_is_transcoding`` accepts."""
    source = context.make_array(sig.args[0])(context, builder, args[0])
    target = context.make_array(sig.args[2])(context, builder, args[2])
    first = context.cast(builder, args[1], sig.args[1], types.intp)
    into = context.cast(builder, args[3], sig.args[3], types.intp)
    vector = ir.VectorType(ir.IntType(sig.args[0].dtype.bitwidth), lanes)
    v = builder.load(builder.bitcast(builder.gep(source.data, [first]), vector.as_pointer()), align=1)
    return v, builder.gep(target.data, [into])


@intrinsic
def narrowed_block(typingctx, units, at, out, out_at):
    """The 64 bytes of code units ``units[at:]`` (a C-contiguous ``uint8``, ``uint16`` or ``uint32`` array:
    64, 32 or 16 units) stored at ``out[out_at:]`` as their low bytes (a ``uint8`` array; the caller keeps
    both in bounds); returns a ``uint64`` mask of the units that are not ASCII (bit ``k``: unit ``at + k``),
    whose stored bytes mean nothing."""
    if not _is_transcoding(units, at, out, out_at):
        return None
    width = units.dtype.bitwidth
    lanes = BLOCK_BYTES * 8 // width

    def codegen(context, builder, sig, args):
        v, pointer = _units_and_target(context, builder, sig, args, lanes)
        high = builder.icmp_unsigned(">=", v, ir.Constant(v.type, [0x80] * lanes))
        low_bytes = builder.trunc(v, ir.VectorType(ir.IntType(8), lanes)) if width > 8 else v
        builder.store(low_bytes, builder.bitcast(pointer, low_bytes.type.as_pointer()), align=1)
        return builder.zext(builder.bitcast(high, ir.IntType(lanes)), ir.IntType(64))

    return types.uint64(units, at, out, out_at), codegen


UTF8_BLOCK_UNITS = 16  # code units a utf8_block transcodes: 16 lanes of 32 bits, at most 64 UTF-8 bytes
BYTE_COMPRESS_FEATURE = "+avx512vbmi2"  # vpcompressb


def _compiles_byte_compress(context) -> bool:
    """Whether the kernels are compiled for a CPU with AVX-512 VBMI2 (the features numba's codegen targets,
    ``NUMBA_CPU_FEATURES`` included)."""
    features = getattr(context.codegen(), "_tm_features", "") or ""
    return BYTE_COMPRESS_FEATURE in features.split(",")


def kernels_have_byte_compress() -> bool:
    """``has_byte_compress`` from Python (numba loaded): whether the kernels are compiled for AVX-512 VBMI2."""
    from numba.core.registry import cpu_target

    return _compiles_byte_compress(cpu_target.target_context)


@intrinsic
def has_byte_compress(typingctx):
    """A compile-time constant: whether ``utf8_block`` is one vector byte compress (AVX-512 VBMI2) on the CPU
    the kernels are compiled for. Elsewhere LLVM emits ``utf8_block`` as a branch per byte, so callers take
    it only where this is true (the other branch is compiled away)."""

    def codegen(context, builder, sig, args):
        return ir.Constant(ir.IntType(1), int(_compiles_byte_compress(context)))

    return types.boolean(), codegen


def _function(builder, name: str, return_type, arg_types):
    """The function ``name`` of the builder's module, declared if it is not yet."""
    try:
        return builder.module.get_global(name)
    except KeyError:
        return ir.Function(builder.module, ir.FunctionType(return_type, arg_types), name)


def _splat32(value: int) -> ir.Constant:
    return ir.Constant(ir.VectorType(ir.IntType(32), UTF8_BLOCK_UNITS), [value] * UTF8_BLOCK_UNITS)


def _utf8_lanes(builder, c):
    """Each code point of the ``<16 x i32>`` vector ``c`` as its UTF-8 in the low bytes of its lane (little
    endian: the lead byte lowest), and a lane of 0xFF for each byte that is part of it."""
    def tail(shift: int):  # a continuation byte: 10xxxxxx of the bits from `shift` up
        bits = builder.lshr(c, _splat32(shift)) if shift else c
        return builder.or_(builder.and_(bits, _splat32(0x3F)), _splat32(0x80))

    def lead(marker: int, shift: int):
        return builder.or_(builder.lshr(c, _splat32(shift)), _splat32(marker))

    def at(byte, k: int):
        return builder.shl(byte, _splat32(8 * k)) if k else byte

    two = builder.or_(lead(0xC0, 6), at(tail(0), 1))
    three = builder.or_(builder.or_(lead(0xE0, 12), at(tail(6), 1)), at(tail(0), 2))
    four = builder.or_(builder.or_(lead(0xF0, 18), at(tail(12), 1)), builder.or_(at(tail(6), 2), at(tail(0), 3)))
    below = [builder.icmp_unsigned("<", c, _splat32(end)) for end in (0x80, 0x800, 0x10000)]
    encoded = builder.select(below[0], c, builder.select(below[1], two, builder.select(below[2], three, four)))
    kept = builder.select(below[0], _splat32(0xFF), builder.select(
        below[1], _splat32(0xFFFF), builder.select(below[2], _splat32(0xFFFFFF), _splat32(-1))))
    return encoded, kept


@intrinsic
def utf8_block(typingctx, units, at, out, out_at):
    """The UTF-8 of the 16 code units ``units[at:at + 16]`` (a C-contiguous ``uint8``, ``uint16`` or ``uint32``
    array, as a str stores its characters) stored at ``out[out_at:]`` (a ``uint8`` array with 64 bytes from
    ``out_at``; the bytes past the UTF-8 mean nothing); returns the UTF-8's length, or -1 when a unit is a
    surrogate (which UTF-8 cannot encode). Each unit becomes one to four bytes in a 32-bit lane and one byte
    compress keeps the bytes in use (``has_byte_compress`` says whether that is one instruction)."""
    if not _is_transcoding(units, at, out, out_at):
        return None
    width = units.dtype.bitwidth

    def codegen(context, builder, sig, args):
        v, pointer = _units_and_target(context, builder, sig, args, UTF8_BLOCK_UNITS)
        c = builder.zext(v, ir.VectorType(ir.IntType(32), UTF8_BLOCK_UNITS)) if width < 32 else v
        encoded, kept = _utf8_lanes(builder, c)
        byte_vector = ir.VectorType(ir.IntType(8), BLOCK_BYTES)
        keep = builder.icmp_unsigned("!=", builder.bitcast(kept, byte_vector), ir.Constant(byte_vector, [0] * 64))
        data = builder.bitcast(encoded, byte_vector)
        if _compiles_byte_compress(context):
            compress = _function(builder, "llvm.x86.avx512.mask.compress.v64i8", byte_vector,
                                 [byte_vector, byte_vector, keep.type])
            packed = builder.call(compress, [data, ir.Constant(byte_vector, [0] * 64), keep])
            builder.store(packed, builder.bitcast(pointer, byte_vector.as_pointer()), align=1)
        else:  # correct anywhere, one branch per byte: has_byte_compress keeps callers off it
            compress = _function(builder, "llvm.masked.compressstore.v64i8", ir.VoidType(),
                                 [byte_vector, pointer.type, keep.type])
            builder.call(compress, [data, pointer, keep])
        word = ir.IntType(64)
        count = builder.call(builder.module.declare_intrinsic("llvm.ctpop", [word]), [builder.bitcast(keep, word)])
        surrogate = builder.icmp_unsigned("==", builder.and_(c, _splat32(0xFFFFF800)), _splat32(0xD800))
        any_surrogate = builder.icmp_unsigned("!=", builder.bitcast(surrogate, ir.IntType(UTF8_BLOCK_UNITS)),
                                              ir.Constant(ir.IntType(UTF8_BLOCK_UNITS), 0))
        return builder.select(any_surrogate, ir.Constant(word, -1), count)

    return types.int64(units, at, out, out_at), codegen
