"""ONNX's indexing, reduction and layout operators (partita/frontend/onnx/index.py): what the
node cases leave out: attribute defaults, negative indices, runtime operands that are fine
(ReverseSequence's lengths, OneHot's values) and the errors for what partita cannot express."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.frontend.onnx import OnnxImportError, import_onnx

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
          np.dtype(np.int32): TensorProto.INT32}


def _model(op: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None,
           n_out: int = 1, opset: int = 18, order: list[str] | None = None, **attrs):
    consts = consts or {}
    names = order or list(inputs) + list(consts)
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(k, _TYPES[v.dtype], v.shape) for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)],
        [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check_against_ort(op: str, inputs: dict[str, np.ndarray], consts=None, n_out: int = 1, opset: int = 18,
                       order: list[str] | None = None, **attrs) -> list[np.ndarray]:
    m = _model(op, inputs, consts, n_out, opset, order, **attrs)
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, inputs)
    g = import_onnx(m)
    for backend in ("numpy", "torch"):
        got = partita.run(g, list(inputs.values()), backend=backend)
        for a, b in zip(got, want):
            a = np.asarray(a if backend == "numpy" else a.numpy())
            assert a.dtype == b.dtype
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    return want


def _error(op: str, inputs: dict[str, np.ndarray], consts=None, n_out: int = 1, opset: int = 18,
           order: list[str] | None = None, **attrs) -> str:
    with pytest.raises(OnnxImportError) as info:
        import_onnx(_model(op, inputs, consts, n_out, opset, order, **attrs))
    return str(info.value)


rng = np.random.default_rng(0)


def test_gather_elements_and_scatter_elements_take_negative_indices():
    x = rng.standard_normal((3, 4)).astype(np.float32)
    idx = np.array([[-1, 0, -3, 2], [1, -2, 2, 0]], np.int64)
    _check_against_ort("GatherElements", {"x": x, "i": idx})
    upd = rng.standard_normal((2, 4)).astype(np.float32)
    for red in ("add", "mul", "max", "min"):
        _check_against_ort("ScatterElements", {"x": x, "i": idx, "u": upd}, axis=0, reduction=red)


def test_gather_nd_with_batch_dims_and_negative_indices():
    x = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    idx = np.array([[[0, -1], [2, 1]], [[-3, 0], [1, 3]]], np.int64)
    _check_against_ort("GatherND", {"x": x, "i": idx}, batch_dims=1)
    _check_against_ort("GatherND", {"x": x, "i": np.array([[1], [-2], [0]], np.int64)})


def test_scatter_nd_reductions_with_repeated_indices():
    x = rng.standard_normal((4, 3)).astype(np.float32)
    idx = np.array([[1], [-1], [1]], np.int64)
    upd = rng.standard_normal((3, 3)).astype(np.float32)
    for red in ("add", "mul", "max", "min"):
        _check_against_ort("ScatterND", {"x": x, "i": idx, "u": upd}, reduction=red)


def test_reverse_sequence_lengths_may_be_computed_at_run_time():
    x = rng.standard_normal((4, 3, 2)).astype(np.float32)
    _check_against_ort("ReverseSequence", {"x": x, "lens": np.array([4, 1, 3], np.int64)})
    xb = rng.standard_normal((3, 4)).astype(np.float32)
    _check_against_ort("ReverseSequence", {"x": xb, "lens": np.array([2, 4, 0], np.int64)},
                       time_axis=1, batch_axis=0)


def test_one_hot_values_at_run_time_and_out_of_range_indices():
    idx = np.array([[0, -1, 5], [2, -4, 3]], np.int64)      # 5 and -4 are out of range for depth 4
    vals = np.array([-1.0, 2.0], np.float32)
    _check_against_ort("OneHot", {"i": idx, "v": vals}, {"depth": np.array(4, np.int64)}, order=["i", "depth", "v"],
                       axis=1)


def test_defaults():
    x = rng.standard_normal((3, 5)).astype(np.float32)
    _check_against_ort("ArgMax", {"x": x})                             # axis 0, keepdims 1
    _check_against_ort("ReduceMax", {"x": x})                          # every axis, keepdims 1
    _check_against_ort("CumSum", {"x": x}, {"axis": np.array(1, np.int32)}, exclusive=1, reverse=1)
    _check_against_ort("Trilu", {"x": x})                              # upper, k 0
    _check_against_ort("Hardmax", {"x": x})                            # axis -1
    _check_against_ort("TopK", {"x": x}, {"k": np.array([2], np.int64)}, n_out=2, largest=0)
    _check_against_ort("ReduceLogSumExp", {"x": x * 100}, {"axes": np.array([1], np.int64)}, keepdims=0)


def test_cumprod_exclusive_and_reverse():
    # onnxruntime has no CumProd (opset 26) yet: against NumPy.
    x = rng.standard_normal((3, 5)).astype(np.float32)
    g = import_onnx(_model("CumProd", {"x": x}, {"axis": np.array(-1, np.int64)}, opset=26, exclusive=1, reverse=1))
    rev = np.cumprod(x[:, ::-1], axis=1)
    want = np.concatenate([np.ones((3, 1), np.float32), rev[:, :-1]], axis=1)[:, ::-1]
    for backend in ("numpy", "torch"):
        (got,) = partita.run(g, [x], backend=backend)
        np.testing.assert_allclose(np.asarray(got if backend == "numpy" else got.numpy()), want, rtol=1e-5)


def test_axes_must_be_constants_and_the_error_says_how_to_fix_it():
    msg = _error("ReduceMax", {"x": np.zeros((2, 3), np.float32), "axes": np.array([1], np.int64)})
    assert "axes (input 1, 'axes') must be known at import time" in msg and "static_inputs={'axes'" in msg
    msg = _error("TopK", {"x": np.zeros((2, 3), np.float32), "k": np.array([1], np.int64)}, n_out=2)
    assert "K (input 1, 'k') must be known at import time" in msg and "graph input 'k'" in msg


def test_errors_name_the_problem():
    x = np.zeros((2, 3), np.float32)
    assert "K=4 is outside [0, 3]" in _error("TopK", {"x": x}, {"k": np.array([4], np.int64)}, n_out=2)
    assert "axis 2 is outside [-2, 1]" in _error("ArgMin", {"x": x}, axis=2)
    assert "must be a float tensor" in _error("ReduceLogSum", {"x": x.astype(np.int64)},
                                             {"axes": np.array([1], np.int64)})
    assert "not divisible by blocksize^2" in _error("DepthToSpace", {"x": np.zeros((1, 3, 2, 2), np.float32)},
                                                    blocksize=2)
    assert "mode 'XYZ' is not DCR or CRD" in _error("DepthToSpace", {"x": np.zeros((1, 4, 2, 2), np.float32)},
                                                    blocksize=2, mode="XYZ")
    assert "delta is 0" in _error("Range", {}, {"s": np.array(0, np.int64), "l": np.array(3, np.int64),
                                                "d": np.array(0, np.int64)})
    assert "depth 0 must be positive" in _error("OneHot", {"i": np.zeros(2, np.int64), "v": np.zeros(2, np.float32)},
                                                {"d": np.array(0, np.int64)}, order=["i", "d", "v"])
