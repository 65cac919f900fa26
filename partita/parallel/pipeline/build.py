"""From a single-device training step (or forward graph) to one template program per pp
rank: one microbatch through the rank's chunks.

1. ``microbatch_graph``: the step's forward and loss, re-typed for one microbatch (the
   batch inputs split ``M`` ways, by the same propagation and partition that data
   parallelism uses, on a virtual mesh axis ``mb``); the loss becomes the microbatch's share
   (its mean times ``1/M``), so the shares of the ``M`` microbatches sum to the step's loss.
2. ``partition_stages`` cuts it into ``S * v`` chunks; ``build_chunk_program`` derives each
   chunk's backward and splits it into B and W.
3. ``_Unroller`` writes, per pp rank, one graph for one microbatch (``template_schedule``'s
   order): every action of the rank's chunks and every transfer (``send``/``recv`` over the
   ``pp`` axis), the parameter gradients summed over its chunks, the gradients of a weight
   that two stages share swapped between them, and the optimizer update of the rank's
   params; each node marked with its section.

Each template is then an ordinary global graph that the SPMD strategies (dp, zero, megatron,
sp) parallelize over the rest of the mesh, and local_unroll.py copies its local pieces once
per action of the real schedule.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from dataclasses import dataclass, field
from typing import Any, Iterator

from ...ir.builder import Builder
from ...ir.graph import Graph, Node, Value
from ...ir.verifier import verify
from ...ops.registry import OPS
from ...ir.mesh import Mesh
from ...ir.placement import Placement
from ..strategies.base import UPDATE_OPS
from .microbatch_rewrites import index_reason, rewrite_for_microbatches, suspects
from .schedule import Action, PipelineError, Schedule, Transfer
from .chunk_templates import chunk_programs
from .stage_graphs import ChunkProgram
from .stages import StageCut, partition_stages, value_cone

MB_AXIS = "mb"
_DIGITS = re.compile(r"\d+")


@dataclass
class MicrobatchGraph:
    """The forward (and loss share) of one microbatch. ``batch_dim``: per value of ``graph``,
    the dim that holds the microbatch's rows (None: none does); ``full``: the batch inputs'
    names with their whole-batch types."""

    graph: Graph
    batch_dim: dict[Value, int | None]
    loss: Value | None
    outputs: list[Value]
    full: dict[str, Any]


def is_training(graph: Graph) -> bool:
    """Whether ``graph`` is a training step: it updates params (an optimizer update) or
    returns gradients (outputs named ``<param>.grad``)."""
    return any(n.op in UPDATE_OPS for n in graph.nodes) or any(
        v.name and str(v.name).endswith(".grad") for v in graph.outputs[1:])


def forward_of(step: Graph) -> tuple[Graph, bool]:
    """The forward section of ``step``: for a training step (optimizer updates, or ``.grad``
    outputs) the cone of its loss (output 0), else the graph itself. Returns (graph, training)."""
    training = is_training(step)
    g = step.clone()
    if training:
        if not step.outputs or step.outputs[0].type.shape != () or not step.outputs[0].type.dtype.is_float:
            raise PipelineError(f"pipeline: @{step.name} looks like a training step but its output 0 is not a float "
                                "scalar loss; build it with partita.training_step")
        g.set_outputs([g.outputs[0]])
        # The loss's cone, not dce: dce keeps ops with effects, and the backward's dropouts
        # (a seeded dropout replays its mask on the gradient) would drag the backward in.
        keep = value_cone([g.outputs[0]])
        for n in list(g.reversed_nodes()):
            if n not in keep:
                g.erase(n)
        return g, training
    from ...passes.manager import PassManager

    PassManager.parse("dce", verify_each=False).run(g)
    return g, training


def check_microbatches(graph: Graph, microbatches: int) -> None:
    """A PipelineError unless ``microbatches`` divides dim 0 of every batch input (the graph
    inputs of role 'input') of ``graph``."""
    batch = [v for v in graph.inputs if v.role == "input"]
    if not batch:
        raise PipelineError(f"pipeline: @{graph.name} has no 'input'-role graph input (the batch) to split into "
                            "microbatches")
    for v in batch:
        if v.type.rank == 0 or v.type.shape[0] % microbatches:
            n = v.type.shape[0] if v.type.rank else 1
            raise PipelineError(
                f"pipeline: microbatches={microbatches:,} does not divide the batch: %{v.name} {v.type} has {n} rows "
                f"in dim 0; use a number of microbatches that divides {n} (e.g. {_divisors(n)}) or a batch that is a "
                f"multiple of {microbatches:,}")


def microbatch_graph(fwd: Graph, microbatches: int, training: bool) -> MicrobatchGraph:
    """``fwd`` re-typed for one of ``microbatches`` microbatches (see the module docstring).

    Two kinds of value that look as if they mixed microbatches are taken as they are meant:

    - a value computed whole, without the batch rows of any input (a causal mask built from
      shapes, a table broadcast to the batch), that a microbatch's rows read: each microbatch
      takes its own rows of it (``index_select`` at the microbatch's index, which the unroll
      knows);
    - a value computed from the batch inputs alone (no param) that reduces over the whole
      batch, such as the count of labels that are not ignored that a Hugging Face loss divides
      by: each microbatch computes it from the whole batch (``<input>.whole``, the step's
      input itself; the unroll reads the batch input there), so every microbatch's loss share
      is its own sum over that one global count and the shares sum to the step's loss.

    Before either, the reshapes and constant-index gathers that keep each microbatch's rows
    to themselves but that the sharding rules cannot split are rewritten into equivalent ops
    that they can (``microbatch_rewrites``); a gather that still mixes microbatches is refused
    with the reason (an index known only at run time, or a constant one that reads rows of
    other microbatches).
    """
    check_microbatches(fwd, microbatches)
    g = fwd.clone()
    whole: set[Value] = set()
    local, report, part = _partition_microbatches(g, microbatches, whole)
    stray = _stray_collectives(report)
    for _ in range(REWRITE_ROUNDS):
        if not stray or not rewrite_for_microbatches(g, microbatches, _consumers(g, part, stray)):
            break
        local, report, part = _partition_microbatches(g, microbatches, whole)
        stray = _stray_collectives(report)
    if stray:
        mixed = _batch_only_values(g, part, stray)
        if mixed is not None:
            whole = _read_whole_batch(g, mixed)
            local, report, part = _partition_microbatches(g, microbatches, whole)
            stray = _stray_collectives(report)
    if stray:
        c = stray[0]
        why = _gather_reason(g, part, c, microbatches)
        raise PipelineError(
            f"pipeline: {c.consumer}{' at ' + c.source if c.source else ''} mixes the rows of different microbatches "
            f"(it needs %{c.value} {c.have} as {c.want}{'; ' + why if why else ''}); with "
            f"microbatches={microbatches} its result would change "
            "(batch statistics of an activation, an index or a reshape that moves rows across the batch, a "
            "reduction over the batch that reads a param). Use microbatches=1, or a model whose rows are "
            "independent until the loss")
    _slices_at_the_microbatch(local)
    outputs = []
    for v in local.outputs:
        prod = v.producer
        while prod is not None and OPS[prod.op].collective is not None:
            v = prod.operands[0]
            prod = v.producer
        outputs.append(v)
    local.set_outputs(outputs)
    from ...passes.manager import PassManager

    PassManager.parse("dce", verify_each=False).run(local)
    inv = {lv: gv for gv, lv in part.vmap.items()}
    batch_dim: dict[Value, int | None] = {}
    for lv in local.values():
        gv = inv.get(lv)
        p = gv.placement if gv is not None else None
        d = None
        if p is not None:
            for i, axes in enumerate(p.dims):
                if MB_AXIS in axes:
                    d = i
        batch_dim[lv] = d
    full = {str(v.name): v.type for v in fwd.inputs if v.role == "input"}
    loss = local.outputs[0] if training else None
    return MicrobatchGraph(local, batch_dim, loss, list(local.outputs), full)


WHOLE_SUFFIX = ".whole"
# The rounds of exact rewrites (microbatch_rewrites) before the microbatch analysis gives up:
# each may uncover the next regrouping reshape of a chain.
REWRITE_ROUNDS = 8


def _gather_reason(g: Graph, part: Any, c: Any, microbatches: int) -> str | None:
    """Why the gather that the stray collective ``c`` feeds, or that made the value it moves,
    mixes microbatches (microbatch_rewrites.index_reason); None when no gather is involved."""
    for node in _consumers(g, part, [c]):
        for n in [node] + suspects(x for x in node.operands if part.name(x) == c.value):
            why = index_reason(n, microbatches, part.name)
            if why is not None:
                return f"{part.describe(n)}: {why}" if n is not node else why
    return None


def _consumers(g: Graph, part: Any, stray: list) -> list[Node]:
    """The nodes of ``g`` that the ``stray`` collectives feed (by the partition's description)."""
    wanted = {c.consumer for c in stray}
    return [n for n in g.nodes if part.describe(n) in wanted]


def _partition_microbatches(g: Graph, microbatches: int, whole: set[Value]) -> tuple[Graph, Any, Any]:
    """``g`` partitioned over a virtual ``mb`` axis: its batch inputs split in dim 0, the
    ``whole`` ones (whole-batch copies) and the params replicated. (local, report, partitioner)."""
    from ..partition import Partitioner
    from ..propagate import propagate

    mesh = Mesh.of({MB_AXIS: microbatches})
    g.mesh = mesh
    for v in g.values():
        v.placement = None
    for v in g.inputs:
        v.placement = Placement.split(v.type.rank, {0: MB_AXIS}) if v.role == "input" and v not in whole else \
            Placement.replicated(v.type.rank)
    prop = propagate(g)
    part = Partitioner(g, prop.reshards)
    local, report = part.run()
    return local, report, part


def _stray_collectives(report: Any) -> list:
    """The collectives over the microbatches that are neither for an output (the loss's sum
    over the microbatches) nor a microbatch taking its rows of a whole value (``shard_slice``)."""
    return [c for c in report.collectives if not c.consumer.startswith("output")
            and not (c.op == "shard_slice" and c.axis == MB_AXIS)]


def _batch_only_values(g: Graph, part: Any, stray: list) -> list[Value] | None:
    """The values of ``g`` the ``stray`` collectives move, if every one of them is computed
    from batch inputs and constants alone (no param or state, no random op); else None."""
    by_name = {part.name(v): v for v in g.values()}
    values = []
    for c in stray:
        v = by_name.get(c.value)
        if v is None:
            return None
        if v.is_input:
            return None
        for n in value_cone([v]):
            if OPS[n.op].effects_of(n.attrs):
                return None
            if any(x.is_input and x.role != "input" for x in n.operands):
                return None
        if v not in values:
            values.append(v)
    return values


def _read_whole_batch(g: Graph, values: list[Value]) -> set[Value]:
    """Recompute ``values`` (batch-only, see ``_batch_only_values``) from whole-batch copies of
    the batch inputs they read: new inputs ``<name>.whole`` of the same type, which the
    partition keeps whole (replicated over the microbatches) and the unroll maps to the step's
    batch input itself. Returns the new inputs."""
    cone = value_cone(values)
    order = [n for n in g.nodes if n in cone]
    copies: dict[Value, Value] = {}
    whole: set[Value] = set()
    for n in order:
        for x in n.operands:
            if x.is_input and x not in copies:
                w = g.add_input(str(x.name) + WHOLE_SUFFIX, x.type, "input")
                copies[x] = w
                whole.add(w)
    b = Builder(g)
    if order:
        b.set_insertion_before(order[0])
    _Unroller._copy(b, order, copies)
    for v in values:
        g.replace_all_uses(v, copies[v])
    from ...passes.manager import PassManager

    PassManager.parse("dce", verify_each=False).run(g)
    verify(g)
    return whole


def _slices_at_the_microbatch(local: Graph) -> None:
    """Each ``shard_slice`` over the microbatches (a microbatch taking its rows of a whole
    value) as ``index_select`` of rows ``[m*n, (m+1)*n)``, m the microbatch's index
    (``axis_index`` over ``mb``, which the unroll replaces by each copy's m)."""
    from ...ir.dtypes import i64

    for node in [n for n in local.nodes if n.op == "shard_slice" and n.attrs.get("axis") == MB_AXIS]:
        x, d = node.operands[0], int(node.attrs["dim"])
        out = node.results[0]
        n = out.type.shape[d]
        b = Builder(local, loc=node.loc)
        b.set_insertion_before(node)
        m = b.emit_node("axis_index", [], {"axis": MB_AXIS, "group_size": int(node.attrs["group_size"])}).results[0]
        start = b.emit_node("mul", [m, b.emit_node("full", [], {"shape": (), "value": n, "dtype": i64}).results[0]],
                            {}).results[0]
        rows = b.emit_node("add", [b.emit_node("iota", [], {"shape": (n,), "axis": 0, "dtype": i64}).results[0],
                                   start], {}).results[0]
        picked = b.emit_node("index_select", [x, rows], {"axis": d}).results[0]
        local.replace_all_uses(out, picked)
        local.erase(node)


def _divisors(n: int) -> str:
    ds = [d for d in range(1, n + 1) if n % d == 0]
    return ", ".join(map(str, ds[:8])) + (", ..." if len(ds) > 8 else "")


@dataclass
class RankProgram:
    """One pp rank's global-shaped program and what it returns: ``outputs[i]`` is the step's
    output ``source_index[i]`` (None: an output only this pipeline has); ``boundary``:
    placements the SPMD strategies must give the values that cross between ranks, as
    (value, batch dim or None)."""

    rank: int
    graph: Graph
    source_index: list[int | None]
    boundary: list[tuple[Value, int | None]] = field(default_factory=list)
    tied_values: list[Value] = field(default_factory=list)
    # The program is a template (one microbatch, unrolled on the per-rank program by
    # local_unroll): each node's section, the param gradients each chunk's W adds up (in
    # order), the values the microbatches' sums replace, and the outputs to put back together.
    sections: dict[Node, tuple] = field(default_factory=dict)
    chunk_grads: dict[int, list[tuple[str, Value]]] = field(default_factory=dict)
    acc_values: dict[str, Value] = field(default_factory=dict)
    loss_share: Value | None = None
    finals: list[tuple[Value, int | None]] = field(default_factory=list)


@dataclass
class Pipeline:
    """Everything ``unroll`` made: the cut, the chunk programs, the schedule, each rank's
    program, and the params two ranks share."""

    cut: StageCut
    chunks: list[ChunkProgram]
    schedule: Schedule
    ranks: list[RankProgram]
    tied: list[str]
    micro: MicrobatchGraph
    training: bool
    owners: dict[str, list[int]]
    # With ``distinct=True``: the pp ranks not built (rank -> the built rank alike but for
    # names, whose template the driver copies); ``ranks`` then holds the built ranks only.
    alike: dict[int, int] = field(default_factory=dict)


class _Unroller:
    def __init__(self, step: Graph, mbg: MicrobatchGraph, cut: StageCut, chunks: list[ChunkProgram],
                 schedule: Schedule, training: bool, axis: str, digests: list[tuple] | None = None) -> None:
        self.step = step
        self.digests = digests or []
        self.mbg = mbg
        self.cut = cut
        self.chunks = chunks
        self.s = schedule
        self.training = training
        self.axis = axis
        S = schedule.stages
        self.owners: dict[str, list[int]] = {}
        for cp in chunks:
            r = schedule.rank_of(cp.index)
            for name in cp.params:
                if r not in self.owners.setdefault(name, []):
                    self.owners[name].append(r)
        # A trained param that no chunk reads (DINOv2's mask token, unused without masked
        # positions) still has its update (AdamW's weight decay moves it): the last stage runs
        # it, with a zero gradient.
        updated = {str(n.operands[0].name).removesuffix(".master") for n in step.nodes if n.op in UPDATE_OPS}
        last = schedule.rank_of(len(chunks) - 1)
        for v in step.inputs:
            if v.role == "param" and str(v.name) in updated and str(v.name) not in self.owners:
                self.owners[str(v.name)] = [last]
        # Only a trainable param read on two ranks is shared (its gradients are summed); a
        # buffer (role "state") that several stages read is an input of each.
        roles = {str(v.name): v.role for v in step.inputs}
        self.tied = sorted(n for n, rs in self.owners.items() if len(rs) > 1 and roles.get(n) == "param")
        first, last = schedule.rank_of(0), schedule.rank_of(schedule.chunks - 1)
        for n in self.tied:
            if sorted(self.owners[n]) != sorted({first, last}) or S < 2:
                raise PipelineError(
                    f"pipeline: the param %{n} is read on pp ranks {self.owners[n]}; a weight may be shared only "
                    f"between the first and the last stage (a tied embedding and head). Cut the stages so that "
                    "its readers fall on one rank, e.g. with stages=[...]")

    def build(self, alike: dict[int, int] | None = None) -> list[RankProgram]:
        """Every pp rank's template program; with ``alike`` (a dict, filled here) only the
        distinct ranks' (``rank_key``), the others mapped to the first alike rank."""
        order = template_schedule(self.s).program_order(tied=bool(self.tied) and self.training)
        if alike is None:
            return [self._rank(r, order[r]) for r in range(self.s.stages)]
        first: dict[tuple, int] = {}
        out: list[RankProgram] = []
        for r in range(self.s.stages):
            q = first.setdefault(self.rank_key(r), r)
            if q != r:
                alike[r] = q
            else:
                out.append(self._rank(r, order[r]))
        return out

    def rank_key(self, r: int) -> tuple:
        """What pp rank ``r``'s template depends on but for names' digits: whether it is the
        first or the last rank or holds a tied weight, and per chunk its ``chunk_digest``, its
        params' and batch inputs' names with digits hidden and its transfers' batch dims; two
        ranks of one key have templates alike but for names (the driver's ``_template_key``)."""
        S = self.s.stages
        parts: list[Any] = [r == 0, r == S - 1, any(r in self.owners[n] for n in self.tied)]
        for c in self.s.chunks_of(r):
            ch = self.cut.chunks[c]
            parts.append((self.digests[c], tuple(_DIGITS.sub("#", str(v.name)) for v in ch.params + ch.batch),
                          tuple(self._bdim(v) for v in ch.recv + ch.send)))
        return tuple(parts)

    # --- one rank -------------------------------------------------------------------------
    def _rank(self, r: int, items: list[Action | Transfer]) -> RankProgram:
        """Pp rank ``r``'s template program: its inputs, then ``items`` in order, then its outputs."""
        w = _RankWriter(self, r)
        w.add_inputs()
        for it in items:
            if isinstance(it, Action):
                w.action(it)
            else:
                w.transfer(it)
        return w.finish()

    def _bdim(self, v: Value) -> int | None:
        return self.mbg.batch_dim.get(v)

    @staticmethod
    def _copy(b: Builder, nodes: list[Node], e: dict[Value, Value]) -> None:
        for n in nodes:
            node = b.emit_node(n.op, [e[o] for o in n.operands], dict(n.attrs), loc=n.loc)
            for a, x in zip(n.results, node.results):
                e[a] = x

    @staticmethod
    def _accumulate(b: Builder, cp: ChunkProgram, e: dict[Value, Value], acc: dict[str, Value],
                    record: "dict[int, list[tuple[str, Value]]] | None" = None) -> None:
        for nm, gv in cp.param_grads.items():
            val = e[gv] if gv in e else gv
            if record is not None:
                record.setdefault(cp.index, []).append((nm, val))
            acc[nm] = val if nm not in acc else b.add(acc[nm], val)

    def _optimizer(self, g: Graph, b: Builder, r: int, ins: dict[str, Value], acc: dict[str, Value],
                   outs: list[Value], src_index: list[int | None], aliases: list[Value | None]) -> None:
        """Copy the step's optimizer updates of this rank's params (and what they read: the
        state, a step counter) with the summed gradients in place of the step's own."""
        step = self.step
        owned = {nm for nm, rs in self.owners.items() if r in rs}

        def param_of(n: Node) -> str | None:
            """The param an update trains: its operand 0, or the param of an f32 master
            copy ``<p>.master`` (adamw with master_weights, which reads the gradient cast)."""
            nm = str(n.operands[0].name)
            if nm in owned:
                return nm
            if nm.endswith(".master") and nm[:-len(".master")] in owned:
                return nm[:-len(".master")]
            return None

        updates = [n for n in step.nodes if n.op in UPDATE_OPS and param_of(n) is not None]
        upd = set(updates)
        need = value_cone([v for n in updates for i, v in enumerate(n.operands) if i != 1])
        # What the step computes from the updates alone: the new bf16/f16 param cast from
        # its updated master copy.
        made = {x for n in updates for x in n.results}
        after = set()
        for n in step.nodes:
            if n.operands and n not in upd and all(v in made for v in n.operands):
                after.add(n)
                made.update(n.results)
        e: dict[Value, Value] = {}
        for n in step.nodes:
            if n not in need and n not in upd and n not in after:
                continue
            operands = []
            for i, v in enumerate(n.operands):
                if n in upd and i == 1:
                    pn = param_of(n)
                    assert pn is not None
                    a = acc[pn] if pn in acc else b.full(shape=list(v.type.shape), value=0.0, dtype=v.type.dtype)
                    # A template reads the summed gradient through its own node, so that a
                    # placement the strategies give the update's gradient (ZeRO's split) is
                    # made once per step, not once per microbatch.
                    summed = b.reshape(a, shape=list(a.type.shape))
                    if summed.type.dtype != v.type.dtype:
                        summed = b.cast(summed, dtype=v.type.dtype)   # the master copy's f32 gradient
                    operands.append(summed)
                    continue
                if v not in e:
                    assert v.producer is None, "the optimizer's cone is closed"
                    nm = str(v.name)
                    if nm not in ins:
                        ins[nm] = g.add_input(nm, v.type, v.role or "state")
                        if nm in step.weights:
                            g.weights[nm] = step.weights[nm]
                    e[v] = ins[nm]
                operands.append(e[v])
            node = b.emit_node(n.op, operands, dict(n.attrs), loc=n.loc)
            for a_, x in zip(n.results, node.results):
                e[a_] = x
                x.name = a_.name
        has_updates = any(n.op in UPDATE_OPS for n in step.nodes)
        for i, v in enumerate(step.outputs):
            if i == 0:
                continue
            if v in e:
                outs.append(e[v])
                src_index.append(i)
                alias = step.output_aliases[i] if step.output_aliases else None
                aliases.append(ins.get(str(alias.name)) if alias is not None else None)
            elif not has_updates and v.name and str(v.name).endswith(".grad") and str(v.name)[:-5] in owned:
                gv = acc[str(v.name)[:-5]]
                gv.name = str(v.name)
                outs.append(gv)
                src_index.append(i)
                aliases.append(None)


class _RankWriter:
    """Writes one pp rank's template program (``_Unroller._rank``), step by step; the
    template stands for every microbatch: its transfers' names and tags say "MB", which the
    unroll replaces by each microbatch's number."""

    def __init__(self, un: _Unroller, r: int) -> None:
        self.un = un
        self.r = r
        self.s = un.s
        self.g = g = Graph(f"{un.step.name}.pp{r}")
        g.weights = type(un.step.weights)()
        self.b = Builder(g)
        self.mb = "MB"
        self.sections: dict[Node, tuple] = {}
        self.chunk_grads: dict[int, list[tuple[str, Value]]] = {}
        self.last_mark: Node | None = None
        self.src_inputs = {str(v.name): v for v in un.step.inputs}
        self.ins: dict[str, Value] = {}
        self.env: dict[tuple[int, int], dict[Value, Value]] = {}
        self.recv_act: dict[tuple[int, int], list[Value]] = {}
        self.recv_ct: dict[tuple[int, int], list[Value | None]] = {}
        self.acc: dict[str, Value] = {}
        self.loss_parts: list[Value] = []
        self.final_parts: list[list[Value]] = []
        self.boundary: list[tuple[Value, int | None]] = []
        self.tied_vals: list[Value] = []
        self.tied_got: dict[str, Value] = {}
        self.acc_before_tied: dict[str, Value] | None = None

    def mark(self, key: tuple) -> None:
        """Every node appended since the last mark belongs to section ``key``."""
        n = self.last_mark.next if self.last_mark is not None else self.g.first
        while n is not None:
            self.sections[n] = key
            n = n.next
        self.last_mark = self.g.last

    def add_inputs(self) -> None:
        """The graph inputs: the batch inputs the rank's chunks read (one microbatch's type), then its params."""
        un, M = self.un, self.s.microbatches
        batch_names: list[str] = []
        param_names: list[str] = []
        for c in self.s.chunks_of(self.r):
            for nm in un.chunks[c].batch:
                if nm not in batch_names:
                    batch_names.append(nm)
            for nm in un.chunks[c].params:
                if nm not in param_names:
                    param_names.append(nm)
        if not batch_names:
            # A middle stage that reads no batch input (all it needs arrives from the stage
            # before) still takes the first one, unread: the data-parallel strategies find the
            # batch by it, and split it as they split the values this rank receives.
            batch0 = next((str(v.name) for v in un.step.inputs if v.role == "input"), None)
            if batch0 is not None:
                batch_names.append(batch0)
        mb_types = {nm: v.type for cp in un.chunks for nm, v in cp.batch.items()}
        # The whole-batch copies of batch inputs (microbatch_graph) come after the step's inputs.
        names = [str(x.name) for x in un.step.inputs] + [
            str(x.name) for x in un.mbg.graph.inputs if str(x.name).endswith(WHOLE_SUFFIX)]
        for nm in [v for v in names if v in batch_names or v in param_names]:
            if nm not in self.src_inputs:
                self.ins[nm] = self.g.add_input(nm, mb_types[nm], "input")
                continue
            v = self.src_inputs[nm]
            t = v.type
            if v.role == "input":
                t = mb_types.get(nm) or t.with_shape((t.shape[0] // M,) + tuple(t.shape[1:]))
            self.ins[nm] = self.g.add_input(nm, t, v.role or "input")
            if nm in un.step.weights:
                self.g.weights[nm] = un.step.weights[nm]

    def action(self, it: Action) -> None:
        """Copy one schedule action (a chunk's F, B or W) into the program."""
        un, b = self.un, self.b
        cp = un.chunks[it.chunk]
        key = (it.chunk, it.mb)
        if it.kind == "F":
            self.forward(it, cp)
            return
        e = self.env[key]
        if it.kind == "B":
            if cp.cotangents:
                cts = self.recv_ct.get(key)
                for i, ct in enumerate(cp.cotangents):
                    if ct is not None:
                        assert cts is not None, f"no gradient received for chunk {it.chunk}"
                        e[ct] = cts[i]  # type: ignore[assignment]
            un._copy(b, cp.B, e)
            self.mark(("B", it.chunk))
            if not self.s.split:
                self.weight_part(it, cp, e)
        else:
            self.weight_part(it, cp, e)

    def forward(self, it: Action, cp: ChunkProgram) -> None:
        """Copy a chunk's forward, on what it received, the batch inputs and its params."""
        e: dict[Value, Value] = {}
        for i, v in enumerate(cp.recv):
            e[v] = self.recv_act[(it.chunk, it.mb)][i]
        for nm, v in cp.batch.items():
            e[v] = self.ins[nm]
        for nm, v in cp.params.items():
            e[v] = self.ins[nm]
        self.mark(("pre",))
        self.un._copy(self.b, cp.F, e)
        self.mark(("F", it.chunk))
        self.env[(it.chunk, it.mb)] = e
        if cp.loss is not None:
            self.loss_parts.append(e[cp.loss])
        if cp.final:
            self.final_parts.append([e[v] for v in cp.final])

    def weight_part(self, it: Action, cp: ChunkProgram, e: dict[Value, Value]) -> None:
        """Copy a chunk's W and add its param gradients to the sums."""
        self.un._copy(self.b, cp.W, e)
        self.mark(("W", it.chunk))
        self.un._accumulate(self.b, cp, e, self.acc, self.chunk_grads)
        self.mark(("acc",))

    def transfer(self, tr: Transfer) -> None:
        """A transfer: a hand-over between two chunks of this rank, or a send or recv."""
        if tr.src == tr.dst:  # both chunks on this rank: a hand-over, no transfer
            assert tr.after is not None
            c, m = tr.after.chunk, tr.after.mb
            chunk = self.un.chunks[c]
            if tr.what == "act":
                self.recv_act[(c + 1, m)] = [self.env[(c, m)][v] for v in chunk.send]
            else:
                self.recv_ct[(c - 1, m)] = [self.env[(c, m)][gv] if gv is not None else None
                                            for gv in chunk.recv_grads]
        elif tr.what == "act":
            self.transfer_activations(tr)
        elif tr.what == "grad":
            self.transfer_gradients(tr)
        else:
            self.transfer_tied(tr)

    def transfer_activations(self, tr: Transfer) -> None:
        """Send a chunk's activations to the next stage, or receive them from the stage before."""
        un, b, s, mb = self.un, self.b, self.s, self.mb
        S = s.stages
        assert tr.after is not None and tr.before is not None
        c, m = tr.after.chunk, tr.after.mb
        cp = un.chunks[c]
        if tr.src == self.r:
            for i, v in enumerate(cp.send):
                val = self.env[(c, m)][v]
                b.send(val, axis=un.axis, group_size=S, peer=tr.dst, tag=_tag("act", c, mb, i, S, s.virtual))
                self.boundary.append((val, un._bdim(un.cut.chunks[c].send[i])))
            self.mark(("send", "act", c))
            return
        nxt = un.chunks[c + 1]
        got = []
        for i, v in enumerate(nxt.recv):
            rv = b.recv(axis=un.axis, group_size=S, peer=tr.src, shape=list(v.type.shape),
                        dtype=v.type.dtype, name=f"pp.act.c{c + 1}.m{mb}.{i}",
                        tag=_tag("act", c, mb, i, S, s.virtual))
            self.boundary.append((rv, un._bdim(un.cut.chunks[c + 1].recv[i])))
            got.append(rv)
        self.recv_act[(c + 1, m)] = got
        self.mark(("recv", "act", c))

    def transfer_gradients(self, tr: Transfer) -> None:
        """Send a chunk's input gradients to the stage before, or receive them from the next stage."""
        un, b, s, mb = self.un, self.b, self.s, self.mb
        S = s.stages
        assert tr.after is not None and tr.before is not None
        c, m = tr.after.chunk, tr.after.mb
        cp = un.chunks[c]
        if tr.src == self.r:
            for i, gv in enumerate(cp.recv_grads):
                if gv is None:
                    continue
                val = self.env[(c, m)][gv]
                b.send(val, axis=un.axis, group_size=S, peer=tr.dst, tag=_tag("grad", c, mb, i, S, s.virtual))
                self.boundary.append((val, un._bdim(un.cut.chunks[c].recv[i])))
            self.mark(("send", "grad", c))
            return
        prev = un.chunks[c - 1]
        got_ct: list[Value | None] = []
        for i, ct in enumerate(prev.cotangents):
            if ct is None:
                got_ct.append(None)
                continue
            rv = b.recv(axis=un.axis, group_size=S, peer=tr.src, shape=list(ct.type.shape),
                        dtype=ct.type.dtype, name=f"pp.grad.c{c - 1}.m{mb}.{i}",
                        tag=_tag("grad", c, mb, i, S, s.virtual))
            self.boundary.append((rv, un._bdim(un.cut.chunks[c - 1].send[i])))
            got_ct.append(rv)
        self.recv_ct[(c - 1, m)] = got_ct
        self.mark(("recv", "grad", c))

    def transfer_tied(self, tr: Transfer) -> None:
        """Send this rank's gradient sums of the shared weights, or receive the other rank's."""
        un, b, acc = self.un, self.b, self.acc
        S = self.s.stages
        self.acc_before_tied = dict(acc)
        for nm in un.tied:
            if tr.src == self.r:
                if acc[nm].name is None or str(acc[nm].name).isdigit():
                    acc[nm].name = f"pp.tied.out.{nm}"
                b.send(acc[nm], axis=un.axis, group_size=S, peer=tr.dst, tag=f"gradient of the shared %{nm}")
                self.tied_vals.append(acc[nm])
            else:
                p = self.src_inputs[nm]
                rv = b.recv(axis=un.axis, group_size=S, peer=tr.src, shape=list(p.type.shape),
                            dtype=p.type.dtype, name=f"pp.tied.{nm}", tag=f"gradient of the shared %{nm}")
                self.tied_vals.append(rv)
                self.tied_got[nm] = rv

    def sum_tied(self) -> None:
        """Add the two ranks' halves of each shared weight's gradient."""
        un, acc = self.un, self.acc
        if un.tied and un.training:
            first = self.s.rank_of(0)
            for nm in (x for x in un.tied if self.r in un.owners[x]):
                # Both ranks add the two halves in the same order: the first stage's first, so
                # that both hold bit-identical sums and updated copies.
                mine_g, other = acc[nm], self.tied_got[nm]
                acc[nm] = self.b.add(mine_g, other) if self.r == first else self.b.add(other, mine_g)
        self.mark(("tied",))

    def finish(self) -> RankProgram:
        """The outputs (the loss share, the final values, the optimizer's), verified, as a RankProgram."""
        un, g = self.un, self.g
        acc_values = dict(self.acc) if self.acc_before_tied is None else self.acc_before_tied
        self.sum_tied()
        outs: list[Value] = []
        src_index: list[int | None] = []
        aliases: list[Value | None] = []
        if self.loss_parts:
            (total,) = self.loss_parts  # one microbatch: its share (the unroll sums them)
            total.name = str(un.step.outputs[0].name or "loss") if un.training else total.name
            outs.append(total)
            src_index.append(0)
            aliases.append(None)
        self.mark(("loss",))
        finals: list[tuple[Value, int | None]] = []
        if self.final_parts:
            for k, x in enumerate(self.final_parts[0]):
                outs.append(x)
                finals.append((x, un.mbg.batch_dim.get(un.mbg.outputs[k])))
                src_index.append(k)
                aliases.append(None)
        self.mark(("final",))
        if un.training:
            un._optimizer(g, self.b, self.r, self.ins, self.acc, outs, src_index, aliases)
        self.mark(("opt",))
        g.set_outputs(outs, aliases)
        verify(g)
        return RankProgram(self.r, g, src_index, self.boundary, self.tied_vals, self.sections, self.chunk_grads,
                           acc_values, self.loss_parts[0] if self.loss_parts else None, finals)


def template_schedule(s: Schedule) -> Schedule:
    """One microbatch through every chunk (forwards in chunk order, then the backwards in
    reverse, then the weight parts): the order of a template, whatever the real schedule."""
    acts = []
    for p in range(s.stages):
        mine = s.chunks_of(p)
        row = [Action("F", c, 0) for c in mine]
        if not s.forward_only:
            row += [Action("B", c, 0) for c in reversed(mine)]
            if s.split:
                row += [Action("W", c, 0) for c in reversed(mine)]
        acts.append(row)
    return Schedule(s.name, s.stages, s.virtual, 1, acts, split=s.split, forward_only=s.forward_only)


def _tag(what: str, chunk: int, mb: int | str, i: int, stages: int, virtual: int) -> str:
    """The words a transfer's send and recv carry (``tag``): which schedule action it serves."""
    def where(c: int) -> str:
        return f"stage {c}" if virtual == 1 else f"chunk {c} (stage {c % stages})"
    if what == "act":
        return f"activation {i} of F{mb}: {where(chunk)} -> {where(chunk + 1)}"
    return f"gradient {i} of B{mb}: {where(chunk)} -> {where(chunk - 1)}"


@dataclass
class StepCache:
    """What ``build_pipeline`` derives from a step alone, kept across the pipelines built inside a
    ``using_step_cache`` block (a planner pricing many candidates of one step): its forward
    section (``forward_of``) by step, and its microbatch graph (``microbatch_graph``) by step and
    microbatch count. Neither is changed by what reads it. Keys are the steps' identities, each
    step kept alive with its entry; ``hits`` counts the graphs handed over again."""

    forwards: dict[int, tuple[Graph, Graph, bool]] = field(default_factory=dict)
    micro: dict[tuple[int, int], tuple[Graph, MicrobatchGraph]] = field(default_factory=dict)
    hits: int = 0

    def forward(self, step: Graph) -> tuple[Graph, bool]:
        """``forward_of(step)``, made once."""
        got = self.forwards.get(id(step))
        if got is not None and got[0] is step:
            self.hits += 1
            return got[1], got[2]
        fwd, training = forward_of(step)
        self.forwards[id(step)] = (step, fwd, training)
        return fwd, training

    def microbatch(self, step: Graph, fwd: Graph, microbatches: int, training: bool) -> MicrobatchGraph:
        """``microbatch_graph(fwd, microbatches, training)`` of ``step``'s forward ``fwd``, made once."""
        got = self.micro.get((id(step), microbatches))
        if got is not None and got[0] is step:
            self.hits += 1
            return got[1]
        mbg = microbatch_graph(fwd, microbatches, training)
        self.micro[(id(step), microbatches)] = (step, mbg)
        return mbg


_STEP_CACHE: contextvars.ContextVar[StepCache | None] = contextvars.ContextVar("step_cache", default=None)


@contextlib.contextmanager
def using_step_cache(cache: StepCache) -> Iterator[StepCache]:
    """Make ``cache`` the step cache of the pipelines built inside the block (see ``StepCache``)."""
    if not isinstance(cache, StepCache):
        raise TypeError(f"using_step_cache: expected a StepCache, got {type(cache).__name__}; make one with StepCache()")
    token = _STEP_CACHE.set(cache)
    try:
        yield cache
    finally:
        _STEP_CACHE.reset(token)


def build_pipeline(step: Graph, stages: int, microbatches: int, schedule: Schedule, *,
                   axis: str = "pp", cut: Any = None, recompute: str | tuple[str, ...] = "none",
                   distinct: bool = False) -> Pipeline:
    """The pipeline of ``step`` (see the module docstring); ``recompute``: the activation
    recomputation policy of every chunk's backward, or one per stage (a chunk takes its rank's); ``distinct``: build only the pp ranks
    whose templates differ but for names (``Pipeline.alike`` maps the others), for the
    driver's ``unroll=False`` templates, which copy the alike ones."""
    cache = _STEP_CACHE.get()
    fwd, training = cache.forward(step) if cache is not None else forward_of(step)
    if not training and not schedule.forward_only:
        raise PipelineError(f"pipeline: @{step.name} is a forward graph (no optimizer update, no gradients); a "
                            f"training schedule needs a training step (partita.training_step); for inference the "
                            "pipeline runs forward only")
    mbg = cache.microbatch(step, fwd, microbatches, training) if cache is not None else \
        microbatch_graph(fwd, microbatches, training)
    sc = partition_stages(mbg.graph, schedule.chunks, cut, virtual=schedule.virtual)
    last = schedule.chunks - 1
    # One program per distinct chunk (first, middle, last), copied into the alike ones.
    digests: list[tuple] = []
    chunks = chunk_programs(sc.chunks, mbg.loss, forward_only=not training,
                            outputs=None if training else mbg.outputs,
                            recompute=recompute if isinstance(recompute, str) else
                            tuple(recompute[schedule.rank_of(c)] for c in range(schedule.chunks)), digests=digests)
    assert [cp.index for cp in chunks] == list(range(last + 1))
    if schedule.split:
        for cp in chunks[1:]:
            if cp.params and not cp.W:
                raise PipelineError(
                    f"pipeline: schedule zero-bubble needs each chunk's backward split into input gradients (B) and "
                    f"weight gradients (W), but chunk {cp.index} computes all of its weight gradients inside its "
                    "input-gradient part (an op whose backward gives both at once); use schedule='1f1b'")
    un = _Unroller(step, mbg, sc, chunks, schedule, training, axis, digests)
    alike: dict[int, int] = {}
    ranks = un.build(alike if distinct else None)
    return Pipeline(sc, chunks, schedule, ranks, un.tied, mbg, training, un.owners, alike)


__all__ = ["MicrobatchGraph", "Pipeline", "RankProgram", "StepCache", "build_pipeline", "check_microbatches",
           "forward_of", "is_training", "microbatch_graph", "using_step_cache"]
