"""Shared fixtures for the IR tests.

``tests/`` goes on ``sys.path`` so ``strategies`` (random valid graphs) imports the same way
in every suite. ``attr_ops`` registers two ops that exist only for these tests: one with an
attribute of every kind, so the text form of each kind can be round-tripped, and one with
several results.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

_TESTS = str(Path(__file__).resolve().parent.parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

import partita  # noqa: E402,F401  (registers every op)
from partita.ir import TensorType, f32  # noqa: E402
from partita.ops.registry import OPS, AttrSpec, OpDef  # noqa: E402

ATTR_OP = "ir_test.attrs"
MULTI_OP = "ir_test.fork"


def _attrs_infer(ts, attrs):
    return ts[0] if ts else TensorType((), f32)


def _fork_infer(ts, attrs):
    return [ts[0]] * attrs["n"]


def _make_test_ops() -> list[OpDef]:
    return [
        OpDef(name=ATTR_OP, operands=("x?",), infer=_attrs_infer,
              reference=lambda args, a: args[0] if args else np.zeros((), np.float32),
              torch=lambda args, a: args[0],
              attrs=(AttrSpec("i", "int", 0), AttrSpec("f", "float", 0.0), AttrSpec("b", "bool", False),
                     AttrSpec("s", "str", ""), AttrSpec("dt", "dtype", None), AttrSpec("ints", "ints", None),
                     AttrSpec("fs", "floats", None), AttrSpec("sc", "scalar", None),
                     AttrSpec("t", "tensor", None), AttrSpec("mode", "str", "a", choices=("a", "b"))),
              doc="test-only: one attribute of every kind"),
        OpDef(name=MULTI_OP, operands=("x",), infer=_fork_infer,
              reference=lambda args, a: [args[0]] * a["n"], torch=lambda args, a: [args[0]] * a["n"],
              attrs=(AttrSpec("n", "int", 2),), doc="test-only: n copies of x"),
    ]


@pytest.fixture(scope="module")
def attr_ops():
    """Registers the test-only ops for one module and removes them afterwards, so suites
    that walk every op in ``OPS`` never see them."""
    ops = _make_test_ops()
    for op in ops:
        assert op.name not in OPS
        OPS[op.name] = op
    yield ops
    for op in ops:
        OPS.pop(op.name, None)
