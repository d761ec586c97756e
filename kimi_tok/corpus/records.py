"""Checking JSON values that carry text to encode (shared by the CLI and ``kimi_tok.corpus``).

Both read the same shapes: a text (a JSON string) or a rendered chat as a list of
``[text, allow_special]`` pairs. The checks raise ``ValueError`` with a message that
callers prefix with where the value came from (a file, a line).

>>> segments_from_json([["<|open|>", True], ["hi", False]])
[('<|open|>', True), ('hi', False)]
"""

from __future__ import annotations

import json
from typing import Any

MAX_SHOWN_CHARS = 60  # a bad segment is quoted in the message, cut to this length


def json_type(value: Any) -> str:
    """How a JSON value's type reads in a message: ``an object``, ``a list``, ``a string``..."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "true/false", type(None): "null"}
    return names.get(type(value), "a number")


def segments_from_json(data: Any) -> list[tuple[str, bool]]:
    """``[[text, allow_special], ...]`` as a list of ``(str, bool)``, checked item by item.

    ``ValueError`` names the first bad item: "segment 3 must be [text, allow_special] ...".
    """
    if not isinstance(data, list):
        raise ValueError(f"expected a list of [text, allow_special] pairs, got {json_type(data)}")
    for i, seg in enumerate(data):
        if not (isinstance(seg, list) and len(seg) == 2 and isinstance(seg[0], str) and isinstance(seg[1], bool)):
            shown = json.dumps(seg, ensure_ascii=False)
            shown = shown if len(shown) <= MAX_SHOWN_CHARS else shown[:MAX_SHOWN_CHARS - 3] + "..."
            raise ValueError(f"segment {i} must be [text, allow_special] (a string and true/false), got {shown}")
    return [(text, allow) for text, allow in data]
