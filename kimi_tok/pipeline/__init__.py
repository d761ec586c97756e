"""The stages of one call, in call order, each a module:

    segments       validate segments, pack them into one UTF-8 buffer + offsets
    chunking       tiktoken-safe 400k-character chunks and 25k same-kind run cuts
    specials       special tokens vs text runs
    pretokenize    text runs -> pieces (the compiled Kimi scanner, or PCRE2 JIT)
    bpe            pieces -> ids (whole-piece look-up, then merges; piece caches)
    assembly       the stages as one compiled call into one preallocated uint32 array
    decode         ids -> bytes and text
"""
