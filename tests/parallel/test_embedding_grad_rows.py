"""A vocab-parallel table's gradient computed for the rank's rows only
(``partita.parallel.local_forms.embedding_grad_rows``, run by the partition).

- Meaning: a GPT training step (tied token table, AdamW) under ``megatron`` and
  ``megatron+sp`` on tp=2 and tp=4 gives the single-device loss and updated params on
  ``run_mesh``, and each rank's program computes 1/tp of the table's gradient (its rows,
  or its hidden columns where sp's gradient is re-split), never the whole table.
- Tracking: ``partition_tracked`` (which a pipeline reads its sections from) lists the rows'
  gradient among the nodes made for the global ``embedding_grad``, and its value map holds
  no value the replacement erased.
"""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.ir.mesh import Mesh
from partita.ir.placement import Placement
from partita.parallel.partition import partition_tracked
from partita.parallel.propagate import propagate

VOCAB, HIDDEN, SEQ, BATCH = 256, 32, 8, 2


def _step():
    fwd = partita.models.gpt(layers=2, hidden=HIDDEN, heads=4, seq=SEQ, vocab=VOCAB, batch=BATCH, dtype="f32",
                             dropout=0.0)
    return partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", lr=1e-2)


def _data(step, seed: int = 0) -> tuple[dict, dict]:
    rng = np.random.default_rng(seed)
    feed = {str(v.name): rng.integers(0, VOCAB, v.type.shape) for v in step.inputs if v.role == "input"}
    weights = {str(v.name): (0.1 * rng.standard_normal(v.type.shape)).astype(np.float32) if v.role == "param"
               else np.zeros(v.type.shape, np.float32) for v in step.inputs if v.role != "input"}
    return feed, weights


def _close(got, want) -> None:
    for i, (a, b) in enumerate(zip(got, want)):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-6 * np.sqrt(max(b.size, 1)))
        # AdamW's first step: compared per tensor by norm, as the launch check compares it.
        assert err <= 1e-4, f"output {i}: relative error {err:.2e}"


@pytest.mark.parametrize("strategy", ["megatron", "megatron+sp"])
@pytest.mark.parametrize("tp", [2, 4])
def test_gpt_step_computes_the_rows_of_the_table_gradient(strategy, tp):
    step = _step()
    prog = partita.parallelize(step, f"tp={tp}", strategy)
    grads = [n for n in prog.local.nodes if n.op == "embedding_grad" and n.attrs["num_embeddings"] != SEQ]
    assert grads, "no gradient of the token table"
    # The rank's share: its rows (the table's split), or its columns where the sequence-parallel
    # gradient is cheaper to re-split by hidden than to gather (then moved to rows, 1/tp of it).
    assert all(n.results[0].type.shape in ((VOCAB // tp, HIDDEN), (VOCAB, HIDDEN // tp)) for n in grads), \
        [str(n.results[0].type) for n in grads]
    feed, weights = _data(step)
    _close(prog.simulate(feed, weights), partita.run(step, feed, weights))


def test_tracking_keeps_the_rows_gradient_with_its_global_node():
    step = _step()
    g = step.clone()
    g.mesh = Mesh.of("tp=2")
    table = next(v for v in g.inputs if v.role == "param" and v.type.shape == (VOCAB, HIDDEN))
    table.placement = Placement.split(2, {0: "tp"})
    propagate(g)
    local, _report, spans, vmap = partition_tracked(g)
    live = set(local.nodes)
    (glob,) = [n for n in g.nodes if n.op == "embedding_grad" and n.attrs["num_embeddings"] == VOCAB]
    rows = [n for n in spans[glob] if n.op == "embedding_grad"]
    assert [tuple(n.results[0].type.shape) for n in rows] == [(VOCAB // 2, HIDDEN)]
    assert all(n in live for made in spans.values() for n in made)
    assert all(v.producer is None or v.producer in live for v in vmap.values())


def test_the_rule_computes_the_rows_where_the_result_is_split_by_rows():
    """``embedding_grad``'s vocabulary is a ``made`` label: with its operands whole over an
    axis the result may be split by rows over it; not where an operand uses that axis."""
    from partita.ir.types import TensorType
    from partita.ir.dtypes import f32, i64
    from partita.parallel.sharding import Conflict, result_placements, sharding_spec

    types = [TensorType((2, 8, HIDDEN), f32), TensorType((2, 8), i64)]
    spec = sharding_spec("embedding_grad", types, {"num_embeddings": VOCAB})
    assert spec is not None and spec.made == frozenset({"v"})
    mesh = Mesh.of("tp=2")
    whole = [Placement.replicated(3), Placement.replicated(2)]
    assert result_placements(spec, whole, types, mesh) == [Placement.replicated(2)]
    assert result_placements(spec, whole, types, mesh, made={"v": ("tp",)}) == [Placement.split(2, {0: "tp"})]
    seq = [Placement.split(3, {1: "tp"}), Placement.split(2, {1: "tp"})]
    got = result_placements(spec, seq, types, mesh, made={"v": ("tp",)})
    assert isinstance(got, Conflict) and "gather them first" in str(got)


@pytest.mark.parametrize("strategy", ["pp+megatron", "pp+megatron+sp"])
def test_a_pipeline_stage_accumulates_the_rank_share_of_the_tied_table(strategy):
    """A pipeline template sums the table's gradient every microbatch: propagation prices that
    sum at the local size and computes 1/tp of the gradient (rows, or hidden columns under
    sp), never the whole table per microbatch; the unrolled program matches one device."""
    fwd = partita.models.gpt(layers=2, hidden=HIDDEN, heads=4, seq=SEQ, vocab=VOCAB, batch=8, dtype="f32",
                             dropout=0.0)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", lr=1e-2)
    kw = dict(microbatches=8, schedule="1f1b")
    tmpl = partita.parallelize(step, "pp=2,tp=2", strategy, unroll=False, **kw).templates[0]
    grads = [n for n in tmpl.local.nodes if n.op == "embedding_grad" and n.attrs["num_embeddings"] != SEQ]
    assert grads and all(tmpl.sections[n][0] in ("B", "W") for n in grads)
    assert all(n.results[0].type.shape in ((VOCAB // 2, HIDDEN), (VOCAB, HIDDEN // 2)) for n in grads), \
        [str(n.results[0].type) for n in grads]
    prog = partita.parallelize(step, "pp=2,tp=2", strategy, **kw)
    feed, weights = _data(step)
    _close(prog.simulate(feed, weights), partita.run(step, feed, weights))
