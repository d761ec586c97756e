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


def warmup(processes: bool = True) -> dict:
    """Compile every kernel kimi_tok can use into numba's cache (or check that they are there):
    for container images and CI, so that no process compiles later (docs/performance.md, "First
    use and load time"). ``processes``: also the worker processes' kernels (starts two).

    >>> kimi_tok.warmup()["compiled"]  # doctest: +SKIP
    0
    """
    from .reuse.warmup import warm_up_everything

    def tokenizers():  # the two kinds of pre-tokenizer: the Kimi scanner, PCRE2 for other patterns
        yield kimi_k3()
        yield Tokenizer(*embedded_kimi_k3(), r"\S+|\s+", name="warm-up (PCRE2)")

    return warm_up_everything(tokenizers, processes=processes)
