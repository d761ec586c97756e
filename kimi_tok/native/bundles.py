"""A short call's arrays handed to its kernel as one object (a numba structref).

numba checks and unboxes every array a kernel is called with, one by one, and a short call's
kernel takes 34: the BPE tables, the special-token table, the scanner's and the chunker's flag
tables and a piece cache. A ``StagesBundle`` holds them inside numba's own memory, so the call
unboxes one object instead (docs/performance.md, "The fixed cost of a short call").

This module imports numba: ``native.jit`` names it through ``DeferredModule`` and imports it
when the kernels are materialized. A bundle is made by a kernel (``pipeline.assembly``) and only
handed back to kernels; Python never reads its fields.
"""

from __future__ import annotations

from numba.core import types
from numba.experimental import structref


@structref.register
class StagesBundleType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(typ)) for name, typ in fields)


class StagesBundle(structref.StructRefProxy):
    """The tables of one vocabulary's stages and one piece cache, as one compiled object."""


structref.define_proxy(StagesBundle, StagesBundleType, ["tables", "specials", "scan_table", "flags", "cache"])
