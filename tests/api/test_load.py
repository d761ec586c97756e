"""Loading: model files and dirs, tiktoken Encodings, custom patterns (the PCRE2 path), errors."""

from __future__ import annotations

import ast
import base64
import importlib
import inspect
import json
from pathlib import Path

import numpy as np
import pcre2
import pytest
import tiktoken

import kimi_tok
from kimi_tok import KIMI_PATTERN
from kimi_tok.pipeline.pretokenize import RegexPreTokenizer, to_pcre2
from kimi_tok.samples import sample_prompt, sample_text
from tests.parity import assert_parity
from tests.reference import Reference, data_dir, load_pattern, load_special_tokens, make_reference_encoding

# ``kimi_tok.load`` is the load() function (it shadows the submodule of the same name).
LOAD_MODULE = importlib.import_module("kimi_tok.vocab.kimi_k3")

MODEL = data_dir() / "tiktoken.model"
SPECIALS_JSON = data_dir() / "special_tokens.json"

EDGE_TEXTS = [
    "", "hello world", "I'LL we'Re it's 's don'T it'ſ", "  leading and trailing  ", "a\r\nb\r\rc\n\n\n",
    "1 12 123 1234 12345 ١٢٣٤ ①②", "中文字符 𠀀𠮷 \U00031350 \U0002ebf0", "e\u0301 \u0301 \u0301\u0301",
    "👨\u200d👩\u200d👧 🇯🇵 1️⃣", "\x00\x1c\x1d\xa0\u3000\u2028\x85", "<|open|> <|not_special|> [EOS]<|sep|>",
    "x" + "a" * 25_001 + " " * 25_001, "Привет, мир! ΑΛΦΑ Straße ǅ", "def f(x):\n\treturn x**2  # ok\n",
    "\ud800 lone \ude00 surrogates \ud83d\ude00",
]


def edge_segments() -> list[tuple[str, bool]]:
    return [(t, allow) for t in EDGE_TEXTS for allow in (False, True)]


def sample_segments() -> list[tuple[str, bool]]:
    return sample_prompt(60_000, seed=41) + edge_segments()


class PatternReference(Reference):
    """The reference chunking + tiktoken, around any tiktoken.Encoding."""

    def __init__(self, enc: tiktoken.Encoding) -> None:
        self.enc = enc


# ---------------------------------------------------------------------------------------------
# Equivalent ways to get the Kimi K3 tokenizer
# ---------------------------------------------------------------------------------------------


def test_load_model_file_with_special_tokens_path(tok, ref):
    """load(tiktoken.model, special_tokens=special_tokens.json) encodes like kimi_k3() and the reference."""
    loaded = kimi_tok.load(MODEL, special_tokens=SPECIALS_JSON)
    loaded_str = kimi_tok.load(str(MODEL), special_tokens=str(SPECIALS_JSON))
    segs = sample_segments()
    expected = assert_parity(loaded, ref, segs)
    assert tok.encode_segments(segs).ids == expected
    assert loaded_str.encode_segments(segs).ids == expected
    assert loaded.n_vocab == tok.n_vocab and loaded.special_tokens == tok.special_tokens


def test_load_model_file_with_special_tokens_dict(ref):
    """special_tokens may be a {text: id} dict."""
    loaded = kimi_tok.load(MODEL, special_tokens=load_special_tokens())
    assert_parity(loaded, ref, edge_segments())


def test_the_k3_model_file_without_specials_gets_the_k3_specials(tmp_path, tok, ref):
    """The K3 vocabulary (known by its sha256) loaded with no special tokens gets its 256: a chat's
    control tokens are never silently encoded as text."""
    loaded = kimi_tok.load(MODEL)
    assert loaded.special_tokens == tok.special_tokens
    assert loaded.encode_segments([("<|open|>", True), ("x", False)]).ids == ref.encode_segments(
        [("<|open|>", True), ("x", False)])
    assert_parity(loaded, ref, edge_segments())
    (tmp_path / "tiktoken.model").write_bytes(MODEL.read_bytes())  # a model dir with no config: the same
    assert kimi_tok.load(tmp_path).special_tokens == tok.special_tokens


def test_other_model_files_without_specials_have_none(tmp_path):
    """Any other vocabulary keeps tiktoken's behaviour: no special tokens unless given."""
    edited = tmp_path / "edited.tiktoken"
    edited.write_bytes(MODEL.read_bytes() + b"\n")  # one blank line more: another sha256, the same ranks
    loaded = kimi_tok.load(edited)
    assert loaded.special_tokens == {}
    assert loaded.encode("<|open|>x", allow_special=True).ids == loaded.encode("<|open|>x").ids


def _tokenizer_config(specials: dict[str, int]) -> dict:
    return {
        "tokenizer_class": "TikTokenTokenizer",
        "added_tokens_decoder": {
            str(id_): {"content": text, "lstrip": False, "normalized": False, "rstrip": False,
                       "single_word": False, "special": True}
            for text, id_ in specials.items()
        },
    }


def test_load_model_dir(tmp_path, tok, ref):
    """A dir with tiktoken.model + tokenizer_config.json (added_tokens_decoder) is the Kimi tokenizer."""
    (tmp_path / "tiktoken.model").symlink_to(MODEL)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(_tokenizer_config(load_special_tokens())), "utf-8")
    loaded = kimi_tok.load(tmp_path)
    assert loaded.special_tokens == tok.special_tokens
    segs = sample_segments()
    assert loaded.encode_segments(segs).ids == tok.encode_segments(segs).ids
    assert_parity(loaded, ref, edge_segments())
    assert kimi_tok.load(str(tmp_path)).special_tokens == tok.special_tokens


def test_load_model_dir_specials_argument_wins(tmp_path, ref):
    """An explicit special_tokens argument replaces the dir's tokenizer_config.json."""
    (tmp_path / "tiktoken.model").symlink_to(MODEL)
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps(_tokenizer_config({"[BOS]": 163584})), "utf-8")
    assert kimi_tok.load(tmp_path).special_tokens == {"[BOS]": 163584}
    loaded = kimi_tok.load(tmp_path, special_tokens=SPECIALS_JSON)
    assert_parity(loaded, ref, edge_segments())


def test_from_tiktoken_reference_encoding(tok, ref):
    """from_tiktoken(the reference Encoding) gives the same ids."""
    wrapped = kimi_tok.from_tiktoken(make_reference_encoding())
    assert wrapped.n_vocab == tok.n_vocab
    segs = sample_segments()
    assert_parity(wrapped, ref, segs)


def test_from_tiktoken_rejects_other_objects():
    with pytest.raises(TypeError):
        kimi_tok.from_tiktoken("cl100k_base")


# ---------------------------------------------------------------------------------------------
# Custom patterns: the generic PCRE2 JIT path
# ---------------------------------------------------------------------------------------------

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def openai_patterns() -> dict[str, str]:
    """Pattern texts copied from tiktoken_ext.openai_public's source (no download), else GPT-2's."""
    patterns = {"gpt2": GPT2_PATTERN}
    try:
        import tiktoken_ext.openai_public as public
    except ImportError:
        return patterns
    patterns["r50k"] = public.r50k_pat_str
    tree = ast.parse(inspect.getsource(public))
    for fn in tree.body:
        if not isinstance(fn, ast.FunctionDef) or fn.name not in ("cl100k_base", "o200k_base"):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.Dict):  # {"pat_str": r"..."}
                for key, value in zip(node.keys, node.values):
                    if isinstance(key, ast.Constant) and key.value == "pat_str" and isinstance(value, ast.Constant):
                        patterns[fn.name] = value.value
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "pat_str":
                try:  # pat_str = "|".join([r"...", ...])
                    patterns[fn.name] = "|".join(ast.literal_eval(node.value.args[0]))
                except (ValueError, AttributeError, IndexError):
                    pass
    return patterns


PATTERNS = openai_patterns()
PATTERNS["kimi-wrapped"] = "(?:" + KIMI_PATTERN + ")"  # same language, different text: PCRE2 path


@pytest.fixture(scope="module")
def kimi_ranks():
    return make_reference_encoding()._mergeable_ranks


@pytest.mark.parametrize("name", list(PATTERNS))
def test_custom_pattern_matches_tiktoken(name, kimi_ranks):
    """The Kimi vocabulary with another pattern: kimi_tok (PCRE2 JIT) == tiktoken with that pattern."""
    pattern = PATTERNS[name]
    specials = load_special_tokens()
    enc = tiktoken.Encoding(name=f"kimi-{name}", pat_str=pattern, mergeable_ranks=kimi_ranks, special_tokens=specials)
    loaded = kimi_tok.load(MODEL, pattern=pattern, special_tokens=SPECIALS_JSON)
    assert isinstance(loaded.engine.stages.pretokenizer, RegexPreTokenizer)  # really the generic path
    expected_ref = PatternReference(enc)
    segs = sample_segments() + [(sample_text(30_000, seed=42), False)]
    assert_parity(loaded, expected_ref, segs)
    assert_parity(loaded, expected_ref, segs[:40], tiktoken_safe=False)
    wrapped = kimi_tok.from_tiktoken(enc)
    assert wrapped.encode_segments(segs).ids == loaded.encode_segments(segs).ids


@pytest.mark.parametrize("name", [n for n in ("cl100k_base", "o200k_base") if n in PATTERNS])
def test_custom_pattern_every_code_point(name, kimi_ranks):
    """cl100k/o200k patterns through PCRE2: every code point between letters, same ids as tiktoken."""
    pattern = PATTERNS[name]
    enc = tiktoken.Encoding(name=f"kimi-{name}", pat_str=pattern, mergeable_ranks=kimi_ranks, special_tokens={})
    loaded = kimi_tok.load(MODEL, pattern=pattern)
    from tests.parity import assert_batched_parity

    samples = [f"a{chr(c)}'s {chr(c)}1" for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    assert_batched_parity(loaded, enc.encode_ordinary, samples, label=f"pattern {name}", chunk=100_000)


@pytest.mark.parametrize("name", list(PATTERNS) + ["kimi"])
def test_to_pcre2_compiles(name):
    """to_pcre2 output compiles with PCRE2 (JIT) for every tiktoken pattern we know."""
    pattern = KIMI_PATTERN if name == "kimi" else PATTERNS[name]
    translated = to_pcre2(pattern)
    assert "&&" not in translated
    pcre2.compile(translated, jit=True)


def test_to_pcre2_examples():
    """The documented translations: Script=Han and Unicode White_Space."""
    assert to_pcre2(r"\p{Han}+|\s+") == r"\p{sc:Han}+|\p{White_Space}+"
    assert to_pcre2(r"\s++$") == r"\p{White_Space}++\z"


def test_regex_pretokenizer_splits_like_the_pattern():
    """RegexPreTokenizer(KIMI_PATTERN).split cuts a few texts as the Kimi pattern is documented to."""
    split = RegexPreTokenizer(KIMI_PATTERN).split
    assert split("Hello world") == ["Hello", " world"]
    assert split("中文abc") == ["中文", "abc"]
    assert split("12345") == ["123", "45"]
    assert split("I'LL go") == ["I'LL", " go"]
    assert split("a  b") == ["a", " ", " b"]
    assert split("x\r\n\r\ny") == ["x", "\r\n\r\n", "y"]
    assert split("") == []


@pytest.mark.parametrize("bad", ["(", "[abc", r"\p{NoSuchProperty}", "a{2,1}"])
def test_bad_pattern_raises_value_error(bad):
    with pytest.raises(ValueError):
        kimi_tok.load(MODEL, pattern=bad)


# ---------------------------------------------------------------------------------------------
# Small hand-made vocabularies
# ---------------------------------------------------------------------------------------------


def _model_text(tokens: list[bytes]) -> str:
    return "".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(tokens))


BYTE_TOKENS = [bytes([b]) for b in range(256)]


def test_small_vocabulary_matches_tiktoken(tmp_path):
    """A tiny vocabulary (bytes + a few merges, one unreachable whole-word token) == tiktoken."""
    extra = [b"he", b"ll", b"hell", b"o w", b" w", b"or", b"ld", b"hello", b"\xe4\xb8", b"<|"]
    tokens = BYTE_TOKENS + extra
    path = tmp_path / "small.tiktoken"
    path.write_text(_model_text(tokens), "ascii")
    specials = {"<|x|>": len(tokens), "[Y]": len(tokens) + 5}
    enc = tiktoken.Encoding(
        name="small", pat_str=load_pattern(), mergeable_ranks={t: r for r, t in enumerate(tokens)},
        special_tokens=specials,
    )
    loaded = kimi_tok.load(path, special_tokens=specials)
    assert loaded.n_vocab == len(tokens) + 6
    segs = edge_segments() + [("hello world hellos <|x|>[Y] 中文", True), ("hello <|x|>", False)]
    assert_parity(loaded, PatternReference(enc), segs)
    with pytest.raises(ValueError):
        loaded.decode([len(tokens) + 1])  # the gap between two special ids is not a token


def test_crlf_lines_and_blank_lines_are_accepted(tmp_path):
    """CRLF line ends and blank lines (skipped by tiktoken) parse like plain LF files."""
    lines = _model_text(BYTE_TOKENS).splitlines()
    path = tmp_path / "crlf.tiktoken"
    path.write_bytes(("\r\n".join(lines[:100]) + "\r\n\r\n" + "\n".join(lines[100:]) + "\n\n").encode())
    loaded = kimi_tok.load(path)
    assert loaded.n_vocab == 256
    assert loaded.encode("hi").ids == [ord("h"), ord("i")]


# ---------------------------------------------------------------------------------------------
# Corrupt files: ValueError naming the file and the line
# ---------------------------------------------------------------------------------------------


def _lines() -> list[str]:
    return _model_text(BYTE_TOKENS).splitlines()


def _corrupt(lines: list[str], line_no: int, new: str) -> str:
    lines = list(lines)
    lines[line_no - 1] = new
    return "\n".join(lines) + "\n"


CORRUPTIONS = {
    # name: (file text, the line the error must name)
    "bad-base64-char": (_corrupt(_lines(), 7, "QU*= 6"), 7),
    "base64-wrong-length": (_corrupt(_lines(), 8, "QUJ 7"), 8),
    "missing-rank-field": (_corrupt(_lines(), 5, "BA=="), 5),
    "empty-rank-field": (_corrupt(_lines(), 5, "BA== "), 5),
    "rank-not-a-number": (_corrupt(_lines(), 9, "CA== x8"), 9),
    "negative-rank": (_corrupt(_lines(), 9, "CA== -8"), 9),
    "duplicate-rank": (_corrupt(_lines(), 10, "CQ== 3"), 10),
    "gap-in-ranks": (_corrupt(_lines(), 101, "ZA== 300"), 101),
    "truncated-mid-base64": ("\n".join(_lines()[:40]) + "\nKA", 41),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corrupt_model_file(tmp_path, name):
    """A corrupt tiktoken.model raises ValueError naming the file and the bad line."""
    text, line = CORRUPTIONS[name]
    path = tmp_path / f"corrupt-{name}.tiktoken"
    path.write_text(text, "ascii")
    with pytest.raises(ValueError) as info:
        kimi_tok.load(path)
    message = str(info.value)
    assert path.name in message, message
    assert f"line {line}" in message, message


def test_truncated_real_model_file(tmp_path):
    """The real file cut mid-base64 (line 1000) or mid-rank (line 2000) names that line."""
    data = MODEL.read_bytes()
    starts = [0] + [i + 1 for i, b in enumerate(data[:200_000]) if b == 0x0A]
    path = tmp_path / "tiktoken.model"
    path.write_bytes(data[: starts[999] + 3])  # 3 base64 chars of line 1000
    with pytest.raises(ValueError, match=r"tiktoken\.model.*line 1000"):
        kimi_tok.load(path)
    line_2000 = data[starts[1999]: starts[2000]]
    assert line_2000.rstrip(b"\n").endswith(b" 1999")
    path.write_bytes(data[: starts[2000] - 2])  # "... 1999" cut to "... 199": a duplicate rank
    with pytest.raises(ValueError, match=r"tiktoken\.model.*line 2000"):
        kimi_tok.load(tmp_path)


def test_empty_model_file(tmp_path):
    path = tmp_path / "empty.tiktoken"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match="empty.tiktoken"):
        kimi_tok.load(path)


def _model_dir(tmp_path: Path, config: bytes) -> Path:
    (tmp_path / "tiktoken.model").write_text(_model_text(BYTE_TOKENS), "ascii")
    (tmp_path / "tokenizer_config.json").write_bytes(config)
    return tmp_path


def test_non_utf8_tokenizer_config(tmp_path):
    """A tokenizer_config.json that is not UTF-8 (bad byte on line 3): ValueError naming file and line."""
    config = b'{\n  "added_tokens_decoder": {\n    "256": {"content": "<|\xff|>"}\n  }\n}\n'
    with pytest.raises(ValueError) as info:
        kimi_tok.load(_model_dir(tmp_path, config))
    message = str(info.value)
    assert "tokenizer_config.json" in message, message
    assert "line 3" in message, message


def test_invalid_json_tokenizer_config(tmp_path):
    """A tokenizer_config.json with a JSON syntax error on line 2: ValueError naming file and line."""
    config = b'{\n  "added_tokens_decoder": {,}\n}\n'
    with pytest.raises(ValueError) as info:
        kimi_tok.load(_model_dir(tmp_path, config))
    message = str(info.value)
    assert "tokenizer_config.json" in message and "line 2" in message, message


@pytest.mark.parametrize(
    "config",
    [b"[]", b'{"added_tokens_decoder": 5}', b'{"added_tokens_decoder": {"x": {"content": "a"}}}',
     b'{"added_tokens_decoder": {"300": {"no_content": 1}}}'],
)
def test_malformed_tokenizer_config(tmp_path, config):
    with pytest.raises(ValueError, match="tokenizer_config.json"):
        kimi_tok.load(_model_dir(tmp_path, config))


def test_special_tokens_json_errors(tmp_path):
    """A bad special_tokens.json raises ValueError naming it."""
    model = tmp_path / "m.tiktoken"
    model.write_text(_model_text(BYTE_TOKENS), "ascii")
    bad = tmp_path / "bad_specials.json"
    for content in (b"\xff\xfe", b"[1, 2]", b'{"<|a|>": "300"}', b'{"<|a|>": true}'):
        bad.write_bytes(content)
        with pytest.raises(ValueError, match="bad_specials.json"):
            kimi_tok.load(model, special_tokens=bad)


def test_bad_special_token_ids(tmp_path):
    """Special ids must not collide with ranks or with each other."""
    model = tmp_path / "m.tiktoken"
    model.write_text(_model_text(BYTE_TOKENS), "ascii")
    with pytest.raises(ValueError, match="collides"):
        kimi_tok.load(model, special_tokens={"<|a|>": 10})
    with pytest.raises(ValueError):
        kimi_tok.load(model, special_tokens={"<|a|>": 300, "<|b|>": 300})
    with pytest.raises(ValueError):
        kimi_tok.load(model, special_tokens={"<|a|>": -1})
    with pytest.raises(ValueError):
        kimi_tok.load(model, special_tokens={"": 300})


def test_embedded_vocabulary_sha256_mismatch(monkeypatch):
    """A damaged embedded vocabulary (here: a wrong expected digest) raises ValueError about sha256."""
    vocabulary, specials = LOAD_MODULE.embedded_kimi_k3()
    assert len(specials) == 256 and vocabulary.token_offsets.shape[0] - 1 == 163_584
    monkeypatch.setattr(LOAD_MODULE, "KIMI_K3_SHA256", "0" * 64)
    with pytest.raises(ValueError, match="sha256"):
        LOAD_MODULE.embedded_kimi_k3()


def test_embedded_vocabulary_is_the_shared_file():
    """The embedded copy decodes to exactly ../shared/kimi-k3/tiktoken.model's tokens."""
    embedded, _ = LOAD_MODULE.embedded_kimi_k3()
    shared = kimi_tok.vocab.parse_tiktoken_bpe(MODEL.read_bytes(), str(MODEL))  # the validating kernel
    assert (embedded.token_offsets == shared.token_offsets).all()
    assert (embedded.token_bytes == shared.token_bytes).all()


# ---------------------------------------------------------------------------------------------
# The on-disk cache of built BPE tables ($KIMI_TOK_CACHE_DIR)
# ---------------------------------------------------------------------------------------------

SMALL_EXTRA = [b"he", b"ll", b"hell", b"o w", b" w", b"or", b"ld", b"hello", b"\xe4\xb8", b"<|"]


def _small_model(tmp_path: Path) -> tuple[Path, PatternReference]:
    tokens = BYTE_TOKENS + SMALL_EXTRA
    path = tmp_path / "small.tiktoken"
    path.write_text(_model_text(tokens), "ascii")
    enc = tiktoken.Encoding(name="small", pat_str=load_pattern(),
                            mergeable_ranks={t: r for r, t in enumerate(tokens)}, special_tokens={})
    return path, PatternReference(enc)


def test_bpe_table_cache_is_written_and_reused(tmp_path, monkeypatch):
    """The first load writes one cache file; a second load reads it and encodes the same."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KIMI_TOK_CACHE_DIR", str(cache))
    model, small_ref = _small_model(tmp_path)
    first = kimi_tok.load(model)
    files = sorted(cache.iterdir())
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    second = kimi_tok.load(model)
    assert sorted(cache.iterdir()) == files and files[0].stat().st_mtime_ns == stamp
    assert_parity(first, small_ref, edge_segments())
    assert_parity(second, small_ref, edge_segments())


def test_bpe_table_cache_is_named_by_the_hashing_source_too(tmp_path, monkeypatch):
    """The hashes in hashing.py place the keys: tables built with other hashes are never read."""
    from kimi_tok.native import hashing
    from kimi_tok.pipeline import bpe

    token_bytes = np.frombuffer(b"abc", dtype=np.uint8)
    offsets = np.array([0, 1, 2, 3], dtype=np.int64)
    before = bpe.build.tables_digest(token_bytes, offsets)
    edited = tmp_path / "hashing.py"
    edited.write_bytes(Path(hashing.__file__).read_bytes() + b"\n# FNV_PRIME changed\n")
    monkeypatch.setattr(hashing, "__file__", str(edited))
    assert bpe.build.tables_digest(token_bytes, offsets) != before


def test_bpe_table_cache_unwritable_dir(tmp_path, monkeypatch):
    """A cache dir that cannot be created (a file is in the way) only means no caching."""
    blocker = tmp_path / "not_a_dir"
    blocker.write_bytes(b"")
    monkeypatch.setenv("KIMI_TOK_CACHE_DIR", str(blocker / "cache"))
    model, small_ref = _small_model(tmp_path)
    assert_parity(kimi_tok.load(model), small_ref, edge_segments())


def _damage(path: Path, how: str) -> None:
    import numpy as np

    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(b"not an npz file at all\n" * 10)
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "npy-not-npz":
        with open(path, "wb") as f:
            np.save(f, np.arange(10))
    elif how == "missing-field":
        with np.load(path) as stored:
            kept = {name: stored[name] for name in list(stored.files)[1:]}
        with open(path, "wb") as f:
            np.savez(f, **kept)
    else:  # pragma: no cover
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["empty", "garbage", "truncated", "npy-not-npz", "missing-field"])
def test_damaged_bpe_table_cache_is_rebuilt(tmp_path, monkeypatch, how):
    """A damaged cache file must not break loading: the tables are built again (bpe.py's promise)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("KIMI_TOK_CACHE_DIR", str(cache))
    model, small_ref = _small_model(tmp_path)
    kimi_tok.load(model)
    (cached,) = cache.iterdir()
    _damage(cached, how)
    assert_parity(kimi_tok.load(model), small_ref, edge_segments())


def test_vocabulary_missing_a_byte_or_repeating_a_token(tmp_path):
    """A vocabulary without some single byte, or with one token at two ranks, is rejected."""
    missing = tmp_path / "missing_byte.tiktoken"
    missing.write_text(_model_text([t for t in BYTE_TOKENS if t != b"\x80"]), "ascii")
    with pytest.raises(ValueError):
        kimi_tok.load(missing)
    repeated = tmp_path / "repeated.tiktoken"
    repeated.write_text(_model_text(BYTE_TOKENS + [b"ab", b"ab"]), "ascii")
    with pytest.raises(ValueError):
        kimi_tok.load(repeated)


def test_vocabulary_without_special_tokens_matches_tiktoken():
    """No special tokens at all: special-looking text is text in both modes, ids as tiktoken's."""
    import tiktoken

    from tests.reference import make_reference_encoding

    base = make_reference_encoding()
    enc = tiktoken.Encoding("no_specials", pat_str=base._pat_str, mergeable_ranks=base._mergeable_ranks,
                            special_tokens={})
    tok = kimi_tok.from_tiktoken(enc)
    assert tok.special_tokens == {}
    for text in ["hello <|open|> world [EOS]", "", "line\n<|sep|>\tx"]:
        for allow_special in (False, True):
            assert tok.encode(text, allow_special=allow_special, tiktoken_safe=False).ids == enc.encode(
                text, disallowed_special=()
            )
