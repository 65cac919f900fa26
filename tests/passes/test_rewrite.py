"""The rewrite-rule DSL and its driver."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from partita.ir import PassError, parse, print_graph, verify
from partita.ir.types import Location
from partita.passes.rewrite import (Match, Op, RewriteDriver, Splat, Var, apply_rules, rule, splat_value)

X, Y = Var("x"), Var("y")


def run_rules(src: str, *rules, trace=None) -> str:
    g = parse(src, "in.pir")
    apply_rules(g, rules, trace=trace)
    return print_graph(verify(g))


def body(text: str) -> list[str]:
    """The node and return lines of printed IR."""
    return [ln.strip() for ln in text.splitlines()[1:-1]]


def test_rule_records_where_it_was_written():
    line = sys._getframe().f_lineno + 1
    r = rule("neg-neg", Op("neg", Op("neg", X)), X)
    assert r.defined_at == Location(__file__, line)
    assert r.ops() == {"neg"} and r.available()


def test_rules_naming_unregistered_ops_are_skipped():
    r = rule("future", Op("no_such_op", X), X)
    assert not r.available()
    d = RewriteDriver([r, rule("neg-neg", Op("neg", Op("neg", X)), X)])
    assert [x.name for x in d.rules] == ["neg-neg"]


def test_pattern_and_replacement_are_checked_at_creation():
    with pytest.raises(TypeError, match="root must be an Op"):
        rule("bad", X, X)
    with pytest.raises(TypeError, match="operands must be patterns"):
        Op("neg", 3)
    with pytest.raises(ValueError, match="unknown fix"):
        rule("bad", Op("neg", X), X, fix=("reshape",))


SRC_SUB = """graph @f(%a: i32[3], %b: i32[3]) -> (i32[3], i32[3]) {
  %0 = sub(%a, %a) : i32[3]
  %1 = sub(%a, %b) : i32[3]
  return %0, %1
}
"""


def test_a_variable_used_twice_must_bind_the_same_value():
    out = run_rules(SRC_SUB, rule("sub-self", Op("sub", X, X), lambda m: m.emit("mul", m["x"], m["x"])))
    assert body(out) == ["%0 = mul(%a, %a) : i32[3]", "%1 = sub(%a, %b) : i32[3]", "return %0, %1"]


SRC_ONES = """graph @f(%x: f32[3]) -> (f32[3], f32[3], f32[3], f32[3], f32[3]) {
  %one = full() {shape=[3], value=1.0} : f32[3]
  %ones = constant() {value=dense<f32[3], [1.0, 1.0, 1.0]>} : f32[3]
  %mixed = constant() {value=dense<f32[3], [1.0, 2.0, 1.0]>} : f32[3]
  %0 = mul(%one, %x) : f32[3]
  %1 = div(%one, %x) : f32[3]
  %2 = mul(%x, %ones) : f32[3]
  %3 = mul(%x, %mixed) : f32[3]
  %4 = div(%x, %ones) : f32[3]
  return %0, %1, %2, %3, %4
}
"""


def test_commutative_ops_match_in_both_orders_and_splats_are_recognised():
    rules = [rule("mul-one", Op("mul", X, Splat(1.0)), X), rule("div-one", Op("div", X, Splat(1)), X)]
    out = run_rules(SRC_ONES, *rules)
    # mul is commutative: 1*x matches; div is not: 1/x stays. A non-splat constant is not 1.
    lines = body(out)
    assert "return %x, %0, %x, %1, %x" in lines
    assert "%0 = div(%one, %x) : f32[3]" in lines and "%1 = mul(%x, %mixed) : f32[3]" in lines


def test_splat_never_matches_nan_and_binds_its_value():
    src = """graph @f(%x: f32[2]) -> (f32[2], f32[2]) {
  %n = full() {shape=[2], value=nan} : f32[2]
  %t = full() {shape=[2], value=3.0} : f32[2]
  %0 = mul(%x, %n) : f32[2]
  %1 = mul(%x, %t) : f32[2]
  return %0, %1
}
"""
    seen = []

    def record(m: Match):
        seen.append(m.splat("c"))
        return None  # does not apply: nothing changes

    out = run_rules(src, rule("mul-nan", Op("mul", X, Splat(float("nan"))), X),
                    rule("see", Op("mul", X, Splat(bind="c")), record))
    assert out == print_graph(parse(src))
    assert len(seen) == 2 and np.isnan(seen[0]) and seen[1] == 3.0


def test_attribute_constraints_by_value_and_by_predicate():
    src = """graph @f(%x: f32[2,3]) -> (f32[3], f32[2], f32[3]) {
  %0 = sum(%x) {axes=[0]} : f32[3]
  %1 = sum(%x) {axes=[1]} : f32[2]
  %2 = sum(%x) {axes=[0], keepdim=false} : f32[3]
  return %0, %1, %2
}
"""
    by_value = rule("axes0", Op("sum", X, axes=(0,)), lambda m: m.emit("max", m["x"], axes=(0,)))
    out = run_rules(src, by_value)
    assert [ln.split(" = ")[1].split("(")[0] for ln in body(out)[:-1]] == ["max", "sum", "max"]
    by_pred = rule("axes-has-1", Op("sum", X, axes=lambda a: 1 in a), lambda m: m.emit("min", m["x"], axes=(1,)))
    out = run_rules(src, by_pred)
    assert [ln.split(" = ")[1].split("(")[0] for ln in body(out)[:-1]] == ["sum", "min", "sum"]


def test_op_replacement_with_computed_attributes():
    src = """graph @f(%x: f32[2,3,4]) -> (f32[3,4,2]) {
  %0 = transpose(%x) {perm=[1, 0, 2]} : f32[3,2,4]
  %1 = transpose(%0) {perm=[0, 2, 1]} : f32[3,4,2]
  return %1
}
"""
    compose = rule("compose", Op("transpose", Op("transpose", X, bind="inner")),
                   Op("transpose", X, perm=lambda m: tuple(m["inner"].attrs["perm"][i] for i in m.root.attrs["perm"])))
    out = run_rules(src, compose)
    assert body(out) == ["%0 = transpose(%x) {perm=[1, 2, 0]} : f32[3,4,2]", "return %0"]


SRC_WIDEN = """graph @f(%x: f32[3], %i: i32[3]) -> (f32[2,3], f32[3]) {
  %one = full() {shape=[2, 3], value=1.0} : f32[2,3]
  %onef = full() {shape=[3], value=1.0} : f32[3]
  %0 = mul(%x, %one) : f32[2,3]
  %1 = mul(%i, %onef) : f32[3]
  return %0, %1
}
"""


def test_replacement_must_keep_the_type_unless_the_rule_allows_a_fix():
    out = run_rules(SRC_WIDEN, rule("mul-one", Op("mul", X, Splat(1.0)), X))
    assert out == print_graph(parse(SRC_WIDEN))  # types differ, no fix allowed: nothing fires
    out = run_rules(SRC_WIDEN, rule("mul-one", Op("mul", X, Splat(1.0)), X, fix=("broadcast",)))
    assert "broadcast_to(%x) {shape=[2, 3]}" in out and "mul(%i, %onef)" in out
    out = run_rules(SRC_WIDEN, rule("mul-one", Op("mul", X, Splat(1.0)), X, fix=("broadcast", "cast")))
    assert body(out) == ["%0 = broadcast_to(%x) {shape=[2, 3]} : f32[2,3]",
                         "%1 = cast(%i) {dtype=f32} : f32[3]", "return %0, %1"]


def test_a_replacement_the_type_rules_reject_does_not_apply():
    src = """graph @f(%b: bool[3], %y: i32[3]) -> (i32[3]) {
  %n = neg(%y) : i32[3]
  %0 = add(%b, %n) : i32[3]
  return %0
}
"""
    # sub rejects a bool operand, so add(b, neg y) -> sub(b, y) cannot be built here.
    out = run_rules(src, rule("add-neg", Op("add", X, Op("neg", Y)), Op("sub", X, Y)))
    assert out == print_graph(parse(src))


def test_dead_matched_nodes_are_erased_but_shared_ones_kept():
    src = """graph @f(%x: f32[3]) -> (f32[3], f32[3]) {
  %a = neg(%x) : f32[3]
  %b = neg(%a) : f32[3]
  %c = exp(%x) : f32[3]
  %d = neg(%c) : f32[3]
  %e = neg(%d) : f32[3]
  return %b, %d
}
"""
    out = run_rules(src, rule("neg-neg", Op("neg", Op("neg", X)), X))
    # %a died with %b; %d is an output, so it stays although %e matched through it.
    assert body(out) == ["%c = exp(%x) : f32[3]", "%d = neg(%c) : f32[3]", "return %x, %d"]


def test_effectful_roots_are_not_rewritten_and_effectful_operands_not_erased():
    src = """graph @f(%x: f32[4]) -> (f32[4], f32[4]) {
  %0 = dropout(%x) {train=true, seed=1} : f32[4]
  %1 = dropout(%0) {train=true, seed=1} : f32[4]
  %2 = dropout(%x) {train=true, seed=2} : f32[4]
  %3 = neg(%2) : f32[4]
  %4 = neg(%3) : f32[4]
  return %1, %4
}
"""
    out = run_rules(src, rule("drop-drop", Op("dropout", Op("dropout", X, bind="in")), lambda m: m["in"].results[0]),
                    rule("neg-neg", Op("neg", Op("neg", X)), X))
    lines = body(out)
    assert sum("dropout(" in ln for ln in lines) == 3
    assert lines[-1] == "return %1, %2"


def test_trace_names_rule_its_source_and_the_node():
    src = """graph @f(%x: f32[3]) -> (f32[3]) {
  %0 = neg(%x) : f32[3]
  %1 = neg(%0) : f32[3]
  return %1
}
"""
    line = sys._getframe().f_lineno + 1
    r = rule("neg-neg", Op("neg", Op("neg", X)), X)
    trace = []
    run_rules(src, r, trace=trace)
    assert len(trace) == 1
    e = trace[0]
    assert (e.rule, e.rule_loc, e.op) == ("neg-neg", Location(__file__, line), "neg")
    assert e.node_loc == Location("in.pir", 3, 8)
    s = str(e)
    assert s.startswith("neg-neg (") and f"test_rewrite.py:{line}) rewrote neg at in.pir:3:8" in s


def test_rewrites_reach_a_fixed_point_in_one_run():
    src = """graph @f(%x: f32[3]) -> (f32[3]) {
  %0 = neg(%x) : f32[3]
  %1 = neg(%0) : f32[3]
  %2 = neg(%1) : f32[3]
  %3 = neg(%2) : f32[3]
  %4 = neg(%3) : f32[3]
  %5 = neg(%4) : f32[3]
  return %5
}
"""
    g = parse(src)
    rules = [rule("neg-neg", Op("neg", Op("neg", X)), X)]
    assert apply_rules(g, rules) == 3
    assert print_graph(g).count("neg") == 0
    assert apply_rules(g, rules) == 0


def test_rules_that_undo_each_other_are_stopped():
    src = """graph @f(%x: f32[3]) -> (f32[3]) {
  %0 = exp(%x) : f32[3]
  return %0
}
"""
    forever = rule("exp-again", Op("exp", X), lambda m: m.emit("exp", m["x"]))
    with pytest.raises(PassError, match=r"did not reach a fixed point.*exp-again"):
        run_rules(src, forever)


def test_splat_value_reads_full_and_splat_constants():
    g = parse("""graph @f() -> (f32[2], f32[2], i32[2], f32[2]) {
  %0 = full() {shape=[2], value=1e-50} : f32[2]
  %1 = constant() {value=dense<f32[2], [2.5, 2.5]>} : f32[2]
  %2 = full() {shape=[2], value=7, dtype=i32} : i32[2]
  %3 = constant() {value=dense<f32[2], [1.0, 2.0]>} : f32[2]
  return %0, %1, %2, %3
}
""")
    # 1e-50 rounds to 0 in f32: the tensor holds zeros.
    assert [splat_value(v) for v in g.outputs] == [0.0, 2.5, 7, None]
