"""``parallelize``, the whole parallel pipeline: the strategies annotate a few values of a copy
of the global graph (partita/parallel/strategies/), user annotations by value name win over
them, ``propagate`` places everything else, pricing each conflict by the reshard it costs,
``partition`` writes the per-rank program, the strategies' own passes run on it, and
``bucket-gradients``, ``bucket-gathers`` and ``order-collectives`` finish it.

``partita.parallelize(graph, mesh="dp=2,tp=2", strategy="dp+megatron")`` combines strategies
(one data-parallel preset and megatron on a 2-D mesh). User ``annotations`` (by value name)
are applied after the strategies and win over them.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..ir.diagnostics import given as _given
from ..ir.graph import Graph, Value
from ..ir.mesh import Mesh, MeshError
from ..ir.placement import Placement, PlacementError
from ..ir.printer import value_names
from ..ops.registry import OPS
from .partition import partition_with_report
from .program import MicrobatchRepeat, ParallelProgram, TrackedPartition
from .propagate import PropagationError, PropagationReport, propagate
from .report import build_plan
from .sharding import sharding_spec
from .strategies import AnnotationContext, ParsedStrategy, StrategyError, parse_strategy, registered


def parse_placement(text: str | Placement, rank: int, what: str = "the annotation") -> Placement:
    """A placement from its text: ``"replicated"``, or one entry per dim in brackets, ``-`` for
    a whole dim and mesh axes joined by ``@`` for a split one, optionally followed by
    ``partial(axis, ...)``: ``"[dp, -]"``, ``"[-, dp@tp] partial(pp)"`` (what ``str(Placement)``
    prints)."""
    if isinstance(text, Placement):
        return text
    if not isinstance(text, str):
        raise StrategyError(f"{what}: the placement must be text such as '[dp, -]' or 'replicated', or a "
                            f"partita.parallel.Placement; got {_given(text)}{_as_text(text, rank)}")
    s = text.strip()
    partial: tuple[str, ...] = ()
    if "partial(" in s:
        s, _, rest = s.partition("partial(")
        partial = tuple(a.strip() for a in rest.rstrip().rstrip(")").split(",") if a.strip())
        s = s.strip()
    if s == "replicated":
        return Placement(((),) * rank, partial)
    if not (s.startswith("[") and s.endswith("]")):
        raise StrategyError(f"{what}: cannot read the placement '{text}'; write one entry per dim in brackets, "
                            "'-' for a whole dim, e.g. '[dp, -]' or '[-, tp] partial(dp)', or 'replicated'")
    entries = [e.strip() for e in s[1:-1].split(",")] if s[1:-1].strip() else []
    if len(entries) != rank:
        raise StrategyError(f"{what}: the placement '{text}' has {len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
                            f" but the value has {rank} dim(s); give one entry per dim")
    dims = tuple(() if e in ("-", "_", "") else tuple(a.strip() for a in e.split("@")) for e in entries)
    return Placement(dims, partial)


def _as_text(x: Any, rank: int | None = None) -> str:
    """A hint for a placement given as a list or tuple of dim entries: the text it means."""
    if isinstance(x, (list, tuple)) and all(isinstance(e, str) for e in x) and (rank is None or len(x) == rank):
        return f"; write it as the text '[{', '.join(e or '-' for e in x)}]'"
    return ""


def _check_graph(graph: Any) -> None:
    if not isinstance(graph, Graph):
        raise StrategyError(f"parallelize: graph must be a partita Graph (from partita.load, partita.import_torch "
                            f"or partita.training_step); got {_given(graph)}")


def _mesh(mesh: Any) -> Mesh:
    """The mesh argument as a Mesh: a Mesh, its text (``"dp=2,tp=2"``, ``"dp:2,tp:2"``), a dict
    of axis sizes, or (name, size) pairs."""
    pairs = isinstance(mesh, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in mesh)
    if not (isinstance(mesh, (Mesh, str, Mapping)) or pairs):
        hint = f"; for {mesh} ranks of data parallelism write mesh='dp={mesh}'" \
            if isinstance(mesh, int) and not isinstance(mesh, bool) and mesh > 0 else ""
        raise StrategyError(f"parallelize: mesh must be a Mesh, its text such as 'dp=2,tp=2', a dict of axis sizes "
                            f"such as {{'dp': 2, 'tp': 2}} or (name, size) pairs; got {_given(mesh)}{hint}")
    try:
        return Mesh.of(mesh.replace(":", "=") if isinstance(mesh, str) else mesh)
    except MeshError as e:
        raise StrategyError(f"bad mesh '{mesh}': {e}") from e


def _strategy(strategy: Any, mesh: Mesh) -> ParsedStrategy:
    if strategy is not None and not isinstance(strategy, str):
        hint = f"; write '{'+'.join(strategy)}'" if isinstance(strategy, (list, tuple)) and strategy and \
            all(isinstance(w, str) for w in strategy) else ""
        raise StrategyError(f"parallelize: strategy must be text naming strategies joined with '+' (registered: "
                            f"{', '.join(registered())}; e.g. 'dp+megatron'), or None for annotations only; got "
                            f"{_given(strategy)}{hint}")
    return parse_strategy(strategy, mesh)


def _check_annotations(annotations: Any) -> None:
    if annotations is None:
        return
    if not isinstance(annotations, Mapping):
        hint = "; for (name, placement) pairs pass dict(pairs)" if isinstance(annotations, (list, tuple)) and \
            all(isinstance(p, (list, tuple)) and len(p) == 2 for p in annotations) else ""
        raise StrategyError(f"parallelize: annotations must be a mapping from value name to placement, e.g. "
                            f"{{'x': '[dp, -]'}}, or None; got {_given(annotations)}{hint}")
    for key in annotations:
        if not isinstance(key, str):
            raise StrategyError(f"parallelize: annotations are keyed by value name, as print_graph prints it (e.g. "
                                f"'x' or '%x'); got the key {_given(key)}")


def parallelize(graph: Graph, mesh: Mesh | str | None = None, strategy: str | None = None,
                annotations: Mapping[str, str | Placement] | None = None, *,
                allow_replication: bool = False, bucket_mb: float | None = 25.0,
                first_bucket_mb: float | None = 1.0, order: bool = True, prefetch: int = 1,
                gather_mb: float | None = 4.0, microbatches: int | None = None, schedule: str | None = None,
                virtual_stages: int | None = None, stages: "Sequence[str] | Sequence[int] | None" = None,
                recompute: "bool | str | Sequence[str] | None" = None, unroll: bool = True,
                plan: Any = None) -> Any:
    """Rewrite ``graph`` (forward or training step; not changed) for ``mesh``.

    ``plan``: a ``partita.Plan`` (``partita.plan``, docs/plan.md) in place of ``mesh``,
    ``strategy`` and the pipeline options: its mesh, strategy words, microbatches, schedule,
    virtual stages, stage cut and recompute are applied as they are.

    ``mesh``: a Mesh or its text (``"dp=2,tp=2"``). ``strategy``: registered strategy words
    joined with ``+`` (partita/parallel/strategies/), or None; ``annotations``: placements by
    value name (as ``print_graph`` names the values), e.g. ``{"x": "[dp, -]"}``, applied after
    the strategies. Ops without a sharding rule are replicated; where that makes a rank gather
    a value the strategy split (the batch, a weight), this raises a StrategyError naming the op
    unless ``allow_replication`` is true (the plan lists those ops either way).
    ``bucket_mb``: gradient all_reduces and reduce_scatters of the per-rank program are
    fused into buckets of at most this many MiB (None: not bucketed), the first of each kind
    at most ``first_bucket_mb`` so that it starts early in the backward pass, as DDP's 25 MiB
    buckets after a 1 MiB first one; ``order``: the collectives get one program-derived order (order-collectives).
    ``prefetch``: zero3 issues each param's all_gather this many param gathers ahead of its
    use, so that it overlaps the compute before (0: just in time, the least memory).
    ``gather_mb``: zero3's param all_gathers are fused into buckets of at most this many MiB
    of gathered params, taken in the order the program reads them (None: one per param).

    With ``pp`` in the strategy (``"pp"``, ``"pp+dp"``, ``"pp+dp+megatron"``, ...) the model is
    cut into pipeline stages over the mesh's ``pp`` axis and a ``PipelineProgram`` is returned
    (partita/parallel/pipeline/): ``microbatches`` (default 1) splits the batch,
    ``schedule`` is ``"1f1b"`` (default), ``"gpipe"``, ``"interleaved"`` (with
    ``virtual_stages`` chunks per rank) or ``"zero-bubble"``; ``stages`` names the cut
    (``["h.3", "h.7"]``: the layers later stages start at) or gives layers per stage
    (``[3, 3, 2]``); by default the cut balances the stages' work; ``recompute``
    (``"full"``, ``"selective"``, ``"cheap"``/True, ``"none"``/False) is the activation
    recomputation of every chunk's backward (default: the step's own, from
    ``training_step(..., recompute=...)``), or a list of one per pp stage (``["full", "none"]``:
    a chunk takes its rank's; the step built without recomputation). A forward graph gets a forward-only (inference)
    pipeline. ``unroll=False`` (pipelines only) keeps each stage's one-microbatch template and
    its schedule without unrolling them into per-rank programs: enough for
    ``partita.cluster.simulate`` (section by section, docs/cluster.md), in a time that does not
    grow with the microbatches, but not for running.
    """
    import time

    if plan is not None:
        return _parallelize_plan(graph, mesh, strategy, plan, annotations, unroll,
                                 allow_replication=allow_replication, bucket_mb=bucket_mb,
                                 first_bucket_mb=first_bucket_mb, order=order, prefetch=prefetch, gather_mb=gather_mb)
    t0 = time.perf_counter()
    _check_graph(graph)
    m = _mesh(mesh)
    s = _strategy(strategy, m)
    _check_annotations(annotations)
    if not isinstance(unroll, bool):
        raise StrategyError(f"parallelize: unroll must be True or False, got {_given(unroll)}")
    if "pp" in s:
        from .pipeline.driver import parallelize_pipeline

        return parallelize_pipeline(graph, m, s, annotations, microbatches=1 if microbatches is None else microbatches,
                                    schedule="1f1b" if schedule is None else schedule,
                                    virtual_stages=1 if virtual_stages is None else virtual_stages, stages=stages,
                                    recompute=recompute, unroll=unroll, parallelize_stage=parallelize_spmd,
                                    allow_replication=allow_replication, bucket_mb=bucket_mb,
                                    first_bucket_mb=first_bucket_mb, order=order, prefetch=prefetch,
                                    gather_mb=gather_mb)
    pipeline_only = [k for k, x in (("microbatches", microbatches), ("schedule", schedule),
                                    ("virtual_stages", virtual_stages), ("stages", stages),
                                    ("recompute", recompute), ("unroll", None if unroll else False))
                    if x is not None]
    if pipeline_only:
        raise StrategyError(f"parallelize: {', '.join(pipeline_only)} {'is' if len(pipeline_only) == 1 else 'are'} "
                            f"options of pipeline parallelism, but strategy {s} has no 'pp'; add it (e.g. "
                            f"strategy='pp+{s}' on a mesh with a pp axis) or leave {pipeline_only[0]} out"
                            + ("; a step recomputes on any mesh when built with training_step(..., recompute=...)"
                               if "recompute" in pipeline_only else ""))
    return parallelize_spmd(graph, m, s, annotations, allow_replication=allow_replication, bucket_mb=bucket_mb,
                            first_bucket_mb=first_bucket_mb, order=order, prefetch=prefetch, gather_mb=gather_mb,
                            started=t0)


@dataclass
class SpmdPartition:
    """The SPMD rewrite up to the per-rank program (``partition_spmd``): the placed copy of the
    global graph, what placed it, and the per-rank program the strategies' passes start from."""

    graph: Graph                    # the copy of the caller's graph, every value placed
    local: Graph                    # the per-rank program, before the strategies' passes
    mesh: Mesh
    strategy: ParsedStrategy
    ctx: AnnotationContext
    prop: PropagationReport
    part: Any                       # partition's report
    forced: list[str]               # ops replicated for want of a sharding rule
    timings: dict[str, float]
    started: float
    tracked: TrackedPartition | None = None


def _parallelize_plan(graph: Graph, mesh: Any, strategy: Any, plan: Any,
                      annotations: Mapping[str, str | Placement] | None, unroll: bool, **options: Any) -> Any:
    """``parallelize(graph, plan=plan)``: the plan's mesh, strategy and pipeline options applied."""
    if mesh is not None or strategy is not None:
        raise StrategyError("parallelize: a plan names its own mesh and strategy; pass plan= alone, or mesh= and "
                            "strategy= without it")
    if not callable(getattr(plan, "parallelize_options", None)):
        raise StrategyError(f"parallelize: plan must be a partita.Plan (partita.plan or Plan.from_json), got "
                            f"{_given(plan)}")
    # The plan's own per-value placements (the sharding integer program's), the caller's winning.
    own = plan.annotations_for(graph) if callable(getattr(plan, "annotations_for", None)) else {}
    merged = {**own, **(annotations or {})} if own else annotations
    return parallelize(graph, annotations=merged, **plan.parallelize_options(unroll=unroll), **options)


def parallelize_spmd(graph: Graph, mesh: Mesh, strategy: "ParsedStrategy | str | None",
                     annotations: Mapping[str, str | Placement] | None = None, *,
                     allow_replication: bool = False, bucket_mb: float | None = 25.0,
                     first_bucket_mb: float | None = 1.0, order: bool = True, prefetch: int = 1,
                     gather_mb: float | None = 4.0, track: bool = False, repeat: MicrobatchRepeat | None = None,
                     started: float | None = None) -> "ParallelProgram":
    """The SPMD rewrite behind ``parallelize`` (no pipeline), in four named stages:
    ``partition_spmd`` (annotate, propagate, partition), the strategies' passes, the
    collectives bucketed and ordered, and the plan. The pipeline driver calls it on each
    stage's template with ``track`` (the result's ``tracked`` says what each caller's node and
    value became) and ``repeat`` (the template's microbatch count, see MicrobatchRepeat).
    Options as ``parallelize``'s."""
    sp = partition_spmd(graph, mesh, strategy, annotations, allow_replication=allow_replication, track=track,
                        repeat=repeat, started=started)
    local = run_strategy_passes(sp)
    buckets, gathers = bucket_and_order(local, sp.timings, bucket_mb=bucket_mb, first_bucket_mb=first_bucket_mb,
                                        order=order, prefetch=prefetch, gather_mb=gather_mb)
    return finish_program(sp, local, graph, buckets, gathers)


def partition_spmd(graph: Graph, mesh: Mesh, strategy: "ParsedStrategy | str | None",
                   annotations: Mapping[str, str | Placement] | None = None, *, allow_replication: bool = False,
                   track: bool = False, repeat: MicrobatchRepeat | None = None,
                   started: float | None = None) -> SpmdPartition:
    """Annotate a copy of ``graph`` with the strategies and ``annotations``, propagate the
    placements, refuse (unless ``allow_replication``) an op the strategy would replicate, and
    partition it into the per-rank program."""
    import time

    timings: dict[str, float] = {}
    t0 = time.perf_counter() if started is None else started
    s = strategy if isinstance(strategy, ParsedStrategy) else _strategy(strategy, mesh)
    g = graph.clone()
    # With track, what each node and value of the caller's graph became in the copy (the
    # strategies rewrite the copy in place: its original nodes keep their identity).
    origin = (dict(zip(graph.nodes, g.nodes)), dict(zip(graph.values(), g.values()))) if track else None
    times, once, acc = _repeat_in_copy(graph, g, repeat)
    ctx = annotate(g, mesh, s, annotations, graph.name)
    timings["annotate"] = time.perf_counter() - t0
    t1 = time.perf_counter()
    prop = _propagate(g, ctx, s, times, once, acc)
    timings["propagate"] = time.perf_counter() - t1
    forced = _forced_replication(g, prop)
    if forced and not allow_replication and s:
        raise StrategyError(
            f"strategy {s} on {mesh}: {forced[0]}; the op has no sharding rule, so every rank would gather its "
            "operands whole. Add a rule for it in partita/parallel/sharding.py, or pass allow_replication=True "
            "to accept the gather" + (f" ({len(forced)} such ops)" if len(forced) > 1 else ""))
    t2 = time.perf_counter()
    real_sizes = ctx.padding.values if ctx.padding is not None else None
    tracked = None
    if origin is not None:
        from .partition import partition_tracked

        local, part, spans, vmap = partition_tracked(g, prop.reshards, real_sizes=real_sizes)
        tracked = TrackedPartition(spans, vmap, origin[0], origin[1], g)
    else:
        local, part = partition_with_report(g, prop.reshards, real_sizes=real_sizes)
    timings["partition"] = time.perf_counter() - t2
    return SpmdPartition(g, local, mesh, s, ctx, prop, part, forced, timings, t0, tracked)


def _repeat_in_copy(graph: Graph, g: Graph, repeat: MicrobatchRepeat | None) -> tuple[int, set, set]:
    """``repeat``'s microbatch count and its once-per-step and accumulated values, as values
    of the copy ``g`` of ``graph``."""
    if repeat is None:
        return 1, set(), set()
    to_copy = dict(zip(graph.values(), g.values()))
    return (repeat.times, {to_copy[v] for v in repeat.once if v in to_copy},
            {to_copy[v] for v in repeat.accumulated if v in to_copy})


def annotate(g: Graph, m: Mesh, s: ParsedStrategy, annotations: Mapping[str, str | Placement] | None,
             name: str) -> AnnotationContext:
    """Clear ``g``'s placements and place the values the strategies and the user's
    ``annotations`` name (the user's win); ``name`` is the caller's graph name, for errors."""
    for v in g.values():
        v.placement = None
    g.mesh = m
    ctx = AnnotationContext(g, m, s)
    # In each strategy's order: megatron first, the ZeRO presets shard the optimizer state on
    # top of its weight splits.
    for st in s.annotation_order():
        st.annotate(ctx)
    if annotations:
        names = {nm: v for v, nm in value_names(g).items()}
        for key_text, text in annotations.items():
            key = key_text.lstrip("%")
            if key not in names:
                near = difflib.get_close_matches(key, list(names), n=3)
                hint = f"; did you mean {', '.join('%' + x for x in near)}?" if near else \
                    "; value names are as print_graph prints them"
                raise StrategyError(f"annotation on %{key}: @{name} has no value of that name{hint}")
            v = names[key]
            p = parse_placement(text, v.type.rank, f"annotation on %{key}")
            try:
                p.validate(v.type.shape, m, f"%{key}")
            except PlacementError as e:
                raise StrategyError(f"annotation on %{key} {v.type}: {e}") from e
            ctx.place(v, p)
    if s:
        # Whatever the strategies left free among the inputs is whole: propagation then runs
        # forward from the inputs, and no annotated intermediate pulls its producers along.
        for v in g.inputs:
            ctx.fixed.setdefault(v, Placement.replicated(v.type.rank))
    # An updated param or state keeps its input's placement, so that each rank's new piece is
    # the next step's input piece (the output aliases its input): a gradient that arrives in
    # another placement (summed from a pipeline stage that shares the weight) is resharded.
    for new, old in zip(g.outputs, g.output_aliases or []):
        if old is not None and old in ctx.fixed and new.producer is not None and new not in ctx.fixed \
                and new not in ctx.late:
            ctx.late[new] = ctx.fixed[old]
    for v, p in ctx.fixed.items():
        v.placement = p
    return ctx


def _propagate(g: Graph, ctx: AnnotationContext, s: ParsedStrategy, times: int, once: set,
               acc: set) -> PropagationReport:
    """Propagate the annotated placements over ``g``; with late placements (updated params
    kept in their input's placement) a second run settles them."""
    try:
        # With late placements the second run below records the reshards of every node: this
        # run's would be dropped, so it only places the values.
        prop = propagate(g, sinks=list(ctx.sinks), repeat=times, once=once, accumulated=acc,
                         resolve=not ctx.late)
    except PropagationError as e:
        raise StrategyError(f"strategy {s}: {e}") from e
    if ctx.late:
        # Everything is placed now: this second run only settles each node against its rule
        # and records the reshards the late placements ask for.
        for v, p in ctx.late.items():
            v.placement = p
        try:
            prop = propagate(g, repeat=times, once=once, accumulated=acc)
        except PropagationError as e:
            raise StrategyError(f"strategy {s}: {e}") from e
    return prop


def run_strategy_passes(sp: SpmdPartition) -> Graph:
    """The strategies' own passes on the per-rank program, in each strategy's order, timed."""
    import time

    local = sp.local
    for st in sp.strategy.annotation_order():
        for ps in st.passes(sp.ctx):
            t = time.perf_counter()
            local = ps.run(local)
            sp.timings[ps.name] = sp.timings.get(ps.name, 0.0) + time.perf_counter() - t
    return local


def bucket_and_order(local: Graph, timings: dict[str, float], *, bucket_mb: float | None,
                     first_bucket_mb: float | None, order: bool, prefetch: int,
                     gather_mb: float | None) -> tuple[Any, Any]:
    """``bucket-gradients``, ``bucket-gathers`` and ``order-collectives`` on the per-rank
    program, as the options ask; their reports (None where not run)."""
    import time

    buckets = gathers = None
    if bucket_mb is not None or order or gather_mb is not None:
        from .bucket import bucket_gathers, bucket_gradients, order_collectives

        t3 = time.perf_counter()
        if bucket_mb is not None:
            buckets = bucket_gradients(local, bucket_mb, first_bucket_mb)
        if gather_mb is not None:
            gathers = bucket_gathers(local, gather_mb)
        if order:
            order_collectives(local, prefetch)
        timings["bucket+order"] = time.perf_counter() - t3
    return buckets, gathers


def finish_program(sp: SpmdPartition, local: Graph, source: Graph, buckets: Any, gathers: Any) -> "ParallelProgram":
    """The plan (with the buckets made) and the ParallelProgram of the finished per-rank
    program ``local``; ``source`` is the caller's graph."""
    import time

    sp.timings["total"] = time.perf_counter() - sp.started
    g, m, s = sp.graph, sp.mesh, sp.strategy
    plan = build_plan(g, local, m, str(s), sp.prop, sp.part, sp.ctx.notes + [f"replicated: {f}" for f in sp.forced],
                      sp.timings)
    # The collectives the strategies' own passes inserted (cp's), as they listed them.
    plan.collectives.extend(sp.ctx.shared.get("pass_collectives", ()))
    if buckets is not None or gathers is not None:
        plan.buckets = [{"op": b.op, "axis": b.axis, "members": list(b.members), "bytes": b.bytes}
                        for rep in (buckets, gathers) if rep is not None for b in rep.fused]
    plan.program_collectives = sum(1 for n in local.nodes if OPS[n.op].collective is not None)
    return ParallelProgram(g, local, m, s, plan, sp.prop, sp.part, source=source, padding=sp.ctx.padding,
                           tracked=sp.tracked)


def _forced_replication(g: Graph, prop: PropagationReport) -> list[str]:
    """Ops without a rule whose operands arrive split or partial (a gather or reduction that
    only the missing rule forces)."""
    names = value_names(g)
    out = []
    for node in g.nodes:
        if sharding_spec(node.op, [o.type for o in node.operands], node.attrs) is not None:
            continue
        # The placements before the forced reshard are the producers' own.
        bad = [o for o in node.operands if o.placement is not None and not o.placement.is_replicated]
        if bad:
            res = ", ".join(f"%{names.get(r, '?')}" for r in node.results)
            line = f" (line {node.loc.line})" if node.loc is not None and getattr(node.loc, "line", None) else ""
            out.append(f"{res} = {node.op}{line} gets %{names.get(bad[0], '?')} placed {bad[0].placement}")
    return out


__all__ = ["parallelize", "parse_placement"]
