"""The house rules of partita/ beyond the layers (tests/test_layers.py), each checked on the
whole package with ``ast``:

- no import cycle among the modules of one layer, counting every import (module level, inside
  functions, under ``if TYPE_CHECKING``), packages' ``__init__`` aside (they re-export);
- no underscore name imported from another module: what two modules share is public in one
  of them, or in a third;
- no function longer than ``MAX_FUNCTION_LINES`` lines.

Each rule has a table of the exceptions that stand today, with why; a table may only shrink:
a new violation fails, and so does an exception that no longer occurs (remove it), or a long
function that grew. ``python tests/test_house.py`` prints what each rule finds.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_layers import ROOT, _package, layer_of, module_files, package_imports  # noqa: E402

MAX_FUNCTION_LINES = 150

# Cycles inside a layer that stand today: each found cycle must be one of these or part of one.
KNOWN_CYCLES: dict[frozenset[str], str] = {}

# (importing module, module imported from, underscore name) -> why it stands.
KNOWN_PRIVATE_IMPORTS: dict[tuple[str, str, str], str] = {
    ("partita.ops.backward", "partita.ops.elementwise", "_unary"):
        "the unary family's registration helper: docs/adding-an-op.md and the op records' line tests use this name",
}

# (module, function's qualified name) -> its length when listed: it may shrink, never grow.
KNOWN_LONG_FUNCTIONS: dict[tuple[str, str], int] = {
}


# --- the checkers ----------------------------------------------------------------------------------

def layer_cycles(root: Path) -> list[frozenset[str]]:
    """The import cycles among the modules of one layer (strongly connected components of
    two or more modules), packages' ``__init__`` left out."""
    files = module_files(root)
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    graph: dict[str, set[str]] = {}
    for module, _path, imps in package_imports(root):
        if module in packages:
            continue
        for imp in imps:
            if imp.target != module and imp.target in files and imp.target not in packages \
                    and layer_of(imp.target) == layer_of(module):
                graph.setdefault(module, set()).add(imp.target)
    # Tarjan's algorithm, iteratively.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[frozenset[str]] = []
    for start in sorted(files):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def private_imports(root: Path) -> list[tuple[str, str, str, int]]:
    """(importing module, module imported from, name, line) of every ``from X import _name``
    where X is another partita module."""
    out = []
    for module, path, _imps in package_imports(root):
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                frm = ".".join(base + (node.module.split(".") if node.module else []))
            else:
                frm = node.module or ""
            if not (frm == "partita" or frm.startswith("partita.")) or frm == module:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    out.append((module, frm, alias.name, node.lineno))
    return out


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> dict[tuple[str, str], int]:
    """(module, qualified name) -> lines of every function longer than ``limit`` lines."""
    out: dict[tuple[str, str], int] = {}
    for module, path in module_files(root).items():
        tree = ast.parse(path.read_text(), str(path))

        def walk(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = (child.end_lineno or child.lineno) - child.lineno + 1
                    if n > limit:
                        out[(module, prefix + child.name)] = n
                    walk(child, prefix + child.name + ".")
                elif isinstance(child, ast.ClassDef):
                    walk(child, prefix + child.name + ".")
        walk(tree, "")
    return out


# --- the package -----------------------------------------------------------------------------------

def test_no_new_import_cycle_inside_a_layer():
    found = layer_cycles(ROOT)
    new = [c for c in found if not any(c <= k for k in KNOWN_CYCLES)]
    assert not new, "import cycles inside a layer:\n" + "\n".join(" <-> ".join(sorted(c)) for c in new)
    stale = [k for k in KNOWN_CYCLES if not any(c <= k for c in found)]
    assert not stale, ("these KNOWN_CYCLES no longer occur; remove them (or shrink them to what remains):\n"
                       + "\n".join(", ".join(sorted(k)) for k in stale))


def test_no_new_underscore_import_across_modules():
    found = private_imports(ROOT)
    new = [f"{m} (line {line}) imports {name} from {frm}" for m, frm, name, line in found
           if (m, frm, name) not in KNOWN_PRIVATE_IMPORTS]
    assert not new, ("underscore names imported from another module; make the name public where it is defined "
                     "(or move it to a module both use):\n" + "\n".join(new))
    seen = {(m, frm, name) for m, frm, name, _ in found}
    stale = [k for k in KNOWN_PRIVATE_IMPORTS if k not in seen]
    assert not stale, "these KNOWN_PRIVATE_IMPORTS no longer occur; remove them:\n" + "\n".join(map(str, stale))


def test_no_new_long_function():
    found = long_functions(ROOT)
    new = [f"{m}.{q}: {n} lines" for (m, q), n in found.items() if (m, q) not in KNOWN_LONG_FUNCTIONS]
    assert not new, (f"functions over {MAX_FUNCTION_LINES} lines; split them into named pieces:\n" + "\n".join(new))
    grown = [f"{m}.{q}: {found[(m, q)]} lines, listed at {n}" for (m, q), n in KNOWN_LONG_FUNCTIONS.items()
             if (m, q) in found and found[(m, q)] > n]
    assert not grown, "these long functions grew; split them instead:\n" + "\n".join(grown)
    stale = [k for k in KNOWN_LONG_FUNCTIONS if k not in found]
    assert not stale, (f"these KNOWN_LONG_FUNCTIONS are no longer over {MAX_FUNCTION_LINES} lines; remove "
                       "them:\n" + "\n".join(map(str, stale)))


# --- the checkers on a synthetic package -----------------------------------------------------------

def test_checker_finds_a_lazy_cycle_and_ignores_packages(tmp_path):
    root = _package(tmp_path, {
        "partita/ir/a.py": "from . import b\n",
        "partita/ir/b.py": "def f():\n    from .c import x\n",
        "partita/ir/c.py": "from .a import y\n",
        "partita/ir/d.py": "from partita.ir import a\n",
        "partita/ir/__init__.py": "from .d import z\n",
        "partita/ops/e.py": "from ..ir import a\n",
    })
    assert layer_cycles(root) == [frozenset({"partita.ir.a", "partita.ir.b", "partita.ir.c"})]


def test_checker_finds_underscore_imports_across_modules_only(tmp_path):
    root = _package(tmp_path, {
        "partita/ir/a.py": "_x = 1\n__all__ = []\n",
        "partita/ir/b.py": "from .a import _x, __all__\nfrom os import _exit\n",
        "partita/ir/c.py": "def f():\n    from partita.ir.a import _x as y\n",
    })
    assert sorted(private_imports(root)) == [("partita.ir.b", "partita.ir.a", "_x", 1),
                                            ("partita.ir.c", "partita.ir.a", "_x", 2)]


def test_checker_measures_functions_and_methods(tmp_path):
    body = "".join(f"        x{i} = {i}\n" for i in range(160))
    root = _package(tmp_path, {"partita/ir/a.py": f"def short():\n    pass\n\n\nclass K:\n    def long(self):\n{body}"})
    assert long_functions(root) == {("partita.ir.a", "K.long"): 161}


if __name__ == "__main__":
    for c in layer_cycles(ROOT):
        print("cycle:", " <-> ".join(sorted(c)))
    for m, frm, name, line in private_imports(ROOT):
        print(f"private: {m}:{line} imports {name} from {frm}")
    for (m, q), n in sorted(long_functions(ROOT).items(), key=lambda kv: -kv[1]):
        print(f"long: {m}.{q} {n} lines")
