"""``partita.launch``: run a ``ParallelProgram`` on real ranks, check it, checkpoint it.

``run_ranks`` (launch.py) runs per-rank graphs on arrays that are already cut per rank; this
module is the layer a user calls with global arrays: it cuts the batch and the weights per
the program's placements, runs the steps on ``mesh.size`` processes (or joins torchrun),
reassembles the global outputs and parameters, and, with ``check=True``, runs the
single-device graph on the same data and compares every output of every step (the loss and
the updated parameters of a training step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .launch import LaunchError, RunResult, run_ranks


@dataclass
class StepCheck:
    """One step's comparison with the single-device graph: the largest relative error over
    the outputs (per tensor: ||got - want|| / ||want||) and which output it was."""

    step: int
    worst: float
    worst_output: str
    loss: float | None
    single_loss: float | None


@dataclass
class LaunchResult:
    """Global outputs per step, the final global params and state, per-step seconds (the
    slowest rank), and the checks when ``check`` was asked for."""

    outputs: list[list[np.ndarray]]
    weights: dict[str, np.ndarray]
    step_seconds: list[float]
    run: RunResult
    checks: list[StepCheck] = field(default_factory=list)
    tolerance: float = 1e-4

    @property
    def passed(self) -> bool | None:
        """Whether every checked step agreed within ``tolerance`` (None: not checked)."""
        return None if not self.checks else all(c.worst <= self.tolerance for c in self.checks)

    def losses(self) -> list[float]:
        """Output 0 of every step, as floats (the loss of a training step)."""
        return [float(np.asarray(o[0]).reshape(-1)[0]) for o in self.outputs]


# Below this root-mean-square a tensor counts as zero: the relative error of a gradient that
# is exactly zero in exact arithmetic (attention's key bias) compares rounding noise with
# rounding noise, so its error is measured against this floor instead.
ZERO_RMS = 1e-6


def _rel(a: Any, b: Any) -> float:
    """||a - b|| / ||b||, with ||b|| taken as at least ZERO_RMS * sqrt(size)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        return float("inf")
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), ZERO_RMS * np.sqrt(max(b.size, 1))))


def launch(program: Any, nproc: int | None = None, inputs: "Mapping[str, Any] | Sequence[Mapping[str, Any]] | None" = None,
           weights: Mapping[str, Any] | None = None, steps: int | None = None, *, check: bool = False,
           tolerance: float = 1e-4, timeout_s: float = 60.0, threads: int | None = 1, backend: str = "auto",
           progress: Callable[[int, int, float], None] | None = None,
           checkpoint_dir: str | None = None, resume_from: str | None = None,
           _fault: tuple[int, int, str] | None = None) -> LaunchResult:
    """Run ``program`` (from ``partita.parallelize``) on ``nproc`` local processes.

    ``inputs``: the global data inputs by name, used every step, or a list with one mapping
    per step. ``weights``: the global params (and optimizer state; missing state starts at
    zeros); default the graph's own. ``nproc`` must equal the mesh size (default: it).
    ``backend``: "auto" (default: NCCL with one GPU per rank when this machine has them,
    else gloo), "gloo" or "nccl" (``run_ranks``).
    ``check``: also run the single-device graph and compare each step's outputs (relative
    error per tensor within ``tolerance``). ``checkpoint_dir``: save the final params and
    state there as a sharded checkpoint (one file per rank's pieces; see checkpoint.py).
    ``resume_from``: start from the latest checkpoint in that directory, recut for this
    program's mesh and placements. Raises LaunchError / RankFailure (see ``run_ranks``).
    """
    from . import checkpoint as ckpt

    mesh = program.mesh
    if nproc is not None and nproc != mesh.size:
        raise LaunchError(f"launch: nproc={nproc} but the program's mesh {mesh} has {mesh.size} ranks; "
                          f"use nproc={mesh.size}, or parallelize for a mesh of {nproc} ranks")
    if inputs is None:
        raise LaunchError("launch: no inputs; pass the global data inputs by name (one mapping, or a list per step)")
    per_step = [inputs] if isinstance(inputs, Mapping) else list(inputs)
    if steps is None:
        steps = len(per_step)
    if len(per_step) not in (1, steps):
        raise LaunchError(f"launch: {len(per_step)} input mappings for {steps} steps; give one, or one per step")
    layout = ckpt.ShardLayout.of(program.graph, _padding(program))
    shards: list[dict[str, np.ndarray]]
    if resume_from is not None:
        loaded = ckpt.load(resume_from, layout)
        assert isinstance(loaded, list)  # every rank's pieces (rank=None)
        shards = loaded
        start_weights = program.assemble_weights(shards)
    else:
        start_weights = _full_weights(program, weights)
        shards = program.shard_weights(start_weights)
    rank_inputs = [program.shard_inputs(b) for b in per_step]
    feed = rank_inputs[0] if len(rank_inputs) == 1 else rank_inputs
    res = run_ranks(program.local, mesh, shards, feed, steps, timeout_s=timeout_s, threads=threads,
                    progress=progress, backend=backend, _fault=_fault)
    joined = res.ranks != tuple(range(mesh.size))
    if joined:
        # Under torchrun this process ran one rank: every process gathers the others' pieces
        # so each can assemble the global view (the process group is still up).
        _gather_ranks(res)
    outputs = [program.assemble_outputs(res.outputs[s]) for s in range(steps)]
    final = program.assemble_weights(res.weights)
    result = LaunchResult(outputs, final, res.step_seconds(), res, tolerance=tolerance)
    if checkpoint_dir is not None:
        if not joined:
            ckpt.save(checkpoint_dir, steps, layout, [w for w in res.weights if w is not None])
        else:
            import torch.distributed as dist

            # Each rank writes its own pieces; rank 0 commits once all have written.
            rank = dist.get_rank()
            ckpt.write_shard(checkpoint_dir, steps, layout, rank, res.weights[rank] or {})
            dist.barrier()
            if rank == 0:
                ckpt.commit(checkpoint_dir, steps, layout)
            dist.barrier()
    if check:
        result.checks = check_single_device(_single_device(program), start_weights, per_step, steps, outputs)
    return result


def _gather_ranks(res: RunResult) -> None:
    """Fill ``res`` with every rank's outputs, weights and timings (torchrun: one rank each)."""
    import torch.distributed as dist

    (mine,) = res.ranks
    payload = ([res.outputs[s][mine] for s in range(res.steps)], res.weights[mine], res.timings[mine])
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, payload)
    for r, (outs, w, t) in enumerate(got):
        for s in range(res.steps):
            res.outputs[s][r] = outs[s]
        res.weights[r] = w
        res.timings[r] = t
    res.ranks = tuple(range(len(got)))


def _single_device(program: Any) -> Any:
    """The single-device graph a program was made from (its placed graph for older ones)."""
    return getattr(program, "single_device", program.graph)


def _padding(program: Any) -> "dict[str, dict[int, int]] | None":
    """The vocabulary padding of a program's params: name -> {dim: real size}."""
    pad = getattr(program, "padding", None)
    return pad.inputs if pad else None


def _full_weights(program: Any, weights: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    """The global params and state at their real (unpadded) sizes, from ``weights`` or the
    graph's own; missing state starts at zeros."""
    graph = _single_device(program)
    src = dict(graph.weights if weights is None else weights)
    out: dict[str, np.ndarray] = {}
    for v in graph.inputs:
        if v.role == "param":
            if v.name not in src:
                raise LaunchError(f"launch: no value for the param %{v.name} {v.type}; pass weights= with every "
                                  "param (or a graph that carries its weights)")
            out[v.name] = np.asarray(src[v.name])
        elif v.role == "state":
            out[v.name] = np.asarray(src[v.name]) if v.name in src else np.zeros(v.type.shape, v.type.dtype.np)
    return out


def check_single_device(graph: Any, weights: Mapping[str, np.ndarray], per_step: Sequence[Mapping[str, Any]],
                        steps: int, outputs: Sequence[Sequence[np.ndarray]]) -> list[StepCheck]:
    """Run the single-device ``graph`` (placements ignored) for ``steps`` steps on the same
    data with the torch executor, carrying aliased outputs as a training loop does, and
    compare each step's outputs with ``outputs``."""
    from ..backend.torch_exec import TorchProgram, to_numpy

    g = graph.clone()
    g.mesh = None
    for v in g.values():
        v.placement = None
    prog = TorchProgram(g)
    values = {k: np.array(a) for k, a in weights.items()}
    aliases = [(i, a.name) for i, a in enumerate(g.output_aliases) if a is not None]
    names = [str(v.name) if v.name is not None else f"output {i}" for i, v in enumerate(g.outputs)]
    checks = []
    for s in range(steps):
        feed = dict(values)
        feed.update(per_step[0] if len(per_step) == 1 else per_step[s])
        want = [to_numpy(o) for o in prog(feed)]
        errs = [(_rel(got, w), n) for got, w, n in zip(outputs[s], want, names)]
        worst, which = max(errs) if errs else (0.0, "")
        loss = single = None
        if want and np.asarray(want[0]).size == 1:
            loss, single = float(np.asarray(outputs[s][0]).reshape(-1)[0]), float(np.asarray(want[0]).reshape(-1)[0])
        checks.append(StepCheck(s + 1, worst, which, loss, single))
        for i, name in aliases:
            values[str(name)] = np.array(want[i])
    return checks
