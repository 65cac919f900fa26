"""Shape, movement and creation ops against torch eager on both executors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import partita
from optest import check_op, expect_error, infer, rand
from partita.ir import Builder, DenseAttr, Graph, TensorType, f32, print_graph
from partita.ir import dtypes as D
from partita.ir.diagnostics import AttributeError_, ExecutionError, TypeRuleError
from partita.ops import OPS

DTYPES = ["f32", "f64", "i64", "i32", "bool", "f16", "bf16"]


# --- reshape -----------------------------------------------------------------------------

@pytest.mark.parametrize("src,dst", [((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((2, 3, 4), (4, -1, 2)),
                                     ((), (1, 1)), ((1,), ()), ((0, 3), (3, 0)), ((0, 3), (-1, 3)),
                                     ((6,), (2, 3))], ids=str)
def test_reshape(src, dst):
    check_op("reshape", [rand(src)], {"shape": list(dst)}, lambda t: t.reshape(dst))


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_dtypes(dtype):
    check_op("reshape", [rand((2, 6), dtype)], {"shape": [3, -1]}, lambda t: t.reshape(3, -1))


def test_reshape_keeps_minus_one_in_the_ir():
    g = Graph("r")
    b = Builder(g)
    y = b.reshape(b.input("x", TensorType((2, 6), f32)), shape=[-1, 3])
    b.ret(y)
    assert y.type.shape == (4, 3)
    assert "shape=[-1, 3]" in print_graph(g)


# --- transpose ---------------------------------------------------------------------------

@pytest.mark.parametrize("shape,perm", [((2, 3, 4), None), ((2, 3, 4), [1, 0, 2]), ((2, 3, 4), [-1, 0, 1]),
                                        ((5,), None), ((), None), ((), []), ((0, 2), [1, 0])], ids=str)
def test_transpose(shape, perm):
    p = tuple(range(len(shape) - 1, -1, -1)) if perm is None else tuple(perm)
    attrs = {} if perm is None else {"perm": perm}
    check_op("transpose", [rand(shape, "i64")], attrs, lambda t: t.permute(p))


@pytest.mark.parametrize("dtype", ["f16", "bf16", "bool"])
def test_transpose_dtypes(dtype):
    check_op("transpose", [rand((3, 2), dtype)], {}, lambda t: t.T)


# --- broadcast_to ------------------------------------------------------------------------

@pytest.mark.parametrize("src,dst", [((3, 1), (2, 3, 4)), ((), (2, 2)), ((4,), (4,)), ((1, 3), (0, 3)),
                                     ((3, 1), (2, -1, 5))], ids=str)
@pytest.mark.parametrize("dtype", ["f32", "bool", "bf16"])
def test_broadcast_to(src, dst, dtype):
    check_op("broadcast_to", [rand(src, dtype)], {"shape": list(dst)}, lambda t: torch.broadcast_to(t, dst))


# --- slice -------------------------------------------------------------------------------

@pytest.mark.parametrize("axis,start,end,step", [
    (0, 1, 3, 1), (1, 0, None, 2), (-1, -3, -1, 1), (1, -100, 100, 3), (0, 5, 2, 1), (1, 2, 2, 1),
    (0, -1, None, 1), (1, 6, None, 1),
], ids=str)
def test_slice(axis, start, end, step):
    x = rand((4, 6), "f32")
    attrs = {"axis": axis, "start": start, "step": step}
    if end is not None:
        attrs["end"] = end
    index = [slice(None)] * 2
    index[axis] = slice(start, end, step)
    check_op("slice", [x], attrs, lambda t: t[tuple(index)])


@pytest.mark.parametrize("dtype", ["i64", "bool", "f16"])
def test_slice_dtypes(dtype):
    check_op("slice", [rand((3, 5), dtype)], {"axis": 1, "start": 1, "end": 4}, lambda t: t[:, 1:4])


# --- concat and split --------------------------------------------------------------------

@pytest.mark.parametrize("shapes,axis", [([(2, 3), (4, 3)], 0), ([(2, 3), (2, 1), (2, 0)], -1),
                                         ([(5,)], 0), ([(0, 2), (0, 2)], 1)], ids=str)
def test_concat(shapes, axis):
    xs = [rand(s, "f32") for s in shapes]
    check_op("concat", xs, {"axis": axis}, lambda *ts: torch.cat(ts, dim=axis))


@pytest.mark.parametrize("dtypes", [("f32", "f64"), ("i32", "bool"), ("bf16", "f16"), ("i64", "i64")], ids=str)
def test_concat_promotes_like_torch(dtypes):
    xs = [rand((2, 2), dt) for dt in dtypes]
    check_op("concat", xs, {"axis": 1}, lambda *ts: torch.cat(ts, dim=1))


@pytest.mark.parametrize("shape,axis,sizes", [((6, 2), 0, [2, 4]), ((2, 5), -1, [1, 0, 4]), ((3,), 0, [3]),
                                              ((0, 3), 1, [1, 2])], ids=str)
@pytest.mark.parametrize("dtype", ["f32", "i64", "bf16"])
def test_split(shape, axis, sizes, dtype):
    check_op("split", [rand(shape, dtype)], {"axis": axis, "sizes": sizes},
             lambda t: torch.split(t, sizes, dim=axis))


# --- squeeze and unsqueeze ---------------------------------------------------------------

@pytest.mark.parametrize("shape,axes", [((1, 3, 1), None), ((1, 3, 1), [0]), ((1, 3, 1), [-1, 0]), ((3,), None),
                                        ((), None), ((1, 1), [])], ids=str)
def test_squeeze(shape, axes):
    attrs = {} if axes is None else {"axes": axes}
    if axes is None:
        fn = torch.squeeze
    else:
        def fn(t):
            return torch.squeeze(t, dim=tuple(axes)) if axes else t.clone()
    check_op("squeeze", [rand(shape, "f64")], attrs, fn)


@pytest.mark.parametrize("shape,axes,out", [((3,), [0], (1, 3)), ((3,), [-1], (3, 1)), ((2, 3), [0, 3], (1, 2, 3, 1)),
                                            ((), [0], (1,)), ((2,), [1, 0], (1, 1, 2))], ids=str)
@pytest.mark.parametrize("dtype", ["f32", "bool"])
def test_unsqueeze(shape, axes, out, dtype):
    check_op("unsqueeze", [rand(shape, dtype)], {"axes": axes}, lambda t: t.reshape(out))
    assert infer("unsqueeze", [(dtype, shape)], {"axes": axes})[0].shape == out


def test_unsqueeze_matches_numpy_expand_dims():
    x = rand((2, 3))
    for axes in ([0], [2], [-1], [0, -1], [1, 2]):
        check_op("unsqueeze", [x], {"axes": axes}, lambda t: torch.from_numpy(np.expand_dims(t.numpy(), tuple(axes))))


# --- pad ---------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,pads,value", [((2, 3), [1, 0, 2, 1], 0), ((3,), [0, 2], 1.5), ((), [], 0),
                                              ((0, 2), [1, 1, 0, 0], -1), ((2, 2), [0, 0, 0, 0], 0)], ids=str)
def test_pad(shape, pads, value):
    torch_pads = [p for i in reversed(range(len(shape))) for p in (pads[2 * i], pads[2 * i + 1])]
    check_op("pad", [rand(shape)], {"pads": pads, "value": value},
             lambda t: F.pad(t, torch_pads, value=value))


@pytest.mark.parametrize("dtype,value", [("i64", 7), ("bool", True), ("bf16", -2.5), ("f16", float("inf"))], ids=str)
def test_pad_dtypes(dtype, value):
    x = rand((2, 3), dtype)

    def ref(t):
        out = torch.full((3, 6), value, dtype=t.dtype)
        out[1:, 1:4] = t
        return out
    check_op("pad", [x], {"pads": [1, 0, 1, 2], "value": value}, ref)


# --- gather and index_select -------------------------------------------------------------

@pytest.mark.parametrize("xshape,ishape,axis", [((3, 4), (3, 2), 1), ((3, 4), (5, 4), 0), ((3, 4), (2, 2), -1),
                                                ((2, 3, 4), (2, 1, 6), 2), ((3, 4), (0, 4), 0)], ids=str)
@pytest.mark.parametrize("idx_dtype", ["i64", "i32"])
def test_gather(xshape, ishape, axis, idx_dtype):
    x = rand(xshape, "f32")
    idx = rand(ishape, idx_dtype, low=0, high=xshape[axis] - 1)
    check_op("gather", [x, idx], {"axis": axis}, lambda t, i: torch.gather(t, axis, i.to(torch.int64)))


@pytest.mark.parametrize("dtype", ["i64", "bool", "bf16"])
def test_gather_dtypes(dtype):
    x, idx = rand((3, 4), dtype), rand((3, 4), "i64", low=0, high=3)
    check_op("gather", [x, idx], {"axis": 1}, lambda t, i: torch.gather(t, 1, i))


@pytest.mark.parametrize("xshape,n,axis", [((4, 5), 3, 0), ((4, 5), 7, -1), ((4, 5), 0, 1), ((6,), 6, 0)], ids=str)
@pytest.mark.parametrize("idx_dtype", ["i64", "i32"])
def test_index_select(xshape, n, axis, idx_dtype):
    x = rand(xshape, "f64")
    idx = rand((n,), idx_dtype, low=0, high=xshape[axis] - 1)
    check_op("index_select", [x, idx], {"axis": axis}, lambda t, i: torch.index_select(t, axis, i))


@pytest.mark.parametrize("op", ["gather", "index_select"])
@pytest.mark.parametrize("bad", [5, -1])
def test_out_of_range_index_is_a_run_time_error(op, bad):
    x = rand((2, 5))
    idx = np.array([[0, bad]] * 2 if op == "gather" else [0, bad], dtype=np.int64)
    g = Graph("g")
    b = Builder(g)
    b.ret(b.emit(op, b.input("x", TensorType((2, 5), f32)),
                 b.input("i", TensorType(idx.shape, partita.dtypes.i64)), axis=1))
    with pytest.raises(ExecutionError, match=f"{op}: index value {bad} is out of range for axis 1 of size 5"):
        partita.run(g, [x, idx], backend="numpy")
    with pytest.raises(ExecutionError, match=op):
        partita.run(g, [x, idx], backend="torch")


# --- creation ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis", [((5,), 0), ((2, 3), 1), ((2, 3), -2), ((4, 0), 0), ((), 0)], ids=str)
@pytest.mark.parametrize("dtype", ["i64", "i32", "f32", "bf16"])
def test_iota(shape, axis, dtype):
    from partita.ops._lazy import to_torch_dtype
    from partita.ir.dtypes import DTYPES

    tdt = to_torch_dtype(DTYPES[dtype])

    def expected():
        if not shape:
            return torch.zeros((), dtype=tdt)
        a = axis % len(shape)
        view = [1] * len(shape)
        view[a] = shape[a]
        return torch.arange(shape[a]).to(tdt).reshape(view).expand(shape)
    check_op("iota", [], {"shape": list(shape), "axis": axis, "dtype": dtype}, expected)


def test_iota_defaults_to_i64_axis_0():
    out = check_op("iota", [], {"shape": [3, 2]}, lambda: torch.arange(3).reshape(3, 1).expand(3, 2))
    assert out[0].tolist() == [[0, 0], [1, 1], [2, 2]]


@pytest.mark.parametrize("shape,value,dtype", [((2, 3), 1.5, None), ((), -4, "i32"), ((0, 2), 2.0, "f64"),
                                               ((2,), True, "bool"), ((3,), 255, "u8"), ((2,), 0.1, "bf16"),
                                               ((2,), float("nan"), "f16"), ((1,), 3, "i64")], ids=str)
def test_full(shape, value, dtype):
    from partita.ops._lazy import to_torch_dtype
    from partita.ir.dtypes import DTYPES

    attrs = {"shape": list(shape), "value": value}
    if dtype is not None:
        attrs["dtype"] = dtype
    tdt = to_torch_dtype(DTYPES[dtype or "f32"])
    check_op("full", [], attrs, lambda: torch.full(shape, value, dtype=tdt))


@pytest.mark.parametrize("arr", [np.arange(6, dtype=np.float32).reshape(2, 3), np.array(2.5),
                                 np.array([True, False]), np.zeros((0, 2), np.int64),
                                 np.array([1.5, -2.0], dtype=rand((1,), "bf16").dtype),
                                 np.array([[1, 2], [3, 4]], dtype=np.int32)], ids=lambda a: str(a.dtype) + str(a.shape))
def test_constant(arr):
    from partita.backend.torch_exec import to_tensor

    # The text form cannot yet carry an empty dense whose first dim is 0 (see the xfail below).
    roundtrip = not (arr.ndim > 1 and arr.shape[0] == 0)
    out = check_op("constant", [], {"value": DenseAttr(arr)}, lambda: to_tensor(np.array(arr, copy=True)),
                   roundtrip=roundtrip)
    assert out[0].flags.writeable


def test_constant_with_leading_zero_dim_round_trips():
    check_op("constant", [], {"value": DenseAttr(np.zeros((0, 2), np.int64))},
             lambda: torch.zeros((0, 2), dtype=torch.int64))


# --- types, costs, errors ----------------------------------------------------------------

def test_movement_ops_cost_no_flops():
    for name in ("reshape", "transpose", "broadcast_to", "slice", "concat", "split", "squeeze", "unsqueeze",
                 "pad", "gather", "index_select", "iota", "full", "constant"):
        assert OPS[name].cost.__name__ == "movement_cost", name
    t = TensorType((4, 8), f32)
    c = OPS["transpose"].cost_of([t], [TensorType((8, 4), f32)], {"perm": None})
    assert (c.flops, c.bytes_read, c.bytes_written) == (0, 128, 128)


def test_result_types():
    assert infer("reshape", [("bf16", (4, 6))], {"shape": [2, -1, 3]})[0].shape == (2, 4, 3)
    assert infer("concat", [("i32", (2,)), ("f16", (3,))], {"axis": 0})[0].dtype.name == "f16"
    assert [t.shape for t in infer("split", [("f32", (5, 2))], {"axis": 0, "sizes": [2, 3]})] == [(2, 2), (3, 2)]
    assert infer("squeeze", [("f32", (1, 2, 1))])[0].shape == (2,)
    assert infer("slice", [("f32", (10,))], {"axis": 0, "start": -4, "step": 3})[0].shape == (2,)
    assert infer("pad", [("f32", (2, 3))], {"pads": [1, 2, 0, 3]})[0].shape == (5, 6)
    assert infer("constant", [], {"value": DenseAttr(np.zeros((2, 1), np.int32))})[0] == \
        TensorType((2, 1), partita.dtypes.i32)


def test_errors_name_the_problem():
    T = TypeRuleError
    expect_error("reshape", [("f32", (2, 3))], {"shape": [4, 2]}, "f32[2,3]", "6 elements", "[4,2]", "8", error=T)
    expect_error("reshape", [("f32", (2, 3))], {"shape": [-1, -1]}, "at most one", error=T)
    expect_error("reshape", [("f32", (2, 3))], {"shape": [4, -1]}, "not a multiple of 4", error=T)
    expect_error("reshape", [("f32", (0, 3))], {"shape": [0, -1]}, "cannot infer the -1", error=T)
    expect_error("reshape", [("f32", (2, 3))], {"shape": [-2, -3]}, "negative size -2", error=T)
    expect_error("transpose", [("f32", (2, 3))], {"perm": [0, 0]}, "not a permutation of 0..1", error=T)
    expect_error("transpose", [("f32", (2, 3))], {"perm": [0]}, "'perm'", "rank 2", error=T)
    expect_error("transpose", [("f32", (2, 3))], {"perm": [0, 2]}, "perm entry 2", "out of range", error=T)
    expect_error("broadcast_to", [("f32", (3, 2))], {"shape": [3, 4]}, "f32[3,2]", "[3,4]", "size 2, target 4",
                 error=T)
    expect_error("broadcast_to", [("f32", (3, 2))], {"shape": [2]}, "lower rank", error=T)
    expect_error("broadcast_to", [("f32", (3,))], {"shape": [-1, 3]}, "-1 at dim 0", error=T)
    expect_error("slice", [("f32", (3,))], {"axis": 0, "step": 0}, "'step' is 0", ">= 1", error=T)
    expect_error("slice", [("f32", (3,))], {"axis": 1}, "axis 1", "rank 1", error=T)
    expect_error("slice", [("f32", (3,))], {"start": 1}, "missing required attribute 'axis'", error=AttributeError_)
    expect_error("concat", [("f32", (2, 3)), ("f32", (2, 4))], {"axis": 0}, "operand 1 is f32[2,4]",
                 "operand 0 is f32[2,3]", "axis 0", error=T)
    expect_error("concat", [("f32", (2,)), ("f32", (2, 1))], {"axis": 0}, "same rank", error=T)
    expect_error("concat", [("f32", ()), ("f32", ())], {"axis": 0}, "rank 0", error=T)
    expect_error("concat", [], {"axis": 0}, "at least 1 operand", error=T)
    expect_error("split", [("f32", (5, 2))], {"axis": 0, "sizes": [2, 2]}, "sum to 4", "size 5", error=T)
    expect_error("split", [("f32", (5, 2))], {"axis": 0, "sizes": []}, "'sizes' is empty", error=T)
    expect_error("split", [("f32", (5, 2))], {"axis": 0, "sizes": [6, -1]}, "negative", error=T)
    expect_error("squeeze", [("f32", (1, 3))], {"axes": [1]}, "axis 1 of f32[1,3] has size 3, not 1", error=T)
    expect_error("unsqueeze", [("f32", (2,))], {"axes": [2]}, "axis 2", "rank 2", error=T)
    expect_error("unsqueeze", [("f32", (2,))], {"axes": [0, -3]}, "repeat", error=T)
    expect_error("pad", [("f32", (2, 3))], {"pads": [1, 1]}, "2 entries", "needs 4", error=T)
    expect_error("pad", [("f32", (2,))], {"pads": [-1, 0]}, "negative", "slice", error=T)
    expect_error("pad", [("i32", (2,))], {"pads": [1, 0], "value": 0.5}, "'value' 0.5", "i32", error=T)
    expect_error("gather", [("f32", (3, 4)), ("i64", (3,))], {"axis": 0}, "same rank", error=T)
    expect_error("gather", [("f32", (3, 4)), ("f32", (3, 4))], {"axis": 0}, "i64 or i32", error=T)
    expect_error("gather", [("f32", (3, 4)), ("i64", (3, 5))], {"axis": 0}, "dim 1", "5 > 4", error=T)
    expect_error("index_select", [("f32", (3, 4)), ("i64", (2, 2))], {"axis": 0}, "must be 1-D", error=T)
    expect_error("index_select", [("f32", ()), ("i64", (1,))], {"axis": 0}, "rank 0", error=T)
    expect_error("iota", [], {"shape": [3], "axis": 1}, "axis 1", error=T)
    expect_error("iota", [], {"shape": [3], "dtype": "bool"}, "bool", error=T)
    expect_error("full", [], {"shape": [2], "value": 300, "dtype": "u8"}, "out of range for u8", "0..255", error=T)
    expect_error("full", [], {"shape": [2], "value": 2, "dtype": "bool"}, "not a bool", error=T)
    expect_error("full", [], {"shape": [-2], "value": 0}, "negative size", error=T)
    expect_error("full", [], {"shape": [2]}, "missing required attribute 'value'", error=AttributeError_)
    expect_error("constant", [], {"value": [1, 2]}, "'value'", "dense", error=AttributeError_)
    expect_error("iota", [("f32", (2,))], {"shape": [2]}, "0 operand", error=T)


# --- fill values that the dtype cannot hold ---------------------------------------------------

def _full_graph(dt: str, value: str, op: str = "full") -> str:
    if op == "pad":
        return (f"graph @g(%x: {dt}[2]) -> ({dt}[4]) {{\n  %0 = pad(%x) {{pads=[1, 1], value={value}}} : {dt}[4]\n"
                "  return %0\n}\n")
    return f"graph @g() -> ({dt}[2]) {{\n  %0 = full() {{shape=[2], value={value}, dtype={dt}}} : {dt}[2]\n  return %0\n}}\n"


@pytest.mark.parametrize("dt,value,says", [
    ("f32", "1e40", "'value' 1e+40 is out of range for f32 (finite values -3.4028235e+38..3.4028235e+38)"),
    ("f16", "70000.0", "'value' 70000.0 is out of range for f16 (finite values -65504.0..65504.0)"),
    ("f16", "-65520.0", "'value' -65520.0 is out of range for f16"),
    ("bf16", "1e39", "'value' 1e+39 is out of range for bf16"),
    ("f32", "1" + "0" * 40, "is out of range for f32"),  # an integer literal beyond f32
    ("f8e4m3fn", "500.0", "'value' 500.0 is out of range for f8e4m3fn (finite values -448.0..448.0)"),
    ("f8e4m3fn", "464.0", "'value' 464.0 is out of range for f8e4m3fn"),  # the tie rounds beyond 448
    ("f4e2m1", "7.0", "'value' 7.0 is out of range for f4e2m1 (finite values -6.0..6.0)"),
    ("f8e4m3fn", "inf", "'value' is inf, but f8e4m3fn has no infinities"),
    ("f4e2m1", "nan", "'value' is nan, but f4e2m1 has no NaN"),
    ("f8e8m0", "-1.0", "'value' -1.0 is out of range for f8e8m0"),
    ("u8", "300", "'value' 300 is out of range for u8 (0..255)"),
    ("i8", "-129", "'value' -129 is out of range for i8 (-128..127)"),
    ("i64", "9223372036854775808", "is out of range for i64 (-9223372036854775808..9223372036854775807)"),
    ("i32", "1.5", "'value' 1.5 is not an integer, so i32 cannot hold it"),
    ("i32", "nan", "'value' nan is not an integer"),
    ("i4", "8", "'value' 8 is out of range for i4 (-8..7)"),
    ("u2", "4", "'value' 4 is out of range for u2 (0..3)"),
    ("bool", "2", "'value' 2 is not a bool"),
])
@pytest.mark.parametrize("op", ["full", "pad"])
def test_a_fill_value_the_dtype_cannot_hold_is_a_located_error(dt, value, says, op):
    from partita.ir import parse, verify
    from partita.ir.diagnostics import PartitaError, VerifyError

    g = parse(_full_graph(dt, value, op), "fill.pir")
    with pytest.raises(VerifyError) as e:
        verify(g)
    msg = str(e.value)
    assert isinstance(e.value, PartitaError)
    assert msg.startswith(f"fill.pir:2:8: error: node %0 = {op} is invalid: {op}: ") and says in msg, msg


@pytest.mark.parametrize("dt,value", [("f32", "inf"), ("f32", "-inf"), ("f32", "nan"), ("f16", "65504.0"),
                                      ("f16", "65519.0"), ("f32", "3.4028235e+38"), ("bf16", "-3.3895314e+38"),
                                      ("f16", "0.1"), ("bf16", "0.1"), ("f8e4m3fn", "463.0"), ("f4e2m1", "6.5"),
                                      ("f16", "-65504.0"), ("f32", "3.4028234663852886e+38"), ("f64", "1e308"),
                                      ("f8e5m2", "inf"), ("f8e4m3fn", "-448.0"), ("f4e2m1", "6.0"),
                                      ("i4", "-8"), ("u64", "18446744073709551615"), ("i32", "3.0"),
                                      ("bool", "true")])
def test_a_fill_value_the_dtype_holds_runs_alike_on_both_executors(dt, value):
    from partita.backend.torch_exec import to_numpy
    from partita.ir import parse, verify

    g = parse(_full_graph(dt, value), "fill.pir")
    verify(g)
    a = partita.run(g, [])[0]
    b = to_numpy(partita.run(g, [], backend="torch")[0])
    d = D.DTYPES[dt]
    # The value rounded to the dtype, as a dense literal of it reads (the rule full follows).
    literal = str(int(float(value)) if "." in value else int(value)) if d.is_int else value
    want = parse(f"graph @g() -> ({dt}[2]) {{\n  %0 = constant() {{value=dense<{dt}[2], {literal}>}} : {dt}[2]\n"
                 "  return %0\n}\n")
    want = next(iter(want.nodes)).attrs["value"].array
    assert a.dtype == d.np and a.tobytes() == np.asarray(b).astype(a.dtype).tobytes() == want.tobytes()


def test_iota_counts_beyond_the_dtype_are_a_located_error():
    from partita.ir import parse, verify
    from partita.ir.diagnostics import VerifyError

    for dt, n, says in [("u8", 300, "iota: the counts 0..299 along axis 0 do not fit u8 (0..255)"),
                        ("i4", 9, "the counts 0..8 along axis 0 do not fit i4 (-8..7)"),
                        ("f16", 70000, "the counts 0..69999 along axis 0 do not fit f16")]:
        g = parse(f"graph @g() -> ({dt}[{n}]) {{\n  %0 = iota() {{shape=[{n}], dtype={dt}}} : {dt}[{n}]\n"
                  "  return %0\n}\n", "iota.pir")
        with pytest.raises(VerifyError, match=r"iota\.pir:2:8: error: node %0 = iota is invalid: ") as e:
            verify(g)
        assert says in str(e.value)
    g = parse("graph @g() -> (u8[256]) {\n  %0 = iota() {shape=[256], dtype=u8} : u8[256]\n  return %0\n}\n")
    verify(g)
    assert partita.run(g, [])[0].tolist() == list(range(256))


def test_builder_refuses_a_fill_value_out_of_range():
    from partita.ir import f16

    b = Builder(Graph("g"))
    with pytest.raises(TypeRuleError, match=r"full: 'value' 70000.0 is out of range for f16"):
        b.full(shape=(2,), value=70000.0, dtype=f16)


def test_folding_a_cast_to_f8e8m0_gives_a_full_the_verifier_accepts():
    """cast(-0.0) to f8e8m0 is its smallest value, 2**-127; folded into a ``full``, its
    shortest text (5.87747e-39) lies just below 2**-127 yet rounds to it, so it is accepted."""
    from partita.ir import parse, verify

    g = parse("graph @g() -> (f8e8m0[3]) {\n  %0 = constant() {value=dense<f32[3], -0.0>} : f32[3]\n"
              "  %1 = cast(%0) {dtype=f8e8m0} : f8e8m0[3]\n  return %1\n}\n", "f8.pir")
    want = partita.run(g, [])[0]
    folded = partita.optimize(g, passes="fold-constants")
    assert [n.op for n in folded.nodes] == ["full"]
    verify(folded)
    assert partita.run(folded, [])[0].tobytes() == want.tobytes()
    assert float(want.astype(np.float64)[0]) == 2.0 ** -127


def test_torch_executor_names_an_output_numpy_cannot_hold():
    """An empty tensor with a dim past NumPy's size limit: torch makes it, NumPy cannot take
    it back. Both executors fail with a PartitaError, not a bare ValueError."""
    from partita.ir import PartitaError, parse

    n = 2 ** 63 - 1
    g = parse(f"graph @g() -> (f32[{n},0]) {{\n  %0 = full() {{shape=[{n},0], value=1.0, dtype=f32}} : f32[{n},0]\n"
              "  return %0\n}\n", "big.pir")
    for backend, says in (("numpy", "array is too big"), ("torch", "cannot be given back as a NumPy array")):
        with pytest.raises(PartitaError, match=says):
            res = partita.run(g, [], backend=backend)
            from partita.backend.torch_exec import to_numpy
            to_numpy(res[0])
