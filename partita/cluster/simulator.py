"""The simulator: one training (or inference) step of the per-rank programs partita emits, on a
cluster described by a cluster file, priced by the cost model.

Every rank has a compute stream and one communication stream per mesh axis, and runs its
program in order exactly as the runtime does (``TorchProgram(overlap=True)``): a compute op
runs on the compute stream after the one before it; a collective with an asynchronous form
(``steps.ASYNC_OPS``, the runtime's own list: all_reduce, all_gather, reduce_scatter, ring_shift,
send, recv) starts on its axis's stream where it stands in the program, once every member of its
group has reached it and the stream is free, and the compute stream waits for it only where
its result is first read (a send: at the program's end), for what of it is not yet done; the
other collectives (all_to_all, broadcast) block the compute stream until they finish. So
zero3's param all_gathers, which order-collectives issues ``prefetch`` gathers ahead (default
1), run on the dp stream while the params before them are used, and its gradient
reduce_scatters while the backward goes on; the collectives of one axis run one after
another on its stream, as on one process group. The k-th collective on an axis meets the k-th of every member of
its group; the k-th send from rank s to d meets the k-th recv on d from s, and transfers
between one pair of ranks happen one after another. Constants and other ops without operands
or effects are computed once, outside the step, as the runtime hoists them.

Ranks whose programs and links are alike are simulated once: a rank's signature is its program
and, for each mesh axis, which link (inside a node or across nodes) joins it to each member of
its group; a representative of each signature runs, and a collective waits for the
representatives of its members' signatures. This is exact when alike ranks keep alike
timelines, which holds whenever the representatives' point-to-point peers are representatives
of their own signatures (checked; otherwise every rank is simulated).

``simulate(program, cluster)`` returns a ``SimResult``: the step time, tokens per second,
FLOP/s utilization (model FLOPs without recomputation, MFU, and hardware FLOPs as computed,
HFU, after Korthikanti et al. 2022), each simulated rank's memory (``partita.cluster.memory_report``),
the communication volume per axis, and the timeline (``chrome_trace()`` writes it as JSON that
Perfetto and chrome://tracing show).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterable, Mapping, Sequence

from ..ir.diagnostics import PartitaError
from ..ir.graph import Graph, Node, Value
from ..ir.mesh import Mesh
from .cost import ATTENTION_OPS, COLLECTIVE_OPS, GEMM_OPS, P2P_OPS, CostModel, price_key
from .eager import eager_ops
from .fused_groups import fused_time
from .hardware import Cluster, load_cluster
from .memory_report import MemoryReport, memory_report
from .steps import ASYNC_OPS, Comm, Issue, Piece, Program, Run, SectionRun, Step, Wait, is_hoisted

class SimulationError(PartitaError):
    """A program that cannot be simulated on the cluster (the message names the rank, the
    field or the axis, and the fix)."""


# --- programs as steps -------------------------------------------------------------------------

def prepare(graph: Graph, model: CostModel, cache: dict | None = None) -> Program:
    """Cut ``graph`` into the steps the simulator plays, pricing every compute op once."""
    outputs = set(graph.outputs)
    steps: list[Step] = []
    comms: list[Comm] = []
    nodes = list(graph.nodes)
    durations = [0.0] * len(nodes)
    pending: dict[Value, int] = {}
    ordinals: dict[tuple, int] = defaultdict(int)
    flops = 0.0
    kinds: dict[str, float] = defaultdict(float)
    run_start = -1
    run_time = 0.0
    cache = {} if cache is None else cache

    def flush(end: int) -> None:
        nonlocal run_start, run_time
        if run_start >= 0:
            steps.append(Run(run_time, run_start, end))
        run_start, run_time = -1, 0.0

    for i, n in enumerate(nodes):
        waits = [pending.pop(v) for v in dict.fromkeys(n.operands) if v in pending]
        if waits:
            flush(i)
            steps.extend(Wait(c) for c in waits)
        op = n.op
        if op in P2P_OPS or (op in COLLECTIVE_OPS and n.attrs.get("group_size", 1) > 1):
            flush(i)
            axis = n.attrs["axis"]
            peer = n.attrs.get("peer") if op in P2P_OPS else None
            key = (axis, op, peer) if op in P2P_OPS else (axis,)
            c = Comm(n, axis, ordinals[key], op in ASYNC_OPS, peer, op == "send")
            ordinals[key] += 1
            comms.append(c)
            steps.append(Issue(len(comms) - 1))
            if c.is_async and n.results:
                pending[n.results[0]] = len(comms) - 1
            elif c.is_async and not n.results:
                pass   # a send: waited for at the end
            else:
                steps.append(Wait(len(comms) - 1))
            continue
        if is_hoisted(n, outputs):
            continue
        priced = fused_time(model, n)
        if priced is None:
            key2 = price_key(n)
            priced = cache.get(key2)
            if priced is None:
                priced = cache[key2] = model.compute_time(n)
        durations[i] = priced.seconds
        flops += priced.flops
        kinds[priced.kind] += priced.seconds
        if run_start < 0:
            run_start = i
        run_time += priced.seconds
    flush(len(nodes))
    # Results still in flight at the end (outputs of asynchronous collectives), and every
    # send, are waited for before the step ends.
    steps.extend(Wait(c) for c in pending.values())
    steps.extend(Wait(k) for k, c in enumerate(comms) if c.sending)
    return Program(graph, steps, comms, nodes, durations, flops, dict(kinds))


# --- results -----------------------------------------------------------------------------------

@dataclass
class Event:
    """One span of a rank's timeline: ``stream`` is ``compute`` or ``comm:<axis>``."""

    rank: int
    stream: str
    name: str
    start: float
    end: float
    args: dict = field(default_factory=dict)
    scope: str = ""                 # the module scope of its node (``Location.scope``), for layer spans


def event_scope(node: Node) -> str:
    """The module scope of ``node`` as a trace groups it, ``(recompute)`` marked."""
    loc = node.loc
    if loc is None:
        return ""
    return loc.scope + (" (recompute)" if loc.recompute and loc.scope else "")


def layer_of(scope: str) -> str:
    """The layer a module scope belongs to: up to its first numbered part
    (``transformer.h.3.attn`` -> ``transformer.h.3``), else its first two parts."""
    base, mark, _rest = scope.partition(" (")
    parts = base.split(".")
    for i, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[:i + 1]) + (" (recompute)" if mark else "")
    return ".".join(parts[:2]) + (" (recompute)" if mark else "")


def format_bytes(x: float) -> str:
    """A byte count in binary units, three significant digits: 1536 -> '1.50 KiB'."""
    if abs(x) < 999.5:
        return f"{x:.0f} B"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        x /= 1024
        if abs(x) < 999.5 or unit == "EiB":
            return f"{x:.3g} {unit}" if abs(x) >= 100 else f"{x:#.3g} {unit}"
    raise AssertionError("unreachable")


def format_ms(seconds: float) -> str:
    """A duration in milliseconds with two decimals, as every time of the summary is printed."""
    return f"{seconds * 1e3:.2f}"


def layer_spans(events: list[Event]) -> list[Event]:
    """``events`` with each run of consecutive spans of one rank's stream in the same layer
    (``layer_of`` their scope) merged into one span named by the layer (``args``: ops, busy ms);
    a pipeline section's span stays as it is."""
    out: list[Event] = []
    last: dict[tuple[int, str], Event] = {}
    for e in events:
        key = (e.rank, e.stream)
        if "section" in e.args:
            last[key] = Event(e.rank, e.stream, e.name, e.start, e.end, dict(e.args))
            out.append(last[key])
            continue
        layer = layer_of(e.scope) if e.scope else "(no layer)"
        m = last.get(key)
        if m is not None and "section" not in m.args and m.name == layer:
            m.start, m.end = min(m.start, e.start), max(m.end, e.end)
            m.args["ops"] += 1
            m.args["busy_ms"] += (e.end - e.start) * 1e3
            continue
        last[key] = Event(e.rank, e.stream, layer, e.start, e.end, {"ops": 1, "busy_ms": (e.end - e.start) * 1e3})
        out.append(last[key])
    return out


@dataclass
class RankResult:
    """One simulated rank (the representative of ``count`` alike ranks)."""

    rank: int
    count: int
    end: float                      # seconds from the step's start to this rank's end
    compute: float                  # seconds its compute stream is busy
    waiting: float                  # seconds its compute stream waits for communication
    comm: dict[str, float]          # seconds each axis's stream is busy
    flops: float                    # FLOPs it computes in the step
    kinds: dict[str, float]         # compute seconds by kind
    memory: MemoryReport | None = None
    waits: dict[str, float] = field(default_factory=dict)   # ``waiting`` by the axis waited for


@dataclass
class SimResult:
    """What ``simulate`` found (see the module docstring)."""

    cluster: Cluster
    mesh: Mesh
    step_time: float
    ranks: list[RankResult]
    events: list[Event]
    comm_bytes: dict[str, float]         # bytes one rank of each signature sends per axis, summed over ranks
    tokens: int | None
    model_flops: float | None            # per step, whole model, without recomputation
    hardware_flops: float                # per step, all ranks, as computed
    peak_flops: float                    # one device's peak for the model's dtype
    dedup: bool
    # The program simulated (a ParallelProgram, PipelineProgram or Graph): partita.view draws its
    # memory over the step from it when the result is viewed alone.
    program: Any = field(default=None, repr=False, compare=False)

    @property
    def devices(self) -> int:
        return self.mesh.size

    @property
    def tokens_per_second(self) -> float | None:
        return None if self.tokens is None else self.tokens / self.step_time

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization: model FLOPs per second over the devices' peak."""
        if self.model_flops is None:
            return None
        return self.model_flops / (self.step_time * self.devices * self.peak_flops)

    @property
    def hfu(self) -> float:
        """Hardware FLOPs utilization: FLOPs computed (recomputation included) per second over
        the devices' peak."""
        return self.hardware_flops / (self.step_time * self.devices * self.peak_flops)

    def flops_per_device(self, flops: float | None = None) -> float:
        """FLOP/s per device for ``flops`` per step (default the model FLOPs)."""
        f = self.model_flops if flops is None else flops
        if f is None:
            raise SimulationError("the model FLOPs are unknown; pass flops=")
        return f / (self.step_time * self.devices)

    def peak_memory(self) -> float:
        return max((r.memory.peak for r in self.ranks if r.memory is not None), default=0.0)

    def text(self) -> str:
        """The summary: step, throughput, utilization, each simulated rank, communication and the
        largest rank's memory; every byte figure in binary units (``format_bytes``), every time in ms."""
        from .hardware import format_quantity as fq

        lines = [f"simulated step on {self.cluster.name} ({self.devices} of {self.cluster.devices} devices, "
                 f"mesh {self.mesh}): {format_ms(self.step_time)} ms"]
        if self.tokens is not None:
            lines.append(f"  {self.tokens_per_second:,.0f} tokens/s ({self.tokens:,} tokens per step)")
        if self.mfu is not None:
            lines.append(f"  MFU {self.mfu:.1%} ({fq(self.flops_per_device(), 'FLOP/s')} per device), "
                         f"HFU {self.hfu:.1%}")
        else:
            lines.append(f"  HFU {self.hfu:.1%}")
        lines.append(f"  ranks simulated: {len(self.ranks)} of {self.devices}" +
                     (" (alike ranks once)" if self.dedup else ""))
        lines.append(f"  {'rank':>6} {'alike':>6} {'end ms':>9} {'compute':>8} {'waits':>8}  comm ms per axis"
                     f"{'':13} peak memory")
        for r in self.ranks[:16]:
            comm = ", ".join(f"{a} {format_ms(t)}" for a, t in sorted(r.comm.items())) or "-"
            mem = format_bytes(r.memory.peak) if r.memory is not None else "-"
            lines.append(f"  {r.rank:>6} {r.count:>6} {format_ms(r.end):>9} {format_ms(r.compute):>8} "
                         f"{format_ms(r.waiting):>8}  {comm:<28} {mem}")
        if len(self.ranks) > 16:
            lines.append(f"  ... {len(self.ranks) - 16} more")
        if self.comm_bytes:
            lines.append("  communication per step: " + ", ".join(
                f"{a} {format_bytes(b)}" for a, b in sorted(self.comm_bytes.items())))
        with_mem = [(r.memory.peak, r) for r in self.ranks if r.memory is not None]
        worst = max(with_mem, key=lambda x: x[0])[1] if with_mem else None
        if worst is not None and worst.memory is not None:
            lines.append(f"  memory of rank {worst.rank} (the largest):")
            lines.extend("    " + s for s in memory_lines(worst.memory, self.cluster.device.memory))
        return "\n".join(lines)

    def chrome_trace(self, path: str | os.PathLike | None = None, *, detail: bool = True) -> dict:
        """The timeline as Chrome trace JSON (one process per simulated rank, one thread per
        stream); written to ``path`` when given. ``detail=False``: one span per layer run
        (``layer_spans``) instead of one per op."""
        tids: dict[tuple[int, str], int] = {}
        events: list[dict] = []
        for r in self.ranks:
            events.append({"ph": "M", "name": "process_name", "pid": r.rank,
                           "args": {"name": f"rank {r.rank}" + (f" (x{r.count})" if r.count > 1 else "")}})
        for e in (self.events if detail else layer_spans(self.events)):
            key = (e.rank, e.stream)
            if key not in tids:
                tids[key] = len([k for k in tids if k[0] == e.rank])
                events.append({"ph": "M", "name": "thread_name", "pid": e.rank, "tid": tids[key],
                               "args": {"name": e.stream}})
            events.append({"ph": "X", "name": e.name, "pid": e.rank, "tid": tids[key], "ts": e.start * 1e6,
                           "dur": max(e.end - e.start, 0.0) * 1e6, "args": e.args})
        doc = {"traceEvents": events, "displayTimeUnit": "ms",
               "otherData": {"cluster": self.cluster.name, "mesh": str(self.mesh),
                             "step_ms": self.step_time * 1e3}}
        if path is not None:
            with open(path, "w") as f:
                json.dump(doc, f)
        return doc


def memory_lines(m: MemoryReport, capacity: float | None = None) -> list[str]:
    """``MemoryReport.text``'s lines with every byte figure in binary units (``format_bytes``)."""
    fb = format_bytes
    lines = [f"params {fb(m.params)}, gradients {fb(m.grads)}, optimizer state {fb(m.optimizer)} "
             f"(model states {fb(m.model_states)}); batch {fb(m.batch)}",
             f"peak {fb(m.peak)} at {m.peak_node or 'the start'}: " +
             ", ".join(f"{k} {fb(v)}" for k, v in m.at_peak.items() if v)]
    if capacity is not None:
        lines[-1] += f" ({m.peak / capacity:.0%} of {fb(capacity)})"
    return lines


# --- the simulation ----------------------------------------------------------------------------

def _programs_of(program: Any) -> tuple[list[Graph], Mesh, Graph | None]:
    """(per-rank graphs, mesh, single-device graph) of a ParallelProgram, PipelineProgram or
    Graph."""
    if isinstance(program, Graph):
        return [program], Mesh.of("dp=1"), program
    graphs_of = getattr(program, "rank_graphs", None)
    mesh = getattr(program, "mesh", None)
    if mesh is None:
        raise SimulationError(f"simulate: expected a ParallelProgram, a PipelineProgram or a Graph, "
                              f"got {type(program).__name__}")
    graphs = graphs_of() if callable(graphs_of) else [program.local] * mesh.size
    return graphs, mesh, getattr(program, "single_device", None)


def _templates_of(program: Any, pp_of: Sequence[int]) -> tuple[list[Graph], Mesh, Graph | None]:
    """(per-rank template graphs, mesh, single-device graph) of a pipeline built with
    unroll=False: the ranks of one pp rank (``pp_of``: each rank's) share its template."""
    locals_ = [t.local for t in program.templates]
    return [locals_[p] for p in pp_of], program.mesh, program.single_device


def _p2p_shell(graph: Graph) -> Any:
    """What the alike-rank check reads of a program: its point-to-point transfers' peers."""
    from types import SimpleNamespace

    comms = [Comm(n, n.attrs["axis"], 0, True, n.attrs.get("peer"), n.op == "send") for n in graph.nodes
             if n.op in P2P_OPS]
    return SimpleNamespace(comms=comms)


def check_fits_cluster(mesh: Mesh, cluster: Cluster, tp_axes: Iterable[str] = ("tp",)) -> None:
    """A mesh the cluster can hold, with every tensor-parallel axis inside one node."""
    if mesh.size > cluster.devices:
        raise SimulationError(
            f"the mesh {mesh} needs {mesh.size} devices but the cluster '{cluster.name}' has {cluster.devices} "
            f"({cluster.nodes} x {cluster.gpus_per_node}); use a smaller mesh, or more nodes "
            f"(cluster.with_nodes({math.ceil(mesh.size / cluster.gpus_per_node)}))")
    names = mesh.names
    for a in tp_axes:
        if a not in names:
            continue
        span = mesh.axis_size(a) * math.prod(mesh.shape[names.index(a) + 1:])
        if mesh.axis_size(a) > 1 and span > cluster.gpus_per_node:
            raise SimulationError(
                f"the tensor-parallel axis {a}={mesh.axis_size(a)} of {mesh} spans {span} consecutive ranks, more "
                f"than the {cluster.gpus_per_node} devices of a node of '{cluster.name}': its collectives would "
                f"cross the network on every layer; make '{a}' the last mesh axis and at most "
                f"{cluster.gpus_per_node} wide")


def _check_simulate_options(tokens: Any, model_flops: Any, progress: Any, **flags: Any) -> None:
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise SimulationError(f"simulate: tokens must be a positive int (tokens per step) or None, got {tokens!r:.40}")
    if model_flops is not None and (isinstance(model_flops, bool) or not isinstance(model_flops, (int, float))
                                    or not math.isfinite(model_flops) or model_flops <= 0):
        raise SimulationError(f"simulate: model_flops must be a positive finite number (FLOPs per step) or None, got "
                              f"{model_flops!r:.40}")
    for name, x in flags.items():
        if not isinstance(x, bool):
            raise SimulationError(f"simulate: {name} must be True or False, got {x!r:.40}")
    if progress is not None and not callable(progress):
        raise SimulationError(f"simulate: progress must be a function taking a line of text (e.g. print) or None, "
                              f"got {progress!r:.40}")


GRAD_SUMS = ("add", "gemm")


def _check_grad_sums(grad_sums: Any, program: Any, sections: bool) -> None:
    """Refuse a ``grad_sums`` simulate cannot honour, naming the value and the fix."""
    if grad_sums not in GRAD_SUMS:
        raise SimulationError(f"simulate: grad_sums must be one of {', '.join(map(repr, GRAD_SUMS))}, got "
                              f"{grad_sums!r:.40}")
    if grad_sums == "gemm" and hasattr(program, "unrolled") and not sections:
        raise SimulationError("simulate: grad_sums='gemm' prices the gradient sums of a pipeline built with "
                              "parallelize(..., unroll=False); this pipeline is unrolled (its sums are plain adds "
                              "among its nodes): parallelize it again with unroll=False, or use grad_sums='add'")


def simulate(program: Any, cluster: Cluster | str, *, tokens: int | None = None,
             model_flops: float | None = None, dedup: bool = True, trace: bool = True,
             memory: bool = True, check_memory: bool = False, grad_sums: str = "add",
             progress: Callable[[str], None] | None = None,
             fusion: str | Collection[str] = "fused", fuse_groups: bool | None = None) -> SimResult:
    """Simulate one step of ``program`` (a ParallelProgram, PipelineProgram or Graph) on
    ``cluster`` (a Cluster or a cluster file name/path); global rank r runs on device r.

    ``tokens``: tokens per step (for tokens/s; default: the elements of the single-device
    program's integer ``input`` named ids/input_ids, if any). ``model_flops``: FLOPs of one
    step of the model without recomputation (default: the single-device program's compute
    FLOPs less the nodes ``partita.autodiff.recompute`` marks as recomputed). ``dedup``: simulate
    alike ranks once. ``trace``: keep the timeline. ``memory``: each simulated rank's memory
    report; ``check_memory``: raise when a rank's peak exceeds the device's memory.
    ``grad_sums``: how a pipeline's per-microbatch gradient sums run: ``"add"`` (default), an
    add per gradient per microbatch, as the program writes them; ``"gemm"``, each gradient a
    matrix product computes added to its sum in that product's epilogue (beta = 1), as
    Megatron-LM's gradient-accumulation fusion runs a linear layer's weight gradient (other
    gradients keep their adds); priced by ``CostModel.sum_in_gemm``. ``"gemm"`` needs a
    pipeline built with ``unroll=False`` (the section-level simulation, which knows the sums).
    ``fusion``: ``"fused"`` (default) prices each op of the program as one kernel; ``"eager"``
    prices the ops uncompiled PyTorch runs as a chain of kernels (RMSNorm, cross-entropy, a
    foreach AdamW) as that chain (partita/cluster/eager.py); a collection of those op names
    prices only them so (a loop that ran, say, a fused RMSNorm kernel).
    ``fuse_groups``: price each group of elementwise ops the code generator's fusion pass would
    form as one memory pass (partita/cluster/fused_groups.py); by default (None) on where
    ``fusion`` is ``"fused"`` (a compiled step) and off where any op is priced as an eager
    chain (an uncompiled loop runs each elementwise op as its own kernel) or the cluster file
    says its runtime runs no fused groups (``fused_groups = false``, as ``partita calibrate``
    writes: its gloo ranks run each op as its own ATen call); True or False forces it.
    """
    _check_simulate_options(tokens, model_flops, dedup=dedup, trace=trace, memory=memory, check_memory=check_memory,
                            progress=progress)
    try:
        eager = eager_ops(fusion)
    except ValueError as e:
        raise SimulationError(f"simulate: {e}") from None
    if fuse_groups is not None and not isinstance(fuse_groups, bool):
        raise SimulationError(f"simulate: fuse_groups must be True, False or None (on for a compiled step, off "
                              f"for an eager one), got {fuse_groups!r:.40}")
    sections = getattr(program, "unrolled", True) is False
    _check_grad_sums(grad_sums, program, sections)
    cluster = load_cluster(cluster)
    if fuse_groups is None:
        fuse_groups = cluster.fused_groups and not eager
    if sections:
        # A rank template's memory is walked in schedule order (template_memory.py; exact against
        # the unrolled program): as long as the simulation itself on a deep pipeline, so only
        # where the caller checks memory.
        memory = check_memory
        pp_of = axis_coords(program.mesh, program.axis)    # program.coords(r)[0], for every rank
        graphs, mesh, single = _templates_of(program, pp_of)
    else:
        graphs, mesh, single = _programs_of(program)
    check_fits_cluster(mesh, cluster)
    shared = _shares_cores(mesh, cluster)
    if shared:
        dedup = False
    model = CostModel(cluster, fusion, fuse_groups)
    say = progress or (lambda s: None)
    n = mesh.size
    cache: dict = {}
    if sections:
        templates = [program.templates[p] for p in pp_of]
        shells = [_p2p_shell(t.local) for t in program.templates]
        reps, rep_of, count = _representatives(mesh, cluster, graphs, [shells[p] for p in pp_of], dedup)
        from .pipeline_sim import SectionProgramBuilder

        builder = SectionProgramBuilder(mesh, cluster, model, cache, sum_in_gemm=grad_sums == "gemm")
        built: dict[int, Program] = {}
        for r in reps:
            alone = frozenset(a for a in mesh.names if all(rep_of[x] == r for x in mesh.group_of(r, a)))
            built[r] = builder.build(templates[r], r, alone)
        prog_of = [built[rep_of[r]] for r in range(n)]
        say(f"built {len(built)} section-level program(s), {sum(len(p.steps) for p in built.values())} steps")
    else:
        # One prepared program per distinct graph object.
        prepared: dict[int, Program] = {}
        for g in graphs:
            if id(g) not in prepared:
                prepared[id(g)] = prepare(g, model, cache)
        say(f"priced {len(prepared)} distinct program(s), {sum(len(p.nodes) for p in prepared.values())} nodes")
        prog_of = [prepared[id(g)] for g in graphs]
        reps, rep_of, count = _representatives(mesh, cluster, graphs, prog_of, dedup)
    walked: dict[int, MemoryReport] = {}

    def template_memory(r: int) -> MemoryReport:
        """The memory report of rank r's pp template, walked once per pp coordinate."""
        from .template_memory import template_memory_report

        p = pp_of[r]
        if p not in walked:
            walked[p] = template_memory_report(program.templates[p], ordered=program.submesh is not None)
        return walked[p]

    if shared:
        sim = _shared_core_sim(mesh, cluster, model, prog_of, reps, rep_of, trace, say)
    else:
        sim = _Sim(mesh, cluster, model, prog_of, reps, rep_of, trace)
        sim.run()
    ranks = []
    comm_bytes: dict[str, float] = defaultdict(float)
    hw = 0.0
    for r in reps:
        p = prog_of[r]
        st = sim.state[r]
        mem = (template_memory(r) if sections else memory_report(p.graph, eager, cluster.device.memory)) if memory else None
        ranks.append(RankResult(r, count[r], st.clock, st.busy, st.waiting, dict(st.comm_busy), p.flops,
                                p.kinds, mem, dict(st.waits)))
        hw += p.flops * count[r]
        for a, b in st.comm_bytes.items():
            comm_bytes[a] += b * count[r]
    step = max(st.clock for st in sim.state.values())
    if check_memory:
        for rr in ranks:
            if rr.memory is not None and rr.memory.peak > cluster.device.memory:
                raise SimulationError(rr.memory.over_message(rr.rank, cluster.device))
    if single is not None and tokens is None:
        tokens = _tokens(single)
    if model_flops is None and single is not None:
        model_flops = _model_flops(single, model)
    peak = model.peak_for(_main_dtype(prog_of[reps[0]]))
    events = sorted(sim.events, key=lambda e: (e.rank, e.start)) if trace else []
    return SimResult(cluster, mesh, step, ranks, events, dict(comm_bytes), tokens, model_flops, hw, peak,
                     dedup and len(reps) < n, program)


def _shares_cores(mesh: Mesh, cluster: Cluster) -> bool:
    c = cluster.cores_per_node
    return c is not None and min(mesh.size, cluster.gpus_per_node) > c


def _slowdowns(spans: Mapping[int, list[tuple[float, float]]], node_of: Callable[[int], int],
               cores: int, comm: Mapping[int, list[tuple[float, float]]] | None = None) -> dict[int, float]:
    """Each rank's mean slowdown over the time it computes, when the ranks of a node that
    compute at once share its ``cores``: k > cores of them run at cores / k of their speed.
    ``comm``: spans in which a rank's collectives or transfers run, whole; they take a core too
    but are not slowed (their figures were measured so). Ranks share cores only on a node of
    CPU ranks joined by loopback (gloo), where no wire carries the bytes: the whole measured
    time of a collective, its latency terms included, is the gloo stack's work and the peers'
    turns on these cores."""
    by_node: dict[int, list[tuple[float, int, int]]] = defaultdict(list)
    for r, ss in spans.items():
        for a, b in ss:
            if b > a:
                by_node[node_of(r)] += [(a, 1, r), (b, -1, r)]
    for r, ss in (comm or {}).items():
        for a, b in _merged(ss):
            if b > a:
                by_node[node_of(r)] += [(a, 1, -1 - r), (b, -1, -1 - r)]
    out: dict[int, float] = {}
    for evs in by_node.values():
        evs.sort(key=lambda e: (e[0], e[1]))
        busy: dict[int, int] = defaultdict(int)
        k, t_prev = 0, evs[0][0] if evs else 0.0
        num: dict[int, float] = defaultdict(float)
        den: dict[int, float] = defaultdict(float)
        for t, d, r in evs:
            if t > t_prev and k > 0:
                f = max(1.0, k / cores)
                for q, n in busy.items():
                    if n > 0:
                        num[q] += f * (t - t_prev)
                        den[q] += t - t_prev
            t_prev = t
            busy[r] += d
            k += d
        for q in den:
            if q >= 0:
                out[q] = num[q] / den[q] if den[q] > 0 else 1.0
    return out


def _merged(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _shared_core_sim(mesh: Mesh, cluster: Cluster, model: CostModel, prog_of: list[Program], reps: list[int],
                     rep_of: list[int], trace: bool, say: Callable[[str], None]) -> "_Sim":
    """The step on ranks that share their node's cores (``Cluster.cores_per_node``): the
    simulation is run again with each rank's compute slowed by its mean slowdown over the
    spans it computed in the run before (processor sharing: k > cores ranks busy at once each
    compute at cores / k of their speed; a rank's running collective or transfer keeps a core
    busy too), damped, until the factors settle (at most 12 runs). Alike ranks are each
    simulated (the count of ranks busy at once needs them)."""
    if len(reps) < mesh.size:
        raise SimulationError("internal: shared cores need every rank simulated")
    cores = cluster.cores_per_node or 1
    scale = {r: 1.0 for r in reps}
    sim = _Sim(mesh, cluster, model, prog_of, reps, rep_of, False, scale)
    sim.run()
    for _ in range(12):
        got = _slowdowns(sim.spans, cluster.node_of, cores, sim.cspans)
        new = {r: 0.5 * (scale[r] + got.get(r, 1.0)) for r in reps}
        moved = max(abs(new[r] - scale[r]) for r in reps)
        scale = new
        sim = _Sim(mesh, cluster, model, prog_of, reps, rep_of, trace, scale)
        sim.run()
        if moved < 1e-3:
            break
    say(f"shared cores ({cores} per node): compute slowed by " +
        ", ".join(f"rank {r} x{scale[r]:.2f}" for r in reps[:8]) + (" ..." if len(reps) > 8 else ""))
    return sim


def _tokens(graph: Graph) -> int | None:
    for v in graph.inputs:
        if v.role == "input" and v.type.dtype.is_int and (v.name or "") in ("ids", "input_ids", "tokens"):
            return math.prod(v.type.shape)
    return None


def _model_flops(graph: Graph, model: CostModel) -> float:
    from ..autodiff.recompute import recomputed_nodes

    skip = recomputed_nodes(graph)
    total = 0.0
    for node in graph.nodes:
        if node in skip or node.op in COLLECTIVE_OPS or node.op in P2P_OPS:
            continue
        total += model.record_cost(node).flops
    return total


def _main_dtype(p: Program) -> str:
    """The dtype of most of a program's matmul FLOPs (f32 without any)."""
    by: dict[str, float] = defaultdict(float)
    for node in p.nodes:
        if node.op in GEMM_OPS or node.op in ATTENTION_OPS:
            by[node.operands[0].type.dtype.name] += 1
    return max(by, key=lambda k: by[k]) if by else "f32"


def axis_coords(mesh: Mesh, axis: str) -> list[int]:
    """Every rank's coordinate along ``axis`` (row-major: the last axis varies fastest)."""
    i = mesh.index(axis)
    size, stride = mesh.shape[i], math.prod(mesh.shape[i + 1:])
    return [(r // stride) % size for r in range(mesh.size)]


def group_node_signatures(mesh: Mesh, node_of: Sequence[int], axis: str) -> list[tuple[int, bool]]:
    """For every rank, over ``axis``: how many members of its group share its node, and
    whether the whole group is on one node (each group walked once; a group is the ranks
    ``base + x * stride`` of the row-major mesh, as ``Mesh.group_of`` lists them)."""
    i = mesh.index(axis)
    size, stride = mesh.shape[i], math.prod(mesh.shape[i + 1:])
    sig: list[tuple[int, bool] | None] = [None] * mesh.size
    for hi in range(0, mesh.size, size * stride):
        for base in range(hi, hi + stride):
            g = range(base, base + size * stride, stride)
            nodes = Counter(node_of[m] for m in g)
            one = len(nodes) == 1
            for m in g:
                sig[m] = (nodes[node_of[m]], one)
    out = [x for x in sig if x is not None]
    assert len(out) == mesh.size, "the groups of an axis cover every rank"
    return out


def _representatives(mesh: Mesh, cluster: Cluster, graphs: list[Graph], progs: Sequence[Any],
                     dedup: bool) -> tuple[list[int], list[int], dict[int, int]]:
    n = mesh.size
    if not dedup:
        return list(range(n)), list(range(n)), {r: 1 for r in range(n)}
    node_of = [cluster.node_of(r) for r in range(n)]
    # How many of its group share its node, and whether the group is one node: a
    # collective's time depends on its group's links, not on where in the group a rank
    # stands (dp ranks one per node are alike wherever they are).
    per_axis = [group_node_signatures(mesh, node_of, a) for a in mesh.names]
    sig_rep: dict[tuple, int] = {}
    rep_of = [0] * n
    for r in range(n):
        key = (id(graphs[r]), *(sig[r] for sig in per_axis))
        rep_of[r] = sig_rep.setdefault(key, r)
    reps = sorted(set(rep_of))
    # Point-to-point peers of representatives must be representatives' alikes consistently:
    # rep r's peer d, and rep(d)'s peer at r's coordinate, must be alike r.
    for r in reps:
        for c in progs[r].comms:
            if c.peer is None:
                continue
            d = mesh.group_of(r, c.axis)[c.peer]
            back = mesh.group_of(rep_of[d], c.axis)[mesh.coord(r, c.axis)]
            if rep_of[back] != r:
                return list(range(n)), list(range(n)), {x: 1 for x in range(n)}
    count: dict[int, int] = defaultdict(int)
    for r in range(n):
        count[rep_of[r]] += 1
    return reps, rep_of, dict(count)


@dataclass
class _State:
    pos: int = 0
    clock: float = 0.0
    busy: float = 0.0
    waiting: float = 0.0
    waits: dict[str, float] = field(default_factory=lambda: defaultdict(float))   # waiting by axis
    issued: dict[int, float] = field(default_factory=dict)     # comm index -> issue time
    done: dict[int, float] = field(default_factory=dict)       # comm index -> completion
    comm_busy: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    comm_bytes: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    finished: bool = False


class _Sim:
    def __init__(self, mesh: Mesh, cluster: Cluster, model: CostModel, progs: list[Program], reps: list[int],
                 rep_of: list[int], trace: bool, scale: Mapping[int, float] | None = None) -> None:
        self.mesh, self.cluster, self.model = mesh, cluster, model
        self.progs, self.reps, self.rep_of, self.trace = progs, reps, rep_of, trace
        # Shared cores (Cluster.cores_per_node): each rank's compute slowed by its factor, and
        # the spans it computes in, from which the next factors come (simulate).
        self.scale = scale
        self.spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self.cspans: dict[int, list[tuple[float, float]]] = defaultdict(list)
        self.state = {r: _State() for r in reps}
        self.events: list[Event] = []
        # (rep, axis, ordinal) -> comm index, per representative, for the collectives.
        self.by_key: dict[tuple, int] = {}
        for r in reps:
            for k, c in enumerate(progs[r].comms):
                if c.peer is None:
                    self.by_key[(r, c.axis, c.ordinal)] = k
                else:
                    self.by_key[(r, c.axis, c.node.op, c.peer, c.ordinal)] = k
        self.groups: dict[tuple[int, str], list[int]] = {}
        self.channel_free: dict[tuple, float] = defaultdict(float)
        self.p2p_done: dict[tuple, float] = {}

    def group(self, r: int, axis: str) -> list[int]:
        key = (r, axis)
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = self.mesh.group_of(r, axis)
        return g

    def run(self) -> None:
        active = list(self.reps)
        while active:
            progress = False
            for r in active:
                progress |= self.advance(r)
            active = [r for r in active if not self.state[r].finished]
            if active and not progress:
                raise SimulationError(self._deadlock(active))

    def _deadlock(self, active: list[int]) -> str:
        parts = []
        for r in active[:6]:
            st = self.state[r]
            s = self.progs[r].steps[st.pos]
            assert isinstance(s, Wait), "a rank stops only where it waits"
            c = self.progs[r].comms[s.comm]
            parts.append(f"rank {r} waits at %{c.node.results[0].name if c.node.results else ''} = {c.node.op} over "
                         f"{c.axis} (its {c.ordinal + 1}. on that axis)")
        return "the per-rank programs cannot finish: " + "; ".join(parts) + \
            (f" (and {len(active) - 6} more)" if len(active) > 6 else "") + \
            "; their collectives or sends and recvs do not line up (check the program with " \
            "partita.parallel.interpreter.check_deadlock_free)"

    def advance(self, r: int) -> bool:
        st = self.state[r]
        prog = self.progs[r]
        steps = prog.steps
        moved = False
        hoist = prog.hoist
        while st.pos < len(steps):
            if hoist:
                h = hoist.get(st.pos)
                if h:
                    for hs in h:
                        if hs.comm not in st.issued:
                            st.issued[hs.comm] = st.clock + hs.offset
            match steps[st.pos]:
                case Run(dur, first, last):
                    if self.scale is not None and dur > 0:
                        dur *= self.scale[r]
                        self.spans[r].append((st.clock, st.clock + dur))
                    if self.trace and dur > 0:
                        self._trace_run(r, prog, first, last, st.clock)
                    st.clock += dur
                    st.busy += dur
                case SectionRun(dur, label):
                    if self.scale is not None and dur > 0:
                        dur *= self.scale[r]
                        self.spans[r].append((st.clock, st.clock + dur))
                    if self.trace and dur > 0:   # one span, named by its section
                        self.events.append(Event(r, "compute", label, st.clock, st.clock + dur, {"section": label}))
                    st.clock += dur
                    st.busy += dur
                case Piece(dur, busy, waiting, cbusy, cbytes, label, waits):
                    if self.scale is not None and busy > 0:
                        extra = busy * (self.scale[r] - 1)
                        self.spans[r].append((st.clock, st.clock + dur + extra))
                        dur += extra
                        busy += extra
                    if self.trace and dur > 0:
                        self.events.append(Event(r, "compute", label, st.clock, st.clock + dur, {"section": label}))
                    st.clock += dur
                    st.busy += busy
                    st.waiting += waiting
                    for a, x in waits:
                        st.waits[a] += x
                    for a, x in cbusy:
                        st.comm_busy[a] += x
                    for a, x in cbytes:
                        st.comm_bytes[a] += x
                case Issue(k):
                    if k not in st.issued:
                        st.issued[k] = st.clock
                case Wait(k):
                    t = st.done.get(k)
                    if t is None:
                        t = self.resolve(r, k)
                        if t is None:
                            return moved
                    if t > st.clock:
                        st.waiting += t - st.clock
                        st.waits[self.progs[r].comms[k].axis] += t - st.clock
                        st.clock = t
            st.pos += 1
            moved = True
        st.finished = True
        return moved

    def _trace_run(self, r: int, prog: Program, a: int, b: int, t0: float) -> None:
        t = t0
        for i in range(a, b):
            d = prog.durations[i]
            if d > 0:
                node = prog.nodes[i]
                name = node.op
                self.events.append(Event(r, "compute", name, t, t + d,
                                         {"result": node.results[0].name if node.results else ""},
                                         event_scope(node)))
                t += d

    def resolve(self, r: int, k: int) -> float | None:
        """The completion time of rep r's comm k, once every participant has issued it (None
        while one has not). A comm's start waits for the one before it on the same group or
        pair; those chains are walked with an explicit stack (thousands of microbatches' sends
        between two stages would overflow Python's recursion limit)."""
        stack = [(r, k)]
        while stack:
            r1, k1 = stack[-1]
            if k1 in self.state[r1].done:
                stack.pop()
                continue
            out = self._resolve_once(r1, k1)
            if out is None:
                return None
            if isinstance(out, tuple):
                if out[1] in self.state[out[0]].done:   # resolved, yet not what k1 waits for
                    raise SimulationError(f"internal: rank {r1}'s comm {k1} waits on rank {out[0]}'s comm "
                                          f"{out[1]}, which completed without releasing it")
                stack.append(out)
                continue
            stack.pop()
        return self.state[r].done[k]

    def _resolve_once(self, r: int, k: int) -> float | tuple[int, int] | None:
        """Comm k of rep r's completion if everything it waits for has completed; else the
        (rep, comm) to resolve first, or None while a participant has not issued it."""
        c = self.progs[r].comms[k]
        st = self.state[r]
        if k not in st.issued:
            return None
        if c.peer is not None:
            return self._resolve_p2p(r, k, c)
        group = self.group(r, c.axis)
        start = 0.0
        members = []
        for m in dict.fromkeys(self.rep_of[x] for x in group):
            km = self.by_key.get((m, c.axis, c.ordinal))
            if km is None:
                raise SimulationError(f"rank {m} issues fewer collectives over '{c.axis}' than rank {r}: its "
                                      f"{c.ordinal + 1}. one ({c.node.op}) has no partner")
            sm = self.state[m]
            if km not in sm.issued:
                return None
            before = self.by_key.get((m, c.axis, c.ordinal - 1)) if c.ordinal > 0 else None
            free = 0.0
            if before is not None:
                got = sm.done.get(before)
                if got is None:
                    return (m, before)
                free = got
            start = max(start, sm.issued[km], free)
            members.append((m, km))
        dur = self.model.collective_time(c.node, group).seconds
        end = start + dur
        for m, km in members:
            sm = self.state[m]
            if km not in sm.done:
                sm.done[km] = end
                if self.scale is not None:
                    # Shared cores: the collective keeps a core busy from start to end.
                    self.cspans[m].append((start, end))
                mc = self.progs[m].comms[km]
                sm.comm_busy[c.axis] += dur
                sm.comm_bytes[c.axis] += self._sent_bytes(mc.node, len(group))
                if self.trace:
                    self.events.append(Event(m, f"comm:{c.axis}", c.node.op, start, end,
                                             {"bytes": self._sent_bytes(mc.node, len(group)),
                                              "group": len(group)}, event_scope(mc.node)))
        return end

    def _sent_bytes(self, node: Node, n: int) -> float:
        c = self.model.record_cost(node)
        return float(c.bytes_written)

    def _resolve_p2p(self, r: int, k: int, c: Comm) -> float | tuple[int, int] | None:
        group = self.group(r, c.axis)
        me = self.mesh.coord(r, c.axis)
        peer_rank = group[c.peer] if c.peer is not None else r
        d = self.rep_of[peer_rank]
        other = "recv" if c.sending else "send"
        kd = self.by_key.get((d, c.axis, other, me, c.ordinal))
        if kd is None:
            raise SimulationError(f"rank {r}'s {c.ordinal + 1}. {c.node.op} over '{c.axis}' (peer {c.peer}) has no "
                                  f"matching {other} on rank {peer_rank}")
        sd = self.state[d]
        if kd not in sd.issued:
            return None
        src, dst = (r, d) if c.sending else (d, r)
        ks, kr = (k, kd) if c.sending else (kd, k)
        key = (src, dst, c.axis, c.ordinal)
        end = self.p2p_done.get(key)
        if end is None:
            # Transfers between one pair go one after another, in order.
            prev = (src, dst, c.axis, c.ordinal - 1)
            free = 0.0
            if c.ordinal > 0:
                if prev not in self.p2p_done:
                    ksp = self.by_key[(src, c.axis, "send", self.mesh.coord(dst, c.axis), c.ordinal - 1)] \
                        if c.sending else None
                    if ksp is None:
                        return (dst, self.by_key[(dst, c.axis, "recv", self.mesh.coord(src, c.axis), c.ordinal - 1)])
                    return (src, ksp)
                free = self.p2p_done[prev]
            start = max(self.state[src].issued[ks], self.state[dst].issued[kr], free)
            node = self.progs[src].comms[ks].node
            ot = self.model.collective_time(node, [r, peer_rank])   # the real pair: its link
            end = start + ot.seconds
            self.p2p_done[key] = end
            if self.scale is not None:
                # Shared cores: the transfer keeps a core of each end busy from start to end.
                self.cspans[src].append((start, end))
                self.cspans[dst].append((start, end))
            self.state[src].comm_busy[c.axis] += ot.seconds
            self.state[src].comm_bytes[c.axis] += ot.bytes
            if self.trace:
                scope = event_scope(c.node)
                self.events.append(Event(src, f"comm:{c.axis}", "send", start, end, {"bytes": ot.bytes, "to": dst},
                                         scope))
                self.events.append(Event(dst, f"comm:{c.axis}", "recv", start, end, {"bytes": ot.bytes, "from": src},
                                         scope))
        self.state[src].done[ks] = end
        self.state[dst].done[kr] = end
        return end
