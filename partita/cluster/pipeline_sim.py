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
from dataclasses import dataclass, field
from typing import Any, TypeAlias

from ..ir.graph import Graph, Node, Value
from ..ir.mesh import Mesh
from ..parallel.collective_order import grows_when_gathered, is_collective, kept_order
from ..parallel.pipeline.local_unroll import ONCE_SECTIONS
from ..ops.registry import OPS
from .cost import COLLECTIVE_OPS, P2P_OPS, CostModel
from .hardware import Cluster
from .steps import ASYNC_OPS, Comm, Hoisted, Issue, Piece, Program, SectionRun, Step, Wait, attr_key, is_hoisted


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


def section_order(nodes: list[Node]) -> SectionOrder:
    """``nodes`` (one section, template order) in the order ``order_collectives(keep_order=
    True)`` gives their copies in the unrolled program: ``kept_order`` of the section, the
    function that pass calls on the whole program (each collective, ``is_collective``:
    point-to-point transfers are not, hoisted to just after the last node it needs and the
    collective before it, then each all_gather sunk to just before its first reader or the
    next collective). What crosses the section's bounds is returned apart: the collectives
    that need nothing of the section (they go up to the collective before them, in an
    earlier section; an all_gather among them that another such one follows stays there),
    and the all_gathers that sink past the section's end (into a later section, unless the
    next collective is anchored before its section: then they stay at their anchor)."""
    kept = kept_order(nodes)
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


def build_fragment(key: tuple, nodes: list[Node], model: CostModel, cache: dict, outputs: set[Value]) -> _Fragment:
    so = section_order(nodes)
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
        k2 = (n.op, tuple((v.type.shape, v.type.dtype.name) for v in n.operands),
              tuple((v.type.shape, v.type.dtype.name) for v in n.results), attr_key(n.attrs))
        priced = cache.get(k2)
        if priced is None:
            priced = cache[k2] = model.compute_time(n)
        flops += priced.flops
        kinds[priced.kind] += priced.seconds
        entries.append(OpRun(priced.seconds, n))
    return _Fragment(key, entries, comms, list(pending.items()), flops, dict(kinds), so.lead_outside,
                     so.has_collective)


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
                    clock = t
            case _:
                raise AssertionError(f"not an entry of a piece: {e}")
    return _Piece(clock, busy, waiting, tuple(cb.items()), tuple(cbytes.items()), at, last_issue, first)


@dataclass
class _Build:
    """The step list of one simulated rank under construction."""

    steps: list[Step] = field(default_factory=list)
    comms: list[Any] = field(default_factory=list)
    hoist: dict[int, list[Hoisted]] = field(default_factory=lambda: defaultdict(list))
    ordinals: dict[tuple, int] = field(default_factory=lambda: defaultdict(int))
    pending: dict[tuple, int] = field(default_factory=dict)
    points: dict[tuple, tuple[int, float]] = field(default_factory=dict)
    last_point: tuple[int, float] = (0, 0.0)
    flops: float = 0.0
    kinds: dict[str, float] = field(default_factory=lambda: defaultdict(float))


class SectionProgramBuilder:
    """Builds the simulator program (``program.Program``) of a rank of a pipeline built
    with ``unroll=False`` from its ``LocalTemplate``."""

    def __init__(self, mesh: Mesh, cluster: Cluster, model: CostModel, cache: dict) -> None:
        self.mesh, self.cluster, self.model, self.cache = mesh, cluster, model, cache
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
            for n in t.local.nodes:
                by[t.sections[n]].append(n)
            outs = set(t.local.outputs)
            got = self.frags[id(t)] = {k: build_fragment(k, ns, self.model, self.cache, outs) for k, ns in by.items()}
        return got

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

    def build(self, t: Any, rank: int, alone: frozenset[str]) -> Any:
        """The program of global rank ``rank`` (pp rank ``t.rank``); ``alone``: the mesh axes
        on which this rank meets only ranks it stands for."""
        cut, axes = self.variant(t, alone)
        links = tuple((a, self.cluster.link(self.mesh.group_of(rank, a))) for a in sorted(axes))
        pkey = (id(t), axes, links)
        pieces = self.pieces.get(pkey)
        if pieces is None:
            pieces = self.pieces[pkey] = {}
        frags = self.fragments(t)
        exports = self.exports(t)
        B = _Build()
        sched = t.sched
        M = sched.microbatches
        sec_of = t.sections
        last_copy: dict[tuple, int] = {}
        once_point: dict[Value, tuple[int, float]] = {}
        acc_point: dict[str, tuple[int, float]] = {}
        loss_points: list[tuple[int, float]] = []

        def copy_of(v: Value, m: int | None) -> tuple | None:
            """The key of the copy of template value ``v`` read by a section copy ``m``."""
            p = v.producer
            if p is None:
                return None
            ps = sec_of[p]
            if ps[0] in ONCE_SECTIONS:
                return (v, None)
            if m is not None:
                return (v, m)
            c = last_copy.get(ps)
            return (v, c) if c is not None else None

        def point_of(v: Value, m: int | None) -> tuple[int, float] | None:
            if m is None and v in once_point:
                return once_point[v]
            k = copy_of(v, m)
            return B.points.get(k) if k is not None else None

        def new_comm(n: Node) -> int:
            op = n.op
            axis = n.attrs["axis"]
            peer = n.attrs.get("peer") if op in P2P_OPS else None
            okey = (axis, op, peer) if op in P2P_OPS else (axis,)
            c = Comm(n, axis, B.ordinals[okey], op in ASYNC_OPS, peer, op == "send")
            B.ordinals[okey] += 1
            B.comms.append(c)
            return len(B.comms) - 1

        def run(dur: float, label: str) -> None:
            B.steps.append(SectionRun(dur, label))

        deferred: list[int] = []

        def flush(upto: int | None = None, at: tuple[int, float] | None = None) -> None:
            """Issue the deferred all_gathers (all, or up to comm ``upto``): at point ``at``, or
            here (the next collective or the first reader of one has come)."""
            if not deferred:
                return
            n = len(deferred) if upto is None else deferred.index(upto) + 1
            for k in deferred[:n]:
                if at is None:
                    B.steps.append(Issue(k))
                else:
                    B.hoist[at[0]].append(Hoisted(at[1], k))
            del deferred[:n]

        def copy(key: tuple, m: int | None, lead_next: bool | None = None) -> None:
            frag = frags.get(key)
            if frag is None:
                return
            var = cut[key]
            pc = pieces.get(key)
            if pc is None:
                pc = pieces[key] = [price_piece(s, frag.comms, lambda n: self.comm_time(rank, n), exports)
                                    if isinstance(s, list) else None for s in var.segs]
            label = _label(key, m, sched)
            gmap: dict[int, int] = {}
            for s, piece in zip(var.segs, pc):
                if piece is not None:
                    i = len(B.steps)
                    if deferred and piece.first_coll is not None:
                        flush(at=(i, piece.first_coll))
                    B.steps.append(Piece(piece.duration, piece.busy, piece.waiting, piece.comm_busy,
                                         piece.comm_bytes, label))
                    for v, off in piece.at.items():
                        B.points[(v, m)] = (i, off)
                    if piece.last_issue is not None:
                        B.last_point = (i, piece.last_issue)
                    continue
                if deferred and isinstance(s, (IssueHere, IssueHoisted, IssueDeferred)):
                    flush()
                if isinstance(s, IssueDeferred):
                    n = frag.comms[s.j]
                    k = gmap[s.j] = new_comm(n)
                    an = s.anchor
                    pt = B.points.get((an.results[0], m)) if an is not None and an.results else None
                    if pt is None:
                        pt = B.last_point
                    if lead_next:
                        # The next collective is hoisted to just after this one's anchor: it
                        # does not sink.
                        B.hoist[pt[0]].append(Hoisted(pt[1], k))
                    else:
                        deferred.append(k)
                    B.last_point = pt
                elif isinstance(s, IssueHere):
                    n = frag.comms[s.j]
                    k = gmap[s.j] = new_comm(n)
                    B.steps.append(Issue(k))
                    B.last_point = (len(B.steps) - 1, 0.0)
                    for v in n.results:
                        if v in exports:
                            B.points[(v, m)] = B.last_point
                elif isinstance(s, IssueHoisted):
                    n = frag.comms[s.j]
                    k = gmap[s.j] = new_comm(n)
                    pt = B.last_point
                    for v in n.operands:
                        q = point_of(v, m)
                        if q is not None and q > pt:
                            pt = q
                    B.hoist[pt[0]].append(Hoisted(pt[1], k))
                    B.last_point = pt
                    for v in n.results:
                        if v in exports:
                            B.points[(v, m)] = pt
                elif isinstance(s, WaitLocal):
                    B.steps.append(Wait(gmap[s.j]))
                else:
                    assert isinstance(s, WaitOther), s
                    ck = copy_of(s.value, m)
                    k2 = B.pending.pop(ck, None) if ck is not None else None
                    if k2 is not None:
                        if k2 in deferred:
                            flush(k2)
                        B.steps.append(Wait(k2))
            for v, j in frag.leaves:
                B.pending[(v, m)] = gmap[j]
            B.flops += frag.flops
            for kk, x in frag.kinds.items():
                B.kinds[kk] += x
            if m is not None:
                last_copy[key] = m

        def price_add(ty: Any) -> Any:
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

        def adds(pairs: list[tuple[Any, tuple | None, Any]], label: str) -> None:
            """Price adds in a run: (type, copy key waited for first or None, callback(point))."""
            acc = 0.0
            for ty, waitkey, done in pairs:
                if waitkey is not None and waitkey in B.pending:
                    if acc > 0:
                        run(acc, label)
                        acc = 0.0
                    k = B.pending.pop(waitkey)
                    if k in deferred:
                        flush(k)
                    B.steps.append(Wait(k))
                if ty is None:
                    done(None)
                    continue
                p = price_add(ty)
                acc += p.seconds
                B.flops += p.flops
                B.kinds[p.kind] += p.seconds
                done((len(B.steps), acc))
            if acc > 0:
                run(acc, label)

        # The prologue: each batch input sliced into its microbatches.
        if M > 1:
            total = 0.0
            for v in t.local.inputs:
                if str(v.name) in t.batch:
                    d = t.batch[str(v.name)]
                    shape = list(v.type.shape)
                    full = v.type.with_shape(tuple(shape[:d] + [shape[d] * M] + shape[d + 1:]))
                    p = _price_slice(self, full, d, shape[d])
                    total += p.seconds * M
                    B.flops += p.flops * M
                    B.kinds[p.kind] += p.seconds * M
            if total > 0:
                run(total, "microbatch slices")
        acc_set: set[str] = set()
        # Per chunk: its gradients, their adds' total time and each one's end offset in it.
        chunk_info: dict[int, tuple] = {}
        last_acc: dict[int, tuple[int | None, int]] = {}

        def info(c: int) -> tuple:
            got = chunk_info.get(c)
            if got is None:
                gs = t.chunk_grads.get(c, [])
                offs, tot, fl = [], 0.0, 0.0
                kinds: dict[str, float] = defaultdict(float)
                for _, gv in gs:
                    p = price_add(gv.type)
                    tot += p.seconds
                    fl += p.flops
                    kinds[p.kind] += p.seconds
                    offs.append(tot)
                comm_grads = [gv for _, gv in gs if gv.producer is not None and _is_comm(gv.producer)]
                got = chunk_info[c] = (gs, offs, tot, fl, dict(kinds), comm_grads)
            return got

        def accumulate(c: int, m: int) -> None:
            gs, offs, tot, fl, kinds, comm_grads = info(c)
            fast = c in last_acc and not any((gv, m) in B.pending for gv in comm_grads)
            if fast:
                # Every gradient of the chunk has a sum already: one add each, one run.
                if tot > 0:
                    last_acc[c] = (len(B.steps), m)
                    run(tot, f"gradient sums of chunk {c}, microbatch {m}")
                    B.flops += fl
                    for kk, x in kinds.items():
                        B.kinds[kk] += x
                return
            pairs: list[tuple[Any, tuple | None, Any]] = []
            for nm, gv in gs:
                ck = copy_of(gv, m)

                def done(pt: Any, nm: str = nm, ck: Any = ck) -> None:
                    if pt is None:
                        q = B.points.get(ck) if ck is not None else None
                        if q is not None:
                            acc_point[nm] = q
                    else:
                        acc_point[nm] = pt
                first = nm not in acc_set
                acc_set.add(nm)
                pairs.append((None if first else gv.type, ck, done))
            adds(pairs, f"gradient sums of chunk {c}, microbatch {m}")
            last_acc[c] = (None, m)

        def settle_acc() -> None:
            """The point of each param's latest sum, from the chunks' latest adds."""
            for c, (i, m) in last_acc.items():
                if i is None:
                    continue
                gs, offs = info(c)[:2]
                for (nm, _), off in zip(gs, offs):
                    pt = (i, off)
                    if nm not in acc_point or acc_point[nm] < pt:
                        acc_point[nm] = pt

        def sums() -> None:
            settle_acc()
            for nm, v in t.acc_values.items():
                if nm in acc_point:
                    once_point[v] = acc_point[nm]
            if t.loss_share is not None and loss_points:
                pairs: list[tuple[Any, tuple | None, Any]] = []
                for i in range(1, len(loss_points)):
                    def done(pt: Any) -> None:
                        once_point[t.loss_share] = pt
                    pairs.append((t.loss_share.type, None, done))
                if not pairs:
                    once_point[t.loss_share] = loss_points[0]
                adds(pairs, "loss sum")
                loss_points[:] = [once_point[t.loss_share]]

        from ..parallel.pipeline.schedule import Action

        # The unroll's order (local_unroll._Unroll._run), as a plan first: whether the next
        # section with a collective starts with one anchored before it decides where an
        # all_gather at a section's end goes.
        plan: list[tuple] = []
        tied_done = False
        for it in t.items:
            if isinstance(it, Action):
                c, m = it.chunk, it.mb
                if it.kind == "F":
                    plan.append(("copy", ("F", c), m))
                    if t.loss_share is not None and c == sched.chunks - 1:
                        plan.append(("loss", m))
                elif it.kind == "B":
                    plan.append(("copy", ("B", c), m))
                    if not sched.split:
                        plan.append(("copy", ("W", c), m))
                        plan.append(("acc", c, m))
                else:
                    plan.append(("copy", ("W", c), m))
                    plan.append(("acc", c, m))
                continue
            if it.what == "tied":
                if not tied_done:
                    plan.append(("sums",))
                    plan.append(("copy", ("tied",), None))
                    tied_done = True
                continue
            if it.src == it.dst:
                continue
            side = "send" if it.src == t.rank else "recv"
            plan.append(("copy", (side, it.what, it.after.chunk), it.after.mb))
        plan.append(("sums",))
        plan.extend(("copy", key, None) for key in (("loss",), ("final",), ("opt",), ("tail",)))
        lead_next: list[bool | None] = [None] * len(plan)
        nxt: bool | None = None
        for i in range(len(plan) - 1, -1, -1):
            lead_next[i] = nxt
            op = plan[i]
            if op[0] == "copy":
                f = frags.get(op[1])
                if f is not None and f.has_collective:
                    nxt = f.lead_outside
        for op, ln in zip(plan, lead_next):
            if op[0] == "copy":
                copy(op[1], op[2], ln)
            elif op[0] == "acc":
                accumulate(op[1], op[2])
            elif op[0] == "loss":
                q = B.points.get((t.loss_share, op[1]))
                loss_points.append(q if q is not None else (len(B.steps), 0.0))
            else:
                sums()
        flush()
        B.steps.extend(Wait(k) for k in B.pending.values())
        B.steps.extend(Wait(k) for k, c in enumerate(B.comms) if c.sending)
        prog = Program(t.local, B.steps, B.comms, list(t.local.nodes), [], B.flops, dict(B.kinds))
        prog.hoist = {k: v for k, v in B.hoist.items()}
        return prog


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


__all__ = ["SectionProgramBuilder"]
