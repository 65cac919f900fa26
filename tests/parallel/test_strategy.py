"""Strategies and ``parallelize``: per-rank programs that compute what the single-device graph does.

Every strategy is checked on the simulated mesh (``ParallelProgram.simulate``, the NumPy
reference with exact collectives) against ``partita.run`` of the single-device graph: the
loss and every gradient (1e-5 relative per tensor), and the parameters after an SGD step.
The plans are checked for what the strategy promises: the batch split, the optimizer state
sharded, the Megatron layer's all-reduces.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import partita
from partita.ir.printer import value_names
from partita.ops.registry import OPS
from partita.parallel import Mesh
from partita.parallel.strategy import (ParallelProgram, StrategyError, assemble, parallelize, parse_placement,
                                       parse_strategy)

_TESTS = str(Path(__file__).resolve().parents[1])
for _p in (_TESTS, str(Path(_TESTS) / "autodiff")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from strategies import graphs, random_inputs  # noqa: E402
from test_training import MLP, gpt2, llama  # noqa: E402


def rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def model_case(name: str, layers: int = 1):
    torch.manual_seed(0)
    if name == "mlp":
        model, x = MLP(), torch.randn(32, 12)
        target = torch.randint(0, 5, (32,))
    else:
        model = gpt2(layers) if name == "gpt2" else llama()
        x = torch.randint(0, 128, (4, 16))
        target = torch.randint(0, 128, (4, 16))
    fwd = partita.import_torch(model.eval(), (x,))
    (inp,) = [v.name for v in fwd.inputs if v.role == "input"]
    return fwd, {inp: x.numpy(), "target": target.numpy()}


def check(step: partita.Graph, feed: dict, mesh: str, strategy: str, rtol: float = 1e-5,
          **kw) -> ParallelProgram:
    prog = parallelize(step, mesh, strategy, **kw)
    partita.verify(prog.local)
    want = partita.run(step, feed, step.weights)
    got = prog.simulate(feed, step.weights)
    names = [str(v.name) for v in step.outputs]
    for n, g, w in zip(names, got, want):
        assert rel(g, w) <= rtol, f"{strategy} on {mesh}: %{n} differs from the single-device value by {rel(g, w):.2e}"
    return prog


_CACHE: dict = {}


def grads(name: str):
    if name not in _CACHE:
        fwd, feed = model_case(name)
        _CACHE[name] = (partita.training_step(fwd, loss="cross_entropy", optimizer=None), feed)
    return _CACHE[name]


def sgd(name: str):
    key = name + ".sgd"
    if key not in _CACHE:
        fwd, feed = model_case(name)
        _CACHE[key] = (partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.1, momentum=0.9), feed)
    return _CACHE[key]


def adamw(name: str):
    key = name + ".adamw"
    if key not in _CACHE:
        fwd, feed = model_case(name)
        _CACHE[key] = (partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", eps=1e-6), feed)
    return _CACHE[key]


# --- the presets on the MLP ----------------------------------------------------------------------------


@pytest.mark.parametrize("mesh,strategy", [("dp=2", "dp"), ("tp=2", "megatron"), ("dp=2,tp=2", "dp+megatron"),
                                           ("dp=4", "dp"), ("dp=2,tp=2", "megatron")])
def test_mlp_gradients(mesh, strategy):
    step, feed = grads("mlp")
    check(step, feed, mesh, strategy)


@pytest.mark.parametrize("strategy", ["dp", "zero1", "zero2", "zero3"])
def test_mlp_sgd_step_data_parallel(strategy):
    step, feed = sgd("mlp")
    prog = check(step, feed, "dp=2", strategy)
    x = next(v for v in prog.graph.inputs if v.role == "input")
    assert str(x.placement) == "[dp, -]", "the batch is split"
    state = [v for v in prog.local.inputs if v.role == "state" and v.type.rank]
    glob = {v.name: v for v in step.inputs}
    if strategy == "dp":
        assert all(v.type == glob[v.name].type for v in state), "dp keeps the momentum whole"
        assert prog.plan.count("all_reduce", "dp", "backward") + prog.plan.count("all_reduce", "dp", "update") >= 1
    else:
        assert any(v.type.shape[0] * 2 == glob[v.name].type.shape[0] for v in state), "zero shards the state"
    if strategy == "zero3":
        params = [v for v in prog.local.inputs if v.role == "param"]
        assert sum(v.type.shape[0] for v in params) < sum(glob[v.name].type.shape[0] for v in params)
        assert prog.plan.count("all_gather", "dp", "forward") >= 1, "params are gathered for the forward"
        # ...and again for the backward, as FSDP does: the forward's copy is not kept.
        assert prog.plan.count("all_gather", "dp", "backward") >= 1, prog.plan.text()
        assert any(v.name and v.name.endswith(".regathered") for v in prog.graph.values())


def test_zero3_holds_less_at_its_peak_than_zero2():
    """Each gathered param lives only while it is read: the forward's copy dies in the
    forward, the backward gathers again, and (just in time, prefetch=0) every all_gather
    sits right before its reader (or before the next collective, which keeps the program's
    one collective order). Prefetching one gather ahead (the default) still holds less than
    zero2."""
    step, _ = sgd("gpt2")
    peak = {s: parallelize(step, "dp=2", s).plan for s in ("zero2", "zero3")}
    z3 = peak["zero3"]
    assert z3.activation_bytes + z3.param_bytes < peak["zero2"].activation_bytes + peak["zero2"].param_bytes
    jit = parallelize(step, "dp=2", "zero3", prefetch=0, gather_mb=None).plan
    assert jit.activation_bytes <= z3.activation_bytes
    prog = parallelize(step, "dp=2", "zero3", prefetch=0, gather_mb=None)
    nodes = list(prog.local.nodes)
    for i, n in enumerate(nodes):
        if n.op == "all_gather":
            readers = {u for r in n.results for u in r.users}
            after = nodes[i + 1]
            assert after in readers or OPS[after.op].collective is not None, (i, after.op)
    first_matmul = next(i for i, n in enumerate(nodes) if n.op == "matmul")
    gathers = sum(n.op == "all_gather" for n in nodes)
    assert sum(n.op == "all_gather" for n in nodes[:first_matmul]) <= gathers // 4, "params are not gathered up front"


@pytest.mark.parametrize("ahead", [1, 2])
def test_zero3_prefetches_each_param_gather_ahead_of_its_use(ahead):
    """With prefetch=k, the gather of a param is issued after the previous param's gather and
    before the first reader of the param k gathers back: it is in flight (the runtime starts
    it asynchronously) while those params are used. The program computes the same, and holds
    at most a few gathered params more than just in time."""
    step, feed = sgd("gpt2")
    prog = check(step, feed, "dp=2", "zero3", prefetch=ahead, gather_mb=None)
    nodes = list(prog.local.nodes)
    at = {n: i for i, n in enumerate(nodes)}
    # zero3's gathered copy of a param is a reshape of it: the gathers of (views of) inputs.
    gathers = [n for n in nodes if n.op == "all_gather" and
               (n.operands[0].producer is None or n.operands[0].producer.operands[0].producer is None)]
    assert len(gathers) >= 8
    first_read = {g: min(at[u] for u in g.results[0].users) for g in gathers}
    early = 0
    for k in range(ahead, len(gathers)):
        g = gathers[k]
        # After the gather before it (the gathers keep their order), and no later than the
        # first reader of the gather `ahead` back (or just after the one before, when that
        # one is read later: wpe is gathered before wte but read after it).
        assert at[gathers[k - 1]] < at[g] <= max(first_read[gathers[k - ahead]], at[gathers[k - 1]] + 1), k
        early += at[g] < first_read[gathers[k - 1]]
    # Nearly every gather is in flight before the previous param is read.
    assert early >= 0.75 * (len(gathers) - ahead), (early, len(gathers))
    jit = parallelize(step, "dp=2", "zero3", prefetch=0, gather_mb=None).plan
    biggest = max(g.results[0].type.nbytes for g in gathers)
    assert prog.plan.activation_bytes <= jit.activation_bytes + ahead * biggest


def test_zero3_gathers_the_tied_lm_head_once():
    """GPT-2's token table is read at the start of the forward, by the LM head at its end and
    by the head's gradient at the start of the backward: no other param is read between the
    last two, so one gathered copy serves the head both ways (FSDP keeps its root unit's
    params likewise); the blocks' params are gathered again for the backward."""
    step, feed = sgd("gpt2")
    prog = check(step, feed, "dp=2", "zero3")
    copies = {str(v.name) for v in prog.graph.values() if v.name and str(v.name).endswith("gathered")}
    assert "lm.transformer.wte.weight.gathered" in copies
    assert "lm.transformer.wte.weight.regathered" not in copies
    assert any(c.startswith("lm.transformer.h.0.") and c.endswith(".regathered") for c in copies), sorted(copies)
    gathers = [n for n in prog.local.nodes if n.op == "all_gather"]
    table = [n for n in gathers if str(n.operands[0].name).startswith("lm.transformer.wte.weight")]
    assert len(table) == 1, [str(n.operands[0].name) for n in table]


@pytest.mark.parametrize("prefetch", [0, 1])
def test_zero3_fuses_param_gathers_into_buckets(prefetch):
    """Consecutive param gathers share one all_gather (a flat [1, K] concat of the pieces,
    gathered on dim 0 and cut per param), as FSDP gathers a unit's flat buffer: fewer calls,
    the same bytes, the same results; a bucket holds at most a sixteenth of the gathered
    bytes, so zero3 still holds less than zero2."""
    step, feed = sgd("gpt2")
    one = parallelize(step, "dp=2", "zero3", gather_mb=None, prefetch=prefetch)
    fused = check(step, feed, "dp=2", "zero3", gather_mb=4.0, prefetch=prefetch)
    calls = [sum(n.op == "all_gather" for n in p.local.nodes) for p in (one, fused)]
    assert calls[1] <= 0.7 * calls[0], calls
    assert fused.plan.comm_bytes == one.plan.comm_bytes
    buckets = [b for b in fused.plan.buckets if b["op"] == "all_gather"]
    assert buckets and all(len(b["members"]) >= 2 for b in buckets)
    total = sum(n.results[0].type.nbytes for n in one.local.nodes if n.op == "all_gather")
    assert all(b["bytes"] <= total // 16 for b in buckets), (total, buckets)
    zero2 = parallelize(step, "dp=2", "zero2").plan
    assert fused.plan.activation_bytes + fused.plan.param_bytes < zero2.activation_bytes + zero2.param_bytes


def test_zero3_bucket_size_must_be_positive():
    step, _ = sgd("mlp")
    with pytest.raises(partita.PartitaError, match="bucket-gathers needs size_mb > 0"):
        parallelize(step, "dp=2", "zero3", gather_mb=0)


def test_zero3_prefetch_must_not_be_negative():
    step, _ = sgd("mlp")
    with pytest.raises(partita.PartitaError, match="prefetch must be 0"):
        parallelize(step, "dp=2", "zero3", prefetch=-1)


def test_zero_shards_adamw_state_and_matches():
    step, feed = adamw("mlp")
    for strategy in ("dp", "zero2"):
        prog = check(step, feed, "dp=2", strategy, rtol=1e-4)
        if strategy == "dp":
            whole = prog.plan.state_bytes
    assert prog.plan.state_bytes < 0.6 * whole, "zero2 holds about half the optimizer state per rank"


# --- transformers ------------------------------------------------------------------------------------


def test_llama_megatron_layer_all_reduces():
    step, feed = grads("llama")
    prog = check(step, feed, "tp=2", "megatron")
    layers = 2
    colls = prog.plan.collectives
    inside = [c for c in colls if c["inside"]]
    names = value_names(prog.graph)
    looked_up = {names[n.results[0]] for n in prog.graph.nodes if n.op == "embedding"}
    layer = [c for c in colls if not c["inside"] and c["value"] not in looked_up]
    # Column-parallel q/k/v and gate/up, row-parallel o and down: the analytical minimum per
    # layer, plus one all_reduce of the LM head's input gradient (its weight is split on
    # the vocabulary, so dx is a pending sum) in the backward.
    assert sum(c["op"] == "all_reduce" and c["phase"] == "forward" for c in layer) == 2 * layers, prog.plan.text()
    assert sum(c["op"] == "all_reduce" and c["phase"] == "backward" for c in layer) == 2 * layers + 1, \
        prog.plan.text()
    # The vocab-parallel embedding: its partial lookup is reduced once.
    assert [(c["op"], c["phase"]) for c in colls if c["value"] in looked_up] == [("all_reduce", "forward")]
    # The vocab-parallel loss: a max and one fused sum in the forward, each of [tokens, 1 or 2]:
    # the logits are never gathered, and the gradient reuses both (no collective of its own).
    assert [(c["op"], c["consumer"].split(" = ")[-1]) for c in inside] == [("all_reduce", "cross_entropy")] * 2
    assert all(c["bytes"] <= 2 * 4 * 64 for c in inside), "per-token scalars only"
    assert prog.plan.count(axis="tp") == 4 * layers + 4, "no other collective over tp"
    assert "vocab-parallel" in prog.plan.text()
    # Each names the model's source line that needed it.
    assert all(c["source"] and c["source"].startswith("modeling_llama.py:") for c in colls if c["phase"] == "forward")
    assert " at modeling_llama.py:" in prog.plan.text()
    assert prog.plan.replicated == []
    assert prog.plan.param_bytes < 0.7 * prog.plan.global_param_bytes


def test_gpt2_megatron_mlp_is_split():
    step, feed = grads("gpt2")
    prog = check(step, feed, "tp=2", "megatron")
    assert prog.plan.count("all_reduce", "tp", "forward") >= 1
    text = prog.plan.to_json()
    assert '"comm_bytes_per_step"' in text and '"placements"' in text


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_transformer_dp_x_megatron(name):
    step, feed = sgd(name)
    prog = check(step, feed, "dp=2,tp=2", "dp+megatron")
    assert prog.mesh.size == 4
    assert prog.plan.count(axis="dp") >= 1 and prog.plan.count(axis="tp") >= 1


def test_sequence_parallel_matches_and_reduce_scatters():
    step, feed = grads("llama")
    prog = check(step, feed, "tp=2", "megatron+sp")
    assert prog.plan.count("reduce_scatter", "tp", "forward") >= 1, prog.plan.summary()


# --- annotations, reports, errors ------------------------------------------------------------------------


def test_annotations_by_name_override_the_preset():
    step, feed = grads("mlp")
    prog = check(step, feed, "tp=2", None, annotations={"fc1.weight": "[tp, -]"})
    w = next(v for v in prog.local.inputs if v.name == "fc1.weight")
    assert w.type.shape == (16, 12)


def test_plan_report_text_and_json():
    step, feed = sgd("mlp")
    prog = parallelize(step, "dp=2", "dp")
    text = prog.plan.text()
    assert "plan: dp on mesh(dp=2)" in text and "communication per step" in text and "%x: [dp, -]" in text
    import json

    d = json.loads(prog.plan.to_json())
    assert d["comm_bytes_per_step"] == sum(c["bytes"] for c in d["collectives"]) > 0
    assert {c["phase"] for c in d["collectives"]} <= {"forward", "backward", "update", "output"}
    assert d["per_rank"]["param_bytes"] == d["global_param_bytes"]


def test_parse_strategy_and_placement():
    m = Mesh.of("dp=2,tp=2")
    s = parse_strategy("zero2+megatron+sp", m)
    assert (s.data, s.dp_axis, s.megatron, s.sequence_parallel, s.tp_axis) == ("zero2", "dp", True, True, "tp")
    assert parse_strategy("dp", Mesh.of("x=4")).dp_axis == "x"
    p = parse_placement("[dp, -] partial(tp)", 2)
    assert str(p) == "[dp, -] partial(tp)"
    assert parse_placement("replicated", 3).is_replicated


@pytest.mark.parametrize("mesh,strategy,message", [
    ("dp=2", "dq", "unknown strategy 'dq' (did you mean 'dp'?)"),
    ("dp=2", "dp+zero1", "choose one data-parallel preset"),
    ("a=2,b=2", "dp", "needs a mesh axis named 'dp'"),
    ("dp=2,tp=2", "sp", "use it as 'megatron+sp'"),
    ("tp=2", "dp+megatron", "on the same mesh axis"),
    ("dp=3", "dp", "which the mesh axis 'dp' of size 3 does not divide"),
    ("dp=0", "dp", "bad mesh"),
])
def test_strategy_errors(mesh, strategy, message):
    step, _ = grads("mlp")
    with pytest.raises(StrategyError, match=None) as e:
        parallelize(step, mesh, strategy)
    assert message in str(e.value)


def test_annotation_errors_name_the_value():
    step, _ = grads("mlp")
    with pytest.raises(StrategyError, match=r"no value of that name; did you mean %fc1.weight"):
        parallelize(step, "tp=2", None, annotations={"fc1.weigth": "[tp, -]"})
    with pytest.raises(StrategyError, match=r"has 1 entry but the value has 2 dim"):
        parallelize(step, "tp=2", None, annotations={"fc1.weight": "[tp]"})
    with pytest.raises(StrategyError, match=r"annotation on %fc1.weight"):
        parallelize(step, "tp=4", None, annotations={"fc1.bias": "[-]", "fc1.weight": "[-, tp] partial(zz)"})


def test_uneven_split_names_the_tensor_dim_and_axis():
    step, _ = grads("mlp")
    with pytest.raises(StrategyError, match=r"%head.bias f32\[5\]: dim 0 of %head.bias \(size 5\) does not divide "
                                            r"over tp=2; pad the dimension"):
        parallelize(step, "tp=2", None, annotations={"head.bias": "[tp]"})


def test_zero_needs_an_optimizer():
    step, _ = grads("mlp")
    with pytest.raises(StrategyError, match="has no optimizer update"):
        parallelize(step, "dp=2", "zero2")


def test_missing_rule_is_an_error_unless_allowed():
    from partita.parallel.sharding import RULES

    # tanh without its rule stands for an op that has none.
    with RULES.override("tanh", None):
        step, feed = sgd("mlp")
        with pytest.raises(StrategyError, match=r"= tanh .*has no sharding rule.*allow_replication=True"):
            parallelize(step, "dp=2", "dp")
        prog = check(step, feed, "dp=2", "dp", allow_replication=True)
    assert any("tanh" in n for n in prog.plan.notes)


def test_global_graph_is_left_alone():
    step, _ = sgd("mlp")
    before = step.clone()
    parallelize(step, "dp=2", "zero3")
    assert step.diff(before) is None and step.mesh is None


def test_assemble_inverts_local_piece():
    from partita.parallel.partition import local_piece
    from partita.ir.placement import Placement

    m = Mesh.of("dp=2,tp=2")
    a = np.arange(48.0).reshape(4, 12)
    for p in (Placement.split(2, {0: "dp", 1: "tp"}), Placement.split(2, {1: ("dp", "tp")}),
              Placement.split(2, {0: "tp"}), Placement.replicated(2)):
        pieces = [local_piece(a, p, m, r) for r in range(4)]
        np.testing.assert_array_equal(assemble(pieces, p, m, a.shape), a)


# --- random graphs -----------------------------------------------------------------------------------


@st.composite
def annotated(draw):
    g = draw(graphs(max_nodes=8, kinds=("binary", "unary", "reshape", "transpose", "matmul", "sum",
                                         "broadcast_to", "slice", "concat", "where")))
    mesh = draw(st.sampled_from(["a=2", "a=2,b=2", "a=1,b=2"]))
    m = Mesh.of(mesh)
    ann = {}
    for v in g.inputs:
        dims = []
        used: set[str] = set()
        for n in v.type.shape:
            choices = [""] + [a for a in m.names if a not in used and n % m.axis_size(a) == 0]
            a = draw(st.sampled_from(choices))
            if a:
                used.add(a)
            dims.append(a or "-")
        ann[v.name] = "[" + ", ".join(dims) + "]" if dims else "replicated"
    return g, mesh, ann


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(annotated())
def test_random_graphs_partitioned_on_random_meshes(case):
    g, mesh, ann = case
    inputs = random_inputs(g, seed=1)
    want = partita.run(g, inputs)
    prog = parallelize(g, mesh, None, annotations=ann)
    partita.verify(prog.local)
    feed = {k: v for k, v in inputs.items()}
    weights = {v.name: inputs[v.name] for v in g.inputs if v.role == "param"}
    got = prog.simulate({k: a for k, a in feed.items() if k not in weights}, weights)
    for i, (a, b) in enumerate(zip(got, want)):
        a, b = np.asarray(a), np.asarray(b)
        assert a.shape == b.shape and a.dtype == b.dtype
        if a.dtype.kind in "biu":
            np.testing.assert_array_equal(a, b, err_msg=f"output {i}")
        else:
            # Partial sums add in another order: compare where the reference is finite.
            ok = np.isfinite(b)
            np.testing.assert_allclose(a[ok], b[ok], rtol=1e-3, atol=1e-3, err_msg=f"output {i} on {mesh}: {ann}")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("mesh,strategy", [("dp=2", "zero1"), ("dp=2", "zero2"), ("dp=2", "zero3"),
                                           ("dp=2,tp=2", "zero3+megatron"), ("dp=2,tp=2", "zero2+megatron+sp"),
                                           ("dp=2,tp=2", "dp+megatron+sp")])
def test_transformer_presets_sgd_step(name, mesh, strategy):
    step, feed = sgd(name)
    prog = check(step, feed, mesh, strategy)
    whole = sum(math.prod(v.type.shape) * 4 for v in step.inputs if v.role == "state")
    if strategy.startswith("zero"):
        assert prog.plan.state_bytes <= 0.6 * whole, "the momentum is sharded over dp"


@pytest.mark.parametrize("name", ["gpt2", "llama"])
@pytest.mark.parametrize("mesh,strategy", [("tp=2", "megatron"), ("dp=2,tp=2", "dp+megatron+sp")])
def test_transformer_forward_outputs(name, mesh, strategy):
    fwd, feed = model_case(name)
    feed = {k: v for k, v in feed.items() if k != "target"}
    check(fwd, feed, mesh, strategy)


@pytest.mark.parametrize("mesh,strategy", [("tp=2", "megatron"), ("dp=2,tp=2", "dp+megatron")])
def test_megatron_shards_master_weights_with_their_params(mesh, strategy):
    """With master_weights the update reads the f32 <p>.master: megatron places it (and the
    moments) as <p>, so no rank gathers a gradient to update a whole param it does not hold."""
    from partita.autodiff.optim import initial_state

    g = partita.models.gpt(layers=2, hidden=32, heads=4, seq=8, vocab=64, batch=4, dtype="bf16")
    step = partita.training_step(g, loss="cross_entropy", optimizer="adamw", master_weights=True)
    prog = parallelize(step, mesh, strategy)
    local = {str(v.name): v.type for v in prog.local.inputs}
    for name in ("transformer.h.0.mlp.c_fc.weight", "transformer.h.1.attn.c_proj.weight"):
        for suffix in (".master", ".exp_avg", ".exp_avg_sq"):
            assert local[name + suffix].shape == local[name].shape, name + suffix
    assert not any(n.op == "all_gather" for n in prog.local.nodes)
    rng = np.random.default_rng(0)
    w = {str(v.name): (rng.standard_normal(v.type.shape) * 0.2).astype(v.type.dtype.np)
         for v in step.inputs if v.role == "param"}
    full = dict(w, **{str(v.name): initial_state(str(v.name), v.type, w) for v in step.inputs if v.role == "state"})
    feed = {"ids": rng.integers(0, 64, (4, 8)), "target": rng.integers(0, 64, (4, 8))}
    for v, a, b in zip(step.outputs, prog.simulate(feed, full), partita.run(step, feed, full)):
        # bf16 gradients (squared in exp_avg_sq); the key biases' gradients are zero up to rounding
        err = np.linalg.norm(np.float64(a) - np.float64(b)) / max(np.linalg.norm(np.float64(b)), 1e-4)
        assert err < 3e-2, f"%{v.name} differs by {err:.2e}"


def test_sequence_parallel_gathers_activations_not_weights():
    """megatron+sp with fewer rows per microbatch than tp ranks (the [seq, batch, hidden]
    layout): each column-parallel layer's input is all_gathered once for the projections that
    read it, and no forward all_gather moves a column-parallel weight (the row-parallel c_proj
    of attention still gathers its weight at small sizes: propagation prices that against
    the reduce_scatter one consumer at a time)."""
    g = partita.models.gpt(layers=2, hidden=128, heads=4, seq=512, vocab=512, batch=1, dtype="f32", layout="sbh")
    step = partita.training_step(g, loss="cross_entropy", optimizer="adamw")
    prog = parallelize(step, "tp=4", "megatron+sp")
    text = prog.plan.text()
    gathered_weights = [ln for ln in text.splitlines() if "[forward] all_gather" in ln
                        and ("c_attn.weight" in ln or "c_fc.weight" in ln)]
    assert not gathered_weights, gathered_weights[:3]
    assert text.count("[forward] all_gather") >= 4          # ln_1 and ln_2 outputs, per layer


def test_sequence_parallel_weight_gradients_are_reduce_scattered_not_all_reduced():
    """A weight gradient propagation makes as a partial sum (both operands split by rows) is
    reduce-scattered onto its sharded master's split, not all_reduced whole and sliced (half
    the bytes); the shapes are those at which the partial sum is the cheaper plan."""
    import collections

    import partita

    fwd = partita.models.gpt(layers=1, hidden=2048, heads=16, seq=2048, vocab=1024, batch=4, dtype="bf16",
                             attention="eager", dropout=0.1, layout="sbh")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True,
                                 recompute="selective")
    prog = partita.parallelize(step, mesh="tp=8", strategy="megatron+sp")
    shapes = {tuple(v.type.shape) for v in step.inputs if v.role == "param" and v.type.rank == 2}
    reduced = collections.Counter(n.op for n in prog.local.nodes
                                  if n.op in ("all_reduce", "reduce_scatter") and n.operands[0].producer is not None
                                  and n.operands[0].producer.op == "matmul"
                                  and tuple(n.operands[0].type.shape) in shapes)
    assert reduced["reduce_scatter"] >= 2 and reduced["all_reduce"] == 0, dict(reduced)


def test_sequence_parallel_weight_gradients_gather_the_activation_where_it_is_the_cheaper_plan():
    """At 22B's shapes (hidden 6144, 8192 rows a microbatch on tp=8), each weight is at least
    as large as the activation it multiplies: a partial weight gradient would then be
    reduce-scattered at its full size, so propagation prices that reduction where the partial
    sum is made, and shares one gather of the transposed activation between the q, k and v
    gradients, as Megatron-LM's single QKV gather: no weight gradient is a partial sum."""
    import collections

    import partita

    fwd = partita.models.gpt(layers=3, hidden=6144, heads=48, seq=2048, vocab=1024, batch=4, dtype="bf16",
                             attention="fused_softmax", dropout=0.1, layout="sbh")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True,
                                 recompute="selective")
    prog = partita.parallelize(step, mesh="tp=8", strategy="megatron+sp")
    shapes = {tuple(v.type.shape) for v in step.inputs if v.role == "param" and v.type.rank == 2}
    shapes |= {s[::-1] for s in shapes}
    reduced = collections.Counter(n.op for n in prog.local.nodes
                                  if n.op in ("all_reduce", "reduce_scatter") and n.operands[0].producer is not None
                                  and n.operands[0].producer.op == "matmul"
                                  and tuple(n.operands[0].type.shape) in shapes)
    assert not reduced, dict(reduced)
    # The q, k and v weight gradients ([6144, 768] shards of column-split weights), three per
    # layer, read one gathered activation per layer.
    reads = collections.Counter(n.operands[0] for n in prog.local.nodes
                                if n.op == "matmul" and n.results[0].type.shape == (6144, 768))
    assert sorted(reads.values()) == [3, 3, 3], sorted(reads.values())
