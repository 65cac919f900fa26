"""``plan(model, cluster, memory=...)``: the fastest plan that fits, explained (docs/plan.md)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import gc
import time
from typing import Any, Callable, Iterator

from ..cluster.hardware import Cluster, load_cluster, parse_quantity
from ..ir import Graph, PartitaError
from .bounds import Candidate, lower_bound, memory_bytes, time_parts
from .floor import LayerCosts, layer_costs, step_floor
from .memory_family import pipeline_zero3_candidates, stage_recompute_candidates
from .plan import RECOMPUTE, Plan
from .search import (CAUSES, GIB, SHARDINGS, Pricer, candidate_plan, cp_candidates, cp_reason, enumerate_candidates,
                     milp_variant)
from .shape import ModelShape, PlanError, model_shape

# A mesh is not priced when its estimate, scaled by the least simulated/estimated ratio of the
# plans priced so far, is more than this much slower than the best priced step.
CALIBRATED_MARGIN = 1.15


def plan(model: Graph, cluster: Cluster | str, memory: str | float | None = None, *, devices: int | None = None,
         global_batch: int | None = None, recompute: str | tuple[str, ...] | None = None, price: int = 4,
         loss: str = "cross_entropy", optimizer: str = "adamw", master_weights: bool = True,
         progress: Callable[[str], None] | None = None, sharding: str = "words") -> Plan:
    """The fastest plan of ``model`` (a forward graph or training step) on ``devices`` devices of
    ``cluster`` within ``memory`` bytes per device (default the device's memory); see docs/plan.md.
    ``price``: how many of the best estimated meshes the simulator prices. ``sharding``: the placements
    of a tp axis (no pipeline): "words" (the strategy words', megatron and sp), "milp" (the per-op
    sharding integer program's) or "both" (each priced, the faster kept). PlanError when nothing fits."""
    with cyclic_gc_paused():
        return search_plan(model, cluster, memory, devices, global_batch, recompute, price, loss, optimizer,
                           master_weights, progress, sharding)


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic collector off while planning, as it was after. Planning allocates
    millions of IR objects that live until a candidate is priced; each full collection walks
    them all (about a sixth of a plan's CPU seconds, docs/plan.md), and what it would free is
    freed when the caller's collector next runs."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def leave_garbage_to_exit() -> None:
    """For a process that ends after planning (the ``partita plan`` command): the cyclic collector
    stays off, and at the exit what is left is frozen (``gc.freeze``) rather than collected.
    The priced candidates' IR is cyclic garbage of millions of objects; collecting it, when
    ``plan`` turns the collector back on or at the interpreter's exit, frees memory no one uses
    any more and took about a tenth of the command's CPU seconds (docs/plan.md)."""
    gc.disable()
    atexit.register(gc.freeze)


def search_plan(model: Graph, cluster: Cluster | str, memory: str | float | None, devices: int | None,
                global_batch: int | None, recompute: str | tuple[str, ...] | None, price: int, loss: str,
                optimizer: str, master_weights: bool, progress: Callable[[str], None] | None,
                sharding: str) -> Plan:
    """``plan``'s search (its arguments as ``plan`` takes them)."""
    if sharding not in SHARDINGS:
        raise PlanError(f"plan: sharding={sharding!r:.40} is not one of {', '.join(SHARDINGS)}")
    t_start = time.perf_counter()
    say = progress or (lambda s: None)
    graph, cl, cap, n, training = check_inputs(model, cluster, memory, devices)
    shape = model_shape(graph)
    if global_batch is not None and global_batch != shape.batch:
        raise PlanError(f"plan: global_batch={global_batch}, but @{graph.name} is built for batch {shape.batch}; "
                        "build the graph at the global batch (partita.models.gpt(..., batch=...))")
    recomputes = recompute_choices(recompute, training)
    cands, invalid = enumerate_candidates(shape, cl, n, recomputes)
    mems = {c: memory_bytes(shape, c) for c in cands}
    # cp when the sequence is long, or when meshes without it exist but none fits the cap.
    cp_why = cp_reason(shape, not mems or any(m <= cap for m in mems.values()))
    if cp_why is None:
        more = cp_candidates(shape, cl, n, recomputes)
        cands += more
        mems.update((c, memory_bytes(shape, c)) for c in more)
    # The memory family: per-stage recomputation and zero3 beside a pipeline, where they alone fit.
    saving = stage_recompute_candidates(shape, cands, mems, cap, recomputes) + \
        pipeline_zero3_candidates(shape, cands, mems, cap)
    cands += saving
    mems.update((c, memory_bytes(shape, c)) for c in saving)
    if not cands:
        raise PlanError(f"plan: {n} devices factor into no valid mesh for @{graph.name}: " + "; ".join(invalid[:4]) +
                        ". Use a device count that a power-of-two tp dividing the heads and a dp dividing the batch make")
    fit = [c for c in cands if mems[c] <= cap]
    if not fit:
        raise PlanError(no_fit_message(graph, shape, cl, cap, n, recomputes, min(mems.values())))
    est = {c: sum(time_parts(shape, c, cl).values()) for c in fit}
    costs = layer_costs(graph, cl, shape.layers)
    t_search = time.perf_counter() - t_start
    say(f"{len(cands)} candidates, {len(fit)} within {cap / GIB:.1f} GiB")
    pricer = Pricer(graph, cl, training, {"loss": loss, "optimizer": optimizer, "master_weights": master_weights})
    priced = price_best(shape, fit, est, mems, pricer, cap, n, cl, price, say, costs, sharding)
    if not priced:
        raise PlanError(f"plan: none of the best {price} candidates of @{graph.name} could be built or fits; "
                        "raise price= or the memory cap")
    priced.sort(key=lambda p: float("inf") if p.step_time is None else p.step_time)
    best = priced[0]
    chosen = pricer.origin[id(best)]
    best.report = {
        "candidates": len(cands), "within_cap": len(fit), "priced": len(priced) + len(pricer_failures(pricer)),
        "skipped_by_bound": pricer.skipped,
        "next": [summary(p) for p in priced[1:]], "invalid": invalid[:10],
        "rejected": rejected_families(shape, cands, fit, mems, est, chosen, cap, cl),
        "families": family_verdicts(shape, cands, mems, est, priced, pricer, chosen, cap, cl, cp_why),
        "failed": pricer_failures(pricer), "sharding": pricer.sharding_notes,
        "seconds": {"search": t_search, **pricer.seconds, "total": time.perf_counter() - t_start}}
    refused = refused_families(shape, n)
    if refused:
        best.report["refused"] = refused
    unruled = replicated_for_lack_of_rule(graph)
    if unruled:
        best.report["replicated"] = unruled
    return best


def replicated_for_lack_of_rule(graph: Graph) -> list[str]:
    """The graph's nodes that have no sharding rule, each with why: the passes replicate them
    (every rank computes them whole), whatever the plan; one line per op and source place."""
    from ..ir.printer import value_names
    from ..parallel.sharding import WITHOUT_RULE, sharding_spec

    names = value_names(graph)
    out: list[str] = []
    seen: set[tuple[str, str]] = set()
    for node in graph.nodes:
        if sharding_spec(node.op, [v.type for v in node.operands], node.attrs) is not None:
            continue
        where = str(node.loc) if node.loc is not None else ""
        if (node.op, where) in seen:
            continue
        seen.add((node.op, where))
        res = ", ".join(f"%{names.get(r, '?')}" for r in node.results)
        why = WITHOUT_RULE.get(node.op, "no sharding rule: every rank computes it whole, and a consumer that "
                                        "wants a split slices it")
        out.append(f"{res} = {node.op}{' at ' + where if where else ''}: {why}")
    return out


def refused_families(shape: ModelShape, devices: int) -> list[str]:
    """The families the search leaves out for this model, with why (empty for a transformer)."""
    if shape.pipeline or shape.layers < 2 or devices < 2:
        return []
    return [f"pp: partita's pipeline cuts between layers named <prefix>.<i>.<name> (or module scopes ending in a "
            f"number); the {shape.layers} linear layers of this model are not so named, so no mesh has a pp axis"]


def pricer_failures(pricer: Pricer) -> list[str]:
    """The priced candidates that could not be built, with why."""
    return pricer.failures


def check_inputs(model: Any, cluster: Any, memory: Any, devices: Any) -> tuple[Graph, Cluster, float, int, bool]:
    """The graph, cluster, memory cap (bytes), device count and whether the graph is a training step."""
    from ..parallel.pipeline.build import is_training

    if not isinstance(model, Graph):
        raise PlanError(f"plan: the model must be a partita Graph (a forward graph or a training step), got "
                        f"{type(model).__name__}")
    cl = load_cluster(cluster)
    cap = cl.device.memory if memory is None else (
        float(memory) if isinstance(memory, (int, float)) else parse_quantity(memory, "bytes"))
    size = cl.nodes * cl.gpus_per_node
    n = size if devices is None else devices
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise PlanError(f"plan: devices must be a positive int, got {devices!r:.40}")
    if n > size:
        raise PlanError(f"plan: devices={n}, but cluster {cl.name!r} has {size} ({cl.nodes} nodes x "
                        f"{cl.gpus_per_node}); use cluster.with_nodes(...) or fewer devices")
    if n > cl.gpus_per_node and n % cl.gpus_per_node:
        raise PlanError(f"plan: devices={n} is not whole nodes of {cl.gpus_per_node}; use a multiple of it")
    return model, cl, cap, n, is_training(model)


def recompute_choices(recompute: Any, training: bool) -> tuple[str, ...]:
    """The recomputations to search: all three for a forward graph; a step's own for a step."""
    if recompute is None:
        return ("none",) if training else RECOMPUTE
    rc = (recompute,) if isinstance(recompute, str) else tuple(recompute)
    bad = [r for r in rc if r not in RECOMPUTE]
    if bad or not rc:
        raise PlanError(f"plan: recompute={recompute!r:.60} must be one or more of {', '.join(RECOMPUTE)}")
    return rc


def no_fit_message(graph: Graph, shape: ModelShape, cl: Cluster, cap: float, n: int, recomputes: tuple[str, ...],
                   least: float) -> str:
    """What would fit: the smallest memory on these devices, the smallest device count at this cap."""
    more = None
    k = n * 2
    size = cl.nodes * cl.gpus_per_node
    while k <= max(size, n) * 64:
        cands, _ = enumerate_candidates(shape, cl, k, recomputes)
        if cp_reason(shape, False) is None:
            cands += cp_candidates(shape, cl, k, recomputes)
        if any(memory_bytes(shape, c) <= cap for c in cands):
            more = k
            break
        k *= 2
    tail = f"; at {cap / GIB:.1f} GiB it needs at least {more} devices" if more else \
        "; no device count up to 64 times this one fits it"
    return (f"plan: no plan of @{graph.name} fits {cap / GIB:.1f} GiB per device on {n} devices of {cl.name!r}: "
            f"the smallest needs {least / GIB:.1f} GiB{tail}. Raise the memory cap or add devices")


def price_best(shape: ModelShape, fit: list[Candidate], est: dict, mems: dict, pricer: Pricer, cap: float, n: int,
               cl: Cluster, price: int, say: Callable[[str], None], costs: LayerCosts | None = None,
               sharding: str = "words") -> list[Plan]:
    """Simulate the best estimated candidate of each of the ``price`` best meshes of each search
    family (the pp x dp x tp meshes first, then hsdp's, then cp's: ``Candidate.kind``); the plans that
    fit. ``costs``: the layer costs of the step-time floor (floor.py), which skips a mesh that cannot
    win; ``sharding``: whose placements a tp axis takes (``price_candidate``)."""
    pricer.failures, pricer.skipped, pricer.sharding_notes = [], 0, []
    run = PricingRun(shape, est, mems, pricer, cap, n, cl, say, costs, sharding, set(fit))
    base_fits = any(c.kind() == "base" for c in fit)
    for kind in FAMILIES:
        # A family that is all there is (cp when no pp x dp x tp mesh fits) gets the whole budget.
        run.price_family([c for c in fit if c.kind() == kind],
                         price if kind == "base" or not base_fits else EXTRA_PRICE)
    return run.out


# The search families, priced in this order, each with its own budget of meshes: ``price`` for
# the pp x dp x tp meshes, EXTRA_PRICE for hsdp's and cp's (whose best estimated mesh is what a
# family's gain rests on; a second costs planning time, docs/plan.md).
FAMILIES = ("base", "hsdp", "cp", "memory")
EXTRA_PRICE = 1


@dataclasses.dataclass
class PricingRun:
    """``price_best``'s state: the best priced step and the least simulated/estimated ratio so far,
    shared by the families, and the plans that fit."""

    shape: ModelShape
    est: dict
    mems: dict
    pricer: Pricer
    cap: float
    n: int
    cl: Cluster
    say: Callable[[str], None]
    costs: LayerCosts | None
    sharding: str
    fitting: set
    best_time: float = float("inf")
    ratio: float = 0.0
    out: list = dataclasses.field(default_factory=list)

    def price_family(self, members: list[Candidate], budget: int) -> None:
        """Price the best estimated candidate of each of the ``budget`` best meshes of ``members``,
        skipping those the bounds say cannot win."""
        seen: set = set()
        shape, cl, est = self.shape, self.cl, self.est
        for c in sorted(members, key=lambda c: est[c]):
            key = (c.pp, c.dp, c.tp, c.recompute) + ((c.cp, c.fsdp) if c.kind() != "base" else ()) + \
                ((c.stage_recompute, c.zero) if c.kind() == "memory" else ())
            if key in seen or dominated(c, self.fitting):
                continue
            if len(seen) >= budget:
                break
            seen.add(key)
            # The lower bounds, and the estimate scaled by the least simulated/estimated ratio seen.
            p = candidate_plan(shape, c, self.n, cl)
            floor = step_floor(self.costs, shape, c, p.stages) if self.costs is not None else 0.0
            # A chain of linear layers has few meshes and the transformer estimate's tp traffic
            # does not hold for it: each is priced unless its lower bound loses.
            calibrated = 0.0 if shape.row_activation_bytes else self.ratio
            if max(lower_bound(shape, c, cl), floor) > self.best_time or \
                    est[c] * calibrated > self.best_time * CALIBRATED_MARGIN:
                self.pricer.skipped += 1
                continue
            for q in price_candidate(shape, c, p, est, self.mems, self.pricer, self.cap, self.sharding, self.say):
                self.pricer.origin[id(q)] = c
                assert q.step_time is not None and q.memory is not None
                if q.memory <= self.cap:
                    self.out.append(q)
                    self.best_time = min(self.best_time, q.step_time)
                self.ratio = q.step_time / est[c] if not self.ratio else min(self.ratio, q.step_time / est[c])


def price_plan(shape: ModelShape, c: Candidate, p: Plan, est: dict, mems: dict, pricer: Pricer, cap: float,
               say: Callable[[str], None]) -> Plan | None:
    """Plan ``p`` of candidate ``c`` priced by the simulator (None where it cannot be built: the failure kept)."""
    try:
        step_time, mfu, peak = pricer.price_scaled(p, shape)
    except PartitaError as e:
        pricer.failures.append(f"{p.describe()}: {str(e)[:200]}")
        return None
    p.step_time, p.mfu, p.estimate = step_time, mfu, est[c]
    p.memory, p.memory_cap = max(mems[c], peak or 0.0), cap
    say(f"priced {p.describe()}: {step_time:.3f} s, {p.memory / GIB:.1f} GiB")
    return p


def price_candidate(shape: ModelShape, c: Candidate, p: Plan, est: dict, mems: dict, pricer: Pricer, cap: float,
                    sharding: str, say: Callable[[str], None]) -> list[Plan]:
    """Candidate ``c`` priced with the strategy words' placements (``p``) and, for a tp axis without
    a pipeline, with the per-op sharding integer program's (``sharding``: "words", "milp" or
    "both"); the plans priced, the comparison noted in ``pricer.sharding_notes``."""
    tries = [p]
    choice = None
    if sharding != "words" and c.tp > 1 and c.pp == 1:
        step, choice = pricer.sharding(c.tp, c.recompute)
        if step is None:
            pricer.failures.append(f"{p.describe()} placements=milp: {choice}")
            choice = None
        else:
            tries = [milp_variant(p, step, choice)] + ([p] if sharding == "both" else [])
    got = [q for q in (price_plan(shape, c, t, est, mems, pricer, cap, say) for t in tries) if q is not None]
    if choice is not None:
        by = {q.sharding: q.step_time for q in got}
        fits = [q for q in got if (q.memory or 0.0) <= cap]
        kept = min(fits, key=lambda q: q.step_time or 0.0).sharding if fits else None
        pricer.sharding_notes.append({
            "mesh": p.mesh, "recompute": c.recompute, "words_s": by.get("words"), "milp_s": by.get("milp"),
            "objective_s": choice.objective, "lp_bound_s": choice.lp_bound, "integral_lp": choice.integral_lp,
            "split_classes": sum(1 for lab in choice.choices.values() if lab is not None),
            "classes": len(choice.choices), "kept": kept})
    return got


def dominated(c: Candidate, fitting: set[Candidate]) -> bool:
    """Whether the same candidate with less recomputation fits too (recomputation only adds work)."""
    lighter = RECOMPUTE[:RECOMPUTE.index(c.recompute)]
    return any(dataclasses.replace(c, recompute=r) in fitting for r in lighter)


def summary(p: Plan) -> dict:
    """A priced plan as one report row."""
    return {"plan": p.describe(), "step_s": p.step_time, "mfu": p.mfu, "memory_GiB": (p.memory or 0) / GIB}


def rejected_families(shape: ModelShape, cands: list[Candidate], fit: list[Candidate], mems: dict, est: dict,
                      chosen: Candidate, cap: float, cl: Cluster) -> list[dict]:
    """Each family but the chosen one's: over the cap by how much, or how much slower and why."""
    fams: dict[str, list[Candidate]] = {}
    for c in cands:
        fams.setdefault(c.family(), []).append(c)
    mine = time_parts(shape, chosen, cl)
    base = sum(mine.values())
    out = []
    for fam, members in fams.items():
        if fam == chosen.family():
            continue
        ok = [c for c in members if c in est]
        if not ok:
            least = min(mems[c] for c in members)
            out.append({"family": fam, "why": f"over the cap by {(least - cap) / GIB:.1f} GiB at best", "slower": None})
            continue
        b = min(ok, key=lambda c: est[c])
        slower = est[b] / base - 1
        out.append({"family": fam, "slower": slower,
                    "why": f"{slower:+.0%} estimated, because of {CAUSES[main_cause(shape, b, mine, cl)]}"})
    out.sort(key=lambda r: (r["slower"] is None, r["slower"] or 0.0))
    return out


def main_cause(shape: ModelShape, c: Candidate, mine: dict[str, float], cl: Cluster) -> str:
    """The estimate's part by which ``c`` loses most against the chosen plan's parts ``mine``."""
    parts = time_parts(shape, c, cl)
    return max(parts, key=lambda k: parts[k] - mine.get(k, 0.0))


def family_verdicts(shape: ModelShape, cands: list[Candidate], mems: dict, est: dict, priced: list[Plan],
                    pricer: Pricer, chosen: Candidate, cap: float, cl: Cluster, cp_why: str | None) -> dict[str, str]:
    """For hsdp and cp: why the family won, lost (over the cap, slower when simulated, or skipped by
    the bounds, with the estimate's main cause) or was not searched."""
    mine = time_parts(shape, chosen, cl)
    out: dict[str, str] = {}
    for kind in FAMILIES[1:]:
        members = [c for c in cands if c.kind() == kind]
        if kind == chosen.kind():
            out[kind] = f"won: {chosen.family()}"
        elif not members and kind == "memory":
            out[kind] = "not searched: no pipelined mesh fits only with recomputation on some stages or zero3"
        elif not members:
            out[kind] = f"not searched: {cp_why}" if kind == "cp" and cp_why else \
                "not searched: no mesh without a pipeline has dp over more than one node's group " \
                f"({cl.gpus_per_node} devices a node, after tp)"
        elif not any(c in est for c in members):
            least = min(mems[c] for c in members)
            out[kind] = f"lost: over the cap by {(least - cap) / GIB:.1f} GiB at best"
        else:
            out[kind] = family_loss(shape, kind, members, est, priced, pricer, mine, cl)
    return out


def family_loss(shape: ModelShape, kind: str, members: list[Candidate], est: dict, priced: list[Plan],
                pricer: Pricer, mine: dict[str, float], cl: Cluster) -> str:
    """Why a family that fits lost: its best simulated plan against the chosen one, or the bounds' skip."""
    ours = [p for p in priced if pricer.origin[id(p)].kind() == kind]
    best = min(ours, key=lambda p: p.step_time or 0.0) if ours else None
    c = pricer.origin[id(best)] if best is not None else min((c for c in members if c in est), key=lambda c: est[c])
    cause = CAUSES[main_cause(shape, c, mine, cl)]
    if best is not None and priced[0].step_time:
        slower = (best.step_time or 0.0) / priced[0].step_time - 1
        return f"lost: {best.describe()} simulated {slower:+.0%} slower, because of {cause}"
    slower = est[c] / max(sum(mine.values()), 1e-30) - 1
    return f"lost: not simulated (the bounds skipped it); its best estimate {slower:+.0%}, because of {cause}"


def report_text(p: Plan) -> str:
    """The plan and its explanation as text."""
    r = p.report
    gib = (p.memory or 0) / GIB
    lines = [f"chosen: {p.describe()}", f"  simulated step {p.step_time:.3f} s, MFU {p.mfu or 0:.1%}, peak memory "
             f"{gib:.1f} GiB per device (cap {(p.memory_cap or 0) / GIB:.1f} GiB)"]
    if p.stages:
        lines.append(f"  stage cut (layers per stage): {p.stages}")
    if r.get("next"):
        lines.append("next best (simulated):")
        lines += [f"  {x['plan']}: {x['step_s']:.3f} s, MFU {x['mfu'] or 0:.1%}, {x['memory_GiB']:.1f} GiB"
                  for x in r["next"]]
    if r.get("rejected"):
        lines.append("rejected families:")
        lines += [f"  {x['family']}: {x['why']}" for x in r["rejected"][:12]]
    for kind, why in r.get("families", {}).items():
        lines.append(f"{kind}: {why}")
    for x in r.get("sharding", []):
        lines.append(sharding_line(x))
    for why in r.get("refused", []):
        lines.append(f"refused: {why}")
    if r.get("replicated"):
        lines.append("replicated (no sharding rule):")
        lines += [f"  {x}" for x in r["replicated"][:12]]
    for f in r.get("failed", []):
        lines.append(f"  could not build: {f}")
    s = r.get("seconds", {})
    lines.append(f"{r.get('candidates', 0)} candidates, {r.get('within_cap', 0)} within the cap, "
                 f"{r.get('priced', 0)} simulated; " + ", ".join(f"{k} {v:.2f} s" for k, v in s.items()))
    return "\n".join(lines)


def sharding_line(x: dict) -> str:
    """One mesh's placements compared: the words' and the integer program's step, its objective and bound."""
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f} s"
    why = "faster" if x.get("words_s") is not None and x.get("milp_s") is not None else "the only one priced"
    return (f"  placements on {x['mesh']} recompute={x['recompute']}: words {ms(x.get('words_s'))}, integer program "
            f"{ms(x.get('milp_s'))} (objective {x['objective_s'] * 1e3:.3f} ms, LP bound {x['lp_bound_s'] * 1e3:.3f} ms"
            f"{', integral' if x.get('integral_lp') else ''}; {x['split_classes']} of {x['classes']} op classes split)"
            f"; kept {x['kept']} ({why})")
