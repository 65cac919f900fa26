"""Benchmark of partita's pipeline parallelism against PyTorch's ``torch.distributed.pipelining``.

    .venv/bin/python bench/bench_pipeline.py                 # every case (about 15 to 18 minutes)
    .venv/bin/python bench/bench_pipeline.py --quick         # pp=2, 1f1b, few steps (under 2 minutes)
    .venv/bin/python bench/bench_pipeline.py --cases pp2-1f1b pp4-zero-bubble --rounds 5
    .venv/bin/python bench/bench_pipeline.py --compile       # parallelize time and program size only
    .venv/bin/python bench/bench_pipeline.py --profile pp2-interleaved-v2   # where a step's time goes

1. **pipeline** (the default): GPT-2 (8 layers, 256 wide, 4 heads, vocab 1024, random weights
   from a config), a batch of 16 x 64 tokens cut into M = 8 microbatches, SGD (lr 0.01,
   momentum 0.9), loss = cross entropy averaged over the whole batch. Every case runs the same
   stage cut on both sides: contiguous transformer blocks, an equal count per model chunk
   (partita: ``stages=[layers per chunk] * chunks``), the embeddings on the first chunk, the
   final norm, the head and the loss on the last. The cases (pp ranks x chunks per rank):

   ====================  ======================================  ===========================================
   case                  partita                                 torch.distributed.pipelining
   ====================  ======================================  ===========================================
   pp2/pp4 gpipe         ``schedule="gpipe"``                    ``ScheduleGPipe``
   pp2/pp4 1f1b          ``schedule="1f1b"``                     ``Schedule1F1B``
   pp2/pp4 interleaved   ``schedule="interleaved"``, v=2          ``ScheduleInterleaved1F1B``, 2 stages/rank
   pp2/pp4 zero-bubble   ``schedule="zero-bubble"`` (ZB-H1)      ``ScheduleInterleavedZeroBubble``, 1 stage
                                                                 per rank (ZB-H1: B and W split, the first
                                                                 ``rank`` W passes deferred to the drain)
   ====================  ======================================  ===========================================

   partita's side is ``partita.parallelize(step, "pp=S", "pp", microbatches=M, schedule=...)``
   of the imported training step, run by ``partita.launch`` (one process per rank, gloo, one
   thread each). Its step time is ``LaunchResult.step_seconds`` (per step, the slowest rank's
   time inside its program; the ranks run their steps back to back), the median over the
   steps after the first two.

   The peer's side: one ``PipelineStage`` per model chunk, each an ``nn.Module`` wrapping the
   same GPT-2's submodules (``wte + wpe + blocks`` first, ``blocks`` in the middle, ``blocks +
   ln_f + lm_head`` last), on ranks spawned with ``torch.multiprocessing``, gloo on loopback,
   ``torch.set_num_threads(1)``; the loss function is the per-microbatch mean cross entropy
   and the schedules' default ``scale_grads=True`` divides the gradients by M (so they are
   the whole-batch mean's). GPT-2 ties ``lm_head.weight`` to ``wte.weight``: the peer's last
   chunk holds an untied copy, and after ``schedule.step()`` the two gradients are summed by
   an ``all_reduce`` between the first and the last chunk's ranks, before ``optimizer.step()``
   on every rank, so both copies take the same update (partita does the same sum, by a
   send/recv swap of the two gradients). Its step is ``schedule.step() + tie all_reduce +
   optimizer.step() + zero_grad()``, timed on every rank two ways in the same processes:
   after a ``dist.barrier()`` ("barrier": the step's makespan) and back to back without one
   (as partita's launch runs its steps); a step's time is the slowest rank's.

   Equivalence before timing, for every case: from the same initial weights, one step of each
   side against the single-device eager step of the same model (tied weights): partita's loss
   and the peer's (the mean of its microbatch losses, as the last rank reports them) within
   1e-4 relative of the single-device loss; every updated param within rtol 1e-4 / atol 1e-6
   elementwise; every momentum buffer (after one step: the gradient itself) within 1e-4 by
   norm. (partita's ``launch(check=True)`` also compares its step with partita's own
   single-device graph.) A mismatch raises ``EquivalenceError`` and nothing is timed.

   Then rounds: each round times one launch of partita's ranks and one of the peer's (who goes
   first alternates), each ``--steps`` steps; a side's round time is the median of its steps
   after the first two; the ratio partita / peer is the median of the per-round ratios (< 1:
   partita is faster).

   Bubble: partita's predicted one (``plan.bubble``, the schedule on a unit time model) and its
   measured one (``plan.measured_bubble``: per step, the time the ranks spent inside recvs over
   the slowest rank's step time, averaged over ranks and steps). The peer's measured in the
   same way from the time its ranks spend inside ``_wait_batch_p2p`` (the waits of its p2p
   works: recvs, and sends where a schedule batches them with recvs), over the slowest rank's
   step time. Bytes sent per step per rank: partita's ``plan.per_stage[p].sent_bytes`` (its
   sends' operands: activations, their gradients, the tied weight's gradient); the peer's
   counted from the tensors of the ``isend`` ops its schedule issues in a step (wrapping
   ``_batch_p2p``), plus the tie all_reduce's ring bytes (2 (n-1)/n of the gradient, n = 2).

2. **profile** (``--profile CASE ...``): where a step's time goes, in one set of spawned
   processes running one step of each variant in turn (each after a barrier): partita's
   per-rank program as ``launch`` runs it, with a clock around every send and recv (time in
   sends, in recvs, and the rest: compute, the optimizer, the executor); two what-ifs that
   are not partita's executor, to price its blocking point-to-point ops (sends started with
   ``isend`` and waited for at the end of the step; and also recvs posted with ``irecv`` where
   they stand and waited for where their tensor is first read, as the peer's runtime does);
   and the peer's step with a clock around each F, B and W of its stages and its p2p waits.
   It also lists the longest sends and recvs of partita's last step. No equivalence check
   (the what-ifs' losses are compared with the program's).

3. **compile** (``--compile``): ``partita.parallelize`` of the AdamW training step of GPT-2
   (12 layers, 768 wide, vocab 50257, positions 1024; its q/k/v projection split by
   ``split-projections``) on mesh ``pp=4,dp=2,tp=2`` with ``pp+dp+megatron``, 1f1b: the median
   time of a few runs at M=16 (target < 3 s) and, for M = 4, 16 and 64, the time, the per-rank
   program size (nodes) and the plan's timings. The import and the step build are timed
   apart and not included. No processes are started.

Results go to bench/results/bench_pipeline.json (``--out`` to change; ``--compile`` writes
bench/results/bench_pipeline_compile.json, ``--profile`` bench/results/bench_pipeline_profile.json)
and markdown tables to stdout.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
# Spawned ranks import this module by name: both directories must be on their path.
for _p in (str(ROOT), str(BENCH_DIR)):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from partita.ir.diagnostics import PartitaError  # noqa: E402

import bench_parallel  # noqa: E402  (its rank runner; this directory is on the path above)

RESULTS_DIR = ROOT / "bench" / "results"
DEFAULT_OUT = RESULTS_DIR / "bench_pipeline.json"
COMPILE_OUT = RESULTS_DIR / "bench_pipeline_compile.json"
COMPILE_TARGET_S = 3.0
LR, MOMENTUM = 0.01, 0.9
RTOL, ATOL = 1e-4, 1e-6
SKIP = 2  # steps dropped from the front of every timed launch (warm-up)

# The peer's schedule class for each of partita's schedules.
TORCH_SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B",
                   "zero-bubble": "ScheduleInterleavedZeroBubble"}
MULTI = ("interleaved", "zero-bubble")  # the peer's schedules that take a list of stages


class EquivalenceError(PartitaError):
    """partita's pipeline step and the peer's computed different things."""


class RankError(PartitaError):
    """A peer rank raised, died or stopped answering."""


# --- configuration --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    layers: int
    width: int
    heads: int
    vocab: int
    seq: int
    batch: int
    microbatches: int

    @property
    def label(self) -> str:
        return (f"GPT-2 ({self.layers} layers, {self.width} wide, {self.heads} heads, vocab {self.vocab}), "
                f"batch {self.batch} x {self.seq} tokens, M={self.microbatches}")


@dataclass(frozen=True)
class Case:
    pp: int
    schedule: str
    virtual: int = 1

    @property
    def name(self) -> str:
        return f"pp{self.pp}-{self.schedule}" + (f"-v{self.virtual}" if self.virtual > 1 else "")

    @property
    def chunks(self) -> int:
        return self.pp * self.virtual


@dataclass(frozen=True)
class Config:
    model: Model
    cases: tuple[Case, ...]
    steps: int  # per timed launch, SKIP of them dropped
    rounds: int
    timeout_s: float


MODEL = Model(8, 256, 4, 1024, 64, 16, 8)
ALL_CASES = (Case(2, "gpipe"), Case(2, "1f1b"), Case(2, "interleaved", 2), Case(2, "zero-bubble"),
             Case(4, "gpipe"), Case(4, "1f1b"), Case(4, "interleaved", 2), Case(4, "zero-bubble"))
FULL = Config(MODEL, ALL_CASES, 8, 3, 300.0)
QUICK = Config(MODEL, (Case(2, "1f1b"),), 6, 2, 120.0)


def case_by_name(name: str) -> Case:
    for c in ALL_CASES:
        if c.name == name:
            return c
    raise SystemExit(f"unknown case {name!r}; choose from {', '.join(c.name for c in ALL_CASES)}")


def build_model(m: Model) -> nn.Module:
    """The seeded GPT-2 (a module returning the logits); its ``.lm`` is the GPT2LMHeadModel."""
    from partita.runtime.demo import gpt2_from_config

    torch.manual_seed(0)
    model, _ = gpt2_from_config(layers=m.layers, width=m.width, heads=m.heads, vocab=m.vocab, positions=m.seq)
    return model.eval()  # no dropout anywhere (the config's are 0 too)


def global_batch(m: Model) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    shape = (m.batch, m.seq)
    return rng.integers(0, m.vocab, shape).astype(np.int64), rng.integers(0, m.vocab, shape).astype(np.int64)


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def layer_counts(m: Model, case: Case) -> list[int]:
    if m.layers % case.chunks:
        raise SystemExit(f"{case.name}: {m.layers} layers do not split evenly into {case.chunks} chunks")
    return [m.layers // case.chunks] * case.chunks


# --- the single-device reference ------------------------------------------------------------------------


def eager_reference(m: Model, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """One SGD step of the whole (tied) model on one device: its loss, the updated params and
    the momentum buffers (the gradients) by partita's names."""
    torch.set_num_threads(1)
    model = build_model(m)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(torch.from_numpy(x)), torch.from_numpy(y))
    loss.backward()
    opt.step()
    params, momentum = {}, {}
    for k, p in model.named_parameters():  # the tied head is not listed again
        params[k] = p.detach().numpy().copy()
        momentum[k] = opt.state[p]["momentum_buffer"].numpy().copy()
    return {"loss": float(loss.detach()), "params": params, "momentum": momentum}


def _rel_norm(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def compare(side: str, loss: float, params: dict[str, np.ndarray], momentum: dict[str, np.ndarray],
            ref: dict[str, Any]) -> dict[str, Any]:
    """Compare one step of ``side`` with the single-device step; raises EquivalenceError."""
    err = abs(loss - ref["loss"]) / max(abs(ref["loss"]), 1e-30)
    if err > RTOL:
        raise EquivalenceError(f"{side}: loss {loss!r} != the single-device loss {ref['loss']!r} (relative error "
                               f"{err:.2e} > {RTOL})")
    worst = {"loss": err, "param": 0.0, "momentum": 0.0}
    for n, want in ref["params"].items():
        if n not in params:
            raise EquivalenceError(f"{side}: no updated param {n!r} (it has {sorted(params)[:5]} ...)")
        got = np.asarray(params[n])
        if got.shape != want.shape:
            raise EquivalenceError(f"{side}: param {n} is {got.shape}, the single-device one {want.shape}")
        bad = np.abs(got - want) > ATOL + RTOL * np.abs(want)
        worst["param"] = max(worst["param"], _rel_norm(got, want))
        if bad.any():
            i = np.unravel_index(np.argmax(np.abs(got - want)), got.shape)
            raise EquivalenceError(f"{side}: updated {n} differs from the single-device step's in {int(bad.sum())} "
                                   f"of {bad.size} elements (at {tuple(map(int, i))}: {got[i]!r} vs {want[i]!r})")
        e = _rel_norm(momentum[n], ref["momentum"][n])
        worst["momentum"] = max(worst["momentum"], e)
        if e > RTOL:
            raise EquivalenceError(f"{side}: the gradient of {n} (its momentum buffer after one step) differs from "
                                   f"the single-device one by {e:.2e} relative by norm (> {RTOL})")
    return {"passed": True, "params": len(ref["params"]), "worst": worst}


# --- partita's side -------------------------------------------------------------------------------------


def partita_step(m: Model):
    """The imported single-device SGD training step of the model (no projection split: pp alone
    needs none, and the peer runs GPT-2's fused q/k/v projection too)."""
    import partita

    model = build_model(m)
    x, _ = global_batch(m)
    t0 = time.perf_counter()
    fwd = partita.import_torch(model, (torch.from_numpy(x),))
    import_s = time.perf_counter() - t0
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=LR, momentum=MOMENTUM)
    (xname,) = [str(v.name) for v in fwd.inputs if v.role == "input"]
    return step, xname, import_s


def partita_program(step, m: Model, case: Case):
    from partita.parallel.spmd import parallelize

    t0 = time.perf_counter()
    prog = parallelize(step, f"pp={case.pp}", "pp", microbatches=m.microbatches, schedule=case.schedule,
                       virtual_stages=case.virtual, stages=layer_counts(m, case))
    return prog, time.perf_counter() - t0


def partita_check(prog, data: dict[str, np.ndarray], ref: dict[str, Any], case: Case) -> dict[str, Any]:
    from partita.runtime.parallel_run import launch

    res = launch(prog, case.pp, data, steps=1, check=True, threads=1, timeout_s=120.0)
    c = res.checks[0]
    if not res.passed:
        raise EquivalenceError(f"partita {case.name}: its step differs from its own single-device graph's: "
                               f"%{c.worst_output} by {c.worst:.2e}")
    params = {k: v for k, v in res.weights.items() if not k.endswith(".momentum_buffer")}
    momentum = {k.removesuffix(".momentum_buffer"): v for k, v in res.weights.items()
                if k.endswith(".momentum_buffer")}
    out = compare(f"partita {case.name}", float(c.loss), params, momentum, ref)
    out.update(loss=float(c.loss), own_single_loss=float(c.single_loss), own_check_worst=c.worst)
    return out


def partita_timed(prog, data: dict[str, np.ndarray], case: Case, steps: int) -> dict[str, Any]:
    from partita.runtime.parallel_run import launch

    t0 = time.perf_counter()
    res = launch(prog, case.pp, data, steps=steps, check=False, threads=1, timeout_s=120.0)
    wall = time.perf_counter() - t0
    ts = res.step_seconds[SKIP:]
    waits = [[w[s] for s in range(SKIP, steps)] for w in res.run.recv_seconds if w is not None]
    return {"median_s": statistics.median(ts), "steps_s": res.step_seconds, "wall_s": wall,
            "load_average": os.getloadavg()[0],
            "measured_bubble": prog.plan.measured_bubble,
            "recv_wait_s_per_rank": [statistics.median(w) for w in waits]}


# --- the peer's side: stage modules ---------------------------------------------------------------------


def _blocks(blocks: nn.ModuleList, config, h: torch.Tensor) -> torch.Tensor:
    """GPT2Model's loop over its blocks, with the causal mask it builds (None for SDPA, whose
    attention is causal by itself)."""
    from transformers.masking_utils import create_causal_mask

    pos = torch.arange(h.shape[1], device=h.device).unsqueeze(0)
    mask = create_causal_mask(config=config, inputs_embeds=h, attention_mask=None, cache=None, position_ids=pos)
    for b in blocks:
        h = b(h, None, mask, None, encoder_attention_mask=None, use_cache=False, position_ids=pos)
    return h


class ChunkModule(nn.Module):
    """One model chunk of the GPT-2: its blocks; the embeddings first when it is the first
    chunk; the final norm and the head after when it is the last (the head an untied copy of
    the embedding, whose gradient the step sums with the embedding's)."""

    def __init__(self, lm: nn.Module, start: int, stop: int, first: bool, last: bool) -> None:
        super().__init__()
        tr = lm.transformer
        self.config = lm.config
        self.first, self.last = first, last
        self.h = nn.ModuleList(tr.h[start:stop])
        if first:
            self.wte, self.wpe, self.drop = tr.wte, tr.wpe, tr.drop
        if last:
            self.ln_f = tr.ln_f
            self.lm_head = nn.Linear(lm.config.n_embd, lm.config.vocab_size, bias=False)
            with torch.no_grad():
                self.lm_head.weight.copy_(tr.wte.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
            x = self.drop(self.wte(x) + self.wpe(pos))
        x = _blocks(self.h, self.config, x)
        if self.last:
            x = self.lm_head(self.ln_f(x))
        return x


TIED, HEAD = "lm.transformer.wte.weight", "lm.lm_head.weight"


@dataclass
class TorchJob:
    model: Model
    case: Case
    rank: int
    init: str
    state: dict[str, np.ndarray]
    x: np.ndarray
    y: np.ndarray
    steps: int
    check: bool
    timeout_s: float
    torch_lr: float = LR  # a different value makes the check fail (the test of the check)


def run_torch(m: Model, case: Case, state: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, steps: int,
              check: bool, timeout_s: float, torch_lr: float = LR) -> list[dict[str, Any]]:
    """Spawn the peer's ranks for ``case``; each reports its check step (if ``check``) and the
    timings of ``steps`` steps with a barrier and ``steps`` without. Never hangs."""
    init = f"tcp://127.0.0.1:{bench_parallel._free_port()}"
    jobs = [TorchJob(m, case, r, init, state, x, y, steps, check, timeout_s, torch_lr) for r in range(case.pp)]
    return spawn_ranks(jobs, _torch_rank_main, timeout_s)


def spawn_ranks(jobs: list[Any], target, timeout_s: float) -> list[dict[str, Any]]:
    """Run ``target(job, queue)`` for each job (one per rank, ``job.rank``) on spawned
    processes (bench_parallel's runner); returns each rank's report, or raises RankError as
    soon as a rank reports an error or dies (never hangs)."""
    try:
        return bench_parallel.run_on_ranks(jobs, timeout_s, target, name="bench-pp-rank")
    except bench_parallel.RankError as e:
        raise RankError(str(e)) from None


def _torch_rank_main(job: TorchJob, q) -> None:
    try:
        q.put((job.rank, "ok", _torch_rank(job)))
    except BaseException:  # noqa: BLE001 -- a rank reports whatever stopped it
        q.put((job.rank, "error", traceback.format_exc()))


class _Counters:
    """Seconds inside the schedule's p2p waits and bytes of the isends it issues, per step."""

    def __init__(self) -> None:
        self.wait_s = 0.0
        self.sent = 0

    def install(self) -> None:
        import torch.distributed as dist
        from torch.distributed.pipelining import schedules

        plain_wait, plain_batch = schedules._wait_batch_p2p, schedules._batch_p2p

        def timed_wait(work):
            t0 = time.perf_counter()
            try:
                return plain_wait(work)
            finally:
                self.wait_s += time.perf_counter() - t0

        def counted_batch(ops, desc=None):
            for op in ops:
                if op.op is dist.isend:
                    self.sent += op.tensor.numel() * op.tensor.element_size()
            return plain_batch(ops, desc)

        schedules._wait_batch_p2p = timed_wait
        schedules._batch_p2p = counted_batch

    def reset(self) -> None:
        self.wait_s, self.sent = 0.0, 0


class TorchPipeline:
    """The peer's side on one rank: this rank's chunk modules, its PipelineStages, the
    schedule, the SGD optimizer over its params and the tie group; ``step()`` runs one
    training step (returns the loss on the last chunk's rank, else None)."""

    def __init__(self, m: Model, case: Case, rank: int, state: dict[str, np.ndarray], x: np.ndarray,
                 y: np.ndarray, lr: float = LR) -> None:
        import torch.distributed as dist
        from torch.distributed.pipelining import PipelineStage, schedules

        S, C = case.pp, case.chunks
        model = build_model(m)
        model.load_state_dict({k: torch.from_numpy(np.array(a, copy=True)) for k, a in state.items()})
        self.names = {id(p): k for k, p in model.named_parameters()}
        counts = layer_counts(m, case)
        starts = [sum(counts[:c]) for c in range(C)]
        self.mine = [c for c in range(C) if c % S == rank]  # chunk c on rank c % S, as partita places them
        modules = {c: ChunkModule(model.lm, starts[c], starts[c] + counts[c], c == 0, c == C - 1) for c in self.mine}
        dev = torch.device("cpu")
        self.stages = [PipelineStage(modules[c], c, C, dev) for c in self.mine]
        cls = getattr(schedules, TORCH_SCHEDULES[case.schedule])
        self.sched = cls(self.stages if case.schedule in MULTI else self.stages[0], m.microbatches, loss_fn=loss_fn)
        self.params = [p for c in self.mine for p in modules[c].parameters()]
        self.opt = torch.optim.SGD(self.params, lr=lr, momentum=MOMENTUM)
        self.first, self.last = 0 in self.mine, (C - 1) in self.mine
        self.tie_ranks = sorted({0, (C - 1) % S})
        # Every rank takes part in creating a group.
        self.tie_group = dist.new_group(self.tie_ranks) if len(self.tie_ranks) > 1 else None
        self.tied = modules[0].wte.weight if self.first else (modules[C - 1].lm_head.weight if self.last else None)
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)
        self.tie_bytes = 0

    def step(self) -> float | None:
        import torch.distributed as dist

        self.opt.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] | None = [] if self.last else None
        args = (self.x,) if self.first else ()
        kw = {"target": self.y, "losses": losses} if self.last else {}
        self.sched.step(*args, **kw)
        if self.tie_group is not None and self.tied is not None:
            # The tied embedding / head: each copy's gradient becomes their sum.
            g = self.tied.grad
            dist.all_reduce(g, group=self.tie_group)
            n = len(self.tie_ranks)
            self.tie_bytes = int(2 * (n - 1) / n * g.numel() * g.element_size())
        self.opt.step()
        return float(torch.stack([v.detach() for v in losses]).mean()) if losses else None

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """This rank's params and momentum buffers by partita's names (the head as HEAD)."""
        ps, mom = {}, {}
        for p in self.params:
            name = self.names.get(id(p), HEAD)
            ps[name] = p.detach().numpy().copy()
            mom[name] = self.opt.state[p]["momentum_buffer"].numpy().copy()
        return ps, mom


def _torch_rank(job: TorchJob) -> dict[str, Any]:
    from datetime import timedelta

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=job.init, rank=job.rank, world_size=job.case.pp,
                            timeout=timedelta(seconds=job.timeout_s))
    try:
        counters = _Counters()
        counters.install()
        tp = TorchPipeline(job.model, job.case, job.rank, job.state, job.x, job.y, job.torch_lr)
        out: dict[str, Any] = {"rank": job.rank, "chunks": tp.mine}
        if job.check:
            loss = tp.step()
            ps, mom = tp.state()
            out["check"] = {"loss": loss, "params": ps, "momentum": mom}
        timed: dict[str, list[float]] = {"barrier": [], "back_to_back": []}
        waits: dict[str, list[float]] = {"barrier": [], "back_to_back": []}
        sent: list[int] = []
        for mode in ("barrier", "back_to_back"):
            dist.barrier()
            for _ in range(job.steps):
                if mode == "barrier":
                    dist.barrier()
                counters.reset()
                t0 = time.perf_counter()
                tp.step()
                timed[mode].append(time.perf_counter() - t0)
                waits[mode].append(counters.wait_s)
                sent.append(counters.sent + (tp.tie_bytes if tp.tied is not None else 0))
        dist.barrier()
        out.update(times=timed, waits=waits, sent_bytes=statistics.median(sent))
        return out
    finally:
        dist.destroy_process_group()


def torch_summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode: per step the slowest rank's time, the median after SKIP; the bubble as the
    ranks' mean wait over the slowest rank's step time."""
    out: dict[str, Any] = {}
    for mode in ("barrier", "back_to_back"):
        n = len(reports[0]["times"][mode])
        span = [max(r["times"][mode][s] for r in reports) for s in range(n)]
        fr = [sum(r["waits"][mode][s] for r in reports) / (len(reports) * span[s]) for s in range(SKIP, n)]
        out[mode] = {"median_s": statistics.median(span[SKIP:]), "steps_s": span,
                     "measured_bubble": sum(fr) / len(fr),
                     "wait_s_per_rank": [statistics.median(r["waits"][mode][SKIP:]) for r in reports]}
    out["sent_bytes_per_rank"] = [r["sent_bytes"] for r in reports]
    return out


def torch_check(reports: list[dict[str, Any]], ref: dict[str, Any], case: Case) -> dict[str, Any]:
    params, mom = {}, {}
    loss = None
    for r in reports:
        c = r["check"]
        if c["loss"] is not None:
            loss = c["loss"]
        params.update(c["params"])
        mom.update(c["momentum"])
    assert loss is not None
    out = compare(f"torch {case.name}", loss, params, mom, ref)
    # The untied head must have taken the embedding's update.
    if HEAD in params:
        e = _rel_norm(params[HEAD], ref["params"][TIED])
        if e > RTOL:
            raise EquivalenceError(f"torch {case.name}: the head's copy of the tied weight differs from the "
                                   f"single-device one by {e:.2e} by norm")
        out["head_copy_rel_err"] = e
    out["loss"] = loss
    return out


def same_action_order(case: Case, prog) -> bool | None:
    """Whether the peer's schedule runs, on every rank, the same F/B/W actions in the same
    order as partita's (the peer's orders from the pure functions its interleaved and
    zero-bubble schedules build them with; its ``I`` is partita's ``B``). None for gpipe and
    1f1b, whose orders the peer writes out in code (the same: ``S - p`` forwards before rank
    ``p``'s first backward, then alternation)."""
    from torch.distributed.pipelining import schedules as sc

    if case.schedule not in MULTI:
        return None
    S, v, M = case.pp, case.virtual, prog.schedule.microbatches
    zb = case.schedule == "zero-bubble"
    per_round = M // max(1, M // S)
    kind = {"F": "F", "B": "B", "I": "B", "W": "W"}
    for rank in range(S):
        warm = sc._get_warmup_ops(rank, v, per_round, S, M, multiply_factor=1 if zb else 2)
        total = v * M

        def fwd(step: int, rank: int = rank) -> int:
            return ((step // per_round) % v) * S + rank

        def bwd(step: int, rank: int = rank, warm: int = warm) -> int:
            return (v - 1 - ((step - warm) // per_round) % v) * S + rank

        ops = sc._get_1f1b_rank_ops(v, S, warm, total - warm, warm, rank, fwd, bwd, rank if zb else 0,
                                    enable_zero_bubble=zb)
        theirs = [(kind[a.computation_type.value], a.stage_index, a.microbatch_index) for a in ops if a is not None]
        ours = [(a.kind, a.chunk, a.mb) for a in prog.schedule.actions[rank]]
        if theirs != ours:
            return False
    return True


# --- the comparison -------------------------------------------------------------------------------------


def bench_case(cfg: Config, case: Case, step, xname: str, ref: dict[str, Any], state: dict[str, np.ndarray],
               x: np.ndarray, y: np.ndarray, rounds: int, steps: int, log=print) -> dict[str, Any]:
    m = cfg.model
    prog, compile_s = partita_program(step, m, case)
    plan = prog.plan
    data = {xname: x, "target": y}
    t0 = time.perf_counter()
    p_check = partita_check(prog, data, ref, case)
    log(f"  {case.name}: partita check passed (loss {p_check['loss']:.6f} vs single-device {ref['loss']:.6f}, "
        f"worst param {p_check['worst']['param']:.1e}, gradient {p_check['worst']['momentum']:.1e}; "
        f"{time.perf_counter() - t0:.0f} s)")
    ours: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    t_check = None
    for r in range(rounds):
        order = ("torch", "partita") if r % 2 == 0 else ("partita", "torch")
        for side in order:
            t0 = time.perf_counter()
            if side == "partita":
                ours.append(partita_timed(prog, data, case, steps))
            else:
                reports = run_torch(m, case, state, x, y, steps, r == 0, cfg.timeout_s)
                if r == 0:
                    # The peer's first launch begins with the check step; its timings count
                    # only once that step agrees.
                    t_check = torch_check(reports, ref, case)
                    log(f"  {case.name}: torch check passed (loss {t_check['loss']:.6f}, worst param "
                        f"{t_check['worst']['param']:.1e}, gradient {t_check['worst']['momentum']:.1e})")
                theirs.append(torch_summary(reports) | {"load_average": os.getloadavg()[0]})
            log(f"  {case.name} round {r + 1}/{rounds}: {side} "
                f"{(ours[-1]['median_s'] if side == 'partita' else theirs[-1]['back_to_back']['median_s']) * 1e3:.0f}"
                f" ms/step ({time.perf_counter() - t0:.0f} s)")
    ratio = [a["median_s"] / b["back_to_back"]["median_s"] for a, b in zip(ours, theirs)]
    ratio_b = [a["median_s"] / b["barrier"]["median_s"] for a, b in zip(ours, theirs)]
    act = m.batch // m.microbatches * m.seq * m.width * 4
    return {
        "case": case.name, "pp": case.pp, "schedule": case.schedule, "virtual_stages": case.virtual,
        "torch_schedule": TORCH_SCHEDULES[case.schedule], "stages": layer_counts(m, case),
        "compile_s": compile_s, "partita_check": p_check, "torch_check": t_check,
        "same_action_order": same_action_order(case, prog),
        "partita_ms": statistics.median(o["median_s"] for o in ours) * 1e3,
        "torch_ms": statistics.median(t["back_to_back"]["median_s"] for t in theirs) * 1e3,
        "torch_barrier_ms": statistics.median(t["barrier"]["median_s"] for t in theirs) * 1e3,
        "ratio": statistics.median(ratio), "ratio_rounds": ratio,
        "ratio_vs_barrier": statistics.median(ratio_b),
        "predicted_bubble": plan.bubble,
        "partita_measured_bubble": statistics.median(o["measured_bubble"] for o in ours),
        "torch_measured_bubble": statistics.median(t["back_to_back"]["measured_bubble"] for t in theirs),
        "torch_measured_bubble_barrier": statistics.median(t["barrier"]["measured_bubble"] for t in theirs),
        "partita_sent_bytes_per_rank": [s.sent_bytes for s in plan.per_stage],
        "torch_sent_bytes_per_rank": theirs[0]["sent_bytes_per_rank"],
        "activation_bytes_per_microbatch": act,
        "partita_rounds": ours, "torch_rounds": theirs, "plan": plan.summary(), "chart": plan.chart,
    }


def bench_pipeline(cfg: Config, rounds: int, steps: int, log=print) -> dict[str, Any]:
    m = cfg.model
    x, y = global_batch(m)
    t0 = time.perf_counter()
    ref = eager_reference(m, x, y)
    ref_s = time.perf_counter() - t0
    step, xname, import_s = partita_step(m)
    state = {k: v.detach().numpy().copy() for k, v in build_model(m).state_dict().items()}
    log(f"single-device step: loss {ref['loss']:.6f} ({ref_s:.1f} s); partita import {import_s:.1f} s")
    results = []
    for case in cfg.cases:
        t0 = time.perf_counter()
        results.append(bench_case(cfg, case, step, xname, ref, state, x, y, rounds, steps, log))
        log(f"  {case.name}: partita / torch {results[-1]['ratio']:.2f} ({time.perf_counter() - t0:.0f} s)")
    return {"model": m.label, "optimizer": f"SGD lr {LR} momentum {MOMENTUM}", "single_device_loss": ref["loss"],
            "steps_per_launch": steps, "skipped_steps": SKIP, "rounds": rounds, "cases": results}


# --- profile: where a step's time goes -----------------------------------------------------------------


@dataclass
class ProfileJob:
    model: Model
    case: Case
    rank: int
    init: str
    mesh: str
    program: str  # this rank's program as text
    weights: dict[str, np.ndarray]
    inputs: dict[str, np.ndarray]
    state: dict[str, np.ndarray]
    x: np.ndarray
    y: np.ndarray
    steps: int
    timeout_s: float


class _TimedWork:
    """A p2p work whose wait adds its seconds to ``cell[0]``."""

    __slots__ = ("work", "cell")

    def __init__(self, work, cell: list[float]) -> None:
        self.work, self.cell = work, cell

    def wait(self):
        t0 = time.perf_counter()
        try:
            return self.work.wait()
        finally:
            self.cell[0] += time.perf_counter() - t0


class PartitaRank:
    """One rank's pipeline program run as ``launch`` runs it (``TorchProgram(graph,
    donate=True, overlap=True)``), with a clock around every send and recv. Two what-ifs
    (not partita's executor), to tell what the blocking point-to-point ops cost:
    ``async_sends`` starts each send with ``isend`` where it stands and waits for them all at
    the end of the step; ``async_recvs`` also posts each recv with ``irecv`` where it stands
    and waits for it only where its tensor is first read (as the peer's runtime does)."""

    def __init__(self, text: str, name: str, weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray],
                 async_sends: bool = False, async_recvs: bool = False) -> None:
        from partita.backend.torch_exec import TorchProgram, to_tensor
        from partita.ir.graph import input_name
        from partita.ir.parser import parse
        from partita.ops.collective import is_point_to_point

        graph = parse(text, name)
        self.program = TorchProgram(graph, donate=True, overlap=True)
        self.aliases = [(i, input_name(a)) for i, a in enumerate(graph.output_aliases) if a is not None]
        self.carried = {k: to_tensor(np.array(a, copy=True)) for k, a in weights.items()}
        self.inputs = {k: to_tensor(np.array(a, copy=True)) for k, a in inputs.items()}
        self.events: list[tuple[str, str, float, float]] = []  # (send/recv, tag, start, end) of the last step
        self.works: list[Any] = []
        self.final_wait = 0.0
        self.recv_wait = [0.0]  # async_recvs: seconds waiting for posted recvs
        self.t_start = 0.0
        steps = self.program.steps
        for i, st in enumerate(steps):
            node = st[-1]
            if not is_point_to_point(node):
                continue
            kind = "send" if node.operands else "recv"
            fn = st[0]
            if async_sends and kind == "send":
                fn = self._isend
            if async_recvs and kind == "recv":
                fn = self._irecv
                # The first step that reads the recv's tensor waits for it there.
                (slot,) = st[3]
                for j in range(i + 1, len(steps)):
                    if slot in steps[j][1]:
                        steps[j] = (*steps[j][:6], steps[j][6] + (slot,), steps[j][7])
                        break
                if slot in self.program.output_slots:
                    self.program.pending_outputs += (slot,)
            steps[i] = (self._timed(fn, kind, str(node.attrs.get("tag", ""))), *st[1:])

    def _isend(self, args, attrs):
        import torch.distributed as dist

        from partita.ops.collective import _peer_rank

        g, dst = _peer_rank("send", attrs)
        x = args[0].contiguous()
        self.works.append((dist.isend(x, dst=dst, group=g), x))
        return ()

    def _irecv(self, args, attrs):
        import torch.distributed as dist

        from partita.ops._lazy import carrier_dtype
        from partita.ops.collective import Pending, _peer_rank

        g, src = _peer_rank("recv", attrs)
        out = torch.empty(attrs["shape"], dtype=carrier_dtype(attrs["dtype"]))
        return Pending(out, _TimedWork(dist.irecv(out, src=src, group=g), self.recv_wait))

    def _timed(self, fn, kind: str, tag: str):
        def run(args, attrs):
            t0 = time.perf_counter()
            try:
                return fn(args, attrs)
            finally:
                self.events.append((kind, tag, t0 - self.t_start, time.perf_counter() - self.t_start))
        return run

    def step(self) -> list[Any]:
        self.events = []
        self.recv_wait[0] = 0.0
        self.t_start = time.perf_counter()
        feed = dict(self.inputs)
        feed.update(self.carried)
        outs = self.program(feed, {})
        t = time.perf_counter()
        for w, _ in self.works:
            w.wait()
        self.works = []
        self.final_wait = time.perf_counter() - t
        for i, name in self.aliases:
            self.carried[name] = outs[i]
        return outs


def _profile_rank_main(job: ProfileJob, q) -> None:
    try:
        q.put((job.rank, "ok", _profile_rank(job)))
    except BaseException:  # noqa: BLE001 -- a rank reports whatever stopped it
        q.put((job.rank, "error", traceback.format_exc()))


def _profile_rank(job: ProfileJob) -> dict[str, Any]:
    """In one set of processes, one step at a time in turn (each after a barrier): partita's
    program, the same program with asynchronous sends, and the peer's step with a clock
    around each F, B and W of its stages."""
    from datetime import timedelta

    import torch.distributed as dist

    from partita.parallel import comm

    torch.set_num_threads(1)
    timeout = timedelta(seconds=job.timeout_s)
    dist.init_process_group("gloo", init_method=job.init, rank=job.rank, world_size=job.case.pp, timeout=timeout)
    try:
        comm.set_groups(comm.new_mesh_groups(job.mesh, timeout=timeout))
        counters = _Counters()
        counters.install()
        ours = PartitaRank(job.program, f"<rank {job.rank}>", job.weights, job.inputs)
        ours_async = PartitaRank(job.program, f"<rank {job.rank}, async sends>", job.weights, job.inputs, True)
        ours_p2p = PartitaRank(job.program, f"<rank {job.rank}, async p2p>", job.weights, job.inputs, True, True)
        tp = TorchPipeline(job.model, job.case, job.rank, job.state, job.x, job.y)
        compute = {"F": 0.0, "B": 0.0, "W": 0.0}

        def clocked(fn, kind):
            def run(*a, **k):
                t0 = time.perf_counter()
                try:
                    return fn(*a, **k)
                finally:
                    compute[kind] += time.perf_counter() - t0
            return run

        for st in tp.stages:
            st.forward_one_chunk = clocked(st.forward_one_chunk, "F")
            st.backward_one_chunk = clocked(st.backward_one_chunk, "B")
            st.backward_weight_one_chunk = clocked(st.backward_weight_one_chunk, "W")
        rec: dict[str, list[dict[str, float]]] = {"partita": [], "partita, async sends": [],
                                                  "partita, async p2p": [], "torch": []}
        events: dict[str, list] = {}
        losses: dict[str, list] = {"partita": [], "partita, async sends": [], "partita, async p2p": []}
        names = list(rec)
        for s in range(job.steps):
            k = s % len(names)
            for n in names[k:] + names[:k]:
                dist.barrier()
                if n == "torch":
                    counters.reset()
                    for key in compute:
                        compute[key] = 0.0
                    t0 = time.perf_counter()
                    tp.step()
                    dt = time.perf_counter() - t0
                    rec[n].append({"step": dt, "wait": counters.wait_s, **compute,
                                   "other": dt - counters.wait_s - sum(compute.values())})
                    continue
                st = {"partita": ours, "partita, async sends": ours_async, "partita, async p2p": ours_p2p}[n]
                t0 = time.perf_counter()
                outs = st.step()
                dt = time.perf_counter() - t0
                send = sum(e[3] - e[2] for e in st.events if e[0] == "send") + st.final_wait
                recv = sum(e[3] - e[2] for e in st.events if e[0] == "recv") + st.recv_wait[0]
                rec[n].append({"step": dt, "send": send, "recv": recv, "compute": dt - send - recv})
                losses[n].append(float(np.asarray(outs[0].detach()).reshape(-1)[0]) if len(outs) else None)
                events[n] = st.events
        dist.barrier()
        med = {n: {k: statistics.median(r[k] for r in rs[SKIP:]) for k in rs[0]} for n, rs in rec.items()}
        return {"rank": job.rank, "median_s": med, "steps": rec, "events": events, "losses": losses}
    finally:
        comm.clear_groups()
        dist.destroy_process_group()


def profile_case(cfg: Config, case: Case, step, xname: str, state: dict[str, np.ndarray], x: np.ndarray,
                 y: np.ndarray, steps: int) -> dict[str, Any]:
    from partita.ir.printer import print_graph

    m = cfg.model
    prog, _ = partita_program(step, m, case)
    data = {xname: x, "target": y}
    weights, inputs = prog.shard_weights(), prog.shard_inputs(data)
    texts = [print_graph(g) for g in prog.rank_graphs()]
    init = f"tcp://127.0.0.1:{bench_parallel._free_port()}"
    jobs = [ProfileJob(m, case, r, init, str(prog.mesh), texts[r], weights[r], inputs[r], state, x, y, steps,
                       cfg.timeout_s) for r in range(case.pp)]
    reports = spawn_ranks(jobs, _profile_rank_main, cfg.timeout_s + steps * 30)
    out: dict[str, Any] = {"case": case.name, "predicted_bubble": prog.plan.bubble, "ranks": []}
    for name in ("partita", "partita, async sends", "partita, async p2p", "torch"):
        n = len(reports[0]["steps"][name])
        span = [max(r["steps"][name][s]["step"] for r in reports) for s in range(n)]
        out.setdefault("step_ms", {})[name] = statistics.median(span[SKIP:]) * 1e3
    # The async-send variant must compute what the plain program does.
    for r in reports:
        a = r["losses"]["partita"]
        for other in ("partita, async sends", "partita, async p2p"):
            b = r["losses"][other]
            if a and a[0] is not None and a != b:
                out.setdefault("async_loss_mismatch", []).append((r["rank"], other, a[:2], b[:2]))
    for r in reports:
        ev = sorted(r["events"]["partita"], key=lambda e: e[2] - e[3])[:6]
        out["ranks"].append({"rank": r["rank"], "median_ms": {n: {k: v * 1e3 for k, v in d.items()}
                                                            for n, d in r["median_s"].items()},
                             "longest_p2p_ms": [(e[0], e[1], round((e[3] - e[2]) * 1e3, 1),
                                                 round(e[2] * 1e3, 1)) for e in ev]})
    return out


def print_profile(p: dict[str, Any]) -> None:
    sm = p["step_ms"]
    print(f"\n## profile {p['case']} (one step of each in turn in the same processes, each after a barrier; "
          f"medians after the first {SKIP}; predicted bubble {p['predicted_bubble']:.1%})")
    print(f"step (slowest rank): partita {sm['partita']:.0f} ms; what-ifs: asynchronous sends "
          f"{sm['partita, async sends']:.0f} ms, asynchronous sends and recvs (each recv waited where first read) "
          f"{sm['partita, async p2p']:.0f} ms; torch {sm['torch']:.0f} ms")
    print("| rank | partita step | in sends | in recvs | rest | async p2p: step | in sends | in recvs | rest | "
          "torch step | in p2p waits | F | B | W | rest |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in p["ranks"]:
        a, b, t = r["median_ms"]["partita"], r["median_ms"]["partita, async p2p"], r["median_ms"]["torch"]
        print(f"| {r['rank']} | {a['step']:.0f} | {a['send']:.0f} | {a['recv']:.0f} | {a['compute']:.0f} | "
              f"{b['step']:.0f} | {b['send']:.0f} | {b['recv']:.0f} | {b['compute']:.0f} | {t['step']:.0f} | "
              f"{t['wait']:.0f} | {t['F']:.0f} | {t['B']:.0f} | {t['W']:.0f} | {t['other']:.0f} |")
    for r in p["ranks"]:
        print(f"rank {r['rank']} longest p2p ops of partita's last step: " + "; ".join(
            f"{k} '{tag}' {ms} ms at {at} ms" for k, tag, ms, at in r["longest_p2p_ms"][:4]))
    if p.get("async_loss_mismatch"):
        print(f"note: a what-if variant's losses differ from the program's: {p['async_loss_mismatch']}")


# --- compile ---------------------------------------------------------------------------------------------


def bench_compile(repeats: int = 3, ms: tuple[int, ...] = (4, 16, 64), profile: bool = False) -> dict[str, Any]:
    """parallelize time of the 12x768 GPT-2 AdamW step on pp=4,dp=2,tp=2 (pp+dp+megatron,
    1f1b) and the per-rank program size for each M; a cProfile of one M=16 run when over
    the target (or ``profile``)."""
    import partita
    from partita.parallel.spmd import parallelize
    from partita.runtime.demo import gpt2_from_config

    torch.set_num_threads(1)
    mesh, strategy = "pp=4,dp=2,tp=2", "pp+dp+megatron"
    batch, seq = 128, 64  # divisible by M * dp for every M asked for
    torch.manual_seed(0)
    t0 = time.perf_counter()
    model, cfg = gpt2_from_config(layers=12, width=768, heads=12, vocab=50257, positions=1024)
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fwd = partita.import_torch(model, (ids,))
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    fwd = partita.optimize(fwd, "split-projections")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    step_s = time.perf_counter() - t0
    per_m = []
    for M in ms:
        runs = []
        prog = None
        for _ in range(repeats if M == 16 else 1):
            t0 = time.perf_counter()
            prog = parallelize(step, mesh, strategy, microbatches=M, schedule="1f1b")
            runs.append(time.perf_counter() - t0)
        assert prog is not None
        graphs = prog.rank_graphs()
        sizes = [len(g) for g in graphs]
        per_m.append({"microbatches": M, "median_s": statistics.median(runs), "runs_s": runs,
                      "timings_s": dict(prog.timings), "nodes_per_rank": sizes,
                      "nodes_per_stage": [len(st.local) for st in prog.stages],
                      "predicted_bubble": prog.plan.bubble, "cut": prog.plan.cut,
                      "layers_per_stage": [len(st.layers) for st in prog.plan.per_stage],
                      "sent_bytes_per_stage": [s.sent_bytes for s in prog.plan.per_stage]})
        del prog, graphs
    at16 = [r for r in per_m if r["microbatches"] == 16]
    profile_text = None
    if profile or (at16 and at16[0]["median_s"] > COMPILE_TARGET_S):
        import cProfile
        import io
        import pstats

        pr = cProfile.Profile()
        pr.enable()
        parallelize(step, mesh, strategy, microbatches=16, schedule="1f1b")
        pr.disable()
        buf = io.StringIO()
        st = pstats.Stats(pr, stream=buf).strip_dirs()
        st.sort_stats("cumulative").print_stats(30)
        st.sort_stats("tottime").print_stats(20)
        profile_text = buf.getvalue()
    return {"model": "GPT-2 (12 layers, 768 wide, 12 heads, vocab 50257), AdamW", "ids_shape": [batch, seq],
            "mesh": mesh, "strategy": strategy, "schedule": "1f1b", "step_nodes": len(step),
            "forward_nodes": len(fwd), "model_build_s": build_s, "import_s": import_s,
            "split_and_training_step_s": step_s, "target_s": COMPILE_TARGET_S, "per_m": per_m,
            "profile": profile_text}


# --- output ---------------------------------------------------------------------------------------------


def _kib(b: float) -> str:
    return f"{b / 1024:,.0f} KiB" if b < 1 << 20 else f"{b / (1 << 20):,.2f} MiB"


def print_pipeline(res: dict[str, Any]) -> None:
    print(f"\n## pipeline parallel vs torch.distributed.pipelining: {res['model']}; {res['optimizer']}; gloo, "
          "1 thread per rank")
    print("| case | torch schedule | partita (ms) | torch (ms) | torch, barrier (ms) | partita / torch | "
          "bubble predicted | partita measured | torch measured | partita sent/step per rank | "
          "torch sent/step per rank |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for c in res["cases"]:
        ps = ", ".join(_kib(b) for b in c["partita_sent_bytes_per_rank"])
        ts = ", ".join(_kib(b) for b in c["torch_sent_bytes_per_rank"])
        print(f"| {c['case']} | {c['torch_schedule']} | {c['partita_ms']:.0f} | {c['torch_ms']:.0f} | "
              f"{c['torch_barrier_ms']:.0f} | {c['ratio']:.2f} | {c['predicted_bubble']:.1%} | "
              f"{c['partita_measured_bubble']:.1%} | {c['torch_measured_bubble']:.1%} | {ps} | {ts} |")
    print(f"\n(median over {res['rounds']} round(s) of each side's median step after the first {res['skipped_steps']} "
          f"of {res['steps_per_launch']}; a step's time is the slowest rank's; partita / torch is the median of "
          "the per-round ratios against the peer's back-to-back steps, as partita's launch runs them; "
          "'barrier': the peer's steps each after a dist.barrier(). Measured bubble: the ranks' mean time inside "
          "p2p waits (partita: the waits of its recvs, which run asynchronously as its sends do; torch: "
          "_wait_batch_p2p) over the slowest rank's step.)")
    for c in res["cases"]:
        pc, tc = c["partita_check"], c["torch_check"]
        print(f"check {c['case']}: loss partita {pc['loss']:.6f}, torch {tc['loss']:.6f}, single device "
              f"{res['single_device_loss']:.6f}; worst param error (by norm) partita {pc['worst']['param']:.1e}, torch "
              f"{tc['worst']['param']:.1e}; worst gradient error partita {pc['worst']['momentum']:.1e}, torch "
              f"{tc['worst']['momentum']:.1e} ({pc['params']} params)"
              + ("" if c.get("same_action_order") is None else
                 f"; the same F/B/W order per rank as the peer's: {'yes' if c['same_action_order'] else 'NO'}"))


def print_compile(c: dict[str, Any]) -> None:
    print(f"\n## compile: parallelize of the {c['model']} training step, ids {c['ids_shape']}, mesh({c['mesh']}), "
          f"{c['strategy']}, {c['schedule']}")
    print("| M | parallelize (s) | pipeline (s) | stages (s) | check (s) | plan (s) | nodes per rank "
          "(stage 0..3) | layers per stage | target |")
    print("|---:|---:|---:|---:|---:|---:|---|---|---|")
    for r in c["per_m"]:
        t = r["timings_s"]
        rest = t["total"] - t.get("pipeline", 0) - t.get("stages", 0) - t.get("check", 0)
        target = (f"< {c['target_s']} s: {'met' if r['median_s'] < c['target_s'] else 'NOT met'}"
                  if r["microbatches"] == 16 else "")
        print(f"| {r['microbatches']} | {r['median_s']:.2f} | {t.get('pipeline', 0):.2f} | {t.get('stages', 0):.2f} | "
              f"{t.get('check', 0):.2f} | {rest:.2f} | {', '.join(str(n) for n in r['nodes_per_stage'])} | "
              f"{', '.join(str(n) for n in r['layers_per_stage'])} | {target} |")
    print(f"(M=16: median of {len(c['per_m'][1]['runs_s']) if len(c['per_m']) > 1 else 1} runs; the single-device "
          f"step has {c['step_nodes']} nodes; not included: model build {c['model_build_s']:.1f} s, import "
          f"{c['import_s']:.1f} s, split-projections + training_step {c['split_and_training_step_s']:.2f} s)")
    if c.get("profile"):
        print("\nprofile of one M=16 parallelize run:")
        print(c["profile"])


def machine() -> dict[str, Any]:
    return {"machine": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__, "threads_per_rank": 1,
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "load_average_at_start": os.getloadavg()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="pp=2, 1f1b, few steps: a smoke run (under 2 minutes)")
    ap.add_argument("--compile", action="store_true", help="only the parallelize time and program size of the "
                    "12x768 GPT-2 on pp=4,dp=2,tp=2")
    ap.add_argument("--compile-profile", action="store_true", help="with --compile: profile an M=16 run even "
                    "when under the target")
    ap.add_argument("--profile", nargs="+", default=None, metavar="CASE",
                    help="where the step time goes for these cases: partita's time in sends, recvs and compute per "
                    "rank, what-ifs with asynchronous sends and recvs, the peer's F/B/W and wait times (no equivalence "
                    "check, no table)")
    ap.add_argument("--cases", nargs="+", default=None, help=f"cases (default all: "
                    f"{' '.join(c.name for c in ALL_CASES)})")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per case (default 3; 2 --quick)")
    ap.add_argument("--steps", type=int, default=None, help=f"steps per timed launch, the first {SKIP} dropped "
                    "(default 8; 6 --quick)")
    ap.add_argument("--out", type=Path, default=None, help=f"JSON results (default {DEFAULT_OUT}, or "
                    f"{COMPILE_OUT} with --compile)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    started = time.perf_counter()
    results: dict[str, Any] = machine()
    if args.compile:
        results["compile"] = bench_compile(profile=args.compile_profile)
        print_compile(results["compile"])
        out = args.out or COMPILE_OUT
    elif args.profile:
        cfg = FULL
        steps = args.steps if args.steps is not None else 8
        m = cfg.model
        x, y = global_batch(m)
        step, xname, _ = partita_step(m)
        state = {k: v.detach().numpy().copy() for k, v in build_model(m).state_dict().items()}
        results["profile"] = []
        for name in args.profile:
            results["profile"].append(profile_case(cfg, case_by_name(name), step, xname, state, x, y, steps))
            print_profile(results["profile"][-1])
        out = args.out or RESULTS_DIR / "bench_pipeline_profile.json"
    else:
        cfg = QUICK if args.quick else FULL
        if args.cases:
            cfg = Config(cfg.model, tuple(case_by_name(n) for n in args.cases), cfg.steps, cfg.rounds, cfg.timeout_s)
        rounds = args.rounds if args.rounds is not None else cfg.rounds
        steps = args.steps if args.steps is not None else cfg.steps
        if steps <= SKIP:
            raise SystemExit(f"--steps must be more than the {SKIP} warm-up steps dropped")
        results["quick"] = args.quick
        results["pipeline"] = bench_pipeline(cfg, rounds, steps)
        print_pipeline(results["pipeline"])
        out = args.out or DEFAULT_OUT
    results["wall_s"] = time.perf_counter() - started
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nwrote {out} ({results['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
