"""The package type-checks cleanly under the mypy settings in pyproject.toml."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_mypy_reports_no_errors() -> None:
    """mypy over ``partita`` (the ``files`` of ``[tool.mypy]``) finds no error.

    Run in a subprocess with this interpreter so the check sees the same installed
    packages as the tests; the incremental cache in ``.mypy_cache`` at the repository root
    keeps repeat runs under a second (a cold run takes about ten seconds).
    """
    if importlib.util.find_spec("mypy") is None:
        pytest.fail("mypy is not installed; install the test extra: pip install -e '.[test]'")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml")],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mypy found type errors (exit {proc.returncode}):\n{out}"
    # A config that stopped naming the package would "succeed" on nothing: insist on files.
    m = re.search(r"no issues found in (\d+) source files", out)
    assert m is not None and int(m.group(1)) > 0, f"mypy checked no files:\n{out}"


# ``Value.name`` is optional because node results go unnamed until printed; graph inputs
# are always named, which is what lets the typed code call ``input_name``. The checks below
# hold that boundary at run time too.

def test_add_input_refuses_an_unnamed_input() -> None:
    """``Graph.add_input`` raises a GraphEditError for a name that is not a string."""
    from partita.ir.diagnostics import GraphEditError
    from partita.ir.dtypes import f32
    from partita.ir.graph import Graph
    from partita.ir.types import TensorType

    g = Graph("g")
    with pytest.raises(GraphEditError, match="input name must be a string, got None"):
        g.add_input(None, TensorType((2,), f32))  # type: ignore[arg-type]  # the error under test
    assert g.inputs == []


def test_verify_names_an_input_whose_name_was_cleared() -> None:
    """The verifier reports an input left without a name, rather than crashing later."""
    from partita.ir.diagnostics import VerifyError
    from partita.ir.dtypes import f32
    from partita.ir.graph import Graph, input_name
    from partita.ir.types import TensorType
    from partita.ir.verifier import verify

    g = Graph("g")
    x = g.add_input("x", TensorType((2,), f32))
    g.set_outputs([x])
    assert input_name(x) == "x"
    verify(g)
    x.name = None
    with pytest.raises(VerifyError, match=r"@g: input 0 has no name"):
        verify(g)
