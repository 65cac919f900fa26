"""Quantized ONNX models in (partita/frontend/onnx/quant.py): the QDQ files ONNX Runtime's
quantize_static writes, the dynamic ones of quantize_dynamic, and the malformed ones."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita
from partita.frontend.onnx import OnnxImportError, import_onnx

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
quantization = pytest.importorskip("onnxruntime.quantization")
from onnx import TensorProto, helper  # noqa: E402


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc1 = nn.Linear(8 * 8 * 8, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        y = torch.relu(self.conv(x)).flatten(1)
        return self.fc2(torch.relu(self.fc1(y)))


@functools.cache
def _float_model(tmp: str) -> tuple[str, np.ndarray]:
    torch.manual_seed(0)
    x = torch.randn(4, 3, 8, 8)
    path = f"{tmp}/float.onnx"
    torch.onnx.export(_Net().eval(), (x,), path, input_names=["x"], output_names=["y"], opset_version=17,
                      dynamo=False)
    return path, x.numpy()


class _Reader:
    """Calibration data for quantize_static: a few random batches."""

    def __init__(self, x: np.ndarray) -> None:
        rng = np.random.default_rng(0)
        self.batches = iter([{"x": x}] + [{"x": rng.standard_normal(x.shape).astype(np.float32)} for _ in range(3)])

    def get_next(self):
        return next(self.batches, None)


def _ort(path: str, x: np.ndarray) -> np.ndarray:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


@pytest.fixture(scope="module")
def tmpdir_module(tmp_path_factory):
    return str(tmp_path_factory.mktemp("quant"))


@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_static_model_matches_onnxruntime(tmpdir_module, per_channel):
    src, x = _float_model(tmpdir_module)
    path = f"{tmpdir_module}/qdq{int(per_channel)}.onnx"
    # reduce_range: 7-bit weights, as ONNX Runtime's docs advise for processors without VNNI;
    # there its u8 x s8 kernels add pairs of products in 16 bits with saturation (AVX2's
    # vpmaddubsw), and with full-range weights ONNX Runtime itself lands 8% of the output's range
    # from the float model on an AVX2 machine, where partita's integer arithmetic stays within
    # 1.2% (and on AVX-512 machines both agree).
    quantization.quantize_static(src, path, _Reader(x), quant_format=quantization.QuantFormat.QDQ,
                                 per_channel=per_channel, weight_type=quantization.QuantType.QInt8,
                                 activation_type=quantization.QuantType.QUInt8, reduce_range=True)
    model = onnx.load(path)
    ops = {n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops
    g = import_onnx(path)
    partita.verify(g)
    assert any(v.type.dtype.name == "i8" for v in g.inputs)          # int8 weights stay int8
    want = _ort(path, x)
    scale = float(np.max(np.abs(want)))
    for backend in ("numpy", "torch"):
        got = np.asarray(partita.run(g, [x], backend=backend)[0])
        # ONNX Runtime runs QDQ groups with integer kernels and requantizes: an output may
        # differ by a step or two of the output's quantization, here about 1% of its range.
        assert np.max(np.abs(got - want)) <= 0.03 * scale, backend
        assert np.mean(np.abs(got - want)) <= 0.005 * scale, backend


def test_dynamic_quantized_model_matches_onnxruntime(tmpdir_module):
    src, x = _float_model(tmpdir_module)
    path = f"{tmpdir_module}/dyn.onnx"
    quantization.quantize_dynamic(src, path, weight_type=quantization.QuantType.QUInt8, op_types_to_quantize=["MatMul", "Gemm"])
    ops = {n.op_type for n in onnx.load(path).graph.node}
    assert "DynamicQuantizeLinear" in ops and "MatMulInteger" in ops, ops
    g = import_onnx(path)
    want = _ort(path, x)
    got = np.asarray(partita.run(g, [x], backend="torch")[0])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(want))))


def _qdq(scale, zp, zp_type=TensorProto.UINT8, dtype=TensorProto.FLOAT) -> onnx.ModelProto:
    inits = [helper.make_tensor("s", dtype, np.shape(scale), np.ravel(scale).tolist())]
    ins = ["x", "s"]
    if zp is not None:
        inits.append(helper.make_tensor("z", zp_type, np.shape(zp), np.ravel(zp).tolist()))
        ins.append("z")
    node = helper.make_node("QuantizeLinear", ins, ["q"], name="quant_x")
    deq = helper.make_node("DequantizeLinear", ["q"] + ins[1:], ["y"], name="dequant_x")
    g = helper.make_graph([node, deq], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])


def test_a_qdq_pair_rounds_to_the_grid():
    g = import_onnx(_qdq(0.5, 10))
    x = np.array([[0.2, 0.3, -1.0], [100.0, -100.0, 0.75]], np.float32)
    (y,) = partita.run(g, [x])
    # q = clip(round(x / 0.5) + 10, 0, 255); y = (q - 10) * 0.5
    want = (np.clip(np.rint(x / 0.5) + 10, 0, 255) - 10) * 0.5
    np.testing.assert_array_equal(y, want)


@pytest.mark.parametrize("scale,zp,zp_type,message", [
    (0.0, 0, TensorProto.UINT8, "scales must be positive and finite"),
    (-0.5, 0, TensorProto.UINT8, "holds 1 value(s) that are zero, negative or not finite"),
    (0.5, 300, TensorProto.INT32, "is i32[]; partita quantizes to i8, u8, i16, u16"),
])
def test_malformed_quantization_is_refused_with_the_node_named(scale, zp, zp_type, message):
    with pytest.raises(OnnxImportError) as e:
        import_onnx(_qdq(scale, zp, zp_type))
    assert "quant_x" in str(e.value) and message in str(e.value)


def test_a_missing_scale_is_refused():
    m = _qdq(0.5, 0)
    m.graph.node[0].input[1] = ""
    with pytest.raises(OnnxImportError, match="quant_x.*the scale \\(input 1\\) is missing"):
        import_onnx(m)
