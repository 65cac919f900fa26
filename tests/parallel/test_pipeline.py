"""Pipeline parallelism (partita/parallel/pipeline/): schedules as data, and the meaning of
the per-rank programs that ``parallelize(..., "pp+...")`` unrolls from them.

- Schedules (pure): gpipe, 1f1b, interleaved and zero-bubble validate; with unit times the
  bubble of gpipe and 1f1b is (S - 1) / (M + S - 1), the interleaved one's
  (S - 1) / (v M + S - 1), zero-bubble's strictly less than 1f1b's; 1f1b holds S - p
  microbatches on rank p where gpipe holds M; the chart has one row per rank; every rank's
  program order puts a send after the action that produces it and a recv before the action
  that needs it, and follows one global order of the transfers; hand-made invalid schedules
  fail ``validate`` and a deadlocking one fails ``simulate``.
- Meaning: on GPT-2 (with its token embedding tied to the head) and Llama, 4 layers 64
  wide, for every schedule and microbatch counts 1, S, 2S, 4S, ``simulate`` (every rank's
  program, exact collectives and send/recv) gives the single-device step's loss and every
  updated param and momentum buffer (pp=3 too, with uneven stages); so do pp+dp,
  pp+megatron, pp+dp+megatron(+sp), pp+zero1/zero3+megatron, a step that returns only the
  gradients, one that recomputes, and random stage cuts and microbatch counts (hypothesis).
- Inference: a forward graph pipelined forward-only gives the single-device logits (with
  pp+dp too: each microbatch's rows come back in their places).
- The plan report, and bad options: each a PipelineError (or StrategyError) that names the
  value and a fix.

SGD with momentum, not AdamW: AdamW turns an exactly-zero gradient (attention's key bias)
into an update of +-lr whose sign is rounding noise (the AdamW test leaves those params out).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from partita.parallel.pipeline.schedule import (SCHEDULES, Action, PipelineError, Schedule, Transfer,
                                                make_schedule)
from partita.parallel.strategies.base import StrategyError

B, T = 8, 16          # batch rows x tokens
LAYERS = 4
TOL = 1e-4
GPT2_TIED = "lm.transformer.wte.weight"


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != {b.shape}"
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-6 * np.sqrt(b.size)))


def assert_outputs_match(got, want, graph, what: str = "") -> None:
    """``got`` (a pipeline's assembled outputs) equals ``want`` (the single-device run), output
    by output, within relative error TOL per tensor."""
    assert len(got) == len(want) == len(graph.outputs)
    bad = []
    for i, (o, w, v) in enumerate(zip(got, want, graph.outputs)):
        assert o is not None, f"{what}: output {i} (%{v.name}) is computed by no rank"
        e = rel_err(o, w)
        if not e <= TOL:
            bad.append(f"%{v.name}: {e:.2e}")
    assert not bad, f"{what}: {len(bad)} of {len(want)} outputs differ from one device: {', '.join(bad[:8])}"


# --- one BLAS thread ------------------------------------------------------------------------


def _blas_threads():
    """The set/get thread-count functions of the BLAS library bundled with NumPy, or None."""
    import ctypes
    import glob
    import os

    names = [("scipy_openblas_set_num_threads64_", "scipy_openblas_get_num_threads64_"),
             ("openblas_set_num_threads64_", "openblas_get_num_threads64_"),
             ("openblas_set_num_threads", "openblas_get_num_threads")]
    for path in glob.glob(os.path.join(os.path.dirname(np.__file__) + ".libs", "*openblas*")):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for set_, get in names:
            if hasattr(lib, set_) and hasattr(lib, get):
                return getattr(lib, set_), getattr(lib, get)
    return None


@pytest.fixture(scope="module", autouse=True)
def _one_blas_thread():
    """The NumPy reference multiplies 64-wide matrices: with two test workers on two cores,
    BLAS threads only spin against each other (five times slower), so use one per worker."""
    fns = _blas_threads()
    if fns is None:
        yield
        return
    set_, get = fns
    before = get()
    set_(1)
    yield
    set_(before)


# --- models (built once per module) ----------------------------------------------------------


def _model(fwd, vocab: int, seed: int) -> SimpleNamespace:
    from partita.autodiff.training import training_step
    from partita.backend.numpy_ref import run as run_np

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab, (B, T)).astype(np.int64)
    target = rng.integers(0, vocab, (B, T)).astype(np.int64)
    weights = {k: np.asarray(a) for k, a in fwd.weights.items()}
    fwd_want = run_np(fwd, {**weights, "ids": ids})
    step = training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.05, momentum=0.9)
    inputs = {"ids": ids, "target": target}
    want = run_np(step, {**{k: np.asarray(a) for k, a in step.weights.items()}, **inputs})
    return SimpleNamespace(fwd=fwd, step=step, inputs=inputs, want=want, ids=ids, fwd_want=fwd_want)


@pytest.fixture(scope="module")
def gpt2():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from partita.frontend.torch_export import import_torch
    from partita.passes.manager import PassManager
    from partita.runtime.demo import gpt2_from_config

    torch.manual_seed(0)
    m, cfg = gpt2_from_config(layers=LAYERS)
    fwd = import_torch(m, (torch.randint(0, cfg.vocab_size, (B, T)),))
    fwd = PassManager.parse("split-projections").run(fwd)
    out = _model(fwd, cfg.vocab_size, 0)
    out.layer = "h.{}"
    return out


@pytest.fixture(scope="module")
def llama():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from partita.frontend.torch_export import import_torch

    class Logits(torch.nn.Module):
        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(input_ids=ids, use_cache=False).logits

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
                                   max_position_embeddings=32, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    m = Logits(transformers.LlamaForCausalLM(cfg)).eval()
    fwd = import_torch(m, (torch.randint(0, 128, (B, T)),))
    out = _model(fwd, 128, 1)
    out.layer = "layers.{}"
    return out


def _pp(graph, mesh: str, strategy: str = "pp", **kw):
    from partita.parallel.spmd import parallelize

    return parallelize(graph, mesh, strategy, **kw)


def check_step(model, mesh: str, strategy: str = "pp", **kw):
    prog = _pp(model.step, mesh, strategy, **kw)
    got = prog.simulate(model.inputs)
    assert_outputs_match(got, model.want, model.step, f"{strategy} on {mesh} {kw}")
    return prog


# --- 1. schedules ----------------------------------------------------------------------------

SHAPES = [(1, 1), (1, 3), (2, 1), (2, 2), (2, 3), (2, 4), (2, 8), (3, 1), (3, 3), (3, 5), (3, 6), (4, 2), (4, 4),
          (4, 8), (4, 16)]


def _all_schedules():
    for S, M in SHAPES:
        for name in SCHEDULES:
            if name == "interleaved":
                if M % S == 0:
                    for v in (1, 2, 3):
                        yield name, S, M, v
            else:
                yield name, S, M, 1


ALL = list(_all_schedules())


@pytest.mark.parametrize("name,S,M,v", ALL)
def test_schedule_validates_and_has_every_action_once(name, S, M, v):
    s = make_schedule(name, S, M, v)
    s.validate()
    assert (s.name, s.stages, s.microbatches, s.virtual) == (name, S, M, v)
    kinds = 3 if s.split else 2
    assert sum(len(row) for row in s.actions) == S * v * M * kinds
    tl = s.simulate()
    assert tl.makespan > 0 and 0.0 <= tl.bubble < 1.0
    # Every dependency ends before the action that waits for it starts.
    for row in s.actions:
        for a in row:
            for d in s.deps(a):
                assert tl.end[d] <= tl.start[a]
        # A rank runs one action at a time, in its order.
        for a, b in zip(row, row[1:]):
            assert tl.end[a] <= tl.start[b]


@pytest.mark.parametrize("S,M", SHAPES)
def test_gpipe_and_1f1b_bubble_is_the_textbook_one(S, M):
    want = (S - 1) / (M + S - 1)
    assert make_schedule("gpipe", S, M).bubble() == pytest.approx(want)
    assert make_schedule("1f1b", S, M).bubble() == pytest.approx(want)


@pytest.mark.parametrize("S,M", [(S, M) for S, M in SHAPES if M % S == 0])
def test_interleaved_bubble_shrinks_by_the_virtual_stages(S, M):
    """The interleaved schedule's bubble: (S - 1) / (v M + S - 1) with unit action times."""
    for v in (1, 2, 3):
        assert make_schedule("interleaved", S, M, v).bubble() == pytest.approx((S - 1) / (v * M + S - 1))
    if S > 1:
        assert make_schedule("interleaved", S, M, 2).bubble() < make_schedule("1f1b", S, M).bubble()


@pytest.mark.parametrize("S,M", [(S, M) for S, M in SHAPES if S > 1])
def test_zero_bubble_beats_1f1b_with_the_same_memory_bound(S, M):
    zb, ob = make_schedule("zero-bubble", S, M), make_schedule("1f1b", S, M)
    if M >= S:
        assert zb.bubble() < ob.bubble()
        # Zero-bubble keeps 1F1B's peak: S microbatches on the first rank, none more anywhere.
        assert max(zb.in_flight()) == max(ob.in_flight()) == S
    else:
        assert zb.bubble() <= ob.bubble()


@pytest.mark.parametrize("S,M", SHAPES)
def test_in_flight_1f1b_vs_gpipe(S, M):
    assert make_schedule("gpipe", S, M).in_flight() == [M] * S
    held = make_schedule("1f1b", S, M).in_flight()
    if M >= S:
        assert held == [S - p for p in range(S)]
    else:
        assert held == [min(S - p, M) for p in range(S)]
    fo = make_schedule("1f1b", S, M, forward_only=True)
    fo.validate()
    assert fo.forward_only and fo.in_flight() == [1] * S


@pytest.mark.parametrize("name,S,M,v", [("gpipe", 2, 4, 1), ("1f1b", 4, 8, 1), ("interleaved", 2, 4, 2),
                                        ("zero-bubble", 3, 6, 1)])
def test_chart_has_one_row_per_rank(name, S, M, v):
    s = make_schedule(name, S, M, v)
    lines = s.chart().splitlines()
    rows = [x for x in lines if x.startswith("rank ")]
    assert len(rows) == S and lines[0].startswith(name)
    assert f"predicted bubble {s.bubble():.1%}" in lines[0]
    cells = int(round(s.simulate().makespan))
    for r, row in enumerate(rows):
        assert row.startswith(f"rank {r}")
        assert row.count("|") == cells + 1
        # Each action of the rank shows up in its row (F0, B3, ...).
        assert "F0" in row and (s.forward_only or "B0" in row)


# A weight is tied between two pp ranks, so tied cases need S > 1.
@pytest.mark.parametrize("name,S,M,v,tied", [x + (tied,) for x in ALL if x[1] > 1 or x[3] > 1
                                             for tied in (False, True) if not (tied and x[1] == 1)])
def test_program_order_sends_after_producer_recvs_before_consumer(name, S, M, v, tied):
    s = make_schedule(name, S, M, v)
    order = s.program_order(tied=tied)
    trs = s.transfers(tied=tied)
    last = s.chunks - 1
    acts = [t for t in trs if t.what == "act"]
    grads = [t for t in trs if t.what == "grad"]
    assert len(acts) == len(grads) == last * M
    assert len([t for t in trs if t.what == "tied"]) == (2 if tied else 0)
    glob = {t: i for i, t in enumerate(trs)}
    assert len(glob) == len(trs)
    for r, items in enumerate(order):
        assert [x for x in items if isinstance(x, Action)] == s.actions[r]
        pos = {x: i for i, x in enumerate(items)}
        mine = [x for x in items if isinstance(x, Transfer)]
        assert len(mine) == len(set(mine)) and set(mine) == {t for t in trs if r in (t.src, t.dst)}
        # The rank's transfers follow the one global order (so no two ranks wait on each other).
        assert [glob[t] for t in mine] == sorted(glob[t] for t in mine)
        for t in mine:
            if t.src == r and t.after is not None:
                assert pos[t.after] < pos[t], f"rank {r}: send {t} before {t.after}"
            if t.dst == r and t.before is not None:
                assert pos[t] < pos[t.before], f"rank {r}: recv {t} after {t.before}"
            if t.what == "tied":
                assert all(pos[a] < pos[t] for a in s.actions[r]), "tied gradients cross after the step"
    # Every hand-over goes from the producing chunk's rank to the consuming chunk's.
    for t in acts + grads:
        assert t.src == s.rank_of(t.after.chunk) and t.dst == s.rank_of(t.before.chunk)
        assert t.before.mb == t.after.mb
        assert t.before.chunk == t.after.chunk + (1 if t.what == "act" else -1)


def _sched(actions, S=2, M=1, **kw):
    return Schedule("hand-made", S, 1, M, actions, **kw)


@pytest.mark.parametrize("actions,words", [
    # F of chunk 1 on rank 0
    ([[Action("F", 1, 0), Action("B", 0, 0)], [Action("F", 0, 0), Action("B", 1, 0)]], ["rank 0", "chunk 1", "rank 1"]),
    # B before its F
    ([[Action("B", 0, 0), Action("F", 0, 0)], [Action("F", 1, 0), Action("B", 1, 0)]], ["B0", "chunk 0", "before"]),
    # rank 1 never runs its backward
    ([[Action("F", 0, 0), Action("B", 0, 0)], [Action("F", 1, 0)]], ["never runs", "B0", "chunk 1"]),
    # an action twice
    ([[Action("F", 0, 0), Action("F", 0, 0), Action("B", 0, 0)], [Action("F", 1, 0), Action("B", 1, 0)]],
     ["twice"]),
    # a W in a schedule that does not split the backward
    ([[Action("F", 0, 0), Action("B", 0, 0), Action("W", 0, 0)], [Action("F", 1, 0), Action("B", 1, 0)]],
     ["only F, B"]),
])
def test_invalid_schedule_fails_validate(actions, words):
    with pytest.raises(PipelineError) as e:
        _sched(actions).validate()
    for w in words:
        assert w in str(e.value), str(e.value)


def test_split_schedule_needs_its_w():
    s = _sched([[Action("F", 0, 0), Action("B", 0, 0)], [Action("F", 1, 0), Action("B", 1, 0), Action("W", 1, 0)]],
               split=True)
    with pytest.raises(PipelineError, match="rank 0 never runs W0 of chunk 0"):
        s.validate()


def test_deadlocking_order_fails_simulate():
    # Rank 0 wants B0 (needs rank 1's B0) before F1; rank 1 runs F1 (needs rank 0's F1) first.
    s = _sched([[Action("F", 0, 0), Action("B", 0, 0), Action("F", 0, 1), Action("B", 0, 1)],
                [Action("F", 1, 1), Action("B", 1, 1), Action("F", 1, 0), Action("B", 1, 0)]], M=2)
    s.validate()  # each rank's own order is fine
    with pytest.raises(PipelineError, match="cannot finish") as e:
        s.simulate()
    assert "rank 0 at B0 of chunk 0" in str(e.value) and "rank 1 at F1 of chunk 1" in str(e.value)
    with pytest.raises(PipelineError):
        s.program_order()


def test_schedule_aliases_and_counts():
    assert make_schedule("GPipe", 2, 2).name == "gpipe"
    assert make_schedule("pipedream-flush", 2, 2).name == "1f1b"
    assert make_schedule("zb", 2, 2).name == "zero-bubble"
    assert make_schedule("interleaved-1f1b", 2, 2, 2).name == "interleaved"
    for bad in (0, -1, 1.5, True):
        with pytest.raises(PipelineError, match="must be a positive int"):
            make_schedule("1f1b", 2, bad)
    with pytest.raises(PipelineError, match="one of gpipe"):
        make_schedule(None, 2, 2)


# --- 2. meaning: the pipelined step is the single-device step -------------------------------


def _ms(S: int, interleaved: bool = False) -> list[int]:
    ms = [1, S, 2 * S, 4 * S]
    return [m for m in ms if B % m == 0 and not (interleaved and m % S)]


GPT2_CASES = [("pp=2", name, M, 1) for name in ("gpipe", "1f1b", "zero-bubble") for M in _ms(2)] \
    + [("pp=2", "interleaved", M, 2) for M in _ms(2, True)] \
    + [("pp=4", name, M, 1) for name in ("gpipe", "1f1b", "zero-bubble") for M in _ms(4)] \
    + [("pp=3", "gpipe", 2, 1), ("pp=3", "1f1b", 4, 1), ("pp=3", "zero-bubble", 8, 1)]   # uneven: 2 + 1 + 1 layers


@pytest.mark.parametrize("mesh,schedule,M,v", GPT2_CASES)
def test_gpt2_step_matches_one_device(gpt2, mesh, schedule, M, v):
    prog = check_step(gpt2, mesh, microbatches=M, schedule=schedule, virtual_stages=v)
    S = int(mesh.split("=")[1])
    assert len(prog.stages) == S and prog.schedule.name == schedule and prog.schedule.microbatches == M
    assert prog.pipeline.tied == [GPT2_TIED]


LLAMA_CASES = [("pp=2", name, M, 1) for name in ("gpipe", "1f1b", "zero-bubble") for M in (1, 4)] \
    + [("pp=2", "interleaved", 2, 2), ("pp=2", "interleaved", 8, 2), ("pp=4", "1f1b", 4, 1),
       ("pp=4", "zero-bubble", 8, 1)]


@pytest.mark.parametrize("mesh,schedule,M,v", LLAMA_CASES)
def test_llama_step_matches_one_device(llama, mesh, schedule, M, v):
    prog = check_step(llama, mesh, microbatches=M, schedule=schedule, virtual_stages=v)
    assert prog.pipeline.tied == []


COMPOSED = [
    ("pp=2,dp=2", "pp+dp", "1f1b", 2, 1),
    ("pp=2,dp=2", "pp+dp", "interleaved", 4, 2),
    ("pp=4,dp=2", "pp+dp", "1f1b", 4, 1),          # middle stages read no batch input
    ("pp=2,tp=2", "pp+megatron", "gpipe", 4, 1),
    ("pp=4,tp=2", "pp+megatron", "zero-bubble", 4, 1),
    ("pp=2,dp=2,tp=2", "pp+dp+megatron", "1f1b", 4, 1),
    ("pp=2,dp=2,tp=2", "pp+dp+megatron", "zero-bubble", 2, 1),
    ("pp=2,dp=2,tp=2", "pp+zero1+megatron", "1f1b", 2, 1),
    ("pp=2,dp=2,tp=2", "pp+dp+megatron+sp", "1f1b", 2, 1),
    ("pp=2,dp=2,tp=2", "pp+zero3+megatron", "gpipe", 2, 1),
    ("dp=2,pp=2", "pp+zero2", "gpipe", 2, 1),       # the pp axis need not come first
    ("pp=2,tp=4", "pp+megatron", "1f1b", 2, 1),
]


@pytest.mark.parametrize("mesh,strategy,schedule,M,v", COMPOSED)
def test_gpt2_composed_matches_one_device(gpt2, mesh, strategy, schedule, M, v):
    prog = check_step(gpt2, mesh, strategy, microbatches=M, schedule=schedule, virtual_stages=v)
    assert prog.submesh is not None and len(prog.rank_graphs()) == prog.mesh.size


@pytest.mark.parametrize("mesh,strategy,schedule,M", [("pp=2,dp=2,tp=2", "pp+dp+megatron", "1f1b", 2),
                                                      ("pp=2,tp=2", "pp+megatron+sp", "zero-bubble", 4)])
def test_llama_composed_matches_one_device(llama, mesh, strategy, schedule, M):
    check_step(llama, mesh, strategy, microbatches=M, schedule=schedule)


def _output_of(step, param: str) -> int:
    for i, a in enumerate(step.output_aliases):
        if a is not None and str(a.name) == param:
            return i
    raise AssertionError(f"no updated %{param} among the outputs")


@pytest.mark.parametrize("mesh,strategy,M", [("pp=2", "pp", 4), ("pp=4", "pp", 4), ("pp=2,tp=2", "pp+megatron", 2)])
def test_gpt2_tied_embedding_is_shared_by_first_and_last_stage(gpt2, mesh, strategy, M):
    prog = _pp(gpt2.step, mesh, strategy, microbatches=M)
    assert prog.pipeline.tied == [GPT2_TIED] and prog.plan.tied == [GPT2_TIED]
    S = prog.schedule.stages
    assert sorted(prog.pipeline.owners[GPT2_TIED]) == [0, S - 1]
    assert "%" + GPT2_TIED in prog.plan.summary()
    got = prog.simulate(gpt2.inputs)
    i = _output_of(gpt2.step, GPT2_TIED)
    assert rel_err(got[i], gpt2.want[i]) <= TOL
    # Each of the two ranks sends its gradient of the shared weight once per step, and the
    # middle ranks take no part.
    for r, g in enumerate(prog.rank_graphs()):
        p = prog.coords(r)[0]
        sends = [n for n in g.nodes if n.op == "send" and "shared" in n.attrs.get("tag", "")]
        recvs = [n for n in g.nodes if n.op == "recv" and "shared" in n.attrs.get("tag", "")]
        want = 1 if p in (0, S - 1) else 0
        assert (len(sends), len(recvs)) == (want, want), (r, len(sends), len(recvs))
    # The update is real (both stages' gradients in it), not the unchanged weight.
    before = np.asarray(gpt2.step.weights[GPT2_TIED])
    assert rel_err(got[i], before) > 10 * TOL
    # Both stages hold the same updated copy after the step.
    outs = prog.stages[0].local, prog.stages[-1].local
    assert all(any(a is not None and str(a.name) == GPT2_TIED for a in g.output_aliases) for g in outs)


@pytest.fixture(scope="module")
def gpt2_steps(gpt2):
    """GPT-2's gradients without an update, an AdamW step, and an SGD step that recomputes."""
    from partita.autodiff.training import training_step
    from partita.backend.numpy_ref import run as run_np

    out = {"grads": training_step(gpt2.fwd, loss="cross_entropy", optimizer=None),
           "adamw": training_step(gpt2.fwd, loss="cross_entropy", optimizer="adamw", lr=1e-3),
           "recompute": training_step(gpt2.fwd, loss="cross_entropy", optimizer="sgd", lr=0.05, recompute=True)}
    return {k: SimpleNamespace(step=g, inputs=gpt2.inputs,
                               want=run_np(g, {**{n: np.asarray(a) for n, a in g.weights.items()}, **gpt2.inputs}))
            for k, g in out.items()}


@pytest.mark.parametrize("kind,mesh,strategy,schedule,M", [
    ("grads", "pp=2", "pp", "1f1b", 4),
    ("grads", "pp=2,dp=2", "pp+dp", "zero-bubble", 2),
    ("recompute", "pp=2", "pp", "interleaved", 4),
])
def test_gpt2_gradients_and_recompute_match_one_device(gpt2_steps, kind, mesh, strategy, schedule, M):
    model = gpt2_steps[kind]
    check_step(model, mesh, strategy, microbatches=M, schedule=schedule,
               virtual_stages=2 if schedule == "interleaved" else 1)


def test_gpt2_adamw_matches_one_device_but_for_zero_gradients(gpt2_steps):
    """AdamW's state (moments, the step counter) lives with each param on its stage; the
    params whose gradient is exactly zero on one device (attention's key bias: softmax does
    not change when a constant is added to every score of a row) get +-lr from rounding
    noise, so they are left out."""
    grads, adam = gpt2_steps["grads"], gpt2_steps["adamw"]
    zero = {str(v.name)[:-len(".grad")] for v, g in zip(grads.step.outputs[1:], grads.want[1:])
            if np.abs(g).max() < 1e-6}
    assert zero and all("attn" in z for z in zero)
    prog = _pp(adam.step, "pp=2", microbatches=4, schedule="1f1b")
    got = prog.simulate(adam.inputs)
    checked = 0
    for i, (o, w, v) in enumerate(zip(got, adam.want, adam.step.outputs)):
        a = adam.step.output_aliases[i] if i < len(adam.step.output_aliases) else None
        if a is not None and str(a.name) in zero:
            continue
        assert rel_err(o, w) <= TOL, f"%{v.name}"
        checked += 1
    assert checked == len(got) - len(zero)


# --- 3. hypothesis: random cuts and microbatch counts ---------------------------------------


def _cut(model, S: int, data, v: int = 1) -> list:
    k = S * v
    # A composition of LAYERS into k positive parts: k - 1 distinct cut positions.
    cuts = sorted(data.draw(st.lists(st.integers(1, LAYERS - 1), min_size=k - 1, max_size=k - 1, unique=True)))
    bounds = [0] + cuts + [LAYERS]
    counts = [b - a for a, b in zip(bounds, bounds[1:])]
    if data.draw(st.booleans()):
        return [model.layer.format(c) for c in cuts]
    return counts


def _random_cut_case(model, S: int, data) -> None:
    names = ["gpipe", "1f1b", "zero-bubble"] + (["interleaved"] if 2 * S <= LAYERS else [])
    schedule = data.draw(st.sampled_from(names))
    v = 2 if schedule == "interleaved" else 1
    M = data.draw(st.sampled_from([m for m in (1, 2, 4, 8) if not (v > 1 and m % S)]))
    stages = _cut(model, S, data, v)
    prog = check_step(model, f"pp={S}", microbatches=M, schedule=schedule, virtual_stages=v, stages=stages)
    layers = [len(c.layers) for c in prog.pipeline.cut.chunks]
    if all(isinstance(x, int) for x in stages):
        assert layers == stages
    else:
        assert [c.layers[0].endswith(s) for c, s in zip(prog.pipeline.cut.chunks[1:], stages)] == [True] * len(stages)
    assert sum(layers) == LAYERS


@settings(max_examples=15, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_hypothesis_random_cuts_pp2(gpt2, data):
    _random_cut_case(gpt2, 2, data)


@settings(max_examples=15, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_hypothesis_random_cuts_pp4(gpt2, data):
    _random_cut_case(gpt2, 4, data)


# --- 4. forward only (inference) ------------------------------------------------------------


@pytest.mark.parametrize("mesh,strategy,M,kw", [
    ("pp=2", "pp", 1, {}),
    ("pp=2", "pp", 2, {}),
    ("pp=2", "pp", 8, {}),
    ("pp=4", "pp", 4, {}),
    ("pp=2", "pp", 4, {"schedule": "interleaved", "virtual_stages": 2}),
    ("pp=2", "pp", 2, {"stages": [1, 3]}),
    ("pp=2,dp=2", "pp+dp", 4, {}),              # rows of a microbatch come back in order
    ("pp=4,dp=2", "pp+dp", 2, {}),              # middle stages read no batch input
    ("pp=2,tp=2", "pp+megatron", 2, {}),
])
def test_gpt2_forward_only_matches_one_device(gpt2, mesh, strategy, M, kw):
    prog = _pp(gpt2.fwd, mesh, strategy, microbatches=M, **kw)
    assert prog.schedule.forward_only and not prog.pipeline.training
    got = prog.simulate({"ids": gpt2.ids})
    assert_outputs_match(got, gpt2.fwd_want, gpt2.fwd, f"forward {strategy} on {mesh} M={M} {kw}")


def test_llama_forward_only_matches_one_device(llama):
    prog = _pp(llama.fwd, "pp=2", "pp", microbatches=4)
    assert_outputs_match(prog.simulate({"ids": llama.ids}), llama.fwd_want, llama.fwd, "llama forward")


# --- 5. the plan report ---------------------------------------------------------------------


@pytest.mark.parametrize("S,M", [(2, 4), (4, 8)])
def test_plan_report_1f1b_vs_gpipe(gpt2, S, M):
    plans = {name: _pp(gpt2.step, f"pp={S}", microbatches=M, schedule=name).plan for name in ("1f1b", "gpipe")}
    for name, plan in plans.items():
        sched = make_schedule(name, S, M)
        assert plan.schedule == name and plan.stages == S and plan.microbatches == M
        assert plan.chart == sched.chart()
        assert plan.bubble == pytest.approx((S - 1) / (M + S - 1))
        summary, text = plan.summary(), plan.text()
        assert f"schedule {name}" in summary and f"{M} microbatches" in summary
        assert f"predicted bubble {plan.bubble:.1%}" in summary
        assert plan.chart in text and summary in text
        assert len([x for x in text.splitlines() if x.startswith("rank ")]) == S
        assert len(plan.per_stage) == S
        assert [lay for s in plan.per_stage for lay in s.layers] == \
            [f"lm.transformer.h.{i}" for i in range(LAYERS)]
        for p, s in enumerate(plan.per_stage):
            assert s.rank == p and s.param_bytes > 0 and s.activation_bytes_per_microbatch > 0
            assert s.peak_activation_bytes == s.activation_bytes_per_microbatch * s.in_flight
            assert s.sends > 0 and s.recvs > 0 and s.sent_bytes > 0
        d = json.loads(plan.to_json())
        assert d["schedule"] == name and d["chart"] == plan.chart and len(d["per_stage"]) == S
    assert [s.in_flight for s in plans["1f1b"].per_stage] == [S - p for p in range(S)]
    assert [s.in_flight for s in plans["gpipe"].per_stage] == [M] * S
    assert plans["1f1b"].per_stage[0].peak_activation_bytes < plans["gpipe"].per_stage[0].peak_activation_bytes
    assert plans["1f1b"].per_stage[0].activation_bytes_per_microbatch == \
        plans["gpipe"].per_stage[0].activation_bytes_per_microbatch


def test_plan_report_composed_mentions_the_stage_plans(gpt2):
    plan = _pp(gpt2.step, "pp=2,dp=2,tp=2", "pp+dp+megatron", microbatches=2, schedule="zero-bubble").plan
    s = plan.summary()
    assert "schedule zero-bubble" in s and "stage 0:" in s and "stage 1:" in s
    assert all(sp is not None for sp in plan.stage_plans)
    assert plan.chart in plan.text() and "B = W = 1" in plan.chart


def test_plan_report_interleaved(gpt2):
    plan = _pp(gpt2.step, "pp=2", microbatches=4, schedule="interleaved", virtual_stages=2).plan
    assert "x 2 virtual" in plan.summary() and plan.virtual_stages == 2
    assert [s.chunks for s in plan.per_stage] == [[0, 2], [1, 3]]
    assert plan.bubble == pytest.approx(1 / 9)


# --- 6. bad options -------------------------------------------------------------------------

BAD = [
    ("pp=2", "pp", {"microbatches": 3}, PipelineError, ["microbatches=3", "does not divide", "8 rows", "1, 2, 4, 8"]),
    ("pp=2,dp=2", "pp+dp", {"microbatches": 8}, PipelineError, ["1 rows", "data-parallel", "fewer microbatches"]),
    ("pp=8", "pp", {}, PipelineError, ["8 chunk(s)", "4 (h.0, h.1, h.2, h.3) layers", "at most 4 pipeline stages"]),
    ("pp=2", "pp", {"stages": ["h.9"]}, PipelineError, ["'h.9'", "names no layer", "did you mean", "h.0 .. h.3"]),
    ("pp=4", "pp", {"stages": ["h.2"]}, PipelineError, ["stages=['h.2']", "4 chunks need 3", "e.g. stages=['h."]),
    ("pp=2", "pp", {"stages": ["h.0"]}, PipelineError, ["'h.0'", "before the first layer"]),
    ("pp=4", "pp", {"stages": ["h.3", "h.1", "h.2"]}, PipelineError, ["increasing layer order"]),
    ("pp=2", "pp", {"stages": [1, 2]}, PipelineError, ["stages=[1, 2]", "sum to the model's 4 layers",
                                                       "e.g. stages=[2, 2]"]),
    ("pp=2", "pp", {"stages": [1, 1, 2]}, PipelineError,
     ["stages=[1, 1, 2]", "2 positive counts", "e.g. stages=[2, 2]"]),
    ("pp=2", "pp", {"stages": [0, 4]}, PipelineError, ["positive counts"]),
    ("pp=2", "pp", {"stages": "h.2"}, PipelineError, ["stages='h.2'", "stages=['h.2']"]),
    ("pp=2", "pp", {"stages": [1.5, 2.5]}, PipelineError, ["layer names", "layer counts"]),
    ("pp=4", "pp", {"schedule": "interleaved", "virtual_stages": 2, "microbatches": 4}, PipelineError,
     ["8 chunk(s)", "4 pp ranks x virtual_stages=2", "pp ranks x virtual_stages <= 4"]),
    ("pp=2", "pp", {"schedule": "interleaved", "virtual_stages": 2, "microbatches": 3}, PipelineError,
     ["microbatches=3", "not a multiple of the 2 pp ranks", "microbatches=2 or 4"]),
    ("pp=2", "pp", {"schedule": "1f1c"}, PipelineError, ["'1f1c'", "did you mean '1f1b'", "gpipe, 1f1b"]),
    ("pp=2", "pp", {"schedule": "bogus"}, PipelineError,
     ["'bogus'", "choose one of gpipe, 1f1b, interleaved, zero-bubble"]),
    ("pp=2", "pp", {"virtual_stages": 2}, PipelineError, ["virtual_stages=2", "schedule='interleaved'", "'1f1b'"]),
    ("pp=2", "pp", {"virtual_stages": 2, "schedule": "zero-bubble"}, PipelineError,
     ["virtual_stages=2", "schedule='interleaved'", "leave virtual_stages out"]),
    ("pp=2", "pp", {"microbatches": 0}, PipelineError, ["microbatches", "positive int", "got 0"]),
    ("pp=2", "pp", {"virtual_stages": 0, "schedule": "interleaved"}, PipelineError, ["virtual_stages", "got 0"]),
    ("dp=2", "dp", {"microbatches": 2}, StrategyError, ["microbatches", "no 'pp'", "pp+dp"]),
    ("dp=2", "dp", {"schedule": "gpipe"}, StrategyError, ["schedule", "no 'pp'", "leave schedule out"]),
    ("dp=2", "dp", {"stages": [2, 2]}, StrategyError, ["stages", "no 'pp'"]),
    ("pp=2,tp=2", "pp+dp", {}, StrategyError, ["dp needs a mesh axis named 'dp'", "mesh(pp=2, tp=2)"]),
    ("pp=2", "pp+dp", {}, StrategyError, ["same mesh axis 'pp'", "pp=2,dp=2"]),
    ("pp=2,dp=2", "pp", {}, PipelineError, ["the mesh axes dp have no strategy", "'pp+dp'", "'pp=2'"]),
]


@pytest.mark.parametrize("mesh,strategy,kw,exc,words", BAD, ids=[f"{b[1]}-{b[0]}-{b[2]}" for b in BAD])
def test_bad_options_are_clear_errors(gpt2, mesh, strategy, kw, exc, words):
    with pytest.raises(exc) as e:
        _pp(gpt2.step, mesh, strategy, **kw)
    msg = str(e.value)
    for w in words:
        assert w in msg, f"{w!r} not in: {msg}"


def test_pipeline_error_is_a_strategy_error():
    assert issubclass(PipelineError, StrategyError)


def test_llama_stages_recompute_the_rotary_tables_and_send_only_the_residual_stream(llama):
    # The rotary tables come from a buffer (role "state") and the positions: each later
    # stage recomputes them instead of receiving them, and a buffer read on several stages
    # is not a shared weight.
    prog = _pp(llama.step, "pp=4", "pp", microbatches=4)
    for ch in prog.pipeline.cut.chunks[1:]:
        assert len(ch.recv) == 1 and ch.recomputed, (ch.index, len(ch.recv), len(ch.recomputed))
    assert prog.pipeline.tied == []
    got = prog.simulate(llama.inputs)
    assert rel_err(got[0], llama.want[0]) <= TOL


def test_sequence_parallel_stages_send_each_ranks_sequence_piece(gpt2):
    # With sp the residual stream between layers is split over tp along the sequence: a
    # stage sends that piece (a 1/tp share), as Megatron-LM does, not the gathered tensor.
    prog = _pp(gpt2.step, "pp=2,tp=2", "pp+megatron+sp", microbatches=2)
    T = gpt2.inputs["ids"].shape[1]
    acts = [n for n in prog.rank_graphs()[0].nodes if n.op == "send" and "activation" in n.attrs.get("tag", "")]
    assert acts and all(n.operands[0].type.shape[1] == T // 2 for n in acts), [n.operands[0].type for n in acts]
    got = prog.simulate(gpt2.inputs)
    assert rel_err(got[0], gpt2.want[0]) <= TOL


def test_annotations_place_the_stages_inputs_and_refuse_intermediate_values(gpt2):
    w = "lm.transformer.h.3.mlp.c_fc.weight"
    prog = _pp(gpt2.step, "pp=2,dp=2", "pp+dp", microbatches=2, annotations={w: "[-, dp]"})
    assert prog.stages[1].plan.placements[w] == "[-, dp]"
    got = prog.simulate(gpt2.inputs)
    assert rel_err(got[0], gpt2.want[0]) <= TOL
    with pytest.raises(PipelineError, match=r"annotations may place the graph's inputs .* %17 is not one"):
        _pp(gpt2.step, "pp=2,dp=2", "pp+dp", microbatches=2, annotations={"17": "[dp, -]"})


# --- recomputation by layer in the chunks' backward -------------------------------------------


@pytest.mark.parametrize("mesh,strategy,schedule", [("pp=2,dp=2", "pp+dp", "1f1b"), ("pp=2", "pp", "zero-bubble")])
def test_gpt2_full_recompute_in_every_chunk_matches_one_device(gpt2, mesh, strategy, schedule):
    """recompute="full" reruns each layer's forward cone in its chunk's backward: the ranks'
    programs hold the marked clones (in B, before W), and simulate still gives the
    single-device step."""
    from partita.autodiff.recompute import recomputed_nodes

    prog = check_step(gpt2, mesh, strategy, microbatches=4, schedule=schedule, recompute="full")
    for cp in prog.pipeline.chunks:
        rc = recomputed_nodes(cp.graph)
        assert rc and rc <= set(cp.B), cp.index
    per_rank = [len(recomputed_nodes(g)) for g in prog.rank_graphs()]
    # Each rank runs its chunk's clones once per microbatch (the partition keeps the marks).
    assert per_rank[0] == 4 * len(recomputed_nodes(prog.pipeline.chunks[0].graph)), per_rank
    assert all(per_rank), per_rank


def test_pipeline_takes_the_steps_recompute_policy_and_refuses_another(gpt2):
    from partita.autodiff.recompute import recompute_policy_of
    from partita.autodiff.training import training_step

    step = training_step(gpt2.fwd, loss="cross_entropy", optimizer="sgd", lr=0.05, momentum=0.9, recompute="full")
    prog = _pp(step, "pp=2", microbatches=2)
    assert all(recompute_policy_of(cp.graph) == "full" for cp in prog.pipeline.chunks)
    assert prog.simulate(gpt2.inputs) is not None
    with pytest.raises(PipelineError, match="was built with recompute='full'"):
        _pp(step, "pp=2", microbatches=2, recompute="selective")
    with pytest.raises(PipelineError, match="forward graph"):
        _pp(gpt2.fwd, "pp=2", microbatches=2, recompute="full")
    with pytest.raises(StrategyError, match="training_step"):
        _pp(gpt2.step, "dp=2", "dp", recompute="full")


def test_master_weights_keep_their_optimizer_in_a_pipeline():
    """adamw with master_weights updates each bf16 param's f32 master copy (``<p>.master``,
    from the gradient cast to f32) and casts the new param back: every stage keeps those
    updates for its params, and every output of the step comes from some stage."""
    import partita

    fwd = partita.models.gpt(layers=4, hidden=64, heads=4, seq=16, vocab=128, batch=16, dtype="bf16")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True)
    updates = sum(n.op == "adamw_update" for n in step.nodes)
    prog = _pp(step, "pp=2,dp=2", "pp+dp", microbatches=4)
    per_stage = [sum(n.op == "adamw_update" for n in st.local.nodes) for st in prog.stages]
    # The tied embedding is updated on both of its stages.
    assert sum(per_stage) == updates + len(prog.pipeline.tied) and min(per_stage) > 0
    given = {i for rp in prog.pipeline.ranks for i in rp.source_index if i is not None}
    assert given == set(range(len(step.outputs)))
    names = {str(v.name) for st in prog.stages for v in st.local.outputs}
    assert "transformer.wte.weight.1" in names and "transformer.wte.weight.master.1" in names


@pytest.mark.parametrize("unroll", [True, False])
def test_tied_gradient_is_communicated_once_per_step_not_per_microbatch(unroll):
    """The tied embedding's gradient is summed over the microbatches first and reduced over dp
    (gathered over tp) once; the first stage does not gather each microbatch's activations over
    dp to avoid that reduction (the template's propagation prices a microbatch section's
    reshards M times, driver._template_repeat)."""
    import collections

    import partita

    fwd = partita.models.gpt(layers=4, hidden=64, heads=4, seq=16, vocab=128, batch=16, dtype="f32")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd")
    rng = np.random.default_rng(0)
    w = {str(v.name): (rng.standard_normal(v.type.shape) * 0.1).astype(np.float32)
         for v in step.inputs if v.role == "param"}
    feed = {"ids": rng.integers(0, 128, (16, 16)), "target": rng.integers(0, 128, (16, 16))}
    for M in (4, 8):
        prog = partita.parallelize(step, mesh="pp=2,dp=2,tp=2", strategy="pp+dp+megatron", microbatches=M,
                                   unroll=unroll)
        graphs = prog.rank_graphs() if unroll else [t.local for t in prog.templates]
        for r, g in enumerate(graphs):
            dp_ops = collections.Counter(n.op for n in g.nodes if n.attrs.get("axis") == "dp")
            assert dp_ops == {"all_reduce": 1}, f"M={M}, program {r}: {dict(dp_ops)}"
        if unroll and M == 4:
            want = partita.run(step, feed, w)
            got = prog.simulate(feed, w)
            for v, a, b in zip(step.outputs, got, want):
                np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5, err_msg=f"%{v.name}")


def test_sequence_parallel_weight_gradients_in_a_pipeline_are_not_full_size_partial_sums():
    """A pipeline template's weight gradient is summed every microbatch at its local size:
    propagation prices that (propagate.ACCUMULATE_BYTES), so a sequence-parallel layer gathers
    the activation and computes its gradient's shard (Megatron-LM's plan), instead of summing a
    full-size partial gradient each microbatch and reduce-scattering it once (the shapes are
    those at which the second moves fewer bytes)."""
    import collections

    import partita

    fwd = partita.models.gpt(layers=2, hidden=4096, heads=32, seq=1024, vocab=1024, batch=8, dtype="bf16",
                             attention="eager", dropout=0.1)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True,
                                 recompute="selective")
    prog = partita.parallelize(step, mesh="pp=2,tp=8", strategy="pp+megatron+sp", microbatches=8, unroll=False)
    shapes = {tuple(v.type.shape) for v in step.inputs if v.role == "param" and v.type.rank == 2}
    for t in prog.templates:
        once = collections.Counter(str(n.operands[0].type) for n in t.local.nodes
                                   if n.op == "reduce_scatter" and t.sections[n][0] == "opt"
                                   and tuple(n.operands[0].type.shape) in shapes)
        assert not once, f"pp rank {t.rank}: full-size weight gradients reduce-scattered once per step: {dict(once)}"
