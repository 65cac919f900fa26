"""Section-level simulator programs of a pipeline built with ``unroll=False``.

A pipeline rank's program is its one-microbatch template copied section by section, once per
schedule action (partita/parallel/pipeline/local_unroll.py). Simulating it node by node costs
``M x`` the template; here each section of each template is priced once into a *fragment*
of simulator steps, and a rank's step list is the fragments concatenated in the rank's
schedule order, exactly as ``prepare`` would cut the unrolled program:

- compute ops priced as ``prepare`` prices them; collectives issued where the unrolled
  program's ``order_collectives(keep_order=True)`` puts them (sends and recvs keep their
  place): inside its section, hoisted to just after what it needs; one that needs nothing of
  its own section goes up to just after the collective before it (a *hoist point*: a step and
  an offset into it); an all_gather at its section's end sinks into a later section, to just
  before its first reader or the next collective, unless that one is hoisted to just after it;
- an asynchronous result is waited for where it is first read, also by a later section (a
  recv read by the next forward); comm ordinals per axis and per point-to-point peer are
  numbered in program order, as ``prepare`` numbers them;
- the gradient accumulation the unroll adds (one add per param per microbatch per chunk
  after its W, and the loss shares' sum) is priced too; the gradient buckets are those
  ``_finish_collectives`` makes from the once-per-step sections (bucketed on the template);
- a stretch of a fragment whose communication is only over axes on which the simulated rank
  meets nobody but ranks it stands for (tp inside a node), that waits for all of it before
  it ends, is a *piece*: precomputed once into (duration, compute, waits, per-axis stream
  busy and bytes), so a 512-microbatch schedule is a few thousand steps per rank.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, TypeAlias

from ..ir.graph import Graph, Node, Value
from ..ir.mesh import Mesh
from ..parallel.collective_order import grows_when_gathered, is_collective, kept_order
from ..parallel.pipeline.chunk_templates import active_section_cache, node_value_map, section_digest
from ..parallel.pipeline.local_unroll import ONCE_SECTIONS
from ..ops.kinds import GEMM_OPS
from ..ops.registry import OPS
from .cost import COLLECTIVE_OPS, P2P_OPS, CostModel, price_key
from .fused_groups import fused_time, group_sections
from .hardware import Cluster
from .steps import ASYNC_OPS, Comm, Hoisted, Issue, Piece, Program, SectionRun, Step, Wait, is_hoisted


def _is_comm(n: Node) -> bool:
    return n.op in P2P_OPS or (n.op in COLLECTIVE_OPS and n.attrs.get("group_size", 1) > 1)


# --- a fragment's entries: ``j`` is the index of a comm in its fragment's ``comms`` -----------

@dataclass(frozen=True, slots=True)
class OpRun:
    """Compute node ``node``, ``seconds`` long."""

    seconds: float
    node: Node


@dataclass(frozen=True, slots=True)
class IssueHere:
    """Comm ``j`` issued here."""

    j: int


@dataclass(frozen=True, slots=True)
class IssueHoisted:
    """Comm ``j`` issued at its hoist point, before the section (see ``section_order``)."""

    j: int


@dataclass(frozen=True, slots=True)
class IssueDeferred:
    """All_gather ``j`` sunk past the section's end; ``anchor``: the node it is hoisted to just
    after when the next collective does not let it sink (None: the last hoist point)."""

    j: int
    anchor: Node | None


@dataclass(frozen=True, slots=True)
class WaitLocal:
    """The compute stream waits for comm ``j`` of this section copy."""

    j: int


@dataclass(frozen=True, slots=True)
class WaitOther:
    """The compute stream waits for ``value`` of another section copy, if still in flight."""

    value: Value


@dataclass(frozen=True, slots=True)
class CollectiveMark:
    """An operand-free collective (axis_index): a place in the collective order only."""


Entry: TypeAlias = OpRun | IssueHere | IssueHoisted | IssueDeferred | WaitLocal | WaitOther | CollectiveMark


@dataclass
class _Fragment:
    """One section of a template as entries (``Entry``), in the unrolled program's order.
    ``leaves``: (value, j) of results still in flight at its end."""

    key: tuple
    entries: list[Entry]
    comms: list[Node]
    leaves: list[tuple[Value, int]]
    flops: float
    kinds: dict[str, float]
    lead_outside: bool = False
    has_collective: bool = False


@dataclass
class SectionOrder:
    """A section's nodes in the unrolled program's order (see ``section_order``)."""

    nodes: list[Node]
    outside: set[Node]            # issued at the hoist point (before the section)
    deferred: dict[Node, Node | None]   # gathers that sink past the section's end: -> anchor node
    lead_outside: bool            # its first collective is anchored before the section
    has_collective: bool


def section_order(nodes: list[Node], overlap: bool = False) -> SectionOrder:
    """``nodes`` (one section, template order) in the order ``order_collectives(keep_order=
    True)`` gives their copies in the unrolled program: ``kept_order`` of the section, the
    function that pass calls on the whole program (each collective, ``is_collective``:
    point-to-point transfers are not, hoisted to just after the last node it needs and the
    collective before it, then each all_gather sunk to just before its first reader or the
    next collective). What crosses the section's bounds is returned apart: the collectives
    that need nothing of the section (they go up to the collective before them, in an
    earlier section; an all_gather among them that another such one follows stays there),
    and the all_gathers that sink past the section's end (into a later section, unless the
    next collective is anchored before its section: then they stay at their anchor).
    ``overlap``: the linear layers' backward ordered to overlap its collectives, as the pass
    does unless the schedule defers the weight gradients (``overlap_linear_backward``)."""
    kept = kept_order(nodes, overlap)
    colls = [n for n in nodes if is_collective(n)]
    lead = [n for n in colls if kept.anchors[n] < 0]
    outside: set[Node] = set()
    for i, n in enumerate(lead):
        if not _is_comm(n) or OPS[n.op].torch_async is None:
            continue
        if not grows_when_gathered(n) or i + 1 < len(lead):
            outside.add(n)
    order = kept.nodes
    deferred: dict[Node, Node | None] = {}
    for i, n in enumerate(order):
        if grows_when_gathered(n) and _is_comm(n) and n not in outside:
            readers = {u for r in n.results for u in r.users}
            if not any(x in readers or is_collective(x) for x in order[i + 1:]):
                deferred[n] = kept.anchor_node(nodes, n)
    return SectionOrder(order, outside, deferred, bool(colls) and kept.anchors[colls[0]] < 0, bool(colls))


def build_fragment(key: tuple, nodes: list[Node], model: CostModel, cache: dict, outputs: set[Value],
                   overlap: bool = False) -> _Fragment:
    """One section's fragment: its nodes in the unrolled program's order (``section_order``;
    ``overlap``: the linear layers' backward overlapped), priced."""
    so = section_order(nodes, overlap)
    order, outside = so.nodes, so.outside
    inside = set(nodes)
    entries: list[Entry] = []
    comms: list[Node] = []
    pending: dict[Value, int] = {}
    seen: set[Value] = set()
    flops = 0.0
    kinds: dict[str, float] = defaultdict(float)
    for n in order:
        for v in dict.fromkeys(n.operands):
            if v in pending:
                entries.append(WaitLocal(pending.pop(v)))
            elif v.producer is not None and v.producer not in inside and v not in seen \
                    and v.producer.op in ASYNC_OPS and _is_comm(v.producer):
                seen.add(v)
                entries.append(WaitOther(v))
        if _is_comm(n):
            j = len(comms)
            comms.append(n)
            if n in so.deferred:
                entries.append(IssueDeferred(j, so.deferred[n]))
            else:
                entries.append(IssueHoisted(j) if n in outside else IssueHere(j))
            if n.op in ASYNC_OPS:
                if n.results:
                    pending[n.results[0]] = j
            else:
                entries.append(WaitLocal(j))
            continue
        if OPS[n.op].collective is not None:
            entries.append(CollectiveMark())
        if is_hoisted(n, outputs):
            continue
        priced = fused_time(model, n)
        if priced is None:
            k2 = price_key(n)
            priced = cache.get(k2)
            if priced is None:
                priced = cache[k2] = model.compute_time(n)
        flops += priced.flops
        kinds[priced.kind] += priced.seconds
        entries.append(OpRun(priced.seconds, n))
    return _Fragment(key, entries, comms, list(pending.items()), flops, dict(kinds), so.lead_outside,
                     so.has_collective)


def map_fragment(frag: _Fragment, proto: list[Node], key: tuple, nodes: list[Node]) -> _Fragment:
    """``frag`` (built for section ``proto``) for the alike section ``nodes`` (key ``key``)."""
    nmap, vmap = node_value_map(proto, nodes)
    entries: list[Entry] = []
    for e in frag.entries:
        match e:
            case OpRun(seconds, node):
                entries.append(OpRun(seconds, nmap[node]))
            case WaitOther(v):
                entries.append(WaitOther(vmap[v]))
            case IssueDeferred(j, anchor):
                entries.append(IssueDeferred(j, nmap[anchor] if anchor is not None else None))
            case _:
                entries.append(e)
    return _Fragment(key, entries, [nmap[n] for n in frag.comms], [(vmap[v], j) for v, j in frag.leaves],
                     frag.flops, frag.kinds, frag.lead_outside, frag.has_collective)


@dataclass
class _Piece:
    """A precomputed stretch of a fragment (see the module docstring); ``at``: the offset of
    each node's end from the piece's start; ``last_issue``: that of its last collective."""

    duration: float
    busy: float
    waiting: float
    comm_busy: tuple
    comm_bytes: tuple
    at: dict[Value, float]
    last_issue: float | None
    first_coll: float | None = None
    waits: tuple = ()        # (axis, seconds) of ``waiting``


@dataclass
class _Variant:
    """A fragment cut for one set of collapsible axes: stretches to price as pieces (lists of
    entries) and the entries between them."""

    segs: list[list[Entry] | Entry]
    bad: set[str]


def cut_fragment(frag: _Fragment, axes: frozenset[str]) -> _Variant:
    """Cut ``frag`` into pieces over the collapsible ``axes``; ``bad``: the axes that cannot
    be collapsed (a comm on them left in flight across a boundary or past the end, hoisted)."""
    segs: list[list[Entry] | Entry] = []
    bad: set[str] = set()
    cur: list[Entry] = []
    open_: set[int] = set()

    def axis(j: int) -> str:
        return frag.comms[j].attrs["axis"]

    def close() -> None:
        nonlocal cur
        if open_:
            bad.update(axis(j) for j in open_)
            open_.clear()
        if cur:
            segs.append(list(cur))
        cur = []

    for e in frag.entries:
        if isinstance(e, (OpRun, CollectiveMark)):
            cur.append(e)
        elif isinstance(e, (IssueHere, WaitLocal)) and axis(e.j) in axes and frag.comms[e.j].op not in P2P_OPS:
            cur.append(e)
            if isinstance(e, IssueHere):
                open_.add(e.j)
            else:
                open_.discard(e.j)
        else:
            if isinstance(e, (IssueHoisted, IssueDeferred)) and axis(e.j) in axes:
                bad.add(axis(e.j))
            close()
            segs.append(e)
    close()
    for _, j in frag.leaves:
        if axis(j) in axes:
            bad.add(axis(j))
    return _Variant(segs, bad)


def price_piece(entries: list[Entry], comms: list[Node], comm_time: Any, exports: set[Value]) -> _Piece:
    """Play ``entries`` (runs and comms over axes where the rank meets only itself) from
    clock 0 with free streams."""
    clock = busy = waiting = 0.0
    free: dict[str, float] = defaultdict(float)
    done: dict[int, float] = {}
    cb: dict[str, float] = defaultdict(float)
    cbytes: dict[str, float] = defaultdict(float)
    at: dict[Value, float] = {}
    last_issue = None
    first = None
    waits: dict[str, float] = defaultdict(float)
    for e in entries:
        match e:
            case CollectiveMark():
                if first is None:
                    first = clock
            case OpRun(seconds, node):
                clock += seconds
                busy += seconds
                for v in node.results:
                    if v in exports:
                        at[v] = clock
            case IssueHere(j):
                n = comms[j]
                a = n.attrs["axis"]
                dur, nbytes = comm_time(n)
                start = max(clock, free[a])
                done[j] = free[a] = start + dur
                cb[a] += dur
                cbytes[a] += nbytes
                last_issue = clock
                if first is None:
                    first = clock
            case WaitLocal(j):
                t = done[j]
                if t > clock:
                    waiting += t - clock
                    waits[comms[j].attrs["axis"]] += t - clock
                    clock = t
            case _:
                raise AssertionError(f"not an entry of a piece: {e}")
    return _Piece(clock, busy, waiting, tuple(cb.items()), tuple(cbytes.items()), at, last_issue, first,
                  tuple(waits.items()))


# --- a rank's plan: the unroll's order of section copies and sums ---------------------------------

@dataclass(frozen=True, slots=True)
class CopySection:
    """Play a copy of section ``key`` for microbatch ``m`` (None: a once-per-step section)."""

    key: tuple
    m: int | None


@dataclass(frozen=True, slots=True)
class LossReady:
    """Note where microbatch ``m``'s loss share is ready."""

    m: int


@dataclass(frozen=True, slots=True)
class Accumulate:
    """Add chunk ``chunk``'s gradients of microbatch ``m`` to their sums."""

    chunk: int
    m: int


@dataclass(frozen=True, slots=True)
class SumUp:
    """Settle where each gradient sum is ready, and sum the loss shares."""


PlanItem: TypeAlias = CopySection | LossReady | Accumulate | SumUp


@dataclass(frozen=True)
class ChunkAdds:
    """The gradient sums of one chunk: its (name, gradient) pairs, each add's end offset in one
    run of them all, that run's seconds, FLOPs and seconds by kind, and the gradients a
    communication makes."""

    grads: list[tuple[str, Value]]
    offsets: list[float]
    seconds: float
    flops: float
    kinds: dict[str, float]
    comm_grads: list[Value]


class SectionProgramBuilder:
    """Builds the simulator program (``program.Program``) of a rank of a pipeline built
    with ``unroll=False`` from its ``LocalTemplate``."""

    def __init__(self, mesh: Mesh, cluster: Cluster, model: CostModel, cache: dict, *,
                 sum_in_gemm: bool = False) -> None:
        self.mesh, self.cluster, self.model, self.cache = mesh, cluster, model, cache
        # A gradient a matrix product computes is added to its sum in that product's epilogue
        # (simulate's ``grad_sums="gemm"``), not by an add of its own.
        self.sum_in_gemm = sum_in_gemm
        # Fragments by section digest (chunk_templates.py): alike sections are built once, and
        # with a planner's SectionCache active, once across its candidates too.
        self.protos: dict[tuple, tuple[_Fragment, list[Node]]] = {}
        self.shared = active_section_cache()
        if self.shared is not None:
            self.cache, self.protos = self.shared.for_cluster(cluster)
        self.frags: dict[int, dict[tuple, _Fragment]] = {}
        self.variants: dict[tuple, tuple[dict[tuple, _Variant], frozenset[str]]] = {}
        self.pieces: dict[tuple, Any] = {}
        self.comm_cache: dict[tuple, tuple[float, float]] = {}
        self.exp: dict[int, set[Value]] = {}

    # --- per template ---------------------------------------------------------------------
    def fragments(self, t: Any) -> dict[tuple, _Fragment]:
        got = self.frags.get(id(t))
        if got is None:
            by: dict[tuple, list[Node]] = defaultdict(list)
            split = t.sched.split
            section_of: dict[Node, tuple] = {}
            for n in t.local.nodes:
                k = t.sections[n]
                # Unsplit, a W section follows its B section in the unrolled program, and the
                # weight gradients move into it (collective_order.overlap_linear_backward).
                k = ("B", k[1]) if k[0] == "W" and not split else k
                by[k].append(n)
                section_of[n] = k
            # Fused groups stay inside a section, as they stay inside an action of the unrolled
            # program (fused_groups.pricing_groups).
            group_sections(self.model, t.local, section_of)
            outs = set(t.local.outputs)
            got = self.frags[id(t)] = {k: self.fragment(k, ns, outs, not split) for k, ns in by.items()}
        return got

    def fragment(self, key: tuple, nodes: list[Node], outs: set[Value], overlap: bool) -> _Fragment:
        """Section ``key``'s fragment: that of an alike section built before (same
        ``section_digest``) with its nodes and values mapped over, else built here."""
        d = section_digest(nodes, outs, overlap)
        got = self.protos.get(d)
        if got is None:
            frag = build_fragment(key, nodes, self.model, self.cache, outs, overlap=overlap)
            self.protos[d] = (frag, nodes)
            if self.shared is not None:
                self.shared.built += 1
            return frag
        try:
            frag = map_fragment(got[0], got[1], key, nodes)
        except KeyError:                # an anchor outside the section: build it here
            return build_fragment(key, nodes, self.model, self.cache, outs, overlap=overlap)
        if self.shared is not None:
            self.shared.hits += 1
        return frag

    def variant(self, t: Any, axes: frozenset[str]) -> tuple[dict[tuple, _Variant], frozenset[str]]:
        """The fragments of ``t`` cut over the largest subset of ``axes`` that collapses."""
        key = (id(t), axes)
        got = self.variants.get(key)
        if got is None:
            frags = self.fragments(t)
            ok = axes
            while True:
                cut = {k: cut_fragment(f, ok) for k, f in frags.items()}
                bad = set().union(*(v.bad for v in cut.values())) if cut else set()
                if not bad & ok:
                    break
                ok = ok - bad
            got = self.variants[key] = (cut, ok)
        return got

    def exports(self, t: Any) -> set[Value]:
        """The values whose place in the program a later section needs: operands of the
        collectives hoisted out of their sections, the gradients the unroll sums, the loss
        share."""
        got = self.exp.get(id(t))
        if got is None:
            got = set()
            for f in self.fragments(t).values():
                for e in f.entries:
                    if isinstance(e, IssueHoisted):
                        got.update(f.comms[e.j].operands)
                    elif isinstance(e, IssueDeferred) and e.anchor is not None and e.anchor.results:
                        got.add(e.anchor.results[0])
            for gs in t.chunk_grads.values():
                got.update(v for _, v in gs)
            if t.loss_share is not None:
                got.add(t.loss_share)
            self.exp[id(t)] = got
        return got

    # --- per rank -------------------------------------------------------------------------
    def comm_time(self, rank: int, n: Node) -> tuple[float, float]:
        axis = n.attrs["axis"]
        group = self.mesh.group_of(rank, axis)
        link = self.cluster.link(group)
        key = (id(n), link, len(group))
        got = self.comm_cache.get(key)
        if got is None:
            ot = self.model.collective_time(n, group)
            got = self.comm_cache[key] = (ot.seconds, float(self.model.record_cost(n).bytes_written))
        return got

    def price_sum(self, gv: Value) -> Any:
        """The priced adding of gradient ``gv`` to its sum: in the epilogue of the matrix
        product that computes it where the builder sums in GEMMs (``CostModel.sum_in_gemm``),
        else an add."""
        gemm = gv.producer
        if not self.sum_in_gemm or gemm is None or gemm.op not in GEMM_OPS:
            return self.price_add(gv.type)
        key = ("pp-sum-in-gemm", price_key(gemm), gv.type.shape, gv.type.dtype.name)
        got = self.cache.get(key)
        if got is None:
            got = self.cache[key] = self.model.sum_in_gemm(gemm, gv.type)
        return got

    def price_add(self, ty: Any) -> Any:
        """The priced add of two values of type ``ty`` (a gradient or loss sum)."""
        key = ("pp-add", ty.shape, ty.dtype.name)
        got = self.cache.get(key)
        if got is None:
            from ..ir.builder import Builder

            g = Graph("priced")
            x, y = g.add_input("x", ty, "input"), g.add_input("y", ty, "input")
            node = Builder(g).add(x, y).producer
            assert node is not None
            got = self.cache[key] = self.model.compute_time(node)
        return got

    def build(self, t: Any, rank: int, alone: frozenset[str]) -> Program:
        """The program of global rank ``rank`` (pp rank ``t.rank``); ``alone``: the mesh axes
        on which this rank meets only ranks it stands for."""
        return RankProgramBuild(self, t, rank, alone).program()


class RankProgramBuild:
    """The program of one simulated rank under construction (``SectionProgramBuilder.build``):
    its steps and comms so far, and where in them the values later copies read are ready, a
    *point* (step index, offset into that step)."""

    def __init__(self, owner: SectionProgramBuilder, t: Any, rank: int, alone: frozenset[str]) -> None:
        self.owner, self.t, self.rank = owner, t, rank
        self.cut, axes = owner.variant(t, alone)
        links = tuple((a, owner.cluster.link(owner.mesh.group_of(rank, a))) for a in sorted(axes))
        pkey = (id(t), axes, links)
        pieces = owner.pieces.get(pkey)
        if pieces is None:
            pieces = owner.pieces[pkey] = {}
        self.pieces: dict[tuple, list[_Piece | None]] = pieces
        self.frags = owner.fragments(t)
        self.exports = owner.exports(t)
        self.sched = t.sched
        self.steps: list[Step] = []
        self.comms: list[Comm] = []
        self.hoist: dict[int, list[Hoisted]] = defaultdict(list)
        self.ordinals: dict[tuple, int] = defaultdict(int)
        self.pending: dict[tuple, int] = {}              # copy key of a value -> its comm, in flight
        self.points: dict[tuple, tuple[int, float]] = {}  # copy key of a value -> where it is ready
        self.last_point: tuple[int, float] = (0, 0.0)     # where the last collective was issued
        self.deferred: list[int] = []                     # all_gathers sinking into what follows
        self.flops = 0.0
        self.kinds: dict[str, float] = defaultdict(float)
        self.last_copy: dict[tuple, int] = {}             # section -> microbatch of its last copy
        self.once_point: dict[Value, tuple[int, float]] = {}
        self.acc_point: dict[str, tuple[int, float]] = {}  # param -> where its latest sum is ready
        self.loss_points: list[tuple[int, float]] = []
        self.acc_set: set[str] = set()                    # params with a sum already
        self.chunk_info: dict[int, ChunkAdds] = {}
        self.last_acc: dict[int, tuple[int | None, int]] = {}

    def program(self) -> Program:
        """Play the rank's plan (``plan``) and return its program."""
        if self.sched.microbatches > 1:
            self.slice_microbatches()
        plan = self.plan()
        for item, lead_next in zip(plan, self.leads(plan)):
            match item:
                case CopySection(key, m):
                    self.copy(key, m, lead_next)
                case Accumulate(c, m):
                    self.accumulate(c, m)
                case LossReady(m):
                    q = self.points.get((self.t.loss_share, m))
                    self.loss_points.append(q if q is not None else (len(self.steps), 0.0))
                case SumUp():
                    self.sums()
        self.flush()
        self.steps.extend(Wait(k) for k in self.pending.values())
        self.steps.extend(Wait(k) for k, c in enumerate(self.comms) if c.sending)
        t = self.t
        prog = Program(t.local, self.steps, self.comms, list(t.local.nodes), [], self.flops, dict(self.kinds))
        prog.hoist = {k: v for k, v in self.hoist.items()}
        return prog

    # --- the plan -------------------------------------------------------------------------
    def plan(self) -> list[PlanItem]:
        """The unroll's order (local_unroll._Unroll._run) of the rank's section copies, gradient
        sums and loss shares."""
        from ..parallel.pipeline.schedule import Action

        t, sched = self.t, self.sched
        plan: list[PlanItem] = []
        tied_done = False
        for it in t.items:
            if isinstance(it, Action):
                c, m = it.chunk, it.mb
                if it.kind == "F":
                    plan.append(CopySection(("F", c), m))
                    if t.loss_share is not None and c == sched.chunks - 1:
                        plan.append(LossReady(m))
                elif it.kind == "B":
                    plan.append(CopySection(("B", c), m))  # with its W section when unsplit
                    if not sched.split:
                        plan.append(Accumulate(c, m))
                else:
                    plan.append(CopySection(("W", c), m))
                    plan.append(Accumulate(c, m))
                continue
            if it.what == "tied":
                if not tied_done:
                    plan.append(SumUp())
                    plan.append(CopySection(("tied",), None))
                    tied_done = True
                continue
            if it.src == it.dst:
                continue
            side = "send" if it.src == t.rank else "recv"
            plan.append(CopySection((side, it.what, it.after.chunk), it.after.mb))
        plan.append(SumUp())
        plan.extend(CopySection(key, None) for key in (("loss",), ("final",), ("opt",), ("tail",)))
        return plan

    def leads(self, plan: list[PlanItem]) -> list[bool | None]:
        """For each item of ``plan``: whether the next section with a collective starts with one
        anchored before it (None: no such section follows), which decides where an all_gather
        at a section's end goes."""
        lead_next: list[bool | None] = [None] * len(plan)
        nxt: bool | None = None
        for i in range(len(plan) - 1, -1, -1):
            lead_next[i] = nxt
            item = plan[i]
            if isinstance(item, CopySection):
                f = self.frags.get(item.key)
                if f is not None and f.has_collective:
                    nxt = f.lead_outside
        return lead_next

    # --- where values are ---------------------------------------------------------------
    def copy_of(self, v: Value, m: int | None) -> tuple | None:
        """The key of the copy of template value ``v`` read by a section copy ``m``."""
        p = v.producer
        if p is None:
            return None
        ps = self.t.sections[p]
        if ps[0] in ONCE_SECTIONS:
            return (v, None)
        if m is not None:
            return (v, m)
        c = self.last_copy.get(ps)
        return (v, c) if c is not None else None

    def point_of(self, v: Value, m: int | None) -> tuple[int, float] | None:
        """Where the copy of ``v`` that section copy ``m`` reads is ready, if known."""
        if m is None and v in self.once_point:
            return self.once_point[v]
        k = self.copy_of(v, m)
        return self.points.get(k) if k is not None else None

    # --- steps ----------------------------------------------------------------------------
    def new_comm(self, n: Node) -> int:
        """A new comm of the program for node ``n``, numbered on its axis (or peer)."""
        op = n.op
        axis = n.attrs["axis"]
        peer = n.attrs.get("peer") if op in P2P_OPS else None
        okey = (axis, op, peer) if op in P2P_OPS else (axis,)
        c = Comm(n, axis, self.ordinals[okey], op in ASYNC_OPS, peer, op == "send")
        self.ordinals[okey] += 1
        self.comms.append(c)
        return len(self.comms) - 1

    def run(self, dur: float, label: str) -> None:
        """A section-level run of ``dur`` seconds."""
        self.steps.append(SectionRun(dur, label))

    def wait(self, k: int) -> None:
        """Wait for comm ``k``, issuing the deferred all_gathers up to it first."""
        if k in self.deferred:
            self.flush(k)
        self.steps.append(Wait(k))

    def flush(self, upto: int | None = None, at: tuple[int, float] | None = None) -> None:
        """Issue the deferred all_gathers (all, or up to comm ``upto``): at point ``at``, or
        here (the next collective or the first reader of one has come)."""
        deferred = self.deferred
        if not deferred:
            return
        n = len(deferred) if upto is None else deferred.index(upto) + 1
        for k in deferred[:n]:
            if at is None:
                self.steps.append(Issue(k))
            else:
                self.hoist[at[0]].append(Hoisted(at[1], k))
        del deferred[:n]

    # --- section copies -------------------------------------------------------------------
    def copy(self, key: tuple, m: int | None, lead_next: bool | None = None) -> None:
        """Append the copy of section ``key`` for microbatch ``m``: its pieces as priced once,
        the entries between them one by one."""
        frag = self.frags.get(key)
        if frag is None:
            return
        var = self.cut[key]
        pc = self.pieces.get(key)
        if pc is None:
            pc = self.pieces[key] = [price_piece(s, frag.comms, lambda n: self.owner.comm_time(self.rank, n),
                                                 self.exports)
                                     if isinstance(s, list) else None for s in var.segs]
        label = _label(key, m, self.sched)
        gmap: dict[int, int] = {}
        for s, piece in zip(var.segs, pc):
            if piece is not None:
                self.place_piece(piece, m, label)
            else:
                assert not isinstance(s, list)
                self.place_entry(s, frag, m, gmap, lead_next)
        for v, j in frag.leaves:
            self.pending[(v, m)] = gmap[j]
        self.flops += frag.flops
        for kk, x in frag.kinds.items():
            self.kinds[kk] += x
        if m is not None:
            self.last_copy[key] = m

    def place_piece(self, piece: _Piece, m: int | None, label: str) -> None:
        """Append a priced piece, and note where the values it exports are ready."""
        i = len(self.steps)
        if self.deferred and piece.first_coll is not None:
            self.flush(at=(i, piece.first_coll))
        self.steps.append(Piece(piece.duration, piece.busy, piece.waiting, piece.comm_busy, piece.comm_bytes,
                                label, piece.waits))
        for v, off in piece.at.items():
            self.points[(v, m)] = (i, off)
        if piece.last_issue is not None:
            self.last_point = (i, piece.last_issue)

    def place_entry(self, s: Entry, frag: _Fragment, m: int | None, gmap: dict[int, int],
                    lead_next: bool | None) -> None:
        """Append one entry of a section copy between its pieces; ``gmap``: the copy's comms'
        indices in the program."""
        if self.deferred and isinstance(s, (IssueHere, IssueHoisted, IssueDeferred)):
            self.flush()
        match s:
            case IssueDeferred(j, an):
                k = gmap[j] = self.new_comm(frag.comms[j])
                pt = self.points.get((an.results[0], m)) if an is not None and an.results else None
                if pt is None:
                    pt = self.last_point
                if lead_next:
                    # The next collective is hoisted to just after this one's anchor: it
                    # does not sink.
                    self.hoist[pt[0]].append(Hoisted(pt[1], k))
                else:
                    self.deferred.append(k)
                self.last_point = pt
            case IssueHere(j):
                n = frag.comms[j]
                k = gmap[j] = self.new_comm(n)
                self.steps.append(Issue(k))
                self.last_point = (len(self.steps) - 1, 0.0)
                for v in n.results:
                    if v in self.exports:
                        self.points[(v, m)] = self.last_point
            case IssueHoisted(j):
                n = frag.comms[j]
                k = gmap[j] = self.new_comm(n)
                pt = self.last_point
                for v in n.operands:
                    q = self.point_of(v, m)
                    if q is not None and q > pt:
                        pt = q
                self.hoist[pt[0]].append(Hoisted(pt[1], k))
                self.last_point = pt
                for v in n.results:
                    if v in self.exports:
                        self.points[(v, m)] = pt
            case WaitLocal(j):
                self.steps.append(Wait(gmap[j]))
            case WaitOther(value):
                ck = self.copy_of(value, m)
                k2 = self.pending.pop(ck, None) if ck is not None else None
                if k2 is not None:
                    self.wait(k2)
            case _:
                raise AssertionError(f"not an entry between pieces: {s}")

    # --- sums -----------------------------------------------------------------------------
    def slice_microbatches(self) -> None:
        """The prologue: each batch input sliced into its microbatches."""
        t, M = self.t, self.sched.microbatches
        total = 0.0
        for v in t.local.inputs:
            if str(v.name) in t.batch:
                d = t.batch[str(v.name)]
                shape = list(v.type.shape)
                full = v.type.with_shape(tuple(shape[:d] + [shape[d] * M] + shape[d + 1:]))
                p = _price_slice(self.owner, full, d, shape[d])
                total += p.seconds * M
                self.flops += p.flops * M
                self.kinds[p.kind] += p.seconds * M
        if total > 0:
            self.run(total, "microbatch slices")

    def adds(self, pairs: list[tuple[Any, tuple | None, Any]], label: str) -> None:
        """Price adds in a run: (type, or the gradient summed (``price_sum``), copy key waited
        for first or None, callback(point))."""
        acc = 0.0
        for ty, waitkey, done in pairs:
            if waitkey is not None and waitkey in self.pending:
                if acc > 0:
                    self.run(acc, label)
                    acc = 0.0
                self.wait(self.pending.pop(waitkey))
            if ty is None:
                done(None)
                continue
            p = self.owner.price_sum(ty) if isinstance(ty, Value) else self.owner.price_add(ty)
            acc += p.seconds
            self.flops += p.flops
            self.kinds[p.kind] += p.seconds
            done((len(self.steps), acc))
        if acc > 0:
            self.run(acc, label)

    def chunk_adds(self, c: int) -> ChunkAdds:
        """Chunk ``c``'s gradient sums, priced once."""
        got = self.chunk_info.get(c)
        if got is None:
            gs = self.t.chunk_grads.get(c, [])
            offs, tot, fl = [], 0.0, 0.0
            kinds: dict[str, float] = defaultdict(float)
            for _, gv in gs:
                p = self.owner.price_sum(gv)
                tot += p.seconds
                fl += p.flops
                kinds[p.kind] += p.seconds
                offs.append(tot)
            comm_grads = [gv for _, gv in gs if gv.producer is not None and _is_comm(gv.producer)]
            got = self.chunk_info[c] = ChunkAdds(gs, offs, tot, fl, dict(kinds), comm_grads)
        return got

    def accumulate(self, c: int, m: int) -> None:
        """Add chunk ``c``'s gradients of microbatch ``m`` to their sums (the first one of each
        param is its sum)."""
        ca = self.chunk_adds(c)
        fast = c in self.last_acc and not any((gv, m) in self.pending for gv in ca.comm_grads)
        if fast:
            # Every gradient of the chunk has a sum already: one add each, one run.
            if ca.seconds > 0:
                self.last_acc[c] = (len(self.steps), m)
                self.run(ca.seconds, f"gradient sums of chunk {c}, microbatch {m}")
                self.flops += ca.flops
                for kk, x in ca.kinds.items():
                    self.kinds[kk] += x
            return
        pairs: list[tuple[Any, tuple | None, Any]] = []
        for nm, gv in ca.grads:
            ck = self.copy_of(gv, m)

            def done(pt: Any, nm: str = nm, ck: Any = ck) -> None:
                if pt is None:
                    q = self.points.get(ck) if ck is not None else None
                    if q is not None:
                        self.acc_point[nm] = q
                else:
                    self.acc_point[nm] = pt
            first = nm not in self.acc_set
            self.acc_set.add(nm)
            pairs.append((None if first else gv, ck, done))
        self.adds(pairs, f"gradient sums of chunk {c}, microbatch {m}")
        self.last_acc[c] = (None, m)

    def settle_acc(self) -> None:
        """The point of each param's latest sum, from the chunks' latest adds."""
        for c, (i, m) in self.last_acc.items():
            if i is None:
                continue
            ca = self.chunk_adds(c)
            for (nm, _), off in zip(ca.grads, ca.offsets):
                pt = (i, off)
                if nm not in self.acc_point or self.acc_point[nm] < pt:
                    self.acc_point[nm] = pt

    def sums(self) -> None:
        """Where each gradient sum the once-per-step sections read is ready; the loss shares
        summed."""
        t = self.t
        self.settle_acc()
        for nm, v in t.acc_values.items():
            if nm in self.acc_point:
                self.once_point[v] = self.acc_point[nm]
        if t.loss_share is not None and self.loss_points:
            pairs: list[tuple[Any, tuple | None, Any]] = []
            for i in range(1, len(self.loss_points)):
                def done(pt: Any) -> None:
                    self.once_point[t.loss_share] = pt
                pairs.append((t.loss_share.type, None, done))
            if not pairs:
                self.once_point[t.loss_share] = self.loss_points[0]
            self.adds(pairs, "loss sum")
            self.loss_points[:] = [self.once_point[t.loss_share]]


def _price_slice(b: SectionProgramBuilder, full: Any, d: int, n: int) -> Any:
    key = ("pp-slice", full.shape, full.dtype.name, d, n)
    got = b.cache.get(key)
    if got is None:
        from ..ir.builder import Builder

        g = Graph("priced")
        x = g.add_input("x", full, "input")
        y = Builder(g).slice(x, axis=d, start=0, end=n)
        got = b.cache[key] = b.model.compute_time(y.producer)
    return got


def _label(key: tuple, m: int | None, sched: Any) -> str:
    if key[0] in ("F", "B", "W"):
        return f"{key[0]}{m}" + (f".{key[1] // sched.stages}" if sched.virtual > 1 else "")
    if key[0] in ("send", "recv"):
        return f"{key[0]} {key[1]} {m}"
    return key[0]


__all__ = ["RankProgramBuild", "SectionOrder", "SectionProgramBuilder", "section_order"]
