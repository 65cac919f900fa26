"""Passes are found by name from one table (``PASS_MODULES``), never by which modules happen to
have been imported: each shipped pass, and every pass the docs name, runs after a bare
``import partita``."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

from partita.passes import PASS_MODULES, PASSES

ROOT = Path(__file__).resolve().parents[2]


def test_each_module_registers_exactly_the_passes_the_table_lists_for_it():
    for module in set(PASS_MODULES.values()):
        importlib.import_module(module)
    for name, cls in PASSES.items():
        if cls.__module__.startswith("partita."):
            assert PASS_MODULES.get(name) == cls.__module__, (name, cls.__module__)
    assert set(PASS_MODULES) <= set(PASSES), sorted(set(PASS_MODULES) - set(PASSES))


def _doc_pass_names() -> set[str]:
    """Names the README and docs/ call a pass: "`x` pass", "pass `x`", and the entries of
    pass pipelines (passes="a,b", --passes a,b)."""
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
    names = set(re.findall(r"`([a-z][a-z0-9]*(?:-[a-z0-9]+)*)` pass\b", text))
    names |= set(re.findall(r"\bpass(?:es)? `([a-z][a-z0-9]*(?:-[a-z0-9]+)*)`", text))
    for pipe in re.findall(r"(?:passes ?= ?\"|--passes[ =])([a-z0-9,{}=.-]+)", text):
        names |= {re.sub(r"\{.*", "", p) for p in pipe.split(",") if p}
    return names


def test_every_pass_the_docs_name_is_in_the_table():
    named = _doc_pass_names()
    assert {"grad", "fuse-kernels", "canonicalize"} <= named      # the extraction finds them
    assert named <= set(PASS_MODULES), sorted(named - set(PASS_MODULES))


def test_every_pass_is_found_after_a_bare_import():
    # A fresh interpreter: "recompute" was "unknown pass" there (it registered only once
    # partita.autodiff.recompute happened to be imported), and "bucket-gathers" was no pass.
    code = (
        "import partita\n"
        "from partita.passes import PASS_MODULES, get_pass\n"
        "for name in PASS_MODULES:\n"
        "    assert get_pass(name).name == name, name\n"
        "g = partita.load('partita/examples/block.pir')\n"
        "partita.optimize(g, passes='recompute')\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
