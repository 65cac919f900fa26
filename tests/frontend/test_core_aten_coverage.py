"""docs/frontend.md's table of core ATen ops without a converter is exactly what
core_aten_missing() computes: a new converter, or a torch release that adds a core op,
makes the table wrong and this test says which rows to change."""

from __future__ import annotations

import re
from pathlib import Path

from partita.frontend.torch_export import ATEN_TO_PARTITA, core_aten_missing, decomposition_table

DOC = Path(__file__).resolve().parents[2] / "docs" / "frontend.md"


def _documented() -> set[str]:
    text = DOC.read_text()
    section = text.split("### The core ATen opset: what has no converter, and why", 1)[1].split("\n### ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        if line.startswith("| `aten."):
            names |= set(re.findall(r"`(aten\.[A-Za-z0-9_.]+)`", line.split(" | ")[0]))
    return names


def test_the_documented_missing_ops_are_the_missing_ops():
    missing, documented = set(core_aten_missing()), _documented()
    assert not missing - documented, f"add to docs/frontend.md's table, with the reason: {sorted(missing - documented)}"
    assert not documented - missing, f"these convert now; remove them from the table: {sorted(documented - missing)}"


def test_missing_ops_have_no_converter_and_are_not_decomposed():
    table = decomposition_table()
    names = {str(op) for op in ATEN_TO_PARTITA} | {str(op) for op in table}
    assert not set(core_aten_missing()) & names
