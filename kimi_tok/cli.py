"""``kimi-tok`` (also ``python -m kimi_tok``): the Kimi K3 tokenizer from the shell.

    echo "hello world" | kimi-tok encode
    kimi-tok count prompt.txt
    kimi-tok encode --segments chat.json --out ids.npy
    kimi-tok encode --jsonl texts.jsonl --out ids.jsonl
    kimi-tok decode ids.npy
    kimi-tok verify
    kimi-tok export-hf tokenizer.json
    kimi-tok corpus train.jsonl --out train.tok
    kimi-tok bench --quick
    kimi-tok warmup

A mistake in the command line or its input prints one line, ``kimi-tok: error: ...``,
and exits with status 2; ``verify`` exits with 1 when it finds a mismatch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from .corpus.records import json_type, segments_from_json

EXIT_OK, EXIT_MISMATCH, EXIT_USAGE = 0, 1, 2
STDIN = "-"

DESCRIPTION = """\
The exact Kimi K3 tokenizer: the same token ids as the official tokenizer
(tiktoken with its "tiktoken-safe" chunking), computed fast.

Text comes from a file or from stdin (use - or leave the file out). Special-token
text such as <|open|> is plain text unless you pass --allow-special; a rendered
chat is best given as --segments, a JSON list of [text, allow_special] pairs, so
that only the control tokens you put there are control tokens."""

EPILOG = """\
examples:
  echo "hello world" | kimi-tok encode          [22931, 2695, 198]
  kimi-tok count notes.txt                      number of tokens
  kimi-tok encode --segments chat.json --out ids.npy
      chat.json: [["<|open|>", true], ["message", false], [" role=\\"user\\"", false],
                  ["<|sep|>", true], ["Hi!", false], ...]
  kimi-tok encode --jsonl texts.jsonl           one JSON line of ids per input line
  kimi-tok decode ids.npy                       ids (.npy or JSON) back to text
  kimi-tok verify                               compare with tiktoken on sample prompts
  kimi-tok export-hf tokenizer.json             a Hugging Face tokenizer.json
  kimi-tok corpus a.jsonl b.jsonl --out DIR     JSONL documents -> .npy shards (resumable; --scheduler: Dask)
  kimi-tok bench --quick                        the benchmark (needs the source checkout)
  kimi-tok warmup                               compile and cache every kernel now (container images, CI)

run "kimi-tok COMMAND --help" for the options of one command; "python -m kimi_tok" is the same program."""


class UserError(Exception):
    """A mistake in the command line or its input: printed as one line, exit status 2."""


# -- reading input ---------------------------------------------------------------


def _read_bytes(source: str) -> bytes:
    if source == STDIN:
        return sys.stdin.buffer.read()
    try:
        return Path(source).read_bytes()
    except FileNotFoundError:
        raise UserError(f"{source}: no such file") from None
    except OSError as e:
        raise UserError(f"{source}: cannot read: {e.strerror}") from None


def _read_text(source: str) -> str:
    """The file's text exactly as stored (no newline translation: CRLF changes ids)."""
    raw = _read_bytes(source)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{_name(source)}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def _name(source: str) -> str:
    return "stdin" if source == STDIN else source


def _parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: invalid JSON: {e}") from None


def _segments_from_json(data: Any, where: str) -> list[tuple[str, bool]]:
    """``[[text, allow_special], ...]`` checked item by item."""
    try:
        return segments_from_json(data)
    except ValueError as e:
        raise UserError(f"{where}: {e}") from None


def _jsonl_line_segments(line: str, where: str, allow_special: bool) -> list[tuple[str, bool]]:
    """One JSONL line: a JSON string (a text) or a list of segments."""
    data = _parse_json(line, where)
    if isinstance(data, str):
        return [(data, allow_special)]
    if isinstance(data, list):
        return _segments_from_json(data, where)
    raise UserError(f"{where}: expected a JSON string or a list of [text, allow_special] pairs, got {json_type(data)}")


def _jsonl_lines(source: str) -> list[tuple[str, str]]:
    """``(where, line)`` for each line of a JSONL input.

    Lines end at ``\n`` only: JSON text may hold a raw U+2028 or U+0085, which
    ``str.splitlines`` would wrongly treat as line ends.
    """
    lines = _read_text(source).split("\n")
    if lines[-1] == "":
        lines.pop()
    return [(f"{_name(source)}: line {n}", line) for n, line in enumerate(lines, 1)]


def _inputs(args) -> list[tuple[str, list[tuple[str, bool]]]]:
    """``(where, segments)`` per output line: one for a text or --segments, one per line for --jsonl."""
    if args.jsonl:
        return [(where, _jsonl_line_segments(line, where, args.allow_special)) for where, line in _jsonl_lines(args.input)]
    where = _name(args.input)
    if args.segments:
        return [(where, _segments_from_json(_parse_json(_read_text(args.input), where), where))]
    return [(where, [(_read_text(args.input), args.allow_special)])]


# -- writing output --------------------------------------------------------------


def _write(out: str | None, data: bytes) -> None:
    if out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return
    try:
        Path(out).write_bytes(data)
    except OSError as e:
        raise UserError(f"{out}: cannot write: {e.strerror}") from None


def _write_npy(out: str, ids: np.ndarray) -> None:
    try:
        np.save(out, ids)
    except OSError as e:
        raise UserError(f"{out}: cannot write: {e.strerror}") from None


def _json_lines(values: list[Any]) -> bytes:
    return "".join(json.dumps(v, ensure_ascii=False) + "\n" for v in values).encode("utf-8")


# -- encode, count, decode --------------------------------------------------------


def _tokenizer():
    import kimi_tok

    try:
        return kimi_tok.kimi_k3()
    except ValueError as e:  # e.g. KIMI_TOK_N_JOBS=abc
        raise UserError(str(e)) from None


def _encode_all(args) -> list[np.ndarray]:
    tok = _tokenizer()
    out = []
    for where, segments in _inputs(args):
        try:
            out.append(tok.encode_to_numpy(segments, tiktoken_safe=not args.no_tiktoken_safe))
        except (TypeError, ValueError) as e:
            raise UserError(f"{where}: {e}") from None
    return out


def cmd_encode(args) -> int:
    """Token ids as JSON (a list, or one list per line with --jsonl), or a .npy file."""
    if args.jsonl and args.out and args.out.endswith(".npy"):
        raise UserError("--jsonl writes one JSON line per input line; use an --out name not ending in .npy")
    ids = _encode_all(args)
    if args.out and args.out.endswith(".npy"):
        _write_npy(args.out, ids[0])
    else:
        _write(args.out, _json_lines([a.tolist() for a in ids]))
    return EXIT_OK


def cmd_count(args) -> int:
    """The number of tokens (one number per line with --jsonl)."""
    _write(None, _json_lines([len(a) for a in _encode_all(args)]))
    return EXIT_OK


def _ids_from_json(data: Any, where: str) -> list[int]:
    if not isinstance(data, list):
        raise UserError(f"{where}: expected a list of token ids, got {json_type(data)}")
    for i, value in enumerate(data):
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: item {i} is {json.dumps(value)}, not an integer token id")
    return data


def _ids_from_npy(source: str) -> np.ndarray:
    try:
        ids = np.load(source, allow_pickle=False)
    except FileNotFoundError:
        raise UserError(f"{source}: no such file") from None
    except (OSError, ValueError) as e:
        raise UserError(f"{source}: not a .npy array: {e}") from None
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise UserError(f"{source}: expected a 1-D integer array, got dtype {ids.dtype} shape {ids.shape}")
    return ids


def _id_lists(args) -> list[tuple[str, Any]]:
    if args.input.endswith(".npy"):
        return [(args.input, _ids_from_npy(args.input))]
    if args.jsonl:
        return [(where, _ids_from_json(_parse_json(line, where), where)) for where, line in _jsonl_lines(args.input)]
    where = _name(args.input)
    return [(where, _ids_from_json(_parse_json(_read_text(args.input), where), where))]


def cmd_decode(args) -> int:
    """Text of ids (.npy or a JSON list); --jsonl: one JSON string per line of id lists."""
    tok = _tokenizer()
    texts = []
    for where, ids in _id_lists(args):
        try:
            texts.append(tok.decode(ids))
        except (TypeError, ValueError) as e:
            raise UserError(f"{where}: {e}") from None
    data = _json_lines(texts) if args.jsonl else texts[0].encode("utf-8", "surrogatepass")
    _write(args.out, data)
    return EXIT_OK


# -- verify, export-hf, bench -----------------------------------------------------


def cmd_verify(args) -> int:
    """kimi_tok's ids == tiktoken's (with the official chunking) on generated chat prompts."""
    try:
        import tiktoken  # noqa: F401
    except ImportError:
        raise UserError("verify compares with tiktoken, which is not installed: pip install tiktoken") from None
    from .interop.tiktoken_compat import first_difference, real_tiktoken_encoding, reference_ids
    from .samples import sample_prompt

    tok = _tokenizer()
    enc = real_tiktoken_encoding(tok)
    n_tokens = n_mismatches = 0
    for k in range(args.prompts):
        segments = sample_prompt(args.chars, seed=args.seed + k)
        got, want = tok.encode_to_numpy(segments).tolist(), reference_ids(enc, segments)
        n_tokens += len(want)
        if got == want:
            print(f"prompt {k + 1}/{args.prompts} (seed {args.seed + k}): {len(segments)} segments, {len(want):,} tokens: identical")
            continue
        n_mismatches += 1
        i = first_difference(want, got)
        print(f"prompt {k + 1}/{args.prompts} (seed {args.seed + k}): MISMATCH at token {i}: "
              f"kimi_tok {got[i:i + 5]} vs tiktoken {want[i:i + 5]} ({len(got):,} vs {len(want):,} tokens)")
    print(f"verify: {args.prompts} prompts, {n_tokens:,} tokens, {n_mismatches} mismatching prompts "
          f"(kimi_tok vs tiktoken {tiktoken.__version__} with tiktoken-safe chunking)")
    return EXIT_MISMATCH if n_mismatches else EXIT_OK


def cmd_export_hf(args) -> int:
    """Write a Hugging Face tokenizer.json for Kimi K3."""
    out = Path(args.out)
    if out.is_dir():
        out = out / "tokenizer.json"
    if not out.parent.is_dir():
        raise UserError(f"{out}: cannot write: no directory {out.parent}")
    tok = _tokenizer()
    try:
        data = tok.to_tokenizer_json(out)
    except OSError as e:
        raise UserError(f"{out}: cannot write: {e.strerror}") from None
    model = data["model"]
    print(f"wrote {out}: {len(model['vocab']):,} tokens, {len(model['merges']):,} merges, "
          f"{len(data['added_tokens'])} special tokens")
    return EXIT_OK


def cmd_corpus(args) -> int:
    """Tokenize JSONL documents into .npy shards in --out (resumable); print a one-line summary."""
    from .corpus import encode_corpus

    try:
        summary = encode_corpus(
            args.inputs, args.out, text_field=args.text_field, segments_field=args.segments_field,
            allow_special=args.allow_special, tiktoken_safe=not args.no_tiktoken_safe,
            docs_per_shard=args.docs_per_shard, max_shard_bytes=args.max_shard_bytes, n_jobs=args.n_jobs,
            scheduler=args.scheduler, on_error=args.on_error, progress=not args.quiet,
        )
    except (ValueError, OSError, ImportError) as e:
        raise UserError(str(e)) from None
    print(summary)
    return EXIT_OK


REPO_ENV = "KIMI_TOK_REPO"


def find_checkout() -> Path | None:
    """The source checkout holding ``bench/bench.py``: ``$KIMI_TOK_REPO``, else next to the package, else cwd."""
    if os.environ.get(REPO_ENV):
        candidates = [Path(os.environ[REPO_ENV])]
    else:
        candidates = [Path(__file__).resolve().parent.parent, Path.cwd()]
    return next((c for c in candidates if (c / "bench" / "bench.py").is_file()), None)


def cmd_warmup(args) -> int:
    """Compile every kernel into numba's cache (or check that they are there), then say what it did."""
    from . import _warm_up_tokenizers, warmup
    from .reuse.warmup import warm_up_all

    if args.part:  # one share, in a process that ``warmup --jobs`` started
        try:
            index, count = (int(x) for x in args.part.split("/"))
            if not 0 <= index < count:
                raise ValueError
        except ValueError:
            print(f"kimi-tok warmup: --part {args.part!r}: expected K/N with 0 <= K < N", file=sys.stderr)
            return EXIT_USAGE
        done = warm_up_all(_warm_up_tokenizers, processes=not args.no_processes, part=(index, count))
        print(json.dumps(done))  # read by the process that started this one
        return EXIT_OK
    done = warmup(processes=not args.no_processes, jobs=args.jobs)
    what = f"compiled {done['compiled']} kernels" if done["compiled"] else "every kernel was already cached"
    if done["processes"] > 1:
        what += f" in {done['processes']} processes"
    print(f"kimi-tok warmup: {what} ({done['kernels']} in all) in {done['seconds']:.1f} s; cached in {done['cache']}")
    return EXIT_OK


def cmd_bench(args, bench_args: list[str]) -> int:
    """Run ``python -m bench.bench`` in the source checkout, passing the remaining arguments."""
    root = find_checkout()
    if root is None:
        where = f"${REPO_ENV}={os.environ[REPO_ENV]}" if os.environ.get(REPO_ENV) else "next to the package or in the current directory"
        raise UserError(f"bench needs the kimi_tok source checkout, but no bench/bench.py was found ({where}); "
                        "run it inside a clone of the repository")
    return subprocess.call([sys.executable, "-m", "bench.bench", *bench_args], cwd=root)


# -- the parser --------------------------------------------------------------------


def _add_text_input(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", nargs="?", default=STDIN, help="a UTF-8 text file, or - for stdin (the default)")
    shape = p.add_mutually_exclusive_group()
    shape.add_argument("--segments", action="store_true",
                       help="the input is a JSON list of [text, allow_special] pairs, each encoded on its own")
    shape.add_argument("--jsonl", action="store_true",
                       help="the input has one JSON value per line: a text (a string) or a segments list")
    _add_encoding_flags(p)


def _add_encoding_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--allow-special", action="store_true",
                   help="encode special-token text (e.g. <|open|>) as control tokens; default: as plain text")
    p.add_argument("--no-tiktoken-safe", action="store_true",
                   help="skip the official 400k/25k chunking (one tiktoken call per segment; ids may differ)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kimi-tok", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("encode", help="print token ids (JSON) or write them (--out ids.npy / ids.json)",
                       description="Print the token ids of a text, a segments list, or each line of a JSONL file.")
    _add_text_input(p)
    p.add_argument("-o", "--out", help="write the ids here: a .npy file (uint32), or JSON for any other name")
    p.set_defaults(func=cmd_encode)

    p = sub.add_parser("count", help="print the number of tokens",
                       description="Print the number of tokens (one number per line with --jsonl).")
    _add_text_input(p)
    p.set_defaults(func=cmd_count)

    p = sub.add_parser("decode", help="turn ids (.npy or a JSON list) back into text",
                       description="Print the text of token ids from a .npy file or a JSON list.")
    p.add_argument("input", nargs="?", default=STDIN, help="a .npy file, a JSON file of ids, or - for stdin (the default)")
    p.add_argument("--jsonl", action="store_true", help="one JSON list of ids per line; prints one JSON string per line")
    p.add_argument("-o", "--out", help="write the text here instead of stdout")
    p.set_defaults(func=cmd_decode)

    p = sub.add_parser("verify", help="check kimi_tok's ids against tiktoken on generated prompts",
                       description="Encode generated chat prompts with kimi_tok and with tiktoken plus the official "
                                   "tiktoken-safe chunking (needs tiktoken); exit 1 on any mismatch.")
    p.add_argument("--prompts", type=_positive_int, default=3, help="how many prompts (default 3)")
    p.add_argument("--chars", type=_positive_int, default=100_000, help="characters per prompt (default 100000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the first prompt (default 0)")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("export-hf", help="write a Hugging Face tokenizer.json",
                       description="Write a tokenizer.json that the Hugging Face tokenizers library loads. It gives "
                                   "kimi_tok's ids without tiktoken-safe chunking (see kimi_tok/hf.py).")
    p.add_argument("out", nargs="?", default="tokenizer.json", help="the file (or a directory) to write; default tokenizer.json")
    p.set_defaults(func=cmd_export_hf)

    from .corpus.shards import DEFAULT_DOCS_PER_SHARD, DEFAULT_MAX_SHARD_BYTES, ON_ERROR

    p = sub.add_parser("corpus", help="tokenize JSONL documents into .npy shards (resumable; local processes or Dask)",
                       description="Tokenize JSONL files (one JSON object per line) into shards of uint32 ids plus "
                                   "offsets in --out, with a manifest.json. Rerun the same command to resume an "
                                   "interrupted run. With --scheduler the shards are encoded on a Dask cluster whose "
                                   "workers see the inputs and --out at the same paths (a shared filesystem).")
    p.add_argument("inputs", nargs="+", metavar="IN", help="JSONL files")
    p.add_argument("-o", "--out", required=True, metavar="DIR", help="the output directory (new, empty, or a run to resume)")
    p.add_argument("--text-field", default="text", metavar="NAME", help="the field holding each document's text (default text)")
    p.add_argument("--segments-field", metavar="NAME",
                   help="read a rendered chat, [[text, allow_special], ...], from this field instead of a text")
    _add_encoding_flags(p)
    p.add_argument("--docs-per-shard", type=_positive_int, default=DEFAULT_DOCS_PER_SHARD, metavar="N",
                   help=f"input lines per shard (default {DEFAULT_DOCS_PER_SHARD})")
    p.add_argument("--max-shard-bytes", type=_positive_int, default=DEFAULT_MAX_SHARD_BYTES, metavar="N",
                   help=f"a shard ends early at this much input (default {DEFAULT_MAX_SHARD_BYTES >> 20} MiB)")
    p.add_argument("--n-jobs", type=_positive_int, metavar="N", help="worker processes (default: all cores / Dask workers)")
    p.add_argument("--scheduler", metavar="ADDRESS", help="run on this Dask scheduler, e.g. tcp://10.0.0.1:8786")
    p.add_argument("--on-error", choices=ON_ERROR, default="stop",
                   help="at a bad record: stop with FILE:LINE (default), or skip it into DIR/errors.jsonl")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_corpus)

    p = sub.add_parser("warmup", help="compile and cache every kernel now (for container images and CI)",
                       description="Compile every numba kernel kimi_tok can use into numba's cache, so that no later "
                                   "process compiles (the first use otherwise compiles them: about 20 s). Run it "
                                   "where the cache is written: the package's __pycache__ folders, or "
                                   "NUMBA_CACHE_DIR when set; see docs/performance.md.")
    p.add_argument("--no-processes", action="store_true", help="skip the worker-process backend's kernels")
    p.add_argument("--jobs", type=_positive_int, default=None,
                   help="processes compiling at once (default: the cores, at most 4)")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)  # K/N: one share, for the processes of --jobs
    p.set_defaults(func=cmd_warmup)

    sub.add_parser("bench", add_help=False, help="run the headline benchmark (needs the source checkout); "
                                                 "arguments go to bench.bench, e.g. --quick or --help")
    return parser


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command == "bench":
        return cmd_bench(args, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.func(args)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``kimi-tok``; returns the exit status."""
    try:
        return _run(argv)
    except UserError as e:
        print(f"kimi-tok: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # e.g. kimi-tok encode big.txt | head
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
