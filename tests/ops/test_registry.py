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
    ({"pad_zeros": "alll"}, "pad_zeros is 'alll' (did you mean 'all'?)"),
    ({"pad_logits": 1}, "pad_logits is 1, not the index of an operand"),
    ({"linear_in": frozenset({1})}, "linear_in must be a frozenset of operand indices (0..0)"),
    ({"linear_in": {0}}, "linear_in must be a frozenset of operand indices"),
    ({"size_attrs": {"shape": 1}}, "size_attrs must be a function or None"),
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


# --- rule tables: later layers attach rules without touching the records ---------------------

_SNAPSHOT_AND_IMPORT_ALL = r"""
import importlib, pkgutil, sys
import partita.ops
from partita.ops.registry import OPS
before = {name: (op, dict(vars(op))) for name, op in OPS.items()}
import partita
for m in pkgutil.walk_packages(partita.__path__, "partita."):
    if m.name.endswith("__main__"):
        continue
    importlib.import_module(m.name)
changed = []
for name, (op, fields) in before.items():
    now = OPS.get(name)
    if now is not op:
        changed.append(f"{name}: OPS holds another record")
    elif dict(vars(now)) != fields or any(vars(now)[k] is not v for k, v in fields.items()):
        changed.append(f"{name}: " + ", ".join(sorted(k for k in set(fields) | set(vars(now))
                                                   if vars(now).get(k, None) is not fields.get(k, None))))
added = sorted(set(OPS) - set(before))
print("imported", len(sys.modules))
print("CHANGED", changed)
print("ADDED", added)
"""


def test_records_are_unchanged_after_importing_every_module():
    # In a fresh process: the records as the op families register them, then every module of
    # partita imported (autodiff's vjp rules, parallel's sharding rules, ...). Later layers
    # keep their rules in RuleTables; the frozen records stay as they were, by identity.
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _SNAPSHOT_AND_IMPORT_ALL], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "CHANGED []" in out.stdout, out.stdout
    assert "ADDED []" in out.stdout, out.stdout


def test_records_read_their_rules_from_the_tables():
    from partita.autodiff.grad import NOT_DIFFERENTIABLE
    from partita.autodiff.rules import RULES as VJP
    from partita.ops.registry import RULE_TABLES
    from partita.parallel.sharding import RULES as SHARDING

    assert RULE_TABLES["vjp"] is VJP and RULE_TABLES["sharding"] is SHARDING
    assert OPS["matmul"].vjp is VJP.get("matmul") is not None and "matmul" in VJP
    # Fallbacks: first-order-only families are not differentiable; elementwise ops without a
    # rule of their own get the broadcast rule.
    assert "sgd_update" not in VJP and OPS["sgd_update"].vjp == NOT_DIFFERENTIABLE
    assert "tanh" not in SHARDING and OPS["tanh"].sharding is not None
    assert OPS["constant"].sharding is None and SHARDING.get("constant", "none") == "none"
    with SHARDING.override("tanh", None):
        assert OPS["tanh"].sharding is None
    assert OPS["tanh"].sharding is not None
    where = VJP.where("matmul")
    assert where is not None and where.file.endswith("rules.py")


def test_a_second_rule_or_a_rule_for_an_unknown_op_is_an_error(fresh_name):
    from partita.ops.registry import RuleTable

    table = RuleTable("test-only-kind")
    try:
        rule = lambda ts, attrs: None  # noqa: E731
        table.register("relu", rule)
        with pytest.raises(ValueError, match=r"test-only-kind rule for 'relu' registered twice \(first at .*test_registry"):
            table.register("relu", rule)
        with pytest.raises(ValueError, match=r"registered twice"):
            table["relu"] = rule
        with pytest.raises(ValueError, match=r"rule for unknown op 'rellu' \(did you mean 'relu'\?\)"):
            table.register("rellu", rule)
        with pytest.raises(ValueError, match=r"unknown op"):
            table.rule("no_such_op")(rule)
        assert table.get("relu") is rule and table.get("tanh") is None and table.names() == {"relu"}
        with pytest.raises(ValueError, match=r"rule table 'test-only-kind' declared twice"):
            RuleTable("test-only-kind")
        # The real tables refuse a second rule for an op they already have.
        from partita.autodiff.rules import RULES as VJP
        with pytest.raises(ValueError, match=r"vjp rule for 'matmul' registered twice"):
            VJP.register("matmul", rule)
    finally:
        from partita.ops.registry import RULE_TABLES
        RULE_TABLES.pop("test-only-kind", None)


def test_linearity_is_a_fact_of_the_elementwise_records():
    """The sharding rule of an elementwise op reads which operands a partial sum passes
    through from the record (no table of op names in the parallel layer)."""
    from partita.ir import TensorType
    from partita.ir.dtypes import f32
    from partita.parallel.sharding import RULES

    assert OPS["add"].linear_in == frozenset({0, 1}) and OPS["add"].linear_joint
    assert OPS["mul"].linear_in == frozenset({0, 1}) and not OPS["mul"].linear_joint
    assert OPS["div"].linear_in == frozenset({0})
    assert OPS["where"].linear_in == frozenset({1, 2}) and OPS["where"].linear_joint
    assert OPS["exp"].linear_in == frozenset()
    t = TensorType((2, 3), f32)
    spec = RULES.get("sub")([t, t], {})
    assert spec.linear == frozenset({0, 1}) and spec.joint
    assert RULES.get("exp")([t], {}).linear == frozenset()


def test_importing_partita_does_not_import_torch():
    """`import partita` (and its op registry) leaves torch unloaded: a command that never runs
    torch (plan, simulate) does not pay its import. A registry entry that reads an attribute
    of torch at import time (`torch.fmod` rather than a lambda calling it) loads it."""
    import subprocess
    import sys

    code = "import sys, partita, partita.ops, partita.planning; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "importing partita loaded torch"
