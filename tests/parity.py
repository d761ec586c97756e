"""Helpers that compare kimi_tok with the tiktoken reference and explain a mismatch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kimi_tok.interop.tiktoken_compat import first_difference


def describe_mismatch(expected: Sequence[int], got: Sequence[int], what: str = "") -> str:
    i = first_difference(expected, got)
    lo = max(0, (i or 0) - 5)
    return (
        f"{what}\nids differ at index {i} (expected {len(expected)} ids, got {len(got)}):\n"
        f"  expected[{lo}:{lo + 15}] = {list(expected[lo:lo + 15])}\n"
        f"  got     [{lo}:{lo + 15}] = {list(got[lo:lo + 15])}"
    )


def rerender(segments) -> list[tuple[str, bool]]:
    """The same segments as new ``str`` objects (as a serving stack renders a prompt again every
    turn): equal texts, never the same objects, so a cache hit must compare text, not identity."""
    return [((text + " ")[:-1], allow) for text, allow in segments]


def short_repr(segments, limit: int = 300) -> str:
    text = repr(segments)
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} chars of repr)"


def assert_parity(tok, ref, segments, tiktoken_safe: bool = True) -> list[int]:
    """kimi_tok's ids for ``segments`` equal the reference's; returns them."""
    expected = ref.encode_segments(segments, tiktoken_safe=tiktoken_safe)
    got = tok.encode_segments(segments, tiktoken_safe=tiktoken_safe).ids
    if got != expected:
        raise AssertionError(
            describe_mismatch(expected, got, f"segments={short_repr(segments)} tiktoken_safe={tiktoken_safe}")
        )
    return got


def assert_batched_parity(tok, encode_one, samples: Sequence[str], label: str, chunk: int = 50_000) -> None:
    """Each sample alone (``encode_one(sample) -> ids``) == kimi_tok on all samples as segments.

    Samples are sent through ``tok.encode_segments`` ``chunk`` at a time (each sample a
    segment with ``allow_special=False``), and the concatenated reference ids are compared
    in one NumPy comparison. On a mismatch the first bad sample is named.
    """
    for lo in range(0, len(samples), chunk):
        part = samples[lo:lo + chunk]
        per_sample = [encode_one(s) for s in part]
        lengths = np.fromiter(map(len, per_sample), dtype=np.int64, count=len(part))
        expected = np.fromiter((i for ids in per_sample for i in ids), dtype=np.uint32, count=int(lengths.sum()))
        got = tok.encode_segments([(s, False) for s in part]).into_numpy()["ids"]
        if got.shape == expected.shape and np.array_equal(got, expected):
            continue
        # Name the first sample whose ids differ.
        ends = np.cumsum(lengths)
        n = min(len(got), len(expected))
        diff = np.flatnonzero(got[:n] != expected[:n])
        at = int(diff[0]) if diff.size else n
        k = int(np.searchsorted(ends, at, side="right"))
        k = min(k, len(part) - 1)
        sample = part[k]
        alone = tok.encode_segments([(sample, False)]).ids
        raise AssertionError(
            f"{label}: sample {lo + k} {sample!r} (code points {[hex(ord(c)) for c in sample]}):\n"
            f"  expected {per_sample[k]}\n  got      {alone}"
        )
