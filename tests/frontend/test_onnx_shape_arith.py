"""Import-time constant propagation through shape arithmetic, opset upgrades, and foreign
domains (partita/frontend/onnx/importer.py).

What exporters write: a Reshape target computed as ``Shape -> Gather -> Concat``, an Expand
shape from ``Where(Equal(shape, -1), ones, shape)``, Pad pads from a ``Cast``. Each is a
constant once the input shapes are static; the importer evaluates them with the ops' NumPy
references and the graph holds constants, not the arithmetic.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from partita.backend.numpy_ref import run as run_ref  # noqa: E402
from partita.frontend.onnx import OnnxImportError, OnnxOpsetUpgradeWarning, import_onnx  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    m = helper.make_model(g, opset_imports=ops)
    m.ir_version = 8
    return m


def _const(name, arr):
    return helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(arr), name))


def _ort(model, feed):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feed)


def _ops(g):
    return [n.op for n in g.nodes]


def test_reshape_target_from_shape_gather_concat_is_a_constant():
    """x.view(x.shape[0], -1, 2): the target is computed from Shape at run time by the file,
    a constant for partita; the graph keeps no Shape arithmetic."""
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             _const("i0", np.array(0, np.int64)),
             helper.make_node("Gather", ["s", "i0"], ["d0"], axis=0),
             helper.make_node("Unsqueeze", ["d0", "ax"], ["d0u"]),
             _const("ax", np.array([0], np.int64)),
             _const("rest", np.array([-1, 2], np.int64)),
             helper.make_node("Concat", ["d0u", "rest"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="view")]
    # Constant "ax" is defined after its reader in the list above: reorder topologically.
    nodes = [nodes[0], nodes[1], nodes[2], nodes[4], nodes[3], nodes[5], nodes[6], nodes[7]]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [3, 4, 2])],
                   [helper.make_tensor_value_info("y", F, None)])
    g = import_onnx(model)
    assert g.outputs[0].type.shape == (3, 4, 2)
    assert _ops(g) == ["reshape"], _ops(g)
    x = np.random.default_rng(0).standard_normal((3, 4, 2)).astype(np.float32)
    np.testing.assert_array_equal(run_ref(g, [x])[0], _ort(model, {"x": x})[0])


def test_expand_shape_from_where_and_pad_pads_from_cast():
    nodes = [_const("shape", np.array([2, -1, 3], np.int64)),
             _const("m1", np.array(-1, np.int64)),
             helper.make_node("Equal", ["shape", "m1"], ["is_neg"]),
             _const("ones", np.array([1, 1, 1], np.int64)),
             helper.make_node("Where", ["is_neg", "ones", "shape"], ["eshape"]),
             helper.make_node("Expand", ["x", "eshape"], ["e"]),
             _const("padsf", np.array([0, 1, 0, 0, 0, 1], np.float32)),
             helper.make_node("Cast", ["padsf"], ["pads"], to=I64),
             helper.make_node("Pad", ["e", "pads"], ["y"], name="pad")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 4, 3])],
                   [helper.make_tensor_value_info("y", F, None)])
    g = import_onnx(model)
    x = np.random.default_rng(1).standard_normal((1, 4, 3)).astype(np.float32)
    want = _ort(model, {"x": x})[0]
    got = run_ref(g, [x])[0]
    assert got.shape == want.shape == (2, 5, 4)
    np.testing.assert_array_equal(got, want)
    assert "equal" not in _ops(g) and "where" not in _ops(g)


def test_a_value_computed_from_a_graph_input_names_the_chain():
    """A Reshape target that depends on a graph input's value (not its shape) cannot be
    static: the error names the operand, the nodes in between and the input."""
    nodes = [helper.make_node("Cast", ["n"], ["nc"], to=I64, name="to_int"),
             _const("rest", np.array([-1], np.int64)),
             helper.make_node("Concat", ["nc", "rest"], ["target"], axis=0, name="cat"),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="view")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [4, 2]),
                           helper.make_tensor_value_info("n", F, [1])],
                   [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(OnnxImportError) as e:
        import_onnx(model)
    msg = str(e.value)
    assert "node 'view' (Reshape)" in msg and "'target'" in msg, msg
    assert "node 'cat' (Concat) <- node 'to_int' (Cast)" in msg and "graph input 'n'" in msg, msg
    assert "static_inputs" in msg, msg


def test_float_arithmetic_on_weights_stays_in_the_graph():
    """Weights are parameters: Mul(w, 2) is not folded into a constant (it would stop training
    w), while integer shape arithmetic on an initializer is."""
    w = onnx.numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    nodes = [_const("two", np.array(2.0, np.float32)),
             helper.make_node("Mul", ["w", "two"], ["w2"]),
             helper.make_node("Add", ["x", "w2"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 2])],
                   [helper.make_tensor_value_info("y", F, [2, 2])], inits=[w])
    g = import_onnx(model)
    assert "mul" in _ops(g) and [v.name for v in g.params()] == ["w"]


def test_opsets_7_to_12_are_upgraded_with_a_warning():
    """An opset-11 model (Unsqueeze axes as an attribute) imports, upgraded by ONNX's
    version converter, and says so."""
    nodes = [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]), helper.make_node("Relu", ["u"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [3])],
                   [helper.make_tensor_value_info("y", F, [1, 3])], opset=11)
    with pytest.warns(OnnxOpsetUpgradeWarning, match=r"opset 11; partita upgraded it to opset 13"):
        g = import_onnx(model)
    x = np.array([-1.0, 0.5, 2.0], np.float32)
    np.testing.assert_array_equal(run_ref(g, [x])[0], np.maximum(x, 0)[None])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        import_onnx(_model(nodes[1:], [helper.make_tensor_value_info("u", F, [3])],
                           [helper.make_tensor_value_info("y", F, [3])], opset=13))


def test_a_model_of_the_ml_domain_only_lists_its_ops():
    node = helper.make_node("LinearClassifier", ["x"], ["y", "z"], domain="ai.onnx.ml", name="clf",
                            coefficients=[1.0, 2.0], classlabels_ints=[0, 1])
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", F, [1, 1])],
                          [helper.make_tensor_value_info("y", I64, [1]), helper.make_tensor_value_info("z", F, [1, 2])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("ai.onnx.ml", 3)])
    with pytest.raises(OnnxImportError, match=r"domain\(s\) ai\.onnx\.ml, which partita does not import.*"
                                              r"ai\.onnx\.ml::LinearClassifier \(nodes: clf\)"):
        import_onnx(model)


def test_training_domain_ops_beside_default_ones_are_listed():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Gradient", ["r"], ["y"], domain="ai.onnx.preview.training", name="grad",
                              xs=["x"], y="r")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2])], [helper.make_tensor_value_info("y", F, [2])],
                   extra_opsets=[("ai.onnx.preview.training", 1)])
    with pytest.raises(OnnxImportError, match=r"ai\.onnx\.preview\.training::Gradient \(nodes: grad\)"):
        import_onnx(model)


def test_load_onnx_binds_dynamic_axes_by_the_inputs_it_sees(tmp_path):
    """A file exported with a dynamic batch axis and a shape-dependent view runs at two batch
    sizes: one import per shape, each matching onnxruntime."""
    import torch

    import partita

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(6, 4)

        def forward(self, x):
            return self.fc(x).view(x.shape[0], 2, 2).relu()

    path = tmp_path / "net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net().eval(), (torch.randn(3, 6),), str(path), input_names=["x"], output_names=["y"],
                          dynamic_axes={"x": {0: "batch"}}, opset_version=17, dynamo=False)
    model = partita.load_onnx(path, backend="numpy")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for batch in (2, 5, 2):
        x = np.random.default_rng(batch).standard_normal((batch, 6)).astype(np.float32)
        (got,) = model(x)
        np.testing.assert_allclose(got, sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    assert len(model._graphs) == 2
    assert model.graph_for({"x": (5, 6)}).outputs[0].type.shape == (5, 2, 2)
    with pytest.raises(OnnxImportError, match=r"inputs x expected; unknown: z"):
        model(z=np.zeros((1, 6), np.float32))
    fixed = partita.load_onnx(path, input_shapes={"x": [4, 6]}, backend="torch")
    assert list(fixed._graphs) and fixed.graph_for({}).inputs[0].type.shape == (4, 6)
