"""Below the pipeline: numba compilation (``jit``), atomics and futexes for threads in compiled
code, hash tables over arrays, UTF-8 helpers, and huge-page memory."""
