"""kimi_tok: the exact Kimi K3 tokenizer, fast, in Python + numba + PCRE2.

>>> import kimi_tok
>>> kimi_tok.kimi_k3().encode_segments([("<|open|>", True), ("hello world", False)]).ids
[163587, 22931, 2695]
"""

from .encoding import Encoding
from .engine import Policy
from .loaders import from_tiktoken, kimi_k3, load
from .tokenizer import Tokenizer
from .vocab import KIMI_PATTERN, embedded_kimi_k3

__all__ = ["Encoding", "Policy", "Tokenizer", "kimi_k3", "load", "from_tiktoken", "warmup", "KIMI_PATTERN"]
__version__ = "0.1.0"


def warmup(processes: bool = True, jobs: int | None = None) -> dict:
    """Compile every kernel kimi_tok can use into numba's cache (or check that they are there):
    for container images and CI, so that no process compiles later (docs/performance.md, "First
    use"). ``jobs``: processes compiling at once (default: the cores, at most 4); ``processes``:
    also the worker-process backend's kernels.

    >>> kimi_tok.warmup()["compiled"]  # doctest: +SKIP
    0
    """
    from .native import jit
    from .reuse.warmup import warm_up_all

    jit.materialize()  # numba now: the Tokenizers made here load synchronously, with no interpreted path
    return warm_up_all(_warm_up_tokenizers, processes=processes, jobs=jobs)


def _warm_up_tokenizers():  # both pre-tokenizers (the Kimi scanner, PCRE2) and both kinds of agent-loop helper
    yield kimi_k3()
    yield Tokenizer(*embedded_kimi_k3(), r"\S+|\s+", name="warm-up (PCRE2)")
    if Policy().parked_helpers:
        yield kimi_k3(policy=Policy.from_env(parked_helpers=False))
