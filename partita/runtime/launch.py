"""Run per-rank programs on real processes with torch.distributed.

``run_ranks`` either spawns one process per mesh rank (gloo on ``tcp://127.0.0.1:<port>``)
or, under ``torchrun``, joins the process group that is already there and runs only this
process's rank. Each rank parses its program from text (graphs travel as their text form,
arrays as NumPy), creates the mesh groups, compiles a ``TorchProgram`` with ``donate=True``
once and runs the steps; outputs that alias an input (new params, optimizer state) become
that input for the next step.

Failures never hang: the parent watches a pipe from each rank and each rank's liveness (a
rank killed by a signal reports nothing), stops every other rank on the first failure and
raises ``RankFailure``. Every collective runs with ``timeout_s``, so a rank whose peer died
or stopped fails within that time, with an error naming the collective and its axis.
"""

from __future__ import annotations

import os
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
from ..parallel.mesh import Mesh

FAULT_KINDS = ("raise", "exit", "kill", "stall")


class LaunchError(PartitaError):
    """``run_ranks`` was called with arguments that cannot make a run (wrong counts, names,
    shapes, mesh); the message names the argument and the fix."""


class CollectiveFailure(ExecutionError):
    """A collective failed or timed out on this rank, most often because a peer rank of its
    group died or stopped; the message names the op, the axis, the group and the location."""


class RankFailure(PartitaError):
    """A rank raised, died, or lost a peer. ``rank``, ``step`` (None: before the first step)
    and ``kind`` ("error", "died" or "collective") describe the first failure; ``others``
    maps each other rank that did not finish to what became of it; ``remote_traceback`` is
    the failing rank's Python traceback when it sent one (spawned ranks)."""

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


def _as_numpy(a: Any) -> np.ndarray:
    if type(a).__module__.startswith("torch"):
        from ..backend.torch_exec import to_numpy
        return to_numpy(a)
    return np.asarray(a)


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
    return {k: _as_numpy(a) for k, a in d.items()}


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
    if executor != "torch":
        raise LaunchError(f"run_ranks: executor={executor!r} cannot run collectives across processes; use "
                          "executor=\"torch\" (partita.parallel.simulate.run_mesh runs the NumPy reference "
                          "on a simulated mesh)")
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
    if not isinstance(steps, int) or steps < 1:
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

def _location(node) -> str:
    loc = node.text_loc or node.loc
    return f" at {loc}" if loc else ""


def _instrument(program, mesh: Mesh, rank: int, timeout_s: float, fault: tuple[int, int, str] | None,
                step_cell: list[int]) -> None:
    """Wrap the program's collective steps so a failure names the op, axis, group and the
    likely cause; with a "raise" fault, make the first compute node of this rank raise at the
    fault step (so the injected error takes the path a real one does).

    ``TorchProgram.steps`` are tuples ``(fn, operand slots, attrs, result slots, dtypes,
    frees, waits, node)``; only ``fn`` is replaced. A collective started asynchronously fails
    when it is waited for: its ``Pending`` gets the same error.
    """
    from ..ops.collective import Pending, is_point_to_point
    from ..ops.registry import OPS

    at_step = fault[1] if fault is not None and fault[0] == rank and fault[2] == "raise" else None
    injected = at_step is not None
    for i, st in enumerate(program.steps):
        fn, node = st[0], st[-1]
        if OPS[node.op].collective is not None or is_point_to_point(node):
            axis = node.attrs.get("axis")
            if node.attrs.get("group_size", 1) <= 1 or axis not in mesh.names:
                continue
            group = mesh.group_of(rank, axis)

            def fail(e: Exception, node=node, axis=axis, group=group) -> None:
                # gloo's messages go on with generic advice after the first sentence.
                first = (str(e).strip().splitlines() or [""])[0].split(" This is typically")[0][:300]
                raise CollectiveFailure(
                    f"{node.op} over axis '{axis}' (group of ranks {group}){_location(node)} failed on rank "
                    f"{rank} at step {step_cell[0]}: {type(e).__name__}: {first}; a peer rank of this group "
                    f"probably died or stopped before reaching this collective (each collective waits at "
                    f"most timeout_s={timeout_s:g} s)") from e

            def wrapped(args, attrs, fn=fn, fail=fail):
                try:
                    res = fn(args, attrs)
                except PartitaError:
                    raise
                except Exception as e:
                    fail(e)
                if type(res) is Pending:
                    res.on_error = fail
                return res
            program.steps[i] = (wrapped, *st[1:])
        elif injected:
            injected = False

            def raising(args, attrs, fn=fn):
                if step_cell[0] == at_step:
                    raise RuntimeError(f"injected fault (run_ranks _fault=(rank {rank}, step {at_step}, 'raise'))")
                return fn(args, attrs)
            program.steps[i] = (raising, *st[1:])


def _run_rank(job: _Job, report: Callable[[tuple], None], step_cell: list[int]) -> tuple:
    """Join the process group, build the mesh groups, compile and run the steps of one rank;
    returns (outputs per step, final weights, seconds per step, setup seconds)."""
    import torch
    import torch.distributed as dist

    from ..backend.torch_exec import TorchProgram, to_numpy, to_tensor
    from ..ir.parser import parse
    from ..parallel import comm

    t0 = time.perf_counter()
    if job.threads is not None:
        torch.set_num_threads(job.threads)
    mesh = Mesh.of(job.mesh)
    timeout = timedelta(seconds=job.timeout_s)
    if not dist.is_initialized():
        if job.init == "env://":
            dist.init_process_group(job.backend, init_method="env://", timeout=timeout)
        else:
            dist.init_process_group(job.backend, init_method=job.init, rank=job.rank, world_size=job.world,
                                    timeout=timeout)
    graph = parse(job.graph_text, f"<@{job.graph_name} rank {job.rank}>")
    device = None
    if job.backend == "nccl":
        # One GPU per rank of this machine; NCCL moves only CUDA tensors.
        local = int(os.environ.get("LOCAL_RANK", job.rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    previous = comm.set_groups(comm.new_mesh_groups(mesh, timeout=timeout))
    try:
        program = TorchProgram(graph, donate=True, overlap=True, device=device)
        _instrument(program, mesh, job.rank, job.timeout_s, job.fault, step_cell)
        aliases = [(i, input_name(a)) for i, a in enumerate(graph.output_aliases) if a is not None]
        aliased = {n for _, n in aliases}
        # Donated buffers are updated in place: the rank owns a copy of each aliased array,
        # so neither the caller's arrays (torchrun) nor the inputs reused every step change.
        carried: dict[str, Any] = {k: to_tensor(np.array(a, copy=True)) for k, a in job.weights.items()}
        if device is not None:
            carried = {k: t.to(device) for k, t in carried.items()}
        setup = time.perf_counter() - t0
        report(("ready", job.rank, setup))
        outputs, timings = [], []
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
                if fault[2] == "stall":
                    time.sleep(job.timeout_s * 3 + 30)
            given = job.inputs[s] if len(job.inputs) > 1 else job.inputs[0]
            feed = {k: (to_tensor(np.array(a, copy=True)) if k in aliased else a) for k, a in given.items()
                    if not (s > 0 and k in aliased)}
            feed.update(carried)
            t = time.perf_counter()
            outs = program(feed, {})
            timings.append(time.perf_counter() - t)
            # Copies: the next step may update an aliased output's buffer in place.
            outputs.append([np.array(to_numpy(o), copy=True) for o in outs])
            for i, name in aliases:
                carried[name] = outs[i]
            report(("step", job.rank, s, timings[-1]))
        final = {k: np.array(to_numpy(carried[k]), copy=True) for k in job.weights}
        step_cell[0] = job.steps
        # Every rank has finished its collectives before any leaves, so none tears down a
        # connection a peer still reads from.
        dist.barrier()
        return outputs, final, timings, setup
    finally:
        comm.set_groups(previous)


def _describe(e: BaseException) -> tuple[str, str]:
    kind = "collective" if isinstance(e, CollectiveFailure) else "error"
    return kind, f"{type(e).__name__}: {e}"


def _worker_main(job: _Job, conn) -> None:
    """Entry point of a spawned rank: runs the job and sends ``ready``, ``step`` and finally
    ``done`` or ``error`` messages on ``conn``."""
    step_cell = [-1]
    try:
        outputs, final, timings, setup = _run_rank(job, conn.send, step_cell)
        conn.send(("done", job.rank, outputs, final, timings, setup))
        code = 0
    except BaseException as e:  # noqa: BLE001 -- a rank reports whatever stopped it
        kind, message = _describe(e)
        try:
            conn.send(("error", job.rank, step_cell[0] if step_cell[0] >= 0 else None, kind, message,
                       traceback.format_exc()))
        except Exception:
            pass
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    conn.close()
    # No interpreter teardown: destroying gloo groups whose peers are gone can block.
    os._exit(code)


# --- the parent ----------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


_PRIORITY = {"error": 0, "died": 1, "collective": 2}


def _first(failures: list[tuple[int, int, int | None, str, str]]) -> tuple[int, int, int | None, str, str]:
    """The failure to report: a rank's own error before a death before a lost peer (the
    usual consequence of the other two), the earliest of a kind first."""
    return failures[min(range(len(failures)), key=lambda i: (failures[i][0], i))]


def _spawn(mesh: Mesh, graph_list: list[Graph], weights: list[dict], per_rank: list[list[dict]], steps: int,
           backend: str, timeout_s: float, threads: int | None, fault, progress) -> RunResult:
    import multiprocessing
    from multiprocessing.connection import wait

    from ..ir.printer import print_graph

    n = mesh.size
    texts: dict[int, str] = {}
    port = _free_port()
    ctx = multiprocessing.get_context("spawn")
    procs, conns = [], []
    for r, g in enumerate(graph_list):
        text = texts.get(id(g))
        if text is None:
            text = texts[id(g)] = print_graph(g)
        job = _Job(r, n, str(mesh), text, g.name, weights[r], per_rank[r], steps, backend, timeout_s,
                   threads, fault, f"tcp://127.0.0.1:{port}")
        recv_end, send_end = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_worker_main, args=(job, send_end), daemon=True, name=f"partita-rank-{r}")
        p.start()
        send_end.close()  # the parent keeps only the read end, so a dead rank reads as EOF
        procs.append(p)
        conns.append(recv_end)

    done: dict[int, tuple] = {}
    last_step: dict[int, int | None] = {r: None for r in range(n)}
    failures: list[tuple[int, int, int | None, str, str]] = []  # (priority, rank, step, kind, message)
    tracebacks: dict[int, str] = {}
    open_conns = {r: conns[r] for r in range(n)}
    first_failure_at: float | None = None

    ready: set[int] = set()

    def current(r: int) -> int | None:
        """The step rank r is in (None: setup; ``steps``: past its last step)."""
        if r not in ready:
            return None
        last = last_step[r]
        return 0 if last is None else last + 1

    def handle(r: int, msg: tuple) -> None:
        tag = msg[0]
        if tag == "ready":
            ready.add(r)
        elif tag == "step":
            last_step[r] = msg[2]
            if progress is not None:
                progress(r, msg[2], msg[3])
        elif tag == "done":
            done[r] = msg
        elif tag == "error":
            _, _, step, kind, message, tracebacks[r] = msg
            failures.append((_PRIORITY[kind], r, step, kind, message))

    def drain(r: int) -> None:
        c = open_conns.get(r)
        while c is not None:
            try:
                if not c.poll():
                    return
                handle(r, c.recv())
            except (EOFError, OSError):
                del open_conns[r]
                return

    try:
        while True:
            pending = [r for r in range(n) if r not in done and not any(f[1] == r for f in failures)]
            if not pending:
                break
            if failures:
                # A peer's lost connection often arrives before the death or error that
                # caused it: give the cause a moment to show up.
                if _first(failures)[3] == "error" or (first_failure_at is not None
                                          and time.monotonic() - first_failure_at > 2.0):
                    break
            watch = [open_conns[r] for r in pending if r in open_conns] + [procs[r].sentinel for r in pending]
            for obj in wait(watch, timeout=0.5):
                for r in pending:
                    if obj is open_conns.get(r) or obj is procs[r].sentinel:
                        drain(r)
            for r in pending:
                if r in done or any(f[1] == r for f in failures):
                    continue
                if procs[r].exitcode is not None:
                    drain(r)
                    if r not in done and not any(f[1] == r for f in failures):
                        failures.append((_PRIORITY["died"], r, current(r), "died",
                                         f"the process {_exit_text(procs[r].exitcode)}"))
            if failures and first_failure_at is None:
                first_failure_at = time.monotonic()
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for c in conns:
            c.close()

    if failures:
        _, rank, step, kind, message = _first(failures)
        others = {}
        for r in range(n):
            if r == rank or r in done:
                continue
            mine = [f for f in failures if f[1] == r]
            if mine:
                others[r] = f"{_step_text(mine[0][2], steps)}: {mine[0][4]}"
            else:
                others[r] = f"stopped by run_ranks {_step_text(current(r), steps)}"
        coords = ", ".join(f"{a}={c}" for a, c in zip(mesh.names, mesh.coords(rank)))
        head = {"error": "raised", "died": "died", "collective": "lost a peer"}[kind]
        text = (f"rank {rank} ({coords} on {mesh}) {head} {_step_text(step, steps)}: {message}")
        if others:
            text += "\nother ranks:\n" + "\n".join(f"  rank {r}: {t}" for r, t in sorted(others.items()))
        raise RankFailure(text, rank, step, kind, others, tracebacks.get(rank))

    outputs: list[list[Any]] = [[None] * n for _ in range(steps)]
    final: list[Any] = [None] * n
    timings: list[Any] = [None] * n
    init: list[Any] = [None] * n
    for r, (_, _, outs, w, t, setup) in done.items():
        for s in range(steps):
            outputs[s][r] = outs[s]
        final[r], timings[r], init[r] = w, t, setup
    return RunResult(mesh, steps, tuple(range(n)), outputs, final, timings, init)


def _torchrun_env() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def _join(mesh: Mesh, graph_list: list[Graph], weights: list[dict], per_rank: list[list[dict]], steps: int,
          backend: str, timeout_s: float, threads: int | None, fault, progress) -> RunResult:
    """Run this process's rank in the process group torchrun set up."""
    from ..ir.printer import print_graph

    rank, n = int(os.environ["RANK"]), mesh.size
    g = graph_list[rank]
    job = _Job(rank, n, str(mesh), print_graph(g), g.name, weights[rank], per_rank[rank], steps, backend,
               timeout_s, threads, fault, "env://")
    step_cell = [-1]

    def report(msg: tuple) -> None:
        if msg[0] == "step" and progress is not None:
            progress(rank, msg[2], msg[3])

    try:
        outs, final, timings, setup = _run_rank(job, report, step_cell)
    except PartitaError as e:
        kind, message = _describe(e)
        step = step_cell[0] if step_cell[0] >= 0 else None
        head = "lost a peer" if kind == "collective" else "raised"
        raise RankFailure(f"rank {rank} ({mesh}) {head} {_step_text(step)}: {message}", rank, step, kind) from e
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
    final_all[rank], timing_all[rank], init[rank] = final, timings, setup
    return RunResult(mesh, steps, (rank,), outputs, final_all, timing_all, init)


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
    ``timeout_s`` bounds rendezvous and every collective. ``progress(rank, step, seconds)``
    is called as steps finish. ``threads``: torch intra-op threads per rank (None: leave
    torch's default). ``_fault=(rank, step, kind)`` injects a failure for tests: "raise" (the
    rank's first compute node raises), "exit" (os._exit(3)), "kill" (SIGKILL) or "stall" (the
    rank sleeps, so its peers' collectives time out).

    Raises ``LaunchError`` for arguments that cannot make a run, ``RankFailure`` when a rank
    raises, dies or loses a peer.
    """
    mine = None
    if _torchrun_env():
        n, world, mine = Mesh.of(mesh).size, int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
        if world != n:
            raise LaunchError(f"run_ranks under torchrun: WORLD_SIZE={world} but the mesh {Mesh.of(mesh)} has {n} "
                              f"ranks; launch with --nproc_per_node {n} (times the number of nodes), or use a "
                              f"mesh of {world} ranks")
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", Mesh.of(mesh).size)) if _torchrun_env() else Mesh.of(mesh).size
    backend = resolve_backend(backend, local_ranks)
    mesh, graph_list, weights, per_rank, steps = _normalize(graphs, mesh, weights_by_rank, inputs, steps,
                                                            executor, backend, _fault, mine)
    if not isinstance(timeout_s, (int, float)) or timeout_s <= 0:
        raise LaunchError(f"run_ranks: timeout_s must be a positive number of seconds, got {timeout_s!r}")
    if _torchrun_env():
        return _join(mesh, graph_list, weights, per_rank, steps, backend, float(timeout_s), threads, _fault,
                     progress)
    return _spawn(mesh, graph_list, weights, per_rank, steps, backend, float(timeout_s), threads, _fault,
                  progress)
