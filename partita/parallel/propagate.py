"""Placement propagation: from the placements a user annotates to a placement on every value.

The input is a global graph with a mesh (``graph.mesh``) and placements on some values (the
annotations: inputs, node results). Annotated values are fixed. The rest are filled in by a
fixed point of three sweeps, each of which only places values that have no placement yet (so
the iteration ends after at most one round per value):

- forward: a node whose operands are all placed gets its results from its sharding rule
  (``result_placements``); an op without a rule gets replicated results;
- backward: a node with unplaced operands and some placed results or operands gives each
  unplaced operand the split its rule ties to the placed ones (an operand dim takes the axes
  of the result or operand dim with the same label; unlabelled dims stay whole; no partial);
- default: when neither sweep places anything, the unplaced graph inputs (and constants) are
  replicated, which starts the forward sweep again.

A node whose operand placements its rule does not accept (a ``Conflict``), or whose result
was placed (annotated, or by a consumer) otherwise than its operands imply, is resolved
without failing: candidate operand placements are built from the labels of each operand and
of the results, each priced by the reshard planner (bytes each rank sends), and the cheapest
is kept. Every operand that must change is recorded as a ``ReshardNeed``, which is what the
reshard pass turns into collectives. Partial results stay partial: the pending sum is
reduced only where a consumer needs it whole, and that consumer records the need.
"""

from __future__ import annotations

import math
from functools import lru_cache
from dataclasses import dataclass, field
from typing import Sequence

from ..ir.diagnostics import PartitaError
from ..ir.graph import Graph, Node, Value
from ..ir.printer import value_names
from ..ops.registry import OPS
from ..passes.manager import Pass, register_pass
from ..ir.mesh import Mesh, MeshError
from ..ir.placement import Placement, PlacementError
from .reshard import ReshardError, plan_bytes, plan_reshard
from .sharding import Conflict, DimSpec, result_placements, sharding_spec


class PropagationError(PartitaError):
    """Propagation cannot start: no mesh, or an annotation that does not fit its value."""


@dataclass(frozen=True)
class ReshardNeed:
    """A value that must change placement on its way into a node.

    ``operand`` is the operand index of ``consumer`` that reads ``value``; None means the
    node's own result ``value``, which was placed (annotated) otherwise than the node
    produces it. ``bytes`` is what each rank sends over the planned collectives; ``node``
    is the consumer itself (for passes; the text names it).
    """

    value: str
    consumer: str
    operand: int | None
    have: Placement
    want: Placement
    bytes: int
    node: Node | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        where = f"operand {self.operand} of {self.consumer}" if self.operand is not None else \
            f"result of {self.consumer}"
        return f"%{self.value} -> {where}: {self.have} -> {self.want}, {self.bytes} bytes sent per rank"


@dataclass
class PropagationReport:
    """What propagation decided: each value's placement (by printed name, as text), the
    reshards the placements imply, and the nodes replicated for lack of a sharding rule."""

    mesh: Mesh
    placements: dict[str, str] = field(default_factory=dict)
    reshards: list[ReshardNeed] = field(default_factory=list)
    replicated: list[str] = field(default_factory=list)
    rounds: int = 0

    @property
    def reshard_bytes(self) -> int:
        """Bytes each rank sends over all recorded reshards."""
        return sum(r.bytes for r in self.reshards)

    def text(self) -> str:
        """A human-readable summary."""
        lines = [f"placements on {self.mesh} ({self.rounds} rounds):"]
        lines += [f"  %{name}: {p}" for name, p in self.placements.items()]
        lines.append(f"reshards needed: {len(self.reshards)} ({self.reshard_bytes} bytes sent per rank)")
        lines += [f"  {r}" for r in self.reshards]
        lines.append(f"replicated: no sharding rule: {len(self.replicated)}")
        lines += [f"  {n}" for n in self.replicated]
        return "\n".join(lines)


def propagate(graph: Graph, mesh: Mesh | str | None = None, sinks: "Sequence[Value]" = (), *, repeat: int = 1,
              once: "set[Value] | frozenset[Value]" = frozenset(),
              accumulated: "set[Value] | frozenset[Value]" = frozenset(), resolve: bool = True) -> PropagationReport:
    """Give every value of ``graph`` a placement (in place) and report the decisions.

    ``mesh`` sets ``graph.mesh`` when the graph has none. ``sinks`` are annotated values that
    constrain only themselves: their placement is not pushed back onto their producers'
    operands (a sequence-parallel boundary asks for a reduce_scatter where it is produced,
    instead of making its producer's inputs split). ``repeat``: the graph is a pipeline
    stage's one-microbatch template that runs ``repeat`` times a step, but for the values in
    ``once`` (the gradients the microbatches accumulate, reduced once; what the once-per-step
    sections make): a reshard of any other value, and the work of the nodes, count
    ``repeat`` times; ``accumulated`` (the param gradients among them) are summed each
    microbatch at their local size, which is priced too (``ACCUMULATE_BYTES``). Raises
    PropagationError without a mesh,
    or when an annotated placement does not fit its value. ``resolve=False``: place every
    value but leave the reshards unrecorded (the report's ``reshards`` and ``replicated``
    empty), for a caller that propagates again over the placed graph (``parallelize``'s
    second run, which settles the late placements) and reads that run's report only.
    """
    if graph.mesh is None:
        if mesh is None:
            raise PropagationError(f"@{graph.name}: propagation needs a device mesh, and the graph has none; "
                                   "set graph.mesh or pass mesh=... (e.g. mesh='dp=2,tp=2')")
        try:
            graph.mesh = Mesh.of(mesh.replace(":", "=") if isinstance(mesh, str) else mesh)
        except MeshError as e:
            raise PropagationError(f"@{graph.name}: bad mesh for propagation: {e}") from e
    return _Propagator(graph, graph.mesh, sinks, repeat, once, accumulated).run(resolve)


# A pipeline template's accumulated gradient is summed each microbatch at its local size (an
# add reads two and writes one): priced as this many bytes sent per local byte (memory moves
# a byte several times faster than a link sends one), so that a full-size partial sum of a
# weight gradient is not taken for cheaper than gathering the activation it needs.
ACCUMULATE_BYTES = 0.5

# Whether ``choose`` answers a question asked before (same node structure and surroundings,
# ``choice_key``) from its memo; off, every conflicting node is priced afresh (tests compare).
MEMOIZE_CHOICES = True

# How many floating-point operations a rank does in the time it sends one byte to a peer:
# the exchange rate between repeated work and communication in the price of a placement
# (CPU cores against gloo over loopback or a data-center network, roughly).
FLOPS_PER_BYTE = 32.0


@lru_cache(maxsize=1 << 16)
def reshard_cost(shape: tuple[int, ...], dtype, have: Placement, want: Placement, mesh: Mesh) -> int | None:
    """Bytes each rank sends on the cheapest plan from ``have`` to ``want`` (None: no plan).
    The planner picks the plan by bytes plus a cost per call (``reshard.CALL_BYTES``);
    propagation compares placements by the bytes alone, with the work each rank repeats.
    Cached: propagation prices the same few shapes and placements thousands of times."""
    try:
        return plan_bytes(plan_reshard(shape, dtype, have, want, mesh, "the value"))
    except (ReshardError, PlacementError):
        return None


def placement_from_labels(labels: Sequence, label_axes: dict[str, tuple[str, ...]], shape: Sequence[int],
                          mesh: Mesh, partial: tuple[str, ...] = ()) -> Placement:
    """The placement whose dim d takes the axes of its label ``labels[d]`` in ``label_axes``
    (None, an unknown label, or axes that do not divide the dim: whole). Memoized by the
    labels' axes, the shape, the mesh and ``partial``: propagation asks the same few again
    and again (every layer alike)."""
    raw = tuple([label_axes.get(lab, ()) if lab is not None else () for lab in labels])
    key = (raw, tuple(shape), mesh, partial)
    keep = True
    try:
        got = _FROM_LABELS.get(key)
    except TypeError:  # axes given as lists: not memoized
        got, keep = None, False
    if got is None:
        dims = []
        for d, axes in enumerate(raw):
            if axes and shape[d] % math.prod(mesh.axis_size(a) for a in axes):
                axes = ()
            dims.append(axes)
        got = Placement(tuple(dims), partial)
        if keep:
            if len(_FROM_LABELS) >= 1 << 16:
                _FROM_LABELS.clear()
            _FROM_LABELS[key] = got
    return got


_FROM_LABELS: dict[tuple, Placement] = {}


class _Propagator:
    def __init__(self, graph: Graph, mesh: Mesh, sinks: "Sequence[Value]" = (), repeat: int = 1,
                 once: "set[Value] | frozenset[Value]" = frozenset(),
                 accumulated: "set[Value] | frozenset[Value]" = frozenset()) -> None:
        self.g = graph
        self.repeat = repeat
        self.once = once
        self.accumulated = accumulated
        self.sinks = set(sinks)
        self.mesh = mesh
        self.names = value_names(graph)
        self.nodes = list(graph.nodes)
        self.pl: dict[Value, Placement] = {}
        self.specs: dict[Node, DimSpec | None] = {}
        self.report = PropagationReport(mesh)
        self.committed: set[tuple[Value, Placement]] = set()   # operand reshards resolve_all recorded
        self.committed_to: dict[Value, set[Placement]] = {}    # the same, by value (for choice_key)
        self.choices: dict[tuple, tuple[tuple[Placement, ...], tuple[Placement, ...], int]] = {}
        self.batch_axes: set[str] = set()   # the axes the data inputs are split over (run)
        # In a training step a param resharded where it is read is resharded back as its
        # gradient in the backward (an all_reduce or reduce_scatter of its size, about twice
        # the bytes): priced at three times its own bytes, so that one consumer's gather of a
        # weight does not look cheaper than moving the activation (sequence parallelism's
        # attention projections, whose weights are smaller than the activation they read).
        self.param_factor = 3 if any(v.name and str(v.name).endswith(".grad") for v in graph.outputs) or \
            any(n.op in ("adamw_update", "sgd_update") for n in self.nodes) else 1

    # --- helpers ---------------------------------------------------------------------------
    def name(self, v: Value) -> str:
        return self.names.get(v, "?")

    def describe(self, node: Node) -> str:
        res = ", ".join(f"%{self.name(r)}" for r in node.results)
        return f"{res + ' = ' if res else ''}{node.op}"

    def spec(self, node: Node) -> DimSpec | None:
        if node not in self.specs:
            self.specs[node] = sharding_spec(node.op, [v.type for v in node.operands], node.attrs)
        return self.specs[node]

    def fits(self, p: Placement, v: Value) -> bool:
        try:
            p.validate(v.type.shape, self.mesh)
        except PlacementError:
            return False
        return True

    def cost(self, v: Value, have: Placement, want: Placement) -> int | None:
        """Bytes sent per rank to turn ``have`` into ``want`` for ``v``; None if impossible."""
        if have == want:
            return 0
        c = reshard_cost(tuple(v.type.shape), v.type.dtype, have, want, self.mesh)
        if c is None or v in self.once:
            return c
        if v.producer is None and v.role == "param":
            # Gathered for each microbatch, its gradient reduced once.
            return c * (self.repeat + self.param_factor - 1)
        return c * self.repeat


    # --- the fixed point -----------------------------------------------------------------------
    def run(self, resolve: bool = True) -> PropagationReport:
        for v in self.g.values():
            if v.placement is not None:
                try:
                    v.placement.validate(v.type.shape, self.mesh, f"%{self.name(v)}")
                except PlacementError as e:
                    raise PropagationError(f"the placement {v.placement} annotated on %{self.name(v)} does not fit "
                                           f"it: {e}; fix the annotation or drop it to let propagation choose") from e
                self.pl[v] = v.placement
        # The axes the batch is split over (those of the data inputs): a partial sum over them
        # is every data-parallel gradient's, reduced whatever the placements (see
        # pending_sum_cost).
        self.batch_axes = {a for v in self.g.inputs if v.role == "input" and v in self.pl
                           for axes in self.pl[v].dims for a in axes}
        rounds = 0
        while True:
            rounds += 1
            if self.forward() or self.backward() or self.default():
                continue
            break
        self.report.rounds = rounds
        if resolve:
            # Reads the placements only (records reshards): skipped, they are the same.
            self.resolve_all()
        for v in self.g.values():
            v.placement = self.pl[v]
            self.report.placements[self.name(v)] = str(self.pl[v])
        return self.report

    def forward(self) -> bool:
        changed = False
        for node in self.nodes:
            if any(r not in self.pl for r in node.results) and all(o in self.pl for o in node.operands):
                spec = self.spec(node)
                if spec is None:
                    res = [Placement.replicated(r.type.rank) for r in node.results]
                else:
                    got = result_placements(spec, [self.pl[o] for o in node.operands],
                                            [o.type for o in node.operands], self.mesh,
                                            [r.type for r in node.results])
                    # A conflict is settled (and priced) after the fixed point; meanwhile
                    # the results take what the cheapest resolution gives.
                    # A rule that may compute a piece of its result (DimSpec.made) is priced too.
                    res = self.choose(node, spec)[0] if isinstance(got, Conflict) or spec.made else got
                for r, p in zip(node.results, res):
                    if r not in self.pl:
                        self.pl[r] = self.reduce_fanout(r, p)
                changed = True
        return changed

    def reduce_fanout(self, r: Value, p: Placement) -> Placement:
        """A pending sum read by several consumers is reduced once, where it is produced:
        left partial, each consumer's path would carry it on and need its own reduction
        (the two branches of a norm's backward would each all_reduce a gradient)."""
        if not p.partial or len(r.users) + (1 if r.is_output else 0) < 2:
            return p
        return Placement(p.dims, ())

    def backward(self) -> bool:
        # Graph inputs first: a node result left to the forward sweep takes what its
        # producer implies, which costs no reshard there.
        return self.backward_sweep(inputs_only=True) or self.backward_sweep(inputs_only=False)

    def backward_sweep(self, inputs_only: bool) -> bool:
        changed = False
        for node in reversed(self.nodes):
            missing = [i for i, o in enumerate(node.operands)
                       if o not in self.pl and (o.is_input or not inputs_only)]
            if not missing:
                continue
            known = any(r in self.pl and r not in self.sinks for r in node.results) or \
                any(o in self.pl for o in node.operands)
            if not known:
                continue
            spec = self.spec(node)
            labels = self.label_axes(node, spec, results_first=True, sinks=False) if spec is not None else {}
            for i in missing:
                o = node.operands[i]
                if o in self.pl:  # the same value twice among the operands
                    continue
                want = Placement.replicated(o.type.rank) if spec is None else \
                    self.operand_placement(spec.operands[i], labels, o)
                self.pl[o] = want
            changed = True
        return changed

    def default(self) -> bool:
        changed = False
        for v in self.g.inputs:
            if v not in self.pl:
                self.pl[v] = Placement.replicated(v.type.rank)
                changed = True
        if not changed:
            # Values unreachable from the inputs (a graph of constants): replicate the first.
            for node in self.nodes:
                for r in node.results:
                    if r not in self.pl:
                        self.pl[r] = Placement.replicated(r.type.rank)
                        return True
        return changed

    # --- labels ------------------------------------------------------------------------------------
    def label_axes(self, node: Node, spec: DimSpec, results_first: bool,
                   first: int | None = None, sinks: bool = True) -> dict[str, tuple[str, ...]]:
        """Mesh axes per label, read from the placed results and operands (``first`` operand
        first, or the results first) without using a mesh axis twice (nor the results that
        are sinks, unless ``sinks``)."""
        res: list[tuple[tuple, Placement]] = \
            [(lab, self.pl[r]) for lab, r in zip(spec.results, node.results)
             if r in self.pl and (sinks or r not in self.sinks)]
        order = list(range(len(node.operands)))
        if first is not None:
            order.remove(first)
            order.insert(0, first)
        ops = [(spec.operands[i], self.pl[node.operands[i]]) for i in order if node.operands[i] in self.pl]
        sources = res + ops if results_first else ops
        allowed = {lab for r in spec.results for lab in r if lab is not None} | set(spec.sums)
        out: dict[str, tuple[str, ...]] = {}
        used: set[str] = set()
        for labels, p in sources:
            for lab, axes in zip(labels, p.dims):
                if lab is None or lab in out or lab not in allowed or not axes or used & set(axes):
                    continue
                out[lab] = axes
                used |= set(axes)
        return out

    def operand_placement(self, labels: Sequence, label_axes: dict[str, tuple[str, ...]], v: Value,
                          partial: tuple[str, ...] = ()) -> Placement:
        return placement_from_labels(labels, label_axes, v.type.shape, self.mesh, partial)

    # --- conflicts -------------------------------------------------------------------------------
    def candidates(self, node: Node, spec: DimSpec) -> list[list[Placement]]:
        """Operand placements to try for ``node``: the labels of the results first, then of
        each operand first, then nothing split; each with the operands' partial sums kept,
        kept for one operand, or dropped."""
        maps = []
        if all(r in self.pl for r in node.results):
            maps.append(self.label_axes(node, spec, results_first=True))
        maps += [self.label_axes(node, spec, results_first=False, first=i) for i in range(len(node.operands))]
        maps.append({})
        have = [self.pl[o] for o in node.operands]
        # An axis a conflict takes off one dim may split another dim the rule allows
        # (a softmax split on its axis goes to a batch dim: one all_to_all, not a gather).
        allowed = [lab for lab in spec.splittable() if lab not in spec.sums]
        for m in list(maps):
            used = {a for axes in m.values() for a in axes}
            for a in dict.fromkeys(a for p in (self.pl[o] for o in node.operands) for axes in p.dims for a in axes):
                if a not in used:
                    maps += [{**m, lab: (a,)} for lab in allowed if lab not in m]
        # A partial sum whose result is read beside a value of its shape already placed split
        # over the partial axis (a weight gradient beside its sharded master and moments): the
        # sum reduce-scattered onto that split, half of all_reducing it and slicing it after.
        partial_axes = {a for o in node.operands for a in self.pl[o].partial}
        if partial_axes:
            for j, r in enumerate(node.results):
                lab = spec.results[j]
                for u in r.users:
                    for o in u.operands:
                        p = self.pl.get(o)
                        if o is r or p is None or o.type.shape != r.type.shape:
                            continue
                        m = {lab[d]: axes for d, axes in enumerate(p.dims)
                             if axes and lab[d] is not None and set(axes) <= partial_axes}
                        if m and m not in maps:
                            maps.append(m)
        out: list[list[Placement]] = []
        seen: set[tuple] = set()
        made: set[tuple[Placement, ...]] = set()   # the candidates in ``out``, for a hashed membership test
        for m in maps:
            key = tuple(sorted(m.items()))
            if key in seen:
                continue
            seen.add(key)
            used = {a for axes in m.values() for a in axes}
            keeps: list[list[tuple[str, ...]]] = [[tuple(a for a in p.partial if a not in used) for p in have]]
            keeps += [[keeps[0][i] if j == i else () for j in range(len(have))] for i in range(len(have))]
            keeps.append([() for _ in have])
            # Operand i takes one of two keeps at most: each placement built once for this map.
            placed: dict[tuple[int, tuple[str, ...]], Placement] = {}
            for keep in keeps:
                cand = []
                for i, o in enumerate(node.operands):
                    p = placed.get((i, keep[i]))
                    if p is None:
                        p = placed[(i, keep[i])] = self.operand_placement(spec.operands[i], m, o, keep[i])
                    cand.append(p)
                t = tuple(cand)
                if t not in made:
                    made.add(t)
                    out.append(cand)
        return out

    def choose(self, node: Node, spec: DimSpec) -> tuple[list[Placement], list[Placement], int]:
        """The cheapest accepted operand placements: (results, operand wants, bytes). A
        result placed otherwise than produced adds its own reshard to the price. Memoized by
        ``choice_key`` (every layer of a template asks the same questions)."""
        key = self.choice_key(node, spec)
        if key is not None:
            hit = self.choices.get(key)
            if hit is not None:
                return list(hit[0]), list(hit[1]), hit[2]
        got, wants, total = self.choose_fresh(node, spec)
        if key is not None:
            self.choices[key] = (tuple(got), tuple(wants), total)
        return list(got), list(wants), total

    def choice_key(self, node: Node, spec: DimSpec) -> tuple | None:
        """Everything ``choose_fresh`` reads of ``node`` and its surroundings (the op, types and
        attributes; each operand's placement, reshards already recorded, reuse among the operands,
        readers of the same op, whether it is a param or once per step; each result's placement,
        once-per-step and accumulated marks, its param's placements, the placements of what its
        readers read beside it); None when an attribute is not hashable (not memoized)."""
        if not MEMOIZE_CHOICES:
            return None
        attrs = frozen_attrs(node.attrs)
        if attrs is None:
            return None
        first: dict[Value, int] = {}
        ops = []
        partial = False
        for i, o in enumerate(node.operands):
            p = self.pl[o]
            partial = partial or bool(p.partial)
            done = self.committed_to.get(o)
            ops.append((first.setdefault(o, i), o.type, p, o in self.once, o.producer is None and o.role == "param",
                        sum(1 for u in o.users if u.op == node.op), frozenset(done) if done else None))
        res = []
        for r in node.results:
            params = tuple(self.param_placements(r)) if (spec.made or r in self.accumulated) else ()
            beside: tuple = ()
            if partial:
                beside = tuple((self.pl.get(o), o.type.shape == r.type.shape) for u in r.users for o in u.operands
                               if o is not r)
            res.append((r.type, self.pl.get(r), r in self.once, r in self.accumulated, params, beside))
        return (node.op, attrs, tuple(ops), tuple(res))

    def choose_fresh(self, node: Node, spec: DimSpec) -> tuple[list[Placement], list[Placement], int]:
        """``choose`` without the memo."""
        best: tuple[float, int, list[Placement], list[Placement], int] | None = None
        flops = self.flops(node)
        made_options = self.made_options(node, spec)
        tries = [(wants, made) for wants in self.candidates(node, spec) for made in made_options]
        for k, (wants, made) in enumerate(tries):
            got = result_placements(spec, wants, [o.type for o in node.operands], self.mesh,
                                    [r.type for r in node.results], made)
            if isinstance(got, Conflict):
                continue
            total = 0
            for o, w in zip(node.operands, wants):
                c = self.shared_cost(o, w, node)
                if c is None:
                    break
                total += c
            else:
                for r, p in zip(node.results, got):
                    if r in self.pl:
                        c = self.cost(r, p, self.pl[r])
                        total += c if c is not None else 1 << 62
                    elif p.partial:
                        total += self.pending_sum_cost(r, p)
                    if r in self.accumulated and self.repeat > 1:
                        # Smaller only where split as its param is (the model states' shards):
                        # a split its param does not have must be undone once per step anyway.
                        mine = self.param_axes(r)
                        pieces = math.prod(self.mesh.axis_size(a) for axes in p.dims for a in axes if a in mine)
                        total += int(self.repeat * ACCUMULATE_BYTES * r.type.nbytes / pieces)
                # Work a rank repeats counts too: splitting the op over fewer devices makes
                # each compute more, which is worth so many bytes not sent.
                used = {a for w in wants for axes in w.dims for a in axes} | \
                    {a for axes in made.values() for a in axes}
                work = flops / math.prod(self.mesh.axis_size(a) for a in used)
                if not (node.results and node.results[0] in self.once):
                    work *= self.repeat
                key = (total + work / FLOPS_PER_BYTE, k)
                if best is None or key < best[:2]:
                    best = (key[0], k, got, wants, total)
        if best is None:  # unreachable: replicating every operand is always accepted
            raise PropagationError(f"no placement of the operands of {self.describe(node)} satisfies its sharding rule")
        return best[2], best[3], best[4]

    def shared_cost(self, o: Value, want: Placement, node: Node) -> int | None:
        """What ``node`` pays to read ``o`` as ``want``: the partition makes one reshard per
        value and placement, shared by every consumer that asks for it. Nothing, then, where
        an earlier consumer's need already makes it; else its cost split over the readers of
        ``o`` that are ``node``'s op (the q, k and v weight gradients reading one transposed
        activation gather it once, where each alone would rather make a partial sum). A gather
        over the batch's axes is not shared out: with zero3 on dp that made the weight
        gradients gather activations over dp rather than reduce-scatter (more bytes than FSDP
        in the end, and every rank's weight-gradient work repeated)."""
        have = self.pl[o]
        if have == want or (o, want) in self.committed:
            return 0
        c = self.cost(o, have, want)
        if c is None:
            return None
        def where(p: Placement) -> dict[str, int]:
            return {a: i for i, axes in enumerate(p.dims) for a in axes}

        h, w = where(have), where(want)
        moved = {a for a in set(h) | set(w) if h.get(a) != w.get(a)} | (set(have.partial) ^ set(want.partial))
        if moved & self.batch_axes:
            # Only a reshard over model axes is shared out: gathering or moving the batch itself
            # (zero3's activations, expert parallelism's token exchange) is each reader's own.
            return c
        return c // max(1, sum(1 for u in o.users if u.op == node.op))

    def pending_sum_cost(self, r: Value, p: Placement) -> int:
        """The least a partial result will cost to reduce, where some consumer needs it
        summed: a reduce_scatter of its local piece over the partial axes ((n-1)/n of it sent
        per rank), once per microbatch unless it is summed once a step. Unpriced, a partial
        sum looked free where it was made: a sequence-parallel weight gradient computed as a
        full-size partial sum beat gathering the activation it needs, and the reduce_scatter
        its update then asked for sent three times the bytes (MLP weights of 22B on tp=8).
        A sum over the batch's own axes is not charged: data parallelism reduces its gradients
        there in any case, and gathering the activations over those axes instead would
        repeat the whole batch's weight-gradient work on every rank (zero3's quick GPT-2
        then sent more than FSDP)."""
        axes = [a for a in p.partial if a not in self.batch_axes]
        if not axes:
            return 0
        n = math.prod(self.mesh.axis_size(a) for a in axes)
        split = math.prod(self.mesh.axis_size(a) for axes in p.dims for a in axes)
        c = int(r.type.nbytes / split * (n - 1) / n)
        return c if r in self.once else c * self.repeat

    def made_options(self, node: Node, spec: DimSpec) -> list[dict[str, tuple[str, ...]]]:
        """The axes to try for the rule's ``made`` labels (result dims a rank may compute its
        piece of): none, those the result is placed with, and those its param (an input of its
        shape read beside it on the way to the update: the table a gradient is of) is split
        over in that dim."""
        out: list[dict[str, tuple[str, ...]]] = [{}]
        if not spec.made:
            return out
        for labels, r in zip(spec.results, node.results):
            sources = [self.pl[r]] if r in self.pl else []
            sources += self.param_placements(r)
            for p in sources:
                opt = {lab: axes for lab, axes in zip(labels, p.dims) if lab in spec.made and axes}
                if opt and opt not in out:
                    out.append(opt)
        return out

    def param_placements(self, r: Value) -> list[Placement]:
        """The placements of the graph inputs of ``r``'s shape read beside it within four
        steps (its param, master or moments), through a cast or a scaling of the gradient on
        its way to the update, and past a tied weight's exchange in a pipeline template (add,
        reshape, cast, update)."""
        out: list[Placement] = []
        frontier, seen = [r], {r}
        for _ in range(4):
            nxt = []
            for v in frontier:
                for u in v.users:
                    for o in u.operands:
                        if o not in seen and o.producer is None and o.type.shape == r.type.shape and o in self.pl \
                                and self.pl[o] not in out:
                            out.append(self.pl[o])
                    nxt += [x for x in u.results if x.type.shape == r.type.shape and x not in seen]
            seen.update(nxt)
            frontier = nxt
        return out

    def param_axes(self, r: Value) -> set[str]:
        """The mesh axes a gradient's param (or its master or moments: graph inputs of its
        shape read beside it, ``param_placements``) is placed split over."""
        return {a for p in self.param_placements(r) for axes in p.dims for a in axes}

    def flops(self, node: Node) -> float:
        try:
            return float(OPS[node.op].cost_of([o.type for o in node.operands], [r.type for r in node.results],
                                              node.attrs).flops)
        except Exception:  # a cost rule that cannot price these types: count no work
            return 0.0

    def resolve_all(self) -> None:
        """Check every node against its rule; record the reshards that make it hold."""
        for node in self.nodes:
            spec = self.spec(node)
            if spec is None:
                if node.operands:  # an op without operands (a constant) has nothing to split
                    self.report.replicated.append(f"{self.describe(node)}: replicated: no sharding rule")
                wants = [Placement.replicated(o.type.rank) for o in node.operands]
                got = [Placement.replicated(r.type.rank) for r in node.results]
            else:
                have = [self.pl[o] for o in node.operands]
                got_or = result_placements(spec, have, [o.type for o in node.operands], self.mesh,
                                           [r.type for r in node.results])
                if not isinstance(got_or, Conflict) and all(self.pl[r] == p for r, p in zip(node.results, got_or)) \
                        and not spec.made:
                    continue
                got, wants, _ = self.choose(node, spec)
            for i, (o, w) in enumerate(zip(node.operands, wants)):
                if self.pl[o] != w:
                    self.need(o, node, i, self.pl[o], w)
                    self.committed.add((o, w))
                    self.committed_to.setdefault(o, set()).add(w)
            for r, p in zip(node.results, got):
                if self.pl[r] != p:
                    self.need(r, node, None, p, self.pl[r])

    def need(self, v: Value, node: Node, operand: int | None, have: Placement, want: Placement) -> None:
        c = self.cost(v, have, want)
        if c is None:
            raise PropagationError(
                f"%{self.name(v)} is placed as {want}, but {self.describe(node)} produces it as {have} and no "
                f"collective gets there (a pending sum cannot be created); change the annotation of %{self.name(v)}")
        self.report.reshards.append(ReshardNeed(self.name(v), self.describe(node), operand, have, want, c, node))


def frozen_attrs(attrs: dict) -> tuple | None:
    """``attrs`` as a hashable key (lists as tuples, a float by its repr so that -0.0 and
    0.0 differ, every value with its type); None when a value is not hashable (an array)."""
    out = []
    for k in sorted(attrs):
        v = frozen_value(attrs[k])
        if v is None and attrs[k] is not None:
            return None
        out.append((k, v))
    return tuple(out)


def frozen_value(v: object) -> object:
    """One attribute value as a hashable key (see ``frozen_attrs``); None when it is not one."""
    if isinstance(v, bool) or v is None:
        return ("b", v)
    if isinstance(v, (int, str)):
        return (type(v).__name__, v)
    if isinstance(v, float):
        return ("f", repr(v))
    if isinstance(v, (list, tuple)):
        items = [frozen_value(x) for x in v]
        return None if any(x is None for x in items) else ("l", tuple(items))
    try:
        hash(v)
    except TypeError:
        return None
    return ("o", type(v).__name__, v)


@register_pass
class PropagatePass(Pass):
    """``propagate``: place every value from the annotated ones (see ``propagate``). The
    report of the last run is ``self.report``. Option ``mesh`` (``dp:2,tp:2`` or
    ``dp=2,tp=2``) is used when the graph has no mesh."""

    name = "propagate"

    @dataclass
    class Options:
        mesh: str = ""

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.report: PropagationReport | None = None

    def run(self, graph: Graph) -> Graph:
        self.report = propagate(graph, self.options.mesh or None)
        return graph
