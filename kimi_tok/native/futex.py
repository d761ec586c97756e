"""Waiting and waking between threads inside compiled code (Linux futexes), without the GIL.

``wait_until`` spins a while (the other thread is usually microseconds away), then sleeps on
the futex; ``set_and_wake`` stores a word and wakes a thread that said it sleeps on it. A
``signal`` is a pair of words, a flag and its sleeper mark, that one thread sets and another
waits for: a kernel given one (``engine.parts.encode_claimed_parts``) sets it as soon as it
runs, telling a waiting thread that this one is in compiled code and the GIL is free
(``reuse.parking``). Only on Linux (x86-64, AArch64): elsewhere ``SYS_FUTEX`` is -1 and no
caller waits.
"""

from __future__ import annotations

import platform
import sys

import numpy as np

from . import atomics
from .jit import leaf

SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower(), -1)
HAS_FUTEX = sys.platform.startswith("linux") and SYS_FUTEX > 0
FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE = 128, 129
WAKE_ALL = 1 << 30
SPIN_READS = 1 << 19  # ~0.5 ms of reads before a wait sleeps
FLAG, FLAG_SLEEPER = 0, 1  # the two words of a signal
NO_SIGNAL = np.zeros(0, dtype=np.int32)  # a signal nobody waits for


@leaf
def wait_until(words, at, value, sleeper_at, syscall_number):
    """Until ``words[at] == value``: spin, then sleep on the futex (``set_and_wake`` wakes it)."""
    for _ in range(SPIN_READS):
        if atomics.load(words, at) == value:
            return
    atomics.store(words, sleeper_at, 1)
    while True:
        seen = atomics.load(words, at)
        if seen == value:
            return
        atomics.futex(words, at, FUTEX_WAIT_PRIVATE, seen, syscall_number)  # returns at once if changed


@leaf
def set_and_wake(words, at, value, sleeper_at, syscall_number):
    """``words[at] = value``, waking every thread that marked ``words[sleeper_at]`` as sleeping."""
    atomics.store(words, at, value)
    if atomics.load(words, sleeper_at) != 0:
        atomics.futex(words, at, FUTEX_WAKE_PRIVATE, WAKE_ALL, syscall_number)


@leaf
def signal(words, syscall_number):
    """Set the signal ``words`` (flag, sleeper mark) and wake its waiter; nothing for ``NO_SIGNAL``."""
    if words.shape[0] >= 2:
        set_and_wake(words, FLAG, 1, FLAG_SLEEPER, syscall_number)
