"""The import layers of partita/ (docs/architecture.md): who may import whom.

Every module of the package is parsed with ``ast``; every import in it (at module level, in
a function, under ``if TYPE_CHECKING``; ``import x``, ``from x import y``, relative imports
resolved against the module) that names a partita module is checked against ``ORDER`` and
``ALSO``. A failure names the importing module, the line, the imported module and the rule.

``python tests/test_layers.py`` prints every edge between layers and every violation.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

PACKAGE = "partita"
ROOT = Path(__file__).resolve().parents[1]

# The layers, bottom to top. A module may import its own layer and every layer below it,
# and nothing above. ``api`` is the package itself (partita/__init__.py, the public facade
# that re-exports from every layer); ``cli`` is partita/cli/ and partita/__main__.py.
# The order follows the flow of docs/architecture.md: the IR records and the op records at
# the bottom, then the executors (they define what a graph means, and every layer that runs a
# graph uses them: the ONNX/torch import checks, the Trainer, run_mesh), then the stages
# from import to launch, and the cluster model (hardware, costs, simulation) that prices
# the programs they emit.
ORDER = ("ir", "ops", "backend", "frontend", "models", "passes", "codegen", "autodiff", "parallel", "runtime", "cluster", "planning", "view", "api",
         "examples", "cli")

# Modules of a layer above that a layer may import as well (with their submodules): the IR
# knows nothing of ops beyond looking them up in the registry (the builder, parser, printer and
# verifier read the op records from it).
ALSO = {
    "ir": ("partita.ops.registry",),
}

# Imports that break the rules today and could not be fixed yet: (importing module, imported
# module, why). The test fails when one of them is no longer there, so the list only shrinks.
KNOWN_EXCEPTIONS: tuple[tuple[str, str, str], ...] = ()


@dataclass(frozen=True)
class Import:
    module: str      # the importing module, e.g. partita.ir.parser
    path: str        # its file, relative to the root scanned
    line: int
    target: str      # the imported partita module, resolved


@dataclass(frozen=True)
class Violation:
    imp: Import
    rule: str

    def __str__(self) -> str:
        i = self.imp
        return f"{i.path}:{i.line}: {i.module} imports {i.target}: {self.rule}"


def layer_of(module: str) -> str | None:
    """The layer of a partita module, or None for a module that is in no layer."""
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    if len(parts) == 1:
        return "api"
    if parts[1] in ("cli", "__main__"):
        return "cli"
    return parts[1] if parts[1] in ORDER and parts[1] not in ("api", "cli") else None


def module_files(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root`` (module name -> file)."""
    out: dict[str, Path] = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(module: str, path: Path, source: str, modules: set[str], is_package: bool,
               root: Path) -> list[Import]:
    """The partita modules ``module`` imports, anywhere in its source."""
    rel = str(path.relative_to(root))
    tree = ast.parse(source, rel)
    out: list[Import] = []

    def add(line: int, target: str) -> None:
        if target == PACKAGE or target.startswith(PACKAGE + "."):
            out.append(Import(module, rel, line, target))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                if node.level - 1 > len(base) - 1:
                    raise ValueError(f"{rel}:{node.lineno}: relative import beyond the package")
                base = base[:len(base) - (node.level - 1)]
                if node.module:
                    base = base + node.module.split(".")
                frm = ".".join(base)
            else:
                frm = node.module or ""
            for alias in node.names:
                sub = f"{frm}.{alias.name}"
                # ``from partita.parallel import comm`` imports the module partita.parallel.comm;
                # ``from partita.ir import Graph`` imports from partita.ir.
                add(node.lineno, sub if sub in modules else frm)
    return out


def package_imports(root: Path) -> Iterator[tuple[str, Path, list[Import]]]:
    """Every module of the package under ``root``: its name, its file and its imports."""
    files = module_files(root)
    names = set(files)
    for module, path in files.items():
        yield module, path, imports_of(module, path, path.read_text(), names, path.name == "__init__.py", root)


def _no_layer(module: str) -> str:
    return f"{module} is in no layer; add its folder to ORDER in tests/test_layers.py"


def rule_for(src: str, target: str) -> str | None:
    """The rule that an import of ``target`` by a module of layer ``src`` breaks, or None."""
    dst = layer_of(target)
    if dst is None:
        return _no_layer(target)
    if dst == src:
        return None
    i, j = ORDER.index(src), ORDER.index(dst)
    if dst == "cli":
        return "nothing but partita.cli and partita.__main__ may import partita.cli"
    if j < i or any(target == m or target.startswith(m + ".") for m in ALSO.get(src, ())):
        return None
    also = "".join(f", and {m}" for m in ALSO.get(src, ()))
    return (f"{src}/ may not import from {dst}/, a layer above it (a module imports its own layer and "
            f"those below: {', '.join(ORDER[:i]) or 'none'}{also})")


def check(root: Path, exceptions=KNOWN_EXCEPTIONS) -> tuple[list[Violation], list[tuple[str, str, str]]]:
    """The violations in the package under ``root`` (less the known exceptions), and the known
    exceptions that no longer occur."""
    found: list[Violation] = []
    for module, path, imps in package_imports(root):
        src = layer_of(module)
        if src is None:
            found.append(Violation(Import(module, str(path.relative_to(root)), 1, module), _no_layer(module)))
            continue
        for imp in imps:
            rule = rule_for(src, imp.target)
            if rule is not None:
                found.append(Violation(imp, rule))
    known = {(m, t) for m, t, _ in exceptions}
    violations = [v for v in found if (v.imp.module, v.imp.target) not in known]
    seen = {(v.imp.module, v.imp.target) for v in found}
    stale = [e for e in exceptions if (e[0], e[1]) not in seen]
    return violations, stale


def edges(root: Path) -> dict[tuple[str, str], int]:
    """How many imports go from each layer to each other layer."""
    out: dict[tuple[str, str], int] = {}
    for module, _path, imps in package_imports(root):
        for imp in imps:
            a, b = layer_of(module), layer_of(imp.target)
            if a != b:
                out[(str(a), str(b))] = out.get((str(a), str(b)), 0) + 1
    return out


# --- the package -------------------------------------------------------------------------------

def test_every_import_follows_the_layers():
    violations, _ = check(ROOT)
    assert not violations, "imports against the layers of docs/architecture.md:\n" + "\n".join(map(str, violations))


def test_known_exceptions_are_still_needed():
    _, stale = check(ROOT)
    assert not stale, ("these KNOWN_EXCEPTIONS in tests/test_layers.py no longer occur; remove them:\n"
                       + "\n".join(f"{m} -> {t} ({why})" for m, t, why in stale))


def test_every_folder_of_the_package_is_a_layer():
    folders = {p.name for p in (ROOT / PACKAGE).iterdir() if p.is_dir() and p.name != "__pycache__"
               and any(p.rglob("*.py"))}
    assert folders <= set(ORDER), f"folders in no layer: {sorted(folders - set(ORDER))}; place them in ORDER"


# --- the checker on a synthetic package --------------------------------------------------------

def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    for d in {(tmp_path / rel).parent for rel in files}:
        while d != tmp_path:
            (d / "__init__.py").touch()
            d = d.parent
    return tmp_path


def test_checker_reports_an_upward_import_in_a_function(tmp_path):
    root = _package(tmp_path, {
        "partita/parallel/comm.py": "X = 1\n",
        "partita/ops/bad.py": "import numpy\n\n\ndef f():\n    from ..parallel.comm import X\n    return X\n",
    })
    violations, stale = check(root, ())
    assert [(v.imp.module, v.imp.line, v.imp.target) for v in violations] == \
        [("partita.ops.bad", 5, "partita.parallel.comm")]
    text = str(violations[0])
    assert text.startswith("partita/ops/bad.py:5: partita.ops.bad imports partita.parallel.comm: ")
    assert "ops/ may not import from parallel/" in text and stale == []


def test_checker_resolves_each_form_of_import(tmp_path):
    root = _package(tmp_path, {
        "partita/passes/manager.py": "",
        "partita/runtime/launch.py": "",
        "partita/ir/a.py": "import partita.passes.manager\n",
        "partita/ir/b.py": "from partita.runtime import launch\n",
        "partita/ir/c.py": "from .. import passes\n",
        "partita/ir/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..runtime.launch import f\n",
        "partita/ir/ok.py": "from . import a\nfrom .a import x\nimport partita.ir.b\n",
    })
    violations, _ = check(root, ())
    got = sorted((v.imp.module, v.imp.target) for v in violations)
    assert got == [("partita.ir.a", "partita.passes.manager"), ("partita.ir.b", "partita.runtime.launch"),
                   ("partita.ir.c", "partita.passes"), ("partita.ir.d", "partita.runtime.launch")]


def test_checker_ir_may_only_look_ops_up(tmp_path):
    root = _package(tmp_path, {
        "partita/ops/registry.py": "",
        "partita/ops/shape.py": "",
        "partita/ir/ok.py": "def f():\n    from ..ops.registry import OPS\n",
        "partita/ir/bad.py": "from ..ops import shape\n",
        "partita/passes/fine.py": "from ..ops import shape\n",
    })
    violations, _ = check(root, ())
    assert [(v.imp.module, v.imp.target) for v in violations] == [("partita.ir.bad", "partita.ops.shape")]
    assert "ir/ may not import from ops/" in violations[0].rule and "and partita.ops.registry" in violations[0].rule


def test_checker_cli_imports_everything_and_nothing_imports_it(tmp_path):
    root = _package(tmp_path, {
        "partita/cli/main.py": "import partita\nfrom partita.runtime import launch\n",
        "partita/__main__.py": "from .cli.main import main\n",
        "partita/runtime/launch.py": "from ..cli import main\n",
        "partita/parallel/x.py": "import partita\n",
    })
    violations, _ = check(root, ())
    got = {(v.imp.module, v.imp.target): v.rule for v in violations}
    assert set(got) == {("partita.runtime.launch", "partita.cli.main"), ("partita.parallel.x", "partita")}
    assert "may import partita.cli" in got[("partita.runtime.launch", "partita.cli.main")]
    assert "api" in got[("partita.parallel.x", "partita")]


def test_checker_reports_a_folder_in_no_layer(tmp_path):
    root = _package(tmp_path, {"partita/plan/cost.py": "", "partita/ir/x.py": "from ..plan import cost\n"})
    violations, _ = check(root, ())
    assert {v.imp.module for v in violations} == {"partita.plan", "partita.plan.cost", "partita.ir.x"}
    assert all("in no layer" in v.rule for v in violations)


def test_checker_known_exceptions_hide_and_go_stale(tmp_path):
    root = _package(tmp_path, {"partita/parallel/comm.py": "", "partita/ops/bad.py": "from ..parallel import comm\n"})
    known = (("partita.ops.bad", "partita.parallel.comm", "the group table"),
             ("partita.ops.gone", "partita.parallel.comm", "fixed since"))
    violations, stale = check(root, known)
    assert violations == []
    assert stale == [known[1]]


if __name__ == "__main__":
    for (a, b), n in sorted(edges(ROOT).items()):
        print(f"{a:>9} -> {b:<9} {n}")
    vs, st = check(ROOT)
    print("\n".join(map(str, vs)) or "no violations")
    for m, t, why in st:
        print(f"stale exception: {m} -> {t} ({why})")
    sys.exit(1 if vs or st else 0)
