"""Per-op sharding over one mesh axis as an integer program (docs/plan.md, "The per-op
sharding integer program").

``shard_layer(graph, tp, cluster, memory=...)`` prices every op's choices over an axis of
``tp`` devices (``partita.planning.sharding_model``: the sharding rules' placements, reshards
priced by the cluster's link model, identical layers sharing one set of variables) and
solves with ``scipy.optimize.milp`` (HiGHS):

- a binary ``x[c, i]`` per class c and choice i, one choice per class (``sum_i x[c, i] = 1``);
- per edge a continuous ``y[e, i, j]`` in [0, 1] with ``sum_j y = x[p, i]`` and
  ``sum_i y = x[q, j]`` (the product of the two ends' binaries, exact when they are binary
  and tighter in the relaxation than ``y >= x + x' - 1``);
- objective: each class's count times its choice's seconds plus each edge's weight times
  its reshard seconds;
- memory per device: each class's count times its choice's bytes, at most the cap.

The LP relaxation is solved first (its optimum is a lower bound; when it is already integral
the integer program is not run), then the integer program with a time limit. The result,
a ``ShardingChoice``, gives a placement per value (``.annotations`` for
``partita.parallelize(step, mesh=..., annotations=...)``) and ``.report()``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cluster.hardware import Cluster, load_cluster, parse_quantity
from ..ir.graph import Graph, Node, Value
from ..ir.printer import value_names
from .shape import PlanError
from .sharding_model import ShardingModel, build_model


@dataclass
class ShardingChoice:
    """The solved placements over the axis: per value name, with the solve's figures."""

    axis: str
    size: int
    annotations: dict[str, str]
    objective: float                 # seconds of the chosen placements (compute + reshards)
    lp_bound: float                  # the LP relaxation's optimum (a lower bound)
    memory: float                    # bytes per device of the choice (the model's upper bound)
    solve_seconds: float             # HiGHS: the LP relaxation and the integer program
    build_seconds: float             # pricing the choices and edges
    variables: int                   # after sharing identical layers (x and y)
    variables_unshared: int          # one set per item instead
    items: int
    classes: int
    integral_lp: bool
    replicated_ops: list[str] = field(default_factory=list)
    choices: dict[str, str | None] = field(default_factory=dict)   # class -> split label

    @property
    def mesh(self) -> str:
        """The mesh to parallelize with."""
        return f"{self.axis}={self.size}"

    def report(self) -> str:
        """The solve in a few lines."""
        lines = [f"per-op sharding over {self.mesh}: {self.objective * 1e3:.3f} ms priced "
                 f"(LP bound {self.lp_bound * 1e3:.3f} ms{', integral' if self.integral_lp else ''}), "
                 f"{self.memory / 2**30:.2f} GiB per device",
                 f"  {self.items} items in {self.classes} classes; {self.variables} variables "
                 f"({self.variables_unshared} without sharing identical layers); priced in "
                 f"{self.build_seconds * 1e3:.1f} ms, solved in {self.solve_seconds * 1e3:.1f} ms"]
        split = sum(1 for lab in self.choices.values() if lab is not None)
        lines.append(f"  {split} of {len(self.choices)} classes split over {self.axis}")
        if self.replicated_ops:
            lines.append(f"  replicated for lack of a sharding rule: {', '.join(self.replicated_ops[:8])}")
        return "\n".join(lines)


def variable_count(model: ShardingModel, shared: bool = True) -> int:
    """x and y variables of the program, with one set per class (or per item)."""
    x = sum(len(c.choices) * (1 if shared else c.count) for c in model.classes)
    y = 0
    for e in model.edges:
        if e.consumer >= 0 and e.consumer != e.producer:
            y += len(e.cost) * len(e.cost[0]) * (1 if shared else e.weight)
    return x + y


def assemble(model: ShardingModel) -> tuple[np.ndarray, Any, np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """The program's arrays: objective, constraint matrix and bounds, upper bounds of the
    variables, the memory row, and the offset of each class's x."""
    from scipy.sparse import coo_matrix  # type: ignore[import-untyped]

    offs: list[int] = []
    c: list[float] = []
    ub: list[float] = []
    for k in model.classes:
        offs.append(len(c))
        c += [k.count * ch.seconds for ch in k.choices]
        ub += [1.0] * len(k.choices)
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []

    def row(entries: list[tuple[int, float]], low: float, high: float) -> None:
        r = len(lo)
        for j, v in entries:
            rows.append(r)
            cols.append(j)
            vals.append(v)
        lo.append(low)
        hi.append(high)

    for k, o in zip(model.classes, offs):
        row([(o + i, 1.0) for i in range(len(k.choices))], 1.0, 1.0)
    for e in model.edges:
        p = offs[e.producer]
        if e.consumer < 0 or e.consumer == e.producer:       # a fixed end, or the same class
            for i, line in enumerate(e.cost):
                cost = line[0] if e.consumer < 0 else line[i]
                if cost is None:
                    ub[p + i] = 0.0
                else:
                    c[p + i] += e.weight * cost
            continue
        q = offs[e.consumer]
        base = len(c)
        ni, nj = len(e.cost), len(e.cost[0])
        for i in range(ni):
            for j in range(nj):
                cost = e.cost[i][j]
                c.append(0.0 if cost is None else e.weight * cost)
                ub.append(0.0 if cost is None else 1.0)
        for i in range(ni):
            row([(base + i * nj + j, 1.0) for j in range(nj)] + [(p + i, -1.0)], 0.0, 0.0)
        for j in range(nj):
            row([(base + i * nj + j, 1.0) for i in range(ni)] + [(q + j, -1.0)], 0.0, 0.0)
    n = len(c)
    mem = np.zeros(n)
    for k, o in zip(model.classes, offs):
        for i, ch in enumerate(k.choices):
            mem[o + i] = k.count * ch.bytes
    A = coo_matrix((vals, (rows, cols)), shape=(len(lo), n)).tocsr()
    return np.array(c), A, np.array([lo, hi]), np.array(ub), mem, offs


def solve(model: ShardingModel, memory: float | None, time_limit: float) \
        -> tuple[np.ndarray, float, float, bool]:
    """The chosen x (and y), the objective, the LP bound and whether the LP was integral."""
    from scipy.optimize import Bounds, LinearConstraint, milp  # type: ignore[import-untyped]

    c, A, lohi, ub, mem, offs = assemble(model)
    cons = [LinearConstraint(A, lohi[0], lohi[1])]
    if memory is not None:
        cons.append(LinearConstraint(mem[None, :], -np.inf, memory))
    nx = offs[-1] + len(model.classes[-1].choices) if model.classes else 0
    bounds = Bounds(np.zeros(len(c)), ub)
    lp = milp(c, constraints=cons, bounds=bounds, integrality=np.zeros(len(c)),
              options={"time_limit": time_limit})
    if lp.x is None:
        cap = f"{memory / 2**30:.3f} GiB" if memory is not None else "no cap"
        raise PlanError(f"shard_layer: no sharding of @{model.graph.name} over {model.mesh} fits the memory cap "
                        f"({cap}); raise memory= or use a larger axis ({lp.message})")
    lp_x = np.asarray(lp.x)
    if np.all(np.minimum(np.abs(lp_x[:nx]), np.abs(lp_x[:nx] - 1.0)) < 1e-6):
        return np.round(lp_x), float(lp.fun), float(lp.fun), True
    integrality = np.zeros(len(c))
    integrality[:nx] = 1
    res = milp(c, constraints=cons, bounds=bounds, integrality=integrality, options={"time_limit": time_limit})
    if res.x is None:
        raise PlanError(f"shard_layer: the integer program over {model.mesh} found no solution in {time_limit} s "
                        f"({res.message}); raise time_limit=")
    return np.asarray(res.x), float(res.fun), float(lp.fun), False


def shard_layer(graph: Graph, tp: int, cluster: Cluster | str, memory: Any = None, *, axis: str = "tp",
                time_limit: float = 30.0) -> ShardingChoice:
    """The cheapest placement of every op of ``graph`` over a mesh axis of ``tp`` devices on
    ``cluster`` (a ``Cluster`` or a cluster file name) within ``memory`` per device (bytes or
    text such as ``"80GiB"``; None: no cap). Identical layers share one set of variables."""
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise PlanError(f"shard_layer: tp must be a whole number of devices >= 1, got {tp!r:.40}")
    if not isinstance(graph, Graph):
        raise PlanError(f"shard_layer: graph must be a partita Graph (a forward graph or a training step), "
                        f"got {type(graph).__name__}")
    cl = load_cluster(cluster)
    cap = None if memory is None else (
        float(memory) if isinstance(memory, (int, float)) else parse_quantity(memory, "bytes"))
    t0 = time.perf_counter()
    model = build_model(graph, axis, tp, cl)
    t1 = time.perf_counter()
    x, obj, bound, integral = solve(model, cap, time_limit)
    seconds = time.perf_counter() - t1
    names = value_names(graph)
    annotations: dict[str, str] = {}
    chosen: dict[str, str | None] = {}
    used = 0.0
    o = 0
    for k in model.classes:
        i = int(np.argmax(x[o:o + len(k.choices)]))
        ch = k.choices[i]
        o += len(k.choices)
        chosen[k.what] = ch.label
        used += k.count * ch.bytes
        for item in k.items:
            vals: list[Value] = list(item.results) if isinstance(item, Node) else [item]
            for v, p in zip(vals, ch.results):
                if v in names:
                    annotations[names[v]] = str(p)
    return ShardingChoice(axis, tp, annotations, obj, bound, used, seconds, t1 - t0, variable_count(model),
                          variable_count(model, shared=False), model.items, len(model.classes), integral,
                          model.replicated_ops, chosen)



def batch_values(graph: Graph) -> set[Value]:
    """The values that depend on the batch (the ``input``-role graph inputs and all they feed)."""
    out: set[Value] = {v for v in graph.inputs if v.role == "input"}
    for n in graph.nodes:
        if any(v in out for v in n.operands):
            out.update(n.results)
    return out


def pattern_annotations(choice: ShardingChoice, graph: Graph, *, batch: bool = True,
                        input_roles: tuple[str, ...] = ("param", "state")) -> dict[str, str]:
    """``choice.annotations`` keyed by name pattern (a layer number written ``#``, as
    ``Plan.annotations`` keeps them), so that they name the values of the same model at any
    depth. Left out: values that depend on the batch unless ``batch`` (a dp axis places those),
    graph inputs whose role is not in ``input_roles``, unnamed values (``%123``: numbered per
    graph), and patterns whose values the choice places differently."""
    from .sharding_model import layer_key

    names = value_names(graph)
    skip = set() if batch else batch_values(graph)
    skip |= {v for v in graph.inputs if v.role not in input_roles}
    out: dict[str, str] = {}
    clash: set[str] = set()
    for v, name in names.items():
        if v in skip or name not in choice.annotations or not any(ch.isalpha() for ch in name):
            continue
        key = layer_key(name)[0]
        want = choice.annotations[name]
        if out.setdefault(key, want) != want:
            clash.add(key)
    return {k: p for k, p in out.items() if k not in clash}
