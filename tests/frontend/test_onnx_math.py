"""ONNX's elementwise math, activation, logic and bitwise op types (partita/frontend/onnx/math.py):
what ONNX's node cases do not cover (attribute defaults, u16/u32 values, errors), checked
against onnxruntime on both executors."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

import partita  # noqa: E402
from partita.frontend.onnx import OnnxImportError, import_onnx  # noqa: E402

F = TensorProto.FLOAT
RNG = np.random.default_rng(11)


def _one_node(op: str, ins: dict[str, np.ndarray], opset: int = 22, **attrs):
    names = list(ins)
    node = helper.make_node(op, names, ["y"], name="n", **attrs)
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for k, a in ins.items()]
    graph = helper.make_graph([node], "m", vis, [helper.make_empty_tensor_value_info("y")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _run_both(model, ins: dict[str, np.ndarray]) -> list[np.ndarray]:
    g = import_onnx(model)
    partita.verify(g)
    args = list(ins.values())
    a = partita.run(g, args, backend="numpy")[0]
    t = partita.run(g, args, backend="torch")[0]
    t = np.asarray(t.detach().numpy()) if hasattr(t, "detach") else np.asarray(t)
    assert a.dtype == t.dtype
    np.testing.assert_allclose(a.astype(np.float64), t.astype(np.float64), rtol=1e-5, atol=1e-6)
    return [a, t]


def _against_ort(op: str, ins: dict[str, np.ndarray], opset: int = 22, rtol: float = 1e-5, **attrs):
    model = _one_node(op, ins, opset, **attrs)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, ins)[0]
    for got in _run_both(model, ins):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-6)


@pytest.mark.parametrize("op, attrs", [("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}),
                                       ("HardSwish", {}), ("Mish", {}), ("Celu", {}), ("Celu", {"alpha": 0.5}),
                                       ("ThresholdedRelu", {}), ("Gelu", {"approximate": "tanh"}),
                                       ("Reciprocal", {}), ("Round", {})], ids=str)
def test_activations_match_onnxruntime(op, attrs):
    x = (RNG.standard_normal((3, 7)) * 4).astype(np.float32)
    x[0, :4] = [0.5, 1.5, -2.5, 30.0]
    if op == "Reciprocal":
        x[x == 0] = 1.0
    _against_ort(op, {"x": x}, opset=20 if op == "Gelu" else 22, **attrs)


@pytest.mark.parametrize("dtype", [np.uint16, np.uint32, np.int16, np.int64])
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_bit_shift_of_wide_unsigned_types(dtype, direction):
    info = np.iinfo(dtype)
    x = np.array([1, 3, info.max, info.max // 2 + 1, 7, 0], dtype)
    s = np.array([0, 1, 1, info.bits - 1, info.bits - 1, 5], dtype)
    want = (np.left_shift(x, s) if direction == "LEFT" else np.right_shift(x, s)).astype(dtype)
    for got in _run_both(_one_node("BitShift", {"x": x, "s": s}, direction=direction), {"x": x, "s": s}):
        assert got.dtype == dtype and got.tolist() == want.tolist()


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_of_integers_matches_onnxruntime(fmod):
    a = np.array([-7, 7, -7, 7, 0, 13, -128], np.int32)
    b = np.array([3, 3, -3, -3, 5, -4, 7], np.int32)
    _against_ort("Mod", {"a": a, "b": b}, opset=13, fmod=fmod)


def test_mod_of_u64_beyond_int64_range():
    a = np.array([2 ** 64 - 1, 2 ** 63 + 5, 10], np.uint64)
    b = np.array([10, 2 ** 63, 2 ** 63 + 1], np.uint64)
    for got in _run_both(_one_node("Mod", {"a": a, "b": b}, opset=13), {"a": a, "b": b}):
        assert got.tolist() == [(2 ** 64 - 1) % 10, 5, 10]


def test_isinf_with_neither_sign_detects_nothing():
    x = np.array([np.inf, -np.inf, 1.0, np.nan], np.float32)
    for got in _run_both(_one_node("IsInf", {"x": x}, detect_positive=0, detect_negative=0), {"x": x}):
        assert got.dtype == np.bool_ and not got.any()


def test_mean_broadcasts_its_inputs():
    ins = {"a": RNG.standard_normal((2, 3)).astype(np.float32), "b": RNG.standard_normal((3,)).astype(np.float32),
           "c": RNG.standard_normal((2, 1)).astype(np.float32)}
    _against_ort("Mean", ins, opset=13)


def test_castlike_keeps_the_target_dtype():
    x = np.array([-2.7, 0.5, 300.0], np.float32)
    t = np.zeros((1,), np.int32)
    _against_ort("CastLike", {"x": x, "t": t}, opset=21)


@pytest.mark.parametrize("op, ins, attrs, words", [
    ("BitShift", {"x": np.zeros(2, np.int32), "s": np.zeros(2, np.int32)}, {"direction": "UP"},
     ["'direction'", "'UP'", "'LEFT' or 'RIGHT'"]),
    ("Mod", {"a": np.zeros(2, np.int32), "b": np.ones(2, np.int32)}, {"fmod": 2}, ["'fmod' is 2", "0", "1"]),
    ("Gelu", {"x": np.zeros(2, np.float32)}, {"approximate": "fast"}, ["'approximate'", "'fast'", "'tanh'"]),
    ("Celu", {"x": np.zeros(2, np.float32)}, {"alpha": 0.0}, ["'alpha' is 0", "divides"]),
    ("And", {"a": np.zeros(2, np.int32), "b": np.zeros(2, np.int32)}, {}, ["input 0 is i32[2]", "takes bool"]),
    ("BitwiseAnd", {"a": np.zeros(2, np.float32), "b": np.zeros(2, np.float32)}, {},
     ["input 0 is f32[2]", "takes integer"]),
    ("SwiGLU", {"a": np.zeros((2, 3), np.float32), "b": np.zeros((1, 3), np.float32)}, {},
     ["A f32[2,3]", "B f32[1,3]", "does not broadcast"]),
], ids=lambda v: v if isinstance(v, str) else "")
def test_errors_name_the_attribute_and_the_fix(op, ins, attrs, words):
    opset = helper.VERSION_TABLE[-1][2] if op == "SwiGLU" else 22
    with pytest.raises(OnnxImportError) as e:
        import_onnx(_one_node(op, ins, opset, **attrs))
    msg = str(e.value)
    assert "node 'n'" in msg and op in msg
    for w in words:
        assert w in msg, (w, msg)
