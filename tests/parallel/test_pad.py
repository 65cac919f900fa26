"""Vocabulary padding (partita.parallel.pad): the padded graph means what the original means,
and megatron splits a vocabulary that the tp axis does not divide."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import partita
from partita.ir.builder import Builder
from partita.ir.dtypes import f32, i64
from partita.ir.graph import Graph
from partita.ir.types import TensorType
from partita.parallel.pad import cut_array, pad_array, pad_dims

E = 8


def _step(vocab: int, *, n: int = 8, optimizer: str = "sgd", smoothing: float = 0.0, logits_rank: int = 2,
          tied: bool = True, softmax_out: bool = False, reduction: str = "mean") -> Graph:
    """A tiny LM step: embedding, tanh, a head (the table transposed, or its own weight), and
    cross_entropy over the vocabulary."""
    g = Graph("lm")
    b = Builder(g)
    w = g.add_input("w", TensorType((vocab, E), f32), "param")
    head = w if tied else g.add_input("head", TensorType((E, vocab), f32), "param")
    ids = g.add_input("ids", TensorType((n,), i64), "input")
    t = g.add_input("t", TensorType((n,) if logits_rank == 2 else (n // 2, 2), i64), "input")
    h = b.tanh(b.embedding(w, ids))
    logits = b.matmul(h, b.transpose(w, perm=(1, 0)) if tied else head)
    if logits_rank == 3:  # [N, C, d]: classes on dim 1, reached through a reshape and a transpose
        logits = b.transpose(b.reshape(logits, shape=(n // 2, 2, vocab)), perm=(0, 2, 1))
    loss = b.cross_entropy(logits, t, reduction=reduction, label_smoothing=smoothing)
    if reduction == "none":
        loss = b.sum(b.mul(loss, loss))
    outs = [loss]
    if softmax_out:  # a consumer that needs the whole, real vocabulary
        outs.append(b.softmax(logits, axis=1))
    g.set_outputs(outs)
    if softmax_out:  # the forward alone: training_step keeps the loss output only
        return g
    return partita.training_step(g, loss=0, optimizer=optimizer, lr=0.1)


def gpt2_forward(vocab: int) -> Graph:
    """The forward graph (ids [2, 8] -> logits) of a one-layer GPT-2, 32 wide, with
    ``vocab`` words, built from a config (random weights, seed 0)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=vocab, n_positions=16, use_cache=False,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = GPT2LMHeadModel(cfg)

        def forward(self, ids):
            return self.lm(ids).logits

    return partita.import_torch(Logits().eval(), (torch.randint(0, vocab, (2, 8)),))


def _data(step: Graph, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    t_shape = next(v.type.shape for v in step.inputs if v.name == "t")
    n = next(v.type.shape for v in step.inputs if v.name == "ids")
    feed = {"ids": rng.integers(0, vocab, n), "t": rng.integers(0, vocab, t_shape)}
    weights = {str(v.name): (rng.standard_normal(v.type.shape).astype(np.float32) if v.role == "param"
                             else np.zeros(v.type.shape, np.float32)) for v in step.inputs if v.role != "input"}
    return feed, weights


def _close(got, want, what="", adamw=False):
    """Equal outputs: elementwise (rtol 2e-5), or for an AdamW step per tensor by norm at 1e-4
    (its first step moves a param by about lr * g / (|g| + eps), so an entry whose gradient
    is rounding noise moves differently for two summation orders; docs/parallel.md)."""
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(got, want)):
        assert np.shape(a) == np.shape(b), (what, i, np.shape(a), np.shape(b))
        if adamw:
            x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
            err = np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-6 * np.sqrt(max(y.size, 1)))
            assert err <= 1e-4, f"{what} output {i}: relative error {err:.2e}"
        else:
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6,
                                       err_msg=f"{what} output {i}")


def _padded_run(step: Graph, multiple: int, feed, weights):
    """pad_dims on a clone seeded at the table's rows; run it on zero-padded weights; cut."""
    g = step.clone()
    w = next(v for v in g.inputs if v.name == "w")
    seeds = [(w, 0)]
    for node in g.nodes:
        if node.op == "cross_entropy":
            lg = node.operands[0]
            seeds.append((lg, 1 if lg.type.rank >= 2 else 0))
    rep = pad_dims(g, seeds, multiple)
    padded = {k: pad_array(a, rep.inputs.get(k, {}), next(v for v in g.inputs if v.name == k).type.shape)
              for k, a in weights.items()}
    outs = partita.run(g, feed, padded)
    return g, rep, [cut_array(o, rep.outputs[i]) if i in rep.outputs else o for i, o in enumerate(outs)]


@pytest.mark.parametrize("kw", [
    {}, {"optimizer": "adamw"}, {"logits_rank": 3}, {"tied": False}, {"reduction": "sum"},
    {"reduction": "none"}, {"smoothing": 0.1}, {"softmax_out": True},
])
def test_the_padded_graph_gives_the_original_results(kw):
    vocab = 10
    step = _step(vocab, **kw)
    feed, weights = _data(step, vocab)
    want = partita.run(step, feed, weights)
    g, rep, got = _padded_run(step, 4, feed, weights)
    assert rep.size == 10 and rep.padded == 12
    assert rep.inputs["w"] == {0: 10}
    if not kw.get("tied", True):
        assert rep.inputs["head"] == {1: 10}
    _close(got, want, str(kw), adamw=kw.get("optimizer") == "adamw")
    cuts = " ".join(rep.cut)
    if kw.get("smoothing"):
        assert "cross_entropy (smooths the labels over every class)" in rep.cut
    elif kw.get("softmax_out"):
        assert "softmax" in cuts
    else:
        # On the plain paths the padding goes all the way: nothing is cut back.
        assert not rep.cut, rep.cut


def test_a_new_param_keeps_zeros_in_its_padding():
    """Every padded param and state output is zero in its padding after a step (the next
    step's input must be zero-padded), and the loss's gradient is zero on padded classes."""
    step = _step(10, optimizer="adamw")
    feed, weights = _data(step, 10)
    g = step.clone()
    rep = pad_dims(g, [(next(v for v in g.inputs if v.name == "w"), 0)], 4)
    padded = {k: pad_array(a, rep.inputs.get(k, {}), next(v for v in g.inputs if v.name == k).type.shape)
              for k, a in weights.items()}
    outs = partita.run(g, feed, padded)
    aliased = [i for i, a in enumerate(g.output_aliases) if a is not None and a.name in rep.inputs]
    assert len(aliased) == 3  # the table and AdamW's two moments
    for i in aliased:
        assert i in rep.outputs
        assert not np.any(np.asarray(outs[i])[10:]), f"output {i} has non-zeros in its padding"


def test_nothing_is_padded_when_the_axis_divides():
    step = _step(12)
    g = step.clone()
    rep = pad_dims(g, [(next(v for v in g.inputs if v.name == "w"), 0)], 4)
    assert not rep and rep.inputs == {}
    assert g.diff(step) is None


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocab=st.integers(3, 23), multiple=st.sampled_from([2, 3, 4, 8]), seed=st.integers(0, 2 ** 16),
       optimizer=st.sampled_from(["sgd", "adamw"]), logits_rank=st.sampled_from([2, 3]))
def test_random_paddings_keep_the_meaning(vocab, multiple, seed, optimizer, logits_rank):
    step = _step(vocab, optimizer=optimizer, logits_rank=logits_rank)
    feed, weights = _data(step, vocab, seed)
    want = partita.run(step, feed, weights)
    _, _, got = _padded_run(step, multiple, feed, weights)
    _close(got, want, adamw=optimizer == "adamw")


@pytest.mark.parametrize("mesh, strategy", [("tp=4", "megatron"), ("tp=3", "megatron"),
                                            ("dp=2,tp=4", "dp+megatron"), ("dp=2,tp=2", "zero1+megatron"),
                                            ("tp=2", "megatron+sp"), ("dp=2,tp=2", "zero3+megatron")])
@pytest.mark.parametrize("tied", [True, False])
def test_megatron_splits_a_padded_vocabulary(mesh, strategy, tied):
    vocab = 10 if "tp=4" in mesh else 11
    step = _step(vocab, tied=tied, optimizer="adamw")
    feed, weights = _data(step, vocab, 1)
    prog = partita.parallelize(step, mesh, strategy)
    notes = "\n".join(prog.plan.notes)
    assert "%w padded from" in notes and "%w is vocab-parallel over 'tp'" in notes, notes
    tp = prog.mesh.axis_size("tp")
    rows = -(-vocab // tp)
    w_local = next(v for v in prog.local.inputs if v.name == "w")
    assert w_local.type.shape[0] in (rows, rows // 2), w_local.type  # zero1/zero3 halve it again over dp
    if not tied:
        head = next(v for v in prog.local.inputs if v.name == "head")
        assert head.type.shape[1] in (rows, rows // 2), head.type
    want = partita.run(step, feed, weights)
    got = prog.simulate(feed, weights)
    _close(got, want, f"{mesh} {strategy}", adamw=True)
    # The ranks' pieces assemble to the real sizes; the padding holds zeros.
    shards = prog.shard_weights(weights)
    back = prog.assemble_weights(shards)
    for k, a in weights.items():
        np.testing.assert_array_equal(back[k], a)


def test_an_id_in_the_padding_is_out_of_range_on_every_rank():
    """Ids 10 and 11 exist in the padded table (tp=4 pads 10 rows to 12) but not in the
    model: the lookup and the loss check against the real vocabulary, as unsplit."""
    from partita.parallel.interpreter import MeshRunError

    step = _step(10)
    feed, weights = _data(step, 10)
    prog = partita.parallelize(step, "tp=4", "megatron")
    for which in ("ids", "t"):
        bad = {k: v.copy() for k, v in feed.items()}
        bad[which][2] = 11
        with pytest.raises((partita.PartitaError, MeshRunError), match="out of range"):
            prog.simulate(bad, weights)
        with pytest.raises(partita.PartitaError, match="out of range"):
            partita.run(step, bad, weights)


def test_gpt2_with_an_odd_vocabulary_is_vocab_parallel():
    """GPT-2's own vocabulary (50,257) is odd; a small config with 67 words stands in for it:
    the tied table, the logits and the AdamW state are padded to 68 and split."""
    vocab = 67
    fwd = partita.optimize(gpt2_forward(vocab), "split-projections")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.1)
    prog = partita.parallelize(step, "dp=2,tp=2", "dp+megatron")
    table = "lm.transformer.wte.weight"
    assert f"%{table} padded from 67 to 68 along dim 0 so that 'tp' (size 2) splits it; the extra entries " \
           "hold zeros" in prog.plan.notes, prog.plan.notes
    assert next(v for v in prog.local.inputs if v.name == table).type.shape == (34, 32)
    (name,) = [v.name for v in fwd.inputs if v.role == "input"]
    rng = np.random.default_rng(2)
    feed = {name: rng.integers(0, vocab, (2, 8)), "target": rng.integers(0, vocab, (2, 8))}
    want = partita.run(step, feed)
    got = prog.simulate(feed)
    for a, b in zip(got, want):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        assert a.shape == b.shape
        # The relative error per tensor, with the norm taken as at least 1e-6 per entry (the
        # key bias's gradient is rounding noise; docs/parallel.md "Limits").
        assert np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-6 * np.sqrt(max(b.size, 1))) < 1e-5


def test_a_checkpoint_of_a_padded_table_holds_the_real_rows_and_loads_onto_other_meshes(tmp_path):
    """Saved from tp=4 (10 rows padded to 12), loaded onto tp=2 (no padding) and dp=2: the
    full params are bit-identical, and the files hold the 10 real rows only."""
    from partita.runtime import checkpoint as ckpt

    step = _step(10, optimizer="adamw")
    _, weights = _data(step, 10, 4)
    src = partita.parallelize(step, "tp=4", "megatron")
    assert src.padding
    layout = ckpt.ShardLayout.of(src.graph, src.padding.inputs)
    assert next(w for w in layout.weights if w.name == "w").shape == (10, E)
    ckpt.save(tmp_path, 1, layout, src.shard_weights(weights))
    full = ckpt.load_full(tmp_path)
    for k, a in weights.items():
        np.testing.assert_array_equal(full[k], a)
    for mesh, strategy in (("tp=2", "megatron"), ("dp=2", "zero1"), ("tp=4", "megatron")):
        dst = partita.parallelize(step, mesh, strategy)
        dlayout = ckpt.ShardLayout.of(dst.graph, dst.padding.inputs if dst.padding else None)
        pieces = ckpt.load(tmp_path, dlayout)
        back = dst.assemble_weights(pieces)
        for k, a in weights.items():
            np.testing.assert_array_equal(back[k], a, err_msg=f"{mesh}: {k}")
        # Each rank's piece has the shape its program holds.
        for r, piece in enumerate(pieces):
            for v in dst.local.inputs:
                if v.role in ("param", "state"):
                    assert piece[v.name].shape == v.type.shape, (mesh, r, v.name)


@pytest.mark.timeout(180)
def test_a_padded_vocabulary_on_gloo_ranks_matches_one_device(tmp_path):
    """The whole path on processes: padded weights go out, three AdamW steps run on tp=4,
    the check compares with the single-device graph, the checkpoint resumes on tp=2."""
    step = _step(10, optimizer="adamw")
    feed, weights = _data(step, 10, 5)
    prog = partita.parallelize(step, "tp=4", "megatron")
    res = partita.launch(prog, 4, feed, weights=weights, steps=3, check=True, timeout_s=90,
                         checkpoint_dir=str(tmp_path))
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]
    assert res.weights["w"].shape == (10, E)
    resumed = partita.launch(partita.parallelize(step, "tp=2", "megatron"), 2, feed, steps=1,
                             resume_from=str(tmp_path), timeout_s=90)
    one = partita.launch(partita.parallelize(step, "tp=2", "megatron"), 2, feed, weights=res.weights, steps=1,
                         timeout_s=90)
    for k in res.weights:
        np.testing.assert_array_equal(resumed.weights[k], one.weights[k])
