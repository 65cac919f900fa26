"""Memory over the step of a pipeline rank built with ``unroll=False``, from its one-microbatch
template, without unrolling it.

A rank's program is its template copied section by section in schedule order
(``partita/parallel/pipeline/local_unroll.py``, ``unroll_local``): the batch inputs sliced
into microbatches, each schedule action's sections (``F``, ``B``, ``W``, the transfers) once
per microbatch, the gradient sums, the once-per-step sections (``tied``, ``loss``, ``final``,
``opt``, ``tail``) and the microbatches' outputs put back together. ``template_live_bytes``
walks that program as ``memory_report.live_bytes`` walks an unrolled one (the same order,
lifetimes, views, constants and categories), without making it:

- a microbatch section's copy is priced once per *profile*: the section, which of the values
  it reads from other sections' copies are last read there (freed there), which of its own
  results are read later (they stay live) and which are gradient buffers; a copy with a
  profile seen before costs a few dict look-ups, so a 512-microbatch schedule walks in about
  the time of its schedule, not of its ``M x`` template;
- the once-per-step sections, the gradient sums and the slices are walked node by node.

The activations of a microbatch stay live from its forward to its backward: they are the
forward's results its backward reads, freed at their last reader. The walk gives, for the
program ``unroll_local`` would make, exactly what ``live_bytes`` gives
(``tests/view/test_template_memory.py`` checks each node). The program ``parallelize``
unrolls (``unroll=True``) differs only by the passes run after the unroll
(``order_collectives`` moves each collective to just after what it needs; the gradient
buckets of the once-per-step sections): docs/view.md gives the difference measured.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..ir.graph import Node, Value
from ..ops.kinds import UPDATE_OPS, VIEW_OPS
from ..ops.registry import OPS
from ..parallel.pipeline.build import MB_AXIS
from ..parallel.pipeline.local_unroll import ONCE_SECTIONS
from .memory_report import COMM_OPS, GRAD_PATH, MemoryReport

# Categories, in the order of a walk's live tuple.
ACT, COMM, GRAD = 0, 1, 2
LIVE_NAMES = ("activations and temporaries", "communication", "gradients")
END = (1 << 62, False)       # the last read of an output: never freed


def root_of(v: Value) -> Value:
    """The value whose buffer ``v`` shares (through views), as ``live_bytes`` roots it."""
    while v.producer is not None and v.producer.op in VIEW_OPS and v.producer.operands:
        v = v.producer.operands[0]
    return v


def is_constant(n: Node) -> bool:
    """A node the runtime computes once (no operands, one result, no effect)."""
    return not n.operands and len(n.results) == 1 and not OPS[n.op].effects_of(n.attrs)


@dataclass
class Section:
    """One microbatch section of a template, as its copies are walked (see the module
    docstring): per node its kind, the values it reads from outside the section (their
    roots, with the offset of their last read here) and the results that may be read later."""

    key: tuple
    nodes: list[Node]
    incoming: dict[Value, int] = field(default_factory=dict)    # outside root -> last offset read here
    inside_last: dict[Value, int] = field(default_factory=dict)  # own result -> last offset read here
    boundary: list[Value] = field(default_factory=list)        # own results read outside (or outputs)
    values: set[Value] = field(default_factory=set)            # every value it allocates or reads
    kept: list[tuple[Value, int, bool]] = field(default_factory=list)  # boundary: (value, bytes, communication?)


class TemplateWalk:
    """The walk of one ``LocalTemplate`` (``partita/parallel/pipeline/local_unroll.py``);
    ``ordered``: each section's nodes in the order ``order_collectives(keep_order=True)``
    gives them in the unrolled program (``parallelize`` orders a pipeline's collectives when
    the stages have another mesh axis), else in the template's (``unroll_local``'s)."""

    def __init__(self, t: Any, ordered: bool = False) -> None:
        self.t = t
        self.M: int = t.sched.microbatches
        self.sec: dict[Node, tuple] = t.sections
        self.nodes = list(t.local.nodes)
        self.batch_inputs = {v for v in t.local.inputs if str(v.name) in t.batch}
        # Ordered and unsplit, a W section follows its B section and its weight gradients move
        # into it (collective_order.overlap_linear_backward): the two are one section.
        self.merged = ordered and not t.sched.split
        by: dict[tuple, list[Node]] = {}
        for n in self.nodes:
            by.setdefault(self.key_of(n), []).append(n)
        if ordered:
            # Each section in the order order_collectives(keep_order=True) gives its copies.
            from ..parallel.collective_order import kept_order

            by = {k: kept_order(ns, not t.sched.split).nodes for k, ns in by.items()}
        self.by_key = by
        self.special = self.special_roots()
        self.chunk_grads = {c: [(nm, gv, gv.type.nbytes, self.grad_root(gv)) for nm, gv in gs]
                            for c, gs in t.chunk_grads.items()}
        self.sections = {k: self.section(k, ns) for k, ns in by.items() if k[0] not in ONCE_SECTIONS}
        self.profiles: dict[tuple, Profile] = {}
        self.grad_bytes = 0
        self.program: list[tuple] = []

    # --- the template, statically -----------------------------------------------------------
    def key_of(self, n: Node) -> tuple:
        """The section node ``n`` is walked in."""
        k = self.sec[n]
        return ("B", k[1]) if self.merged and k[0] == "W" else k

    def special_roots(self) -> set[Value]:
        """Roots read outside the sections' nodes: the gradient sums' operands, the loss
        shares, the program's outputs."""
        t = self.t
        out = {root_of(gv) for gs in t.chunk_grads.values() for _, gv in gs}
        out |= {root_of(v) for v in t.acc_values.values()}
        if t.loss_share is not None:
            out.add(root_of(t.loss_share))
        out |= {root_of(v) for v in t.local.outputs}
        return out

    def grad_root(self, gv: Value) -> Value | None:
        """The template value whose copies hold a gradient's buffer (None: not a buffer the
        walk counts: an input's or a constant's)."""
        r = root_of(gv)
        if r.producer is None:
            return r if r in self.batch_inputs and self.M > 1 else None
        return None if is_constant(r.producer) else r

    def section(self, key: tuple, nodes: list[Node]) -> Section:
        """What the copies of microbatch section ``key`` read, free and keep (``Section``)."""
        s = Section(key, nodes)
        own = set(nodes)
        outside_read: set[Value] = set()
        for n in self.nodes:
            if n in own:
                continue
            for o in n.operands:
                r = root_of(o)
                if r.producer in own:
                    outside_read.add(r)
        for i, n in enumerate(nodes):
            for o in n.operands:
                r = root_of(o)
                if r.producer is not None and is_constant(r.producer):
                    continue            # a constant: counted for the whole step, never freed
                if r.producer in own:
                    s.inside_last[r] = i
                elif r.producer is not None or (r in self.batch_inputs and self.M > 1):
                    s.incoming[r] = i
            if n.op in VIEW_OPS or is_constant(n):
                continue
            for r in n.results:
                s.inside_last.setdefault(r, i)
                if r in outside_read or r in self.special:
                    s.boundary.append(r)
        s.values = set(s.incoming) | {r for n in nodes for r in n.results}
        s.kept = [(r, r.type.nbytes, r.producer is not None and r.producer.op in COMM_OPS) for r in s.boundary]
        return s

    # --- the virtual program --------------------------------------------------------------
    def items(self) -> Iterator[tuple]:
        """The unrolled program's pieces in order (``unroll_local``'s): ``("block", section,
        m)`` for a microbatch section's copy, else ``("node", op, reads, results, attrs,
        view_source, send_bytes, template_node)`` for one node (reads and results are copy
        keys; a read None is an input)."""
        t, M = self.t, self.M
        st = self.state = _UnrollState(self)
        for v in t.local.inputs:
            if v in self.batch_inputs and M > 1:
                for m in range(M):
                    yield ("node", "slice", [None], [((v, m), v.type.nbytes)], {}, None, 0, None)
        split = t.sched.split
        tied_done = False
        from ..parallel.pipeline.schedule import Action

        for it in t.items:
            if isinstance(it, Action):
                c, m = it.chunk, it.mb
                if it.kind == "F":
                    yield from self.copy(st, ("F", c), m)
                    if t.loss_share is not None and c == t.sched.chunks - 1:
                        st.loss_parts.append(self.mb_key(t.loss_share, m))
                elif it.kind == "B":
                    yield from self.copy(st, ("B", c), m)
                    if not split:
                        yield from self.copy(st, ("W", c), m)
                        yield from st.accumulate(c, m)
                else:
                    yield from self.copy(st, ("W", c), m)
                    yield from st.accumulate(c, m)
                continue
            if it.what == "tied":
                if not tied_done:
                    yield from st.sums()
                    yield from self.copy(st, ("tied",), None)
                    tied_done = True
                continue
            if it.src == it.dst:
                continue
            assert it.after is not None
            side = "send" if it.src == t.rank else "recv"
            yield from self.copy(st, (side, it.what, it.after.chunk), it.after.mb)
        yield from st.sums()
        for key in (("loss",), ("final",), ("opt",), ("tail",)):
            yield from self.copy(st, key, None)
        yield from st.finish()

    def copy(self, st: "_UnrollState", key: tuple, m: int | None) -> Iterator[tuple]:
        """The copy of section ``key`` for microbatch ``m`` (None: once per step)."""
        if key not in self.by_key:
            return
        if m is not None:
            st.last_m[key] = m
            yield ("block", self.sections[key], m)
            return
        for n in self.by_key[key]:
            yield from self.copy_once(st, n)

    def copy_once(self, st: "_UnrollState", n: Node) -> Iterator[tuple]:
        """Node ``n`` of a once-per-step section, after the nodes of later once-per-step
        sections it reads (a template whose gradient buckets stand in the section before
        their members' reshapes: ``unroll_local`` refuses it; here they are pulled forward)."""
        if n in st.done_once:
            return
        st.done_once.add(n)
        for o in n.operands:
            p = o.producer
            if p is not None and p not in st.done_once and self.key_of(p)[0] in ONCE_SECTIONS:
                yield from self.copy_once(st, p)
        res = [((r, None), r.type.nbytes) for r in n.results]
        reads = [st.once_key(o) for o in n.operands]
        send = n.operands[0].type.nbytes if n.op == "send" and n.operands else 0
        yield ("node", n.op, reads, res, n.attrs, reads[0] if n.op in VIEW_OPS and reads else None, send, n)
        for r in n.results:
            st.made_once.add(r)

    def mb_key(self, u: Value, m: int) -> tuple | None:
        """The key of microbatch ``m``'s copy of template value ``u`` (None: an input)."""
        if u.producer is None:
            return (u, m) if u in self.batch_inputs and self.M > 1 else None
        return (u, m)


    # --- the two passes ---------------------------------------------------------------------
    def root(self, k: tuple | None, views: dict[tuple, tuple | None]) -> tuple | None:
        """The key of the buffer copy ``k`` shares (None: an input's)."""
        if k is None:
            return None
        if k in views:
            return views[k]
        u, m = k[0], k[1]
        if isinstance(u, Value) and isinstance(m, int):
            ru = root_of(u)
            return k if ru is u else self.mb_key(ru, m)
        return k

    def reads(self) -> tuple[dict[tuple, tuple[int, bool]], dict[tuple, tuple | None], set[tuple], "_UnrollState", int]:
        """The first pass: where each buffer is read last (position, whether in a section
        copy), the views' roots, the gradient buffers, the outputs; and the node count."""
        last: dict[tuple, tuple[int, bool]] = {}
        views: dict[tuple, tuple | None] = {}
        made: dict[tuple, list] = {}
        sizes: dict[tuple, int] = {}
        grads: set[tuple] = set()
        pos = 0
        self.program = list(self.items())      # walked again by ``walk``
        for item in self.program:
            if item[0] == "block":
                sect, m = item[1], item[2]
                for r, lo in sect.incoming.items():
                    last[(r, m)] = (pos + lo, True)
                pos += len(sect.nodes)
                continue
            if item[0] == "adds":
                for k, pr, vr, size in item[1]:
                    here = (pos, False)
                    if pr is not None:
                        last[pr] = here
                    if vr is not None:
                        last[vr] = here
                    sizes[k] = size
                    pos += 1
                continue
            _, op, reads, results, attrs, src, _send, _n = item
            for k in reads:
                rk = self.root(k, views)
                if rk is not None:
                    last[rk] = (pos, False)
            if src is not None or op in VIEW_OPS:
                for k, _ in results:
                    views[k] = self.root(src, views)
            for k, size in results:
                made[k] = reads
                sizes[k] = size
            if op in UPDATE_OPS and len(reads) >= 2 and _n is not None:
                gk = self.grad_buffer(reads[1], _n.operands[1], made)
                if gk is not None:
                    grads.add(gk)
            pos += 1
        st = self.state
        for k in st.outputs:
            rk = self.root(k, views)
            if rk is not None:
                last[rk] = END
        self.grad_bytes = sum(sizes[k] if k in sizes else k[0].type.nbytes for k in grads)
        return last, views, grads, st, pos

    def grad_buffer(self, k: tuple | None, v: Value, made: dict[tuple, list]) -> tuple | None:
        """``gradient_buffers``' walk from an update's gradient operand (copy ``k`` of
        template value ``v``) back through casts, reshapes, slices and scalings."""
        while k is not None and isinstance(k[0], Value) and v.producer is not None and \
                v.producer.op in GRAD_PATH and v.producer.op not in COMM_OPS and v.producer.operands:
            p = v.producer
            j = max(range(len(p.operands)), key=lambda i: p.operands[i].type.numel)
            m = k[1]
            if isinstance(m, int) and isinstance(k[0], Value):
                k, v = self.mb_key(p.operands[j], m), p.operands[j]
            elif k in made:
                k, v = made[k][j], p.operands[j]
            else:
                break
        return k


    def walk(self, every_node: bool = False) -> "TemplateCurve":
        """The live bytes after each node that allocates, as ``live_bytes`` yields them;
        ``every_node`` False keeps of each section copy its highest and lowest points only
        (the peak is exact either way). The walk makes many small tuples and frees none: the
        cyclic garbage collector, which would scan the whole heap (a big plan's programs)
        again and again, is paused meanwhile."""
        paused = gc.isenabled()
        gc.disable()
        try:
            return self.passes(every_node)
        finally:
            if paused:
                gc.enable()

    def passes(self, every_node: bool) -> "TemplateCurve":
        """The first pass (``reads``), then the second: the live bytes after each node (``walk``)."""
        last, views, grads, st, n_total = self.reads()
        outputs = set(st.outputs)
        aliased = st.aliased
        grads_mb: dict[int, set[Value]] = {}
        for k in grads:
            if k is not None and isinstance(k[0], Value) and isinstance(k[1], int):
                grads_mb.setdefault(k[1], set()).add(k[0])
        aliased_mb = {k for k in aliased if isinstance(k[0], Value) and isinstance(k[1], int)}
        out = TemplateCurve(n_total)
        out.grad_bytes = self.grad_bytes
        emit = out.add if every_node else out.add_run
        live = [0, 0, 0]
        consts = 0
        frees: dict[int, list[tuple[int, int]]] = {}
        pos = 0
        for item in self.program:
            if item[0] == "block":
                sect, m = item[1], item[2]
                F = frozenset(r for r, lo in sect.incoming.items() if last.get((r, m)) == (pos + lo, True))
                E = []
                for r, size, comm in sect.kept:
                    fp = last.get((r, m))
                    if fp is None:
                        continue
                    E.append(r)
                    if not fp[1]:
                        cat = GRAD if (r, m) in grads else COMM if comm else ACT
                        frees.setdefault(fp[0], []).append((cat, size))
                G = frozenset(grads_mb[m] & sect.values) if m in grads_mb else frozenset()
                A = frozenset(r for r in sect.boundary if (r, m) in aliased_mb) if aliased_mb else frozenset()
                prof = self.profile(sect, F, frozenset(E), G, A)
                out.flush()
                pts = prof.points if every_node else prof.extremes
                for o, dc, dl in pts:
                    out.add(pos + o, consts + dc, live[0] + dl[0], live[1] + dl[1], live[2] + dl[2], (sect, m, o))
                consts += prof.end_consts
                for c in range(3):
                    live[c] += prof.end_live[c]
                pos += len(sect.nodes)
                continue
            if item[0] == "adds":
                for k, _, _, size in item[1]:
                    cat = GRAD if k in grads else ACT
                    live[cat] += size
                    fp = last.get(k)
                    if fp is None or fp[0] <= pos:
                        frees.setdefault(pos, []).append((cat, size))
                    elif not fp[1]:
                        frees.setdefault(fp[0], []).append((cat, size))
                    emit(pos, consts, live[0], live[1], live[2], (None, "add", k))
                    for cat, size in frees.pop(pos, ()):
                        live[cat] -= size
                    pos += 1
                continue
            _, op, reads, results, attrs, src, send, tn = item
            if not reads and len(results) == 1 and not OPS[op].effects_of(attrs) and results[0][0] not in outputs:
                consts += results[0][1]
                pos += 1
                continue
            if op in VIEW_OPS:
                pos += 1
                continue
            for k, size in results:
                if k in aliased:
                    continue
                cat = GRAD if k in grads else COMM if op in COMM_OPS else ACT
                live[cat] += size
                fp = last.get(k)
                if fp is None or fp[0] <= pos:
                    frees.setdefault(pos, []).append((cat, size))
                elif not fp[1]:
                    frees.setdefault(fp[0], []).append((cat, size))
            if send:
                live[COMM] += send
                frees.setdefault(pos, []).append((COMM, send))
            emit(pos, consts, live[0], live[1], live[2], (tn, op, results[0][0] if results else None))
            for cat, size in frees.pop(pos, ()):
                live[cat] -= size
            pos += 1
        out.flush()
        out.total_consts = consts
        return out

    def profile(self, sect: Section, F: frozenset, E: frozenset, G: frozenset, A: frozenset) -> "Profile":
        """A copy of ``sect`` walked alone: its points' deltas from the live bytes before it
        (``F``: outside values freed at their last read here; ``E``: own results read after
        it; ``G``: gradient buffers; ``A``: results written into donated inputs)."""
        key = (sect.key, F, E, G, A)
        got = self.profiles.get(key)
        if got is not None:
            return got
        dl = [0, 0, 0]
        dc = 0
        pts: list[tuple[int, int, tuple[int, int, int]]] = []
        free_at: dict[int, list[tuple[int, int]]] = {}
        for r in F:
            cat = GRAD if r in G else COMM if r.producer is not None and r.producer.op in COMM_OPS else ACT
            free_at.setdefault(sect.incoming[r], []).append((cat, r.type.nbytes))
        for i, n in enumerate(sect.nodes):
            if is_constant(n) or (n.op == "axis_index" and n.attrs.get("axis") == MB_AXIS):
                dc += n.results[0].type.nbytes
                continue
            if n.op in VIEW_OPS:
                continue
            for r in n.results:
                if r in A:
                    continue
                cat = GRAD if r in G else COMM if n.op in COMM_OPS else ACT
                dl[cat] += r.type.nbytes
                if r not in E:
                    free_at.setdefault(max(sect.inside_last.get(r, i), i), []).append((cat, r.type.nbytes))
            if n.op == "send" and n.operands:
                dl[COMM] += n.operands[0].type.nbytes
                free_at.setdefault(i, []).append((COMM, n.operands[0].type.nbytes))
            pts.append((i, dc, (dl[0], dl[1], dl[2])))
            for cat, size in free_at.pop(i, ()):
                dl[cat] -= size
        got = self.profiles[key] = Profile(pts, dc, (dl[0], dl[1], dl[2]))
        return got


@dataclass
class Profile:
    """One section copy's points (offset, constants' bytes, live bytes by category), as deltas
    from the bytes live before it, and its deltas at its end."""

    points: list[tuple[int, int, tuple[int, int, int]]]
    end_consts: int
    end_live: tuple[int, int, int]
    extremes: list[tuple[int, int, tuple[int, int, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.points:
            tot = [p[1] + sum(p[2]) for p in self.points]
            hi = max(range(len(tot)), key=tot.__getitem__)
            lo = min(range(len(tot)), key=tot.__getitem__)
            self.extremes = [self.points[i] for i in sorted({hi, lo})]


class TemplateCurve:
    """A walk's points: node index, constants' bytes and live bytes by category, and what
    each point is (a section copy's node, or a node of its own)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.total_consts = 0     # the constants' bytes at the end (all of them)
        self.hi: tuple[int, tuple] | None = None
        self.lo: tuple[int, tuple] | None = None
        self.grad_bytes = 0       # the gradient buffers' bytes
        self.x: list[int] = []
        self.consts: list[int] = []
        self.act: list[int] = []
        self.comm: list[int] = []
        self.grads: list[int] = []
        self.what: list[tuple] = []

    def add_run(self, x: int, c: int, a: int, co: int, g: int, what: tuple) -> None:
        """A point of a run of nodes walked one by one, of which only the highest and the
        lowest are kept (``flush``)."""
        tot = c + a + co + g
        p = (x, c, a, co, g, what)
        if self.hi is None or tot > self.hi[0]:
            self.hi = (tot, p)
        if self.lo is None or tot < self.lo[0]:
            self.lo = (tot, p)

    def flush(self) -> None:
        """Keep the current run's highest and lowest points."""
        if self.hi is not None and self.lo is not None:
            pts = sorted({self.hi[1][0]: self.hi[1], self.lo[1][0]: self.lo[1]}.items())
            for _, p in pts:
                self.add(*p)
        self.hi = self.lo = None

    def add(self, x: int, c: int, a: int, co: int, g: int, what: tuple) -> None:
        self.x.append(x)
        self.consts.append(c)
        self.act.append(a)
        self.comm.append(co)
        self.grads.append(g)
        self.what.append(what)

    def where(self, k: int) -> tuple[str, str]:
        """Point ``k`` as a report names a node (``%name = op``, the microbatch) and its scope."""
        what = self.what[k]
        if isinstance(what[0], Section):
            sect, m, o = what
            n = sect.nodes[o]
            name = n.results[0].name if n.results and n.results[0].name else ""
            name = str(name).replace("MB", str(m))
            s = f"%{name} = {n.op}" if name else n.op
            return f"{s} ({'/'.join(map(str, sect.key))}, microbatch {m})", (n.loc.scope if n.loc is not None else "")
        tn, op, _ = what
        if tn is not None:
            name = tn.results[0].name if tn.results and tn.results[0].name else ""
            return (f"%{name} = {op}" if name else op), (tn.loc.scope if tn.loc is not None else "")
        return op, ""



class _UnrollState:
    """What ``unroll_local`` keeps while it copies: the gradient sums so far, the loss shares,
    the last copy of each section, the once-per-step values made."""

    def __init__(self, w: TemplateWalk) -> None:
        self.w = w
        self.acc: dict[str, tuple | None] = {}
        self.acc_root: dict[str, tuple | None] = {}
        self.once: dict[Value, tuple | None] = {}
        self.loss_parts: list[tuple | None] = []
        self.last_m: dict[tuple, int] = {}
        self.made_once: set[Value] = set()
        self.done_once: set[Node] = set()
        self.fresh = 0

    def new_key(self, what: str) -> tuple:
        self.fresh += 1
        return (what, self.fresh)

    def mb_value(self, v: Value, m: int) -> tuple | None:
        """Microbatch ``m``'s copy of ``v`` as a key (it may be a view: roots come later)."""
        return self.w.mb_key(v, m)

    def once_key(self, v: Value) -> tuple | None:
        """The copy of template value ``v`` a once-per-step section reads (``lookup(v, None)``)."""
        if v.producer is None:
            return None
        if v in self.once:
            return self.once[v]
        if v in self.made_once:
            return (v, None)
        m = self.last_m.get(self.w.key_of(v.producer))
        return (v, m) if m is not None else None

    def accumulate(self, c: int, m: int) -> Iterator[tuple]:
        """Chunk ``c``'s gradients of microbatch ``m`` added to their sums: one ``("adds",
        [(result, root of the sum so far, root of the gradient, bytes), ...])`` item (a
        param's first gradient is its sum)."""
        adds = []
        acc, roots = self.acc, self.acc_root
        for nm, gv, size, rg in self.w.chunk_grads.get(c, ()):
            vr = (rg, m) if rg is not None else None
            if nm not in acc:
                acc[nm] = (gv, m)
                roots[nm] = vr
                continue
            self.fresh += 1
            k = ("add", self.fresh)
            adds.append((k, roots[nm], vr, size))
            acc[nm] = roots[nm] = k
        if adds:
            yield ("adds", adds)

    def sums(self) -> Iterator[tuple]:
        t = self.w.t
        for nm, v in t.acc_values.items():
            if nm in self.acc:
                self.once[v] = self.acc[nm]
        if t.loss_share is not None and self.loss_parts:
            total = self.loss_parts[0]
            for x in self.loss_parts[1:]:
                k = self.new_key("add")
                yield ("node", "add", [total, x], [(k, t.loss_share.type.nbytes)], {}, None, 0, None)
                total = k
            self.once[t.loss_share] = total
            self.loss_parts = [total]

    def finish(self) -> Iterator[tuple]:
        """The outputs: each final put back together from its microbatches (a concat), the
        others the once-per-step copies; records ``outputs`` and ``aliased``."""
        t, M = self.w.t, self.w.M
        outs: list[tuple | None] = []
        for v in t.local.outputs:
            fin = next((d for x, d in t.finals if x is v), "none")
            if fin != "none":
                parts = [self.mb_value(v, m) for m in range(M)]
                if M == 1:
                    outs.append(parts[0])
                else:
                    k = self.new_key("concat")
                    yield ("node", "concat", parts, [(k, v.type.nbytes * M)], {}, None, 0, None)
                    outs.append(k)
            else:
                outs.append(self.once_key(v))
        aliases = t.local.output_aliases or [None] * len(outs)
        self.outputs = [k for k in outs if k is not None]
        self.aliased = {k for k, a in zip(outs, aliases) if a is not None and k is not None}


def template_base(t: Any) -> dict[str, int]:
    """Params, optimizer state and batch of the rank's program (each batch input holds every
    microbatch)."""
    M = t.sched.microbatches
    out = {"params": 0, "optimizer state": 0, "batch": 0}
    for v in t.local.inputs:
        size = v.type.nbytes * (M if str(v.name) in t.batch else 1)
        out["params" if v.role == "param" else "optimizer state" if v.role == "state" else "batch"] += size
    return out


def template_memory_report(t: Any, ordered: bool = False) -> MemoryReport:
    """``memory_report`` of the program ``unroll_local`` makes of template ``t`` (``ordered``:
    its collectives ordered as ``parallelize`` orders them), without making it."""
    walk = TemplateWalk(t, ordered)
    c = walk.walk()
    base = template_base(t)
    fixed = sum(base.values())
    peak, at, node = fixed, (0, 0, 0), ""
    for k in range(len(c.x)):
        tot = fixed + c.consts[k] + c.act[k] + c.comm[k] + c.grads[k]
        if tot > peak:
            peak, node, at = tot, c.where(k)[0], (c.act[k], c.comm[k], c.grads[k])
    at_peak = {**base, "constants": c.total_consts, **dict(zip(LIVE_NAMES, at))}
    return MemoryReport(base["params"], c.grad_bytes, base["optimizer state"], base["batch"], peak, at_peak, node)


__all__ = ["template_base", "template_memory_report", "TemplateWalk", "TemplateCurve", "Profile", "root_of", "is_constant", "LIVE_NAMES"]
