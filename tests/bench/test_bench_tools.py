"""The bench tools that are not run by CI otherwise still run (smoke tests, no timings asserted)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kimi_tok.reuse import parking

REPO = Path(__file__).resolve().parents[2]


def test_turn_timeline_shows_both_threads_of_an_encoded_ahead_turn():
    """Its wrappers patch kimi_tok's stages for good, so it runs in a process of its own."""
    result = subprocess.run(
        [sys.executable, "-m", "bench.turn_timeline", "--instances", "2", "--turns", "3", "--target-tokens", "150_000"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "KIMI_TOK_N_JOBS": "2"},  # encoding ahead needs two jobs, whatever the cores
    )
    assert result.returncode == 0, result.stderr
    timed = [line for line in result.stdout.splitlines() if " ms: " in line]
    assert len(timed) == 1, result.stdout
    # new text in shared parts; the cached ids copied ahead by a parked helper (Linux) or by the plan
    copied = "post<@Main" if parking.PARKING else "copy<@"
    for mark in ("pack>@Main", "parts<@Main", "verify>@", copied, "store<@Main"):
        assert mark in timed[0], (mark, timed[0])
    assert "untimed inside: last turn median" in result.stdout


def test_helpers_ab_compares_both_kinds_of_helpers():
    result = subprocess.run(
        [sys.executable, "-m", "bench.helpers_ab", "--instances", "1", "--turns", "3", "--timed-from", "1",
         "--target-tokens", "120_000"],
        cwd=REPO, capture_output=True, text=True, timeout=300, env={**os.environ, "KIMI_TOK_N_JOBS": "2"},
    )
    assert result.returncode == 0, result.stderr
    if parking.PARKING:
        for kind in ("parked", "executor"):
            assert f"{kind} helpers: median" in result.stdout, result.stdout
