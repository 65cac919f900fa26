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
                    # a string op and one whose result shape depends on the values (partita has neither)
                    helper.make_node("StringNormalizer", ["a"], ["b"], name="sn1"),
                    helper.make_node("Unique", ["b"], ["c"], name="uniq"),
                    helper.make_node("StringNormalizer", ["c"], ["y"], name="sn2")],
                   [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])])
    with pytest.raises(OnnxImportError) as e:
        import_onnx(model)
    msg = str(e.value)
    assert "Unique (nodes: uniq)" in msg and "StringNormalizer (nodes: sn1, sn2)" in msg
    assert "Relu (nodes" not in msg


def test_an_opset_the_version_converter_cannot_upgrade_is_refused_saying_what_to_do(monkeypatch):
    from onnx import version_converter

    def refuse(model, target):
        raise RuntimeError("No Adapter For Relu\nmore C++ detail")

    monkeypatch.setattr(version_converter, "convert_version", refuse)
    model = _tiny()
    model.opset_import[0].version = 6  # type: ignore[attr-defined]
    with pytest.raises(OnnxImportError, match=r"opset 6 and ONNX's version converter cannot upgrade it to opset 13: "
                                              r"No Adapter For Relu; export the model again at opset 13"):
        import_onnx(model)


def test_reshape_shape_computed_at_run_time_is_refused_naming_the_node():
    model = _model([helper.make_node("Reshape", ["x", "s"], ["y"], name="dyn_reshape")],
                   [helper.make_tensor_value_info("x", F, [2, 3]),
                    helper.make_tensor_value_info("s", TensorProto.INT64, [2])],
                   [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(OnnxImportError, match=r"<onnx>:1: node 'dyn_reshape' \(Reshape\).*must be known at import time.*graph input 's'.*static_inputs"):
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
    model = _model([helper.make_node("Pad", ["x", "p"], ["y"], name="pad_sym", mode="symmetric")],
                   [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)],
                   [("p", _i64(1, 1, 1, 1))])
    with pytest.raises(OnnxImportError, match=r"node 'pad_sym' \(Pad\): mode 'symmetric' is not supported"):
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
    from partita.frontend.onnx.backend import PartitaBackend, PartitaTorchBackend

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


# --- training-mode BatchNormalization and Dropout, Pad wrap, Slice with negative steps --------

def _bn_training_expected(x, s, b, m, v, momentum, eps):
    """ONNX's definition: batch mean and biased variance; running = old * momentum + batch * (1 - momentum)."""
    axes = (0,) + tuple(range(2, x.ndim))
    mean, var = x.mean(axis=axes), x.var(axis=axes)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps) * s.reshape(shape) + b.reshape(shape)
    return y, m * momentum + mean * (1 - momentum), v * momentum + var * (1 - momentum)


@pytest.mark.parametrize("shape,opset", [((4, 3), 15), ((2, 3, 5, 4), 15), ((2, 3, 4), 13)])
def test_batch_norm_training_mode_updates_running_statistics(shape, opset):
    """training_mode=1 (before opset 14: asking for the statistics outputs): y uses the batch
    statistics, and the running mean and variance take the biased batch variance with ONNX's
    momentum (the weight of the old value)."""
    c = shape[1]
    s, b, m, v = _rand(c), _rand(c), _rand(c), np.abs(_rand(c)) + 0.5
    mode = {"training_mode": 1} if opset >= 14 else {}
    # BatchNormalization-9 declares all five outputs; the saved statistics are left unnamed.
    outs = ["y", "rm", "rv"] + ([] if opset >= 14 else ["", ""])
    model = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outs,
                                     momentum=0.7, epsilon=1e-3, **mode)],
                   [helper.make_tensor_value_info("x", F, list(shape))],
                   [helper.make_tensor_value_info(n, F, None) for n in ("y", "rm", "rv")],
                   [("s", s), ("b", b), ("m", m), ("v", v)], opset=opset)
    x = _rand(*shape)
    g = _check_against_ort(model, {"x": x})
    want = _bn_training_expected(x, s, b, m, v, 0.7, 1e-3)
    for got in (partita.run(g, [x]), [t.numpy() for t in partita.run(g, [x], backend="torch")]):
        for w, a in zip(want, got):
            np.testing.assert_allclose(a, w, rtol=1e-4, atol=1e-5)


def test_batch_norm_statistics_outputs_need_training_mode():
    model = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm"], name="bn")],
                   [helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info(n, F, None) for n in ("y", "rm")],
                   [(n, _rand(3)) for n in "sbmv"], opset=15)
    with pytest.raises(OnnxImportError, match=r"node 'bn' \(BatchNormalization\): outputs \[1\].*training_mode=1"):
        import_onnx(model)
    saved = _model([helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                                     ["y", "rm", "rv", "sm", "sv"], name="bn9")],
                   [helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info(n, F, None) for n in ("y", "rm", "rv", "sm", "sv")],
                   [(n, _rand(3)) for n in "sbmv"], opset=13)
    with pytest.raises(OnnxImportError, match=r"node 'bn9' \(BatchNormalization\): the saved_mean/saved_var"):
        import_onnx(saved)


def _training_dropout(shape, ratio, seed=None, inits=True, name="drop"):
    attrs = {} if seed is None else {"seed": seed}
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], name=name, **attrs)
    r, t = np.array(ratio, dtype=np.float32), np.array(True)
    if inits:
        return _model([node], [helper.make_tensor_value_info("x", F, list(shape))],
                      [helper.make_tensor_value_info("y", F, None),
                       helper.make_tensor_value_info("mask", TensorProto.BOOL, None)], [("r", r), ("t", t)])
    return _model([node], [helper.make_tensor_value_info("x", F, list(shape)),
                           helper.make_tensor_value_info("r", F, []),
                           helper.make_tensor_value_info("t", TensorProto.BOOL, [])],
                  [helper.make_tensor_value_info("y", F, None),
                   helper.make_tensor_value_info("mask", TensorProto.BOOL, None)])


def test_training_dropout_mask_properties_on_both_executors():
    """No importer can match the mask NumPy's global RNG draws, so check what defines
    dropout: kept elements are x / (1 - p), the mask marks exactly the kept ones, about p of
    a large tensor is dropped, and one seed gives one mask on both executors."""
    p, shape = 0.3, (64, 128)
    x = np.abs(_rand(*shape)) + 0.1  # no zeros, so a zero in y can only be a drop
    g = import_onnx(_training_dropout(shape, p, seed=5))
    partita.verify(g)
    assert [n.attrs["seed"] for n in g.nodes if n.op == "dropout"] == [5, 5]
    y_np, m_np = partita.run(g, [x])
    y_t, m_t = (t.numpy() for t in partita.run(g, [x], backend="torch"))
    assert m_np.dtype == np.bool_ and m_np.shape == shape
    np.testing.assert_array_equal(m_np, m_t)
    np.testing.assert_allclose(y_np, y_t, rtol=1e-6)
    np.testing.assert_array_equal(m_np, y_np != 0)
    np.testing.assert_allclose(y_np[m_np], x[m_np] / (1 - p), rtol=1e-6)
    dropped = 1 - m_np.mean()
    assert abs(dropped - p) < 0.02, dropped
    # The same seed repeats the mask; another seed draws another one.
    (_, again) = partita.run(import_onnx(_training_dropout(shape, p, seed=5)), [x])
    (_, other) = partita.run(import_onnx(_training_dropout(shape, p, seed=6)), [x])
    np.testing.assert_array_equal(again, m_np)
    assert (other != m_np).mean() > 0.2


def test_training_dropout_ratio_zero_and_runtime_flags():
    """Ratio 0 drops nothing (y is x, the mask all true) even in training; ratio and
    training_mode computed at run time are refused, naming the node; bound ones import."""
    x = _rand(3, 4)
    g = import_onnx(_training_dropout((3, 4), 0.0))
    for backend in ("numpy", "torch"):
        y, mask = (np.asarray(v) for v in partita.run(g, [x], backend=backend))
        np.testing.assert_array_equal(y, x)
        assert mask.dtype == np.bool_ and mask.all()
    model = _training_dropout((3, 4), 0.5, inits=False, name="drop_rt")
    with pytest.raises(OnnxImportError, match=r"node 'drop_rt' \(Dropout\): training_mode .*must be known at import time.*graph input"):
        import_onnx(model)
    g = import_onnx(model, static_inputs={"t": np.array(True), "r": np.array(0.5, np.float32)})
    assert [n.attrs["p"] for n in g.nodes if n.op == "dropout"] == [0.5, 0.5]
    with pytest.raises(OnnxImportError, match=r"node 'drop_rt' \(Dropout\): ratio .*must be known at import time.*graph input"):
        import_onnx(model, static_inputs={"t": np.array(True)})


@pytest.mark.parametrize("pads,axes", [
    ([2, 1, 1, 1], None),              # the spec's example
    ([7, 0, 3, 9], None),              # longer than the axis: whole copies plus a remainder
    ([-1, 2, 2, -1], None),            # crop one side, wrap the other (from the cropped data)
    ([-1, 3], [-1]),                   # negative axis, one axis only
])
def test_wrap_pad_matches_onnxruntime(pads, axes):
    ins = ["x", "p"] + (["", "axes"] if axes is not None else [])
    inits = [("p", _i64(*pads))] + ([("axes", _i64(*axes))] if axes is not None else [])
    model = _model([helper.make_node("Pad", ins, ["y"], mode="wrap")],
                   [helper.make_tensor_value_info("x", F, [3, 4])], [helper.make_tensor_value_info("y", F, None)],
                   inits, opset=19)
    g = _check_against_ort(model, {"x": _rand(3, 4)})
    assert {n.op for n in g.nodes} <= {"slice", "concat"}


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_negative_pads_crop_before_padding_like_onnxruntime(mode):
    model = _model([helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)],
                   [helper.make_tensor_value_info("x", F, [4, 5])], [helper.make_tensor_value_info("y", F, None)],
                   [("p", _i64(-1, 2, 2, -2))], opset=19)
    _check_against_ort(model, {"x": _rand(4, 5)})


def test_pads_cropping_more_than_the_axis_are_refused():
    model = _model([helper.make_node("Pad", ["x", "p"], ["y"], name="crop", mode="wrap")],
                   [helper.make_tensor_value_info("x", F, [2, 3])], [helper.make_tensor_value_info("y", F, None)],
                   [("p", _i64(0, -2, 0, -2))], opset=19)
    with pytest.raises(OnnxImportError, match=r"node 'crop' \(Pad\): negative pads remove 2 \+ 2 elements from "
                                              r"axis 1, which has only 3"):
        import_onnx(model)


_INT_MAX, _INT_MIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


@pytest.mark.parametrize("starts,ends,axes,steps", [
    ([-1], [_INT_MIN], [1], [-1]),                 # reverse an axis with the INT_MIN sentinel
    ([_INT_MAX, 4], [_INT_MIN, 0], None, [-2, -3]),  # INT_MAX start clamps to the last element
    ([20, -2], [-20, 1], [0, -1], [-1, -1]),       # out-of-range start/end, negative axis
    ([1], [3], [2], [-1]),                         # start before end going backward: empty
    ([5, 0], [-7, _INT_MAX], [2, 0], [-2, 1]),     # mixed directions
    ([0, 0], [-1, 5], None, None),                 # omitted axes and steps
    ([3], [3], [0], [-1]),                         # one element kept backward (no reverse needed)
])
def test_slice_with_negative_steps_matches_onnxruntime(starts, ends, axes, steps):
    """Every ONNX clamping rule for negative steps: sentinels, negatives, empty results."""
    inits = [("starts", _i64(*starts)), ("ends", _i64(*ends))]
    ins = ["x", "starts", "ends"]
    if axes is not None or steps is not None:
        inits.append(("axes", _i64(*(axes if axes is not None else range(len(starts))))))
        ins.append("axes")
    if steps is not None:
        inits.append(("steps", _i64(*steps)))
        ins.append("steps")
    model = _model([helper.make_node("Slice", ins, ["y"])],
                   [helper.make_tensor_value_info("x", F, [4, 5, 6])], [helper.make_tensor_value_info("y", F, None)],
                   inits)
    _check_against_ort(model, {"x": _rand(4, 5, 6)})


def test_slice_zero_step_and_repeated_axis_are_refused():
    def model(steps, axes):
        return _model([helper.make_node("Slice", ["x", "s", "e", "a", "st"], ["y"], name="sl")],
                      [helper.make_tensor_value_info("x", F, [4, 5])], [helper.make_tensor_value_info("y", F, None)],
                      [("s", _i64(0, 0)), ("e", _i64(2, 2)), ("a", _i64(*axes)), ("st", _i64(*steps))])
    with pytest.raises(OnnxImportError, match=r"node 'sl' \(Slice\): step 0 on axis 1"):
        import_onnx(model([1, 0], [0, 1]))
    with pytest.raises(OnnxImportError, match=r"node 'sl' \(Slice\): axis 1 is sliced twice"):
        import_onnx(model([1, 1], [1, -1]))


# --- sequences: unrolled at import time, compared with ONNX's reference evaluator ---------

I64 = TensorProto.INT64


def _check_against_reference(model, feeds: dict[str, np.ndarray]):
    """Import, verify, run on both executors, and compare every output with
    onnx.reference.ReferenceEvaluator (onnxruntime lacks some sequence ops' corner cases)."""
    from onnx.reference import ReferenceEvaluator

    g = import_onnx(model)
    partita.verify(g)
    want = ReferenceEvaluator(model).run(None, feeds)
    args = [feeds[v.name] for v in g.inputs if v.role == "input"]
    got_np = partita.run(g, args, backend="numpy")
    got_t = [t.detach().numpy() for t in partita.run(g, args, backend="torch")]
    assert len(want) == len(got_np) == len(got_t)
    for w, a, b in zip(want, got_np, got_t):
        w = np.asarray(w)
        assert a.dtype == w.dtype and a.shape == w.shape
        np.testing.assert_array_equal(a, w)
        np.testing.assert_array_equal(b, w)
    return g


def _seq_inputs(*shapes):
    return ([helper.make_tensor_value_info(n, F, s) for n, s in zip("XYZ", shapes)],
            {n: _rand(*s) for n, s in zip("XYZ", shapes)})


def _out(name: str, elem: int = F):
    return helper.make_tensor_value_info(name, elem, None)


@pytest.mark.parametrize("pos", [0, 2, -1, -3])
def test_sequence_construct_and_at_with_negative_positions(pos):
    """SequenceAt reads the element at a constant position, negatives counted from the back."""
    ins, feeds = _seq_inputs([2, 3], [1, 3], [4, 3])
    model = _model([helper.make_node("SequenceConstruct", ["X", "Y", "Z"], ["s"]),
                    helper.make_node("SequenceAt", ["s", "p"], ["y"], name="at")],
                   ins, [_out("y")], [("p", np.array(pos, np.int64))])
    _check_against_reference(model, feeds)


@pytest.mark.parametrize("pos", [None, 0, 1, 2, -1, -2])
def test_sequence_empty_and_insert_with_and_without_position(pos):
    """SequenceInsert appends by default and inserts before a position in [-n, n] otherwise;
    ConcatFromSequence shows the order of the whole sequence."""
    ins, feeds = _seq_inputs([1, 3], [2, 3], [3, 3])
    insert = (helper.make_node("SequenceInsert", ["s2", "Z"], ["s3"]) if pos is None else
              helper.make_node("SequenceInsert", ["s2", "Z", "p"], ["s3"]))
    model = _model([helper.make_node("SequenceEmpty", [], ["s0"], dtype=F),
                    helper.make_node("SequenceInsert", ["s0", "X"], ["s1"]),
                    helper.make_node("SequenceInsert", ["s1", "Y"], ["s2"]),
                    insert,
                    helper.make_node("ConcatFromSequence", ["s3"], ["y"], axis=0)],
                   ins, [_out("y")], [] if pos is None else [("p", np.array(pos, np.int64))])
    # The reference evaluator wraps position n around to the front, against the spec (n means
    # the back, as onnxruntime does); that case is compared with onnxruntime instead.
    g = _check_against_ort(model, feeds) if pos == 2 else _check_against_reference(model, feeds)
    # The sequence is gone after import: only the concatenation reaches the graph.
    assert [n.op for n in g.nodes] == ["concat"]


@pytest.mark.parametrize("pos", [None, 0, 1, -1, -3])
def test_sequence_erase_default_last_and_at_position(pos):
    """SequenceErase drops the last element by default, else the one at a constant position
    given by a Constant node."""
    ins, feeds = _seq_inputs([1, 2], [2, 2], [3, 2])
    nodes = [helper.make_node("SequenceConstruct", ["X", "Y", "Z"], ["s"])]
    if pos is None:
        nodes.append(helper.make_node("SequenceErase", ["s"], ["t"]))
    else:
        nodes += [helper.make_node("Constant", [], ["p"], value=numpy_helper.from_array(np.array(pos, np.int64))),
                  helper.make_node("SequenceErase", ["s", "p"], ["t"])]
    nodes.append(helper.make_node("ConcatFromSequence", ["t"], ["y"], axis=-2))
    _check_against_reference(_model(nodes, ins, [_out("y")]), feeds)


def test_sequence_length_is_a_constant_i64_scalar():
    """SequenceLength is static after unrolling: an i64 scalar constant, usable in arithmetic."""
    ins, feeds = _seq_inputs([2, 3])
    model = _model([helper.make_node("SplitToSequence", ["X"], ["s"], axis=1),
                    helper.make_node("SequenceLength", ["s"], ["n"]),
                    helper.make_node("Sub", ["n", "one"], ["a"])],
                   ins, [_out("n", I64), _out("a", I64)], [("one", np.array(1, np.int64))])
    g = _check_against_reference(model, feeds)
    assert g.outputs[0].producer.op == "constant" and str(g.outputs[0].type) == "i64[]"


@pytest.mark.parametrize("split, axis, keepdims", [
    (None, 0, 1), (None, -1, 0), (None, 1, 0),
    (np.array(2, np.int64), 1, 1),                # scalar: chunks of 2, the last one smaller
    (np.array(2, np.int64), 1, 0),                # keepdims is ignored when split is given
    (np.array([1, 3, 1], np.int64), -1, 1),       # 1-D sizes
])
def test_split_to_sequence_matches_reference(split, axis, keepdims):
    """SplitToSequence with the default split of 1 (keepdims honoured), a scalar split and
    1-D sizes; the parts are read back with SequenceAt and ConcatFromSequence (new_axis)."""
    ins, feeds = _seq_inputs([2, 5])
    split_in = ["X"] if split is None else ["X", "sp"]
    stack = dict(axis=axis, new_axis=1) if split is None and not keepdims else dict(axis=axis)
    model = _model([helper.make_node("SplitToSequence", split_in, ["s"], axis=axis, keepdims=keepdims),
                    helper.make_node("SequenceAt", ["s", "last"], ["y0"]),
                    helper.make_node("SequenceLength", ["s"], ["n"]),
                    helper.make_node("ConcatFromSequence", ["s"], ["y1"], **stack)],
                   ins, [_out("y0"), _out("n", I64), _out("y1")],
                   [("last", np.array(-1, np.int64))] + ([] if split is None else [("sp", split)]))
    _check_against_reference(model, feeds)


@pytest.mark.parametrize("axis, new_axis", [(1, 0), (-1, 0), (0, 1), (2, 1), (-1, 1), (-3, 1)])
def test_concat_from_sequence_axis_and_new_axis(axis, new_axis):
    """ConcatFromSequence concatenates (new_axis=0) or stacks (new_axis=1, axis in [-r-1, r])."""
    ins, feeds = _seq_inputs([2, 3], [2, 3], [2, 3])
    model = _model([helper.make_node("SequenceConstruct", ["X", "Y", "Z"], ["s"]),
                    helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=new_axis)],
                   ins, [_out("y")])
    _check_against_reference(model, feeds)


def test_sequence_graph_outputs_and_inputs_are_refused():
    """A sequence that reaches a graph output or arrives as a graph input cannot be a
    partita value: the error says so."""
    ins, _ = _seq_inputs([2, 3])
    seq_out = helper.make_tensor_sequence_value_info("s", F, [2, 3])
    out_model = _model([helper.make_node("SequenceConstruct", ["X"], ["s"])], ins, [seq_out])
    with pytest.raises(OnnxImportError, match="graph output 's' is a sequence: sequence-typed graph "
                                              "inputs/outputs are not supported: partita's values are tensors"):
        import_onnx(out_model)
    in_model = _model([helper.make_node("SequenceAt", ["s", "p"], ["y"])],
                      [seq_out], [_out("y")], [("p", np.array(0, np.int64))])
    with pytest.raises(OnnxImportError, match="graph input 's' is a sequence: sequence-typed graph "
                                              "inputs/outputs are not supported"):
        import_onnx(in_model)


def test_sequence_position_computed_at_run_time_is_refused_naming_the_node():
    """Positions must be constants: one computed from a graph input is refused, naming the
    node and the operand."""
    ins, _ = _seq_inputs([2, 3], [2, 3])
    model = _model([helper.make_node("SequenceConstruct", ["X", "Y"], ["s"]),
                    helper.make_node("SequenceAt", ["s", "p"], ["y"], name="pick")],
                   ins + [helper.make_tensor_value_info("p", I64, [])], [_out("y")])
    with pytest.raises(OnnxImportError, match=r"node 'pick' \(SequenceAt\): the position \(input 1, 'p'\) "
                                              "must be known at import time.*depends on graph input 'p'"):
        import_onnx(model)


def test_sequence_misuse_is_refused_naming_the_node():
    """An out-of-range position, a sequence fed to a tensor op, and an element of another
    dtype are each a located error."""
    ins, _ = _seq_inputs([2, 3], [2, 3])
    at = _model([helper.make_node("SequenceConstruct", ["X", "Y"], ["s"]),
                 helper.make_node("SequenceAt", ["s", "p"], ["y"], name="at")],
                ins, [_out("y")], [("p", np.array(2, np.int64))])
    with pytest.raises(OnnxImportError, match=r"'at' \(SequenceAt\): position 2 is outside \[-2, 1\]"):
        import_onnx(at)
    relu = _model([helper.make_node("SequenceConstruct", ["X", "Y"], ["s"]),
                   helper.make_node("Relu", ["s"], ["y"], name="act")], ins, [_out("y")])
    with pytest.raises(OnnxImportError, match=r"'act' \(Relu\) reads sequence 's' as input 0"):
        import_onnx(relu)
    mixed = _model([helper.make_node("SequenceConstruct", ["X"], ["s"]),
                    helper.make_node("SequenceInsert", ["s", "k"], ["t"], name="ins"),
                    helper.make_node("ConcatFromSequence", ["t"], ["y"], axis=0)],
                   ins[:1], [_out("y")], [("k", np.zeros((2, 3), np.int64))])
    with pytest.raises(OnnxImportError, match=r"'ins' \(SequenceInsert\): a sequence of f32 tensors cannot hold a i64"):
        import_onnx(mixed)
