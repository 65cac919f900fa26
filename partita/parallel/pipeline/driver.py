"""``parallelize`` for a strategy with ``pp``: the stage cut, the schedule unrolled into one
program per pp rank, each parallelized with the rest of the strategy over the rest of the
mesh, and the static proof that the ranks' sends, recvs and collectives meet."""

from __future__ import annotations

import re
import time
from typing import Any, Callable, Mapping, Sequence

from ...ir.graph import Graph, Node, Value
from ...ir.mesh import Mesh
from ...ir.placement import Placement
from ..program import MicrobatchRepeat
from ..strategies.base import ParsedStrategy, StrategyError
from .build import WHOLE_SUFFIX, build_pipeline, check_microbatches, is_training
from .local_unroll import ONCE_SECTIONS, LocalTemplate, local_sections, unroll_local
from .pipeline_program import PipelineProgram, WholeStage
from .schedule import PipelineError, Schedule, check_schedule, make_schedule
from .stages import check_chunks, graph_layers


def _positive(name: str, x: Any, fix: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise PipelineError(f"parallelize: {name} must be a positive int, got {x!r}; {fix}")
    return x


def _check_stages(stages: Any) -> None:
    ok = stages is None or (isinstance(stages, (list, tuple)) and (
        all(isinstance(x, str) for x in stages) or all(isinstance(x, int) and not isinstance(x, bool) for x in stages)))
    if not ok and not isinstance(stages, (str, bytes)):     # a string: partition_stages says how to fix it
        raise PipelineError(f"parallelize: stages must be a list of layer names (the layers later stages start at, "
                            f"e.g. ['h.3', 'h.7']) or of layer counts per stage (e.g. [3, 3, 2]); got "
                            f"{type(stages).__name__} {stages!r:.60}")


def _recompute_policy(graph: Graph, recompute: Any, training: bool, stages: int = 1) -> str | tuple[str, ...]:
    """The recomputation policy of the chunks' backward. The pipeline derives each chunk's
    backward again from the step's forward, so a step's own recomputation would be lost:
    the step's policy (read from its recomputed nodes' locations) is taken, and an explicit
    ``recompute`` that contradicts it is refused. A list or tuple gives each pp stage its
    own policy (``stage_recompute_policies``)."""
    from ...autodiff.grad import AutodiffError
    from ...autodiff.recompute import recompute_policy, recompute_policy_of

    own = recompute_policy_of(graph) if training else "none"
    if isinstance(recompute, (list, tuple)):
        return stage_recompute_policies(graph, recompute, own, training, stages)
    if recompute is None:
        return own
    try:
        asked = recompute_policy(recompute, "parallelize: recompute")
    except AutodiffError as e:
        raise PipelineError(str(e)) from None
    if not training and asked != "none":
        raise PipelineError(f"parallelize: recompute={recompute!r}, but @{graph.name} is a forward graph: a forward-only "
                            "pipeline has no backward to recompute for; leave recompute out")
    if own != "none" and asked != own:
        raise PipelineError(f"parallelize: recompute={recompute!r}, but the step @{graph.name} was built with "
                            f"recompute={own!r} (its recomputed nodes say so); the pipeline applies one policy to "
                            f"every chunk's backward: pass recompute={own!r} or leave it out, or build the step with "
                            f"training_step(..., recompute={asked!r})")
    return asked


def stage_recompute_policies(graph: Graph, recompute: Sequence[Any], own: str, training: bool,
                             stages: int) -> tuple[str, ...]:
    """One recomputation policy per pp stage (``recompute=["full", "none"]``): early stages hold
    more microbatches' activations under 1F1B, so they may recompute while later ones do not.
    The step must be built without recomputation of its own (or with the policy every stage
    gets), since each chunk's backward is derived again with its stage's policy."""
    from ...autodiff.grad import AutodiffError
    from ...autodiff.recompute import recompute_policy

    if not training:
        raise PipelineError(f"parallelize: recompute={list(recompute)!r:.80}, but @{graph.name} is a forward graph: "
                            "a forward-only pipeline has no backward to recompute for; leave recompute out")
    if len(recompute) != stages:
        raise PipelineError(f"parallelize: recompute has {len(recompute)} policies, but the pipeline has {stages} "
                            f"stages; give one per stage (e.g. {['full'] + ['none'] * (stages - 1)!r}) or one "
                            "policy for all")
    try:
        asked = tuple(recompute_policy(r, f"parallelize: recompute[{i}]") for i, r in enumerate(recompute))
    except AutodiffError as e:
        raise PipelineError(str(e)) from None
    if own != "none" and any(a != own for a in asked):
        raise PipelineError(f"parallelize: recompute={list(asked)!r}, but the step @{graph.name} was built with "
                            f"recompute={own!r}; per-stage policies need a step built without recomputation: "
                            "training_step(..., recompute='none')")
    return asked


def parallelize_pipeline(graph: Graph, mesh: Mesh, strategy: ParsedStrategy,
                         annotations: Mapping[str, Any] | None = None, *, microbatches: int = 1,
                         schedule: str = "1f1b", virtual_stages: int = 1,
                         stages: Sequence[str] | Sequence[int] | None = None,
                         recompute: bool | str | Sequence[str] | None = None, unroll: bool = True, parallelize_stage: Callable[..., Any], **spmd: Any) -> PipelineProgram:
    """The pipeline program of ``graph`` (a training step, or a forward graph for inference)
    on ``mesh`` with ``strategy`` (which includes ``pp``); see ``partita.parallelize``, which
    checks ``unroll``. ``unroll=False``: keep each rank's local template
    (``PipelineProgram.templates``) instead of unrolling it, for ``partita.cluster.simulate``;
    nothing is checked or runnable then. ``parallelize_stage``: the SPMD ``parallelize`` each
    stage's program goes through."""
    t0 = time.perf_counter()
    axis = strategy.axis_of("pp")
    assert axis is not None
    S = mesh.axis_size(axis)
    M, v, user = _check_arguments(graph, S, microbatches, virtual_stages, stages, schedule, annotations)
    rest, submesh = _rest_of_strategy(strategy, mesh, axis, S)
    training = is_training(graph)
    if not unroll and not training:
        raise PipelineError("parallelize: unroll=False simulates a training pipeline; a forward-only (inference) "
                            "pipeline is small enough to unroll: leave unroll out")
    policy = _recompute_policy(graph, recompute, training, S)
    sched = make_schedule(schedule, S, M, v, forward_only=not training)
    sched.validate()
    dp_axis = rest.dp_axis
    dp = submesh.axis_size(dp_axis) if (submesh is not None and dp_axis is not None) else 1
    timings: dict[str, float] = {}
    _check_dp_rows(graph, M, dp)
    # Templates (unroll=False) over another mesh axis copy the ranks alike but for names
    # (_template_key); build_pipeline then builds only the distinct ranks (Pipeline.alike).
    # The user's annotations name inputs, which may tell alike ranks apart: every rank then.
    distinct = not unroll and submesh is not None and not user
    pipe = build_pipeline(graph, S, M, sched, axis=axis, cut=stages, recompute=policy, distinct=distinct)
    timings["pipeline"] = time.perf_counter() - t0
    items = sched.program_order(tied=bool(pipe.tied) and training)
    t1 = time.perf_counter()
    made = _StagePrograms(mesh, submesh, rest, dp, user, sched, items, M, unroll, parallelize_stage, spmd)
    built = {rp.rank: rp for rp in pipe.ranks}
    for r in range(S):
        if r in pipe.alike:
            made.copy_rank(pipe.alike[r], r)
        else:
            made.add(built[r])
    timings["stages"] = time.perf_counter() - t1 - made.unroll_s
    timings["unroll"] = made.unroll_s
    out = PipelineProgram(graph, mesh, axis, strategy, pipe, made.progs, submesh, timings=timings,
                          unrolled=unroll, templates=made.templates if not unroll else None, batch_ranks=dp,
                          copied_from=dict(made.copied_from))
    t2 = time.perf_counter()
    if unroll:
        check_program(out)
    timings["check"] = time.perf_counter() - t2
    from .pipeline_report import build_pipeline_plan

    out.plan = build_pipeline_plan(out)
    timings["total"] = time.perf_counter() - t0
    return out


def _check_arguments(graph: Graph, S: int, microbatches: Any, virtual_stages: Any, stages: Any, schedule: str,
                     annotations: Mapping[str, Any] | None) -> tuple[int, int, dict[str, Any]]:
    """The cheap checks of the arguments; returns (microbatches, virtual stages, the user's annotations by name)."""
    M = _positive("microbatches", microbatches, "the batch is split into that many microbatches (e.g. 2 * the pp size)")
    v = _positive("virtual_stages", virtual_stages, "use 1, or 2 or more with schedule='interleaved'")
    _check_stages(stages)
    # The cheap checks before any work that a user's number sizes (the schedule has S * M * v
    # actions): the microbatches divide the batch, the layers are enough for S * v chunks.
    check_schedule(schedule, S, M, v)
    check_microbatches(graph, M)
    check_chunks(graph, graph_layers(graph), S * v, v)
    user = {str(k).lstrip("%"): p for k, p in (annotations or {}).items()}
    if user:
        inputs = {str(x.name) for x in graph.inputs}
        inner = sorted(k for k in user if k not in inputs)
        if inner:
            raise PipelineError(
                f"parallelize: with pp, annotations may place the graph's inputs (params, state, the batch), which "
                f"each stage takes as they are; %{inner[0]} is not one (each stage's program computes its own copy "
                "of an intermediate value). Annotate an input, or parallelize without pp")
    return M, v, user


def _rest_of_strategy(strategy: ParsedStrategy, mesh: Mesh, axis: str, S: int) -> tuple[ParsedStrategy, Mesh | None]:
    """The strategy's words besides ``pp`` and the mesh without the pp axis (None: no other axis)."""
    rest_words = [s.name for s in strategy.strategies if s.name != "pp"]
    others = [(a, n) for a, n in zip(mesh.names, mesh.shape) if a != axis]
    submesh = Mesh.of(others) if others else None
    if rest_words and submesh is None:
        raise PipelineError(f"strategy {strategy} on {mesh}: {'+'.join(rest_words)} needs a mesh axis besides '{axis}'; "
                            f"use a mesh such as '{axis}={S},dp=2'")
    from ..strategies.base import parse_strategy

    rest = parse_strategy("+".join(rest_words), submesh) if rest_words and submesh is not None else ParsedStrategy()
    if submesh is not None and not rest_words:
        raise PipelineError(f"strategy {strategy} on {mesh}: the mesh axes {', '.join(a for a, _ in others)} have no "
                            f"strategy; add one (e.g. 'pp+dp') or use the mesh '{axis}={S}'")
    return rest, submesh


def _check_dp_rows(graph: Graph, M: int, dp: int) -> None:
    """A PipelineError unless the ``dp`` data-parallel ranks divide a microbatch's rows."""
    for x in graph.inputs:
        if x.role == "input" and x.type.rank and x.type.shape[0] % M == 0 and (x.type.shape[0] // M) % dp:
            rows = x.type.shape[0] // M
            raise PipelineError(f"pipeline: a microbatch of %{x.name} has {rows} rows ({x.type.shape[0]} / {M} "
                                f"microbatches), which the {dp} data-parallel ranks do not divide; use a batch of a "
                                f"multiple of {M * dp} rows or fewer microbatches")


class _StagePrograms:
    """Each pp rank's stage program, made in rank order: its template (one microbatch)
    parallelized over the rest of the mesh, then unrolled per schedule action on the per-rank
    program (local_unroll.py), so that compile time does not grow with M; with
    ``unroll=False`` the local templates are kept instead."""

    def __init__(self, mesh: Mesh, submesh: Mesh | None, rest: ParsedStrategy, dp: int, user: dict[str, Any],
                 sched: Schedule, items: list[Any], M: int, unroll: bool, parallelize_stage: Callable[..., Any],
                 spmd: dict[str, Any]) -> None:
        self.mesh, self.submesh, self.rest, self.dp, self.user = mesh, submesh, rest, dp, user
        self.sched, self.items, self.M, self.unroll = sched, items, M, unroll
        self.parallelize_stage = parallelize_stage
        self.bucket_mb = spmd.pop("bucket_mb", 25.0)
        self.first_mb = spmd.pop("first_bucket_mb", 1.0)
        self.order = spmd.pop("order", True)
        self.prefetch = spmd.pop("prefetch", 1)
        self.gather_mb = spmd.pop("gather_mb", 4.0)
        self.spmd = spmd
        self.progs: list[Any] = []
        self.templates: list[LocalTemplate] = []
        self.unroll_s = 0.0
        self.alike: dict[tuple, tuple[int, Any, LocalTemplate]] = {}
        self.by_rank: dict[int, tuple[Any, LocalTemplate]] = {}
        self.copied_from: dict[int, int] = {}

    def notes(self, rp: Any) -> dict[str, Any]:
        """The placements rank ``rp``'s stage is parallelized with: its boundary's, then the user's of its inputs."""
        rest = self.rest
        assert self.submesh is not None
        notes: dict[str, Any] = _boundary_annotations(rp, self.submesh, rest.dp_axis, self.dp,
                                                      rest.tp_axis if rest.sequence_parallel else None)
        mine = {str(x.name) for x in rp.graph.inputs}
        notes.update({k: p for k, p in self.user.items() if k in mine})
        return notes

    def add(self, rp: Any) -> None:
        """Make pp rank ``rp.rank``'s stage program (or, with ``unroll=False``, its template)."""
        key: tuple = ()
        if not self.unroll and self.submesh is not None:
            # Stages alike but for names (the middle stages of a GPT: other layers of one
            # shape) are parallelized once; the others take a copy of its local template.
            key = _template_key(rp, self.sched.stages, self.notes(rp))
            if key in self.alike:
                q = self.alike[key][0]
                self.copy_rank(q, rp.rank)
                return
        st, local, tracked = self.parallelize(rp)
        vmap: dict[Value, Value] | None = tracked.local_values() if tracked is not None else None
        t = time.perf_counter()
        spans = tracked.spans if tracked is not None else None
        sections = local_sections(local, rp.sections, spans,
                                  (tracked.copy, tracked.node_origin) if spans is not None else None)

        def loc(v: Value) -> Value:
            return vmap[v] if vmap is not None else v

        # The whole-batch copies (build.py, microbatch_graph) are read whole, not sliced per microbatch.
        batch = {str(v.name): 0 for v in rp.graph.inputs if v.role == "input" and not str(v.name).endswith(WHOLE_SUFFIX)}
        chunk_grads = {c: [(nm, loc(v)) for nm, v in gs] for c, gs in rp.chunk_grads.items()}
        acc_values = {nm: loc(v) for nm, v in rp.acc_values.items()}
        loss_share = loc(rp.loss_share) if rp.loss_share is not None else None
        finals = [(loc(v), d) for v, d in rp.finals]
        if self.submesh is not None:
            _defer_grad_reductions(sections, chunk_grads, acc_values)
        if not self.unroll:
            if self.submesh is not None and self.bucket_mb is not None:
                _bucket_template(local, sections, self.bucket_mb, self.first_mb)
            self.templates.append(LocalTemplate(rp.rank, local, sections, self.sched, self.items[rp.rank], batch,
                                                chunk_grads, acc_values, loss_share, finals))
            if self.submesh is not None:
                self.alike.setdefault(key, (rp.rank, st, self.templates[-1]))
                self.by_rank[rp.rank] = (st, self.templates[-1])
            self.unroll_s += time.perf_counter() - t
            self.progs.append(st)
            return
        once: set[Any] = set()
        unrolled = unroll_local(local, sections, self.sched, rp.rank, self.items[rp.rank], batch=batch,
                                chunk_grads=chunk_grads, acc_values=acc_values, loss_share=loss_share,
                                finals=finals, mesh=self.mesh, once_nodes=once)
        self.unroll_s += time.perf_counter() - t
        if self.submesh is not None:
            _finish_collectives(unrolled, self.bucket_mb, self.first_mb, self.order, self.prefetch, self.gather_mb,
                                once, overlap_backward=not self.sched.split)
        unrolled.mesh = self.mesh
        st.local = unrolled
        self.progs.append(st)

    def copy_rank(self, q: int, p: int) -> None:
        """Pp rank ``p``'s stage and template (``unroll=False``): a copy of rank ``q``'s, made
        before and alike but for names (``_reuse_template``)."""
        t = time.perf_counter()
        st_q, tq = self.by_rank[q]
        st_p, tmpl = _reuse_template(st_q, tq, q, p, self.sched.stages, self.items[p])
        self.templates.append(tmpl)
        self.progs.append(st_p)
        self.by_rank[p] = (st_p, tmpl)
        self.copied_from[p] = q
        self.unroll_s += time.perf_counter() - t

    def parallelize(self, rp: Any) -> tuple[Any, Graph, Any]:
        """Rank ``rp``'s template through the rest of the strategy: (stage, local graph, its
        tracking); without another mesh axis the template is the stage as it is (tracking None)."""
        if self.submesh is None:
            return WholeStage(rp.graph), rp.graph, None
        try:
            st = self.parallelize_stage(rp.graph, self.submesh, str(self.rest), self.notes(rp), bucket_mb=None,
                                        gather_mb=None, order=False, track=True,
                                        repeat=_template_repeat(rp, self.M), **self.spmd)
        except StrategyError as e:
            raise PipelineError(f"pp rank {rp.rank} (stage program @{rp.graph.name}): {e}") from None
        return st, st.local, st.tracked


def _finish_collectives(local: Graph, bucket_mb: Any, first_mb: Any, order: bool, prefetch: int,
                        gather_mb: Any, once: "set[Any] | None" = None, overlap_backward: bool = True) -> None:
    """The bucketing and ordering of collectives that ``parallelize`` runs on a per-rank
    program, here on the unrolled one (a template's buckets would mix microbatches).
    ``once``: the nodes of the once-per-step sections, whose all_reduces alone are bucketed
    (the gradient reductions): fusing two microbatches' independent collectives (a small
    all_reduce of the loss of microbatch m with that of m + 1) would hold the first back until
    the second's forward, and reorder the schedule around it. ``overlap_backward``: whether
    order-collectives overlaps the linear layers' backward collectives with their weight
    gradients (not when a schedule defers the weight gradients, zero-bubble's W sections)."""
    from ..bucket import bucket_gathers, bucket_gradients, order_collectives

    if bucket_mb is not None:
        bucket_gradients(local, bucket_mb, first_mb, only=once)
    if gather_mb is not None:
        bucket_gathers(local, gather_mb)
    if order:
        order_collectives(local, prefetch, keep_order=True, overlap_backward=overlap_backward)


def _norm(text: str) -> str:
    return re.sub(r"\d+", "#", text)


def _template_key(rp: Any, S: int, notes: dict[str, Placement]) -> tuple:
    """What parallelizing pp rank ``rp.rank``'s template depends on, but for names and numbers
    (layer and chunk indices): its inputs, every node's op, attributes (a transfer's peer
    relative to the rank), result types, operands by position, location scope and section
    (chunks counted on the rank), what the unroll maps, and the boundary placements (which
    outputs of the step it returns is for running, not simulating: left out)."""
    r = rp.rank
    idx: dict[Value, tuple] = {v: ("in", i) for i, v in enumerate(rp.graph.inputs)}
    parts: list[Any] = [tuple((_norm(str(v.name)), str(v.type), v.role) for v in rp.graph.inputs)]

    def sec(k: Any) -> Any:
        if k is None:
            return None
        if k[0] in ("F", "B", "W"):
            return (k[0], (k[1] - r) // S)
        if k[0] in ("send", "recv"):
            return (k[0], k[1], (k[2] - r) // S)
        return k

    def attr(a: str, v: Any) -> Any:
        if a == "peer" and isinstance(v, int):
            return ("peer", (v - r) % S)
        if a in ("tag", "name"):
            return None
        return _norm(repr(v))

    for k, n in enumerate(rp.graph.nodes):
        parts.append((n.op, tuple(sorted((a, attr(a, v)) for a, v in n.attrs.items())),
                      tuple(idx[o] for o in n.operands), tuple(str(x.type) for x in n.results),
                      _norm(repr(n.loc)), sec(rp.sections.get(n))))
        for j, x in enumerate(n.results):
            idx[x] = (k, j)
    parts.append(tuple(idx.get(v) for v in rp.graph.outputs))
    parts.append(tuple(((c - r) // S, tuple((_norm(nm), idx.get(v)) for nm, v in gs))
                       for c, gs in sorted(rp.chunk_grads.items())))
    parts.append(tuple((_norm(nm), idx.get(v)) for nm, v in rp.acc_values.items()))
    parts.append(idx.get(rp.loss_share) if rp.loss_share is not None else None)
    parts.append(tuple((idx.get(v), d) for v, d in rp.finals))
    parts.append(tuple(sorted((_norm(k), repr(p)) for k, p in notes.items())))
    return tuple(parts)


def _reuse_template(st_q: Any, tq: LocalTemplate, q: int, p: int, S: int, items: list[Any]) -> tuple[Any, LocalTemplate]:
    """pp rank ``p``'s stage and template from pp rank ``q``'s, alike but for names: a copy of
    its local template with the transfers' peers and the sections' chunks moved to ``p``."""
    import copy as _copy

    g = tq.local.clone()
    nmap = dict(zip(tq.local.nodes, g.nodes))
    vmap = dict(zip(tq.local.values(), g.values()))
    for n in g.nodes:
        if "peer" in n.attrs and isinstance(n.attrs["peer"], int):
            n.attrs["peer"] = (n.attrs["peer"] - q + p) % S

    def sec(k: tuple) -> tuple:
        if k[0] in ("F", "B", "W"):
            return (k[0], k[1] - q + p)
        if k[0] in ("send", "recv"):
            return (k[0], k[1], k[2] - q + p)
        return k

    t = LocalTemplate(p, g, {nmap[n]: sec(k) for n, k in tq.sections.items()}, tq.sched, items, dict(tq.batch),
                      {c - q + p: [(nm, vmap[v]) for nm, v in gs] for c, gs in tq.chunk_grads.items()},
                      {nm: vmap[v] for nm, v in tq.acc_values.items()},
                      vmap[tq.loss_share] if tq.loss_share is not None else None,
                      [(vmap[v], d) for v, d in tq.finals])
    st = _copy.copy(st_q)
    st.local = g
    return st, t


def _bucket_template(local: Graph, sections: dict[Any, tuple], bucket_mb: Any, first_mb: Any) -> None:
    """Bucket the once-per-step sections' all_reduces of a template in place, as
    ``_finish_collectives`` buckets them on the unrolled program (the candidates and their
    relative order are the same there), and give the fused nodes their section: that of the
    node they stand before."""
    from ..bucket import bucket_gradients

    once = {n for n, k in sections.items() if k[0] in ONCE_SECTIONS}
    bucket_gradients(local, bucket_mb, first_mb, only=once)
    # A bucket sits after its members' operands: with zero2 a gradient in a W section, which
    # in the unrolled program is the sum after the last microbatch. Its nodes are once per
    # step: they join the next once-per-step section.
    key: tuple = ("tail",)
    for n in reversed(list(local.nodes)):
        if n in sections:
            if sections[n][0] in ONCE_SECTIONS:
                key = sections[n]
        else:
            sections[n] = key
    for n in [n for n in sections if n.graph is not local]:
        del sections[n]


def _defer_grad_reductions(sections: dict[Node, tuple], chunk_grads: dict[int, list[tuple[str, Value]]],
                           acc_values: dict[str, Value]) -> None:
    """A param gradient the template reduces or gathers in its microbatch sections (a tied
    weight's gradient, annotated whole for its exchange, all_reduced over dp and gathered
    over tp where it is made) is communicated once per step instead, on the microbatches'
    sum: sum reductions and gathers commute with the sum over microbatches. In place: the
    chain of collectives joins the once-per-step section of the gradient's first reader,
    just before it, and the microbatches accumulate the chain's operand."""
    linear = ("all_reduce", "reduce_scatter", "all_gather")
    # Two params may share one gradient value (cse merges the equal gradients of two biases
    # added to the same sum, as Phi's parallel attention and MLP output biases are): once its
    # chain is deferred, every param that reads it accumulates the chain's operand.
    deferred: dict[Value, Value] = {}
    for grads in chunk_grads.values():
        for i, (nm, gv) in enumerate(grads):
            if gv in deferred and acc_values.get(nm) is gv:
                grads[i] = (nm, deferred[gv])
                acc_values[nm] = deferred[gv]
                continue
            if acc_values.get(nm) is not gv or not gv.users or gv.graph is None or gv in gv.graph.outputs:
                continue
            if any(sections.get(u, ("opt",))[0] not in ONCE_SECTIONS for u in gv.users):
                continue
            chain: list[Node] = []
            x = gv
            while x.producer is not None and x.producer.op in linear and \
                    x.producer.attrs.get("op", "sum") in ("sum", "avg") and \
                    sections.get(x.producer, ("opt",))[0] in ("F", "B", "W") and (x is gv or len(x.users) == 1):
                chain.append(x.producer)
                x = x.producer.operands[0]
            if not chain or len(x.users) != 1:
                continue
            first = min(gv.users, key=lambda u: u._order)
            for n in reversed(chain):
                sections[n] = sections.get(first, ("opt",))
                # Where the unrolled program has it: just before the gradient's first reader.
                gv.graph.move_before(first, n)
            grads[i] = (nm, x)
            acc_values[nm] = x
            deferred[gv] = x


def _template_repeat(rp: Any, M: int) -> MicrobatchRepeat:
    """The microbatch repeat (M, once, accumulated) for the propagation of pp rank ``rp``'s one-microbatch template:
    its microbatch sections run M times a step; the once-per-step sections' values and the
    param gradients the microbatches accumulate (reduced once, after the last) do not; those
    gradients are summed each microbatch, at their local size."""
    once = {r for n, key in rp.sections.items() if key and key[0] in ONCE_SECTIONS for r in n.results}
    acc = {v for grads in rp.chunk_grads.values() for _, v in grads}
    once.update(acc)
    once.update(rp.acc_values.values())
    return MicrobatchRepeat(M, frozenset(once), frozenset(acc))


def _boundary_annotations(rp: Any, submesh: Mesh, dp_axis: str | None, dp: int,
                          sp_axis: str | None = None) -> dict[str, Placement]:
    """Placements for every value that crosses between pp ranks: its batch dim split over the
    data-parallel axis (as the stage's batch is), whole along everything else; the sender and
    the receiver annotate alike, so each rank sends and receives its own piece. With sequence
    parallelism (``sp_axis``) a float activation ``[batch, seq, ...]`` also has its sequence
    dim split over that axis, as the residual stream between layers is (Megatron-LM sends the
    sequence-parallel piece too): each rank sends a 1/tp share."""
    out: dict[str, Placement] = {}
    k = 0
    taken = {str(x.name) for x in rp.graph.values() if x.name is not None}
    for val, d in list(rp.boundary) + [(t, None) for t in rp.tied_values]:
        if val.name is None or str(val.name).isdigit() or val.producer is None:
            name = f"pp.send{k}"
            while name in taken:
                k += 1
                name = f"pp.send{k}"
            k += 1
            if val.producer is None:
                # A graph input sent on as it is (a recv passed through): annotate the input.
                name = str(val.name)
            else:
                val.name = name
                taken.add(name)
        rank = val.type.rank
        splits: dict[int, str | Sequence[str]] = {}
        if dp_axis is not None and d is not None and dp > 1 and val.type.shape[d] % dp == 0:
            splits[d] = dp_axis
        if sp_axis is not None and d is not None and rank >= 3 and val.type.dtype.is_float \
                and val.type.shape[d + 1] % submesh.axis_size(sp_axis) == 0:
            splits[d + 1] = sp_axis
        out[str(val.name)] = Placement.split(rank, splits) if splits else Placement.replicated(rank)
    return out


def check_program(prog: PipelineProgram) -> None:
    """Prove before anything runs that the ranks' programs meet: every send pairs with its
    recv (same type), along every mesh axis each group issues the same collectives in the
    same order (``check_collective_order``), and played in lockstep with sends that wait
    for their recv, the communication never stops (``check_deadlock_free``); raises
    PipelineError naming the ranks and the nodes."""
    from ..bucket import CollectiveOrderError, check_collective_order
    from ..interpreter import MeshRunError, check_deadlock_free, pair_point_to_point

    graphs = prog.rank_graphs()
    try:
        pair_point_to_point(graphs, prog.mesh)
        check_collective_order(graphs, prog.mesh)
        check_deadlock_free(graphs, prog.mesh)
    except (MeshRunError, CollectiveOrderError) as e:
        raise PipelineError(f"pipeline on {prog.mesh}: the per-rank programs would not meet: {e}") from None


__all__ = ["check_program", "is_training", "parallelize_pipeline"]
