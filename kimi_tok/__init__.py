"""kimi_tok: the exact Kimi K3 tokenizer, fast, in Python + numba + PCRE2.

>>> import kimi_tok
>>> kimi_tok.kimi_k3().encode_segments([("<|open|>", True), ("hello world", False)]).ids
[163587, 22931, 2695]
"""

from .encoding import Encoding
from .engine import Policy
from .loaders import from_tiktoken, kimi_k3, load
from .tokenizer import Tokenizer
from .vocab import KIMI_PATTERN

__all__ = ["Encoding", "Policy", "Tokenizer", "kimi_k3", "load", "from_tiktoken", "KIMI_PATTERN"]
__version__ = "0.1.0"
