"""ONNX Col2Im (opset 18; the dynamo exporter writes it for ``F.fold``): against onnxruntime
on both executors, with strides, dilations and asymmetric pads, overlapping blocks, a 3-D image,
and the inverse of torch's ``F.unfold`` through an exported model."""

from __future__ import annotations

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")
from onnx import helper, numpy_helper  # noqa: E402

from partita.frontend.onnx import OnnxImportError, import_onnx  # noqa: E402
from partita.frontend.onnx.backend import PartitaBackend, PartitaTorchBackend  # noqa: E402

_rng = np.random.default_rng(0)


def _col2im_model(x: np.ndarray, image: list[int], block: list[int], **attrs) -> object:
    """A one-node Col2Im model: input x, image_shape and block_shape as initializers."""
    node = helper.make_node("Col2Im", ["x", "image_shape", "block_shape"], ["y"], **attrs)
    inits = [numpy_helper.from_array(np.array(image, np.int64), "image_shape"),
             numpy_helper.from_array(np.array(block, np.int64), "block_shape")]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", 1, x.shape)],
                              [helper.make_empty_tensor_value_info("y")], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _blocks(image: list[int], block: list[int], strides: list[int], dil: list[int], pads: list[int]) -> int:
    nd = len(image)
    out = 1
    for d in range(nd):
        out *= (image[d] + pads[d] + pads[nd + d] - (dil[d] * (block[d] - 1) + 1)) // strides[d] + 1
    return out


@pytest.mark.parametrize("image, block, strides, dil, pads", [
    ([5, 5], [2, 2], [1, 1], [1, 1], [0, 0, 0, 0]),          # overlapping blocks add up
    ([8, 8], [2, 2], [2, 2], [1, 1], [0, 0, 0, 0]),          # MobileViT's patches: no overlap
    ([7, 6], [3, 2], [2, 1], [2, 1], [1, 0, 2, 1]),          # dilation, asymmetric pads
    ([4, 5, 3], [2, 3, 1], [1, 2, 1], [1, 1, 1], [0, 1, 0, 1, 0, 0]),  # a 3-D image
])
def test_col2im_matches_onnxruntime(image, block, strides, dil, pads):
    l = _blocks(image, block, strides, dil, pads)
    x = _rng.standard_normal((2, 3 * int(np.prod(block)), l)).astype(np.float32)
    model = _col2im_model(x, image, block, strides=strides, dilations=dil, pads=pads)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for backend in (PartitaBackend, PartitaTorchBackend):
        got = backend.prepare(model).run({"x": x})
        np.testing.assert_allclose(np.asarray(got[0]), want[0], rtol=1e-5, atol=1e-6)


def test_col2im_equals_torch_fold():
    """Col2Im is torch's F.fold: same result on the same columns (kernel 3, stride 2, pad 1, dilation 2)."""
    x = torch.randn(2, 4 * 9, _blocks([9, 8], [3, 3], [2, 2], [2, 2], [1, 1, 1, 1]))
    want = torch.nn.functional.fold(x, (9, 8), 3, dilation=2, padding=1, stride=2)
    model = _col2im_model(x.numpy(), [9, 8], [3, 3], strides=[2, 2], dilations=[2, 2], pads=[1, 1, 1, 1])
    got = PartitaBackend.prepare(model).run({"x": x.numpy()})[0]
    np.testing.assert_allclose(np.asarray(got), want.numpy(), rtol=1e-5, atol=1e-6)


def test_col2im_rejects_columns_that_do_not_fit_the_blocks():
    x = np.zeros((1, 8, 5), np.float32)                     # 2x2 blocks over 4x4 make 9 columns, not 5
    with pytest.raises(OnnxImportError, match="must be \\[N, C \\* 4, 9\\]"):
        import_onnx(_col2im_model(x, [4, 4], [2, 2]))


class _FoldUnfold(torch.nn.Module):
    """MobileViT's unfold to patches and fold back, with a product between."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cols = torch.nn.functional.unfold(x, kernel_size=2, stride=2)
        return torch.nn.functional.fold(cols * 2.0 + 1.0, output_size=(8, 6), kernel_size=2, stride=2)


def test_fold_exported_by_the_dynamo_exporter_imports(tmp_path):
    """``F.fold`` exported by torch.onnx's dynamo exporter becomes Col2Im, which imports and
    equals eager."""
    pytest.importorskip("onnxscript")
    x = torch.randn(2, 3, 8, 6)
    path = tmp_path / "fold.onnx"
    torch.onnx.export(_FoldUnfold().eval(), (x,), str(path), dynamo=True, opset_version=18)
    import onnx

    proto = onnx.load(str(path))
    assert "Col2Im" in {n.op_type for n in proto.graph.node}
    got = PartitaBackend.prepare(proto).run({proto.graph.input[0].name: x.numpy()})[0]
    np.testing.assert_allclose(np.asarray(got), _FoldUnfold()(x).numpy(), rtol=1e-5, atol=1e-6)
