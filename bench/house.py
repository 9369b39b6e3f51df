"""House counts: import circles, function-level imports, ``Any`` and long modules (prints; asserts nothing).

The counts issue 31 asks to report before -> after, from the source alone (``ast``; nothing is
imported, so it runs in a second):

- **import circles**: strongly connected components of more than one module in the graph
  "module A imports module B" over the five packages and ``bench/``. An import counts whether it
  sits at the top or inside a function (both run), not under ``if TYPE_CHECKING:`` (never runs).
  ``from pkg import name`` points at ``pkg.name`` when that is a module, else at ``pkg``; a
  package's ``__init__`` is a node of its own (importing ``a.b.c`` also runs ``a/b/__init__``,
  which is not counted as an edge: every package with re-exports would be a circle). ``bench/``
  scripts put their folder first on ``sys.path``, so a bare name that is a bench module resolves
  there (before the rename, ``from retrieval import ...`` in a bench script was ``bench/retrieval.py``).
- **function-level imports**: import statements inside a function body, all and those of the
  project's own modules.
- **Any**: every use of the name ``Any`` outside import lines, and how many are ``dict[str, Any]``.
- **modules over N lines** (default 600).

Usage: ``python bench/house.py [--lines 600] [--list]`` (``--list`` names each function-level
import of our own modules).
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: folder -> import name (pyproject.toml's package-dir mapping), then the bench scripts
PACKAGES = {"cases": "remedy.cases", "retrieval": "remedy.retrieval", "optimizer": "remedy.optimizer"}
PACKAGES |= {"miners": "remedy.miners", "kb": "remedy.kb", "bench": "bench"}


@dataclass
class Module:
    """One source file: its dotted name, its tree and what it imports."""

    name: str
    path: Path
    is_package: bool
    tree: ast.Module
    imports: list[tuple[str, bool, int]] = field(default_factory=list)  # (target, in a function, line)


def modules() -> dict[str, Module]:
    """Every .py file of the five packages and bench/ (bench/data and bench/out excluded), by dotted name."""
    found: dict[str, Module] = {}
    for folder, dotted in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder)
            if folder == "bench" and rel.parts[0] in ("data", "out"):
                continue
            parts = [dotted, *rel.with_suffix("").parts]
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            found[name] = Module(name, path, is_package, ast.parse(path.read_text(), str(path)))
    return found


def _walk_imports(node: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Import statements under ``node`` with whether they sit in a function; TYPE_CHECKING blocks skipped."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            yield from _walk_imports(ast.Module(body=child.orelse, type_ignores=[]), in_function)
        elif isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function
        else:
            nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from _walk_imports(child, nested)


def _base(mod: Module, node: ast.ImportFrom, known: dict[str, Module]) -> str:
    """The absolute module a ``from X import`` names (relative levels resolved)."""
    if node.level == 0:
        name = node.module or ""
        if mod.name.startswith("bench.") and f"bench.{name.split('.')[0]}" in known:
            return f"bench.{name}"  # bench scripts put bench/ first on sys.path
        return name
    package = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, node.module] if node.module else package)


def resolve(known: dict[str, Module]) -> None:
    """Fill each module's ``imports`` with the project modules it names."""
    for mod in known.values():
        for node, in_function in _walk_imports(mod.tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
                if mod.name.startswith("bench."):
                    names = [f"bench.{n}" if f"bench.{n}" in known else n for n in names]
                targets = [n for n in names if n in known]
            else:
                base = _base(mod, node, known)
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
                plain = [a for a in node.names if f"{base}.{a.name}" not in known]
                targets = subs + ([base] if plain and base in known else [])
            mod.imports.extend((t, in_function, node.lineno) for t in targets if t != mod.name)


def circles(known: dict[str, Module]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted({t for t, _, _ in known[v].imports}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(known):
        if v not in index:
            visit(v)
    return sorted(found)


def any_counts(known: dict[str, Module]) -> tuple[int, int]:
    """Uses of ``Any`` (names and ``typing.Any``) and how many are ``dict[str, Any]``."""
    total = dicts = 0
    for mod in known.values():
        for node in ast.walk(mod.tree):
            if (isinstance(node, ast.Name) and node.id == "Any") or (
                isinstance(node, ast.Attribute) and node.attr == "Any"
            ):
                total += 1
            elif isinstance(node, ast.Subscript) and ast.unparse(node).replace("typing.", "") == "dict[str, Any]":
                dicts += 1
    return total, dicts


def _group(known: dict[str, Module], bench: bool) -> dict[str, Module]:
    """The package modules (``bench=False``) or the bench scripts."""
    return {k: m for k, m in known.items() if k.startswith("bench.") == bench}


def main() -> None:
    """Print the counts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=600, help="report modules longer than this")
    ap.add_argument("--list", action="store_true", help="name each function-level import of our own modules")
    args = ap.parse_args()
    known = modules()
    resolve(known)
    loops = circles(known)
    print(f"modules: {len(known)} ({sum(not m.name.startswith('bench') for m in known.values())} in the packages)")
    print(f"import circles: {len(loops)}")
    for comp in loops:
        print("  " + " <-> ".join(comp))
    for label, group in (("packages", _group(known, False)), ("bench", _group(known, True))):
        fn_all = fn_own = 0
        for mod in group.values():
            fn_all += sum(inside for _, inside in _walk_imports(mod.tree))
            own = [(t, line) for t, inside, line in mod.imports if inside]
            fn_own += len({line for _, line in own})
            if args.list:
                for t, line in own:
                    print(f"  {mod.path.relative_to(ROOT)}:{line} -> {t}")
        total, dicts = any_counts(group)
        print(f"{label}: function-level imports {fn_all} ({fn_own} of the project's own modules)", end="")
        print(f"; Any {total} ({dicts} dict[str, Any])")
    long = sorted(((len(m.path.read_text().splitlines()), m) for m in known.values()), key=lambda x: -x[0])
    long = [(n, m) for n, m in long if n > args.lines]
    print(f"modules over {args.lines} lines: {len(long)}")
    for n, m in long:
        print(f"  {n:5d} {m.path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
