"""Local forms (``partita.parallel.local_forms``): the vocab-parallel embedding and the
cross_entropy over split classes, and ``axis_index``, which tells a rank its piece.

Each case partitions a training step (embedding -> tied LM head -> cross_entropy -> SGD or
AdamW) with the table split by rows, runs every rank with ``run_mesh``, and compares the
loss and the updated params with the single-device step. One case runs on gloo ranks.
"""

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
from partita.ir.mesh import Mesh
from partita.parallel.partition import local_piece, partition_with_report
from partita.ir.placement import Placement
from partita.parallel.propagate import propagate
from partita.parallel.interpreter import run_mesh

V, E = 16, 8


def _step(n: int, reduction: str, smoothing: float, ignore: int, optimizer: str, logits_rank: int = 2,
          vocab: int = V) -> Graph:
    g = Graph("vocab")
    b = Builder(g)
    w = g.add_input("w", TensorType((vocab, E), f32), "param")
    ids = g.add_input("ids", TensorType((n,), i64), "input")
    t = g.add_input("t", TensorType((n,) if logits_rank == 2 else (n // 2, 2), i64), "input")
    h = b.embedding(w, ids)
    logits = b.matmul(b.tanh(h), b.transpose(w, perm=(1, 0)))
    if logits_rank == 3:  # [N, C, d]: the classes on dim 1 with a trailing dim
        logits = b.transpose(b.reshape(logits, shape=(n // 2, 2, vocab)), perm=(0, 2, 1))
    loss = b.cross_entropy(logits, t, reduction=reduction, label_smoothing=smoothing, ignore_index=ignore)
    if reduction == "none":
        loss = b.sum(b.mul(loss, loss))
    g.set_outputs([loss])
    return partita.training_step(g, loss=0, optimizer=optimizer, lr=0.1)


def _run(mesh: str, table: Placement, batch: Placement | None = None, reduction: str = "mean",
         smoothing: float = 0.0, ignore: int = -100, optimizer: str = "sgd", n: int = 8, logits_rank: int = 2,
         vocab: int = V, seed: int = 0):
    step = _step(n, reduction, smoothing, ignore, optimizer, logits_rank, vocab)
    rng = np.random.default_rng(seed)
    t_shape = next(v.type.shape for v in step.inputs if v.name == "t")
    feeds = {"ids": rng.integers(0, vocab, n), "t": rng.integers(0, vocab, t_shape)}
    if ignore >= 0:
        # Exactly two ignored targets, one in each half of the batch: a batch split over dp
        # then gives each rank the same count, where the mean of the ranks' means is the
        # global mean (uneven counts weigh ranks differently, as DDP does; docs/parallel.md).
        t = rng.integers(0, vocab - 1, t_shape)
        feeds["t"] = np.where(t >= ignore, t + 1, t)
        feeds["t"].reshape(-1)[[1, -1]] = ignore
    weights = {str(v.name): (rng.standard_normal(v.type.shape).astype(np.float32) if v.name == "w"
                             else np.zeros(v.type.shape, np.float32)) for v in step.inputs if v.role != "input"}
    want = partita.run(step, feeds, weights)
    m = Mesh.of(mesh)
    g = step.clone()
    g.mesh = m
    by_name = {str(v.name): v for v in g.inputs}
    by_name["w"].placement = table
    if batch is not None:
        by_name["ids"].placement = batch
        by_name["t"].placement = Placement(batch.dims + ((),) * (len(t_shape) - 1))
    propagate(g)
    local, report = partition_with_report(g)
    pieces = [{k: local_piece(a, by_name[k].placement, m, r) for k, a in weights.items()} for r in range(m.size)]
    inputs = [{k: local_piece(a, by_name[k].placement, m, r) for k, a in feeds.items()} for r in range(m.size)]
    outs = run_mesh(local, m, inputs, pieces)
    for r in range(m.size):
        for got, full, v in zip(outs[r], want, g.outputs):
            assert v.placement is not None
            ref = local_piece(full, Placement(v.placement.dims, ()), m, r)
            if optimizer == "adamw":
                # AdamW's first step moves a param by about lr * g / (|g| + eps): an entry whose
                # gradient is rounding noise moves by a noise-sized fraction of lr, differently
                # for two summation orders. Compared per tensor by norm, at 1e-4, as the launch
                # check compares AdamW steps (docs/parallel.md, "Limits").
                a, b = np.asarray(got, np.float64), np.asarray(ref, np.float64)
                err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-6 * np.sqrt(max(b.size, 1)))
                assert err <= 1e-4, f"rank {r}, output {v.name}: relative error {err:.2e}"
            else:
                np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6, err_msg=f"rank {r}, output {v.name}")
    return local, report


ROWS = Placement.split(2, {0: "tp"})


@pytest.mark.parametrize("reduction, smoothing, ignore", [
    ("mean", 0.0, -100), ("mean", 0.1, 3), ("sum", 0.0, 3), ("none", 0.2, -100), ("mean", 0.0, 0)])
def test_vocab_parallel_step_matches_one_device(reduction, smoothing, ignore):
    local, report = _run("tp=2", ROWS, reduction=reduction, smoothing=smoothing, ignore=ignore)
    # The logits are never gathered: every collective inside the loss carries one (or a few)
    # values per token, and the table's rows stay split (a free local slice at most).
    inside = [c for c in report.collectives if c.inside]
    assert inside and all(c.bytes <= 3 * 4 * 8 for c in inside), report.text()
    assert not any(c.op == "all_gather" for c in report.collectives), report.text()
    text = partita.print_graph(local)
    assert "axis_index()" in text and "f32[8,8] aliases(%w)" in text
    # The lookup's gradient is computed for the rank's 8 rows, not for the whole table and
    # then sliced.
    (grad,) = [n for n in local.nodes if n.op == "embedding_grad"]
    assert grad.attrs["num_embeddings"] == 8 and "shard_slice" not in text
    assert not any(c.op == "shard_slice" for c in report.collectives)


def test_four_ranks_and_trailing_class_dims():
    _run("tp=4", Placement.split(2, {0: "tp"}), ignore=0)
    _run("tp=2", ROWS, logits_rank=3, smoothing=0.1, ignore=5)


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_with_a_data_parallel_batch(optimizer):
    _run("dp=2,tp=2", ROWS, Placement.split(1, {0: "dp"}), optimizer=optimizer, smoothing=0.1)


@pytest.mark.parametrize("axes", [("dp", "tp"), ("tp", "dp")])
def test_rows_split_over_two_axes(axes):
    # The piece index runs over both axes, major to minor, as a placement cuts the dim.
    _run("dp=2,tp=2", Placement((axes, ())), reduction="sum")


@st.composite
def _cases(draw):
    mesh = draw(st.sampled_from(["tp=2", "tp=4", "dp=2,tp=2"]))
    m = Mesh.of(mesh)
    axes = draw(st.sampled_from([a for a in [("tp",), ("dp", "tp"), ("tp", "dp"), ("dp",)]
                                 if all(x in m.names for x in a)]))
    pieces = 1
    for a in axes:
        pieces *= m.axis_size(a)
    vocab = pieces * draw(st.integers(1, 5))
    batch = "dp" in m.names and "dp" not in axes and draw(st.booleans())
    n = (2 if batch else 1) * 2 * draw(st.integers(1, 4))
    return dict(mesh=mesh, table=Placement((axes, ())), batch=Placement.split(1, {0: "dp"}) if batch else None,
                reduction=draw(st.sampled_from(["mean", "sum", "none"])),
                smoothing=draw(st.sampled_from([0.0, 0.25])), ignore=draw(st.sampled_from([-100, 0])),
                optimizer=draw(st.sampled_from(["sgd", "adamw"])), n=n, vocab=vocab,
                logits_rank=draw(st.sampled_from([2, 3])), seed=draw(st.integers(0, 2**16)))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_cases())
def test_random_vocab_splits_match_one_device(case):
    """Random vocabularies, batches, meshes, row splits over one or two axes, reductions,
    smoothing, ignored targets and optimizers: every rank equals the single-device step."""
    _run(**case)


def test_axis_index_gives_each_rank_its_coordinate():
    g = partita.parse("""graph @where(%x: f32[2]) -> (i64[], i64[]) mesh(dp=2, tp=3) {
  %0 = axis_index() {axis="dp", group_size=2} : i64[]
  %1 = axis_index() {axis="tp", group_size=3} : i64[]
  return %0, %1
}""")
    m = Mesh.of("dp=2,tp=3")
    outs = run_mesh(g, m, [[np.zeros(2, np.float32)]] * m.size)
    assert [(int(a), int(b)) for a, b in outs] == [(m.coord(r, "dp"), m.coord(r, "tp")) for r in range(m.size)]
    with pytest.raises(partita.PartitaError, match="group_size must be at least 1"):
        partita.verify(partita.parse('graph @bad() -> (i64[]) {\n  %0 = axis_index() {axis="tp", group_size=0} '
                                     ': i64[]\n  return %0\n}'))
    # Passes keep both: they are rank-dependent, never merged or dropped while used.
    two = partita.parse("""graph @two(%x: f32[2]) -> (i64[]) mesh(tp=2) {
  %0 = axis_index() {axis="tp", group_size=2} : i64[]
  %1 = axis_index() {axis="tp", group_size=2} : i64[]
  %2 = add(%0, %1) : i64[]
  return %2
}""")
    assert partita.print_graph(partita.optimize(two)).count("axis_index") == 2


@pytest.mark.timeout(180)
def test_megatron_gpt2_vocab_parallel_on_gloo_ranks():
    """The whole path on processes: megatron splits the tied table by rows, the loss runs
    on split logits, and every step matches the single-device step."""
    from test_pad import gpt2_forward

    fwd = partita.optimize(gpt2_forward(64), "split-projections")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.1)
    prog = partita.parallelize(step, "tp=2", "megatron")
    assert any("vocab-parallel" in n for n in prog.plan.notes), prog.plan.notes
    (name,) = [v.name for v in fwd.inputs if v.role == "input"]
    rng = np.random.default_rng(1)
    batches = [{name: rng.integers(0, 64, (2, 8)), "target": rng.integers(0, 64, (2, 8))} for _ in range(2)]
    res = partita.launch(prog, 2, batches, check=True, timeout_s=60)
    assert res.passed, [(c.step, c.worst, c.worst_output) for c in res.checks]


@pytest.mark.parametrize("bad", [V, -3])
def test_an_id_outside_the_vocabulary_is_an_error_on_every_rank(bad):
    """No rank's rows hold it, so a masked lookup would give a silent zero row; instead the
    id reaches the local lookup (and the loss's target its gather) out of range, which fails
    as the unsplit op does."""
    from partita.parallel.interpreter import MeshRunError

    step = _step(8, "mean", 0.0, -100, "sgd")
    g = step.clone()
    m = Mesh.of("tp=2")
    g.mesh = m
    by_name = {str(v.name): v for v in g.inputs}
    by_name["w"].placement = ROWS
    propagate(g)
    local, _ = partition_with_report(g)
    w = np.random.default_rng(0).standard_normal((V, E)).astype(np.float32)
    pieces = [{"w": local_piece(w, ROWS, m, r)} for r in range(2)]
    ids, t = np.arange(8) % V, np.arange(8) % V
    for which in ("ids", "t"):
        feed = {"ids": ids.copy(), "t": t.copy()}
        feed[which][3] = bad
        with pytest.raises((partita.PartitaError, MeshRunError), match="out of range"):
            run_mesh(local, m, [feed, feed], pieces)
        with pytest.raises(partita.PartitaError, match="out of range"):
            partita.run(step, feed, {"w": w, "w.momentum_buffer": np.zeros_like(w)})
    # An ignored target is no error.
    feed = {"ids": ids, "t": np.where(np.arange(8) == 3, -100, t)}
    run_mesh(local, m, [feed, feed], pieces)


def test_megatron_pads_a_vocabulary_the_axis_does_not_divide():
    """10 rows split evenly over tp=2; over tp=4 they are padded to 12 (3 per rank) and still
    split, and both programs give the single-device step's results at the real sizes."""
    step = _step(8, "mean", 0.0, -100, "sgd", vocab=10)
    split = partita.parallelize(step, "tp=2", "megatron")
    assert "%w is vocab-parallel over 'tp' (split by rows)" in split.plan.notes
    assert not any("padded" in n for n in split.plan.notes), split.plan.notes
    assert next(v for v in split.local.inputs if v.name == "w").type.shape == (5, E)
    padded = partita.parallelize(step, "tp=4", "megatron")
    assert "%w padded from 10 to 12 along dim 0 so that 'tp' (size 4) splits it; the extra entries hold zeros" \
        in padded.plan.notes, padded.plan.notes
    assert "%w is vocab-parallel over 'tp' (split by rows)" in padded.plan.notes
    assert next(v for v in padded.local.inputs if v.name == "w").type.shape == (3, E)
    rng = np.random.default_rng(3)
    feed = {"ids": rng.integers(0, 10, 8), "t": rng.integers(0, 10, 8)}
    weights = {"w": rng.standard_normal((10, E)).astype(np.float32), "w.momentum_buffer": np.zeros((10, E), np.float32)}
    want = partita.run(step, feed, weights)
    for prog in (split, padded):
        got = prog.simulate(feed, weights)
        for a, b in zip(got, want):
            assert np.shape(a) == np.shape(b)
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_forward", [False, True])
def test_the_gradient_reuses_the_forwards_softmax_statistics(with_forward):
    """With the loss on the same logits in the program, cross_entropy_grad's form takes the
    forward's all-reduced max and denominator (no collective of its own); alone, it computes
    them itself. Both equal the single-device gradient."""
    g = Graph("ce")
    b = Builder(g)
    z = g.add_input("z", TensorType((6, 8), f32), "input")
    t = g.add_input("t", TensorType((6,), i64), "input")
    d = g.add_input("d", TensorType((), f32), "input")
    outs = [b.cross_entropy(z, t, label_smoothing=0.1)] if with_forward else []
    outs.append(b.cross_entropy_grad(d, z, t, label_smoothing=0.1))
    g.set_outputs(outs)
    rng = np.random.default_rng(5)
    feed = {"z": rng.standard_normal((6, 8)).astype(np.float32), "t": rng.integers(0, 8, 6),
            "d": np.asarray(0.7, np.float32)}
    want = partita.run(g, feed)
    m = Mesh.of("tp=2")
    g.mesh = m
    z.placement = Placement.split(2, {1: "tp"})
    propagate(g)
    local, report = partition_with_report(g)
    grads = [c for c in report.collectives if c.inside and "cross_entropy_grad" in c.consumer]
    assert len(grads) == (0 if with_forward else 2), report.text()
    got = run_mesh(local, m, [{k: local_piece(a, v.placement, m, r) for (k, a), v in zip(feed.items(), g.inputs)}
                              for r in range(2)])
    for r in range(2):
        for a, w, v in zip(got[r], want, g.outputs):
            assert v.placement is not None
            np.testing.assert_allclose(a, local_piece(w, Placement(v.placement.dims, ()), m, r), rtol=1e-5, atol=1e-6)


def test_an_onnx_gather_of_a_table_becomes_a_vocab_parallel_embedding():
    """ONNX exports spell the lookup Gather(table, ids), imported as index_select; the
    canonicalizer turns rows of a 2-d table into an embedding, which megatron then splits."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(4)
    w = rng.standard_normal((V, E)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["w", "ids"], ["h"], axis=0),
             helper.make_node("Tanh", ["h"], ["a"]),
             helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["a", "wt"], ["logits"])]
    graph = helper.make_graph(nodes, "lm", [helper.make_tensor_value_info("ids", TensorProto.INT64, [8])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [8, V])],
                              initializer=[numpy_helper.from_array(w, "w")])
    fwd = partita.import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert "index_select" in partita.print_graph(fwd)
    fwd = partita.optimize(fwd, "canonicalize,dce")
    assert "embedding(" in partita.print_graph(fwd) and "index_select" not in partita.print_graph(fwd)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.1)
    prog = partita.parallelize(step, "tp=2", "megatron")
    assert any("vocab-parallel" in n for n in prog.plan.notes), prog.plan.notes
    (name,) = [v.name for v in step.inputs if v.role == "input" and v.name != "target"]
    feed = {name: rng.integers(0, V, 8), "target": rng.integers(0, V, 8)}
    want = partita.run(step, feed)
    for a, b in zip(prog.simulate(feed), want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
