"""Regression tests for argument checks the fuzzing campaign (tests/fuzz/campaign.py) found
missing: each call once raised a TypeError, AttributeError, ValueError or IndexError from
deep inside partita instead of a PartitaError that names the argument."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita import Builder, PartitaError

TEXT = """graph @mlp(%x: f32[4,8], %w: f32[8,4] param) -> (f32[4,4]) {
  %0 = matmul(%x, %w) : f32[4,4]
  %1 = relu(%0) : f32[4,4]
  return %1
}
"""


@pytest.fixture
def g():
    return partita.parse(TEXT, "api.pir")


@pytest.mark.parametrize("junk", [1.5, [], {}, "x", None])
def test_verify_of_a_non_graph(junk):
    with pytest.raises(PartitaError, match=r"verify: the graph must be a partita.Graph"):
        partita.verify(junk)


@pytest.mark.parametrize("kwargs, match", [
    ({"loss": 7}, r"loss=7, but @mlp has 1 output"),
    ({"loss": -1}, r"loss=-1, but @mlp has 1 output"),
    ({"loss": iter([1])}, r"loss must be None, the index"),
    ({"loss": 1.5}, r"loss must be None, the index"),
    ({"loss": True}, r"loss must be None, the index"),
    ({"loss": "cross_entropy", "optimizer": np.zeros((2, 2))}, r"unknown optimizer"),
    ({"loss": "cross_entropy", "optimizer": "adam"}, r"unknown optimizer 'adam'"),
    ({"loss": "cross_entropy", "junk": 7}, r"unknown option\(s\) junk for optimizer 'adamw'; its options are lr"),
    ({"loss": "cross_entropy", "optimizer": "sgd", "beta1": 0.9}, r"unknown option\(s\) beta1 for optimizer 'sgd'"),
    ({"loss": "cross_entropy", "optimizer": None, "lr": 0.1}, r"lr need an optimizer"),
])
def test_training_step_arguments(g, kwargs, match):
    with pytest.raises(PartitaError, match=match):
        partita.training_step(g, **kwargs)


def test_training_step_of_a_non_graph():
    with pytest.raises(PartitaError, match=r"training_step: the forward graph must be a partita.Graph, got dict"):
        partita.training_step({}, loss="cross_entropy")


def test_training_step_still_takes_its_options(g):
    step = partita.training_step(g, loss="cross_entropy", optimizer="sgd", lr=0.1, momentum=0.9)
    assert [v.name for v in step.inputs][:2] == ["x", "w"]


@pytest.mark.parametrize("kwargs, match", [
    ({"junk": 1}, r"optimize: unknown option\(s\) junk; the options are verify_each"),
    ({"print_ir_after": float("nan")}, r"print_ir_after: give pass names"),
    ({"print_ir_before": [1]}, r"print_ir_before: pass names are strings, got int"),
    ({"verify_each": np.zeros(3)}, r"verify_each must be True or False, got ndarray"),
    ({"timing": "yes"}, r"timing must be True or False, got str"),
])
def test_optimize_options(g, kwargs, match):
    with pytest.raises(PartitaError, match=match):
        partita.optimize(g, "dce", reproducer_dir=None, **kwargs)


def test_optimize_still_takes_its_options(g):
    out = partita.optimize(g, "cse,dce", verify_each=False, print_ir_after=["dce"], out=__import__("io").StringIO(),
                           reproducer_dir=None)
    assert [n.op for n in out.nodes] == ["matmul", "relu"]


@pytest.mark.parametrize("junk", [7, np.array(["a"]), None, ("add",)])
def test_emit_of_a_non_string_op(g, junk):
    with pytest.raises(PartitaError, match=r"emit: an op is named by a string"):
        Builder(g).emit(junk, g.inputs[0])


@pytest.mark.parametrize("options, match", [
    ({"junk": 0}, r"parallelize: unknown option\(s\) junk; the options are allow_replication, bucket_mb"),
    ({"junk": 0, "bucket": 1}, r"unknown option\(s\) bucket, junk;"),
])
def test_parallelize_unknown_options(g, options, match):
    step = partita.training_step(g, loss="cross_entropy", optimizer="sgd", lr=0.1)
    with pytest.raises(PartitaError, match=match):
        partita.parallelize(step, "dp=2", "dp", **options)


def test_parallelize_still_takes_its_options(g):
    step = partita.training_step(g, loss="cross_entropy", optimizer="sgd", lr=0.1)
    assert partita.parallelize(step, "dp=2", "dp", bucket_mb=None, order=False) is not None


@pytest.mark.parametrize("junk", [0, None, b"graph", ["x"]])
def test_parse_of_a_non_string(junk):
    with pytest.raises(PartitaError, match=r"partita.parse: text must be the .pir text as a str, got"):
        partita.parse(junk)


@pytest.mark.parametrize("junk, match", [
    (0, r"partita.load: the path must be a str or os.PathLike naming a .pir file, got 0 \(int\)"),
    ([], r"partita.load: the path must be a str or os.PathLike"),
    ("", r"partita.load: an empty path names no file"),
    ("a\x00b.pir", r"partita.load: the path 'a\\x00b.pir' contains a NUL byte"),
])
def test_load_paths(junk, match):
    with pytest.raises(PartitaError, match=match):
        partita.load(junk)


def test_load_still_reads_a_file(g, tmp_path):
    partita.save(g, tmp_path / "m.pir")
    assert partita.print_graph(partita.load(tmp_path / "m.pir")) == partita.print_graph(g)
    assert partita.load(str(tmp_path / "m.pir")).name == "mlp"


@pytest.mark.parametrize("junk", ["", None, 0, {"x": 1}])
def test_print_graph_of_a_non_graph(junk):
    with pytest.raises(PartitaError, match=r"partita.print_graph: the graph must be a partita.Graph"):
        partita.print_graph(junk)


@pytest.mark.parametrize("junk", [np.zeros((2, 2)), np.array("numpy"), None, 1, ["numpy"]])
def test_run_backend_not_a_string(g, junk):
    with pytest.raises(PartitaError, match=r"partita.run: backend must be 'numpy' or 'torch', got"):
        partita.run(g, {"x": np.zeros((4, 8), np.float32)}, {"w": np.ones((8, 4), np.float32)}, backend=junk)


@pytest.mark.parametrize("junk, match", [
    ("", r"partita.import_onnx: an empty path names no file"),
    ("a\x00b.onnx", r"partita.import_onnx: the path 'a\\x00b.onnx' contains a NUL byte"),
    (b"a\x00b.onnx", r"contains a NUL byte"),
])
def test_import_onnx_paths(junk, match):
    pytest.importorskip("onnx")
    with pytest.raises(PartitaError, match=match):
        partita.import_onnx(junk)


@pytest.mark.parametrize("junk, match", [
    (0, r"partita.import_onnx: input_shapes must be a mapping from input name to shape.*got 0 \(int\)"),
    ([1, 2], r"input_shapes must be a mapping"),
    ("x", r"input_shapes must be a mapping"),
    ({1: [2]}, r"input_shapes is keyed by the ONNX input's name, got the key 1 \(int\)"),
])
def test_import_onnx_input_shapes(junk, match):
    pytest.importorskip("onnx")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import campaign

    with pytest.raises(PartitaError, match=match):
        partita.import_onnx(campaign.onnx_models()[0], input_shapes=junk)
