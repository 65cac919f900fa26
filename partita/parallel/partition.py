"""The partition pass: from a placed global graph to the per-rank (SPMD) program.

The input is a global graph with a mesh and a placement on every value (what ``propagate``
leaves). The output is a new graph that every rank runs: inputs with the local shapes of
their placements (same names and roles), each node re-emitted on local operands with
localized attributes, and collectives (``apply_reshard``) wherever an operand is not placed
the way its consumer's sharding rule accepts. The decisions where to reshard are
propagation's own (its ``ReshardNeed``s, recomputed on a copy of the graph), so partition and
propagate never disagree; an operand pair that the rule still rejects is resolved by
replicating the conflicting operand. Graph outputs keep their placement (each rank returns
its piece), except pending sums, which are all-reduced so every output is a proper shard.

The per-rank graph keeps ``graph.mesh`` but no placements: the text form reads a type with
placements as a global type (``f32[8@dp]`` is a tensor of 8 split in two), so a local shape
carrying its global placement would read back as a different tensor, and the verifier
rejects a local dim that no longer divides. The report keeps each value's placement instead.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..ir.attrs import DenseAttr
from ..ir.builder import Builder
from ..ir.diagnostics import PartitaError
from ..ir.graph import Graph, Node, Value
from ..ir.printer import value_names
from ..ir.types import Location, TensorType
from ..passes.manager import Pass, register_pass
from ..ir.mesh import Mesh
from ..ir.placement import Placement
from .propagate import ReshardNeed, propagate
from .reshard import Step, apply_reshard, plan_reshard
from .local_forms import LocalForm, embedding_grad_rows
from .sharding import Conflict, DimSpec, average_factor, result_placements, sharding_spec


class PartitionError(PartitaError):
    """The graph cannot be partitioned: no mesh, an unplaced value, a partial weight."""


@dataclass(frozen=True)
class InsertedCollective:
    """One collective the partition inserted, and why: ``value`` (printed name in the global
    graph) placed ``have`` must reach ``consumer`` (operand ``operand``; None for a node's
    own result or a graph output) as ``want``; ``bytes`` is what each rank sends. ``inside``:
    the collective is part of the consumer's distributed local form (``local_forms``), as
    the all-reduced log-sum-exp of a vocab-parallel cross_entropy; ``value`` is its result."""

    op: str
    axis: str
    value: str
    consumer: str
    operand: int | None
    have: Placement
    want: Placement
    bytes: int
    inside: bool = False
    source: str | None = None  # the consumer's source location (file:line), when it has one

    def __str__(self) -> str:
        at = f" at {self.source}" if self.source else ""
        if self.inside:
            return (f"{self.op} over {self.axis}: inside {self.consumer}{at} (its distributed form), {self.bytes} bytes "
                    "sent per rank")
        where = f"operand {self.operand} of {self.consumer}" if self.operand is not None else self.consumer
        return (f"{self.op} over {self.axis}: %{self.value} -> {where}{at} ({self.have} -> {self.want}), {self.bytes} "
                "bytes sent per rank")


@dataclass
class PartitionReport:
    """What the partition inserted, and each global value's placement (as text), which the
    per-rank graph itself does not carry."""

    mesh: Mesh
    collectives: list[InsertedCollective] = field(default_factory=list)
    placements: dict[str, str] = field(default_factory=dict)

    @property
    def bytes(self) -> int:
        """Bytes each rank sends over all inserted collectives."""
        return sum(c.bytes for c in self.collectives)

    def count(self, op: str, axis: str | None = None) -> int:
        """How many ``op`` collectives (over ``axis``, if given) were inserted."""
        return sum(1 for c in self.collectives if c.op == op and (axis is None or c.axis == axis))

    def text(self) -> str:
        """A human-readable summary."""
        lines = [f"partition on {self.mesh}: {len(self.collectives)} collective(s), {self.bytes} bytes sent per rank"]
        lines += [f"  {c}" for c in self.collectives]
        return "\n".join(lines)


def partition(graph: Graph) -> Graph:
    """The per-rank program of ``graph`` (a new graph; ``graph`` is not changed).

    Raises PartitionError without a mesh or when a value has no placement. The report of
    the inserted collectives is ``partition_with_report``'s second result.
    """
    return partition_with_report(graph)[0]


def partition_with_report(graph: Graph, reshards: "list[ReshardNeed] | None" = None, *,
                          real_sizes: "Mapping[Value, Mapping[int, int]] | None" = None) -> tuple[Graph, PartitionReport]:
    """``partition`` plus the report of every inserted collective (producer, consumer, bytes).

    ``reshards``: the needs of the ``propagate`` run that placed ``graph`` as it is now (its
    report's ``reshards``), which saves recomputing them; by default they are recomputed.
    ``real_sizes``: for values padded by ``partita.parallel.pad``, the real size of each
    padded dim; the local forms check ids and targets against it."""
    return Partitioner(graph, reshards, real_sizes).run()


def partition_tracked(graph: Graph, reshards: "list[ReshardNeed] | None" = None, *,
                      real_sizes: "Mapping[Value, Mapping[int, int]] | None" = None
                      ) -> tuple[Graph, PartitionReport, dict[Node, list[Node]], dict[Value, Value]]:
    """``partition_with_report`` that also returns, per global node, the local nodes made for
    it, and the map from each global value to its local value."""
    p = Partitioner(graph, reshards, real_sizes)
    p.spans = {}
    local, report = p.run()
    return local, report, p.spans, dict(p.vmap)


def local_piece(array: Any, placement: Placement | None, mesh: Mesh, rank: int, what: str = "the tensor") -> np.ndarray:
    """The piece of the global ``array`` that ``rank`` holds under ``placement`` (None:
    replicated). A split dim is cut by its axes major to minor. Pending sums have no single
    piece per rank: PartitionError."""
    arr = np.asarray(array)
    p = Placement.replicated(arr.ndim) if placement is None else placement
    if p.partial:
        raise PartitionError(f"{what} is placed as {p}, a pending sum over {', '.join(p.partial)}: a global array "
                             "has no unique summands to hand out; place it replicated or split instead")
    p.validate(arr.shape, mesh, what)
    return arr[piece_index(arr.shape, p, mesh, rank)]


def piece_index(shape: Sequence[int], placement: Placement, mesh: Mesh, rank: int) -> tuple[slice, ...]:
    """The index of ``rank``'s piece in a global array of ``shape``: each split dim cut by
    its axes, major to minor (the placement must divide the shape)."""
    index: list[slice] = []
    for n, axes in zip(shape, placement.dims):
        k = 0
        for a in axes:
            k = k * mesh.axis_size(a) + mesh.coord(rank, a)
        size = n // math.prod(mesh.axis_size(a) for a in axes)
        index.append(slice(k * size, (k + 1) * size))
    return tuple(index)


def shard_weights(global_graph: Graph, weights: Mapping[str, Any], mesh: Mesh | str | None = None) -> list[dict[str, np.ndarray]]:
    """Each rank's local pieces of the param/state arrays in ``weights``, cut per their
    placements in ``global_graph`` (rank order row-major over the mesh). Arrays of names
    that are not param/state inputs are left out; a partial placement is a PartitionError."""
    m = Mesh.of(mesh) if mesh is not None else global_graph.mesh
    if m is None:
        raise PartitionError(f"@{global_graph.name}: shard_weights needs a mesh; the graph has none, so pass mesh=...")
    held = [(v.name, v.placement) for v in global_graph.inputs
            if v.role in ("param", "state") and v.name is not None and v.name in weights]
    return [{name: local_piece(weights[name], p, m, r, f"weight %{name}") for name, p in held}
            for r in range(m.size)]


class Partitioner:
    """Rewrites a placed global graph into its local (per-rank) graph and report; ``run`` does it."""
    def __init__(self, graph: Graph, reshards: "list[ReshardNeed] | None" = None,
                 real_sizes: "Mapping[Value, Mapping[int, int]] | None" = None) -> None:
        self.given = reshards
        self.real_sizes = real_sizes or {}
        if graph.mesh is None:
            raise PartitionError(f"@{graph.name}: partition needs a device mesh and placements; the graph has no "
                                 "mesh. Set graph.mesh and run propagate first")
        self.g = graph
        self.mesh = graph.mesh
        self.names = value_names(graph)
        for v in graph.values():
            if v.placement is None:
                what = "input" if v.producer is None else f"result of {v.producer.op}"
                raise PartitionError(f"@{graph.name}: %{self.name(v)} ({what}) has no placement; run propagate "
                                     "first (partita.parallel.propagate.propagate(graph)) so every value is placed")
        self.report = PartitionReport(self.mesh, placements={self.name(v): str(v.placement) for v in graph.values()})
        self.new = Graph(graph.name)
        self.new.mesh = self.mesh
        self.new.loc = graph.loc
        self.b = Builder(self.new)
        self.vmap: dict[Value, Value] = {}
        # Resharded versions already emitted: (global value, placement) -> per-rank value.
        self.moved: dict[tuple[Value, Placement], Value] = {}
        # The report entry of each one-step reshard's result, for rewrites after the fact.
        self.entry: dict[Value, InsertedCollective] = {}
        self.memo: dict = {}  # shared by the local forms (local_forms.LocalForm.memo)
        # Propagation's placement of a node's result where it differs from the result's own
        # (the node produces it so and a reshard follows), by node and result name.
        self.produced: dict[Node, dict[str, Placement]] = {}
        # With ``track``: per global node, the local nodes its emission made (its operands'
        # reshards, its local form, its result's reshard), for passes that copy pieces of the
        # per-rank program (a pipeline unrolls a one-microbatch template).
        self.spans: dict[Node, list[Node]] | None = None

    def name(self, v: Value) -> str:
        return self.names.get(v, "?")

    @staticmethod
    def pl(v: Value) -> Placement:
        # Checked in __init__: every value of the global graph is placed.
        assert v.placement is not None
        return v.placement

    def describe(self, node: Node) -> str:
        res = ", ".join(f"%{self.name(r)}" for r in node.results)
        return f"{res + ' = ' if res else ''}{node.op}"

    def needs(self) -> dict[Node, dict[int, Placement]]:
        """Propagation's operand reshards, by node of ``self.g``: recomputed on a copy, where
        every value is already placed, so only its node-by-node resolution runs."""
        if self.given is not None:
            own = set(self.g.nodes)
            given: dict[Node, dict[int, Placement]] = {}
            for g in self.given:
                if g.operand is not None and g.node in own:
                    given.setdefault(g.node, {})[g.operand] = g.want
                elif g.node in own:
                    self.produced.setdefault(g.node, {})[g.value] = g.have
            return given
        copy = self.g.clone()
        report = propagate(copy)
        by_copy = dict(zip(copy.nodes, self.g.nodes))
        out: dict[Node, dict[int, Placement]] = {}
        for n in report.reshards:
            need: ReshardNeed = n
            if need.operand is not None and need.node in by_copy:
                out.setdefault(by_copy[need.node], {})[need.operand] = need.want
            elif need.node in by_copy:
                self.produced.setdefault(by_copy[need.node], {})[need.value] = need.have
        return out

    def reshard(self, v: Value, local: Value, have: Placement, want: Placement, consumer: str,
                operand: int | None, loc: Location | None = None) -> Value:
        if have == want:
            return local
        key = (v, want)
        if key in self.moved:
            return self.moved[key]
        steps: list[Step] = plan_reshard(v.type.shape, v.type.dtype, have, want, self.mesh, f"%{self.name(v)}")
        out = apply_reshard(self.b, local, steps)
        for s in steps:
            self.report.collectives.append(InsertedCollective(s.op, s.axis, self.name(v), consumer, operand,
                                                              have, want, s.bytes_sent, source=_source(loc)))
        if len(steps) == 1:
            self.entry[out] = self.report.collectives[-1]
        self.moved[key] = out
        return out

    def run(self) -> tuple[Graph, PartitionReport]:
        needs = self.needs()
        mesh = self.mesh
        for v in self.g.inputs:
            t = TensorType(self.pl(v).local_shape(v.type.shape, mesh), v.type.dtype)
            w = self.new.add_input(v.name or f"in{v.index}", t, v.role or "input")
            self.vmap[v] = w
            self.moved[(v, self.pl(v))] = w
        for node in self.g.nodes:
            before = self.new.last
            self.emit(node, needs.get(node, {}))
            if self.spans is not None:
                n = before.next if before is not None else self.new.first
                made = []
                while n is not None:
                    made.append(n)
                    n = n.next
                self.spans[node] = made
        outs: list[Value] = []
        for i, v in enumerate(self.g.outputs):
            p = self.pl(v)
            want = Placement(p.dims, ()) if p.partial else p
            outs.append(self.reshard(v, self.vmap[v], p, want, f"output {i}", None))
        aliases = []
        for o, a in zip(outs, self.g.output_aliases or [None] * len(outs)):
            # A new param keeps its buffer only when its piece has the old one's local type.
            aliases.append(self.vmap[a] if a is not None and self.vmap[a].type == o.type and self.vmap[a] is not o else None)
        if len(set(map(id, [a for a in aliases if a is not None]))) != len([a for a in aliases if a is not None]):
            aliases = [None] * len(outs)
        self.new.set_outputs(outs, aliases)
        # A vocab-parallel table's gradient: only the rank's rows, not the whole table sliced.
        for gone in embedding_grad_rows(self.new, mesh, self.rows_replaced):
            if gone in self.entry:
                self.report.collectives.remove(self.entry[gone])
        return self.new, self.report

    def made_axes(self, node: Node, spec: DimSpec) -> dict[str, tuple[str, ...]]:
        """The axes of the rule's ``made`` labels (result dims a rank computes its piece of) as
        the results are placed."""
        out: dict[str, tuple[str, ...]] = {}
        if not spec.made:
            return out
        produced = self.produced.get(node, {})
        for labels, r in zip(spec.results, node.results):
            p = produced.get(self.name(r), self.pl(r))
            for lab, axes in zip(labels, p.dims):
                if lab in spec.made and axes:
                    out[lab] = axes
        return out

    def rows_replaced(self, old: Value, new: Value, gone: list[Node], made: list[Node]) -> None:
        """A table's gradient computed for the rank's rows (``embedding_grad_rows``): the
        global values that mapped to the sliced whole gradient map to ``new``, and the local
        nodes made for a global node take ``made`` in place of the erased ones, so a pipeline
        reads the rows' gradient in the section the whole one was in."""
        for k, v in list(self.vmap.items()):
            if v is old:
                self.vmap[k] = new
        for k2, v2 in list(self.moved.items()):
            if v2 is old:
                self.moved[k2] = new
        if self.spans is None:
            return
        for key, nodes in self.spans.items():
            if any(n in gone for n in nodes):
                at = next(i for i, n in enumerate(nodes) if n in gone)
                rest = [n for n in nodes if n not in gone]
                self.spans[key] = rest[:at] + made + rest[at:]
                made = []

    def _real_whole(self, v: Value, p: Placement, what: str) -> dict[int, int]:
        """The real sizes of ``v``'s padded dims (none when it is not padded), which must
        be whole: a value crosses between stages at its real size."""
        real = dict(self.real_sizes.get(v, {}))
        for d in real:
            if p.dims[d]:
                raise PartitionError(f"@{self.g.name}: %{self.name(v)} ({what}) is padded in dim {d} and split there "
                                     f"({p}); a padded value crosses between stages whole in that dim: place it "
                                     "replicated there")
        return real

    def emit(self, node: Node, node_needs: dict[int, Placement]) -> None:
        mesh = self.mesh
        if node.op == "send" and node.operands[0] in self.real_sizes:
            o = node.operands[0]
            have0 = self.pl(o)
            want0 = node_needs.get(0, Placement(have0.dims, ()))
            x = self.reshard(o, self.vmap[o], have0, want0, self.describe(node), 0, node.loc)
            for d, n in sorted(self._real_whole(o, want0, "sent").items()):
                x = self.b.emit("slice", x, axis=d, start=0, end=n, loc=node.loc)
            self.b.emit_node("send", [x], dict(node.attrs), loc=node.loc)
            return
        if node.op == "recv":
            # A recv's tensor arrives in the placement annotated on its result (the sender's
            # send is placed alike): each rank receives its own piece.
            rv = node.results[0]
            rp = self.pl(rv)
            if rp.partial:
                raise PartitionError(f"@{self.g.name}: %{self.name(rv)} = recv is placed {rp}, a pending sum; place "
                                     "what crosses between stages replicated or split, never partial")
            local = list(rp.local_shape(rv.type.shape, mesh))
            whole = self._real_whole(rv, rp, "recv")
            lr = self.b.emit_node("recv", [], dict(node.attrs, shape=[whole.get(d, n) for d, n in enumerate(local)]),
                                  loc=node.loc).results[0]
            if whole:
                # A padded value crosses at its real size (the peer may not pad it): the padding
                # is zeros, as the padding rewrite assumes of a recv (pad_zeros "always").
                pads = []
                for d, n in enumerate(local):
                    pads += [0, n - whole.get(d, n)]
                lr.name = None
                lr = self.b.emit("pad", lr, pads=pads, value=0.0, loc=node.loc)
            if rv.name is not None:
                lr.name = rv.name
            self.vmap[rv] = lr
            self.moved[(rv, rp)] = lr
            return
        types = [o.type for o in node.operands]
        rtypes = [r.type for r in node.results]
        spec = sharding_spec(node.op, types, node.attrs)
        have = [self.pl(o) for o in node.operands]
        made: dict[str, tuple[str, ...]] = {}
        if spec is None:
            wants = [Placement.replicated(t.rank) for t in types]
            got: list[Placement] | Conflict = [Placement.replicated(t.rank) for t in rtypes]
        else:
            wants = [node_needs.get(i, p) for i, p in enumerate(have)]
            made = self.made_axes(node, spec)
            got = result_placements(spec, wants, types, mesh, rtypes, made) if made else Conflict("")
            if isinstance(got, Conflict):
                made = {}
                got = result_placements(spec, wants, types, mesh, rtypes)
            # A pair the rule still rejects: replicate the operands it names, then all of them.
            for _ in range(len(wants) + 1):
                if not isinstance(got, Conflict):
                    break
                named = got.operands or tuple(range(len(wants)))
                if all(wants[i].is_replicated for i in named):
                    named = tuple(range(len(wants)))
                for i in named:
                    wants[i] = Placement.replicated(types[i].rank)
                got = result_placements(spec, wants, types, mesh, rtypes)
            if isinstance(got, Conflict):
                raise PartitionError(f"@{self.g.name}: {self.describe(node)}: no operand placement satisfies its "
                                     f"sharding rule ({got})")
        assert not isinstance(got, Conflict)
        consumer = self.describe(node)
        operands = [self.reshard(o, self.vmap[o], h, w, consumer, i, node.loc)
                    for i, (o, h, w) in enumerate(zip(node.operands, have, wants))]
        local_types = [o.type for o in operands]
        attrs = dict(node.attrs) if spec is None else spec.localize_attrs(node.attrs, local_types, types)
        ranged = {} if spec is None else {**_split_ranged(spec, wants), **{k: a for k, a in made.items() if a}}
        if ranged:
            assert spec is not None and spec.local_form is not None, f"{node.op}: a ranged label needs a local form"
            real = [TensorType(tuple(self.real_sizes.get(o, {}).get(d, n) for d, n in enumerate(t.shape)), t.dtype)
                    for o, t in zip(node.operands, types)]
            form = LocalForm(self.b, operands, attrs, types, ranged, mesh, consumer, node.loc, memo=self.memo,
                             real=real)
            local_results = spec.local_form(form)
            for op, axis, sent in form.collectives:
                self.report.collectives.append(InsertedCollective(op, axis, self.name(node.results[0]), consumer,
                                                                  None, got[0], got[0], sent, inside=True,
                                                                  source=_source(node.loc)))
        else:
            local_results = list(self.b.emit_node(node.op, operands, attrs, loc=node.loc).results)
        n = 1 if spec is None else average_factor(spec, wants, mesh)
        if n > 1:
            # A rank averaged over its piece: n times its share of the global average
            # (DimSpec.averages). 1/n is exact for a power of two.
            for k, lr in enumerate(local_results):
                if lr.type.dtype.is_float:
                    inv = self.b.emit("constant", value=DenseAttr(np.array(1.0 / n, dtype=lr.type.dtype.np)),
                                      loc=node.loc)
                    local_results[k] = self.b.emit("mul", lr, inv, loc=node.loc)
        for r, lr, p in zip(node.results, local_results, got):
            expect = p.local_shape(r.type.shape, mesh)
            if lr.type.shape != expect:  # a rule whose localize misses a size attribute
                raise PartitionError(f"@{self.g.name}: {consumer}: the local result has shape {list(lr.type.shape)}, "
                                     f"but placed as {p} a rank should hold {list(expect)}; the op's sharding rule "
                                     "needs a localize for its attributes")
            if r.name is not None:
                lr.name = r.name
            self.vmap[r] = self.reshard(r, lr, p, self.pl(r), f"result of {consumer}", None, node.loc)
            self.moved[(r, self.pl(r))] = self.vmap[r]


def _source(loc: Location | None) -> str | None:
    """A node's source location as the report shows it: the file's name and the line (the
    directories of an installed model's files say little)."""
    if loc is None:
        return None
    return f"{os.path.basename(loc.file)}:{loc.line}"


def _split_ranged(spec: DimSpec, placements: Sequence[Placement]) -> dict[str, tuple[str, ...]]:
    """The ranged labels of ``spec`` that ``placements`` split, with their mesh axes."""
    out: dict[str, tuple[str, ...]] = {}
    if not spec.ranged:
        return out
    for labels, p in zip(spec.operands, placements):
        for lab, axes in zip(labels, p.dims):
            if lab in spec.ranged and axes:
                out[lab] = axes
    return out


@register_pass
class PartitionPass(Pass):
    """``partition``: the per-rank program of a placed global graph (see ``partition``);
    returns a new graph. The report of the last run is ``self.report``."""

    name = "partition"

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.report: PartitionReport | None = None

    def run(self, graph: Graph) -> Graph:
        new, self.report = partition_with_report(graph)
        return new
