"""Real text from this machine, per kind, for the benchmarks: built once, cached, drawn fresh.

The pool is built at run time from what a Debian/Python machine has installed, so nothing
third-party is committed and any user of the bench can rebuild it:

* **code**: the running Python's standard-library ``.py`` sources;
* **prose**: license texts (``/usr/share/common-licenses``, Debian ``copyright`` files, the
  ``LICENSE``/``COPYING``/``NOTICE`` files of installed Python packages) and Debian changelogs
  (``/usr/share/doc/*/changelog*.gz``);
* **json**: one JSON record per installed ``*.dist-info``, from its ``RECORD`` file (real paths,
  sha256 digests as hex, sizes; each record's ``request_id`` uuid is drawn from a seeded RNG:
  synthetic, labelled as such), and the ``.json`` files installed packages ship (SBOMs with
  hashes and uuids, schemas, data);
* **ids**: lists of real md5 digests (``/var/lib/dpkg/info/*.md5sums``) and, as a labelled
  synthetic share, lists of seeded uuids;
* **specials**: license and changelog text with literal K3 control strings (``<|open|>``,
  ``[EOS]``, ...) inserted at seeded places (real text, synthetic insertion);
* **languages** (``ja``, ``zh``, ``ko``, ``th``, ``hi``, ``ar``, ``de``, and more): the
  translated strings of the gettext catalogs (``.mo`` files, parsed here) that installed
  packages ship under ``/usr/share/locale``, ``/usr/share/vim`` and the Python site folders.

Texts are cut into blocks of at most ``BLOCK_CHARS`` characters at line ends and cached in
``~/.cache/kimi_tok_bench/realtext-v{POOL_VERSION}.json.gz`` (``KIMI_TOK_BENCH_CACHE`` moves the
folder; ``python -m bench.realtext --rebuild`` rebuilds it). The characters U+001C-U+001F are
removed everywhere: basetenkenizer 0.2.8 treats them as non-space in its 25k cuts (see
docs/robustness.md), and the serving-path texts must be ones every peer encodes right.

Every benchmark round draws blocks no earlier round of the same run drew (a seeded permutation
per kind), so caches cannot make rounds warm. A kind whose pool is too small for that is not
padded: its rounds get less text, and the bench says so.

    python -m bench.realtext            # build (or load) the pool and print MB per kind
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import random
import re
import struct
import sys
import sysconfig
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

from kimi_tok.samples import SYSTEM_PROMPT, TOOLS  # the header the synthetic prompts have too

POOL_VERSION = 1
CACHE_DIR = Path(os.environ.get("KIMI_TOK_BENCH_CACHE", Path.home() / ".cache" / "kimi_tok_bench"))
BLOCK_CHARS = 8192
BUILD_SEED = 20_240_601  # picks which files fill the capped kinds, the uuids and the insertions
MB = 1_000_000
_DROP_CHARS = "\x1c\x1d\x1e\x1f"

Segment = tuple[str, bool]


@dataclass(frozen=True)
class Kind:
    name: str
    label: str
    source: str
    cap_mb: float = 16.0
    locales: tuple[str, ...] = ()
    synthetic: str = ""  # what part of the kind is synthetic, if any


LANGUAGE_KINDS = {
    "ja": ("Japanese", ("ja",)),
    "zh": ("Chinese", ("zh",)),  # zh_CN, zh_TW, zh_HK: simplified and traditional
    "ko": ("Korean", ("ko",)),
    "th": ("Thai", ("th",)),
    "hi": ("Hindi", ("hi",)),
    "ar": ("Arabic", ("ar",)),
    "de": ("German", ("de",)),
    "ru": ("Russian", ("ru",)),
    "fr": ("French", ("fr",)),
    "he": ("Hebrew", ("he",)),
    "el": ("Greek", ("el",)),
    "vi": ("Vietnamese", ("vi",)),
}

KINDS: dict[str, Kind] = {
    "code": Kind("code", "code", "Python standard-library .py sources", 24.0),
    "prose": Kind("prose", "prose", "license texts and Debian changelogs", 24.0),
    "json": Kind("json", "JSON", "dist-info RECORD files as JSON records (paths, sha256 hex, sizes) and "
                 "installed .json files (SBOMs, schemas, package data)", 12.0,
                 synthetic="each record's request_id uuid (seeded RNG)"),
    "ids": Kind("ids", "ids/hashes", "md5 digests of /var/lib/dpkg/info/*.md5sums as id lists", 8.0,
                synthetic="a quarter of the lists are uuids from a seeded RNG"),
    "specials": Kind("specials", "control strings", "license/changelog text with literal K3 control strings", 6.0,
                     synthetic="the control strings are inserted at seeded places (about 2% of the bytes)"),
    **{name: Kind(name, label, "gettext .mo catalogs, translated strings", 16.0, locales)
       for name, (label, locales) in LANGUAGE_KINDS.items()},
}
# The rows of the per-kind table, in the order, plus literal control strings.
TABLE_KINDS = ("code", "prose", "json", "ids", "ja", "zh", "ko", "th", "hi", "ar", "de", "specials")


# --------------------------------------------------------------------------------------------
# Reading what the machine has
# --------------------------------------------------------------------------------------------


def read_mo(data: bytes) -> list[str]:
    """The translated strings of a GNU gettext ``.mo`` catalog (plural forms split, header skipped).

    The format: a magic number giving the byte order, then the count of entries and the offsets
    of two tables of (length, offset) pairs, originals and translations; the translation of the
    empty msgid is the header, whose ``charset=`` names the encoding of the strings.

    >>> read_mo(b"") == []
    True
    """
    if len(data) < 28:
        return []
    order = {0x950412DE: "<", 0xDE120495: ">"}.get(struct.unpack_from("<I", data)[0])
    if order is None:
        return []
    try:
        _revision, count, originals, translations = struct.unpack_from(order + "4I", data, 4)
        ids = struct.unpack_from(f"{order}{2 * count}I", data, originals)  # (length, offset) pairs
        strs = struct.unpack_from(f"{order}{2 * count}I", data, translations)
    except struct.error:
        return []
    charset, raws = "utf-8", []
    for i in range(0, 2 * count, 2):
        raw = data[strs[i + 1]:strs[i + 1] + strs[i]]
        if ids[i] == 0:  # the header
            found = re.search(rb"charset=([A-Za-z0-9_.:-]+)", raw)
            charset = found.group(1).decode("ascii") if found else charset
        else:
            raws.append(raw)
    try:
        text = b"\x00".join(raws).decode(charset)
    except (LookupError, UnicodeDecodeError):
        return []
    return [form for form in text.split("\x00") if form.strip()]  # plural forms are NUL-separated too


def _python_dirs() -> list[Path]:
    """Site folders of this interpreter (and the Debian dist-packages), existing ones only."""
    import site

    paths = {sysconfig.get_paths()[key] for key in ("purelib", "platlib")}
    try:
        paths.update(site.getsitepackages())
    except AttributeError:  # virtualenvs without site.getsitepackages
        pass
    paths.update(str(p) for p in Path("/usr/lib").glob("python3*/dist-packages"))
    paths.update(str(p) for p in Path("/usr/local/lib").glob("python3*/dist-packages"))
    return sorted(Path(p) for p in paths if Path(p).is_dir())


def _walk(root: Path, match) -> Iterator[Path]:
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if match(name):
                yield Path(folder) / name


def _read_text(path: Path, max_bytes: int = 4 * MB) -> str | None:
    try:
        raw = path.read_bytes()[: max_bytes + 1]
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        if len(raw) > max_bytes or b"\x00" in raw:
            return None
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def _take(texts: Iterable[str], cap_bytes: float, seen: set[str]) -> list[str]:
    """Texts in order, skipping duplicates, until ``cap_bytes`` of UTF-8."""
    out, total = [], 0
    for text in texts:
        digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
        if not text.strip() or digest in seen:
            continue
        seen.add(digest)
        out.append(text)
        total += len(text.encode("utf-8", "surrogatepass"))
        if total >= cap_bytes:
            break
    return out


def _shuffled(paths: Iterable[Path], seed: int) -> list[Path]:
    paths = sorted(paths)
    random.Random(seed).shuffle(paths)
    return paths


def code_texts(cap_bytes: float) -> tuple[list[str], dict]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    skip = ("site-packages", "dist-packages")
    paths = [p for p in _walk(stdlib, lambda n: n.endswith(".py")) if not any(s in p.parts for s in skip)]
    texts = _take((t for t in map(_read_text, _shuffled(paths, BUILD_SEED)) if t), cap_bytes, set())
    return texts, {"root": str(stdlib), "files_found": len(paths), "files_used": len(texts)}


def _license_paths() -> list[Path]:
    paths = [p for p in Path("/usr/share/common-licenses").glob("*") if p.is_file()]
    paths += sorted(Path("/usr/share/doc").glob("*/copyright"))
    name = re.compile(r"^(LICEN[CS]E|COPYING|NOTICE)([._-].*)?$", re.I)
    for root in _python_dirs():
        paths += [p for p in _walk(root, name.match) if p.suffix not in (".py", ".pyc", ".so")]
    return paths


def prose_texts(cap_bytes: float, extra_bytes: float) -> tuple[list[str], list[str], dict]:
    """Licenses first (all of them, deduplicated), then Debian changelogs up to the cap; the text
    after the cap (``extra_bytes`` of it) is the base of the ``specials`` kind."""
    seen: set[str] = set()
    licenses = _take((t for t in map(_read_text, _license_paths()) if t), cap_bytes / 2, seen)
    changelog_paths = _shuffled(Path("/usr/share/doc").glob("*/changelog*.gz"), BUILD_SEED)
    changelogs = (t for t in (_read_text(p, 2 * MB) for p in changelog_paths) if t)
    lic_bytes = sum(len(t.encode()) for t in licenses)
    taken = _take(changelogs, max(0.0, cap_bytes - lic_bytes), seen)
    rest = _take(changelogs, extra_bytes, seen)  # the same generator: files the prose kind did not take
    info = {"license_files": len(licenses), "changelog_files_found": len(changelog_paths),
            "changelog_files_used": len(taken)}
    return licenses + taken, rest, info


def catalog_texts() -> tuple[dict[str, list[str]], dict]:
    """Translated strings of every ``.mo`` catalog found, one text per catalog, by language."""
    roots = [Path("/usr/share/locale"), Path("/usr/local/share/locale"), Path("/usr/share/vim"),
             Path(sys.prefix) / "share" / "locale", *_python_dirs()]
    by_lang: dict[str, list[str]] = {}
    seen: set[str] = set()
    n_files = 0
    for root in dict.fromkeys(r for r in roots if r.is_dir()):
        for path in _walk(root, lambda n: n.endswith(".mo")):
            parts = path.parts
            if "LC_MESSAGES" not in parts:
                continue
            n_files += 1
            lang = re.split(r"[.@_]", parts[parts.index("LC_MESSAGES") - 1])[0]
            try:
                strings = read_mo(path.read_bytes())
            except OSError:
                continue
            text = "\n".join(strings)
            digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
            if text and digest not in seen:  # vim ships ja, ja.euc-jp, ja.sjis: the same strings
                seen.add(digest)
                by_lang.setdefault(lang, []).append(text)
    return by_lang, {"mo_files_found": n_files, "languages_found": len(by_lang),
                     "roots": [str(r) for r in roots if r.is_dir()]}


def _records() -> list[tuple[str, str, list[list[str]]]]:
    """(name, version, RECORD rows) of every installed dist-info."""
    out = []
    for root in _python_dirs():
        for info in sorted(root.glob("*.dist-info")):
            text = _read_text(info / "RECORD")
            if not text:
                continue
            name, _, version = info.name[: -len(".dist-info")].partition("-")
            out.append((name, version, [line.split(",") for line in text.splitlines() if line.count(",") >= 2]))
    return out


def _b64_to_hex(digest: str) -> tuple[str, str] | None:
    import base64

    algo, _, value = digest.partition("=")
    try:
        return algo, base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
    except ValueError:
        return None


def json_texts(cap_bytes: float) -> tuple[list[str], dict]:
    """One JSON record per dist-info (half the cap at most), then installed ``.json`` files (SBOMs
    with hashes and uuids, schemas, package data) that parse as JSON."""
    rng = random.Random(BUILD_SEED + 1)
    records = []
    for name, version, rows in _records():
        files = []
        for row in rows:
            path, digest, size = ",".join(row[:-2]), row[-2], row[-1]
            converted = _b64_to_hex(digest) if digest else None
            if converted and size.isdigit():  # rows without a hash (.pyc, RECORD itself) say little
                files.append({"path": path, converted[0]: converted[1], "size": int(size)})
        record = {"request_id": str(uuid.UUID(int=rng.getrandbits(128), version=4)), "package": name,
                  "version": version, "n_files": len(files), "files": files}
        records.append(json.dumps(record, indent=rng.choice((None, 2)), ensure_ascii=False) + "\n")
    rng.shuffle(records)
    seen: set[str] = set()
    texts = _take(records, cap_bytes / 2, seen)
    used = sum(len(t.encode()) for t in texts)
    paths = [p for root in [*_python_dirs(), Path("/usr/share")] for p in _walk(root, lambda n: n.endswith(".json"))]
    files = (t for t in map(_read_text, _shuffled(paths, BUILD_SEED)) if t and _is_json(t))
    more = _take(files, cap_bytes - used, seen)
    return texts + more, {"dist_info_records": len(texts), "json_files_found": len(paths),
                          "json_files_used": len(more)}


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def ids_texts(cap_bytes: float) -> tuple[list[str], dict]:
    rng = random.Random(BUILD_SEED + 2)
    texts, n_real, total = [], 0, 0
    for path in _shuffled(Path("/var/lib/dpkg/info").glob("*.md5sums"), BUILD_SEED):
        if total >= cap_bytes:
            break
        text = _read_text(path)
        digests = [line.split()[0] for line in (text or "").splitlines() if line.split()]
        digests = [d for d in digests if re.fullmatch(r"[0-9a-f]{32}", d)]
        if not digests:
            continue
        n_real += 1
        lists = [_format_ids(digests, rng)]
        if rng.random() < 1 / 3:  # a uuid list for every three real ones: a quarter of the lists
            lists.append(_format_ids([str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in digests], rng))
        texts += lists
        total += sum(map(len, lists))  # ASCII: characters are bytes
    texts = _take(texts, cap_bytes, set())
    return texts, {"md5sums_files": n_real, "lists": len(texts)}


def _format_ids(ids: list[str], rng: random.Random) -> str:
    style = rng.randrange(3)
    if style == 0:
        return "\n".join(ids) + "\n"
    if style == 1:
        return json.dumps(ids) + "\n"
    return ", ".join(ids) + "\n"


def control_literals() -> list[str]:
    from kimi_tok.vocab.kimi_k3 import kimi_k3_special_tokens

    names = [t for t in kimi_k3_special_tokens() if "reserved" not in t]
    return names + ['<|open|>message role="assistant"<|sep|>', "<|close|>message<|sep|><|end_of_msg|>"]


def with_control_strings(text: str, rng: random.Random, literals: Sequence[str]) -> str:
    """``text`` with a literal control string after about every 400 characters (at a space)."""
    out, pos = [], 0
    while pos < len(text):
        nxt = text.find(" ", pos + rng.randint(100, 700))
        if nxt < 0:
            break
        out += [text[pos:nxt + 1], rng.choice(literals)]
        pos = nxt + 1
    out.append(text[pos:])
    return "".join(out)


# --------------------------------------------------------------------------------------------
# The pool
# --------------------------------------------------------------------------------------------


def blocks_of(text: str, max_chars: int = BLOCK_CHARS) -> list[str]:
    """``text`` cut at line ends into blocks of at most ``max_chars`` (a longer line is cut as is)."""
    if any(c in text for c in _DROP_CHARS):
        text = re.sub(f"[{_DROP_CHARS}]", "", text)
    out, start = [], 0
    while start < len(text):
        end = min(len(text), start + max_chars)
        if end < len(text):
            nl = text.rfind("\n", start, end)
            end = nl + 1 if nl > start else end
        out.append(text[start:end])
        start = end
    return out


def pool_path() -> Path:
    return CACHE_DIR / f"realtext-v{POOL_VERSION}.json.gz"


def build_pool_data() -> dict:
    """Read the machine's text into ``{"kinds": {name: {"blocks", "bytes", "info"}}}``."""
    t0 = time.perf_counter()
    kinds: dict[str, dict] = {}

    def put(name: str, texts: list[str], info: dict) -> None:
        blocks = [b for t in texts for b in blocks_of(t)]
        kinds[name] = {"blocks": blocks, "bytes": [len(b.encode("utf-8", "surrogatepass")) for b in blocks],
                       "info": info}

    put("code", *code_texts(KINDS["code"].cap_mb * MB))
    prose, rest, info = prose_texts(KINDS["prose"].cap_mb * MB, KINDS["specials"].cap_mb * MB)
    put("prose", prose, info)
    rng, literals = random.Random(BUILD_SEED + 3), control_literals()
    put("specials", [with_control_strings(t, rng, literals) for t in rest], {"base_files": len(rest)})
    put("json", *json_texts(KINDS["json"].cap_mb * MB))
    put("ids", *ids_texts(KINDS["ids"].cap_mb * MB))
    by_lang, cat_info = catalog_texts()
    for name, kind in KINDS.items():
        if kind.locales:
            catalogs = [t for loc in kind.locales for t in by_lang.get(loc, [])]
            random.Random(BUILD_SEED).shuffle(catalogs)
            put(name, _take(catalogs, kind.cap_mb * MB, set()), {"catalogs": len(catalogs)})
    kinds["ja"]["info"].update(cat_info)  # said once: where the catalogs were looked for
    return {"version": POOL_VERSION, "python": sys.version.split()[0], "built_s": time.perf_counter() - t0,
            "kinds": kinds}


class Pool:
    """The cached blocks per kind, and what they came from.

    >>> pool = Pool.load()            # doctest: +SKIP
    >>> pool.texts("th", rounds=5, mb_per_round=1.0, seed=0)[1]  # doctest: +SKIP
    'th: only 0.66 MB here, so each of 5 rounds gets 0.13 MB (not padded)'
    """

    def __init__(self, data: dict, path: Path | None = None) -> None:
        self.kinds: dict[str, list[str]] = {k: v["blocks"] for k, v in data["kinds"].items()}
        self.sizes: dict[str, list[int]] = {k: v["bytes"] for k, v in data["kinds"].items()}
        self.info: dict[str, dict] = {k: v["info"] for k, v in data["kinds"].items()}
        self.path = path
        self.built_s = data.get("built_s", 0.0)

    @classmethod
    def load(cls, rebuild: bool = False, quiet: bool = False) -> "Pool":
        """The cached pool; built first (tens of seconds) if missing, of another version, or ``rebuild``."""
        path = pool_path()
        if not rebuild and path.exists():
            try:
                data = json.loads(gzip.decompress(path.read_bytes()))
                if data.get("version") == POOL_VERSION:
                    return cls(data, path)
            except (OSError, ValueError, EOFError):
                pass
        if not quiet:
            print(f"building the real-text pool from this machine's files into {path} ...", file=sys.stderr)
        data = build_pool_data()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(gzip.compress(json.dumps(data, ensure_ascii=False).encode("utf-8", "surrogatepass"), 1))
        tmp.replace(path)
        if not quiet:
            print(f"  built in {data['built_s']:.1f} s", file=sys.stderr)
        return cls(data, path)

    def mb(self, kind: str) -> float:
        return sum(self.sizes.get(kind, ())) / MB

    def available(self, kinds: Iterable[str]) -> list[str]:
        return [k for k in kinds if self.sizes.get(k)]

    def texts(self, kind: str, rounds: int, mb_per_round: float, seed: int) -> tuple[list[str], str]:
        """``rounds`` texts of about ``mb_per_round`` MB each, no block in two of them; a note
        (empty if none) when the kind holds too little text for that."""
        blocks, sizes = self.kinds.get(kind, []), self.sizes.get(kind, [])
        if not blocks:
            return [""] * rounds, f"{kind}: no text of this kind on this machine"
        order = list(range(len(blocks)))
        random.Random(f"{seed}:{kind}").shuffle(order)
        want = mb_per_round * MB
        note = ""
        if sum(sizes) < want * rounds:
            want = sum(sizes) / rounds
            note = (f"{kind}: only {self.mb(kind):.2f} MB here, so each of {rounds} rounds gets "
                    f"{want / MB:.2f} MB (not padded)")
        out, cur, cur_bytes = [], [], 0
        for i in order:
            cur.append(blocks[i])
            cur_bytes += sizes[i]
            if cur_bytes >= want:
                out.append("".join(cur))
                cur, cur_bytes = [], 0
                if len(out) == rounds:
                    break
        if len(out) < rounds and cur:
            out.append("".join(cur))
        out += [out[-1]] * (rounds - len(out))  # unreachable unless blocks are very uneven
        return out, note

    def summary(self, kinds: Iterable[str] | None = None) -> list[str]:
        lines = []
        for name in kinds or KINDS:
            kind = KINDS[name]
            extra = f"; synthetic: {kind.synthetic}" if kind.synthetic else ""
            small = "  (less than 5 rounds of 1 MB)" if self.mb(name) < 5 else ""
            lines.append(f"{name:>9} {kind.label:<16} {self.mb(name):7.2f} MB  {kind.source}{extra}{small}")
        return lines

    def drawer(self, seed: int) -> "Drawer":
        return Drawer(self, seed)


class Drawer:
    """Fresh text on demand: each kind's blocks in a seeded order, none given twice until the
    kind runs out (then a new order, and ``wrapped`` names the kind)."""

    def __init__(self, pool: Pool, seed: int) -> None:
        self.pool, self.seed = pool, seed
        self.order: dict[str, list[int]] = {}
        self.cursor: dict[str, int] = {}
        self.wrapped: set[str] = set()
        self.rng = random.Random(seed)

    def _next_block(self, kind: str) -> str:
        blocks = self.pool.kinds[kind]
        if self.cursor.get(kind, len(blocks)) >= len(self.order.get(kind, ())):
            if kind in self.order:
                self.wrapped.add(kind)
            order = list(range(len(blocks)))
            random.Random(f"{self.seed}:{kind}:{len(self.wrapped)}").shuffle(order)
            self.order[kind], self.cursor[kind] = order, 0
        i = self.order[kind][self.cursor[kind]]
        self.cursor[kind] += 1
        return blocks[i]

    def take(self, kind: str, n_chars: int) -> str:
        """About ``n_chars`` characters of ``kind`` (exactly, cut inside the last block)."""
        parts, total = [], 0
        while total < n_chars:
            block = self._next_block(kind)
            parts.append(block)
            total += len(block)
        return "".join(parts)[:n_chars]

    def take_mix(self, weights: dict[str, float], n_chars: int, piece_chars: int = 6000) -> str:
        """``n_chars`` of text whose pieces (about ``piece_chars`` each) come from kinds chosen by
        weight (``"lang"``: a language, in proportion to the pool's text of each)."""
        if "lang" in weights:
            weights = dict(weights)
            share = weights.pop("lang")
            total = sum(self.pool.mb(k) for k in LANGUAGE_KINDS) or 1.0
            for k in LANGUAGE_KINDS:
                weights[k] = weights.get(k, 0.0) + share * self.pool.mb(k) / total
        kinds = [k for k in weights if self.pool.sizes.get(k) and weights[k] > 0]
        if not kinds:
            raise RuntimeError("the real-text pool holds none of the kinds " + ", ".join(weights))
        w = [weights[k] for k in kinds]
        parts, total = [], 0
        while total < n_chars:
            n = min(n_chars - total, max(200, int(piece_chars * self.rng.uniform(0.3, 1.7))))
            parts.append(self.take(self.rng.choices(kinds, w)[0], n))
            total += n
        return "".join(parts)


# --------------------------------------------------------------------------------------------
# K3 chat prompts of real text
# --------------------------------------------------------------------------------------------

# Which kinds of text fill each slot of a conversation, by weight; "lang" is one of the languages,
# drawn in proportion to the text the pool has of each (so small ones do not run out first).
SLOT_MIX: dict[str, dict[str, float]] = {
    "system": {"prose": 1.0},
    "user": {"prose": 3.0, "code": 2.0, "specials": 1.0, "lang": 1.5},
    "think": {"prose": 3.0, "lang": 0.5},
    "arguments": {"code": 1.0, "json": 1.0},
    "tool": {"code": 3.0, "json": 2.0, "prose": 2.0, "ids": 1.0, "lang": 1.0},
    "response": {"prose": 2.0, "code": 1.0, "lang": 0.75},
}
# Share of a prompt's text budget each slot gets (the bulk goes to user and tool texts).
SLOT_WEIGHT = {"system": 0.5, "user": 8.0, "think": 1.0, "response": 1.0, "arguments": 0.3, "tool": 12.0}
# system, a user turn, two tool calls with their results, an answer, the next user turn
PLAN = ("system", "user", "call", "tool", "call", "tool", "answer", "user")


def _slots(plan: Sequence[str]) -> list[str]:
    out = []
    for step in plan:
        out += {"call": ["think", "arguments"], "answer": ["think", "response"]}.get(step, [step])
    return out


def chat_messages(drawer: Drawer, texts: Iterator[str], plan: Sequence[str], rng: random.Random) -> list[dict]:
    messages, call = [], {}
    for step in plan:
        if step in ("system", "user"):
            messages.append({"role": step, "content": next(texts)})
        elif step == "call":
            call = {"name": rng.choice(TOOLS)["name"], "call_id": f"call_{rng.getrandbits(48):012x}"}
            think, args = next(texts), next(texts)
            messages.append({"role": "assistant", "think": think, "content": "",
                             "tool_calls": [{**call, "arguments": json.dumps({"input": args}, ensure_ascii=False)}]})
        elif step == "tool":
            messages.append({"role": "tool", **call, "content": next(texts)})
        else:
            think, response = next(texts), next(texts)
            messages.append({"role": "assistant", "think": think, "content": response})
    return messages


def real_prompt(drawer: Drawer, n_chars: int, plan: Sequence[str] = PLAN) -> list[Segment]:
    """A rendered K3 agentic chat of about ``n_chars`` characters of real text (``render_chat``:
    control tokens ``allow_special=True``, every text ``False``), fresh from ``drawer``."""
    from kimi_tok.samples import render_chat

    rng = random.Random(drawer.rng.getrandbits(64))
    slots = _slots(plan)
    header = SYSTEM_PROMPT + "# Tools\n" + json.dumps(TOOLS, ensure_ascii=False) + "\n"
    skeleton = render_chat(chat_messages(drawer, iter([header] + [""] * len(slots)), plan, random.Random(0)))
    budget = max(0, n_chars - sum(len(t) for t, _ in skeleton))
    total_weight = sum(SLOT_WEIGHT[s] for s in slots)
    sizes = [int(budget * SLOT_WEIGHT[s] / total_weight) for s in slots]
    sizes[slots.index("tool")] += budget - sum(sizes)
    texts = [drawer.take_mix(SLOT_MIX[s], n) if n else "" for s, n in zip(slots, sizes)]
    texts[0] = header + texts[0]
    return render_chat(chat_messages(drawer, iter(texts), plan, rng))


def turn_messages(drawer: Drawer, turn: int, n_chars: int, shares: dict[str, float]) -> list[dict]:
    """One agent-loop turn of real text: an assistant message that thinks and calls a tool, the
    tool's output, and an observation message (``shares``: think/arguments/tool/observation)."""
    rng = random.Random(f"{drawer.seed}:turn:{turn}")
    text = {k: drawer.take_mix(SLOT_MIX["user" if k == "observation" else k], max(1, int(n_chars * share)))
            for k, share in shares.items()}
    call = {"name": rng.choice(TOOLS)["name"], "call_id": f"call_{rng.getrandbits(48):012x}"}
    return [
        {"role": "assistant", "think": text["think"], "content": "",
         "tool_calls": [{**call, "arguments": json.dumps({"input": text["arguments"]}, ensure_ascii=False)}]},
        {"role": "tool", **call, "content": text["tool"]},
        {"role": "user", "content": f"[observation after turn {turn}]\n" + text["observation"]},
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.realtext", description=__doc__.split("\n")[0])
    p.add_argument("--rebuild", action="store_true", help="rebuild the cached pool from this machine's files")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    pool = Pool.load(rebuild=args.rebuild)
    print(f"real-text pool {pool.path} (loaded in {time.perf_counter() - t0:.1f} s; "
          f"built in {pool.built_s:.1f} s):")
    print("\n".join(pool.summary()))
    for name, info in pool.info.items():
        print(f"  {name}: {info}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
