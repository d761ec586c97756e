"""The package's layers: imports run one way, from the applications down to the native helpers.

    applications   kimi_tok (the package), cli, __main__, corpus
    facade         tokenizer, encoding, loaders, samples
    interop        interop (tiktoken drop-in, tokenizer.json), _educational (the readable spec)
    reuse          segment cache, encoding ahead, parked helpers
    engine         policy and how one call runs
    pipeline       the stages in call order
    vocab          vocabulary files and the embedded K3 copy
    native         jit, atomics, futexes, hashing, UTF-8, huge pages; data (the shipped files)

A module may import its own layer or any layer below it, never one above, and no modules
import each other in a circle. Imports under ``if TYPE_CHECKING:`` are type hints only and
are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "kimi_tok"  # read as text: nothing is imported
LAYERS = [
    ["kimi_tok", "kimi_tok.__main__", "kimi_tok.cli", "kimi_tok.corpus"],
    ["kimi_tok.tokenizer", "kimi_tok.encoding", "kimi_tok.loaders", "kimi_tok.samples"],
    ["kimi_tok.interop", "kimi_tok._educational"],
    ["kimi_tok.reuse"],
    ["kimi_tok.engine"],
    ["kimi_tok.pipeline"],
    ["kimi_tok.vocab"],
    ["kimi_tok.native", "kimi_tok.data"],
]


def module_name(path: Path) -> str:
    parts = ["kimi_tok", *path.relative_to(PACKAGE).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    best = None
    for level, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or (prefix != "kimi_tok" and module.startswith(prefix + ".")):
                if best is None or len(prefix) > best[1]:
                    best = (level, len(prefix))
    assert best is not None, f"{module} belongs to no layer: add it to LAYERS"
    return best[0]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_modules(path: Path) -> set[str]:
    """The kimi_tok modules ``path`` imports, resolved to module names (``from .x import y``
    counts as ``x.y`` when ``y`` is a module, else ``x``)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def resolve(base: str, names: list[str]) -> None:
        for item in names:
            candidate = f"{base}.{item}"
            found.add(candidate if candidate in ALL_MODULES else base)

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.split(".")[0] == "kimi_tok")
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base_parts = package.split(".")[: len(package.split(".")) - child.level + 1]
                    base = ".".join(base_parts + ([child.module] if child.module else []))
                    resolve(base, [a.name for a in child.names])
                elif child.module and child.module.split(".")[0] == "kimi_tok":
                    resolve(child.module, [a.name for a in child.names])
            visit(child)

    visit(ast.parse(path.read_text("utf-8")))
    found.discard(name)
    return {m for m in found if m in ALL_MODULES}


FILES = sorted(PACKAGE.rglob("*.py"))
ALL_MODULES = {module_name(path) for path in FILES}
GRAPH = {module_name(path): imported_modules(path) for path in FILES}


def test_every_module_has_a_layer():
    for module in ALL_MODULES:
        layer_of(module)


def test_imports_run_one_way():
    upward = [f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
              for module, targets in GRAPH.items() for target in targets if layer_of(target) < layer_of(module)]
    assert not upward, "imports against the layers:\n" + "\n".join(sorted(upward))


def test_no_circle_of_imports():
    # a package's __init__ re-exporting its modules is not a circle with them: drop package -> own module edges
    edges = {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def walk(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == 1:
                return stack[stack.index(target):] + [target]
            if target not in state:
                circle = walk(target)
                if circle:
                    return circle
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(edges):
        if module not in state:
            circle = walk(module)
            assert circle is None, "a circle of imports: " + " -> ".join(circle)


def test_the_top_level_stays_small():
    top = [path.name for path in PACKAGE.glob("*.py")]
    assert len(top) <= 8, f"{len(top)} modules at the package's top level: {sorted(top)}"
