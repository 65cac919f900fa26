"""split-projections: a fused projection whose result is split becomes one projection per
piece, with the same outputs; tensor parallelism then splits GPT-2's attention by heads."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import partita
from partita.ir.printer import value_names

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "autodiff"))
from test_training import gpt2  # noqa: E402

FUSED = """graph @g(%x: f32[8,4], %w: f32[4,6] param, %b: f32[6] param) -> (f32[2,4,2], f32[2,4,4]) {
  %y = matmul(%x, %w) : f32[8,6]
  %z = add(%y, %b) : f32[8,6]
  %r = reshape(%z) {shape=[2, 4, 6]} : f32[2,4,6]
  %q, %kv = split(%r) {axis=2, sizes=[2, 4]} : f32[2,4,2], f32[2,4,4]
  return %q, %kv
}"""


def _weights(g):
    rng = np.random.default_rng(0)
    for v in g.inputs:
        if v.role == "param":
            g.weights[v.name] = rng.standard_normal(v.type.shape).astype(np.float32)
    return {"x": rng.standard_normal((8, 4)).astype(np.float32)}


def test_fused_projection_is_split_with_the_same_outputs():
    g = partita.parse(FUSED)
    x = _weights(g)
    want = partita.run(g, x, g.weights)
    w = np.array(g.weights["w"])
    h = partita.optimize(g.clone(), "split-projections")
    partita.verify(h)
    assert [v.name for v in h.inputs if v.role == "param"] == ["w.split0", "b.split0", "w.split1", "b.split1"]
    assert sorted(h.weights) == ["b.split0", "b.split1", "w.split0", "w.split1"]
    np.testing.assert_array_equal(h.weights["w.split1"], w[:, 2:])
    assert sum(1 for n in h.nodes if n.op == "matmul") == 2 and not any(n.op == "split" for n in h.nodes)
    for a, b in zip(partita.run(h, x, h.weights), want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("change", ["weight used twice", "split on another axis", "no param"])
def test_other_patterns_are_left_alone(change):
    text = FUSED
    if change == "weight used twice":
        text = text.replace("return %q, %kv", "%t = transpose(%w) {perm=[1, 0]} : f32[6,4]\n  return %q, %kv")
    elif change == "split on another axis":
        text = text.replace("{axis=2, sizes=[2, 4]} : f32[2,4,2], f32[2,4,4]", "{axis=0, sizes=[1, 1]} : f32[1,4,6], f32[1,4,6]")
        text = text.replace("-> (f32[2,4,2], f32[2,4,4])", "-> (f32[1,4,6], f32[1,4,6])")
    else:
        text = text.replace("%w: f32[4,6] param", "%w: f32[4,6]")
    g = partita.parse(text)
    before = g.clone()
    partita.optimize(g, "split-projections")
    assert g.diff(before) is None


def test_gpt2_attention_splits_by_heads_after_it():
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (2, 16))
    fwd = partita.import_torch(gpt2(2).eval(), (ids,))
    g = partita.optimize(fwd.clone(), "split-projections")
    (inp,) = [v.name for v in fwd.inputs if v.role == "input"]
    np.testing.assert_allclose(partita.run(g, {inp: ids.numpy()}, g.weights)[0],
                               partita.run(fwd, {inp: ids.numpy()}, fwd.weights)[0], rtol=1e-5, atol=1e-5)
    step = partita.training_step(g, loss="cross_entropy", optimizer=None)
    prog = partita.parallelize(step, "tp=2", "megatron")
    # Per layer: q, k, v and fc column-parallel, the two output projections row-parallel.
    # Besides: the vocab-parallel embedding's lookup (forward) and the tied LM head's input
    # gradient (backward), and the loss's own all_reduces (inside).
    names = value_names(prog.graph)
    looked_up = {names[n.results[0]] for n in prog.graph.nodes if n.op == "embedding"}
    layer = [c for c in prog.plan.collectives if not c["inside"] and c["value"] not in looked_up]
    assert sum(c["op"] == "all_reduce" and c["phase"] == "forward" for c in layer) == 4, prog.plan.text()
    assert sum(c["op"] == "all_reduce" and c["phase"] == "backward" for c in layer) == 4 + 1, prog.plan.text()
    assert not any("c_attn" in n for n in prog.plan.notes), prog.plan.notes
