"""Differential stress run: random hostile segment lists, kimi_tok vs the tiktoken reference.

    python -m bench.stress --minutes 5            # the long run (prints inputs tried, mismatches)
    python -m bench.stress --seconds 20 --seed 7  # a short one

Every input is a random list of ``(text, allow_special)`` segments mixing scripts, every
kind of whitespace (``str.isspace`` and look-alikes that are not), digits, contractions,
punctuation, combining marks, emoji, Han, special-token text (allowed or not, and near
misses), U+0000, noncharacters, private use, lone surrogates and surrogate pairs written as
two code points, and long runs of one kind at 25,000 +- a few characters or whole segments
of 400,000 +- a few characters with a tricky character at the cut. Each input is encoded

* by ``tests.reference.Reference`` (tiktoken + the official tiktoken-safe chunking),
* by ``kimi_k3()`` (threads, segment cache on; some inputs are sent again as new ``str``
  objects so the cache answers) and by a one-thread Tokenizer without a cache,

with ``tiktoken_safe`` on (and, for one input in four, off), and the ids must be equal;
``count_tokens`` must equal the length and ``decode_bytes`` must equal tiktoken's. A
mismatch is printed and its input saved as JSON under ``--out`` (default
``bench/stress_failures``); the exit status is 1 if there was any.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import kimi_tok  # noqa: E402
from tests.reference import MAX_PIECE_CHARS, MAX_RUN_CHARS, Reference  # noqa: E402

SPACES = [chr(c) for c in range(0x110000) if chr(c).isspace()]  # 29 code points, \x1c-\x1f included
NOT_SPACES = ["\u200b", "\u180e", "\ufeff", "\u2060", "\x00", "\x7f"]  # look like space, are not
WORDS = ["hello", "World", "HTTPServer", "iPhone", "I'LL", "don't", "WE'RE", "McDonald's", "Привет", "мир",
         "ΑΛΦΑ", "Straße", "ǅemal", "東京", "ラーメン", "ひらがな", "한국어", "مرحبا", "नमस्ते", "สวัสดี",
         "def", "__init__", "0x1F", "NaN", "ſ", "İstanbul"]
CONTRACTIONS = ["'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'LL", "'d", "'", "''", "\u2019s", "'ſ"]
DIGITS = ["0", "7", "12", "123", "1234", "12345", "١٢٣", "०", "①", "Ⅻ", "½", "²", "𝟏", "〇", "３"]
PUNCT = list(".,;:!?-_()[]{}\"`/\\@#$%^&*+=<>|~") + ["...", "…", "。", "、", "「", "»", "—", "•", "€"]
MARKS = ["\u0301", "\u0308", "\u0327", "\u20dd", "\u094d", "\u0e31", "\u05b7", "\u3099", "\ufe0f", "\u200d"]
EMOJI = ["😀", "🚀", "👍🏽", "👨\u200d👩\u200d👧", "🏳️\u200d🌈", "🇯🇵", "1️⃣", "🫠", "❤️"]
HAN = ["中", "文", "字", "𠀀", "𠮷", "\U00031350", "\U0002ebf0", "\u3400", "々"]
NAMED_SPECIALS = ["<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "[EOS]", "[BOS]", "[EOT]", "[PAD]",
                  "[UNK]", "<|media_pad|>", "<|media_begin|>", "<osagent_mode>", "[start_header_id]",
                  "[end_header_id]"]
NEAR_SPECIALS = ["<|open|", "<|", "|>", "<|not_special|>", "<| |>", "[", "]", "<|OPEN|>", "[eos]",
                 "<|reserved_token_99|>", "<|open|><|open|"]
NONCHARACTERS = ["\ufdd0", "\ufdef", "\ufffe", "\uffff", "\U0001fffe", "\U0010ffff"]
PRIVATE_USE = ["\ue000", "\uf8ff", "\U000f0000", "\U00100000"]
# one char of each kind for long runs; the pairs (\r\n, a surrogate pair as two code points) cut mid-pair
RUN_UNITS = [" ", "\n", "\r\n", "\t", "\xa0", "\x1c", "\u3000", "\u2028", "a", "Z", "中", "😀", "é", "1", "!",
             "\u0301", "\x00", "\ud83d\ude00", "ab ", "<|open|>", "\ufffe"]
BOUNDARY_CHARS = ["\r\n", "\ud83d\ude00", "😀", "e\u0301", "👨\u200d👩", "<|open|>", " ", "  ", "\n\n", "'s",
                  "12345", "中文"]


def random_char(rng: random.Random) -> str:
    """Any code point, lone surrogates included (the reference fixes those up per sub-string)."""
    r = rng.random()
    if r < 0.5:
        return chr(rng.randrange(0x20, 0x3000))
    if r < 0.8:
        return chr(rng.randrange(0, 0x110000))
    return chr(rng.randrange(0xD800, 0xE000))


def random_atom(rng: random.Random, specials: list[str]) -> str:
    pools = (WORDS, WORDS, CONTRACTIONS, DIGITS, PUNCT, MARKS, EMOJI, HAN, SPACES, SPACES, NOT_SPACES,
             NAMED_SPECIALS, NEAR_SPECIALS, NONCHARACTERS, PRIVATE_USE)
    r = rng.random()
    if r < 0.08:
        return random_char(rng)
    if r < 0.10:
        return rng.choice(specials)
    if r < 0.12:
        return rng.choice(SPACES) * rng.randint(2, 40)
    return rng.choice(rng.choice(pools))


def random_text(rng: random.Random, specials: list[str], max_atoms: int = 60) -> str:
    return "".join(random_atom(rng, specials) for _ in range(rng.randint(0, max_atoms)))


def long_run_text(rng: random.Random, specials: list[str]) -> str:
    """1-3 runs of one unit, about 25,000 characters (or a multiple) long, with short text around them."""
    parts = [random_text(rng, specials, 5)]
    for _ in range(rng.randint(1, 3)):
        unit = rng.choice(RUN_UNITS)
        target = rng.choice([MAX_RUN_CHARS, 2 * MAX_RUN_CHARS, MAX_RUN_CHARS // 2, rng.randint(1, 60_000)])
        n = max(1, (target + rng.randint(-3, 3)) // len(unit))
        parts.append(unit * n)
        parts.append(random_text(rng, specials, 3))
    return "".join(parts)


def boundary_text(rng: random.Random, specials: list[str]) -> str:
    """About 400,000 characters with a tricky character straddling the 400k chunk cut."""
    filler = random_text(rng, specials, 80) or "x"
    if rng.random() < 0.3:  # a long run that crosses the cut
        filler = rng.choice(RUN_UNITS)
    tricky = rng.choice(BOUNDARY_CHARS)
    at = MAX_PIECE_CHARS - rng.randint(0, len(tricky)) + rng.choice([0, 0, -1, 1])
    head = (filler * (at // len(filler) + 1))[:at]
    tail = (filler * 40)[: rng.randint(0, 400)]
    return head + tricky + tail


def random_segments(rng: random.Random, specials: list[str]) -> list[tuple[str, bool]]:
    segments = []
    for _ in range(rng.randint(1, 12)):
        r = rng.random()
        if r < 0.04:
            text = long_run_text(rng, specials)
        elif r < 0.045:
            text = boundary_text(rng, specials)
        elif r < 0.15:
            text = rng.choice(specials + NAMED_SPECIALS)
        else:
            text = random_text(rng, specials)
        segments.append((text, rng.random() < 0.4))
    return segments


def rerender(segments: list[tuple[str, bool]]) -> list[tuple[str, bool]]:
    """Equal texts as new ``str`` objects (what a chat renderer sends each turn)."""
    return [("".join(list(text)), allow) for text, allow in segments]


class Stress:
    """Runs inputs through both Tokenizers and the reference; counts what it tried and what differed."""

    def __init__(self, out: Path | None = None) -> None:
        self.ref = Reference()
        self.cached = kimi_tok.kimi_k3()
        vocabulary, specials = kimi_tok.vocab.embedded_kimi_k3()
        self.plain = kimi_tok.Tokenizer(vocabulary, specials, kimi_tok.KIMI_PATTERN, n_jobs=1, segment_cache_bytes=0)
        self.specials = sorted(specials)
        self.out = out
        self.inputs = self.segments = self.chars = self.tokens = 0
        self.mismatches: list[str] = []

    def check(self, segments: list[tuple[str, bool]], safe: bool) -> None:
        self.inputs += 1
        self.segments += len(segments)
        self.chars += sum(len(t) for t, _ in segments)
        expected = self.ref.encode_segments(segments, tiktoken_safe=safe)
        self.tokens += len(expected)
        problems = []
        for name, tok in (("kimi_k3()", self.cached), ("n_jobs=1, no cache", self.plain)):
            got = tok.encode_segments(segments, tiktoken_safe=safe).ids
            if got != expected:
                at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
                problems.append(f"{name}: ids differ at {at} ({len(got)} vs {len(expected)} ids)")
            elif tok.count_tokens(segments, tiktoken_safe=safe) != len(expected):
                problems.append(f"{name}: count_tokens != {len(expected)}")
        if not problems and self.cached.decode_bytes(expected) != self.ref.enc.decode_bytes(expected):
            problems.append("decode_bytes differs from tiktoken's")
        if problems:
            self.report(segments, safe, problems)

    def report(self, segments, safe: bool, problems: list[str]) -> None:
        text = f"input {self.inputs}: " + "; ".join(problems)
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            path = self.out / f"mismatch-{len(self.mismatches):04d}.json"
            with open(path, "w", encoding="utf-8") as f:  # surrogates kept as \\udXXX escapes
                json.dump({"tiktoken_safe": safe, "segments": segments, "problems": problems}, f)
            text += f" (saved to {path})"
        print(text, flush=True)
        self.mismatches.append(text)

    def run(self, seconds: float, seed: int, progress_every: float = 30.0) -> None:
        rng = random.Random(seed)
        history: list[list[tuple[str, bool]]] = []
        start = last = time.perf_counter()
        while time.perf_counter() - start < seconds:
            if history and rng.random() < 0.15:  # an earlier input again: the segment cache answers
                segments = rerender(rng.choice(history))
            else:
                segments = random_segments(rng, self.specials)
                history = (history + [segments])[-50:]
            self.check(segments, safe=rng.random() >= 0.25)
            now = time.perf_counter()
            if progress_every and now - last >= progress_every:
                last = now
                print(f"  {now - start:6.0f} s: {self.summary()}", flush=True)

    def summary(self) -> str:
        return (f"{self.inputs:,} inputs ({self.segments:,} segments, {self.chars:,} characters, "
                f"{self.tokens:,} tokens), {len(self.mismatches)} mismatches")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    when = parser.add_mutually_exclusive_group()
    when.add_argument("--minutes", type=float, help="how long to run (default 5)")
    when.add_argument("--seconds", type=float, help="how long to run, in seconds")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock, printed)")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "stress_failures",
                        help="where mismatching inputs are saved as JSON")
    args = parser.parse_args(argv)
    seconds = args.seconds if args.seconds is not None else 60 * (args.minutes if args.minutes is not None else 5)
    seed = args.seed if args.seed is not None else int(time.time())
    stress = Stress(args.out)
    print(f"stress: {seconds:.0f} s, seed {seed}, kimi_tok vs tiktoken reference", flush=True)
    stress.run(seconds, seed)
    print(f"stress: {stress.summary()}")
    return 1 if stress.mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
