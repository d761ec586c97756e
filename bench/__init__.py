"""The benchmarks (``python -m bench.bench`` and the others here).

They measure the compiled kernels: where those are not compiled yet (a fresh install), a new Tokenizer
waits for the processes compiling them instead of answering on the interpreted engine meanwhile
(``KIMI_TOK_COLD_START=wait``, unless set otherwise). ``bench.load_time`` measures the cold start
itself and unsets it for its children.
"""

import os

os.environ.setdefault("KIMI_TOK_COLD_START", "wait")
