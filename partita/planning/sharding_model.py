"""The per-op sharding choices of a graph over one mesh axis, priced, with identical layers merged.

``build_model(graph, axis, size, cluster)`` turns a graph into what the integer program of
``partita.planning.milp`` solves:

- an **item** per graph input and per op node; its **choices** are the placements it may take
  over the axis: for an op, replicated or one label of its sharding rule (``op.sharding``, the
  rules propagation uses) split over the axis, each with the operand placements it needs and
  the result placements the rule gives (a summed label leaves partial results); for an input,
  replicated or split on one dim that divides;
- items of identical layers (the same scope with another layer number, the same op and types,
  the same place in the layer) form one **class**, which has one set of choices for all of
  them; a class counts how many items it stands for;
- an **edge** per (producer class, result, consumer class, operand) with the seconds of the
  reshard (``plan_reshard``'s collectives, each priced by the cluster's link model) for every
  pair of the two ends' choices, weighted by how many item edges it stands for; a graph
  output that carries an input's state to the next step (``name.1`` of ``name``) is an edge
  back to that input, and any other output wants to be whole;
- per choice the op's compute seconds (``CostModel.compute_time`` with the work divided by
  the axis size where the choice splits a label) and its bytes per device (its results; an
  input's own bytes), the memory an upper bound: every result counted as kept.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Sequence

from ..cluster.cost import CostModel
from ..cluster.hardware import Cluster
from ..ir.graph import Graph, Node, Value
from ..ir.mesh import Mesh
from ..ir.placement import Placement, PlacementError
from ..ir.printer import value_names
from ..ir.types import TensorType
from ..ops.kinds import VIEW_OPS
from ..parallel.reshard import ReshardError, plan_reshard
from ..parallel.sharding import Conflict, result_placements, sharding_spec

COLLECTIVE_STEPS = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
LAYER_NUMBER = re.compile(r"(?<=\.)(\d+)(?=\.|$)")


@dataclass(frozen=True)
class Choice:
    """One placement of an item: the split label (None: replicated; ``dim<d>`` for an input),
    the operand placements it needs, the result placements it gives, its seconds and bytes."""

    label: str | None
    operands: tuple[Placement, ...]
    results: tuple[Placement, ...]
    seconds: float
    bytes: int


@dataclass
class ItemClass:
    """Items that share one set of choices: ``items`` (nodes or input values), their choices."""

    key: tuple
    items: list = field(default_factory=list)
    choices: list[Choice] = field(default_factory=list)
    what: str = ""

    @property
    def count(self) -> int:
        return len(self.items)


@dataclass
class Edge:
    """A producer class's result read by a consumer class's operand (``operand`` None: the
    input a state output flows back to; -1: a graph output that must be whole): ``cost[i][j]``
    the seconds of the reshard from producer choice i to consumer choice j (None: no way),
    ``weight`` the item edges it stands for."""

    producer: int
    consumer: int
    cost: list[list[float | None]]
    weight: int = 0


@dataclass
class ShardingModel:
    """The priced choices of a graph: classes, edges, how many items there were."""

    graph: Graph
    mesh: Mesh
    classes: list[ItemClass]
    edges: list[Edge]
    items: int
    replicated_ops: list[str] = field(default_factory=list)

    @property
    def layers(self) -> int:
        """The most items one class stands for (the number of identical layers)."""
        return max((c.count for c in self.classes), default=1)


def layer_key(scope: str) -> tuple[str, int | None]:
    """``scope`` with its first layer number replaced by ``#`` and that number (None: none)."""
    m = LAYER_NUMBER.search(scope)
    if m is None:
        return scope, None
    return scope[:m.start()] + "#" + scope[m.end():], int(m.group(1))


def node_scope(node: Node, names: dict[Value, str]) -> str:
    """Where a node sits: its location's scope, else the name of a named graph input it reads."""
    if node.loc is not None and node.loc.scope:
        return str(node.loc.scope)
    for v in node.operands:
        if v.producer is None and v.name:
            return str(v.name)
    return ""


def type_key(types: Sequence[TensorType]) -> tuple:
    return tuple((t.shape, str(t.dtype)) for t in types)


def group_items(graph: Graph, names: dict[Value, str]) -> tuple[list[ItemClass], dict[object, int]]:
    """The classes of the graph's inputs and nodes; identical layers' items share a class (the
    n-th item of an op, scope pattern and operand types in one layer is the n-th in every layer)."""
    classes: list[ItemClass] = []
    index: dict[tuple, int] = {}
    of: dict[object, int] = {}
    nth: dict[tuple, int] = {}

    def put(item: object, layer: int | None, key: tuple, what: str) -> None:
        if layer is None:
            key = ("own", len(of))
        else:
            k = nth.get((layer,) + key, 0)
            nth[(layer,) + key] = k + 1
            key = key + (k,)
        if key not in index:
            index[key] = len(classes)
            classes.append(ItemClass(key, [], [], what))
        classes[index[key]].items.append(item)
        of[item] = index[key]

    for v in graph.inputs:
        pattern, layer = layer_key(names.get(v, ""))
        put(v, layer, ("input", pattern, type_key([v.type])), f"%{names.get(v, '?')}")
    for n in graph.nodes:
        pattern, layer = layer_key(node_scope(n, names))
        res = ", ".join(f"%{names.get(r, '?')}" for r in n.results)
        put(n, layer, (n.op, pattern, type_key([v.type for v in n.operands])), f"{res} = {n.op}")
    return classes, of


def input_choices(v: Value, mesh: Mesh, axis: str) -> list[Choice]:
    """An input's placements: replicated, or one dim split over ``axis`` where it divides."""
    t = v.type
    out = [Choice(None, (), (Placement.replicated(t.rank),), 0.0, t.nbytes)]
    n = mesh.axis_size(axis)
    for d, size in enumerate(t.shape):
        if size % n == 0 and size >= n:
            dims = tuple((axis,) if e == d else () for e in range(t.rank))
            out.append(Choice(f"dim{d}", (), (Placement(dims, ()),), 0.0, t.nbytes // n))
    return out


def node_choices(node: Node, mesh: Mesh, axis: str, cm: CostModel) -> list[Choice] | None:
    """An op's placements: replicated, or one label of its rule split over ``axis`` (None: the
    op has no rule and is replicated)."""
    ins = [v.type for v in node.operands]
    outs = [v.type for v in node.results]
    spec = sharding_spec(node.op, ins, node.attrs)
    t = cm.compute_time(node).seconds if node.results else 0.0
    over = cm.eff.op_overhead if t > 0 else 0.0
    kept = 0 if node.op in VIEW_OPS else sum(r.nbytes for r in outs)
    rep = Choice(None, tuple(Placement.replicated(x.rank) for x in ins),
                 tuple(Placement.replicated(x.rank) for x in outs), t, kept)
    if spec is None:
        return None
    out = [rep]
    n = mesh.axis_size(axis)
    for lab in spec.splittable():
        pls = [Placement(tuple((axis,) if l == lab else () for l in labels), ()) for labels in spec.operands]
        try:
            for p, x in zip(pls, ins):
                p.validate(x.shape, mesh, "operand")
        except PlacementError:
            continue
        got = result_placements(spec, pls, ins, mesh, outs)
        if isinstance(got, Conflict):
            continue
        local = 0 if node.op in VIEW_OPS else sum(math.prod(p.local_shape(r.shape, mesh)) * r.dtype.itemsize
                                                  for p, r in zip(got, outs))
        out.append(Choice(lab, tuple(pls), tuple(got), (t - over) / n + over, local))
    return out


class ReshardPricer:
    """Seconds of the cheapest reshard of a value between two placements over the axis's link."""

    def __init__(self, mesh: Mesh, axis: str, cm: CostModel, cluster: Cluster) -> None:
        self.mesh, self.cm = mesh, cm
        self.n = mesh.axis_size(axis)
        self.link = cluster.link(list(range(min(self.n, cluster.devices))))
        self.cache: dict[tuple, float | None] = {}

    def seconds(self, t: TensorType, have: Placement, want: Placement) -> float | None:
        """The reshard's collectives' seconds (a local slice is free; None: impossible)."""
        if have == want:
            return 0.0
        key = (t.shape, str(t.dtype), have, want)
        if key not in self.cache:
            try:
                steps = plan_reshard(t.shape, t.dtype, have, want, self.mesh, "the value")
            except (ReshardError, PlacementError):
                self.cache[key] = None
            else:
                self.cache[key] = sum(
                    self.cm.collective(s.op, max(math.prod(s.before), math.prod(s.after)) * t.dtype.itemsize,
                                       self.n, self.link)
                    for s in steps if s.op in COLLECTIVE_STEPS)
        return self.cache[key]


def edge_cost(pricer: ReshardPricer, t: TensorType, have: list[Placement], want: list[Placement]) \
        -> list[list[float | None]]:
    """The reshard seconds from each producer placement to each consumer placement."""
    return [[pricer.seconds(t, h, w) for w in want] for h in have]


def state_inputs(graph: Graph, names: dict[Value, str]) -> dict[Value, Value]:
    """Outputs that carry an input's state to the next step (``%w.1`` of ``%w``) -> that input."""
    by_name = {names.get(v): v for v in graph.inputs}
    out: dict[Value, Value] = {}
    for o in graph.outputs:
        m = re.fullmatch(r"(.*)\.\d+", names.get(o, ""))
        if m and m.group(1) in by_name and by_name[m.group(1)].type == o.type:
            out[o] = by_name[m.group(1)]
    return out


def build_model(graph: Graph, axis: str, size: int, cluster: Cluster) -> ShardingModel:
    """The priced choices of ``graph`` over a mesh axis ``axis`` of ``size`` devices."""
    mesh = Mesh.of(f"{axis}={size}")
    cm = CostModel(cluster)
    names = value_names(graph)
    classes, of = group_items(graph, names)
    replicated: list[str] = []
    for c in classes:
        first = c.items[0]
        if isinstance(first, Node):
            got = node_choices(first, mesh, axis, cm)
            if got is None:
                replicated.append(c.what)
                t = cm.compute_time(first).seconds if first.results else 0.0
                got = [Choice(None, tuple(Placement.replicated(v.type.rank) for v in first.operands),
                              tuple(Placement.replicated(v.type.rank) for v in first.results), t, 0)]
            c.choices = got
        else:
            c.choices = input_choices(first, mesh, axis)
    edges = build_edges(graph, classes, of, names, ReshardPricer(mesh, axis, cm, cluster))
    return ShardingModel(graph, mesh, classes, edges, len(of), replicated)


def build_edges(graph: Graph, classes: list[ItemClass], of: dict[object, int], names: dict[Value, str],
                pricer: ReshardPricer) -> list[Edge]:
    """The class edges: every operand read, state outputs back to their inputs, outputs whole."""
    edges: dict[tuple, Edge] = {}

    def add(p: int, r: int, c: int, k: int, t: TensorType) -> None:
        key = (p, r, c, k)
        if key not in edges:
            have = [ch.results[r] for ch in classes[p].choices]
            if k >= 0:
                want = [ch.operands[k] for ch in classes[c].choices]
            elif k == -1:
                want = [Placement.replicated(t.rank)]
            else:
                want = [ch.results[0] for ch in classes[c].choices]
            edges[key] = Edge(p, c, edge_cost(pricer, t, have, want))
        edges[key].weight += 1

    def source(v: Value) -> tuple[int, int]:
        if v.producer is None:
            return of[v], 0
        return of[v.producer], list(v.producer.results).index(v)

    for n in graph.nodes:
        for k, v in enumerate(n.operands):
            p, r = source(v)
            add(p, r, of[n], k, v.type)
    states = state_inputs(graph, names)
    for o in graph.outputs:
        p, r = source(o)
        if o in states:
            add(p, r, of[states[o]], -2, o.type)
        else:
            add(p, r, -1, -1, o.type)
    return list(edges.values())
