"""Corpus scale: tokenize JSONL documents into memory-mappable shards, on local processes or Dask
(``shards``; docs/corpus.md).

>>> from kimi_tok.corpus import Corpus, encode_corpus
>>> summary = encode_corpus(["train.jsonl"], "train.tok")      # doctest: +SKIP
>>> Corpus("train.tok")[0]                                      # doctest: +SKIP
memmap([22931, 2695], dtype=uint32)
"""

from .shards import Corpus, CorpusError, CorpusSummary, encode_corpus

__all__ = ["Corpus", "CorpusError", "CorpusSummary", "encode_corpus"]
