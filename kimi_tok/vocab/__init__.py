"""Vocabularies: ``tiktoken.model`` files and model directories, and the embedded Kimi K3 copy."""

from .files import Vocabulary, parse_tiktoken_bpe, read_model, read_special_tokens_json, vocabulary_from_ranks
from .kimi_k3 import KIMI_K3_SHA256, KIMI_PATTERN, embedded_kimi_k3
from .specials import check_special_tokens

__all__ = ["Vocabulary", "parse_tiktoken_bpe", "read_model", "read_special_tokens_json", "vocabulary_from_ranks",
           "KIMI_K3_SHA256", "KIMI_PATTERN", "embedded_kimi_k3", "check_special_tokens"]
