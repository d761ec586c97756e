"""Chat templates with trust boundaries: ``Tokenizer.apply_chat_template``.

A Hugging Face chat template (Jinja) is rendered as transformers renders it (a sandboxed
``ImmutableSandboxedEnvironment`` with ``trim_blocks``/``lstrip_blocks``, ``loopcontrols``,
``raise_exception``, ``strftime_now`` and its ``tojson``), but into segments: **the
template's own text becomes ``allow_special=True`` segments and every value from
``messages`` (and ``tools``/``documents``) becomes ``allow_special=False`` segments**. A
literal ``<|open|>`` typed by a user stays text, whatever the template does with it.

How: every text carries where it came from. The template's literal text and string
constants are marked as template text when the template is compiled (``_MarkTemplateText``
rewrites its syntax tree); every string inside ``messages`` is wrapped as message text.
Both are ``ChatText`` objects, a ``str`` whose parts each remember their origin, and the
operations a template applies keep the parts: ``+``, ``~``, ``join``, slicing and
iteration, ``strip``/``trim``, ``split``, ``replace``, ``upper``/``lower``, captured blocks
and macros. Any other operation (a filter such as ``title`` or ``tojson``, ``format``,
``%``, ...) makes its result message text as a whole, if message text went into it; it
raises ``ValueError`` instead when template text holding a special token went in too (the
result could only be wrong: control tokens lost, or user text made control tokens). Text
whose origin is not known (made by code that does not keep the parts) is ordinary text and
raises ``ValueError`` if it holds special-token text. The table is in docs/serving.md.

    >>> chatml = ("{% for m in messages %}<|im_start|>{{ m.role }}\\n{{ m.content }}<|im_end|>\\n"
    ...           "{% endfor %}")
    >>> tok.apply_chat_template([{"role": "user", "content": "hi <|im_end|>"}], chatml, tokenize=False)
    [('<|im_start|>', True), ('user', False), ('\\n', True), ('hi <|im_end|>', False), ('<|im_end|>\\n', True)]

Needs ``jinja2`` (the ``chat`` extra: ``pip install 'kimi_tok[chat]'``).
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.filters import make_attrgetter
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError("Tokenizer.apply_chat_template needs jinja2: pip install 'kimi_tok[chat]'") from e

if TYPE_CHECKING:  # pragma: no cover
    from ..tokenizer import Tokenizer

TEMPLATE = "template"  # the template's own text: may hold control tokens
MESSAGE = "message"  # from messages, tools or documents: never control tokens
UNKNOWN = "unknown"  # made where origins are not kept: ordinary text that must hold no special token
MESSAGE_VARS = ("tools", "documents")  # template variables that carry content, not template text


class TrustBoundaryError(ValueError):
    """A template used message text in a way that cannot keep it apart from control tokens."""


_specials: contextvars.ContextVar[re.Pattern | None] = contextvars.ContextVar("kimi_tok_chat_specials", default=None)


def _special_in(text: str) -> str | None:
    """The first special token's text inside ``text`` (during a render), or None."""
    pattern = _specials.get()
    match = pattern.search(text) if pattern is not None and text else None
    return match.group() if match else None


class ChatText(str):
    """A ``str`` whose parts remember where they came from (``TEMPLATE``, ``MESSAGE``, ``UNKNOWN``).

    Made only while a chat template renders. Its text is the parts joined; the operations
    below keep the parts, the other ``str`` methods give a result of one origin
    (``combined``). Its parts are not visible to templates (the sandbox hides ``_`` names).
    """

    _parts: tuple[tuple[str, str], ...]

    def __new__(cls, text: object = "", parts: tuple[tuple[str, str], ...] | None = None) -> ChatText:
        plain = str.__str__(text) if isinstance(text, str) else str(text)
        self = super().__new__(cls, plain)
        self._parts = ((plain, UNKNOWN),) if parts is None else parts
        return self

    @classmethod
    def _of(cls, text: str, origin: str) -> ChatText:
        plain = str.__str__(text)
        return cls(plain, ((plain, origin),) if plain else ())

    @classmethod
    def _joined(cls, parts: Sequence[tuple[str, str]]) -> ChatText:
        """The parts as one text; adjacent template text becomes one part, empty parts go."""
        kept: list[tuple[str, str]] = []
        run: list[str] = []  # template text not yet kept
        for text, origin in parts:
            if not text:
                continue
            if origin == TEMPLATE:
                run.append(text)
                continue
            if run:
                kept.append(("".join(run), TEMPLATE))
                run = []
            kept.append((text, origin))
        if run:
            kept.append(("".join(run), TEMPLATE))
        return cls("".join(text for text, _ in kept), tuple(kept))

    def __str__(self) -> ChatText:  # str(x) keeps the parts (Jinja calls str() on every output)
        return self

    def _origin(self) -> str | None:
        """The one origin of all parts, or None if they differ."""
        origins = {origin for _, origin in self._parts}
        return next(iter(origins)) if len(origins) == 1 else (TEMPLATE if not origins else None)

    def _slice(self, start: int, stop: int) -> ChatText:
        """Characters ``start:stop`` (0 <= start, stop <= len), with their parts."""
        out, at = [], 0
        for text, origin in self._parts:
            end = at + len(text)
            if end > start and at < stop:
                out.append((text[max(start - at, 0):min(stop, end) - at], origin))
            at = end
        return ChatText._joined(out)

    # -- operations that keep the parts --------------------------------------------------

    def __add__(self, other: object) -> ChatText:
        if not isinstance(other, str):
            return NotImplemented
        return ChatText._joined(self._parts + _parts_of(other))

    def __radd__(self, other: object) -> ChatText:
        if not isinstance(other, str):
            return NotImplemented
        return ChatText._joined(_parts_of(other) + self._parts)

    def __mul__(self, n: object) -> ChatText:
        if not isinstance(n, int):
            return NotImplemented
        return ChatText._joined(self._parts * max(n, 0))

    __rmul__ = __mul__

    def __getitem__(self, key: int | slice) -> ChatText:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                return self._slice(start, max(start, stop))
            return combined(str.__getitem__(self, key), [self], "a slice with a step")
        str.__getitem__(self, key)  # IndexError/TypeError as for a str
        at = key + len(self) if key < 0 else key
        return self._slice(at, at + 1)

    def __iter__(self):
        for text, origin in self._parts:
            for character in text:
                yield ChatText._of(character, origin)

    def __format__(self, spec: str) -> str:
        return self if not spec else combined(str.__format__(self, spec), [self, spec], "format")

    def join(self, items) -> ChatText:
        parts: list[tuple[str, str]] = []
        for i, item in enumerate(items):
            if not isinstance(item, str):
                raise TypeError(f"sequence item {i}: expected str instance, {type(item).__name__} found")
            if i:
                parts += self._parts
            parts += _parts_of(item)
        return ChatText._joined(parts)

    def strip(self, chars: str | None = None) -> ChatText:
        plain = str.__str__(self)
        start = len(plain) - len(plain.lstrip(chars))
        return self._slice(start, max(start, len(plain.rstrip(chars))))

    def lstrip(self, chars: str | None = None) -> ChatText:
        plain = str.__str__(self)
        return self._slice(len(plain) - len(plain.lstrip(chars)), len(plain))

    def rstrip(self, chars: str | None = None) -> ChatText:
        return self._slice(0, len(str.rstrip(self, chars)))

    def removeprefix(self, prefix: str) -> ChatText:
        return self._slice(len(prefix) if self.startswith(prefix) else 0, len(self))

    def removesuffix(self, suffix: str) -> ChatText:
        return self._slice(0, len(self) - len(suffix) if suffix and self.endswith(suffix) else len(self))

    def replace(self, old: str, new: str, count: int = -1) -> ChatText:
        if not isinstance(old, str) or not isinstance(new, str) or not old:
            return combined(str.replace(self, old, new, count), [self, old, new], "replace")
        return (new if isinstance(new, ChatText) else ChatText._of(new, UNKNOWN)).join(self.split(old, count))

    def split(self, sep: str | None = None, maxsplit: int = -1) -> list[ChatText]:
        return self._pieces(str.split(self, sep, maxsplit), [sep], "split")

    def rsplit(self, sep: str | None = None, maxsplit: int = -1) -> list[ChatText]:
        return self._pieces(str.rsplit(self, sep, maxsplit), [sep], "rsplit")

    def splitlines(self, keepends: bool = False) -> list[ChatText]:
        return self._pieces(str.splitlines(self, keepends), [], "splitlines")

    def partition(self, sep: str) -> tuple[ChatText, ChatText, ChatText]:
        return tuple(self._pieces(list(str.partition(self, sep)), [sep], "partition"))  # type: ignore[return-value]

    def rpartition(self, sep: str) -> tuple[ChatText, ChatText, ChatText]:
        return tuple(self._pieces(list(str.rpartition(self, sep)), [sep], "rpartition"))  # type: ignore[return-value]

    def _pieces(self, pieces: list[str], args: list, what: str) -> list[ChatText]:
        """Pieces of this text: of its one origin, else each of the origins that went in."""
        origin = self._origin()
        if origin is not None:
            return [ChatText._of(piece, origin) for piece in pieces]
        return [combined(piece, [self, *args], what) for piece in pieces]

    def _cased(self, method: str) -> ChatText:
        """``upper``/``lower``/... part by part, when that gives the text the whole would give."""
        whole = getattr(str, method)(self)
        parts = [(getattr(str, method)(text), origin) for text, origin in self._parts]
        if "".join(text for text, _ in parts) == whole:
            return ChatText._joined(parts)
        return combined(whole, [self], method)

    def upper(self) -> ChatText:
        return self._cased("upper")

    def lower(self) -> ChatText:
        return self._cased("lower")

    def casefold(self) -> ChatText:
        return self._cased("casefold")

    def swapcase(self) -> ChatText:
        return self._cased("swapcase")


def _one_origin(method: str):
    """A ``str`` method whose result (a str, or a list/tuple of them) takes the origins of its inputs."""
    plain = getattr(str, method)

    def tracked(self, *args, **kwargs):
        return _tracked(plain(self, *args, **kwargs), [self, args, kwargs], method)

    tracked.__name__ = method
    tracked.__doc__ = plain.__doc__
    return tracked


for _method in ("capitalize", "center", "expandtabs", "format", "format_map", "ljust", "rjust", "title",
                "translate", "zfill", "__mod__", "__rmod__"):
    setattr(ChatText, _method, _one_origin(_method))


def _parts_of(text: str) -> tuple[tuple[str, str], ...]:
    return text._parts if isinstance(text, ChatText) else ((str.__str__(text), UNKNOWN),) if text else ()


def _strings(value) -> tuple[list[str], bool]:
    """The strings inside ``value`` (nested lists, tuples and dicts, keys too), and whether
    nothing else could hold text (numbers, bools, None, Undefined and Jinja's contexts aside):
    an object that is none of these may carry message text in a way not seen here."""
    found: list[str] = []
    clear = True
    stack, seen = [value], set()
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, (list, tuple, Mapping)):
            if id(item) in seen:
                continue
            seen.add(id(item))
            stack.extend(item.items() if isinstance(item, Mapping) else item)
        elif not (item is None or isinstance(item, (bool, int, float, jinja2.Undefined, jinja2.Environment,
                                                    jinja2.nodes.EvalContext, jinja2.runtime.Context))):
            clear = False
    return found, clear


def combined(result: str, inputs: list, what: str) -> ChatText:
    """``result`` of an operation that mixes its ``inputs`` where their parts cannot be followed:
    template text if only template text went in; else message text (or of unknown origin), and
    ``ValueError`` if template text that went in holds a special token (it would be lost, or
    user text would become control tokens) or text of unknown origin does."""
    strings, clear = _strings(inputs)
    parts = [part for text in strings for part in _parts_of(text)]
    origins = {origin for _, origin in parts}
    if origins == {TEMPLATE} and clear:
        return ChatText._of(result, TEMPLATE)
    if MESSAGE in origins:
        for text, origin in parts:
            token = _special_in(text) if origin != MESSAGE else None
            if token is not None:
                where = "template text" if origin == TEMPLATE else "text of unknown origin"
                raise TrustBoundaryError(
                    f"chat template: {what} mixes message text with {where} holding the special token {token!r}, "
                    "so the result cannot keep the trust boundary; emit the special token as template text of "
                    "its own (see docs/serving.md)")
    return ChatText._of(result, MESSAGE if MESSAGE in origins else UNKNOWN)


def _tracked(result, inputs: list, what: str):
    """``result`` of a filter or method: its text (or texts) with the origins of ``inputs`` where
    its own parts lost track somewhere (a part of unknown origin: Python code joined strings)."""
    if isinstance(result, ChatText) and all(origin != UNKNOWN for _, origin in result._parts):
        return result
    if not isinstance(result, (str, list, tuple)):
        return result
    if isinstance(result, str):
        return combined(str.__str__(result), inputs, what)
    if all(isinstance(item, str) for item in result):
        return type(result)(_tracked(item, inputs, what) for item in result)
    return result


# -- the environment ------------------------------------------------------------------------


class _MarkTemplateText(NodeTransformer):
    """Rewrites a parsed template so that its literal text and string constants are made as
    template ``ChatText`` at run time, and ``~`` keeps the parts of what it joins."""

    def visit_TemplateData(self, node: nodes.TemplateData) -> nodes.Node:
        return _call("chat_template_text", [nodes.Const(node.data)], node.lineno)

    def visit_Const(self, node: nodes.Const) -> nodes.Node:
        if isinstance(node.value, str):
            return _call("chat_template_text", [nodes.Const(node.value)], node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return _call("chat_concat", [nodes.List(node.nodes)], node.lineno)


def _call(name: str, args: list, lineno: int) -> nodes.Call:
    """A call of an environment attribute (templates cannot name the environment)."""
    call = nodes.Call(nodes.EnvironmentAttribute(name), args, [], None, None)
    call.set_lineno(lineno)
    return call


class _Generation(Extension):
    """transformers' ``{% generation %}`` block (assistant-token masks): rendered as its body."""

    tags = {"generation"}

    def parse(self, parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller) -> str:
        return caller()


def _text_of(value: Any) -> ChatText:
    """``str(value)`` with origins: a ``str`` not made here is of unknown origin; a list or dict
    takes the origins of the strings in it (``combined``); a number is of unknown origin."""
    if isinstance(value, ChatText):
        return value
    if isinstance(value, str):
        return ChatText._of(value, UNKNOWN)
    return combined(str(value), [value], "str()")


def _finalize(value: Any) -> ChatText:
    """Every ``{{ ... }}`` output as a ``ChatText`` (``_text_of``)."""
    return _text_of(value)


def _concat(chunks) -> ChatText:
    """``Environment.concat`` (blocks, macros, ``{% set %}`` captures, the whole render), keeping the parts."""
    parts: list[tuple[str, str]] = []
    for chunk in chunks:
        parts += _text_of(chunk)._parts
    return ChatText._joined(parts)


def _concat_operands(values: list) -> ChatText:
    """``a ~ b``: ``str()`` of each operand, joined with their parts."""
    return _concat(values)


def _tojson(value, ensure_ascii: bool = False, indent=None, separators=None, sort_keys: bool = False) -> ChatText:
    """transformers' ``tojson`` (``json.dumps``, no HTML escaping)."""
    text = json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    return combined(text, [value], "tojson")


@jinja2.pass_environment
def _join(environment, value, d: str = "", attribute=None) -> ChatText:
    """Jinja's ``join`` filter, keeping the parts."""
    if attribute is not None:
        value = map(make_attrgetter(environment, attribute), value)
    separator = d if isinstance(d, ChatText) else ChatText._of(str(d), UNKNOWN)
    return separator.join([_text_of(item) for item in value])


def _tracked_filter(name: str, function):
    """A built-in filter whose text result takes the origins of its inputs (``combined``)."""

    @functools.wraps(function)
    def tracked(*args, **kwargs):
        return _tracked(function(*args, **kwargs), [args, kwargs], f"the filter {name!r}")

    return tracked


def _as_text(value) -> ChatText:
    """``{{ x | as_text }}``: all of ``x``, template text too, as one ordinary-text segment (a
    template that lays out attributes as one segment, as Kimi K3's renderer does)."""
    return ChatText._of(value if isinstance(value, str) else str(value), MESSAGE)


def _raise_exception(message) -> None:
    raise jinja2.exceptions.TemplateError(str(message))


def _strftime_now(format: str) -> ChatText:
    return ChatText._of(datetime.now().strftime(format), UNKNOWN)


class ChatEnvironment(ImmutableSandboxedEnvironment):
    """transformers' chat-template environment, with ``ChatText`` kept through every output."""

    def __init__(self) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols, _Generation],
                         finalize=_finalize)
        self.concat = _concat  # type: ignore[assignment]  # before any template is compiled
        self.chat_template_text = functools.partial(ChatText._of, origin=TEMPLATE)
        self.chat_concat = _concat_operands
        for name, function in list(self.filters.items()):
            self.filters[name] = _tracked_filter(name, function)
        self.filters.update(tojson=_tojson, join=_join, as_text=_as_text)
        self.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)

    def wrap_str_format(self, value: Any):
        """``"...".format(...)`` in a template: the sandbox's formatter, its result of one origin."""
        formatter = super().wrap_str_format(value)
        if formatter is None:
            return None
        template = value.__self__

        def tracked(*args, **kwargs):
            return combined(str.__str__(formatter(*args, **kwargs)), [template, args, kwargs], f"str.{value.__name__}")

        return tracked


_environment: ChatEnvironment | None = None


@functools.lru_cache(maxsize=32)
def compile_chat_template(source: str) -> jinja2.Template:
    """``source`` compiled (cached); ``ValueError`` naming the line of a syntax error."""
    global _environment
    if _environment is None:
        _environment = ChatEnvironment()
    try:
        tree = _MarkTemplateText().visit(_environment.parse(source))
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ValueError(f"chat template line {e.lineno}: {e.message}") from None
    tree.set_environment(_environment)
    try:
        return _environment.from_string(tree)
    except jinja2.exceptions.TemplateSyntaxError as e:  # e.g. an unknown filter, found when compiling
        raise ValueError(f"chat template line {e.lineno}: {e.message}") from None


# -- inputs -----------------------------------------------------------------------------


def wrapped(value: Any, origin: str, where: str, depth: int = 0) -> Any:
    """``value`` with every string (dict keys too) a ``ChatText`` of ``origin``; JSON-like values only
    for message content (``TypeError`` naming ``where`` otherwise)."""
    if isinstance(value, str):
        return ChatText._of(value, origin)
    if depth > 100:
        raise ValueError(f"{where}: nested more than 100 levels deep")
    if isinstance(value, Mapping):
        return {wrapped(key, origin, where, depth + 1): wrapped(item, origin, f"{where}[{key!r}]", depth + 1)
                for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(wrapped(item, origin, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))
    if value is None or isinstance(value, (bool, int, float)) or origin == TEMPLATE:
        return value
    raise TypeError(f"{where} is a {type(value).__name__}: message values must be str, int, float, bool, None, "
                    "lists or dicts")


def template_source(tok: Tokenizer, chat_template: str | None, has_tools: bool) -> str:
    """The template to render: ``chat_template`` (a template, or the name of one of the model's),
    else the model directory's; never a guess."""
    if chat_template is not None and not isinstance(chat_template, str):
        raise TypeError(f"chat_template must be a str or None, not {type(chat_template).__name__}")
    known = tok.chat_template
    if isinstance(known, Mapping):
        if chat_template in known:
            return known[chat_template]
        if chat_template is None:
            name = "tool_use" if has_tools and "tool_use" in known else "default"
            if name not in known:
                raise ValueError(f"this Tokenizer's chat templates are named {sorted(known)}: pass "
                                 "chat_template=<one of them, or a template>")
            return known[name]
    if chat_template is not None:
        return chat_template
    if known is None:
        raise ValueError("this Tokenizer has no chat template (a model directory given to kimi_tok.load() "
                         "provides one in tokenizer_config.json or chat_template.jinja): pass chat_template=...")
    return known


@functools.lru_cache(maxsize=8)
def _special_pattern(specials: tuple[str, ...]) -> re.Pattern | None:
    if not specials:
        return None
    return re.compile("|".join(re.escape(text) for text in sorted(specials, key=len, reverse=True)))


def render(tok: Tokenizer, messages: Sequence[Mapping], chat_template: str | None = None,
           add_generation_prompt: bool = False, template_vars: Mapping[str, Any] | None = None
           ) -> list[tuple[str, bool]]:
    """The ``(text, allow_special)`` segments of ``messages`` rendered with the chat template."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TypeError(f"messages must be a list of dicts, not {type(messages).__name__}")
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise TypeError(f"messages[{i}] must be a dict, not {type(message).__name__}")
    if not isinstance(add_generation_prompt, bool):
        raise TypeError(f"add_generation_prompt must be a bool, not {type(add_generation_prompt).__name__}")
    template_vars = dict(template_vars or {})
    source = template_source(tok, chat_template, bool(template_vars.get("tools")))
    template = compile_chat_template(source)
    variables = {name: wrapped(value, MESSAGE if name in MESSAGE_VARS else TEMPLATE, name)
                 for name, value in template_vars.items()}
    for name in MESSAGE_VARS:
        variables.setdefault(name, None)
    variables["messages"] = wrapped(list(messages), MESSAGE, "messages")
    variables["add_generation_prompt"] = add_generation_prompt
    token = _specials.set(_special_pattern(tuple(sorted(tok.special_tokens))))
    try:
        return segments_of(template.render(variables))
    except TrustBoundaryError:
        raise
    except jinja2.exceptions.TemplateError as e:  # raise_exception(...), undefined or unsafe use, ...
        raise ValueError(f"chat template{_line(e)}: {e}") from None
    except TypeError as e:  # the template's own error (an operation on values that do not fit), with its line
        raise TypeError(f"chat template{_line(e)}: {e}") from e
    except Exception as e:
        raise ValueError(f"chat template{_line(e)}: {type(e).__name__}: {e}") from e
    finally:
        _specials.reset(token)


def _line(error: BaseException) -> str:
    """`` line N`` of the template where ``error`` was raised, if Jinja's traceback tells."""
    lineno = getattr(error, "lineno", None)
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            lineno = tb.tb_lineno
        tb = tb.tb_next
    return f" line {lineno}" if lineno else ""


def segments_of(rendered: ChatText) -> list[tuple[str, bool]]:
    """Template text as ``allow_special=True`` segments, each message value as a ``False`` one."""
    segments: list[tuple[str, bool]] = []
    for text, origin in _parts_of(rendered):
        if origin == UNKNOWN:
            token = _special_in(text)
            if token is not None:
                raise TrustBoundaryError(f"chat template: it output {_preview(text)}, text of unknown origin (made by "
                                 f"an operation that does not keep the trust boundary) holding the special "
                                 f"token {token!r}: it cannot tell template text from message text there")
        segments.append((str.__str__(text), origin == TEMPLATE))
    return segments


def _preview(text: str) -> str:
    return repr(text) if len(text) <= 60 else repr(text[:57]) + "..."


def apply_chat_template(tok: Tokenizer, messages: Sequence[Mapping], chat_template: str | None,
                        add_generation_prompt: bool, tokenize: bool, template_vars: Mapping[str, Any]):
    """``Tokenizer.apply_chat_template``: an ``Encoding`` of the segments, or the segments."""
    if not isinstance(tokenize, bool):
        raise TypeError(f"tokenize must be a bool, not {type(tokenize).__name__}")
    segments = render(tok, messages, chat_template, add_generation_prompt, template_vars)
    return tok.encode_segments(segments) if tokenize else segments
