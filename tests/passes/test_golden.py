"""Golden tests: ``tests/golden/<pass>/*.pir`` (format: docs/passes.md, "Golden files").

Each file holds ``// RUN: <pipeline>``, the input graph, a line ``// EXPECT:`` and the
expected output graph. For each file this test checks that
- the input and the expected graph are in printed form (print(parse(text)) == text), so
  both round-trip through the printer and the parser;
- running the pipeline (verifying after each pass) prints exactly the expected text;
- the reference interpreter gives the same outputs before and after, on random inputs.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest

from partita.ir import parse, print_graph, verify
from partita.passes import PassManager

from strategies import assert_same_outputs, random_inputs, run_reference

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
PASS_DIRS = ("dce", "cse", "fold-constants", "canonicalize", "fuse-activations", "fuse-kernels", "fuse-library",
             "fold-batch-norm", "assign-layout")
FILES = sorted(p for d in PASS_DIRS for p in (GOLDEN / d).glob("*.pir"))


class GoldenFile:
    """A parsed golden file: its pipeline, input text and expected text."""

    def __init__(self, path: Path) -> None:
        self.path = path
        lines = path.read_text().splitlines(keepends=True)
        if not lines or not lines[0].startswith("// RUN: "):
            raise ValueError(f"{path}: the first line must be '// RUN: <pipeline>'")
        self.pipeline = lines[0][len("// RUN: "):].strip()
        marks = [i for i, ln in enumerate(lines) if ln.rstrip("\n") == "// EXPECT:"]
        if len(marks) != 1:
            raise ValueError(f"{path}: expected exactly one '// EXPECT:' line, found {len(marks)}")
        k = marks[0]
        # Comment lines before the input graph describe the test; they are not graph text.
        self.input = "".join(ln for ln in lines[1:k] if not ln.startswith("//"))
        self.expected = "".join(lines[k + 1:])


def _id(p: Path) -> str:
    return f"{p.parent.name}/{p.name}"


def test_every_pass_has_golden_files():
    for d in PASS_DIRS:
        n = len(list((GOLDEN / d).glob("*.pir")))
        assert n >= 4, f"tests/golden/{d} has {n} golden files; each pass needs at least 4"


@pytest.mark.parametrize("path", FILES, ids=_id)
def test_golden(path: Path, tmp_path: Path):
    gf = GoldenFile(path)
    name = _id(path)
    src = parse(gf.input, str(path))
    assert print_graph(src) == gf.input, f"{name}: the input graph is not in printed form (it must round-trip)"
    expected = parse(gf.expected, str(path))
    assert print_graph(expected) == gf.expected, f"{name}: the expected graph is not in printed form"
    verify(expected)

    inputs = random_inputs(src, seed=zlib.crc32(name.encode()))
    before = run_reference(src, inputs)
    pm = PassManager.parse(gf.pipeline, reproducer_dir=tmp_path)
    out = pm.run(src)
    got = print_graph(out)
    assert got == gf.expected, f"{name}: output of '{gf.pipeline}' differs from // EXPECT:\n{got}"
    assert_same_outputs(before, run_reference(out, inputs), f"{name} (reference interpreter)")


def test_golden_reader_rejects_malformed_files(tmp_path: Path):
    bad = tmp_path / "bad.pir"
    bad.write_text("graph @f() -> () {\n  return\n}\n")
    with pytest.raises(ValueError, match="RUN"):
        GoldenFile(bad)
    bad.write_text("// RUN: dce\ngraph @f() -> () {\n  return\n}\n")
    with pytest.raises(ValueError, match="EXPECT"):
        GoldenFile(bad)
