"""The benchmarks (``python -m bench.bench`` and the others here).

They measure the compiled kernels: where those are not compiled yet (a fresh install), a new Tokenizer
waits for the processes compiling them instead of answering on the interpreted engine meanwhile
(``KIMI_TOK_COLD_START=wait``, unless set otherwise). ``bench.load_time`` measures the cold start
itself and unsets it for its children. ``settled`` waits, before anything is timed, for the kernel
loads a new Tokenizer leaves running on a background thread (``reuse.warmup``): they hold the GIL
and the cache, and slowed the first timed rows by up to a third.
"""

import os

os.environ.setdefault("KIMI_TOK_COLD_START", "wait")


def settled(*tokenizers):
    """``tokenizers``, once each runs on its compiled kernels and no kernel load runs in the background."""
    from kimi_tok.reuse.warmup import wait_for_background

    for tok in tokenizers:
        tok.wait_until_compiled()
    wait_for_background()
    return tokenizers
