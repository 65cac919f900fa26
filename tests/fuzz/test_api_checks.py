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
