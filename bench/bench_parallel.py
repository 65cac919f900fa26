"""Benchmark of partita's parallel layer: compile time, data parallel against DDP, tensor
parallel against DTensor.

    .venv/bin/python bench/bench_parallel.py                 # everything (about 4 minutes)
    .venv/bin/python bench/bench_parallel.py --quick         # tiny sizes and rounds (a smoke run)
    .venv/bin/python bench/bench_parallel.py --parts dp --rounds 60

1. **compile**: ``partita.parallelize`` (annotate, propagate, partition, bucket+order; the
   plan's timings give each) of the AdamW training step of GPT-2 (12 layers, 768 wide, vocab
   50257, its q/k/v projection split by ``split-projections`` as the demo does) on
   ``mesh(dp=2, tp=4)`` with ``dp+megatron``; median of a few runs, the node counts, the
   plan's collectives and the per-rank param and optimizer-state bytes (the vocabulary is
   padded to 50260 to split over tp). Over the target (2 s) a cProfile summary is printed
   and kept.
2. **dp**: two gloo ranks on this machine, one thread each. partita's step is the per-rank
   program of ``parallelize(training_step(fwd, ...), "dp=2", "dp")`` run by
   ``TorchProgram(local, donate=True)``; PyTorch's is ``DistributedDataParallel`` forward,
   loss, backward and ``optimizer.step()``. Also timed: the other form of the same per-rank
   program, without gradient buckets where ``parallelize`` buckets by default
   (``bucket_mb=None``), with ``bucket_gradients`` at DDP's 25 MiB where it does not.
3. **tp**: two gloo ranks, a Megatron MLP block ``Linear(d, 4d) -> GELU -> Linear(4d, d)``:
   partita's ``parallelize(..., "tp=2", "megatron")`` of its training step against
   ``parallelize_module`` with ``ColwiseParallel`` / ``RowwiseParallel`` on a 1-D CPU
   ``DeviceMesh``.
4. **zero3**: two gloo ranks, the dp part's GPT-2: partita's ``parallelize(..., "dp=2",
   "zero3")`` (params, gradients and momentum sharded; gather buckets and one gather of
   prefetch, the defaults) against FSDP2's ``fully_shard`` on each block and on the whole
   model (its defaults: reshard after forward, its own prefetching). Also timed: the same
   program with ``prefetch=0`` (each bucket gathered just in time).

The comparisons use SGD (lr 0.01, momentum 0.9), the same initial weights and the same
per-rank data, and run inside the same two processes and process group. Before timing, each
rank runs two steps of every side from equal weights and compares the losses, the updated
params (rtol 1e-4) and the momentum buffers (the gradients; rtol 1e-4 by norm); a mismatch
raises ``EquivalenceError`` and nothing is timed. Then each round times one step of every
side (in an order that rotates from round to round), each after a ``dist.barrier()``; a
round's step time is the slowest rank's, and a ratio is the median of the per-round ratios.

Communication per step, per rank, two figures for each side:
- payload: the bytes of the tensors handed to collectives (partita: the operands of the
  per-rank program's collective nodes; DDP: the gradient buckets its comm hook receives;
  DTensor: the input tensors of the collectives a CommDebugMode sees);
- sent: what a rank sends with ring algorithms (all_reduce 2 (n-1)/n of the payload, which is
  the payload itself for n = 2). For partita this is ``plan.comm_bytes``, cross-checked here
  against the same formula applied to the per-rank program's nodes.

Results go to bench/results/bench_parallel.json (``--out`` to change) and a table to stdout.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import queue  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

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

import bench_train  # noqa: E402
import partita  # noqa: E402
from partita.ir.diagnostics import PartitaError  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
DEFAULT_OUT = RESULTS_DIR / "bench_parallel.json"
COMPILE_TARGET_S = 2.0
RATIO_TARGET = 1.0
LR, MOMENTUM = 0.01, 0.9
RTOL, ATOL = 1e-4, 1e-6
CHECK_STEPS = 2
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "shard_slice")


class EquivalenceError(PartitaError):
    """partita's step and the PyTorch step it is timed against computed different things."""


class RankError(PartitaError):
    """A benchmark rank raised, died or stopped answering."""


# --- models ---------------------------------------------------------------------------------------------


class MegatronMLP(nn.Module):
    """The MLP of a transformer layer: Linear(d, 4d) -> GELU -> Linear(4d, d)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.up, self.act, self.down = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


@dataclass(frozen=True)
class GPT2Size:
    layers: int
    width: int
    heads: int
    vocab: int
    batch: int  # per rank for dp, global for compile
    seq: int

    @property
    def label(self) -> str:
        return f"GPT-2 ({self.layers} layers, {self.width} wide, vocab {self.vocab})"


@dataclass(frozen=True)
class Config:
    """Every size the benchmark uses; ``QUICK`` is the smoke-test form."""

    compile_model: GPT2Size
    compile_mesh: str
    compile_repeats: int
    mlp_batch: int  # per rank
    dp_gpt2: GPT2Size
    tp_width: int
    tp_tokens: tuple[int, int]
    warmup: int
    rounds: int
    timeout_s: float


FULL = Config(GPT2Size(12, 768, 12, 50257, 2, 64), "dp=2,tp=4", 5, 64, GPT2Size(4, 256, 4, 8192, 8, 64),
              512, (8, 128), 3, 30, 300.0)
QUICK = Config(GPT2Size(2, 64, 4, 512, 2, 16), "dp=2,tp=4", 2, 16, GPT2Size(1, 64, 2, 512, 2, 16),
               64, (2, 16), 1, 3, 120.0)


def build_model(key: str, cfg: Config) -> nn.Module:
    """A fresh torch model for ``key`` ("mlp", "gpt2", "megatron_mlp"), seeded."""
    torch.manual_seed(0)
    if key == "mlp":
        return bench_train.MLP()
    if key == "gpt2":
        s = cfg.dp_gpt2
        return bench_train.gpt2(s.layers, s.width, s.heads, s.vocab, s.seq)
    if key == "megatron_mlp":
        return MegatronMLP(cfg.tp_width)
    raise SystemExit(f"unknown model {key!r}")


def global_batch(key: str, cfg: Config, ranks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch (inputs, targets) of ``ranks`` ranks; rank r's is its dim-0 slice for dp."""
    g = torch.Generator().manual_seed(1)
    if key == "mlp":
        n = cfg.mlp_batch * ranks
        return torch.randn(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g)
    if key == "gpt2":
        s = cfg.dp_gpt2
        shape = (s.batch * ranks, s.seq)
        return torch.randint(0, s.vocab, shape, generator=g), torch.randint(0, s.vocab, shape, generator=g)
    if key == "megatron_mlp":
        shape = (*cfg.tp_tokens, cfg.tp_width)
        return torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    raise SystemExit(f"unknown model {key!r}")


def torch_loss(key: str, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if key == "megatron_mlp":
        return F.mse_loss(out, y)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def model_label(key: str, cfg: Config) -> str:
    if key == "mlp":
        return f"MLP 784-256-128-10, batch {cfg.mlp_batch} per rank"
    if key == "gpt2":
        s = cfg.dp_gpt2
        return f"{s.label}, {s.batch} x {s.seq} tokens per rank"
    return (f"Megatron MLP d={cfg.tp_width} (Linear {cfg.tp_width}-{4 * cfg.tp_width}, GELU, "
            f"Linear {4 * cfg.tp_width}-{cfg.tp_width}), {cfg.tp_tokens[0]} x {cfg.tp_tokens[1]} tokens")


# --- byte accounting ------------------------------------------------------------------------------------


def _nbytes(t) -> int:
    return math.prod(t.shape) * t.dtype.itemsize


def ring_bytes_sent(op: str, operand_bytes: int, result_bytes: int, n: int) -> float:
    """Bytes one rank sends for a collective with ring algorithms (docs/parallel.md's table)."""
    s = max(operand_bytes, result_bytes)
    if op == "all_reduce":
        return 2 * (n - 1) / n * s
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * s
    if op == "broadcast":
        return s
    return 0.0


def program_comm(local) -> dict[str, Any]:
    """Collectives of a per-rank program counted from its nodes: calls and payload bytes (the
    operands) by op, and the ring bytes sent by the formula above."""
    calls: dict[str, int] = {}
    payload: dict[str, int] = {}
    sent = 0.0
    for node in local.nodes:
        if node.op not in COLLECTIVES or node.op == "shard_slice":
            continue
        ob = sum(_nbytes(o.type) for o in node.operands)
        rb = sum(_nbytes(r.type) for r in node.results)
        calls[node.op] = calls.get(node.op, 0) + 1
        payload[node.op] = payload.get(node.op, 0) + ob
        sent += ring_bytes_sent(node.op, ob, rb, int(node.attrs["group_size"]))
    return {"calls": calls, "payload_bytes": sum(payload.values()), "payload_by_op": payload,
            "ring_sent_bytes": sent}


def plan_groups(plan) -> list[dict[str, Any]]:
    """The plan's collectives grouped by (phase, op, axis), with ``plan.count`` for each."""
    keys = sorted({(c["phase"], c["op"], c["axis"]) for c in plan.collectives})
    return [{"phase": ph, "op": op, "axis": ax, "count": plan.count(op, ax, ph),
             "bytes": sum(c["bytes"] for c in plan.collectives
                          if (c["phase"], c["op"], c["axis"]) == (ph, op, ax))} for ph, op, ax in keys]


# --- 1. compile -----------------------------------------------------------------------------------------


def bench_compile(cfg: Config, profile: bool = False) -> dict[str, Any]:
    """Time ``partita.parallelize`` of a GPT-2 AdamW training step; profile it when over target."""
    s = cfg.compile_model
    model = bench_train.gpt2(s.layers, s.width, s.heads, s.vocab, 1024 if s.width >= 768 else max(64, s.seq)).eval()
    ids = torch.randint(0, s.vocab, (s.batch, s.seq), generator=torch.Generator().manual_seed(0))
    t0 = time.perf_counter()
    fwd = partita.import_torch(model, (ids,))
    import_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    # As the demo and `partita run --train` do for megatron: GPT-2's fused q/k/v projection
    # becomes three, so that attention splits by heads (docs/parallel.md "Limits").
    fwd = partita.optimize(fwd, "split-projections")
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
    step_s = time.perf_counter() - t0
    runs: list[dict[str, float]] = []
    prog = None
    for _ in range(cfg.compile_repeats):
        prog = partita.parallelize(step, cfg.compile_mesh, "dp+megatron")
        runs.append(dict(prog.plan.timings))
    assert prog is not None
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    counted = program_comm(prog.local)
    res: dict[str, Any] = {
        "model": s.label, "ids_shape": [s.batch, s.seq], "mesh": cfg.compile_mesh, "strategy": "dp+megatron",
        "forward_nodes": len(fwd), "step_nodes": len(step), "local_nodes": len(prog.local),
        "import_s": import_s, "training_step_s": step_s, "median_s": med, "runs_s": runs,
        "target_s": COMPILE_TARGET_S, "plan_comm_bytes": prog.plan.comm_bytes,
        "counted_ring_sent_bytes": counted["ring_sent_bytes"], "counted_calls": counted["calls"],
        "collectives": plan_groups(prog.plan), "notes": list(prog.plan.notes), "summary": prog.plan.summary(),
        "buckets": [{k: b[k] for k in ("op", "axis", "bytes")} | {"members": len(b["members"])}
                    for b in getattr(prog.plan, "buckets", [])],
        "per_rank": {"param_bytes": prog.plan.param_bytes, "optimizer_state_bytes": prog.plan.state_bytes,
                     "global_param_bytes": prog.plan.global_param_bytes},
        "profile": None,
    }
    if profile or med["total"] > COMPILE_TARGET_S:
        res["profile"] = profile_parallelize(step, cfg.compile_mesh)
    return res


def profile_parallelize(step, mesh: str, top: int = 30) -> str:
    """cProfile of one ``parallelize`` run: the top functions by cumulative and by own time."""
    import cProfile
    import io
    import pstats

    pr = cProfile.Profile()
    pr.enable()
    partita.parallelize(step, mesh, "dp+megatron")
    pr.disable()
    out = io.StringIO()
    st = pstats.Stats(pr, stream=out).strip_dirs()
    st.sort_stats("cumulative").print_stats(top)
    st.sort_stats("tottime").print_stats(top)
    return out.getvalue()


# --- ranks ----------------------------------------------------------------------------------------------


@dataclass
class RankJob:
    """What one spawned rank needs: the per-rank programs as text, its weights and data, the
    torch model's initial state, and how to check and time."""

    kind: str  # "dp" or "tp"
    model: str
    cfg: Config
    rank: int
    world: int
    init: str
    mesh: str
    programs: dict[str, str]  # variant -> per-rank program text
    weights: dict[str, np.ndarray]  # this rank's params and optimizer state
    inputs: dict[str, np.ndarray]  # this rank's data inputs, by partita input name
    torch_x: np.ndarray  # this rank's batch for the torch side
    torch_y: np.ndarray
    state_dict: dict[str, np.ndarray]
    placements: dict[str, Any]  # param name -> Placement on the global graph
    rounds: int
    warmup: int
    timeout_s: float
    torch_lr: float = LR  # a different value makes the check fail (the test of the check)
    extra: dict[str, Any] = field(default_factory=dict)


def _free_port() -> int:
    from partita.runtime.launch import free_port

    return free_port()


def run_on_ranks(jobs: list[Any], timeout_s: float, target: Any = None, name: str = "bench-rank"
                 ) -> list[dict[str, Any]]:
    """Run ``jobs`` (one per rank, ``job.rank``) on spawned processes, each with
    ``target(job, queue)`` (default: this module's rank entry point), which puts
    ``(rank, kind, payload)``: "ok", "mismatch" or "error"; returns each rank's payload, or
    raises ``EquivalenceError`` / ``RankError`` as soon as a rank reports one (never hangs)."""
    import multiprocessing

    # A spawned rank imports this module by name, with the parent's sys.path at start.
    for d in (str(ROOT), str(BENCH_DIR)):
        if d not in sys.path:
            sys.path.append(d)
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=target or _rank_main, args=(job, q), daemon=True, name=f"{name}-{job.rank}")
             for job in jobs]
    for p in procs:
        p.start()
    got: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < len(jobs):
            try:
                rank, kind, payload = q.get(timeout=1.0)
            except queue.Empty:
                dead = [j.rank for j, p in zip(jobs, procs) if j.rank not in got and p.exitcode is not None]
                if dead:
                    # A rank that reported just before exiting may still be in the queue.
                    try:
                        rank, kind, payload = q.get(timeout=2.0)
                    except queue.Empty:
                        raise RankError(f"rank {dead[0]} died (exit code {procs[dead[0]].exitcode}) "
                                        "without reporting") from None
                elif time.monotonic() > deadline:
                    raise RankError(f"ranks {sorted(set(range(len(jobs))) - set(got))} did not finish within "
                                    f"{timeout_s:.0f} s; raise the timeout or lower --rounds") from None
                else:
                    continue
            if kind == "mismatch":
                raise EquivalenceError(f"rank {rank}: {payload}")
            if kind == "error":
                raise RankError(f"rank {rank} raised:\n{payload}")
            got[rank] = payload
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return [got[r] for r in range(len(jobs))]


def _rank_main(job: RankJob, q) -> None:
    """Entry point of a spawned rank: reports (rank, "ok", report), (rank, "mismatch",
    message) or (rank, "error", traceback)."""
    try:
        q.put((job.rank, "ok", _run_rank(job)))
    except EquivalenceError as e:
        q.put((job.rank, "mismatch", str(e)))
    except BaseException:  # noqa: BLE001 -- a rank reports whatever stopped it
        q.put((job.rank, "error", traceback.format_exc()))


class _PartitaStep:
    """One per-rank program and the params and state it carries from step to step."""

    def __init__(self, text: str, name: str, job: RankJob) -> None:
        from partita.backend.torch_exec import TorchProgram, to_tensor
        from partita.ir.graph import input_name
        from partita.ir.parser import parse

        graph = parse(text, f"<{name} rank {job.rank}>")
        # As run_ranks runs it: collectives overlap the computation that does not need them.
        self.program = TorchProgram(graph, donate=True, overlap=True)
        self.aliases = [(i, input_name(a)) for i, a in enumerate(graph.output_aliases) if a is not None]
        # Donated buffers are updated in place: this program owns its copies.
        self.carried = {k: to_tensor(np.array(a, copy=True)) for k, a in job.weights.items()}
        self.inputs = {k: to_tensor(np.array(a, copy=True)) for k, a in job.inputs.items()}

    def __call__(self) -> float:
        feed = dict(self.inputs)
        feed.update(self.carried)
        outs = self.program(feed, {})
        for i, name in self.aliases:
            self.carried[name] = outs[i]
        return float(outs[0])

    def param(self, name: str) -> np.ndarray:
        return self.carried[name].detach().numpy().copy()

    def collective_seconds(self, steps: int) -> list[float]:
        """Run ``steps`` steps with a clock around each collective node; the seconds spent in
        collectives per step (the communication the step waits for, since they block)."""
        spent = [0.0]

        def timed(fn):
            def run(args, attrs):
                t0 = time.perf_counter()
                try:
                    return fn(args, attrs)
                finally:
                    spent[0] += time.perf_counter() - t0
            return run

        plain = self.program.steps
        self.program.steps = [(timed(st[0]),) + tuple(st[1:]) if st[-1].op in COLLECTIVES else st for st in plain]
        out = []
        try:
            for _ in range(steps):
                spent[0] = 0.0
                self()
                out.append(spent[0])
        finally:
            self.program.steps = plain
        return out


def _run_rank(job: RankJob) -> dict[str, Any]:
    from datetime import timedelta

    import torch.distributed as dist

    from partita.parallel import comm
    from partita.ir.mesh import Mesh

    torch.set_num_threads(1)
    timeout = timedelta(seconds=job.timeout_s)
    dist.init_process_group("gloo", init_method=job.init, rank=job.rank, world_size=job.world, timeout=timeout)
    try:
        comm.set_groups(comm.new_mesh_groups(job.mesh, timeout=timeout))
        ours = {v: _PartitaStep(text, f"@{job.model} {v}", job) for v, text in job.programs.items()}
        model = build_model(job.model, job.cfg)
        model.load_state_dict({k: torch.from_numpy(np.array(a, copy=True)) for k, a in job.state_dict.items()})
        x, y = torch.from_numpy(job.torch_x), torch.from_numpy(job.torch_y)
        if job.kind == "dp":
            theirs_name, theirs, theirs_params, comm_count = _ddp_side(job, model, x, y)
        elif job.kind == "zero3":
            theirs_name, theirs, theirs_params, comm_count = _fsdp_side(job, model, x, y)
        else:
            theirs_name, theirs, theirs_params, comm_count = _dtensor_side(job, model, x, y)
        check = _check(job, ours, theirs, theirs_params, comm_count)
        steps = {**ours, theirs_name: theirs}
        names = list(steps)
        times: dict[str, list[float]] = {n: [] for n in names}
        for r in range(job.warmup + job.rounds):
            k = r % len(names)
            for n in names[k:] + names[:k]:  # the order rotates, so no side always goes first
                dist.barrier()
                t0 = time.perf_counter()
                steps[n]()
                dt = time.perf_counter() - t0
                if r >= job.warmup:
                    times[n].append(dt)
        in_collectives = {}
        for n, st in ours.items():
            dist.barrier()
            in_collectives[n] = st.collective_seconds(5)
        # What one all_reduce of partita's whole payload costs on its own: the communication
        # a step cannot hide when nothing overlaps it.
        axis = Mesh.of(job.mesh).names[0]
        flat = torch.zeros(max(1, job.extra["payload_bytes"] // 4), dtype=torch.float32)
        alone = []
        for _ in range(5):
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(flat, group=comm.group(axis))
            alone.append(time.perf_counter() - t0)
        dist.barrier()
        return {"rank": job.rank, "times": times, "check": check, "torch_comm": comm_count["result"],
                "allreduce_alone": alone, "in_collectives": in_collectives}
    finally:
        comm.clear_groups()
        dist.destroy_process_group()


def _state_by_name(model: nn.Module, opt, whole) -> dict[str, np.ndarray]:
    """The params and SGD momentum buffers as whole arrays, by the names partita gives them."""
    out = {}
    for k, p in model.named_parameters():
        out[k] = whole(p).detach().numpy().copy()
        buf = opt.state.get(p, {}).get("momentum_buffer")
        if buf is not None:
            out[f"{k}.momentum_buffer"] = whole(buf).detach().numpy().copy()
    return out


def _torch_step(job: RankJob, forward: nn.Module, opt, x: torch.Tensor, y: torch.Tensor) -> Callable[[], float]:
    """One SGD step of a torch peer (DDP, DTensor, FSDP): its loss."""
    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = torch_loss(job.model, forward(x), y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def _ddp_side(job: RankJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """DDP's timed step, a function giving its params by partita name, and the byte count of
    its gradient all-reduces (a separate DDP instance with a counting comm hook, so the timed
    one keeps DDP's built-in C++ all-reduce)."""
    import copy

    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel as DDP

    counted_model = copy.deepcopy(model)
    # No buffer of these models changes in training and partita's step moves none; left on,
    # DDP would broadcast them every forward (GPT-2's masks). Newer torch spells the switch
    # forward_sync_buffers and deprecates broadcast_buffers.
    import inspect

    no_sync = ({"forward_sync_buffers": False} if "forward_sync_buffers" in inspect.signature(DDP).parameters
               else {"broadcast_buffers": False})
    ddp = DDP(model, **no_sync)
    opt = torch.optim.SGD(ddp.parameters(), lr=job.torch_lr, momentum=MOMENTUM)

    step = _torch_step(job, ddp, opt, x, y)

    def params() -> dict[str, np.ndarray]:
        return _state_by_name(model, opt, lambda t: t)

    counter = {"calls": 0, "payload_bytes": 0}

    def counting_hook(state: dict, bucket):
        buf = bucket.buffer()
        state["calls"] += 1
        state["payload_bytes"] += buf.numel() * buf.element_size()
        return allreduce_hook(None, bucket)

    def count() -> dict[str, Any]:
        ddp_c = DDP(counted_model, **no_sync)
        ddp_c.register_comm_hook(counter, counting_hook)
        opt_c = torch.optim.SGD(ddp_c.parameters(), lr=LR, momentum=MOMENTUM)
        for _ in range(2):  # DDP rebuilds its buckets after the first iteration: count the second
            counter.update(calls=0, payload_bytes=0)
            opt_c.zero_grad(set_to_none=True)
            torch_loss(job.model, ddp_c(x), y).backward()
            opt_c.step()
        n = dist.get_world_size()
        return {"all_reduce_calls": counter["calls"], "payload_bytes": counter["payload_bytes"],
                "ring_sent_bytes": 2 * (n - 1) / n * counter["payload_bytes"],
                "how": "DDP comm hook (allreduce_hook wrapped), bytes of every bucket buffer, 2nd step"}

    return "ddp", step, params, {"count": count}


def _fsdp_side(job: RankJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """FSDP2's timed step: ``fully_shard`` on each GPT-2 block, then on the whole model (the
    embeddings, the final norm and the tied head), its default ``reshard_after_forward=True``
    (each block's params gathered again for the backward, as zero3 does) and its default
    prefetching; its params and momentum as full tensors by name; its collectives counted
    under a CommDebugMode on a step of a copy."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    counted_model = copy.deepcopy(model)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))

    def shard(m: nn.Module) -> None:
        for block in m.lm.transformer.h:
            fully_shard(block, mesh=mesh)
        fully_shard(m, mesh=mesh)

    shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=job.torch_lr, momentum=MOMENTUM)

    step = _torch_step(job, model, opt, x, y)

    def params() -> dict[str, np.ndarray]:
        return _state_by_name(model, opt, lambda t: t.full_tensor() if isinstance(t, DTensor) else t)

    def count() -> dict[str, Any]:
        import warnings

        shard(counted_model)
        opt_c = torch.optim.SGD(counted_model.parameters(), lr=LR, momentum=MOMENTUM)
        mode = _CommBytes()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            with mode:
                opt_c.zero_grad(set_to_none=True)
                torch_loss(job.model, counted_model(x), y).backward()
                opt_c.step()
        counts = {str(k): v for k, v in mode.get_comm_counts().items()}
        n = dist.get_world_size()
        sent = 0.0
        for k, b in mode.bytes.items():
            op = next((o for o in COLLECTIVES if o in k.replace("allgather", "all_gather")), "all_reduce")
            sent += ring_bytes_sent(op, b, b * n if op == "all_gather" else b, n)
        return {"calls": counts, "payload_bytes": sum(mode.bytes.values()), "payload_by_op": mode.bytes,
                "ring_sent_bytes": sent, "how": "CommDebugMode subclass adding the input bytes of each "
                "collective, one step of a copy"}

    return "fsdp", step, params, {"count": count}


class _CommBytes:
    """A CommDebugMode that also adds up the bytes of each collective's input tensors."""

    def __new__(cls):
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor.debug import CommDebugMode
        from torch.distributed.tensor.debug import _comm_mode
        from torch.utils._pytree import tree_flatten

        class CommBytes(CommDebugMode):
            def __init__(self) -> None:
                super().__init__()
                self.bytes: dict[str, int] = {}

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if not isinstance(func, torch._ops.HigherOrderOperator) and not any(t is DTensor for t in types):
                    packet = func._overloadpacket
                    if packet in self.comm_registry or packet in _comm_mode.c10d_collective_ops:
                        tensors = [a for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)]
                        if tensors:
                            name = str(_comm_mode.NATIVE_TO_PY_MAPPING.get(packet, packet))
                            # c10d's in-place forms take (output, input): count the input.
                            t = tensors[1] if len(tensors) > 1 and ("_base" in name or "into_tensor" in name
                                                                     or "reduce_scatter_tensor" in name) \
                                else tensors[0]
                            self.bytes[name] = self.bytes.get(name, 0) + t.numel() * t.element_size()
                return super().__torch_dispatch__(func, types, args, kwargs)

        return CommBytes()


def _dtensor_side(job: RankJob, model: nn.Module, x: torch.Tensor, y: torch.Tensor):
    """The DTensor tensor-parallel step (ColwiseParallel up, RowwiseParallel down), its params
    as full tensors by name, and its collectives counted under a CommDebugMode."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    parallelize_module(model, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=job.torch_lr, momentum=MOMENTUM)

    step = _torch_step(job, model, opt, x, y)

    def params() -> dict[str, np.ndarray]:
        return _state_by_name(model, opt, lambda t: t.full_tensor())

    def count() -> dict[str, Any]:
        # Counted on a step of the timed model itself (the check's last step), since the
        # debug mode changes no arithmetic.
        import warnings

        mode = _CommBytes()
        with warnings.catch_warnings():
            # The mode's module tracker hooks backward on modules whose inputs need no grad.
            warnings.simplefilter("ignore", UserWarning)
            with mode:
                loss = step()
        counts = {str(k): v for k, v in mode.get_comm_counts().items()}
        n = dist.get_world_size()
        ar = sum(v for k, v in counts.items() if "all_reduce" in k)
        sent = 0.0
        for k, b in mode.bytes.items():
            # b is the input: an all_gather's result is n times larger, a reduce_scatter's n times smaller.
            op = next((o for o in COLLECTIVES if o in k), "all_reduce")
            sent += ring_bytes_sent(op, b, b * n if op == "all_gather" else b, n)
        return {"loss": loss, "calls": counts, "all_reduce_calls": ar, "payload_bytes": sum(mode.bytes.values()),
                "payload_by_op": mode.bytes, "ring_sent_bytes": sent,
                "how": "CommDebugMode subclass adding the input bytes of each collective, one step"}

    return "dtensor", step, params, {"count": count, "counts_a_step": True}


def _rel_norm(got: np.ndarray, want: np.ndarray) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _check(job: RankJob, ours: dict[str, _PartitaStep], theirs, theirs_state, comm_count: dict) -> dict[str, Any]:
    """Run CHECK_STEPS steps of every side from equal weights and compare this rank's pieces:
    the losses (rtol 1e-4), the params (elementwise, rtol 1e-4, atol 1e-6) and the SGD
    momentum buffers (relative error by norm <= 1e-4). After step 1 a momentum buffer is the
    gradient itself, after step 2 ``0.9 g1 + g2``: this compares the gradients directly. (An
    update read off f32 params, ``p_new - p_old``, is not precise enough: a layer-norm weight
    near 1.0 moved by 1e-5 is known to about 1%.) Raises EquivalenceError on the first difference."""
    import torch.distributed as dist

    from partita.ir.mesh import Mesh
    from partita.parallel.partition import local_piece

    mesh = Mesh.of(job.mesh)
    names = sorted(job.placements)
    worst = {"loss": 0.0, "param": 0.0, "momentum": 0.0}
    counts_a_step = comm_count.get("counts_a_step", False)
    for s in range(CHECK_STEPS):
        ours_loss = {v: st() for v, st in ours.items()}
        if counts_a_step and s == CHECK_STEPS - 1:
            comm_count["result"] = comm_count["count"]()
            their_loss = comm_count["result"].pop("loss")
        else:
            their_loss = theirs()
        if job.kind in ("dp", "zero3"):
            # DDP's and FSDP's loss is this rank's mean; partita's is the global one.
            t = torch.tensor([their_loss], dtype=torch.float64)
            dist.all_reduce(t)
            their_loss = float(t) / dist.get_world_size()
        full = theirs_state()
        for v, st in ours.items():
            err = abs(ours_loss[v] - their_loss) / max(abs(their_loss), 1e-30)
            worst["loss"] = max(worst["loss"], err)
            if err > RTOL:
                raise EquivalenceError(f"step {s + 1}: {v}'s loss {ours_loss[v]!r} != {their_loss!r} "
                                       f"(relative error {err:.2e} > {RTOL})")
            for n in names:
                if n not in full:
                    raise EquivalenceError(f"the torch model has no parameter {n!r} (it has {sorted(full)})")
                want = local_piece(full[n], job.placements[n], mesh, job.rank, f"param {n}")
                got = st.param(n)
                if got.shape != want.shape:
                    raise EquivalenceError(f"step {s + 1}: {v}'s piece of {n} is {got.shape}, the torch model's "
                                           f"{want.shape}")
                if n.endswith(".momentum_buffer"):
                    err = _rel_norm(got, want)
                    worst["momentum"] = max(worst["momentum"], err)
                    if err > RTOL:
                        raise EquivalenceError(f"step {s + 1}: {v}'s {n} (the gradient history) differs from the "
                                               f"torch optimizer's by {err:.2e} relative by norm (> {RTOL})")
                    continue
                worst["param"] = max(worst["param"], float(np.max(np.abs(got - want) / (np.abs(want) + ATOL))))
                bad = np.abs(got - want) > ATOL + RTOL * np.abs(want)
                if bad.any():
                    i = np.unravel_index(np.argmax(np.abs(got - want)), got.shape)
                    raise EquivalenceError(f"step {s + 1}: {v}'s {n} differs from the torch model's in "
                                           f"{int(bad.sum())} of {bad.size} elements (at {tuple(map(int, i))}: "
                                           f"{got[i]!r} vs {want[i]!r}; rtol {RTOL}, atol {ATOL})")
    if "result" not in comm_count:
        comm_count["result"] = comm_count["count"]()
    n_params = sum(1 for n in names if not n.endswith(".momentum_buffer"))
    return {"passed": True, "steps": CHECK_STEPS, "params": n_params, "momentum_buffers": len(names) - n_params,
            "worst": worst}


# --- 2. and 3.: the comparisons -------------------------------------------------------------------------


def _jobs(kind: str, key: str, cfg: Config, mesh: str, strategy: str, loss: str, rounds: int,
          torch_lr: float) -> tuple[list[RankJob], Any, dict[str, Any]]:
    from partita.parallel.bucket import bucket_gradients
    from partita.ir.printer import print_graph

    world = 2
    model = build_model(key, cfg).eval()
    x, y = global_batch(key, cfg, world)
    fwd = partita.import_torch(model, (x,))
    (xname,) = [str(v.name) for v in fwd.inputs if v.role == "input"]
    step = partita.training_step(fwd, loss=loss, optimizer="sgd", lr=LR, momentum=MOMENTUM)
    t0 = time.perf_counter()
    prog = partita.parallelize(step, mesh, strategy)
    compile_s = time.perf_counter() - t0
    programs = {"partita": print_graph(prog.local)}
    info: dict[str, Any] = {"step_nodes": len(step), "local_nodes": len(prog.local), "compile_s": compile_s,
                            "plan_comm_bytes": prog.plan.comm_bytes, "collectives": plan_groups(prog.plan),
                            "partita_comm": program_comm(prog.local)}
    if kind == "zero3":
        # The same program with each param gathered just in time: what prefetching is worth.
        programs["partita just in time"] = print_graph(partita.parallelize(step, mesh, strategy, prefetch=0).local)
        info["other_variant"] = "partita just in time"
        info["per_rank"] = {"param_bytes": prog.plan.param_bytes, "state_bytes": prog.plan.state_bytes,
                            "activation_bytes": prog.plan.activation_bytes}
    if kind == "dp":
        # The other form of the same program, to show what gradient buckets are worth: without
        # them where parallelize buckets by default, with them where it does not.
        import inspect

        from partita.parallel import strategy as _strategy

        if "bucket_mb" in inspect.signature(_strategy.parallelize).parameters:
            other_name, other = "partita unbucketed", partita.parallelize(step, mesh, strategy, bucket_mb=None).local
        else:
            other_name, other = "partita+buckets", prog.local.clone()
            bucket_gradients(other, size_mb=25.0)
        programs[other_name] = print_graph(other)
        info["other_variant"] = other_name
        info["other_comm"] = program_comm(other)
        info["plan_buckets"] = [{k: b[k] for k in ("op", "axis", "bytes")} | {"members": len(b["members"])}
                                for b in getattr(prog.plan, "buckets", [])]
    weights = prog.shard_weights()
    inputs = prog.shard_inputs({xname: x.numpy(), "target": y.numpy()})
    state = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    placements = {v.name: v.placement for v in prog.graph.inputs if v.role in ("param", "state")}
    port = _free_port()
    jobs = []
    for r in range(world):
        if kind in ("dp", "zero3"):
            tx, ty = inputs[r][xname], inputs[r]["target"]
        else:
            tx, ty = x.numpy(), y.numpy()
        jobs.append(RankJob(kind, key, cfg, r, world, f"tcp://127.0.0.1:{port}", mesh, programs, weights[r],
                            inputs[r], tx, ty, state, placements, rounds, cfg.warmup, cfg.timeout_s, torch_lr,
                            {"payload_bytes": info["partita_comm"]["payload_bytes"]}))
    return jobs, prog, info


def _summarize(reports: list[dict[str, Any]], ref: str) -> dict[str, Any]:
    """Per-round step time = the slowest rank's; medians, and ratios to ``ref`` per round."""
    names = list(reports[0]["times"])
    per_round = {n: [max(r["times"][n][i] for r in reports) for i in range(len(reports[0]["times"][n]))]
                 for n in names}
    alone = [max(r["allreduce_alone"][i] for r in reports) for i in range(len(reports[0]["allreduce_alone"]))]
    # min over ranks: the last rank to reach a collective does not wait for its peer, so its
    # time is the communication itself.
    in_coll = {n: [min(r["in_collectives"][n][i] for r in reports) for i in range(len(ts))]
               for n, ts in reports[0]["in_collectives"].items()}
    out: dict[str, Any] = {"median_ms": {n: statistics.median(t) * 1e3 for n, t in per_round.items()},
                           "allreduce_ms": statistics.median(alone) * 1e3,
                           "in_collectives_ms": {n: statistics.median(ts) * 1e3 for n, ts in in_coll.items()},
                           "rounds_ms": {n: [t * 1e3 for t in ts] for n, ts in per_round.items()}, "ratio": {}}
    for n in names:
        if n != ref:
            rs = [a / b for a, b in zip(per_round[n], per_round[ref])]
            out["ratio"][n] = statistics.median(rs)
            out.setdefault("ratio_quartiles", {})[n] = [float(np.percentile(rs, 25)), float(np.percentile(rs, 75))]
    return out


def bench_dp(key: str, cfg: Config, rounds: int, torch_lr: float = LR) -> dict[str, Any]:
    """partita's data-parallel step against DDP on two gloo ranks (see the module docstring)."""
    jobs, _, info = _jobs("dp", key, cfg, "dp=2", "dp", "cross_entropy", rounds, torch_lr)
    reports = run_on_ranks(jobs, cfg.timeout_s + rounds * 10)
    res = {"model": key, "label": model_label(key, cfg), "optimizer": f"SGD lr {LR} momentum {MOMENTUM}", **info,
           **_summarize(reports, "ddp"), "check": reports[0]["check"], "checks": [r["check"] for r in reports],
           "ddp_comm": reports[0]["torch_comm"]}
    return res


def bench_zero3(cfg: Config, rounds: int, torch_lr: float = LR) -> dict[str, Any]:
    """partita's zero3 step (params, gradients and momentum sharded; params gathered before
    use, prefetched one gather ahead) against FSDP2's ``fully_shard`` on two gloo ranks."""
    jobs, _, info = _jobs("zero3", "gpt2", cfg, "dp=2", "zero3", "cross_entropy", rounds, torch_lr)
    reports = run_on_ranks(jobs, cfg.timeout_s + rounds * 10)
    return {"model": "gpt2", "label": model_label("gpt2", cfg), "optimizer": f"SGD lr {LR} momentum {MOMENTUM}",
            **info, **_summarize(reports, "fsdp"), "check": reports[0]["check"],
            "checks": [r["check"] for r in reports], "fsdp_comm": reports[0]["torch_comm"]}


def bench_tp(cfg: Config, rounds: int, torch_lr: float = LR) -> dict[str, Any]:
    """partita's Megatron MLP step against DTensor's on two gloo ranks."""
    key = "megatron_mlp"
    jobs, _, info = _jobs("tp", key, cfg, "tp=2", "megatron", "mse", rounds, torch_lr)
    reports = run_on_ranks(jobs, cfg.timeout_s + rounds * 10)
    return {"model": key, "label": model_label(key, cfg), "optimizer": f"SGD lr {LR} momentum {MOMENTUM}", **info,
            **_summarize(reports, "dtensor"), "check": reports[0]["check"], "checks": [r["check"] for r in reports],
            "dtensor_comm": reports[0]["torch_comm"]}


# --- output ---------------------------------------------------------------------------------------------


def _kib(b: float) -> str:
    return f"{b / 1024:,.1f} KiB" if b < 1 << 20 else f"{b / (1 << 20):,.2f} MiB"


def print_compile(c: dict[str, Any]) -> None:
    m = c["median_s"]
    print(f"## compile: parallelize of the {c['model']} AdamW training step, ids {c['ids_shape']}, "
          f"mesh({c['mesh']}), {c['strategy']}")
    passes = [k for k in m if k != "total"]
    print("| step nodes | per-rank nodes | " + " | ".join(f"{k} (s)" for k in passes) + " | total (s) | target |")
    print("|---:|---:|" + "---:|" * len(passes) + "---:|---|")
    verdict = "met" if m["total"] < c["target_s"] else "NOT met"
    print(f"| {c['step_nodes']} | {c['local_nodes']} | " + " | ".join(f"{m[k]:.3f}" for k in passes) +
          f" | {m['total']:.3f} | < {c['target_s']} s: {verdict} |")
    totals = ", ".join(f"{r['total']:.2f}" for r in c["runs_s"])
    print(f"(median of {len(c['runs_s'])}; totals {totals} s; "
          f"import {c['import_s']:.1f} s, split-projections + training_step {c['training_step_s']:.2f} s, "
          "not included)")
    print("collectives of the plan (plan.count(op, axis, phase)):")
    for g in c["collectives"]:
        print(f"  {g['phase']:8} {g['op']:14} over {g['axis']:3} x{g['count']:<4} {_kib(g['bytes'])} sent per rank")
    print(f"plan.comm_bytes {_kib(c['plan_comm_bytes'])}; counted from the per-rank program's nodes "
          f"{_kib(c['counted_ring_sent_bytes'])} in {c['counted_calls']}")
    if "per_rank" in c:
        pr = c["per_rank"]
        print(f"per rank: params {_kib(pr['param_bytes'])} of {_kib(pr['global_param_bytes'])}, AdamW state "
              f"{_kib(pr['optimizer_state_bytes'])}")
    for n in c["notes"]:
        if "padded" in n or "vocab-parallel" in n:
            print(f"  note: {n}")
    for b in c["buckets"]:
        print(f"  bucket: {b['members']} {b['op']}s over {b['axis']} fused, {_kib(b['bytes'])}")
    if c["profile"]:
        print("\nprofile of one parallelize run (over target):")
        print(c["profile"])


def print_comparisons(dp: list[dict[str, Any]], tp: dict[str, Any] | None) -> None:
    if dp:
        other = dp[0]["other_variant"]
        print("\n## data parallel (2 gloo ranks, 1 thread each) vs DDP; SGD lr 0.01 momentum 0.9")
        print(f"| model | partita (ms) | {other} (ms) | DDP (ms) | partita / DDP | {other} / DDP | "
              "partita in collectives, last rank (ms) | one all_reduce of the payload (ms) |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for r in dp:
            m, q = r["median_ms"], r["ratio"]
            print(f"| {r['label']} | {m['partita']:.2f} | {m[other]:.2f} | {m['ddp']:.2f} | "
                  f"{q['partita']:.2f} | {q[other]:.2f} | {r['in_collectives_ms']['partita']:.2f} | "
                  f"{r['allreduce_ms']:.2f} |")
        print("\ncommunication per step per rank (payload = bytes handed to all_reduce; sent = ring, 2(n-1)/n "
              "of it, = payload for n=2):")
        print(f"| model | partita all_reduce calls | partita payload | plan.comm_bytes (sent) | {other} calls | "
              "DDP all_reduce calls | DDP payload |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in dp:
            pc, bc, dc = r["partita_comm"], r["other_comm"], r["ddp_comm"]
            print(f"| {r['label']} | {pc['calls'].get('all_reduce', 0)} | {_kib(pc['payload_bytes'])} | "
                  f"{_kib(r['plan_comm_bytes'])} | {bc['calls'].get('all_reduce', 0)} | {dc['all_reduce_calls']} | "
                  f"{_kib(dc['payload_bytes'])} |")
    if tp:
        print("\n## tensor parallel (2 gloo ranks, 1 thread each) vs DTensor; SGD lr 0.01 momentum 0.9")
        print("| block | partita (ms) | DTensor (ms) | partita / DTensor | partita in collectives, last rank (ms) | "
              "partita collectives | partita payload | DTensor collectives | DTensor payload |")
        print("|---|---:|---:|---:|---:|---|---:|---|---:|")
        m, pc, dc = tp["median_ms"], tp["partita_comm"], tp["dtensor_comm"]
        print(f"| {tp['label']} | {m['partita']:.2f} | {m['dtensor']:.2f} | {tp['ratio']['partita']:.2f} | "
              f"{tp['in_collectives_ms']['partita']:.2f} | "
              f"{pc['calls']} | {_kib(pc['payload_bytes'])} | {dc['calls']} | {_kib(dc['payload_bytes'])} |")


def print_zero3(z: dict[str, Any]) -> None:
    other = z["other_variant"]
    m, q, pc, fc = z["median_ms"], z["ratio"], z["partita_comm"], z["fsdp_comm"]
    print("\n## zero3 (2 gloo ranks, 1 thread each) vs FSDP2 fully_shard; SGD lr 0.01 momentum 0.9")
    print(f"| model | partita (ms) | {other} (ms) | FSDP (ms) | partita / FSDP | {other} / FSDP |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| {z['label']} | {m['partita']:.2f} | {m[other]:.2f} | {m['fsdp']:.2f} | {q['partita']:.2f} | "
          f"{q[other]:.2f} |")
    print("\ncommunication per step per rank (payload: bytes handed to the collectives; sent: ring):")
    print("| side | calls | payload | sent |")
    print("|---|---|---:|---:|")
    print(f"| partita | {pc['calls']} | {_kib(pc['payload_bytes'])} | {_kib(pc['ring_sent_bytes'])} |")
    print(f"| FSDP | {fc['calls']} | {_kib(fc['payload_bytes'])} | {_kib(fc['ring_sent_bytes'])} |")
    pr = z["per_rank"]
    print(f"partita per rank: params {_kib(pr['param_bytes'])}, momentum {_kib(pr['state_bytes'])}, "
          f"peak activations (plan) {_kib(pr['activation_bytes'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", nargs="+", default=["compile", "dp", "tp", "zero3"],
                    choices=["compile", "dp", "tp", "zero3"])
    ap.add_argument("--models", nargs="+", default=["mlp", "gpt2"], choices=["mlp", "gpt2"],
                    help="data-parallel models (default both)")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds per comparison (default 30; 3 --quick)")
    ap.add_argument("--quick", action="store_true", help="tiny models and few rounds: a smoke run")
    ap.add_argument("--profile", action="store_true", help="profile parallelize even when under target")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON results (default {DEFAULT_OUT})")
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    rounds = args.rounds if args.rounds is not None else cfg.rounds
    torch.set_num_threads(1)
    started = time.perf_counter()
    results: dict[str, Any] = {"machine": platform.platform(), "processor": platform.processor(),
                               "cpus": os.cpu_count(), "python": platform.python_version(),
                               "torch": torch.__version__, "threads_per_rank": 1, "quick": args.quick,
                               "rounds": rounds, "warmup_rounds": cfg.warmup,
                               "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "compile": None, "dp": [], "tp": None,
                               "zero3": None}
    if "compile" in args.parts:
        results["compile"] = bench_compile(cfg, args.profile)
        print_compile(results["compile"])
    if "dp" in args.parts:
        results["dp"] = [bench_dp(k, cfg, rounds) for k in args.models]
    if "tp" in args.parts:
        results["tp"] = bench_tp(cfg, rounds)
    if "zero3" in args.parts:
        results["zero3"] = bench_zero3(cfg, rounds)
    print_comparisons(results["dp"], results["tp"])
    if results["zero3"]:
        print_zero3(results["zero3"])
    print()
    if results["compile"]:
        total = results["compile"]["median_s"]["total"]
        print(f"compile: {total:.3f} s (target < {COMPILE_TARGET_S} s): "
              f"{'met' if total < COMPILE_TARGET_S else 'NOT met'}")
    for r in results["dp"]:
        q = r["ratio"]["partita"]
        print(f"dp {r['model']}: partita / DDP {q:.3f} (target <= {RATIO_TARGET}): "
              f"{'met' if q <= RATIO_TARGET else 'NOT met'}; equivalence check passed on both ranks "
              f"(worst gradient-history error {max(c['worst']['momentum'] for c in r['checks']):.1e})")
    if results["tp"]:
        q = results["tp"]["ratio"]["partita"]
        print(f"tp: partita / DTensor {q:.3f} (target <= {RATIO_TARGET}): {'met' if q <= RATIO_TARGET else 'NOT met'}; "
              f"equivalence check passed on both ranks "
              f"(worst gradient-history error {max(c['worst']['momentum'] for c in results['tp']['checks']):.1e})")
    if results["zero3"]:
        z = results["zero3"]
        q = z["ratio"]["partita"]
        print(f"zero3: partita / FSDP {q:.3f} (just in time {z['ratio'][z['other_variant']]:.3f}); equivalence check "
              f"passed on both ranks (worst gradient-history error "
              f"{max(c['worst']['momentum'] for c in z['checks']):.1e})")
    results["wall_s"] = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1, default=str))
    print(f"\nwrote {args.out} ({results['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
