"""The JSON a view page embeds: a graph (nodes, edges, module scopes, ``.pir`` lines), a
parallel program's plan (collectives, placements, mesh), a pipeline schedule as bars per
rank, and a simulation's per-rank streams and memory.

Everything is plain lists and dicts, shaped to be small: a graph's nodes are columns (op,
scope and file as indices into tables), so a 10^5-node graph stays a few MB.
"""

from __future__ import annotations

from typing import Any

from ..ir.graph import Graph, Value
from ..ir.printer import format_placed_type, print_graph_lines, value_names

# Above this many nodes a graph's page keeps only its layers (no per-node lines): the page
# says so and shows the layer view.
DETAIL_LIMIT = 150_000
# A simulation's timeline keeps at most this many spans (layer spans; op spans when few).
MAX_SPANS = 200_000


def placement_json(v: Value) -> dict | None:
    """A value's placement as ``{"dims": [[axes], ...], "partial": [axes]}`` (None: unplaced)."""
    p = v.placement
    if p is None:
        return None
    return {"dims": [list(a) for a in p.dims], "partial": list(p.partial)}


class _Table:
    """Strings interned to indices (op names, scopes, files)."""

    def __init__(self) -> None:
        self.items: list[str] = []
        self.index: dict[str, int] = {}

    def __call__(self, s: str) -> int:
        i = self.index.get(s)
        if i is None:
            i = self.index[s] = len(self.items)
            self.items.append(s)
        return i


def graph_json(graph: Graph, *, detail_limit: int = DETAIL_LIMIT, title: str = "") -> dict:
    """The page data of one graph: per node its op, scope, results, operands (edges) and, when
    the graph is within ``detail_limit`` nodes, its ``.pir`` line and types."""
    nodes = list(graph.nodes)
    detail = len(nodes) <= detail_limit
    lines, node_lines = print_graph_lines(graph) if detail else ([], {})
    names = value_names(graph) if detail else {}
    ops, scopes, files = _Table(), _Table(), _Table()
    where: dict[Value, int] = {}
    for i, v in enumerate(graph.inputs):
        where[v] = -1 - i
    cols: dict[str, list] = {"op": [], "scope": [], "in": []}
    if detail:
        # a node's value names and types are read back from its line by the page
        cols.update({"line": [], "file": [], "lineno": [], "rc": [], "flops": [], "bytes": []})
    for i, n in enumerate(nodes):
        for r in n.results:
            where[r] = i
        loc = n.loc
        cols["op"].append(ops(n.op))
        cols["scope"].append(scopes(loc.scope if loc is not None else ""))
        cols["in"].append(sorted({where[o] for o in n.operands if o in where and where[o] >= 0}))
        if detail:
            li = node_lines.get(n)
            cols["line"].append(strip_loc(lines[li]) if li is not None else "")
            cols["file"].append(files(loc.file) if loc is not None else -1)
            cols["lineno"].append(loc.line if loc is not None else 0)
            cols["rc"].append(loc.recompute if loc is not None else "")
            flops, moved = node_cost(n)
            cols["flops"].append(flops)
            cols["bytes"].append(moved)
    shown_in = {str(i): scopes(sc) for i, sc in borrowed_scopes(nodes, where).items()}
    out: dict[str, Any] = {"title": title or f"@{graph.name}", "n": len(nodes), "detail": detail,
                           "detail_limit": detail_limit, "ops": ops.items, "scopes": scopes.items,
                           "files": files.items, **cols, "shown_in": shown_in}
    if detail:
        out["inputs"] = [{"name": names.get(v, v.name or ""), "role": v.role,
                          "type": format_placed_type(v.type, v.placement)} for v in graph.inputs]
        out["placements"] = {str(i): p for i, n in enumerate(nodes) if n.results
                             for p in [placement_json(n.results[0])] if p is not None}
        out["input_placements"] = {str(i): p for i, v in enumerate(graph.inputs)
                                   for p in [placement_json(v)] if p is not None}
    return out


def borrowed_scopes(nodes: list, where: dict[Value, int]) -> dict[int, str]:
    """The module each node without one is drawn in: the scope of the value it moves (its
    first operand's producer, through chains of such nodes), else of its first consumer; so a
    layer's collectives, the slices and reshapes around them and its weights' optimizer
    updates are found in the layer. Nodes whose neighbours have no module either are left out."""
    own = [n.loc.scope if n.loc is not None and n.loc.scope else "" for n in nodes]
    if all(own):
        return {}
    eff = list(own)
    users: dict[int, list[int]] = {}
    for i, n in enumerate(nodes):
        for o in n.operands:
            j = where.get(o, -1)
            if j >= 0:
                users.setdefault(j, []).append(i)
                if not eff[i] and eff[j]:
                    eff[i] = eff[j]
    for i in range(len(nodes) - 1, -1, -1):
        if not eff[i]:
            eff[i] = next((eff[u] for u in users.get(i, ()) if eff[u]), "")
    return {i: eff[i] for i in range(len(nodes)) if not own[i] and eff[i]}


def strip_loc(line: str) -> str:
    """A printed node line without its trailing `` loc(...)`` (the page keeps the file, line
    and scope in their own columns and prints the location back)."""
    line = line.strip()
    cut = line.rfind(" loc(")
    return line[:cut] if cut > 0 and line.endswith(")") else line


def node_cost(n: Any) -> tuple[int, int]:
    """A node's FLOPs and bytes moved (read and written) by its op record's cost; (0, 0) for an
    op without one."""
    from ..ops.registry import OPS

    op = OPS.get(n.op)
    if op is None:
        return 0, 0
    try:
        c = op.cost_of([v.type for v in n.operands], [v.type for v in n.results], n.attrs)
    except Exception:   # an op whose cost rule cannot price these types: no cost shown
        return 0, 0
    return int(c.flops), int(c.bytes_read + c.bytes_written)


def mesh_json(mesh: Any) -> dict:
    """A mesh as ``{"names": [...], "shape": [...]}``."""
    return {"names": list(mesh.names), "shape": list(mesh.shape)}


def plan_json(prog: Any, *, detail_limit: int = DETAIL_LIMIT) -> dict:
    """A ParallelProgram: its placed graph, its per-rank program, the mesh and each collective
    of the plan with why it exists."""
    colls = []
    for c in prog.plan.collectives:
        colls.append({k: (v if isinstance(v, (int, float, str, bool)) or v is None else str(v))
                      for k, v in c.items()})
    from .compare import compare_json

    out = {"mesh": mesh_json(prog.mesh), "strategy": str(prog.plan.strategy),
           "global": graph_json(prog.graph, detail_limit=detail_limit, title="placed graph (single device)"),
           "local": graph_json(prog.local, detail_limit=detail_limit, title="per-rank program"),
           "collectives": colls, "notes": list(prog.plan.notes),
           "comm_bytes": prog.plan.comm_bytes}
    if out["global"]["detail"] and out["local"]["detail"]:
        out["compare"] = compare_json(prog.graph, prog.local)
    return out


def schedule_bars(schedule: Any) -> list[list[dict]]:
    """Each pipeline rank's actions as bars ``{k, mb, c, s, e}`` in unit time (F 1, B 2 or
    B 1 and W 1 when the backward is split), each started when its inputs are ready."""
    dur = {"F": 1.0, "B": 1.0 if schedule.split else 2.0, "W": 1.0}
    done: dict[tuple[str, int, int], float] = {}
    chunks = schedule.stages * schedule.virtual
    bars: list[list[dict]] = [[] for _ in schedule.actions]
    pos = [0] * len(schedule.actions)
    clock = [0.0] * len(schedule.actions)
    progress = True
    while progress:
        progress = False
        for p, acts in enumerate(schedule.actions):
            while pos[p] < len(acts):
                a = acts[pos[p]]
                deps = _action_deps(a.kind, a.chunk, a.mb, chunks, schedule.forward_only)
                if any(d not in done for d in deps):
                    break
                start = max([clock[p], *(done[d] for d in deps)])
                end = start + dur.get(a.kind, 1.0)
                done[(a.kind, a.chunk, a.mb)] = end
                clock[p] = end
                bars[p].append({"k": a.kind, "mb": a.mb, "c": a.chunk, "s": start, "e": end})
                pos[p] += 1
                progress = True
    return bars


def _action_deps(kind: str, chunk: int, mb: int, chunks: int, forward_only: bool) -> list[tuple[str, int, int]]:
    """The actions one pipeline action waits for (its input's producer on the previous chunk)."""
    if kind == "F":
        return [("F", chunk - 1, mb)] if chunk > 0 else []
    if kind == "B":
        return [("F", chunk, mb)] + ([("B", chunk + 1, mb)] if chunk + 1 < chunks else [])
    return [("B", chunk, mb)]


def pipeline_json(prog: Any, *, detail_limit: int = DETAIL_LIMIT) -> dict:
    """A PipelineProgram: its schedule's bars per pp rank and stage 0's parallel program."""
    s = prog.schedule
    out: dict[str, Any] = {"schedule": {"name": s.name, "stages": s.stages, "virtual": s.virtual,
                                        "microbatches": s.microbatches,
                                        "bars": [[[b["k"], b["mb"], b["c"], b["s"], b["e"]] for b in row]
                                                 for row in schedule_bars(s)]},
                           "mesh": mesh_json(prog.mesh)}
    if getattr(prog, "stages", None) and hasattr(prog.stages[0], "plan"):
        # A stage no other axis splits (a pure "pp" strategy) has no parallel plan to draw.
        out["stage0"] = plan_json(prog.stages[0], detail_limit=detail_limit)
        out["stage0"]["note"] = ("pp rank 0's stage; its ranks r0, r1, ... are numbered within the stage's "
                                 "mesh " + str(prog.stages[0].mesh))
    return out


def sim_json(res: Any) -> dict:
    """A simulation: per simulated rank (alike ranks once, with their count) its streams'
    spans, the compute stream's waits and its memory at the peak."""
    from ..cluster.simulator import layer_spans

    events = res.events or []
    if len(events) > MAX_SPANS:
        events = layer_spans(events)
    step = res.step_time
    ranks = []
    for r in res.ranks:
        mem = r.memory
        ranks.append({"rank": r.rank, "count": r.count, "end": r.end, "compute": r.compute, "waiting": r.waiting,
                      "comm": dict(r.comm),
                      "memory": None if mem is None else {"params": mem.params, "grads": mem.grads,
                                                          "optimizer": mem.optimizer, "batch": mem.batch,
                                                          "peak": mem.peak, "at_peak": dict(mem.at_peak),
                                                          "peak_node": mem.peak_node}})
    streams: dict[str, list[list]] = {}
    kept = {r.rank for r in res.ranks}
    for e in events:
        if e.rank in kept:
            streams.setdefault(f"{e.rank}|{e.stream}", []).append([e.start, e.end, e.name, e.scope])
    merged = 0
    if streams:
        budget = max(50, MAX_SPANS // len(streams))
        for key, spans in streams.items():
            if len(spans) > budget:
                merged += len(spans)
                streams[key] = merge_spans(spans, budget, step)
    return {"step": step, "mesh": str(res.mesh), "cluster": res.cluster.name, "ranks": ranks, "streams": streams,
            "truncated": merged > 0, "text": res.text(),
            "capacity": float(res.cluster.device.memory)}


def merge_spans(spans: list[list], budget: int, step: float) -> list[list]:
    """At most about ``budget`` spans: neighbours closer than a gap that doubles until the
    spans fit are merged (named by the first, with the count), so long waits stay visible."""
    gap = max(step, 1e-12) / 20000
    while len(spans) > budget and gap < step:
        out: list[list] = []
        for sp in spans:
            last = out[-1] if out else None
            if last is not None and sp[0] - last[1] <= gap:
                last[1] = max(last[1], sp[1])
                last[4] = last[4] + 1
            else:
                out.append([sp[0], sp[1], sp[2], sp[3], sp[4] if len(sp) > 4 else 1])
        spans = out
        gap *= 2
    for sp in spans:
        if len(sp) > 4 and sp[4] > 1:
            sp[2] = f"{sp[2]} and {sp[4] - 1} more"
        del sp[4:]
    return spans


def normalized_lines(g: dict) -> list[str]:
    """Each node's line with value names blanked (``%a = add(%b, %c)`` -> ``% = add(%, %)``),
    prefixed by its module, so two graphs compare by what their nodes do."""
    import re

    pat = re.compile(r"%[A-Za-z0-9_.]+")
    return [g["scopes"][s] + "|" + pat.sub("%", ln) for s, ln in zip(g["scope"], g["line"])]


def diff_json(before: Graph, after: Graph, *, detail_limit: int = DETAIL_LIMIT) -> dict:
    """Two graphs side by side, each node marked (``changed``) when the other graph has fewer
    nodes of its module doing the same thing (its line with value names blanked)."""
    from collections import Counter

    a = graph_json(before, detail_limit=detail_limit, title=f"before: @{before.name}")
    b = graph_json(after, detail_limit=detail_limit, title=f"after: @{after.name}")
    if not (a["detail"] and b["detail"]):
        raise ValueError("a graph over the detailed view's limit")
    for this, other in ((a, b), (b, a)):
        left = Counter(normalized_lines(other))
        marks = []
        for key in normalized_lines(this):
            if left[key] > 0:
                left[key] -= 1
                marks.append(0)
            else:
                marks.append(1)
        this["changed"] = marks
    return {"before": a, "after": b}


def page_data(obj: Any, *, detail_limit: int = DETAIL_LIMIT, sim: Any = None, run: Any = None) -> dict:
    """The page data of ``obj`` (a Graph, a pair of Graphs (before, after), a ParallelProgram,
    PipelineProgram or SimResult), with ``sim`` (a SimResult of it) and, for a pipeline,
    ``run`` (a launch's result: the measured bubble) added when given; a parallel program's
    memory over the step (a simulation's, when it keeps its program), which also gives the
    timeline's memory at the peak of the ranks the simulation did not report. Raises TypeError for anything else."""
    from .measured import measured_json
    from .memory import fill_sim_memory, program_memory

    from ..cluster.simulator import SimResult
    from ..parallel.pipeline.pipeline_program import PipelineProgram
    from ..parallel.program import ParallelProgram

    simulated: Any = obj
    if isinstance(obj, Graph):
        data: dict[str, Any] = {"kind": "graph", "graph": graph_json(obj, detail_limit=detail_limit)}
    elif isinstance(obj, PipelineProgram):
        data = {"kind": "pipeline", "pipeline": pipeline_json(obj, detail_limit=detail_limit),
                "memory": program_memory(obj)}
        measured = measured_json(obj, run) if run is not None else None
        if measured is not None:
            data["pipeline"]["schedule"]["measured"] = measured
    elif isinstance(obj, ParallelProgram):
        data = {"kind": "parallel", "plan": plan_json(obj, detail_limit=detail_limit), "memory": program_memory(obj)}
    elif isinstance(obj, (tuple, list)) and len(obj) == 2 and all(isinstance(g, Graph) for g in obj):
        data = {"kind": "diff", "diff": diff_json(obj[0], obj[1], detail_limit=detail_limit)}
    elif isinstance(obj, SimResult):
        data = {"kind": "sim"}
        sim = obj
        # The simulated program, when the result keeps it: its memory over the step.
        simulated = getattr(obj, "program", None)
        if simulated is not None and not isinstance(simulated, Graph):
            data["memory"] = program_memory(simulated)
    else:
        raise TypeError(type(obj).__name__)
    if sim is not None:
        data["sim"] = sim_json(sim)
        if data.get("memory"):
            fill_sim_memory(data["sim"], data["memory"], simulated)
    return data


__all__ = ["DETAIL_LIMIT", "graph_json", "plan_json", "pipeline_json", "sim_json", "page_data", "schedule_bars",
           "diff_json"]
