"""The ``kimi-tok`` command, run for real: ``python -m kimi_tok ...`` in a subprocess.

Expected ids come from the library (``tok``), whose parity with tiktoken the rest of
the suite checks. User mistakes must give one ``kimi-tok: error: ...`` line, exit
status 2 and no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CHAT = [["<|open|>", True], ["message", False], [' role="user"', False], ["<|sep|>", True],
        ["Hi! What is <|open|>?\r\n", False], ["<|close|>", True], ["message", False], ["<|sep|>", True]]


def kimi_tok(*args: str, stdin: bytes | None = None, env: dict | None = None, cwd: Path = REPO_ROOT):
    """Run ``python -m kimi_tok ARGS``; returns the CompletedProcess (stdout/stderr as bytes)."""
    return subprocess.run(
        [sys.executable, "-m", "kimi_tok", *args],
        input=stdin if stdin is not None else b"",
        capture_output=True,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), **(env or {})},
        timeout=300,
    )


def ok(*args: str, **kwargs) -> str:
    result = kimi_tok(*args, **kwargs)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode("utf-8")


def assert_user_error(result, *words: str) -> None:
    stderr = result.stderr.decode()
    assert result.returncode == 2, (result.returncode, stderr)
    assert "Traceback" not in stderr
    assert stderr.startswith("kimi-tok: error: ") and stderr.count("\n") == 1, stderr
    for word in words:
        assert word in stderr, stderr


@pytest.fixture
def files(tmp_path):
    """A few input files: text with CRLF and a control string, a chat, a JSONL file."""
    text = tmp_path / "prompt.txt"
    text.write_bytes("Hi <|sep|> 我们\r\nline two\n".encode())
    chat = tmp_path / "chat.json"
    chat.write_text(json.dumps(CHAT), encoding="utf-8")
    lines = tmp_path / "texts.jsonl"
    lines.write_text(  # raw U+2028 and U+0085 inside a JSON string do not end a line
        "\n".join(json.dumps(v, ensure_ascii=False) for v in ("plain <|sep|>\u2028\x85", CHAT, "")) + "\r\n", encoding="utf-8"
    )
    return tmp_path


def test_help_explains_the_commands():
    text = ok("--help")
    for word in ("encode", "count", "decode", "verify", "export-hf", "bench", "--segments", "allow_special", "examples:"):
        assert word in text
    for command in ("encode", "count", "decode", "verify", "export-hf"):
        assert "usage: kimi-tok " + command in ok(command, "--help")


def test_encode_a_file_keeps_crlf(tok, files):
    text = (files / "prompt.txt").read_bytes().decode()
    assert json.loads(ok("encode", str(files / "prompt.txt"))) == tok.encode(text).ids
    assert json.loads(ok("encode", str(files / "prompt.txt"), "--allow-special")) == tok.encode(text, True).ids


def test_encode_stdin(tok):
    assert json.loads(ok("encode", stdin="hello world\n".encode())) == tok.encode("hello world\n").ids
    assert json.loads(ok("encode", "-", stdin=b"<|sep|>")) == tok.encode("<|sep|>").ids


def test_no_tiktoken_safe(tok):
    text = "x" + " " * 30_000 + "y"
    chunked = json.loads(ok("encode", stdin=text.encode()))
    whole = json.loads(ok("encode", "--no-tiktoken-safe", stdin=text.encode()))
    assert chunked == tok.encode(text).ids and whole == tok.encode(text, tiktoken_safe=False).ids
    assert chunked != whole


def test_encode_segments_to_npy_and_json(tok, files):
    want = tok.encode_segments([tuple(s) for s in CHAT]).ids
    ok("encode", "--segments", str(files / "chat.json"), "--out", str(files / "ids.npy"))
    ids = np.load(files / "ids.npy")
    assert ids.dtype == np.uint32 and ids.tolist() == want
    ok("encode", "--segments", str(files / "chat.json"), "--out", str(files / "ids.json"))
    assert json.loads((files / "ids.json").read_text()) == want
    assert ok("count", "--segments", str(files / "chat.json")).strip() == str(len(want))


def test_jsonl_one_line_per_input_line(tok, files):
    out = ok("encode", "--jsonl", str(files / "texts.jsonl")).splitlines()
    assert [json.loads(line) for line in out] == [
        tok.encode("plain <|sep|>\u2028\x85").ids,
        tok.encode_segments([tuple(s) for s in CHAT]).ids,
        [],
    ]
    special = ok("encode", "--jsonl", "--allow-special", str(files / "texts.jsonl")).splitlines()
    assert json.loads(special[0]) == tok.encode("plain <|sep|>\u2028\x85", allow_special=True).ids
    counts = ok("count", "--jsonl", str(files / "texts.jsonl")).split()
    assert counts == [str(len(json.loads(line))) for line in out]


def test_decode_round_trips(tok, files):
    text = (files / "prompt.txt").read_bytes().decode()
    np.save(files / "ids.npy", tok.encode_to_numpy([(text, False)]))
    assert kimi_tok("decode", str(files / "ids.npy")).stdout == text.encode()
    (files / "ids.json").write_text(json.dumps(tok.encode(text).ids))
    assert kimi_tok("decode", str(files / "ids.json"), "--out", str(files / "back.txt")).returncode == 0
    assert (files / "back.txt").read_bytes() == text.encode()
    assert kimi_tok("decode", stdin=b"[22931, 2695]").stdout == b"hello world"
    ids_lines = ok("encode", "--jsonl", str(files / "texts.jsonl")).encode()
    decoded = [json.loads(line) for line in ok("decode", "--jsonl", stdin=ids_lines).split("\n")[:-1]]
    assert decoded == ["plain <|sep|>\u2028\x85", "".join(t for t, _ in CHAT), ""]


def test_o_is_the_short_form_of_out(tok, files):
    """Every subcommand with ``--out`` takes ``-o`` too; one real run writes with it."""
    from kimi_tok.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    with_out = {name for name, sub in commands.items() if any("--out" in a.option_strings for a in sub._actions)}
    assert with_out == {"encode", "decode", "corpus"}
    for name in with_out:
        (action,) = [a for a in commands[name]._actions if "--out" in a.option_strings]
        assert action.option_strings == ["-o", "--out"], name
        args = parser.parse_args([name, "input.jsonl", "-o", "somewhere"])
        assert args.out == "somewhere"
    ok("encode", "--segments", str(files / "chat.json"), "-o", str(files / "short.npy"))
    assert np.load(files / "short.npy").tolist() == tok.encode_segments([tuple(s) for s in CHAT]).ids


def write(path: Path, content: bytes) -> str:
    path.write_bytes(content)
    return str(path)


@pytest.mark.parametrize(
    "make_args, words",
    [
        (lambda d: ["encode", str(d / "missing.txt")], ["missing.txt", "no such file"]),
        (lambda d: ["encode", write(d / "bad.bin", b"\xff\xfe text")], ["not UTF-8"]),
        (lambda d: ["encode", "--segments", write(d / "bad.json", b"[[")], ["invalid JSON"]),
        (lambda d: ["encode", "--segments", write(d / "obj.json", b'{"a": 1}')], ["expected a list"]),
        (lambda d: ["encode", "--segments", write(d / "shape.json", b'[["a", true], ["b"]]')], ["segment 1"]),
        (lambda d: ["encode", "--segments", write(d / "flag.json", b'[["a", 1]]')], ["segment 0", "true/false"]),
        (lambda d: ["count", "--jsonl", write(d / "x.jsonl", b'"ok"\n5\n')], ["line 2"]),
        (lambda d: ["encode", "--jsonl", write(d / "y.jsonl", b'"ok"\n'), "--out", str(d / "o.npy")], ["--jsonl"]),
        (lambda d: ["encode", write(d / "t.txt", b"hi"), "--out", str(d / "no" / "dir.json")], ["cannot write"]),
        (lambda d: ["decode", write(d / "range.json", b"[1, 999999]")], ["999999", "not a token id"]),
        (lambda d: ["decode", write(d / "neg.json", b"[-1]")], ["-1"]),
        (lambda d: ["decode", write(d / "float.json", b"[1, 2.5]")], ["item 1", "2.5"]),
        (lambda d: ["decode", write(d / "ids.npy", b"not numpy")], ["not a .npy"]),
        (lambda d: ["decode", str(d / "missing.npy")], ["no such file"]),
        (lambda d: ["export-hf", str(d / "no" / "dir" / "tokenizer.json")], ["cannot write"]),
    ],
    ids=lambda v: "" if callable(v) else v[0],
)
def test_user_mistakes_give_one_line(tmp_path, make_args, words):
    assert_user_error(kimi_tok(*make_args(tmp_path)), *words)


def test_unknown_option_is_a_usage_error():
    result = kimi_tok("encode", "--frobnicate")
    assert result.returncode == 2 and b"Traceback" not in result.stderr
    assert b"unrecognized arguments: --frobnicate" in result.stderr


def test_verify_passes():
    out = ok("verify", "--prompts", "2", "--chars", "30000", "--seed", "7")
    assert out.count(": identical") == 2
    assert "verify: 2 prompts" in out and "0 mismatching prompts" in out


def run_main(code: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``kimi_tok.cli.main(args)`` after ``code`` (to simulate a broken or missing dependency)."""
    script = f"import sys\n{code}\nfrom kimi_tok.cli import main\nsys.exit(main({list(args)!r}))"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, cwd=REPO_ROOT, timeout=300)


def test_verify_reports_a_mismatch_with_exit_status_1():
    drop_last = (
        "import kimi_tok.tokenizer as core\n"
        "real = core.Tokenizer.encode_to_numpy\n"
        "core.Tokenizer.encode_to_numpy = lambda self, *a, **k: real(self, *a, **k)[:-1]"
    )
    result = run_main(drop_last, "verify", "--prompts", "1", "--chars", "5000")
    assert result.returncode == 1, result.stderr.decode()
    assert b"MISMATCH" in result.stdout and b"1 mismatching prompts" in result.stdout


def test_verify_without_tiktoken():
    result = run_main("sys.modules['tiktoken'] = None", "verify")
    assert_user_error(result, "pip install tiktoken")


def test_export_hf(tmp_path):
    out = ok("export-hf", str(tmp_path))
    data = json.loads((tmp_path / "tokenizer.json").read_text("utf-8"))
    assert data["model"]["type"] == "BPE" and len(data["added_tokens"]) == 256
    assert "163,584 tokens" in out


def test_bench_passes_its_arguments_to_bench_bench(tmp_path):
    """``kimi-tok bench`` runs ``python -m bench.bench`` in the checkout, from any directory."""
    out = ok("bench", "--help", cwd=tmp_path)
    assert "usage: python -m bench.bench" in out and "--quick" in out


def test_bench_without_a_checkout(tmp_path):
    result = kimi_tok("bench", "--quick", env={"KIMI_TOK_REPO": str(tmp_path)})
    assert_user_error(result, "bench needs the kimi_tok source checkout", "bench/bench.py")


def test_warmup_compiles_or_checks_every_kernel():
    out = ok("warmup", "--no-processes")
    assert out.startswith("kimi-tok warmup: ") and "in all" in out and "cached in" in out, out
    again = ok("warmup", "--no-processes")  # the first run cached them all
    assert "every kernel was already cached" in again, again
