"""Recomputation by layer (partita/autodiff/recompute.py: recompute_layers, recomputed_nodes).

On a 2-layer GPT-2 (imported as the pipeline tests import it): every policy gives the same
step outputs as none on the reference interpreter; "full" keeps fewer activation bytes and
adds between half and one forward's matmul FLOPs (the cone the backward needs: the output
projections, whose backward reads only their input, are not rerun); the marks survive
clone, the text form and cse; a bad policy is refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest

B, T = 8, 16
POLICIES = ("none", "cheap", "selective", "full")


@pytest.fixture(scope="module")
def gpt2():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from partita.frontend.torch_export import import_torch
    from partita.passes.manager import PassManager
    from partita.runtime.demo import gpt2_from_config

    torch.manual_seed(0)
    m, cfg = gpt2_from_config(layers=2)
    fwd = import_torch(m, (torch.randint(0, cfg.vocab_size, (B, T)),))
    fwd = PassManager.parse("split-projections").run(fwd)
    rng = np.random.default_rng(0)
    inputs = {"ids": rng.integers(0, cfg.vocab_size, (B, T)).astype(np.int64),
              "target": rng.integers(0, cfg.vocab_size, (B, T)).astype(np.int64)}
    return fwd, inputs


@pytest.fixture(scope="module")
def steps(gpt2):
    from partita.autodiff.training import training_step

    fwd, _ = gpt2
    return {p: training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.05, momentum=0.9, recompute=p)
            for p in POLICIES}


def _run(step, inputs):
    from partita.backend.numpy_ref import run

    return run(step, {**{k: np.asarray(a) for k, a in step.weights.items()}, **inputs})


def _flops(graph, ops=None) -> int:
    from partita.ops.registry import OPS

    total = 0
    for n in graph.nodes:
        if ops is not None and n.op not in ops:
            continue
        c = OPS[n.op].cost_of([v.type for v in n.operands], [r.type for r in n.results], n.attrs)
        total += int(c.flops)
    return total


@pytest.mark.parametrize("policy", POLICIES[1:])
def test_every_policy_gives_the_same_step(gpt2, steps, policy):
    from partita.autodiff.recompute import recompute_policy_of, recomputed_nodes

    _, inputs = gpt2
    want = _run(steps["none"], inputs)
    got = _run(steps[policy], inputs)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert recomputed_nodes(steps[policy])
    assert recompute_policy_of(steps[policy]) == policy
    assert not recomputed_nodes(steps["none"]) and recompute_policy_of(steps["none"]) == "none"


def test_full_keeps_only_layer_inputs_and_adds_about_a_forward(gpt2, steps):
    from partita.autodiff.recompute import analyze
    from partita.ir.layers import node_layer

    fwd, _ = gpt2
    none, sel, full = (analyze(steps[p]) for p in ("none", "selective", "full"))
    assert full.saved_bytes < sel.saved_bytes <= none.saved_bytes
    assert full.saved_bytes < none.saved_bytes / 3
    # The layers' forward matmul FLOPs (the head's is outside every layer, never recomputed).
    layer_mm = sum(_flops_node(n) for n in fwd.nodes if n.op in ("matmul", "attention") and node_layer(n))
    extra = _flops(steps["full"]) - _flops(steps["none"])
    assert 0.5 * layer_mm <= extra <= 1.0 * layer_mm, (extra, layer_mm)
    assert _flops(steps["selective"]) >= _flops(steps["none"])


def _flops_node(n) -> int:
    from partita.ops.registry import OPS

    return int(OPS[n.op].cost_of([v.type for v in n.operands], [r.type for r in n.results], n.attrs).flops)


def test_clones_sit_in_their_layers_backward_before_its_first_reader(steps):
    from partita.autodiff.recompute import backward_start, recomputed_nodes
    from partita.ir.layers import node_layer

    g = steps["full"]
    nodes = list(g.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    start = pos[backward_start(g)]
    rc = recomputed_nodes(g)
    layers = {node_layer(n) for n in rc}
    assert layers == {"lm.transformer.h.0", "lm.transformer.h.1"}
    for n in rc:
        assert pos[n] > start
        assert n.loc is not None and n.loc.recompute == "full"
        for r in n.results:
            for u in r.users:
                assert u in rc or node_layer(u) == node_layer(n)
    # No forward value of a layer is read by that layer's own backward any more, except
    # through recomputation: only layer inputs (other layers' or the embeddings' values) stay.
    for u in nodes[start:]:
        if u in rc:
            continue
        for v in u.operands:
            p = v.producer
            if p is not None and pos[p] < start and node_layer(p):
                assert node_layer(p) != node_layer(u), (u, v)


def test_marks_survive_clone_text_and_cse(steps):
    from partita.autodiff.recompute import recomputed_nodes
    from partita.ir.parser import parse
    from partita.ir.printer import print_graph
    from partita.passes.manager import PassManager

    g = steps["full"]
    n = len(recomputed_nodes(g))
    assert len(recomputed_nodes(g.clone())) == n
    text = print_graph(g)
    assert 'recompute "full"' in text
    back = parse(text)
    assert len(recomputed_nodes(back)) == n and print_graph(back) == text
    cleaned = PassManager.parse("canonicalize,cse,dce").run(g.clone())
    assert len(recomputed_nodes(cleaned)) == n


def test_recompute_pass_and_bad_policy(steps):
    from partita.autodiff.grad import AutodiffError
    from partita.autodiff.recompute import recompute_policy, recomputed_nodes
    from partita.passes.manager import PassManager

    g = PassManager.parse("recompute{policy=full}").run(steps["none"].clone())
    assert len(recomputed_nodes(g)) == len(recomputed_nodes(steps["full"]))
    assert recompute_policy(True) == "cheap" and recompute_policy(False) == "none"
    with pytest.raises(AutodiffError, match="did you mean 'full'"):
        recompute_policy("fulll")


@pytest.mark.parametrize("policy", ["selective", "full"])
def test_dropout_is_recomputed_with_its_mask(policy):
    """A training dropout's mask is a hash of its seed and indices: recomputing the layer
    draws it again, so the recomputed step equals the plain one and the attention probs'
    dropout is not saved."""
    import partita

    g = partita.models.gpt(layers=2, hidden=32, heads=4, seq=16, vocab=64, batch=2, dtype="f32", attention="eager",
                           dropout=0.2)
    plain = partita.training_step(g, loss="cross_entropy", optimizer=None)
    step = partita.training_step(g, loss="cross_entropy", optimizer=None, recompute=policy)
    again = [n for n in step.nodes if n.op == "dropout" and n.loc is not None and n.loc.recompute == policy]
    assert len(again) >= 2          # each layer's attention-probs dropout at least
    rng = np.random.default_rng(0)
    w = {str(v.name): (rng.standard_normal(v.type.shape) * 0.2).astype(np.float32)
         for v in plain.inputs if v.role == "param"}
    feed = {"ids": rng.integers(0, 64, (2, 16)), "target": rng.integers(0, 64, (2, 16))}
    for a, b in zip(partita.run(step, feed, w), partita.run(plain, feed, w)):
        np.testing.assert_array_equal(a, b)
