"""Memory over the step, per rank: what one rank's program holds after each node, split into
params, gradients, optimizer state, batch, constants, activations and communication
buffers.

The walk is ``partita.cluster.memory_report``'s (the same order, lifetimes and categories;
its module docstring says what each is), recording the live bytes at every node instead of
only the peak, so the curve's highest point is the report's peak. Alike ranks (the ranks
that run the same program object) are drawn once, with their count. A pipeline built with
``unroll=False`` has no per-rank programs: each pp rank's curve is walked from its template
(``partita.cluster.template_memory``), one per stage.
"""

from __future__ import annotations

from typing import Any, Callable

from ..cluster.memory_report import gradient_buffers, live_bytes, where_of
from ..cluster.template_memory import TemplateWalk, template_base
from ..ir.graph import Graph

# The curve's layers, bottom to top (the page stacks them in this order).
CATEGORIES = ("params", "optimizer state", "batch", "constants", "gradients", "activations", "communication")
# At most this many points per rank's curve (each kept point is the highest of its bucket,
# so the peak survives).
MAX_POINTS = 1500
# All ranks' curves share at most about this many points (64 pp ranks: 500 each), each at
# least MIN_POINTS.
TOTAL_POINTS = 32000
MIN_POINTS = 200


def memory_curve(graph: Graph, max_points: int | None = None) -> dict[str, Any]:
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
    nodes = list(graph.nodes)

    def where(x: int) -> tuple[str, str]:
        n = nodes[x]
        return where_of(n), (n.loc.scope if n.loc is not None else "")
    return thin_curve(base, xs, cols, len(nodes), where, max_points)


def template_curve(t: Any, ordered: bool, max_points: int | None = None) -> dict[str, Any]:
    """``memory_curve`` of the program of a pipeline rank built with ``unroll=False``, from its
    template (``partita.cluster.template_memory``): each section copy's highest and lowest
    points, the peak exact."""
    walk = TemplateWalk(t, ordered)
    c = walk.walk()
    cols = {"constants": c.consts, "gradients": c.grads, "activations": c.act, "communication": c.comm}
    index = {x: k for k, x in enumerate(c.x)}
    return thin_curve(template_base(t), c.x, cols, c.n, lambda x: c.where(index[x]), max_points)


def thin_curve(base: dict[str, int], xs: list[int], cols: dict[str, list[int]], n: int,
               where: Callable[[int], tuple[str, str]], max_points: int | None = None) -> dict[str, Any]:
    """At most ``max_points`` (default ``MAX_POINTS``) points, each the highest of its bucket;
    the peak and where (``where(x)``: the node at index ``x`` as a report names it, its scope)."""
    limit = MAX_POINTS if max_points is None else max_points
    fixed = sum(base.values())
    totals = [fixed + sum(v[k] for v in cols.values()) for k in range(len(xs))]
    keep = list(range(len(xs)))
    if len(keep) > limit:
        step = len(keep) / limit
        keep = [max(range(int(b * step), max(int(b * step) + 1, int((b + 1) * step))), key=totals.__getitem__)
                for b in range(limit)]
    top = max(range(len(xs)), key=totals.__getitem__) if xs else -1
    peak = totals[top] if xs else fixed
    node, scope = where(xs[top]) if xs else ("", "")
    return {"x": [xs[k] for k in keep], "n": n, "base": base,
            "cols": {c: [v[k] for k in keep] for c, v in cols.items()}, "peak": peak,
            "peak_x": xs[top] if xs else 0, "peak_node": node, "peak_scope": scope}


def program_memory(prog: Any) -> dict[str, Any]:
    """Each distinct per-rank program's curve (alike ranks once, with their ranks); a pipeline
    built with ``unroll=False``: each pp rank's, walked from its template (the ranks of a
    stage run one program)."""
    if getattr(prog, "unrolled", True) is False:
        return {"ranks": template_memory(prog), "categories": list(CATEGORIES),
                "note": "walked from each pp rank's one-microbatch template (unroll=False), as its unrolled "
                        "program would run"}
    graphs_of = getattr(prog, "rank_graphs", None)
    graphs = graphs_of() if callable(graphs_of) else [prog.local] * prog.mesh.size
    groups: dict[int, list[int]] = {}
    for r, g in enumerate(graphs):
        groups.setdefault(id(g), []).append(r)
    out = []
    limit = points_per_rank(len(groups))
    for rs in groups.values():
        curve = memory_curve(graphs[rs[0]], limit)
        curve.update({"rank": rs[0], "count": len(rs)})
        out.append(curve)
    return {"ranks": out, "categories": list(CATEGORIES)}


def points_per_rank(ranks: int) -> int:
    """Each curve's points: ``MAX_POINTS``, fewer when many ranks share ``TOTAL_POINTS``."""
    return max(MIN_POINTS, min(MAX_POINTS, TOTAL_POINTS // max(1, ranks)))


def template_memory(prog: Any) -> list[dict[str, Any]]:
    """The curve of each pp rank of a pipeline built with ``unroll=False`` (its ranks: those
    of its stage), the collectives ordered as ``parallelize`` orders them when the stages
    have another mesh axis."""
    by_stage: dict[int, list[int]] = {}
    for r in range(prog.mesh.size):
        by_stage.setdefault(prog.coords(r)[0], []).append(r)
    ordered = prog.submesh is not None
    limit = points_per_rank(len(prog.templates))
    out = []
    for p, t in enumerate(prog.templates):
        rs = by_stage.get(p, [])
        curve = template_curve(t, ordered, limit)
        curve.update({"rank": rs[0] if rs else p, "count": len(rs)})
        out.append(curve)
    return out


def fill_sim_memory(sim: dict[str, Any], memory: dict[str, Any], prog: Any) -> None:
    """Give each simulated rank without a memory report (a pipeline simulated section by
    section) the one its program's curve gives: the rank's stage's curve, by pp rank."""
    curves = memory.get("ranks") or []
    if not curves or prog is None or getattr(prog, "unrolled", True) is not False:
        return
    by_stage = {prog.coords(c["rank"])[0]: c for c in curves}
    for r in sim["ranks"]:
        c = by_stage.get(prog.coords(r["rank"])[0])
        if r["memory"] is not None or c is None:
            continue
        k = c["x"].index(c["peak_x"]) if c["peak_x"] in c["x"] else -1
        live = {name: (c["cols"][col][k] if k >= 0 else 0)
                for name, col in (("activations and temporaries", "activations"), ("communication", "communication"),
                                  ("gradients", "gradients"))}
        base = c["base"]
        r["memory"] = {"params": base["params"], "grads": None, "optimizer": base["optimizer state"],
                       "batch": base["batch"], "peak": c["peak"], "peak_node": c["peak_node"],
                       "at_peak": {**base, "constants": c["cols"]["constants"][k] if k >= 0 else 0, **live},
                       "from": "the memory curve (walked from the stage's template)"}


__all__ = ["fill_sim_memory", "memory_curve", "template_curve", "program_memory", "template_memory", "CATEGORIES", "MAX_POINTS"]
