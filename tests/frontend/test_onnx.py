"""The ONNX importer: small models built with onnx.helper, imported, verified, run on both
executors and compared with onnxruntime; and the errors a user can hit."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import partita  # noqa: E402
from partita.frontend.onnx import ONNX_TO_PARTITA, OnnxImportError, import_onnx  # noqa: E402
from partita.ir.diagnostics import PartitaError  # noqa: E402

F = TensorProto.FLOAT
RNG = np.random.default_rng(7)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _model(nodes, inputs, outputs, inits=(), opset: int = 17, name: str = "m"):
    graph = helper.make_graph(nodes, name, inputs, outputs,
                              [numpy_helper.from_array(a, n) for n, a in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8  # what onnxruntime of this age accepts for every opset used here
    # The checker insists on output shapes; outputs left unshaped here are for ONNX to infer.
    if all(o.type.tensor_type.HasField("shape") for o in outputs):
        onnx.checker.check_model(model)
    return model


def _check_against_ort(model, feeds: dict[str, np.ndarray], rtol: float = 1e-4, atol: float = 1e-5):
    """Import, verify, run on both executors, and compare every output with onnxruntime."""
    g = import_onnx(model)
    partita.verify(g)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    args = [feeds[v.name] for v in g.inputs if v.role == "input"]
    got_np = partita.run(g, args, backend="numpy")
    got_t = [t.detach().numpy() for t in partita.run(g, args, backend="torch")]
    assert len(want) == len(got_np) == len(got_t)
    for w, a, b in zip(want, got_np, got_t):
        assert a.dtype == w.dtype and a.shape == w.shape
        np.testing.assert_allclose(a, w, rtol=rtol, atol=atol)
        np.testing.assert_allclose(b, w, rtol=rtol, atol=atol)
    return g


def test_mlp_with_gemm_flags_matches_onnxruntime():
    """Gemm with transB, alpha and beta, Relu and Softmax: weights land in graph.weights."""
    w1, b1, w2, b2 = _rand(8, 16), _rand(16), _rand(4, 16), _rand(1, 4)
    model = _model(
        [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", alpha=0.5),
         helper.make_node("Relu", ["h"], ["r"], name="act"),
         helper.make_node("Gemm", ["r", "w2", "b2"], ["z"], name="fc2", transB=1, beta=2.0),
         helper.make_node("Softmax", ["z"], ["y"], name="sm", axis=1)],
        [helper.make_tensor_value_info("x", F, [3, 8])],
        [helper.make_tensor_value_info("y", F, [3, 4])],
        [("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)])
    g = _check_against_ort(model, {"x": _rand(3, 8)})
    assert [v.role for v in g.inputs] == ["input", "param", "param", "param", "param"]
    assert set(g.weights) == {"w1", "b1", "w2", "b2"}
    np.testing.assert_array_equal(g.weights["w2"], w2)
    # The printed graph parses back to an equal graph.
    assert partita.parse(partita.print_graph(g)).structurally_equal(g)


def test_small_cnn_matches_onnxruntime(tmp_path):
    """Conv (pads, strides, group, SAME_UPPER), BatchNorm, MaxPool, GlobalAveragePool,
    Flatten, Gemm; imported from a file, whose name appears in the node locations."""
    c1w, c1b = _rand(4, 3, 3, 3), _rand(4)
    c2w = _rand(8, 2, 3, 3)
    bn = [_rand(4), _rand(4), _rand(4), np.abs(_rand(4)) + 0.5]
    fw, fb = _rand(8, 5), _rand(5)
    model = _model(
        [helper.make_node("Conv", ["x", "c1w", "c1b"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
         helper.make_node("BatchNormalization", ["c1", "s", "b", "m", "v"], ["n1"], name="bn1", epsilon=1e-3),
         helper.make_node("Relu", ["n1"], ["r1"], name="relu1"),
         helper.make_node("MaxPool", ["r1"], ["p1"], name="pool1", kernel_shape=[2, 2], strides=[2, 2]),
         helper.make_node("Conv", ["p1", "c2w"], ["c2"], name="conv2", group=2, strides=[2, 2],
                          auto_pad="SAME_UPPER"),
         helper.make_node("GlobalAveragePool", ["c2"], ["gap"], name="gap"),
         helper.make_node("Flatten", ["gap"], ["flat"], name="flat"),
         helper.make_node("Gemm", ["flat", "fw", "fb"], ["y"], name="fc")],
        [helper.make_tensor_value_info("x", F, [2, 3, 9, 9])],
        [helper.make_tensor_value_info("y", F, [2, 5])],
        [("c1w", c1w), ("c1b", c1b), ("c2w", c2w), ("s", bn[0]), ("b", bn[1]), ("m", bn[2]), ("v", bn[3]),
         ("fw", fw), ("fb", fb)])
    path = tmp_path / "cnn.onnx"
    onnx.save(model, str(path))
    g = _check_against_ort(model, {"x": _rand(2, 3, 9, 9)})
    from_file = partita.import_onnx(path)
    assert [n.op for n in from_file.nodes] == [n.op for n in g.nodes]
    convs = [n for n in from_file.nodes if n.op == "conv2d"]
    assert convs[0].loc is not None and convs[0].loc.file == str(path) and convs[0].loc.line == 1
    assert convs[1].attrs["groups"] == 2 and convs[1].loc.line == 5


def test_asymmetric_pads_and_avg_pool_exclude_pad_match_onnxruntime():
    """SAME_LOWER conv padding and an AveragePool whose pads partita pads explicitly."""
    w = _rand(2, 3, 2, 2)
    model = _model(
        [helper.make_node("Conv", ["x", "w"], ["c"], auto_pad="SAME_LOWER"),
         helper.make_node("AveragePool", ["c"], ["a"], kernel_shape=[3, 3], pads=[0, 1, 2, 2]),
         helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2], pads=[1, 0, 0, 1], ceil_mode=1,
                          strides=[2, 2])],
        [helper.make_tensor_value_info("x", F, [1, 3, 6, 7])],
        [helper.make_tensor_value_info("a", F, None), helper.make_tensor_value_info("m", F, None)],
        [("w", w)])
    _check_against_ort(model, {"x": _rand(1, 3, 6, 7)})


def test_one_d_conv_and_pools_are_lifted_to_two_d_and_match_onnxruntime():
    """1-D Conv/MaxPool/AveragePool run as 2-D ones over a unit height."""
    w, bias = _rand(4, 2, 3), _rand(4)
    model = _model(
        [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[2, 1], strides=[2], group=1),
         helper.make_node("MaxPool", ["c"], ["m"], kernel_shape=[2], auto_pad="SAME_LOWER"),
         helper.make_node("AveragePool", ["m"], ["y"], kernel_shape=[3], pads=[1, 1], count_include_pad=0)],
        [helper.make_tensor_value_info("x", F, [2, 2, 11])],
        [helper.make_tensor_value_info("y", F, None)],
        [("w", w), ("b", bias)])
    g = _check_against_ort(model, {"x": _rand(2, 2, 11)})
    assert g.outputs[0].type.rank == 3


def _i64(*vals: int) -> np.ndarray:
    return np.array(vals, dtype=np.int64)


def test_shape_and_elementwise_ops_match_onnxruntime():
    """Reshape 0/-1, Transpose, Split (input), Unsqueeze/Squeeze (inputs), Concat, Reduce*,
    Gather with negative indices, Where/Less/Greater/Equal, Cast, Pow, Erf, Sqrt,
    LayerNormalization, Dropout, Identity, Constant, broadcasting Add/Sub/Mul/Div."""
    scale, bias = _rand(6), _rand(6)
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),                   # [2,3,4] -> [2,-1] -> [2,12]
        helper.make_node("Reshape", ["r", "shape0"], ["r0"]),                 # [0, 3, 4]
        helper.make_node("Transpose", ["r0"], ["t"], perm=[0, 2, 1]),         # [2,4,3]
        helper.make_node("Split", ["t", "split"], ["s0", "s1"], axis=1),      # [2,1,3], [2,3,3]
        helper.make_node("Squeeze", ["s0", "ax1"], ["sq"]),                   # [2,3]
        helper.make_node("Unsqueeze", ["sq", "ax1"], ["us"]),                 # [2,1,3]
        helper.make_node("Concat", ["us", "s1"], ["cat"], axis=1),            # [2,4,3]
        helper.make_node("ReduceSum", ["cat", "ax1"], ["rs"], keepdims=0),    # [2,3]
        helper.make_node("ReduceMean", ["cat"], ["rm"], axes=[2]),            # [2,4,1]
        helper.make_node("Constant", [], ["c2"], value=numpy_helper.from_array(np.float32(2.0))),
        helper.make_node("Pow", ["rs", "c2"], ["pw"]),
        helper.make_node("Sqrt", ["pw"], ["sqrt"]),
        helper.make_node("Erf", ["rs"], ["erf"]),
        helper.make_node("Less", ["rs", "zero"], ["lt"]),
        helper.make_node("Where", ["lt", "sqrt", "erf"], ["wh"]),
        helper.make_node("Gather", ["x", "idx"], ["ga"], axis=2),             # [2,3,2,2]
        helper.make_node("Cast", ["lt"], ["ltf"], to=TensorProto.FLOAT),
        helper.make_node("Greater", ["rs", "zero"], ["gt"]),
        helper.make_node("Equal", ["lt", "gt"], ["eq"]),
        helper.make_node("Sub", ["wh", "ltf"], ["sub"]),
        helper.make_node("Div", ["sub", "c2"], ["div"]),
        helper.make_node("Mul", ["rm", "x4"], ["mul"]),                        # [2,4,1]*[4,5] -> [2,4,5]
        helper.make_node("Concat", ["div", "div"], ["d6"], axis=1),            # [2,6]
        helper.make_node("LayerNormalization", ["d6", "scale", "bias"], ["ln"], epsilon=1e-3),
        helper.make_node("Dropout", ["ln"], ["dr"]),
        helper.make_node("Identity", ["dr"], ["y0"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [2, 3, 4]), helper.make_tensor_value_info("x4", F, [4, 5])],
        [helper.make_tensor_value_info(n, t, None) for n, t in
         [("y0", F), ("mul", F), ("ga", F), ("eq", TensorProto.BOOL)]],
        [("shape", _i64(2, -1)), ("shape0", _i64(0, 3, 4)), ("split", _i64(1, 3)), ("ax1", _i64(1)),
         ("zero", np.float32(0.0)), ("idx", np.array([[0, -1], [2, 1]], dtype=np.int64)),
         ("scale", scale), ("bias", bias)])
    _check_against_ort(model, {"x": _rand(2, 3, 4), "x4": _rand(4, 5)})


@pytest.mark.parametrize("opset", [13, 18])
def test_split_without_sizes_follows_each_opset(opset):
    """Opset 13 splits equally by the number of outputs; 18 needs num_outputs (last part smaller)."""
    attrs = {"axis": 1} if opset == 13 else {"axis": 1, "num_outputs": 3}
    n_out = 3
    model = _model([helper.make_node("Split", ["x"], [f"o{i}" for i in range(n_out)], **attrs)],
                   [helper.make_tensor_value_info("x", F, [2, 9 if opset == 13 else 8])],
                   [helper.make_tensor_value_info(f"o{i}", F, None) for i in range(n_out)], opset=opset)
    x = _rand(2, 9 if opset == 13 else 8)
    g = _check_against_ort(model, {"x": x})
    sizes = [v.type.shape[1] for v in g.outputs]
    assert sizes == ([3, 3, 3] if opset == 13 else [3, 3, 2])


def test_integer_div_truncates_like_onnx():
    model = _model([helper.make_node("Div", ["a", "b"], ["y"])],
                   [helper.make_tensor_value_info("a", TensorProto.INT32, [4]),
                    helper.make_tensor_value_info("b", TensorProto.INT32, [4])],
                   [helper.make_tensor_value_info("y", TensorProto.INT32, [4])])
    a, b = np.array([7, -7, 9, -1], dtype=np.int32), np.array([2, 2, -4, 3], dtype=np.int32)
    _check_against_ort(model, {"a": a, "b": b})


# --- errors -------------------------------------------------------------------------------

def _tiny() -> object:
    return _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, [2])],
                  [helper.make_tensor_value_info("y", F, [2])])


def test_corrupt_file_names_the_file(tmp_path):
    path = tmp_path / "bad.onnx"
    path.write_bytes(b"\xff\xfe this is not a protobuf \x00\x01" * 8)
    with pytest.raises(PartitaError, match=r"bad\.onnx.*(corrupt|not a valid ONNX)"):
        import_onnx(path)


def test_truncated_file_names_the_file(tmp_path):
    data = _tiny().SerializeToString()  # type: ignore[attr-defined]
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxImportError, match=r"cut\.onnx.*truncated"):
        import_onnx(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(OnnxImportError, match=r"nope\.onnx: cannot read"):
        import_onnx(tmp_path / "nope.onnx")


def test_unknown_ops_are_all_listed_with_node_names():
    model = _model([helper.make_node("Relu", ["x"], ["a"], name="ok"),
                    helper.make_node("HardSwish", ["a"], ["b"], name="hs1"),
                    helper.make_node("Celu", ["b"], ["c"], name="celu"),
                    helper.make_node("HardSwish", ["c"], ["y"], name="hs2")],
                   [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(OnnxImportError) as e:
        import_onnx(model)
    msg = str(e.value)
    assert "Celu (nodes: celu)" in msg and "HardSwish (nodes: hs1, hs2)" in msg
    assert "Relu (nodes" not in msg


def test_old_opset_is_refused_with_the_upgrade_path():
    model = _tiny()
    model.opset_import[0].version = 11  # type: ignore[attr-defined]
    with pytest.raises(OnnxImportError, match=r"opset 11.*opset 13 and newer.*convert_version"):
        import_onnx(model)


def test_reshape_shape_computed_at_run_time_is_refused_naming_the_node():
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="dyn_reshape")],
                   [helper.make_tensor_value_info("x", F, [2, 3]),
                    helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                   [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(OnnxImportError, match=r"<onnx>:1: node 'dyn_reshape' \(Reshape\).*constant"):
        import_onnx(model)
    # Binding the shape input to a value (as the conformance backend does) makes it importable.
    g = import_onnx(model, static_inputs={"s": np.array([3, 2], dtype=np.int64)})
    assert g.outputs[0].type.shape == (3, 2)


def test_symbolic_input_dim_needs_input_shapes():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [helper.make_tensor_value_info("x", F, ["N", 4])],
                   [helper.make_tensor_value_info("y", F, ["N", 4])])
    with pytest.raises(OnnxImportError, match=r"symbolic dim 'N'.*input_shapes"):
        import_onnx(model)
    g = import_onnx(model, input_shapes={"x": [3, 4]})
    assert g.outputs[0].type.shape == (3, 4)


def test_unsupported_attribute_names_the_node():
    model = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn_train",
                                     training_mode=1)],
                   [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)],
                   [(n, _rand(3)) for n in "sbmv"])
    with pytest.raises(OnnxImportError, match=r"node 'bn_train' \(BatchNormalization\).*eval mode"):
        import_onnx(model)


def test_converter_table_is_the_single_dispatch():
    """Every claimed op type has a converter, and the op types the brief lists are claimed."""
    claimed = {"Gemm", "Conv", "Reshape", "Split", "Unsqueeze", "Squeeze", "MaxPool", "AveragePool",
               "GlobalAveragePool", "BatchNormalization", "Relu", "Sigmoid", "Tanh", "Softmax", "MatMul",
               "Add", "Sub", "Mul", "Div", "Pow", "Concat", "Flatten", "Transpose", "Gather", "Constant",
               "Identity", "Cast", "ReduceMean", "ReduceSum", "Erf", "Sqrt", "Where", "Equal", "Less",
               "Greater", "LayerNormalization", "Dropout"}
    assert claimed <= set(ONNX_TO_PARTITA) and all(callable(f) for f in ONNX_TO_PARTITA.values())


def test_result_type_disagreeing_with_onnx_inference_is_caught(monkeypatch):
    """A converter whose result type differs from ONNX's inferred value_info is an error
    naming the node (a wrong mapping never slips through silently)."""
    from partita.frontend import onnx as onnx_frontend

    monkeypatch.setitem(onnx_frontend.ONNX_TO_PARTITA, "Relu",
                        lambda n: [n.emit("transpose", n.input(0), perm=[1, 0])])
    model = _model([helper.make_node("Relu", ["x"], ["y"], name="r0")],
                   [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, [2, 3])])
    with pytest.raises(OnnxImportError, match=r"node 'r0' \(Relu\): output 'y': partita infers f32\[3,2\] but ONNX"):
        import_onnx(model)


def test_backend_interface_run_node_and_run_model():
    """run_node wraps one NodeProto in a model; run_model takes inputs by position or by
    ONNX name; both executors agree; devices other than the CPU are refused."""
    from partita.frontend.onnx_backend import PartitaBackend, PartitaTorchBackend

    a, b = _rand(3, 4), _rand(4)
    node = helper.make_node("Sub", ["a", "b"], ["y"])
    for backend in (PartitaBackend, PartitaTorchBackend):
        (y,) = backend.run_node(node, [a, b])
        np.testing.assert_allclose(y, a - b, rtol=1e-6)
    model = _model([helper.make_node("Mul", ["a", "b"], ["y"])],
                   [helper.make_tensor_value_info("a", F, [3, 4]), helper.make_tensor_value_info("b", F, [4])],
                   [helper.make_tensor_value_info("y", F, [3, 4])])
    (y,) = PartitaBackend.run_model(model, {"b": b, "a": a})
    np.testing.assert_allclose(y, a * b, rtol=1e-6)
    assert PartitaBackend.supports_device("CPU") and not PartitaBackend.supports_device("CUDA")
    with pytest.raises(OnnxImportError, match="CPU"):
        PartitaBackend.prepare(model, "CUDA")
