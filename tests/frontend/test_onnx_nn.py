"""ONNX neural-network op types (partita/frontend/onnx/nn.py) beyond ONNX's node cases:
attributes and forms those cases leave out, checked against onnxruntime on both executors,
and the import errors that name what partita cannot express."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import helper, numpy_helper  # noqa: E402

from partita.frontend.onnx import OnnxImportError, import_onnx  # noqa: E402
from partita.frontend.onnx.backend import PartitaBackend, PartitaTorchBackend  # noqa: E402


def _model(op: str, inputs: dict[str, np.ndarray], consts: dict[str, np.ndarray], n_out: int = 1,
           opset: int = 17, input_order: list[str] | None = None, **attrs):
    """A one-node model: ``inputs`` are graph inputs, ``consts`` initializers; the node reads
    them in ``input_order`` ('' for an omitted optional input)."""
    order = input_order if input_order is not None else list(inputs) + list(consts)
    outs = [f"y{i}" for i in range(n_out)]
    node = helper.make_node(op, order, outs, **attrs)
    vis = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in inputs.items()]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    graph = helper.make_graph([node], "g", vis, [helper.make_empty_tensor_value_info(o) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, inputs: dict[str, np.ndarray], rtol: float = 1e-5, atol: float = 1e-6) -> None:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, inputs)
    for backend in (PartitaBackend, PartitaTorchBackend):
        got = backend.prepare(model).run(inputs)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_allclose(np.asarray(g, np.float64), np.asarray(w, np.float64), rtol=rtol, atol=atol)


_rng = np.random.default_rng(0)


def _randn(*shape: int) -> np.ndarray:
    return _rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("eq, shapes", [
    ("ij,jk", [(2, 3), (3, 4)]),                         # implicit result: 'ik'
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 5, 4, 2)]),  # '...' dims that broadcast
    ("ii->", [(4, 4)]),                                  # trace
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),          # three operands
    ("i,j->ij", [(3,), (4,)]),                           # outer product
    ("bij,bkj->bik", [(2, 3, 4), (2, 5, 4)]),
    ("iij->ji", [(3, 3, 2)]),
])
def test_einsum_matches_onnxruntime(eq, shapes):
    ins = {f"x{i}": _randn(*s) for i, s in enumerate(shapes)}
    _check(_model("Einsum", ins, {}, equation=eq), ins, rtol=1e-5, atol=1e-5)


def test_einsum_rejects_a_malformed_equation():
    ins = {"x0": _randn(2, 3)}
    with pytest.raises(OnnxImportError, match="does not match the rank"):
        import_onnx(_model("Einsum", ins, {}, equation="ijk->i"))


def test_gru_linear_before_reset_with_partial_sequence_lens():
    x = _randn(4, 3, 2)
    consts = {"W": _randn(2, 15, 2), "R": _randn(2, 15, 5), "B": _randn(2, 30),
              "lens": np.array([4, 2, 3], np.int32)}
    _check(_model("GRU", {"x": x}, consts, n_out=2, hidden_size=5, linear_before_reset=1,
                  direction="bidirectional"), {"x": x}, atol=1e-5)


def test_lstm_peepholes_clip_and_sequence_lens_as_a_graph_input():
    x = _randn(3, 2, 4)
    lens = np.array([3, 1], np.int32)
    consts = {"W": _randn(1, 12, 4), "R": _randn(1, 12, 3), "B": _randn(1, 24), "P": _randn(1, 9),
              "h0": _randn(1, 2, 3), "c0": _randn(1, 2, 3)}
    model = _model("LSTM", {"x": x, "lens": lens}, consts, n_out=3, hidden_size=3, clip=0.8,
                   direction="reverse", input_order=["x", "W", "R", "B", "lens", "h0", "c0", "P"])
    _check(model, {"x": x, "lens": lens}, atol=1e-5)


def test_rnn_activation_with_alpha():
    x = _randn(2, 3, 2)
    consts = {"W": _randn(1, 4, 2), "R": _randn(1, 4, 4)}
    _check(_model("RNN", {"x": x}, consts, n_out=2, hidden_size=4, activations=["LeakyRelu"],
                  activation_alpha=[0.3]), {"x": x}, atol=1e-5)


def test_rnn_rejects_an_unknown_activation():
    x = _randn(2, 3, 2)
    consts = {"W": _randn(1, 4, 2), "R": _randn(1, 4, 4)}
    with pytest.raises(OnnxImportError, match="activation 'Swish' is not one of"):
        import_onnx(_model("RNN", {"x": x}, consts, hidden_size=4, activations=["Swish"]))


def test_global_lp_pool_and_lp_pool_ceil_mode_match_onnxruntime():
    x = _randn(1, 2, 5, 5)
    _check(_model("GlobalLpPool", {"x": x}, {}, p=3), {"x": x}, rtol=1e-4)
    _check(_model("LpPool", {"x": x}, {}, kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1, p=2, opset=18),
           {"x": x},
           rtol=1e-4)


def test_resize_nearest_keeps_integer_inputs_exact():
    x = _rng.integers(0, 255, (1, 1, 3, 4)).astype(np.uint8)
    model = _model("Resize", {"x": x}, {"scales": np.array([1, 1, 2, 1.5], np.float32)},
                   input_order=["x", "", "scales"], mode="nearest")
    _check(model, {"x": x}, rtol=0, atol=0)


@pytest.mark.parametrize("mode, dtype", [("linear", np.uint8), ("cubic", np.int8)])
def test_resize_of_integers_rounds_half_to_even_and_saturates(mode, dtype):
    """As ONNX's reference: interpolated in float, then np.round and clipped to the dtype
    (cubic overshoots, so the clipping shows). The data is the test's own (seed 1): drawn from
    the module's shared generator it depended on which tests ran before on the worker, and
    some draws put an output exactly on a tie, where the reference's float rounding errs
    (117.5 exactly, 117 from the reference, 118 from partita's round-half-to-even)."""
    from onnx.reference import ReferenceEvaluator

    info = np.iinfo(dtype)
    x = np.random.default_rng(1).integers(info.min, info.max, (1, 1, 3, 4), endpoint=True).astype(dtype)
    x[0, 0, 0, :2] = [info.min, info.max]
    model = _model("Resize", {"x": x}, {"scales": np.array([1, 1, 2, 1.5], np.float32)},
                   input_order=["x", "", "scales"], mode=mode)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    for backend in (PartitaBackend, PartitaTorchBackend):
        (got,) = backend.prepare(model).run({"x": x})
        assert got.dtype == dtype
        np.testing.assert_array_equal(got, want)


def test_resize_linear_of_i64_is_refused_with_the_fix():
    x = np.zeros((1, 1, 2, 2), np.int64)
    model = _model("Resize", {"x": x}, {"scales": np.array([1, 1, 2, 2], np.float32)},
                   input_order=["x", "", "scales"], mode="linear")
    with pytest.raises(OnnxImportError, match="cast it to float first"):
        import_onnx(model)


def test_resize_needs_constant_scales():
    x = _randn(1, 1, 2, 2)
    scales = np.array([1, 1, 2, 2], np.float32)
    model = _model("Resize", {"x": x, "scales": scales}, {}, input_order=["x", "", "scales"])
    with pytest.raises(OnnxImportError, match="must be known at import time.*graph input 'scales'"):
        import_onnx(model)


def test_rms_normalization_of_f16_computes_in_float32():
    x = (_randn(2, 8) * 100).astype(np.float16)
    scale = _randn(8).astype(np.float16)
    model = _model("RMSNormalization", {"x": x}, {"scale": scale}, opset=23)
    xf = x.astype(np.float32)
    want = (xf / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True) + 1e-5)).astype(np.float16) * scale
    for backend in (PartitaBackend, PartitaTorchBackend):
        (got,) = backend.prepare(model).run({"x": x})
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=1e-3)


@pytest.mark.parametrize("op, opset, consts", [
    ("LayerNormalization", 17, {"scale": _randn(8).astype(np.float16), "bias": _randn(8).astype(np.float16)}),
    ("GroupNormalization", 21, {"scale": _randn(4).astype(np.float16), "bias": _randn(4).astype(np.float16)}),
])
def test_layer_and_group_norm_of_f16_match_onnx_s_function_body(op, opset, consts):
    """Statistics in float32 (stash_type), the result cast back to f16 before the scale and
    bias: the function body's order, which onnx's reference evaluator runs."""
    from onnx.reference import ReferenceEvaluator

    x = (_randn(2, 4, 8) * 30 + 5).astype(np.float16)
    attrs = {"num_groups": 2} if op == "GroupNormalization" else {}
    model = _model(op, {"x": x}, consts, opset=opset, **attrs)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    for backend in (PartitaBackend, PartitaTorchBackend):
        (got,) = backend.prepare(model).run({"x": x})
        assert got.dtype == np.float16
        np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=2e-3, atol=2e-3)


def test_group_normalization_rejects_groups_that_do_not_divide_the_channels():
    x = _randn(1, 6, 2, 2)
    model = _model("GroupNormalization", {"x": x}, {"s": _randn(6), "b": _randn(6)}, opset=21, num_groups=4)
    with pytest.raises(OnnxImportError, match="num_groups 4 must be positive and divide the 6 channels"):
        import_onnx(model)


def test_lp_normalization_refuses_p_3():
    x = _randn(2, 3)
    with pytest.raises(OnnxImportError, match="p 3 must be 1 or 2"):
        import_onnx(_model("LpNormalization", {"x": x}, {}, p=3))


def test_rotary_embedding_refuses_an_odd_rotary_dim():
    x = _randn(1, 2, 3, 8)
    cache = _randn(3, 2)
    model = _model("RotaryEmbedding", {"x": x}, {"cos": cache, "sin": cache, "pos": np.zeros((1, 3), np.int64)},
                   opset=23, rotary_embedding_dim=5)
    with pytest.raises(OnnxImportError, match="rotary_embedding_dim 5 must be even"):
        import_onnx(model)


def test_attention_3d_inputs_need_the_head_counts():
    q = _randn(1, 2, 8)
    model = _model("Attention", {"q": q, "k": q, "v": q}, {}, opset=23)
    with pytest.raises(OnnxImportError, match="need both q_num_heads and kv_num_heads"):
        import_onnx(model)


def test_softmax_cross_entropy_mean_with_weights_and_ignore_index_matches_onnxruntime():
    x = _randn(4, 5, 3)
    t = _rng.integers(0, 5, (4, 3)).astype(np.int64)
    t[0, 0] = -1
    model = _model("SoftmaxCrossEntropyLoss", {"x": x, "t": t}, {"w": np.abs(_randn(5))}, n_out=2,
                   ignore_index=-1)
    _check(model, {"x": x, "t": t}, rtol=1e-5)


def test_einsum_of_integers_is_exact():
    ins = {"a": _rng.integers(-50, 50, (2, 3, 3)).astype(np.int64),
           "b": _rng.integers(-50, 50, (3, 4)).astype(np.int64)}
    _check(_model("Einsum", ins, {}, equation="bii,ij->bj"), ins, rtol=0, atol=0)


def test_plain_f32_attention_is_the_fused_op_and_softcap_composes():
    q = _randn(1, 2, 3, 4)
    ins = {"q": q, "k": _randn(1, 2, 5, 4), "v": _randn(1, 2, 5, 4)}
    plain = import_onnx(_model("Attention", ins, {}, opset=23, is_causal=1))
    assert "attention" in {node.op for node in plain.nodes}
    capped = import_onnx(_model("Attention", ins, {}, opset=23, softcap=2.0))
    assert "attention" not in {node.op for node in capped.nodes}


def test_group_normalization_18_takes_one_scale_and_bias_per_group():
    from onnx.reference import ReferenceEvaluator

    x = _randn(2, 6, 3)
    model = _model("GroupNormalization", {"x": x}, {"scale": _randn(3), "bias": _randn(3)}, opset=18, num_groups=3)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    for backend in (PartitaBackend, PartitaTorchBackend):
        (got,) = backend.prepare(model).run({"x": x})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
