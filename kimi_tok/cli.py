"""``kimi-tok``: encode, count and decode from the shell.

    kimi-tok count prompt.txt
    echo "hello" | kimi-tok encode -
    kimi-tok encode --segments chat.json --out ids.npy
    kimi-tok decode ids.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


class UserError(Exception):
    """A mistake in the command line or its input: printed as one line, exit 2."""


def _read_text(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text("utf-8")
    except FileNotFoundError:
        raise UserError(f"{source}: no such file") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{source}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _segments(args) -> list[tuple[str, bool]]:
    text = _read_text(args.input)
    if not args.segments:
        return [(text, args.allow_special)]
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{args.input}: invalid JSON: {e}") from None
    if not isinstance(data, list):
        raise UserError(f"{args.input}: expected a JSON list of [text, allow_special] pairs")
    return [tuple(seg) if isinstance(seg, list) else seg for seg in data]


def _encode(args) -> np.ndarray:
    import kimi_tok

    try:
        return kimi_tok.kimi_k3().encode_to_numpy(_segments(args), tiktoken_safe=not args.no_tiktoken_safe)
    except TypeError as e:
        raise UserError(f"{args.input}: {e}") from None


def cmd_encode(args) -> None:
    ids = _encode(args)
    if args.out and args.out.endswith(".npy"):
        np.save(args.out, ids)
    else:
        text = json.dumps(ids.tolist())
        if args.out:
            Path(args.out).write_text(text + "\n")
        else:
            print(text)


def cmd_count(args) -> None:
    print(len(_encode(args)))


def cmd_decode(args) -> None:
    import kimi_tok

    if args.input.endswith(".npy"):
        try:
            ids = np.load(args.input)
        except (OSError, ValueError) as e:
            raise UserError(f"{args.input}: not a .npy array: {e}") from None
    else:
        try:
            ids = json.loads(_read_text(args.input))
        except json.JSONDecodeError as e:
            raise UserError(f"{args.input}: invalid JSON: {e}") from None
    try:
        sys.stdout.write(kimi_tok.kimi_k3().decode(ids))
    except (TypeError, ValueError) as e:
        raise UserError(f"{args.input}: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kimi-tok",
        description="The exact Kimi K3 tokenizer (same ids as the official tiktoken path).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, help_ in (
        ("encode", cmd_encode, "print token ids of a text (or write them with --out)"),
        ("count", cmd_count, "print the number of tokens only"),
    ):
        p = sub.add_parser(name, help=help_)
        p.add_argument("input", help="a UTF-8 text file, or - for stdin")
        p.add_argument("--segments", action="store_true",
                       help="input is a JSON list of [text, allow_special] segments")
        p.add_argument("--allow-special", action="store_true",
                       help="treat special-token text (e.g. <|open|>) as control tokens")
        p.add_argument("--no-tiktoken-safe", action="store_true",
                       help="encode each segment whole (no 400k/25k chunking; ids may differ)")
        if name == "encode":
            p.add_argument("--out", help="write ids to this file (.npy, or JSON otherwise)")
        p.set_defaults(func=func)
    p = sub.add_parser("decode", help="ids (.npy or a JSON list) back to text")
    p.add_argument("input", help="a .npy file, a JSON file of ids, or - for stdin")
    p.set_defaults(func=cmd_decode)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except UserError as e:
        print(f"kimi-tok: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
