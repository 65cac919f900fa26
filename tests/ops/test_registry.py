"""The op registry itself: records are checked when they are registered, and they say where
they were defined."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import partita  # noqa: F401  (registers every op family)
from partita.ops.registry import OPS, AttrSpec, OpDef, record_problems, register


def _record(**kw) -> OpDef:
    base = dict(name="test_only_op", operands=("x",), infer=lambda ts, a: ts[0],
                reference=lambda args, a: args[0], torch=lambda args, a: args[0])
    base.update(kw)
    return OpDef(**base)


@pytest.fixture
def fresh_name():
    yield "test_only_op"
    OPS.pop("test_only_op", None)


@pytest.mark.parametrize("kw, message", [
    ({"attrs": (AttrSpec("n", "itn", 0),)}, "attribute 'n' has kind 'itn' (did you mean 'int'?)"),
    ({"attrs": (AttrSpec("n", "int", 1.5),)}, "attribute 'n': the default does not fit"),
    ({"attrs": (AttrSpec("alpha", "float", 1),)}, "default 1 is not in canonical form (write 1.0)"),
    ({"attrs": (AttrSpec("axes", "ints", [0]),)}, "default [0] is not in canonical form (write (0,))"),
    ({"attrs": (AttrSpec("mode", "str", "c", choices=("a", "b")),)}, "must be one of 'a', 'b', got 'c'"),
    ({"attrs": (AttrSpec("n", "int", 0), AttrSpec("n", "int", 1))}, "attribute 'n' is declared twice"),
    ({"operands": ("x", "x")}, "operand 'x' is declared twice"),
    ({"operands": ("x?", "y")}, "operand 'y' follows an optional operand"),
    ({"reference": None}, "reference must be a function"),
])
def test_register_refuses_a_malformed_record(fresh_name, kw, message):
    with pytest.raises(ValueError) as e:
        register(_record(**kw))
    assert message in str(e.value)
    assert "op 'test_only_op' at " in str(e.value) and "test_registry.py" in str(e.value)
    assert fresh_name not in OPS


def test_register_accepts_a_well_formed_record(fresh_name):
    op = register(_record(attrs=(AttrSpec("n", "int", 0), AttrSpec("mode", "str", "a", choices=("a", "b")),
                                 AttrSpec("eps", "float", 1e-5), AttrSpec("axes", "ints", None)),
                          operands=("x", "y?")))
    assert OPS[fresh_name] is op
    assert op.normalize_attrs({"n": np.int64(3)}) == {"n": 3, "mode": "a", "eps": 1e-5, "axes": None}
    with pytest.raises(ValueError, match="registered twice"):
        register(_record())


def test_every_registered_record_is_well_formed():
    bad = {name: record_problems(op) for name, op in OPS.items() if record_problems(op)}
    assert not bad


def _line_of(path: Path, pattern: str) -> int:
    for i, line in enumerate(path.read_text().splitlines(), 1):
        if re.search(pattern, line):
            return i
    raise AssertionError(f"{pattern} not in {path}")


@pytest.mark.parametrize("name, file, pattern", [
    ("relu", "elementwise.py", r'^_unary\("relu"'),
    ("add", "elementwise.py", r'^_binary\("add"'),
    ("silu_grad", "backward.py", r'^_act_grad\("silu_grad"'),
    ("all_gather", "collective.py", r'^_collective\("all_gather"'),
])
def test_defined_at_is_the_line_that_defines_the_op(name, file, pattern):
    # A family helper (_unary, _binary, ...) calls register; the record names the helper's
    # caller, the op's own line.
    ops_dir = Path(partita.__file__).parent / "ops"
    at = OPS[name].defined_at
    assert Path(at.file).resolve() == (ops_dir / file).resolve()
    assert at.line == _line_of(ops_dir / file, pattern)


def test_defined_at_outside_the_ops_package_is_the_caller(fresh_name):
    line = _line_of(Path(__file__), r"register\(_record\(\)\)  # this line")
    register(_record())  # this line
    assert OPS[fresh_name].defined_at.file == __file__ and OPS[fresh_name].defined_at.line == line
