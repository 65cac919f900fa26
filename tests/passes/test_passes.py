"""Unit tests of the passes beyond the golden files: effects, op-record facts, limits."""

from __future__ import annotations

import io
import itertools

import numpy as np
import pytest

import partita
from partita.ir import TensorType, parse, print_graph, verify
from partita.ir.dtypes import ALL_DTYPES
from partita.ops.registry import OPS, OpDef, register
from partita.passes import PassManager
from partita.passes.canonicalize import Canonicalize, _lossless, _same_cast_rule
from partita.passes.cse import _attr_key


def _same(ts, attrs):
    return ts[0]


@pytest.fixture
def test_ops():
    """Registers a few ops for one test and removes them afterwards."""
    def fragile(args, attrs):
        raise ValueError("the reference refuses")

    defs = [
        OpDef(name="test_io", operands=("x",), infer=lambda ts, a: ts[0], reference=lambda args, a: args[0],
              torch=lambda args, a: args[0], effects=frozenset({"io"}), idempotent=True, elementwise=True),
        OpDef(name="test_flip", operands=("x",), infer=lambda ts, a: ts[0], reference=lambda args, a: -args[0],
              torch=lambda args, a: -args[0], involution=True, elementwise=True),
        OpDef(name="test_fragile", operands=("x",), infer=lambda ts, a: ts[0], reference=fragile,
              torch=lambda args, a: args[0]),
    ]
    for d in defs:
        register(d)
    yield
    for d in defs:
        OPS.pop(d.name, None)


def run(pipeline: str, src: str) -> str:
    return print_graph(PassManager.parse(pipeline).run(parse(src, "t.pir")))


def ops_of(text: str) -> list[str]:
    return [ln.split(" = ")[1].split("(")[0] for ln in text.splitlines() if " = " in ln]


EFFECTS_SRC = """graph @f(%x: f32[3]) -> (f32[3]) {
  %c = full() {shape=[3], value=2.0} : f32[3]
  %0 = test_io(%c) : f32[3]
  %1 = test_io(%c) : f32[3]
  %2 = test_io(%0) : f32[3]
  %3 = exp(%x) : f32[3]
  return %3
}
"""


def test_dce_keeps_effectful_nodes_and_what_they_read(test_ops):
    out = run("dce", EFFECTS_SRC)
    assert ops_of(out) == ["full", "test_io", "test_io", "test_io", "exp"]


def test_cse_does_not_merge_effectful_nodes(test_ops):
    assert ops_of(run("cse", EFFECTS_SRC)).count("test_io") == 3


def test_fold_does_not_evaluate_effectful_nodes(test_ops):
    assert ops_of(run("fold-constants", EFFECTS_SRC)).count("test_io") == 3


def test_canonicalize_does_not_rewrite_effectful_roots(test_ops):
    # test_io says it is idempotent, but applying it twice performs the effect twice.
    assert ops_of(run("canonicalize", EFFECTS_SRC)).count("test_io") == 3


def test_canonicalize_rules_come_from_op_record_facts(test_ops):
    src = """graph @f(%x: f32[3]) -> (f32[3], f32[3]) {
  %0 = test_flip(%x) : f32[3]
  %1 = test_flip(%0) : f32[3]
  %2 = test_flip(%1) : f32[3]
  return %1, %2
}
"""
    names = [r.name for r in Canonicalize().rules()]
    assert "involution[test_flip]" in names and "idempotent[test_io]" in names
    assert ops_of(run("canonicalize", src)) == ["test_flip"]


@pytest.fixture
def without_ops():
    """Unregister some ops for one test; the table (and its order) is restored afterwards."""
    saved = dict(OPS)

    def remove(*names):
        for n in names:
            del OPS[n]

    yield remove
    OPS.clear()
    OPS.update(saved)


def test_canonicalize_skips_rules_for_ops_that_are_not_registered(without_ops):
    without_ops("transpose", "broadcast_to", "full")
    src = """graph @f(%x: f32[3], %c: f32[2,3]) -> (f32[2,3], f32[3]) {
  %0 = mul(%x, %c) : f32[2,3]
  %1 = neg(%x) : f32[3]
  %2 = neg(%1) : f32[3]
  return %0, %2
}
"""
    assert ops_of(run("canonicalize", src)) == ["mul"]


def test_fold_leaves_nodes_whose_reference_fails(test_ops):
    src = """graph @f() -> (f32[2], f32[2]) {
  %c = constant() {value=dense<f32[2], [1.0, 2.0]>} : f32[2]
  %0 = test_fragile(%c) : f32[2]
  %1 = neg(%c) : f32[2]
  return %0, %1
}
"""
    assert ops_of(run("fold-constants", src)) == ["constant", "test_fragile", "constant"]


def test_fold_caps_operands_and_results_but_not_splats():
    src = """graph @f() -> (f32[], f32[10], f32[10]) {
  %c = iota() {shape=[10], dtype=f32} : f32[10]
  %0 = sum(%c) : f32[]
  %1 = neg(%c) : f32[10]
  %s = full() {shape=[10], value=3.0} : f32[10]
  %2 = exp(%s) : f32[10]
  return %0, %1, %2
}
"""
    assert ops_of(run("fold-constants{max-elements=9}", src)) == ["iota", "sum", "neg", "full"]
    assert ops_of(run("fold-constants{max-elements=10}", src)) == ["constant", "constant", "full"]


def test_canonicalize_trace_goes_to_the_manager_output():
    out = io.StringIO()
    src = """graph @f(%x: f32[3]) -> (f32[3]) {
  %0 = neg(%x) : f32[3]
  %1 = neg(%0) : f32[3]
  return %1
}
"""
    pm = PassManager.parse("canonicalize{trace=true}", out=out)
    pm.run(parse(src, "t.pir"))
    line = out.getvalue().strip()
    assert line.startswith("// canonicalize: involution[neg] (partita/passes/canonicalize.py:")
    assert line.endswith("rewrote neg at t.pir:3:8")
    assert pm.passes[0].trace[0].rule == "involution[neg]"


def test_cse_attribute_keys_tell_values_apart():
    assert _attr_key(0.0) != _attr_key(-0.0)
    assert len({_attr_key(1), _attr_key(1.0), _attr_key(True)}) == 3
    assert _attr_key(float("nan")) == _attr_key(float("nan"))
    assert _attr_key((1, 2)) == _attr_key((1, 2)) != _attr_key((1.0, 2))


def _extremes(dt) -> np.ndarray:
    """Values of ``dt`` that stress conversions: limits, signs, fractions, non-finite."""
    if dt.is_bool:
        return np.array([False, True])
    if dt.is_int:
        info = np.iinfo(dt.np)
        vals = [info.min, info.min + 1, -1, 0, 1, 2, info.max - 1, info.max, 255, 256, 2 ** 24 + 1, 2 ** 53 + 1]
        return np.array([v for v in vals if info.min <= v <= info.max], dtype=object).astype(dt.np)
    return np.array([0.0, -0.0, 0.1, -2.75, 1e-8, 65504.0, 3.4e38, 1e300, np.inf, -np.inf, np.nan],
                    dtype=np.float64).astype(dt.np)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_lossless_casts_really_round_trip():
    """_lossless(src, mid) and _same_cast_rule(src, mid, dst), the conditions of cast-cast, must
    mean: cast(cast(x, mid), dst) == cast(x, dst), NaN, infinities and values out of range
    included (float -> int saturates, int -> int wraps: docs/ir.md)."""
    cast = OPS["cast"].reference
    # Storage types (f8, i4, ...) are covered by _lossless's own rule: into f32/f64 only.
    dtypes = [d for d in ALL_DTYPES if not d.storage]
    for src, mid in itertools.product(dtypes, dtypes):
        if not _lossless(src, mid):
            continue
        x = _extremes(src)
        via = cast([x], OPS["cast"].normalize_attrs({"dtype": mid}))
        for dst in dtypes:
            if not _same_cast_rule(src, mid, dst):
                continue
            a = np.asarray(cast([np.asarray(via).astype(mid.np)], OPS["cast"].normalize_attrs({"dtype": dst}))).astype(dst.np)
            b = np.asarray(cast([x], OPS["cast"].normalize_attrs({"dtype": dst}))).astype(dst.np)
            same = np.array_equal(a, b, equal_nan=dst.is_float)
            assert same, f"cast {src} -> {mid} -> {dst} differs from {src} -> {dst}: {a} vs {b}"


def test_cast_cast_keeps_an_integer_through_a_float_that_the_target_cannot_hold():
    """i16 -> f32 -> i8 saturates (float -> int) where i16 -> i8 wraps: not one cast."""
    src = """graph @f(%x: i16[3]) -> (i8[3], i32[3]) {
  %0 = cast(%x) {dtype=f32} : f32[3]
  %1 = cast(%0) {dtype=i8} : i8[3]
  %2 = cast(%0) {dtype=i32} : i32[3]
  return %1, %2
}
"""
    g = parse(src)
    x = np.array([300, -300, 5], np.int16)
    want = [o.tolist() for o in partita.run(g, [x])]
    assert want == [[127, -128, 5], [300, -300, 5]]
    out = parse(run("canonicalize,dce", src))
    assert [n.op for n in out.nodes].count("cast") == 3  # i16 -> i32 through f32 became one cast
    assert [o.tolist() for o in partita.run(out, [x])] == want


def test_lossless_table_refuses_lossy_conversions():
    d = {t.name: t for t in ALL_DTYPES}
    for src, mid in [("f32", "f16"), ("f32", "bf16"), ("f16", "bf16"), ("bf16", "f16"), ("f32", "i32"),
                     ("i64", "f32"), ("i32", "f32"), ("i64", "f64"), ("u8", "i8"), ("i8", "u8"), ("i16", "f16"),
                     ("i32", "bool"), ("f32", "bool"), ("i64", "i32")]:
        assert not _lossless(d[src], d[mid]), f"{src} -> {mid} is lossy"
    for src, mid in [("i32", "i64"), ("u8", "i16"), ("i32", "f64"), ("i8", "bf16"), ("u8", "f16"),
                     ("f16", "f32"), ("bf16", "f64"), ("bool", "u8"), ("f32", "f64")]:
        assert _lossless(d[src], d[mid]), f"{src} -> {mid} is lossless"


def test_passes_keep_names_and_locations_of_surviving_nodes():
    src = """graph @f(%x: f32[3]) -> (f32[3]) {
  %a = exp(%x) : f32[3] loc("model.py":12)
  %b = exp(%x) : f32[3] loc("model.py":13)
  %c = add(%a, %b) : f32[3] loc("model.py":14:5)
  return %c
}
"""
    out = run("cse,dce", src)
    assert out.splitlines()[1:3] == ['  %a = exp(%x) : f32[3] loc("model.py":12)',
                                     '  %c = add(%a, %a) : f32[3] loc("model.py":14:5)']
    verify(parse(out))


def test_rewritten_nodes_keep_the_source_location_of_the_root():
    src = """graph @f(%m: f32[2,3], %n: f32[3,2]) -> (f32[3,3]) {
  %0 = transpose(%m) : f32[3,2] loc("model.py":3)
  %1 = transpose(%n) : f32[2,3] loc("model.py":4)
  %2 = matmul(%0, %1) : f32[3,3] loc("model.py":5)
  return %2
}
"""
    out = run("canonicalize", src)
    assert ops_of(out) == ["matmul", "transpose"]
    assert all('loc("model.py":5)' in ln for ln in out.splitlines() if " = " in ln)
    assert TensorType((3, 3), parse(out).outputs[0].type.dtype) == parse(out).outputs[0].type


@pytest.mark.parametrize("perm2,out_shape,cancels", [([0, 2, 1], [2, 9, 8], True), ([2, 0, 1], [9, 2, 8], False),
                                                      ([0, 1, 2], [2, 8, 9], False)])
def test_transposes_that_cancel_across_a_reshape_become_one_reshape(perm2, out_shape, cancels):
    """[B, H, W, C] -> [B, C, H, W] -> [B, C, H*W] -> [B, H*W, C] is reshape(x); other second
    permutations are not, and stay."""
    from strategies import run_reference

    ty = ",".join(map(str, out_shape))
    text = f"""graph @f(%x: f32[2,3,3,8]) -> (f32[{ty}]) {{
  %0 = transpose(%x) {{perm=[0, 3, 1, 2]}} : f32[2,8,3,3]
  %1 = reshape(%0) {{shape=[2, 8, 9]}} : f32[2,8,9]
  %2 = transpose(%1) {{perm={perm2}}} : f32[{ty}]
  return %2
}}
"""
    x = {"x": np.random.default_rng(0).standard_normal((2, 3, 3, 8)).astype(np.float32)}
    out = PassManager.parse("canonicalize,dce").run(parse(text, "t.pir"))
    assert (ops_of(print_graph(out)) == ["reshape"]) == cancels
    np.testing.assert_array_equal(run_reference(parse(text, "t.pir"), x)[0], run_reference(out, x)[0])
