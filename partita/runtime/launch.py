"""Run per-rank programs on real processes with torch.distributed.

``run_ranks`` either spawns one process per mesh rank (gloo on ``tcp://127.0.0.1:<port>``)
or, under ``torchrun``, joins the process group that is already there and runs only this
process's rank. Each rank parses its program from text (graphs travel as their text form,
arrays as NumPy), creates the mesh groups, compiles a ``TorchProgram`` with ``donate=True``
once and runs the steps; outputs that alias an input (new params, optimizer state) become
that input for the next step.

Failures never hang: the parent watches a pipe from each rank, each rank's liveness (a
rank killed by a signal reports nothing) and each rank's heartbeat and count of collectives
entered (shared memory the rank writes), stops every other rank on the first failure and
raises ``RankFailure``. Every collective runs with ``timeout_s``, so a rank whose peer died
or stopped fails within that time, with an error naming the collective and its axis; the
heartbeats and counts then name the rank that stopped (no heartbeat) or never reached the
collective. Every wait of the parent is bounded: a rank's job travels on its own pipe from a
thread (so a rank that dies or stops while starting cannot block the parent), results are
read by threads, and the processes are killed, not merely asked to stop.
"""

from __future__ import annotations

import atexit

import os
import queue
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..ir.diagnostics import ExecutionError, PartitaError
from ..ir.graph import Graph, input_name
from ..ir.mesh import Mesh

FAULT_KINDS = ("raise", "exit", "kill", "stall", "stop", "kill-mid")

# A spawned rank's heartbeat thread writes the time every HEARTBEAT_S seconds. Once a peer has
# lost a rank (a collective timed out), a rank without a beat for STALE_S seconds is the one
# that stopped; without any failure, a rank silent for longer than timeout_s is reported as
# stopped on its own. A spawned process must have received its job within START_TIMEOUT_S
# (or timeout_s when that is longer): the interpreter starts and imports partita before that.
# After the first failure the parent waits up to GRACE_S for its cause to show up.
HEARTBEAT_S = 0.2
STALE_S = 2.0
START_TIMEOUT_S = 60.0
GRACE_S = 2.0


class LaunchError(PartitaError):
    """``run_ranks`` was called with arguments that cannot make a run (wrong counts, names,
    shapes, mesh); the message names the argument and the fix."""


class CollectiveFailure(ExecutionError):
    """A collective failed or timed out on this rank, most often because a peer rank of its
    group died or stopped; the message names the op, the axis, the group and the location.
    ``ordinal`` is the collective's number among those the rank entered (the rendezvous is
    1), ``group`` its ranks and ``what`` the collective in words."""

    def __init__(self, message: str, ordinal: int | None = None, group: Sequence[int] | None = None,
                 what: str | None = None) -> None:
        super().__init__(message)
        self.ordinal = ordinal
        self.group = list(group) if group is not None else None
        self.what = what


class RankFailure(PartitaError):
    """A rank raised, died, stopped, or lost a peer. ``rank``, ``step`` (None: before the
    first step) and ``kind`` ("error", "died", "stuck": alive but stopped, or never reaching
    a collective its peers waited for, or "collective": it lost a peer) describe the first
    failure; ``others`` maps each other rank that did not finish to what became of it;
    ``remote_traceback`` is the failing rank's Python traceback when it sent one (spawned
    ranks)."""

    def __init__(self, message: str, rank: int, step: int | None, kind: str,
                 others: Mapping[int, str] | None = None, remote_traceback: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.step = step
        self.kind = kind
        self.others = dict(others or {})
        self.remote_traceback = remote_traceback


@dataclass
class RunResult:
    """What ``run_ranks`` brings back.

    ``outputs[step][rank]`` is that rank's list of outputs (NumPy arrays) at that step,
    ``weights[rank]`` its arrays after the last step (the given weights, updated through the
    output aliases), ``timings[rank][step]`` the seconds that step's program took on that
    rank. Under torchrun only this process's rank is filled (``ranks``); the others are None.
    """

    mesh: Mesh
    steps: int
    ranks: tuple[int, ...]
    outputs: list[list[list[np.ndarray] | None]]
    weights: list[dict[str, np.ndarray] | None]
    timings: list[list[float] | None]
    init_seconds: list[float | None] = field(default_factory=list)
    # ``recv_seconds[rank][step]``: the seconds that step spent inside point-to-point recvs
    # (a pipeline stage waiting for its neighbours: the bubble as measured).
    recv_seconds: list[list[float] | None] = field(default_factory=list)
    # ``action_times[rank][step]``: a pipeline rank's schedule actions as it ran them,
    # ``(kind, mb, chunk, start, end)`` in program order, seconds from the step's start
    # (partita/runtime/action_times.py); None for a rank whose program is not a pp rank's.
    action_times: list[list[list[tuple[str, int, int, float, float]]] | None] = field(default_factory=list)
    # ``step_clock[rank][step]``: where that step started on the wall clock (seconds since the
    # epoch), for the ranks with action times: their actions on one clock (action_times.align_clocks).
    step_clock: list[list[float] | None] = field(default_factory=list)

    def step_seconds(self) -> list[float]:
        """Per step, the slowest filled rank's time: what one step costs the whole mesh."""
        have = [t for t in (self.timings[r] for r in self.ranks) if t is not None]
        return [max(t[s] for t in have) for s in range(self.steps)] if have else []


# --- arguments -----------------------------------------------------------------------------

@dataclass
class _Job:
    """Everything one rank needs, picklable (graphs as text, arrays as NumPy)."""

    rank: int
    world: int
    mesh: str
    graph_text: str
    graph_name: str
    weights: dict[str, np.ndarray]
    inputs: list[dict[str, np.ndarray]]  # one per step, or one used for every step
    steps: int
    backend: str
    timeout_s: float
    threads: int | None
    fault: tuple[int, int, str] | None
    init: str  # "tcp://..." or "env://"
    executor: str = "torch"  # or "codegen": generated kernels (partita.codegen.CompiledProgram)
    # Per node of the program in order, the pipeline action it was made for (action_times.py).
    actions: list | None = None


def _check_rank_arrays(g: Graph, rank: int, weights: Mapping[str, Any], inputs: Mapping[str, Any],
                       where: str) -> None:
    """Names, shapes and dtypes of one rank's arrays against its program's inputs."""
    from ..backend.common import numpy_dtype_name

    need_w = {input_name(v): v for v in g.inputs if v.role in ("param", "state")}
    need_i = {input_name(v): v for v in g.inputs if v.role == "input"}
    missing_w = [n for n in need_w if n not in weights]
    if missing_w:
        raise LaunchError(f"weights_by_rank[{rank}] lacks {', '.join('%' + n for n in missing_w)} of "
                          f"@{g.name}; give every rank its shard of every param/state "
                          "(partita.parallel.partition.shard_weights makes them)")
    extra_w = [n for n in weights if n not in need_w]
    if extra_w:
        raise LaunchError(f"weights_by_rank[{rank}] has {', '.join(repr(n) for n in extra_w)}, which "
                          f"@{g.name} has no param/state input for; its params/states are "
                          f"{', '.join('%' + n for n in need_w) or 'none'}")
    missing_i = [n for n in need_i if n not in inputs]
    if missing_i:
        raise LaunchError(f"{where} lacks the data input(s) {', '.join('%' + n for n in missing_i)} of "
                          f"@{g.name} for rank {rank}")
    extra_i = [n for n in inputs if n not in need_i]
    if extra_i:
        raise LaunchError(f"{where} has {', '.join(repr(n) for n in extra_i)} for rank {rank}, which "
                          f"@{g.name} has no data input for; its data inputs are "
                          f"{', '.join('%' + n for n in need_i) or 'none'}")
    for name, a in [*weights.items(), *inputs.items()]:
        v = need_w.get(name) or need_i[name]
        t = v.type
        got = numpy_dtype_name(a)
        if tuple(a.shape) != t.shape or got != t.dtype.name:
            what = f"weights_by_rank[{rank}]" if name in need_w else f"{where} (rank {rank})"
            raise LaunchError(f"{what}['{name}'] is {got}[{','.join(map(str, a.shape))}] but rank {rank}'s "
                              f"program takes %{name}: {t}; pass the rank's local shard (the per-rank "
                              "program's shapes), not the global array")


def _is_per_rank(inputs: Sequence[Any]) -> bool:
    return all(isinstance(x, Mapping) or x is None for x in inputs)


def _rank_arrays(d: Any, r: int, what: str, mine: int | None) -> dict[str, np.ndarray]:
    """One rank's mapping as NumPy arrays; under torchrun (``mine`` set) other ranks' entries
    may be None, since a process holds only its own shards."""
    if d is None:
        if mine is not None and r != mine:
            return {}
        raise LaunchError(f"run_ranks: {what} is None; give a mapping name -> array for every rank"
                          + (" (only under torchrun may other ranks' entries be None)" if mine is None else ""))
    if not isinstance(d, Mapping):
        raise LaunchError(f"run_ranks: {what} is a {type(d).__name__}; give a mapping name -> array")
    from ..backend.common import as_numpy

    return {k: as_numpy(a) for k, a in d.items()}


BACKENDS = ("auto", "gloo", "nccl")


def resolve_backend(backend: str, local_ranks: int) -> str:
    """The process-group backend a run of ``local_ranks`` ranks on this machine uses:
    ``"gloo"`` (CPU tensors), ``"nccl"`` (one CUDA GPU per rank; the executor computes on
    ``cuda:<local rank>``) or ``"auto"``: nccl when this machine has a GPU for every local
    rank, else gloo."""
    if backend not in BACKENDS:
        raise LaunchError(f"run_ranks: unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "gloo":
        return backend
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if gpus >= local_ranks and torch.distributed.is_nccl_available() else "gloo"
    if not torch.distributed.is_nccl_available():
        raise LaunchError("run_ranks: backend='nccl' needs a torch built with NCCL (this one is not: a CPU build); "
                          "use backend='gloo' or 'auto'")
    if gpus < local_ranks:
        raise LaunchError(f"run_ranks: backend='nccl' runs one rank per GPU, but this machine has {gpus} GPU(s) "
                          f"for {local_ranks} local rank(s); use backend='gloo' (CPU), or fewer ranks per machine")
    return backend


def _normalize(graphs: Graph | Sequence[Graph], mesh: Mesh | str, weights_by_rank: Sequence[Mapping[str, Any]],
               inputs: Sequence[Any] | None, steps: int | None, executor: str, backend: str,
               fault: tuple[int, int, str] | None, mine: int | None) -> tuple[Mesh, list[Graph], list[dict], list[list[dict]], int]:
    """Checked arguments: (mesh, graph per rank, weights per rank, inputs per rank (one dict
    per step, or one for all steps), steps). ``mine``: the only rank this process runs
    (torchrun), whose arrays alone are needed and checked."""
    mesh = Mesh.of(mesh)
    n = mesh.size
    if executor not in ("torch", "codegen"):
        raise LaunchError(f"run_ranks: executor={executor!r} cannot run collectives across processes; use "
                          "executor=\"torch\" (ATen kernels) or \"codegen\" (generated kernels, docs/codegen.md); "
                          "partita.parallel.interpreter.run_mesh runs the NumPy reference on a simulated mesh")
    if executor == "codegen" and backend == "nccl":
        raise LaunchError("run_ranks: executor=\"codegen\" generates CPU kernels and the ranks would compute on "
                          "GPUs (nccl); use executor=\"torch\" there, or backend=\"gloo\"")
    if isinstance(graphs, Graph):
        graph_list = [graphs] * n
    else:
        graph_list = list(graphs)
        if len(graph_list) != n or not all(isinstance(g, Graph) for g in graph_list):
            raise LaunchError(f"run_ranks: {len(graph_list)} per-rank graphs for the {n} ranks of {mesh}; give "
                              "one graph per rank, or a single graph that every rank runs")
    for r, g in enumerate(graph_list):
        if g.mesh is not None and g.mesh != mesh:
            raise LaunchError(f"run_ranks: rank {r}'s program @{g.name} was partitioned for {g.mesh}, but the "
                              f"run is on {mesh}; pass mesh={str(g.mesh)!r}, or partition for {mesh}")
    if weights_by_rank is None or isinstance(weights_by_rank, Mapping) or len(weights_by_rank) != n:
        got = "a mapping" if isinstance(weights_by_rank, Mapping) else (
            "None" if weights_by_rank is None else f"{len(weights_by_rank)} entries")
        raise LaunchError(f"run_ranks: weights_by_rank has {got}, but {mesh} has {n} ranks; give a list with "
                          "each rank's param/state shards (partita.parallel.partition.shard_weights)")
    weights = []
    for r, w in enumerate(weights_by_rank):
        weights.append(_rank_arrays(w, r, f"weights_by_rank[{r}]", mine))

    if inputs is None:
        inputs = [{} for _ in range(n)]
    if isinstance(inputs, Mapping) or not isinstance(inputs, Sequence) or len(inputs) == 0:
        raise LaunchError("run_ranks: inputs must be a list with one mapping per rank (used at every step), "
                          "or a list with one such list per step")
    if _is_per_rank(inputs):
        if len(inputs) != n:
            raise LaunchError(f"run_ranks: inputs for {len(inputs)} ranks, but {mesh} has {n} ranks; give one "
                              "mapping per rank (rank order is row-major over the mesh axes)")
        steps = 1 if steps is None else steps
        per_rank = [[_rank_arrays(inputs[r], r, f"inputs[{r}]", mine)] for r in range(n)]
        where = ["inputs"]
    else:
        if steps is not None and steps != len(inputs):
            raise LaunchError(f"run_ranks: inputs hold {len(inputs)} steps but steps={steps}; give one "
                              "per-rank list per step, or leave steps out")
        steps = len(inputs)
        per_rank = [[] for _ in range(n)]
        for s, step_inputs in enumerate(inputs):
            if (isinstance(step_inputs, Mapping) or not isinstance(step_inputs, Sequence)
                    or len(step_inputs) != n or not _is_per_rank(step_inputs)):
                raise LaunchError(f"run_ranks: inputs[{s}] must be a list of {n} mappings (one per rank of "
                                  f"{mesh}), got {type(step_inputs).__name__}"
                                  + (f" of {len(step_inputs)}" if isinstance(step_inputs, Sequence) else ""))
            for r in range(n):
                per_rank[r].append(_rank_arrays(step_inputs[r], r, f"inputs[{s}][{r}]", mine))
        where = [f"inputs[{s}]" for s in range(steps)]
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise LaunchError(f"run_ranks: steps must be a positive integer, got {steps!r}")
    for r, g in enumerate(graph_list):
        if mine is not None and r != mine:
            continue
        for s, feed in enumerate(per_rank[r]):
            _check_rank_arrays(g, r, weights[r], feed, where[s])
    if fault is not None:
        if (not isinstance(fault, tuple) or len(fault) != 3 or fault[2] not in FAULT_KINDS
                or not 0 <= fault[0] < n or not isinstance(fault[1], int)):
            raise LaunchError(f"run_ranks: _fault must be (rank < {n}, step, one of {', '.join(FAULT_KINDS)}), "
                              f"got {fault!r}")
    return mesh, graph_list, weights, per_rank, steps


# --- one rank ------------------------------------------------------------------------------

class _Tracker:
    """Counts the collectives a rank has entered: the rendezvous is 1, the creation of the
    mesh groups 2, then every collective of every step. A spawned rank keeps the count in
    shared memory (``cells[rank]``) where the parent reads it, to tell a rank that never
    reached a collective from the peers that waited for it."""

    def __init__(self, rank: int, cells: Any = None) -> None:
        self.rank = rank
        self.cells = cells
        self.count = 0

    def enter(self) -> int:
        self.count += 1
        if self.cells is not None:
            self.cells[self.rank] = self.count
        return self.count


def _communicating(graph: Graph, mesh: Mesh, rank: int) -> list:
    """The nodes of ``graph`` that ``_instrument`` counts as entered, in program order."""
    from ..ops.collective import is_point_to_point
    from ..ops.registry import OPS

    out = []
    for node in graph.nodes:
        if OPS[node.op].collective is not None or is_point_to_point(node):
            if node.attrs.get("group_size", 1) > 1 and node.attrs.get("axis") in mesh.names:
                out.append(node)
    return out


def _entered_node(graph: Graph, mesh: Mesh, rank: int, entered: int, step: int | None) -> str:
    """What a rank that died was doing: the communication it had entered last (its count of
    entered collectives, ``entered``, includes the rendezvous and the mesh groups), with the
    pipeline action a send or recv serves; empty when unknown."""
    from ..parallel.interpreter import nth

    if step is None or entered < 3:
        return ""
    nodes = _communicating(graph, mesh, rank)
    k = entered - 3 - step * len(nodes)
    if not nodes or not 0 <= k < len(nodes):
        return ""
    node = nodes[k]
    axis = node.attrs["axis"]
    tag = node.attrs.get("tag")
    if node.attrs.get("peer") is not None and node.op in ("send", "recv"):
        peer = mesh.group_of(rank, axis)[node.attrs["peer"]]
        what = f"{node.op} {'to' if node.op == 'send' else 'from'} rank {peer} over axis '{axis}'"
    else:
        what = f"{node.op} over axis '{axis}'"
    return f"{what}{f' ({tag})' if tag else ''}{_location(node)}, its {nth(k + 1)} communication of the step"


def _location(node) -> str:
    loc = node.text_loc or node.loc
    return f" at {loc}" if loc else ""


def _first_line(e: BaseException) -> str:
    # gloo's messages go on with generic advice after the first sentence.
    return (str(e).strip().splitlines() or [""])[0].split(" This is typically")[0][:300]


def _instrument(program, mesh: Mesh, rank: int, timeout_s: float, fault: tuple[int, int, str] | None,
                step_cell: list[int], tracker: _Tracker, wait_cell: list[float] | None = None) -> None:
    """Wrap the program's collective steps so a failure names the op, axis, group and the
    likely cause, and so each collective counts in ``tracker`` as it is entered; with a
    "raise" fault, make the first compute node of this rank raise at the fault step (so the
    injected error takes the path a real one does).

    ``TorchProgram.steps`` are tuples ``(fn, operand slots, attrs, result slots, dtypes,
    frees, waits, node)``; only ``fn`` is replaced. A collective started asynchronously fails
    when it is waited for: its ``Pending`` gets the same error.
    """
    from ..ops.collective import Pending, is_point_to_point
    from ..ops.registry import OPS

    at_step = fault[1] if fault is not None and fault[0] == rank and fault[2] == "raise" else None
    kill_count = [0]
    injected = at_step is not None
    # "kill-mid" counts the point-to-point ops when the program has any (a pipeline rank: the
    # fault lands in the schedule's transfers, wherever the collectives sit), else collectives.
    mid_p2p = any(is_point_to_point(st[-1]) for st in program.steps)
    for i, st in enumerate(program.steps):
        fn, node = st[0], st[-1]
        if OPS[node.op].collective is not None or is_point_to_point(node):
            axis = node.attrs.get("axis")
            if node.attrs.get("group_size", 1) <= 1 or axis not in mesh.names:
                continue
            group = mesh.group_of(rank, axis)
            what = f"{node.op} over axis '{axis}' (group of ranks {group}){_location(node)}"
            if is_point_to_point(node):
                peer = group[node.attrs["peer"]]
                tag = node.attrs.get("tag")
                what = (f"{node.op} {'to' if node.operands else 'from'} rank {peer} over axis '{axis}'"
                        + (f" ({tag})" if tag else "") + _location(node))

            def fail(e: Exception, ordinal: int | None = None, what=what, group=group) -> None:
                raise CollectiveFailure(
                    f"{what} failed on rank {rank} at step {step_cell[0]}: {type(e).__name__}: {_first_line(e)}; "
                    f"a peer rank of this group probably died or stopped before reaching this collective "
                    f"(each collective waits at most timeout_s={timeout_s:g} s)", ordinal, group, what) from e

            timed = wait_cell is not None and is_point_to_point(node) and not node.operands
            # "kill-mid": the rank dies at the fault step as it enters its third point-to-point
            # op (or collective, in a program without any), in the middle of a pipeline schedule.
            mid_step = fault[1] if fault is not None and fault[0] == rank and fault[2] == "kill-mid" \
                and is_point_to_point(node) == mid_p2p else None

            def wrapped(args, attrs, fn=fn, fail=fail, timed=timed, mid_step=mid_step):
                ordinal = tracker.enter()
                if mid_step is not None and step_cell[0] == mid_step:
                    kill_count[0] += 1
                    if kill_count[0] == 3:
                        os.kill(os.getpid(), signal.SIGKILL)
                t0 = time.perf_counter() if timed else 0.0
                try:
                    res = fn(args, attrs)
                except PartitaError:
                    raise
                except Exception as e:
                    fail(e, ordinal)
                if timed:
                    assert wait_cell is not None
                    wait_cell[0] += time.perf_counter() - t0
                    if type(res) is Pending:  # an irecv: its wait, where it is read, counts
                        res.waited = wait_cell
                if type(res) is Pending:
                    res.on_error = lambda e, fail=fail, ordinal=ordinal: fail(e, ordinal)
                return res
            program.steps[i] = (wrapped, *st[1:])
        elif injected:
            injected = False

            def raising(args, attrs, fn=fn):
                if step_cell[0] == at_step:
                    raise RuntimeError(f"injected fault (run_ranks _fault=(rank {rank}, step {at_step}, 'raise'))")
                return fn(args, attrs)
            program.steps[i] = (raising, *st[1:])


def _world_collective(job: _Job, tracker: _Tracker, what: str, fn: Callable[[], Any],
                      only_timeouts: bool) -> Any:
    """Run a collective of every rank (the rendezvous, the mesh groups, the final barrier),
    counted in ``tracker``; its failure is a lost peer (with ``only_timeouts``, only a time
    out is: any other failure, such as a port in use, is the rank's own error)."""
    ordinal = tracker.enter()
    try:
        return fn()
    except PartitaError:
        raise
    except Exception as e:
        text = f"{type(e).__name__} {e}".lower()
        if only_timeouts and "timed out" not in text and "timeout" not in text:
            raise
        raise CollectiveFailure(
            f"{what} failed on rank {job.rank}: {type(e).__name__}: {_first_line(e)}; a peer rank probably died "
            f"or stopped before reaching it (it waits at most timeout_s={job.timeout_s:g} s)", ordinal,
            list(range(job.world)), what) from e


def _destroy_group() -> None:
    """Destroy the default process group if it is still there (an ``atexit`` hook)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - exiting anyway; nothing to report to
            pass


def _run_rank(job: _Job, report: Callable[[tuple], None], step_cell: list[int], tracker: _Tracker) -> tuple:
    """Join the process group, build the mesh groups, compile and run the steps of one rank;
    returns (outputs per step, final weights, seconds per step, setup seconds, recv seconds
    per step, and None or the schedule actions' times per step with each step's start on the
    wall clock)."""
    import torch
    import torch.distributed as dist

    from ..backend.torch_exec import TorchProgram, to_numpy, to_tensor
    from ..ir.parser import parse
    from ..parallel import comm
    from .action_times import action_timer, carried_actions
    from .memory_peak import StepMemory, memory_dir

    t0 = time.perf_counter()
    if job.threads is not None:
        torch.set_num_threads(job.threads)
    mesh = Mesh.of(job.mesh)
    timeout = timedelta(seconds=job.timeout_s)
    if not dist.is_initialized():
        if job.init == "env://":
            _world_collective(job, tracker, "the rendezvous (init_process_group, env://)",
                              lambda: dist.init_process_group(job.backend, init_method="env://", timeout=timeout),
                              only_timeouts=True)
            # The group this rank made (under torchrun) is taken down while Python still runs:
            # left to the interpreter's teardown, gloo's threads can end the process with
            # std::terminate ("terminate called without an active exception", exit code -6).
            atexit.register(_destroy_group)
        else:
            _world_collective(job, tracker, f"the rendezvous (init_process_group on {job.init})",
                              lambda: dist.init_process_group(job.backend, init_method=job.init, rank=job.rank,
                                                              world_size=job.world, timeout=timeout),
                              only_timeouts=True)
    graph = parse(job.graph_text, f"<@{job.graph_name} rank {job.rank}>")
    device = None
    if job.backend == "nccl":
        # One GPU per rank of this machine; NCCL moves only CUDA tensors.
        local = int(os.environ.get("LOCAL_RANK", job.rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    groups = _world_collective(job, tracker, "the creation of the mesh groups (new_group)",
                               lambda: comm.new_mesh_groups(mesh, timeout=timeout), only_timeouts=True)
    previous = comm.set_groups(groups)
    try:
        timed, actions = graph, job.actions   # what the action timer reads the program's steps by
        if job.executor == "codegen":
            from ..codegen import CompiledProgram

            # Generated kernels; collectives stay where they are (fusion never moves an op
            # with effects), and the plan's arena holds only this rank's temporaries.
            compiled = CompiledProgram(graph, donate=True, overlap=True)
            program = compiled.program
            if actions is not None and len(actions) == len(graph):   # its steps run the rewritten graph
                timed, actions = compiled.graph, carried_actions(graph, actions, compiled.graph)
        else:
            program = TorchProgram(graph, donate=True, overlap=True, device=device)
        wait_cell = [0.0]
        _instrument(program, mesh, job.rank, job.timeout_s, job.fault, step_cell, tracker, wait_cell)
        timer = action_timer(program, timed, actions)
        meter = StepMemory(job.rank, folder) if (folder := memory_dir()) else None   # opt-in, memory_peak.py
        aliases = [(i, input_name(a)) for i, a in enumerate(graph.output_aliases) if a is not None]
        aliased = {n for _, n in aliases}
        # Donated buffers are updated in place: the rank owns a copy of each aliased array,
        # so neither the caller's arrays (torchrun) nor the inputs reused every step change.
        carried: dict[str, Any] = {k: to_tensor(np.array(a, copy=True)) for k, a in job.weights.items()}
        if device is not None:
            carried = {k: t.to(device) for k, t in carried.items()}
        setup = time.perf_counter() - t0
        report(("ready", job.rank, setup))
        outputs, timings, waits = [], [], []
        acts: list[Any] = []
        clocks: list[float] = []
        fault = job.fault if job.fault is not None and job.fault[0] == job.rank else None
        for s in range(job.steps):
            step_cell[0] = s
            if fault is not None and fault[1] == s:
                if fault[2] == "exit":
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(3)
                if fault[2] == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if fault[2] == "stop":
                    os.kill(os.getpid(), signal.SIGSTOP)
                if fault[2] == "stall":
                    time.sleep(job.timeout_s * 3 + 30)
            given = job.inputs[s] if len(job.inputs) > 1 else job.inputs[0]
            feed = {k: (to_tensor(np.array(a, copy=True)) if k in aliased else a) for k, a in given.items()
                    if not (s > 0 and k in aliased)}
            feed.update(carried)
            if timer is not None:
                timer.reset()
            t = time.perf_counter()
            wait_cell[0] = 0.0
            outs = program(feed, {}) if meter is None else meter.run(program, feed)
            timings.append(time.perf_counter() - t)
            waits.append(wait_cell[0])
            if timer is not None:
                acts.append(timer.collect(t))
                clocks.append(timer.wall(t))
            # Copies: the next step may update an aliased output's buffer in place.
            outputs.append([np.array(to_numpy(o), copy=True) for o in outs])
            for i, name in aliases:
                carried[name] = outs[i]
            report(("step", job.rank, s, timings[-1]))
        final = {k: np.array(to_numpy(carried[k]), copy=True) for k in job.weights}
        if meter is not None:
            meter.write()
        step_cell[0] = job.steps
        # Every rank has finished its collectives before any leaves, so none tears down a
        # connection a peer still reads from.
        _world_collective(job, tracker, "the final barrier (every rank)", dist.barrier, only_timeouts=False)
        return outputs, final, timings, setup, waits, ((acts, clocks) if timer is not None else None)
    finally:
        comm.set_groups(previous)


def _describe(e: BaseException) -> tuple[str, str, dict | None]:
    """(kind, message, where) of a rank's failure; ``where`` describes a failed collective
    (its ordinal, group and words) for the parent to find the rank that did not reach it."""
    if isinstance(e, CollectiveFailure):
        return "collective", f"{type(e).__name__}: {e}", {"ordinal": e.ordinal, "group": e.group, "what": e.what}
    return "error", f"{type(e).__name__}: {e}", None


def _heartbeat(beats: Any, rank: int) -> None:
    while True:
        beats[rank] = time.monotonic()
        time.sleep(HEARTBEAT_S)


def _worker_main(rank: int, jobs, conn, beats, entered) -> None:
    """Entry point of a spawned rank: starts the heartbeat, receives its job on ``jobs``,
    runs it and sends ``started``, ``ready``, ``step`` and finally ``done`` or ``error``
    messages on ``conn``."""
    import threading

    threading.Thread(target=_heartbeat, args=(beats, rank), daemon=True, name="partita-heartbeat").start()
    step_cell = [-1]
    try:
        job = jobs.recv()
    except BaseException:  # noqa: BLE001 -- the parent is gone or gave up on this rank
        os._exit(2)
    jobs.close()
    try:
        conn.send(("started", rank))
        outputs, final, timings, setup, waits, acts = _run_rank(job, conn.send, step_cell, _Tracker(rank, entered))
        conn.send(("done", rank, outputs, final, timings, setup, waits, acts))
        code = 0
    except BaseException as e:  # noqa: BLE001 -- a rank reports whatever stopped it
        kind, message, where = _describe(e)
        try:
            conn.send(("error", rank, step_cell[0] if step_cell[0] >= 0 else None, kind, message,
                       traceback.format_exc(), where))
        except Exception:
            pass
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    conn.close()
    # No interpreter teardown: destroying gloo groups whose peers are gone can block.
    os._exit(code)


# --- the parent ----------------------------------------------------------------------------

def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now. It is drawn below the kernel's ephemeral range
    (where the source ports of outgoing connections come from: gloo opens many, and one of them
    could take a port the OS had just handed out as free); if none of a few draws is free, the
    OS picks one. It can still be taken before it is bound: ``_spawn`` then tries another."""
    import random

    low = _ephemeral_low()
    for _ in range(8):
        port = random.randrange(max(1024, low - 12_000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768 elsewhere)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return max(13_024, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        return 32768


def _exit_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _step_text(step: int | None, steps: int | None = None) -> str:
    if step is None:
        return "before its first step (setup: process group, mesh groups, compile)"
    if steps is not None and step >= steps:
        return "after its last step (final barrier)"
    return f"at step {step}"


def _proc_state(pid: int | None) -> str:
    """The process's state letter and its meaning from /proc (Linux), or ""."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError, TypeError):
        return ""
    names = {"T": "stopped by a signal, such as SIGSTOP", "t": "stopped by a debugger", "D": "in uninterruptible I/O",
             "R": "running", "S": "sleeping"}
    return f"state {state}: {names.get(state, 'see proc(5)')}"


def check_spawnable(who: str = "run_ranks") -> None:
    """Refuse up front a main module that multiprocessing's "spawn" cannot re-import in each
    rank: a script read from standard input (``python - < train.py``: its ``__file__`` is
    "<stdin>") or one whose file is gone. Spawn re-runs the main module's file in every child
    before the child can receive its job; when that fails the child dies at once. ``python
    -c``, an interactive session and ``python -m`` have no file to re-run (or import by
    name) and work."""
    main = sys.modules.get("__main__")
    if main is None or getattr(getattr(main, "__spec__", None), "name", None) is not None:
        return
    path = getattr(main, "__file__", None)
    if path is None:
        return
    from multiprocessing import process

    origin = getattr(process, "ORIGINAL_DIR", None)  # the working directory at start (not in the stubs)
    full = path if os.path.isabs(path) or origin is None else os.path.join(origin, path)
    if os.path.exists(full):
        return
    fix = ("save the script to a file and run it as `python train.py` (calling launch under "
           "`if __name__ == \"__main__\":`), run it with `python -c`, or under torchrun")
    if path == "<stdin>":
        raise LaunchError(f"{who}: the main module is a script read from standard input ('<stdin>'); the rank "
                          f"processes are started with multiprocessing's \"spawn\", which re-runs the main "
                          f"module's file in every rank and cannot re-read standard input; {fix}")
    raise LaunchError(f"{who}: the main module's file {full} does not exist (moved or deleted since it started); "
                      f"the rank processes are started with multiprocessing's \"spawn\", which re-runs that file "
                      f"in every rank; {fix}")


_PRIORITY = {"error": 0, "died": 1, "stuck": 2, "collective": 3}
_HEAD = {"error": "raised", "died": "died", "stuck": "is stuck", "collective": "lost a peer"}


def _first(failures: list[tuple]) -> tuple:
    """The failure to report: a rank's own error before a death before a stuck rank before a
    lost peer (the usual consequence of the other three), the earliest of a kind first."""
    return failures[min(range(len(failures)), key=lambda i: (failures[i][0], i))]


def _send_job(conn, job: _Job) -> None:
    """Send a rank its job (on a thread: the write waits for the rank to read it)."""
    try:
        conn.send(job)
    except Exception:  # noqa: BLE001 -- the rank died or was stopped: its watcher reports it
        pass
    finally:
        conn.close()


def _read_results(conn, rank: int, events: "queue.Queue") -> None:
    """Put every message of a rank on ``events``, then (rank, None) at its end."""
    try:
        while True:
            events.put((rank, conn.recv()))
    except Exception:  # noqa: BLE001 -- EOF (the rank ended) or a message cut off by its death
        pass
    events.put((rank, None))


def _spawn(mesh: Mesh, graph_list: list[Graph], weights: list[dict], per_rank: list[list[dict]], steps: int,
           backend: str, timeout_s: float, threads: int | None, fault, progress, executor: str = "torch") -> RunResult:
    """Run the ranks on spawned processes and watch them (``_Supervisor``); raises RankFailure on a failure."""
    for attempt in range(PORT_ATTEMPTS):
        sup = _Supervisor(mesh, graph_list, steps, timeout_s, progress)
        try:
            sup.start(weights, per_rank, backend, threads, fault, executor)
            sup.watch()
        finally:
            sup.stop()
        if sup.failures and attempt + 1 < PORT_ATTEMPTS and sup.port_was_taken():
            # The free port was taken (by any process on the machine) between choosing it and
            # rank 0 binding it; nothing ran yet, so run again on another port.
            continue
        if sup.failures:
            sup.raise_failure()
        return sup.result()
    raise AssertionError("unreachable: the last attempt returns or raises")


# How many ports a spawned run tries when the one chosen is taken before rank 0 binds it.
PORT_ATTEMPTS = 3


def _port_taken(message: str) -> bool:
    text = message.lower()
    return "eaddrinuse" in text or "address already in use" in text


class _Supervisor:
    """The parent's side of a spawned run: the rank processes, what their pipes said, their
    heartbeats and counts of collectives entered, and the failures seen so far."""

    def __init__(self, mesh: Mesh, graph_list: list[Graph], steps: int, timeout_s: float, progress) -> None:
        import multiprocessing

        self.mesh, self.graph_list, self.steps, self.timeout_s, self.progress = \
            mesh, graph_list, steps, timeout_s, progress
        self.n = n = mesh.size
        self.texts: dict[int, str] = {}
        self.port = free_port()
        self.ctx = ctx = multiprocessing.get_context("spawn")
        self.beats = ctx.RawArray("d", n)     # each rank's last heartbeat (time.monotonic; 0: none yet)
        self.entered = ctx.RawArray("q", n)   # the collectives each rank has entered
        self.events: queue.Queue = queue.Queue()
        self.procs: list[Any] = []
        self.readers: list[Any] = []
        self.result_conns: list[Any] = []
        self.start_limit = max(START_TIMEOUT_S, timeout_s)
        self.done: dict[int, tuple] = {}
        self.last_step: dict[int, int | None] = {r: None for r in range(n)}
        # (priority, rank, step, kind, message, where)
        self.failures: list[tuple[int, int, int | None, str, str, dict | None]] = []
        self.tracebacks: dict[int, str] = {}
        self.ended: set[int] = set()         # ranks whose pipe reached its end
        self.exited_at: dict[int, float] = {}
        self.started: set[int] = set()
        self.ready: set[int] = set()
        self.first_failure_at: float | None = None
        self.spawned_at = 0.0

    def port_was_taken(self) -> bool:
        """Whether the run failed only because rank 0 could not listen on the chosen port: the
        first failure is a setup error saying the address is in use, and no rank got past setup."""
        _, _, step, kind, message, _ = _first(self.failures)
        return kind == "error" and step is None and _port_taken(message) and not self.ready

    # --- the ranks' state ----------------------------------------------------------------------
    def current(self, r: int) -> int | None:
        """The step rank r is in (None: setup; ``steps``: past its last step)."""
        if r not in self.ready:
            return None
        last = self.last_step[r]
        return 0 if last is None else last + 1

    def failed(self, r: int) -> bool:
        """Whether rank r has a failure."""
        return any(f[1] == r for f in self.failures)

    def handle(self, r: int, msg: tuple | None) -> None:
        """Take in one message of rank r (None: its pipe ended)."""
        if msg is None:
            self.ended.add(r)
            return
        tag = msg[0]
        if tag == "started":
            self.started.add(r)
        elif tag == "ready":
            self.ready.add(r)
        elif tag == "step":
            self.last_step[r] = msg[2]
            if self.progress is not None:
                self.progress(r, msg[2], msg[3])
        elif tag == "done":
            self.done[r] = msg
        elif tag == "error":
            _, _, step, kind, message, self.tracebacks[r], where = msg
            self.failures.append((_PRIORITY[kind], r, step, kind, message, where))

    def stuck(self, r: int, message: str) -> None:
        """Record rank r as stuck."""
        self.failures.append((_PRIORITY["stuck"], r, self.current(r), "stuck", message, None))

    def silent_for(self, r: int, now: float) -> float:
        """The seconds since rank r's last heartbeat (0: none yet)."""
        return now - self.beats[r] if self.beats[r] > 0 else 0.0

    def frozen_text(self, r: int, now: float) -> str:
        """Why rank r, alive but without a heartbeat, is stuck."""
        state = _proc_state(self.procs[r].pid)
        return (f"the process is alive but has not run for {self.silent_for(r, now):.1f} s (no heartbeat"
                f"{'; ' + state if state else ''}): it was stopped (SIGSTOP) or is frozen")

    def blame(self, now: float) -> None:
        """For each lost peer, the ranks of its group that stopped (no heartbeat) or never
        reached the collective (fewer collectives entered: comparable when every rank runs
        the same program) are stuck."""
        spmd = len(set(self.texts.values())) == 1
        entered = self.entered
        for f in list(self.failures):
            if f[3] != "collective" or not f[5] or f[5].get("group") is None:
                continue
            where = f[5]
            for p in where["group"]:
                if p == f[1] or p in self.done or self.failed(p) or self.procs[p].exitcode is not None:
                    continue
                if self.silent_for(p, now) > STALE_S:
                    self.stuck(p, f"{self.frozen_text(p, now)}; rank {f[1]} lost it as a peer")
                elif spmd and where.get("ordinal") is not None and entered[p] < where["ordinal"]:
                    self.stuck(p, f"it is running but did not reach {where['what']}, which rank {f[1]} waited "
                                  f"timeout_s={self.timeout_s:g} s for (counting the rendezvous and the mesh groups, "
                                  f"rank {p} has entered {entered[p]} collectives; that one is rank {f[1]}'s "
                                  f"collective {where['ordinal']})")

    # --- the run -------------------------------------------------------------------------------
    def start(self, weights: list[dict], per_rank: list[list[dict]], backend: str, threads: int | None, fault,
              executor: str) -> None:
        """Spawn a process per rank, with a thread that sends its job and one that reads its results."""
        import threading

        from ..ir.printer import print_graph

        from .action_times import node_actions

        ctx, n = self.ctx, self.n
        actions: dict[int, Any] = {}
        for r, g in enumerate(self.graph_list):
            text = self.texts.get(id(g))
            if text is None:
                text = self.texts[id(g)] = print_graph(g)
                actions[id(g)] = node_actions(g)
            job = _Job(r, n, str(self.mesh), text, g.name, weights[r], per_rank[r], self.steps, backend,
                       self.timeout_s, threads, fault, f"tcp://127.0.0.1:{self.port}", executor, actions[id(g)])
            job_recv, job_send = ctx.Pipe(duplex=False)
            res_recv, res_send = ctx.Pipe(duplex=False)
            # The process object spawn writes to the child is small (the job goes on its own
            # pipe), so starting cannot block on a child that dies before reading it.
            p = ctx.Process(target=_worker_main, args=(r, job_recv, res_send, self.beats, self.entered),
                            daemon=True, name=f"partita-rank-{r}")
            p.start()
            self.procs.append(p)
            # The parent keeps only its ends, so a dead rank reads as EOF and a write to it fails.
            job_recv.close()
            res_send.close()
            threading.Thread(target=_send_job, args=(job_send, job), daemon=True,
                             name=f"partita-send-{r}").start()
            reader = threading.Thread(target=_read_results, args=(res_recv, r, self.events), daemon=True,
                                      name=f"partita-read-{r}")
            reader.start()
            self.readers.append(reader)
            self.result_conns.append(res_recv)
        self.spawned_at = time.monotonic()

    def watch(self) -> None:
        """Read the ranks' messages and check their processes until every rank is done or failed
        (after a failure: until its cause has had GRACE_S to show up), then blame the stuck ranks."""
        while True:
            pending = [r for r in range(self.n) if r not in self.done and not self.failed(r)]
            if not pending:
                break
            if self.failures:
                # A peer's lost connection often arrives before the death or error that
                # caused it: give the cause a moment to show up.
                if _first(self.failures)[3] == "error" or (self.first_failure_at is not None
                                                          and time.monotonic() - self.first_failure_at > GRACE_S):
                    break
            batch: list[tuple[int, Any]] = []
            try:
                batch.append(self.events.get(timeout=0.1))
                while True:
                    batch.append(self.events.get_nowait())
            except queue.Empty:
                pass
            for r, msg in batch:
                self.handle(r, msg)
            now = time.monotonic()
            self.check_processes(now)
            if self.failures and self.first_failure_at is None:
                self.first_failure_at = now
        if self.failures:
            self.blame(time.monotonic())

    def check_processes(self, now: float) -> None:
        """Record the ranks that died, never started or stopped beating."""
        for r in range(self.n):
            if r in self.done or self.failed(r):
                continue
            code = self.procs[r].exitcode
            if code is not None:
                # A rank that raised sends its error before it exits: read its pipe to the
                # end before calling it dead.
                if r not in self.ended and now - self.exited_at.setdefault(r, now) < 5.0:
                    continue
                text = f"the process {_exit_text(code)}"
                last = _entered_node(self.graph_list[r], self.mesh, r, int(self.entered[r]), self.current(r))
                if last:
                    text += f" in {last}"
                if r not in self.started:
                    text += (" before it received its job: a spawned rank first re-imports the main module, "
                             "and a script must call launch/run_ranks under `if __name__ == \"__main__\":` "
                             "(the rank's own traceback is on standard error)")
                self.failures.append((_PRIORITY["died"], r, self.current(r), "died", text, None))
            elif r not in self.started:
                if now - self.spawned_at > self.start_limit:
                    self.stuck(r, f"the process did not start: it had not received its job {self.start_limit:g} s "
                                  f"after it was spawned ({_proc_state(self.procs[r].pid) or 'alive'})")
            elif self.silent_for(r, now) > max(self.timeout_s, STALE_S):
                self.stuck(r, self.frozen_text(r, now))

    def stop(self) -> None:
        """Kill the ranks still running and join their processes and reader threads."""
        # Killed, not asked: a stopped process does not act on SIGTERM until continued.
        for p in self.procs:
            if p.exitcode is None:
                p.kill()
        for p in self.procs:
            p.join(timeout=5)
        for t in self.readers:
            t.join(timeout=2)
        for c in self.result_conns:
            c.close()

    def raise_failure(self) -> None:
        """Raise RankFailure for the first failure, with what became of the other ranks."""
        steps = self.steps
        _, rank, step, kind, message, _ = _first(self.failures)
        others = {}
        for r in range(self.n):
            if r == rank or r in self.done:
                continue
            mine = [f for f in self.failures if f[1] == r]
            if mine:
                f = min(mine, key=lambda f: f[0])
                others[r] = f"{_HEAD[f[3]]} {_step_text(f[2], steps)}: {f[4]}"
            else:
                others[r] = f"stopped by run_ranks {_step_text(self.current(r), steps)}"
        mesh = self.mesh
        coords = ", ".join(f"{a}={c}" for a, c in zip(mesh.names, mesh.coords(rank)))
        text = f"rank {rank} ({coords} on {mesh}) {_HEAD[kind]} {_step_text(step, steps)}: {message}"
        if others:
            text += "\nother ranks:\n" + "\n".join(f"  rank {r}: {t}" for r, t in sorted(others.items()))
        raise RankFailure(text, rank, step, kind, others, self.tracebacks.get(rank))

    def result(self) -> RunResult:
        """The RunResult of a run in which every rank finished."""
        n, steps = self.n, self.steps
        outputs: list[list[Any]] = [[None] * n for _ in range(steps)]
        final: list[Any] = [None] * n
        timings: list[Any] = [None] * n
        init: list[Any] = [None] * n
        recv: list[Any] = [None] * n
        acts: list[Any] = [None] * n
        clocks: list[Any] = [None] * n
        for r, (_, _, outs, w, t, setup, waits, a) in self.done.items():
            for s in range(steps):
                outputs[s][r] = outs[s]
            final[r], timings[r], init[r], recv[r], (acts[r], clocks[r]) = w, t, setup, waits, a or (None, None)
        return RunResult(self.mesh, steps, tuple(range(n)), outputs, final, timings, init, recv, acts, clocks)


def under_torchrun() -> bool:
    """Whether this process was started by torchrun (its rendezvous variables are set)."""
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _join(mesh: Mesh, graph_list: list[Graph], weights: list[dict], per_rank: list[list[dict]], steps: int,
          backend: str, timeout_s: float, threads: int | None, fault, progress, executor: str = "torch") -> RunResult:
    """Run this process's rank in the process group torchrun set up."""
    from ..ir.printer import print_graph
    from .action_times import node_actions

    rank, n = int(os.environ["RANK"]), mesh.size
    g = graph_list[rank]
    job = _Job(rank, n, str(mesh), print_graph(g), g.name, weights[rank], per_rank[rank], steps, backend,
               timeout_s, threads, fault, "env://", executor, node_actions(g))
    step_cell = [-1]

    def report(msg: tuple) -> None:
        if msg[0] == "step" and progress is not None:
            progress(rank, msg[2], msg[3])

    try:
        outs, final, timings, setup, waits, acts = _run_rank(job, report, step_cell, _Tracker(rank))
    except PartitaError as e:
        kind, message, _ = _describe(e)
        step = step_cell[0] if step_cell[0] >= 0 else None
        raise RankFailure(f"rank {rank} ({mesh}) {_HEAD[kind]} {_step_text(step)}: {message}", rank, step,
                          kind) from e
    except Exception as e:
        step = step_cell[0] if step_cell[0] >= 0 else None
        raise RankFailure(f"rank {rank} ({mesh}) raised {_step_text(step)}: {type(e).__name__}: {e}",
                          rank, step, "error") from e
    outputs: list[list[Any]] = [[None] * n for _ in range(steps)]
    for s in range(steps):
        outputs[s][rank] = outs[s]
    final_all: list[Any] = [None] * n
    timing_all: list[Any] = [None] * n
    init: list[Any] = [None] * n
    recv: list[Any] = [None] * n
    act_all: list[Any] = [None] * n
    clock_all: list[Any] = [None] * n
    final_all[rank], timing_all[rank], init[rank], recv[rank] = final, timings, setup, waits
    act_all[rank], clock_all[rank] = acts or (None, None)
    return RunResult(mesh, steps, (rank,), outputs, final_all, timing_all, init, recv, act_all, clock_all)


def run_ranks(graphs: Graph | Sequence[Graph], mesh: Mesh | str, weights_by_rank: Sequence[Mapping[str, Any]],
              inputs: Sequence[Any] | None = None, steps: int | None = None, *, backend: str = "auto",
              timeout_s: float = 60.0, executor: str = "torch",
              progress: Callable[[int, int, float], None] | None = None, threads: int | None = 1,
              _fault: tuple[int, int, str] | None = None) -> RunResult:
    """Run per-rank programs on ``mesh.size`` processes with torch.distributed.

    ``graphs``: one per-rank graph every rank runs, or a list with one per rank.
    ``weights_by_rank[r]``: the param/state arrays rank r holds (its shards only).
    ``inputs``: a list with one mapping per rank (the data inputs of every step), or a list
    with one such list per step. ``steps``: how many steps (default 1, or the number of
    per-step lists). Outputs aliasing an input feed that input at the next step.

    Outside torchrun it spawns one process per rank on a local gloo group; under torchrun
    (RANK, WORLD_SIZE, MASTER_ADDR set) it joins the existing group and runs this rank only;
    other ranks' entries of ``weights_by_rank`` and ``inputs`` may then be None.
    ``backend``: "auto" (NCCL when this machine has a GPU per local rank, else gloo), "gloo"
    or "nccl" (rank r computes on ``cuda:<local rank>``; see ``resolve_backend``).
    ``executor``: "torch" (each node's ATen implementation) or "codegen" (partita.codegen's
    generated kernels and memory plan; CPU ranks only). ``timeout_s`` bounds rendezvous and
    every collective. ``progress(rank, step, seconds)``
    is called as steps finish. ``threads``: torch intra-op threads per rank (None: leave
    torch's default). ``_fault=(rank, step, kind)`` injects a failure for tests: "raise" (the
    rank's first compute node raises), "exit" (os._exit(3)), "kill" (SIGKILL), "stall" (the
    rank sleeps, so its peers' collectives time out), "stop" (the rank sends itself SIGSTOP)
    or "kill-mid" (SIGKILL as the rank enters its third send or recv of that step, or its
    third collective in a program without them: a pipeline stage dying mid-schedule).

    Raises ``LaunchError`` for arguments that cannot make a run (and, outside torchrun, for a
    main module that spawn cannot re-import: ``check_spawnable``), ``RankFailure`` when a rank
    raises, dies, stops or loses a peer.
    """
    mine = None
    if under_torchrun():
        n, world, mine = Mesh.of(mesh).size, int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        if world != n:
            raise LaunchError(f"run_ranks under torchrun: WORLD_SIZE={world} but the mesh {Mesh.of(mesh)} has {n} "
                              f"ranks; launch with --nproc_per_node {n} (times the number of nodes), or use a "
                              f"mesh of {world} ranks")
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", Mesh.of(mesh).size)) if under_torchrun() else Mesh.of(mesh).size
    backend = resolve_backend(backend, local_ranks)
    mesh, graph_list, weights, per_rank, steps = _normalize(graphs, mesh, weights_by_rank, inputs, steps,
                                                            executor, backend, _fault, mine)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
        raise LaunchError(f"run_ranks: timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if under_torchrun():
        return _join(mesh, graph_list, weights, per_rank, steps, backend, float(timeout_s), threads, _fault,
                     progress, executor)
    check_spawnable("run_ranks")
    return _spawn(mesh, graph_list, weights, per_rank, steps, backend, float(timeout_s), threads, _fault,
                  progress, executor)
