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
    # The step count the run started from (the resumed checkpoint's step, else 0) and the
    # step of the checkpoint it saved (start_step + steps; None without checkpoint_dir).
    start_step: int = 0
    checkpoint_step: int | None = None

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
           weights: Mapping[str, Any] | None = None, steps: int | None = None, *, check: "bool | str" = False,
           tolerance: float = 1e-4, timeout_s: float = 60.0, threads: int | None = 1, backend: str = "auto",
           progress: Callable[[int, int, float], None] | None = None,
           checkpoint_dir: str | None = None, resume_from: str | None = None, executor: str = "torch",
           _fault: tuple[int, int, str] | None = None) -> LaunchResult:
    """Run ``program`` (from ``partita.parallelize``) on ``nproc`` local processes.

    ``inputs``: the global data inputs by name, used every step, or a list with one mapping
    per step. ``weights``: the global params (and optimizer state; missing state starts at
    zeros); default the graph's own. ``nproc`` must equal the mesh size (default: it).
    ``backend``: "auto" (default: NCCL with one GPU per rank when this machine has them,
    else gloo), "gloo" or "nccl" (``run_ranks``).
    ``executor``: "torch" (ATen kernels, the default) or "codegen" (generated kernels and the
    static memory plan on every rank; docs/codegen.md).
    ``check``: also run the single-device graph and compare each step's outputs (relative
    error per tensor within ``tolerance``); ``check=True`` records the comparison and does
    not raise on a mismatch (read ``result.passed`` and ``result.checks``), ``check="raise"``
    raises a CheckMismatch naming the first step and output beyond the tolerance. ``checkpoint_dir``: save the final params and
    state there as a sharded checkpoint (one file per rank's pieces; see checkpoint.py).
    ``resume_from``: start from the latest checkpoint in that directory, recut for this
    program's mesh and placements; the step count goes on from its step, so the checkpoint
    a resumed run saves is ``step-<resumed step + steps>`` (the same directory may be both).
    Every argument, and a checkpoint_dir that already holds that step (or a later one), is
    checked before any process starts. Raises LaunchError / RankFailure (see ``run_ranks``).
    """
    from . import checkpoint as ckpt
    from .launch import check_spawnable, under_torchrun

    mesh = _check_program(program)
    if check not in (True, False, "raise") or check is None:
        raise LaunchError(f"launch: check must be False, True (record the comparison; read result.passed) or "
                          f"'raise' (raise on a mismatch), got {check!r:.40}")
    if nproc is not None and (isinstance(nproc, bool) or not isinstance(nproc, int)):
        raise LaunchError(f"launch: nproc must be an int equal to the mesh size, got {nproc!r} (a "
                          f"{type(nproc).__name__}); the program's mesh {mesh} has {mesh.size} ranks: pass "
                          f"nproc={mesh.size}, or leave nproc out")
    if nproc is not None and nproc != mesh.size:
        raise LaunchError(f"launch: nproc={nproc} but the program's mesh {mesh} has {mesh.size} ranks; "
                          f"use nproc={mesh.size}, or parallelize for a mesh of {nproc} ranks")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise LaunchError(f"launch: steps must be a positive int, got {steps!r}; pass the number of training "
                          "steps, or leave it out to run one step per input mapping")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise LaunchError(f"launch: timeout_s must be a positive number of seconds, got {timeout_s!r}; it bounds "
                          "the rendezvous and every collective (default 60)")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0:
        raise LaunchError(f"launch: tolerance must be a non-negative number, got {tolerance!r}")
    if inputs is None:
        raise LaunchError("launch: no inputs; pass the global data inputs by name (one mapping, or a list per step)")
    per_step = _per_step_inputs(inputs)
    if steps is None:
        steps = len(per_step)
    if len(per_step) not in (1, steps):
        raise LaunchError(f"launch: {len(per_step)} input mappings for {steps} steps; give one, or one per step")
    for i, feed in enumerate(per_step):
        _check_global_inputs(program, feed, "inputs" if isinstance(inputs, Mapping) else f"inputs[{i}]")
    if weights is not None:
        _check_global_weights(program, weights)
    if not under_torchrun():
        check_spawnable("launch")
    pipelined = hasattr(program, "rank_graphs")
    if pipelined and checkpoint_dir is not None and under_torchrun():
        raise LaunchError("launch: under torchrun a pipeline program does not save checkpoints yet; launch it "
                          "from one process (partita.launch spawns the ranks), or run without checkpoint_dir")
    layout = None if pipelined else ckpt.ShardLayout.of(program.graph, _padding(program))
    shards: list[dict[str, np.ndarray]]
    start = 0
    if resume_from is not None:
        resumed = ckpt.latest_step(resume_from)
        if pipelined or ckpt.stage_dirs(resume_from):
            # A pipeline's checkpoint (one per stage), or a pipeline resuming from any
            # checkpoint: the global arrays, cut for this program's stages and placements.
            start_weights = ckpt.load_full(resume_from, resumed)
            _check_global_weights(program, start_weights)
            shards = program.shard_weights(start_weights)
        else:
            assert layout is not None
            loaded = ckpt.load(resume_from, layout, step=resumed)
            assert isinstance(loaded, list)  # every rank's pieces (rank=None)
            shards = loaded
            start_weights = program.assemble_weights(shards)
        start = ckpt.read_manifest(resume_from, resumed)["step"]
    else:
        start_weights = _full_weights(program, weights)
        shards = program.shard_weights(start_weights)
    save_step = start + steps
    if checkpoint_dir is not None:
        _check_checkpoint_dir(checkpoint_dir, save_step, start, resume_from)
    rank_inputs = [program.shard_inputs(b) for b in per_step]
    rank_feed: Any = rank_inputs[0] if len(rank_inputs) == 1 else rank_inputs
    graphs = program.rank_graphs() if pipelined else program.local
    res = run_ranks(graphs, mesh, shards, rank_feed, steps, timeout_s=timeout_s, threads=threads,
                    progress=progress, backend=backend, executor=executor, _fault=_fault)
    joined = res.ranks != tuple(range(mesh.size))
    if joined:
        # Under torchrun this process ran one rank: every process gathers the others' pieces
        # so each can assemble the global view (the process group is still up).
        _gather_ranks(res)
    outputs = [program.assemble_outputs(res.outputs[s]) for s in range(steps)]
    final = program.assemble_weights(res.weights)
    result = LaunchResult(outputs, final, res.step_seconds(), res, tolerance=tolerance, start_step=start)
    if pipelined and getattr(program, "plan", None) is not None:
        program.plan.record_measured(res)
    if checkpoint_dir is not None and pipelined:
        _save_pipeline(program, checkpoint_dir, save_step, res)
        result.checkpoint_step = save_step
    elif checkpoint_dir is not None:
        assert layout is not None
        if not joined:
            ckpt.save(checkpoint_dir, save_step, layout, [w for w in res.weights if w is not None])
        else:
            import torch.distributed as dist

            # Each rank writes its own pieces; rank 0 commits once all have written.
            rank = dist.get_rank()
            ckpt.write_shard(checkpoint_dir, save_step, layout, rank, res.weights[rank] or {})
            dist.barrier()
            if rank == 0:
                ckpt.commit(checkpoint_dir, save_step, layout)
            dist.barrier()
        result.checkpoint_step = save_step
    if check:
        result.checks = check_single_device(_single_device(program), start_weights, per_step, steps, outputs)
        if check == "raise" and not result.passed:
            bad = next(c for c in result.checks if not c.worst <= tolerance)
            raise CheckMismatch(f"launch: step {bad.step}: %{bad.worst_output} differs from the single-device step by "
                                f"{bad.worst:.3g} (relative), beyond tolerance={tolerance:g}", result)
    return result


class CheckMismatch(LaunchError):
    """``launch(..., check="raise")``: the per-rank programs' outputs differ from the
    single-device step's beyond the tolerance; ``.result`` is the run's LaunchResult."""

    def __init__(self, message: str, result: "LaunchResult") -> None:
        super().__init__(message)
        self.result = result


def _save_pipeline(program: Any, checkpoint_dir: str, step: int, res: RunResult) -> None:
    """One checkpoint per pipeline stage (``stage-<p>/``), each of its ranks' pieces under its
    stage program's layout; a weight two stages share is saved by both."""
    from . import checkpoint as ckpt

    by_stage = program._by_stage(res.weights)
    for p, st in enumerate(program.stages):
        layout = ckpt.ShardLayout.of(st.graph, _padding(st))
        ckpt.save(ckpt.stage_dir(checkpoint_dir, p), step, layout, by_stage[p])


def _check_program(program: Any) -> Any:
    """The program's mesh; anything but a ``ParallelProgram`` is a LaunchError."""
    from ..ir.graph import Graph
    from ..parallel.pipeline.pipeline_program import PipelineProgram
    from ..parallel.strategy import ParallelProgram

    if isinstance(program, (ParallelProgram, PipelineProgram)):
        return program.mesh
    if isinstance(program, Graph):
        raise LaunchError(f"launch: got the graph @{program.name}, not a ParallelProgram; call "
                          f"partita.parallelize first, e.g. prog = partita.parallelize(graph, \"dp=2\", \"dp\"), "
                          f"and pass prog (partita.run runs a graph on one device)")
    raise LaunchError(f"launch: the program is a {type(program).__name__}, not a ParallelProgram; call "
                      f"partita.parallelize(graph, mesh, strategy) first and pass what it returns")


def _per_step_inputs(inputs: Any) -> list[Mapping[str, Any]]:
    """``inputs`` as one mapping per step (or one for every step)."""
    if isinstance(inputs, Mapping):
        return [inputs]
    if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence) or len(inputs) == 0:
        raise LaunchError(f"launch: inputs is {_what(inputs)}; pass a mapping from input name to global array "
                          "(used at every step), or a non-empty list with one such mapping per step")
    for i, feed in enumerate(inputs):
        if not isinstance(feed, Mapping):
            raise LaunchError(f"launch: inputs[{i}] is {_what(feed)}, not a mapping; pass a list with one mapping "
                              "from input name to global array per step")
    return list(inputs)


def _what(x: Any) -> str:
    from ..backend.common import describe_value

    if isinstance(x, (str, bytes)):
        return f"the {type(x).__name__} {x[:40]!r}"
    if isinstance(x, Sequence) and len(x) == 0:
        return f"an empty {type(x).__name__}"
    return describe_value(x)


def _arrays_check(want: Mapping[str, Any], given: Mapping[str, Any], where: str, kind: str,
                  how: str) -> None:
    """Names (missing and unknown), shapes and dtypes of global arrays against ``want``
    (name -> the value whose type they must have)."""
    from ..backend.common import as_numpy, numpy_dtype_name

    listing = ", ".join(f"%{n}: {v.type}" for n, v in want.items()) or "none"
    unknown = [k for k in given if k not in want]
    missing = [n for n in want if n not in given] if kind == "data input" else []
    if unknown or missing:
        parts = []
        if missing:
            parts.append(f"lacks {', '.join('%' + n for n in missing)}")
        if unknown:
            parts.append(f"has {', '.join(repr(str(k)) for k in unknown)}, which "
                         f"{'is not a ' + kind if len(unknown) == 1 else 'are not ' + kind + 's'} of the program")
        raise LaunchError(f"launch: {where} {' and '.join(parts)}; the program's {kind}s are {listing}{how}")
    for name, a in given.items():
        t = want[name].type
        arr = as_numpy(a)
        got = numpy_dtype_name(arr)
        if tuple(arr.shape) != tuple(t.shape) or got != t.dtype.name:
            raise LaunchError(f"launch: {where}['{name}'] is {got}[{','.join(map(str, arr.shape))}] but the "
                              f"program's {kind} %{name} is {t}; pass the global array (launch cuts it per "
                              f"rank), of that shape and dtype")


def _check_global_inputs(program: Any, feed: Mapping[str, Any], where: str) -> None:
    from ..ir.graph import input_name

    want = {input_name(v): v for v in program.graph.inputs if v.role == "input"}
    _arrays_check(want, feed, where, "data input", "")


def _check_global_weights(program: Any, weights: Mapping[str, Any]) -> None:
    if not isinstance(weights, Mapping):
        raise LaunchError(f"launch: weights is {_what(weights)}; pass a mapping from param/state name to global "
                          "array, or leave weights out to use the graph's own")
    from ..ir.graph import input_name

    graph = _single_device(program)
    want = {input_name(v): v for v in graph.inputs if v.role in ("param", "state")}
    _arrays_check(want, weights, "weights", "param/state",
                  " (missing state starts at zeros)")


def _check_checkpoint_dir(checkpoint_dir: Any, save_step: int, start: int, resume_from: Any) -> None:
    """Refuse, before any process starts, a save that could not be committed after training:
    checkpoint_dir a file, or already holding step ``save_step`` or a later one."""
    import os
    from pathlib import Path

    from . import checkpoint as ckpt

    root = Path(checkpoint_dir)
    if root.exists() and not root.is_dir():
        raise LaunchError(f"launch: checkpoint_dir {root} is a file, not a directory; pass a directory (it is "
                          "created if missing)")
    have = ckpt.steps(root)
    later = [s for s in have if s >= save_step]
    latest = None
    try:
        latest = ckpt.latest_step(root)
    except ckpt.CheckpointError:
        pass
    if latest is not None and latest >= save_step:
        later.append(latest)
    if later:
        same = resume_from is not None and os.path.abspath(str(resume_from)) == os.path.abspath(str(root))
        found = max(later)
        fix = ("; resume from it (resume_from=checkpoint_dir: the steps go on from its step), save into another "
               "directory, or delete the later steps" if not same else
               f"; the run resumes from step {start} (the step {root / 'latest'} names), so it would save step "
               f"{save_step}: write {found} into {root / 'latest'} to resume from step {found}, or save into "
               f"another directory")
        raise LaunchError(f"launch: checkpoint_dir {root} already holds step {found}, at or after the step this "
                          f"run would save ({save_step} = {start} + steps={save_step - start}); checkpoints are "
                          f"never overwritten nor moved back{fix}")


def _gather_ranks(res: RunResult) -> None:
    """Fill ``res`` with every rank's outputs, weights, timings, recv seconds and action
    times (torchrun: one rank each)."""
    import torch.distributed as dist

    (mine,) = res.ranks
    payload = ([res.outputs[s][mine] for s in range(res.steps)], res.weights[mine], res.timings[mine],
               res.recv_seconds[mine] if res.recv_seconds else None,
               res.action_times[mine] if res.action_times else None, res.step_clock[mine] if res.step_clock else None)
    got: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(got, payload)
    res.recv_seconds = [None] * len(got)
    res.action_times = [None] * len(got)
    res.step_clock = [None] * len(got)
    for r, (outs, w, t, waits, acts, clock) in enumerate(got):
        for s in range(res.steps):
            res.outputs[s][r] = outs[s]
        res.weights[r] = w
        res.timings[r] = t
        res.recv_seconds[r] = waits
        res.action_times[r] = acts
        res.step_clock[r] = clock
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
