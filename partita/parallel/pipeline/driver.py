"""``parallelize`` for a strategy with ``pp``: the stage cut, the schedule unrolled into one
program per pp rank, each parallelized with the rest of the strategy over the rest of the
mesh, and the static proof that the ranks' sends, recvs and collectives meet."""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from ...ir.graph import Graph, Value
from ..mesh import Mesh
from ..placement import Placement
from ..strategies.base import ParsedStrategy, StrategyError, UPDATE_OPS
from .build import build_pipeline, forward_of
from .program import PipelineProgram, WholeStage
from .schedule import PipelineError, make_schedule


def _positive(name: str, x: Any, fix: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise PipelineError(f"parallelize: {name} must be a positive int, got {x!r}; {fix}")
    return x


def is_training(graph: Graph) -> bool:
    return any(n.op in UPDATE_OPS for n in graph.nodes) or any(
        v.name and str(v.name).endswith(".grad") for v in graph.outputs[1:])


def parallelize_pipeline(graph: Graph, mesh: Mesh, strategy: ParsedStrategy,
                         annotations: Mapping[str, Any] | None = None, *, microbatches: int = 1,
                         schedule: str = "1f1b", virtual_stages: int = 1,
                         stages: Sequence[str] | Sequence[int] | None = None, **spmd: Any) -> PipelineProgram:
    """The pipeline program of ``graph`` (a training step, or a forward graph for inference)
    on ``mesh`` with ``strategy`` (which includes ``pp``); see ``partita.parallelize``."""
    from ..driver import parallelize

    t0 = time.perf_counter()
    axis = strategy.axis_of("pp")
    assert axis is not None
    S = mesh.axis_size(axis)
    M = _positive("microbatches", microbatches, "the batch is split into that many microbatches (e.g. 2 * the pp size)")
    v = _positive("virtual_stages", virtual_stages, "use 1, or 2 or more with schedule='interleaved'")
    if annotations:
        raise PipelineError("parallelize: annotations by value name are not supported with pp yet (each stage is its "
                            "own program); leave annotations out, or parallelize without pp")
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
    training = is_training(graph)
    sched = make_schedule(schedule, S, M, v, forward_only=not training)
    sched.validate()
    dp_axis = rest.dp_axis
    dp = submesh.axis_size(dp_axis) if (submesh is not None and dp_axis is not None) else 1
    timings: dict[str, float] = {}
    pipe = build_pipeline(graph, S, M, sched, dp_size=dp, axis=axis, cut=stages)
    timings["pipeline"] = time.perf_counter() - t0
    progs: list[Any] = []
    t1 = time.perf_counter()
    for rp in pipe.ranks:
        if submesh is None:
            progs.append(WholeStage(rp.graph))
            continue
        notes = _boundary_annotations(rp, submesh, dp_axis, dp)
        try:
            prog = parallelize(rp.graph, submesh, str(rest), notes, **spmd)
        except StrategyError as e:
            raise PipelineError(f"pp rank {rp.rank} (stage program @{rp.graph.name}): {e}") from None
        prog.local.mesh = mesh
        progs.append(prog)
    timings["stages"] = time.perf_counter() - t1
    out = PipelineProgram(graph, mesh, axis, strategy, pipe, progs, submesh, timings=timings)
    t2 = time.perf_counter()
    check_program(out)
    timings["check"] = time.perf_counter() - t2
    from .report import build_pipeline_plan

    out.plan = build_pipeline_plan(out)
    timings["total"] = time.perf_counter() - t0
    return out


def _boundary_annotations(rp: Any, submesh: Mesh, dp_axis: str | None, dp: int) -> dict[str, Placement]:
    """Placements for every value that crosses between pp ranks: its batch dim split over the
    data-parallel axis (as the stage's batch is), whole along everything else; the sender and
    the receiver annotate alike, so each rank sends and receives its own piece."""
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
        if dp_axis is not None and d is not None and dp > 1 and val.type.shape[d] % dp == 0:
            p = Placement.split(rank, {d: dp_axis})
        else:
            p = Placement.replicated(rank)
        out[str(val.name)] = p
    return out


def check_program(prog: PipelineProgram) -> None:
    """Prove before anything runs that the ranks' programs meet: every send pairs with its
    recv (same type), along every mesh axis each group issues the same collectives in the
    same order (``check_collective_order``), and played in lockstep with sends that wait
    for their recv, the communication never stops (``check_deadlock_free``); raises
    PipelineError naming the ranks and the nodes."""
    from ..bucket import CollectiveOrderError, check_collective_order
    from ..simulate import MeshRunError, check_deadlock_free, pair_point_to_point

    graphs = prog.rank_graphs()
    try:
        pair_point_to_point(graphs, prog.mesh)
        check_collective_order(graphs, prog.mesh)
        check_deadlock_free(graphs, prog.mesh)
    except (MeshRunError, CollectiveOrderError) as e:
        raise PipelineError(f"pipeline on {prog.mesh}: the per-rank programs would not meet: {e}") from None


__all__ = ["check_program", "is_training", "parallelize_pipeline"]
