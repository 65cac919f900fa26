"""Memory over the step, per rank: what one rank's program holds after each node, split into
params, gradients, optimizer state, batch, constants, activations and communication
buffers.

The walk is ``partita.cluster.memory_report``'s (the same order, lifetimes and categories;
its module docstring says what each is), recording the live bytes at every node instead of
only the peak, so the curve's highest point is the report's peak. Alike ranks (the ranks
that run the same program object) are drawn once, with their count.
"""

from __future__ import annotations

from typing import Any

from ..cluster.memory_report import gradient_buffers, live_bytes, where_of
from ..ir.graph import Graph

# The curve's layers, bottom to top (the page stacks them in this order).
CATEGORIES = ("params", "optimizer state", "batch", "constants", "gradients", "activations", "communication")
# At most this many points per rank's curve (each kept point is the highest of its bucket,
# so the peak survives).
MAX_POINTS = 1500


def memory_curve(graph: Graph) -> dict[str, Any]:
    """The live bytes by category after each node of ``graph`` (one rank's program): columns
    ``x`` (node index) and one per category, the peak and the node there."""
    base = {"params": sum(v.type.nbytes for v in graph.inputs if v.role == "param"),
            "optimizer state": sum(v.type.nbytes for v in graph.inputs if v.role == "state"),
            "batch": sum(v.type.nbytes for v in graph.inputs if v.role not in ("param", "state"))}
    xs: list[int] = []
    cols: dict[str, list[int]] = {c: [] for c in ("constants", "gradients", "activations", "communication")}
    for i, _, consts, live in live_bytes(graph, gradient_buffers(graph)):
        xs.append(i)
        cols["constants"].append(consts)
        cols["gradients"].append(live["gradients"])
        cols["activations"].append(live["activations and temporaries"])
        cols["communication"].append(live["communication"])
    return thin_curve(base, xs, cols, list(graph.nodes))


def thin_curve(base: dict[str, int], xs: list[int], cols: dict[str, list[int]], nodes: list) -> dict[str, Any]:
    """At most ``MAX_POINTS`` points, each the highest of its bucket; the peak and where."""
    fixed = sum(base.values())
    totals = [fixed + sum(v[k] for v in cols.values()) for k in range(len(xs))]
    keep = list(range(len(xs)))
    if len(keep) > MAX_POINTS:
        step = len(keep) / MAX_POINTS
        keep = [max(range(int(b * step), max(int(b * step) + 1, int((b + 1) * step))), key=totals.__getitem__)
                for b in range(MAX_POINTS)]
    top = max(range(len(xs)), key=totals.__getitem__) if xs else -1
    peak = totals[top] if xs else fixed
    n = nodes[xs[top]] if xs else None
    where = "" if n is None else where_of(n)
    return {"x": [xs[k] for k in keep], "n": len(nodes), "base": base,
            "cols": {c: [v[k] for k in keep] for c, v in cols.items()}, "peak": peak,
            "peak_x": xs[top] if xs else 0, "peak_node": where,
            "peak_scope": (n.loc.scope if n is not None and n.loc is not None else "")}


def program_memory(prog: Any) -> dict[str, Any]:
    """Each distinct per-rank program's curve (alike ranks once, with their ranks); a note
    instead when the program has no per-rank programs (a pipeline built with unroll=False)."""
    if getattr(prog, "unrolled", True) is False:
        return {"ranks": [], "note": "a pipeline built with unroll=False has no per-rank programs to walk; "
                                     "parallelize without unroll=False for memory over the step"}
    graphs_of = getattr(prog, "rank_graphs", None)
    graphs = graphs_of() if callable(graphs_of) else [prog.local] * prog.mesh.size
    groups: dict[int, list[int]] = {}
    for r, g in enumerate(graphs):
        groups.setdefault(id(g), []).append(r)
    out = []
    for rs in groups.values():
        curve = memory_curve(graphs[rs[0]])
        curve.update({"rank": rs[0], "count": len(rs)})
        out.append(curve)
    return {"ranks": out, "categories": list(CATEGORIES)}


__all__ = ["memory_curve", "program_memory", "CATEGORIES", "MAX_POINTS"]
