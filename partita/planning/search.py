"""The search: enumerate the outer choices, prune by analytic bounds, price the survivors.

``plan(model, cluster, memory=...)``: every factorization of the device count into
pp x dp x tp (tp a power of two inside a node, dividing the heads; pp at most the layers;
dp dividing the global batch), plain data parallelism or zero1, sequence parallelism with
tp, microbatch sizes and counts, the 1f1b and interleaved schedules (virtual stages 2 to 8),
and recomputation none/selective/full. Each candidate gets the memory bound and time
estimate of ``bounds``; those over the memory cap are out before anything is simulated
(the cap is a constraint); the best estimated of the distinct meshes and recomputations are
priced by the simulator's section-level path (``unroll=False``), skipping any whose lower
bound already exceeds the best priced step, and the fastest that fits wins. A candidate is
simulated on models of one and two layers per pipeline chunk and scaled to the real depth
(``reduce``) where those are smaller than the model.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable

from ..cluster.hardware import Cluster, load_cluster, parse_quantity
from ..ir import Graph, PartitaError
from ..parallel.pipeline.build import StepCache, using_step_cache
from ..parallel.pipeline.chunk_templates import SectionCache, using_section_cache
from .bounds import Candidate, lower_bound, memory_bytes, recompute_stage_cut, stage_cut, time_parts
from .plan import RECOMPUTE, Plan
from .reduce import scale, truncate_layers
from .shape import ModelShape, PlanError, model_shape

GIB = 1024.0 ** 3
SHARDINGS = ("words", "milp", "both")
# Context parallelism is searched from this sequence length on (or when nothing fits without it).
CP_MIN_SEQ = 16384
CAUSES = {"cp": "cp's key and value gathers", "bubble": "the pipeline bubble", "dp": "exposed dp traffic", "recompute": "recomputation",
          "tp": "tp all-reduces", "memory": "memory-bound ops", "p2p": "pipeline sends", "compute": "smaller matmuls"}


def pow2_divisors(n: int, limit: int) -> list[int]:
    """Powers of two dividing ``n``, at most ``limit``."""
    out, k = [], 1
    while k <= limit and n % k == 0:
        out.append(k)
        k *= 2
    return out


def divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending."""
    small = [d for d in range(1, int(n ** 0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def pipeline_options(shape: ModelShape, pp: int, per_dp: int) -> list[tuple[int, int, str | None, int]]:
    """(micro, microbatches, schedule, virtual stages) of a pipeline with ``per_dp`` sequences per replica."""
    if pp == 1:
        return [(per_dp, 1, None, 1)]
    out: list[tuple[int, int, str | None, int]] = []
    for micro in (1, 2, 4, 8, 16):
        if per_dp % micro:
            continue
        m = per_dp // micro
        if m < pp:
            continue
        out.append((micro, m, "1f1b", 1))
        for v in (2, 3, 4, 6, 8):
            if pp * v <= shape.layers and m % pp == 0:
                out.append((micro, m, "interleaved", v))
    return out


def dp_kinds(pp: int, dp: int) -> tuple[str, ...]:
    """Data-parallel kinds of a mesh: plain and zero1, and zero3 (fully sharded) without a pipeline."""
    if dp == 1:
        return ("dp",)
    return ("dp", "zero1") if pp > 1 else ("dp", "zero1", "zero3")


def enumerate_candidates(shape: ModelShape, cluster: Cluster, devices: int,
                         recomputes: tuple[str, ...]) -> tuple[list[Candidate], list[str]]:
    """Every candidate of the search space, and why whole meshes are invalid."""
    out: list[Candidate] = []
    invalid: list[str] = []
    for tp in pow2_divisors(devices, cluster.gpus_per_node):
        if shape.heads % tp or shape.hidden % tp:
            invalid.append(f"tp={tp}: the layer widths (their divisor {shape.heads}) are not divisible by {tp}"
                           if shape.row_activation_bytes else f"tp={tp}: {shape.heads} heads are not divisible by {tp}")
            continue
        for pp in divisors(devices // tp):
            dp = devices // (tp * pp)
            if pp > shape.layers:
                continue
            if pp > 1 and not shape.pipeline:
                invalid.append(f"pp={pp},dp={dp},tp={tp}: partita's pipeline cuts between layers named "
                               "<prefix>.<i>.<name>; this model's linear layers are not so named")
                continue
            if shape.batch % dp:
                invalid.append(f"pp={pp},dp={dp},tp={tp}: the global batch {shape.batch} is not divisible by dp={dp}")
                continue
            for micro, m, sched, v in pipeline_options(shape, pp, shape.batch // dp):
                for zero in dp_kinds(pp, dp):
                    for rc in recomputes:
                        # sp splits a sequence: none in a chain of linear layers.
                        out.append(Candidate(pp, dp, tp, zero, tp > 1 and shape.seq > 1, micro, m, sched, v, rc))
            out += hsdp_candidates(shape, cluster, pp, dp, tp, recomputes)
    return out, invalid


def hsdp_candidates(shape: ModelShape, cluster: Cluster, pp: int, dp: int, tp: int,
                    recomputes: tuple[str, ...]) -> list[Candidate]:
    """Hybrid sharding of a mesh without a pipeline: zero3 inside a group of the node's devices
    left after tp (mesh ``dp=dp/F,fsdp=F``), replicated across the groups; only where dp spans
    more than one group. Megatron without sp (hsdp's sp splits the tokens over dp alone)."""
    fsdp = cluster.gpus_per_node // tp
    if pp > 1 or fsdp < 2 or dp <= fsdp or dp % fsdp:
        return []
    return [Candidate(1, dp, tp, "hsdp", False, shape.batch // dp, 1, None, 1, rc, fsdp=fsdp) for rc in recomputes]


def cp_reason(shape: ModelShape, fits_without: bool) -> str | None:
    """Why the search leaves context parallelism out (None: it is enumerated): it needs fused
    attention and pays for long sequences (16K tokens or more) or when no plan without it fits."""
    if shape.seq == 1:
        return "the model has no sequence to split"
    if not shape.fused_attention:
        return "cp needs fused attention (build the model with attention=\"fused\")"
    if shape.seq % 4:
        return f"the sequence {shape.seq} is not a multiple of 2 x cp = 4"
    if shape.seq < CP_MIN_SEQ and fits_without:
        return f"the sequence {shape.seq} is under {CP_MIN_SEQ} tokens and plans without cp fit the cap"
    return None


def cp_candidates(shape: ModelShape, cluster: Cluster, devices: int,
                  recomputes: tuple[str, ...]) -> list[Candidate]:
    """Context-parallel candidates: a power-of-two cp (2 x cp dividing the sequence, for the
    balanced split) beside a tp inside the node, with pp and dp as partita's strategies compose
    them (dp, zero1, zero3 without a pipeline; no sp, which cp refuses; no hsdp)."""
    out: list[Candidate] = []
    for tp in pow2_divisors(devices, cluster.gpus_per_node):
        if shape.heads % tp or shape.hidden % tp:
            continue
        for cp in pow2_divisors(devices // tp, devices)[1:]:
            if shape.seq % (2 * cp):
                break
            for pp in divisors(devices // (tp * cp)):
                dp = devices // (tp * cp * pp)
                if pp > shape.layers or shape.batch % dp:
                    continue
                for micro, m, sched, v in pipeline_options(shape, pp, shape.batch // dp):
                    for zero in dp_kinds(pp, dp):
                        out += [Candidate(pp, dp, tp, zero, False, micro, m, sched, v, rc, cp=cp) for rc in recomputes]
    return out


def candidate_plan(shape: ModelShape, c: Candidate, devices: int, cluster: Cluster) -> Plan:
    """The Plan of a candidate (without prices): mesh text, strategy words, pipeline options, cut."""
    alone = c.pp == c.tp == c.cp == 1
    if c.zero == "hsdp":
        data = [f"dp={c.dp // c.fsdp}", f"fsdp={c.fsdp}"]
    else:
        data = [f"dp={c.dp}"] * (c.dp > 1 or alone)
    axes = [f"pp={c.pp}"] * (c.pp > 1) + data + [f"cp={c.cp}"] * (c.cp > 1) + [f"tp={c.tp}"] * (c.tp > 1)
    words = ["pp"] * (c.pp > 1) + [c.zero] * (c.dp > 1 or alone) + ["cp"] * (c.cp > 1) + \
        ["megatron"] * (c.tp > 1) + ["sp"] * c.sp
    stages = None
    if c.stage_recompute:
        stages = recompute_stage_cut(shape, c)
    elif c.pp > 1 and c.virtual_stages == 1:
        lf = shape.layer_flops(1)
        stages = stage_cut([lf] * shape.layers, c.pp, last_extra=shape.head_flops(1))
    return Plan(mesh=",".join(axes), strategy="+".join(words), recompute=c.recompute, microbatches=c.microbatches,
                schedule=c.schedule, virtual_stages=c.virtual_stages, stages=stages, devices=devices,
                cluster=cluster.name, stage_recompute=list(c.stage_recompute) or None)


def milp_variant(p: Plan, step: Graph, choice: Any) -> Plan:
    """Plan ``p`` with the integer program's placements in place of its tp strategy words
    (megatron, sp): the dp kind stays; with a dp axis the values that depend on the batch keep
    the placements dp gives them, and zero1/zero3 keep the optimizer state (and zero3 the
    params) they shard."""
    from .milp import pattern_annotations

    words = [w for w in p.strategy.split("+") if w not in ("megatron", "sp")]
    dp = p.axes.get("dp", 1) > 1
    roles = ("param", "state") if "zero1" not in words and "zero3" not in words else \
        (("param",) if "zero1" in words else ())
    ann = pattern_annotations(choice, step, batch=not dp, input_roles=roles)
    return dataclasses.replace(p, strategy="+".join(words), sharding="milp", annotations=ann, report={},
                               stages=p.stages)


class Pricer:
    """Prices plans with the simulator: one training step per recomputation, built once."""

    def __init__(self, graph: Graph, cluster: Cluster, training: bool, step_options: dict[str, Any]) -> None:
        self.graph, self.cluster, self.training, self.options = graph, cluster, training, step_options
        self.steps: dict[tuple[int | None, str], Graph] = {}
        self.reduced: dict[int, Graph | None] = {}
        self.seconds = {"training_step": 0.0, "parallelize": 0.0, "simulate": 0.0}
        self.failures: list[str] = []   # the plans that could not be built, with why (price_best)
        # The pipelines' priced sections, kept across candidates (parallel/pipeline/chunk_templates.py).
        self.sections = SectionCache()
        # The steps' forward sections and microbatch graphs, kept across pipeline candidates (build.py).
        self.built = StepCache()
        self.skipped = 0                # the meshes the bounds skipped unpriced (price_best)
        self.shardings: dict[tuple[int, str], Any] = {}   # (tp, recompute) -> (step, ShardingChoice or error text)
        self.sharding_notes: list[dict] = []               # per mesh: the words' and the program's step (planner)
        self.origin: dict[int, Candidate] = {}             # id of a priced plan -> its candidate
        self.seconds["milp"] = 0.0
        self.model_flops: dict[int, float] = {}            # id of a step (kept in steps) -> its model FLOPs

    def sharding(self, tp: int, recompute: str) -> Any:
        """The per-op sharding integer program's choice over ``tp`` devices on one layer's training
        step (identical layers share variables, so one layer prices what any depth does); cached.
        A ``ShardingChoice``, or the error text where it could not be solved."""
        from .milp import shard_layer

        key = (tp, recompute)
        if key not in self.shardings:
            t0 = time.perf_counter()
            layers = None if self.training or self.model(1) is None else 1
            try:
                step = self.step(recompute, layers)
                self.shardings[key] = (step, shard_layer(step, tp, self.cluster))
            except PartitaError as e:
                self.shardings[key] = (None, str(e)[:200])
            self.seconds["milp"] += time.perf_counter() - t0
        return self.shardings[key]

    def model(self, layers: int | None) -> Graph | None:
        """The forward graph with its first ``layers`` layers (None: all; None back when it cannot be cut)."""
        if layers is None:
            return self.graph
        if layers not in self.reduced:
            self.reduced[layers] = truncate_layers(self.graph, layers)
        return self.reduced[layers]

    def step(self, recompute: str, layers: int | None = None) -> Graph:
        """The training step with ``recompute`` of the model of ``layers`` layers (None: all), cached;
        the given step itself when one was given."""
        if self.training:
            return self.graph
        key = (layers, recompute)
        if key not in self.steps:
            from ..autodiff import training_step

            t0 = time.perf_counter()
            model = self.model(layers)
            if model is None:
                raise PlanError(f"plan: @{self.graph.name} cannot be cut to {layers} layers")
            self.steps[key] = training_step(model, recompute=recompute, **self.options)
            self.seconds["training_step"] += time.perf_counter() - t0
        return self.steps[key]

    def simulate_on(self, step: Graph, p: Plan) -> tuple[float, float | None, float | None, float]:
        """(step seconds, MFU, memory report's peak or None, model FLOPs) of ``p`` applied to ``step``."""
        from ..cluster.simulator import simulate
        from ..parallel.spmd import parallelize

        t0 = time.perf_counter()
        with using_step_cache(self.built):
            prog = parallelize(step, **p.parallelize_options(unroll=False))
        t1 = time.perf_counter()
        with using_section_cache(self.sections):
            # The step's model FLOPs (a walk of its whole graph) are the same for every plan of it.
            res = simulate(prog, self.cluster, trace=False, memory=not p.pipelined,
                           model_flops=self.model_flops.get(id(step)))
        if res.model_flops:
            self.model_flops[id(step)] = res.model_flops
        t2 = time.perf_counter()
        self.seconds["parallelize"] += t1 - t0
        self.seconds["simulate"] += t2 - t1
        peaks = [r.memory.peak for r in res.ranks if r.memory is not None]
        return res.step_time, res.mfu, (max(peaks) if peaks else None), float(res.model_flops or 0.0)

    def price(self, p: Plan) -> tuple[float, float | None, float | None]:
        """(step seconds, MFU, the memory report's peak or None) of plan ``p``, simulated in full."""
        t, mfu, peak, _flops = self.simulate_on(self.step(p.recompute), p)
        return t, mfu, peak

    def price_scaled(self, p: Plan, shape: ModelShape) -> tuple[float, float | None, float | None]:
        """``price(p)`` from models of one and two layers per pipeline chunk, scaled to the real depth
        (partita/planning/reduce.py); in full when the two would hold as many layers as the model (they
        cost about what it does) or it cannot be cut."""
        chunks = max(p.axes.get("pp", 1), 1) * max(p.virtual_stages, 1)
        if self.training or 3 * chunks >= shape.layers:     # the two small models cost what the full one does
            return self.price(p)
        figures = []
        for per in (1, 2):
            if self.model(per * chunks) is None:
                return self.price(p)
            small = dataclasses.replace(p, stages=[per] * p.axes["pp"] if p.stages is not None else None, report={})
            figures.append(self.simulate_on(self.step(p.recompute, per * chunks), small))
        (t1, _m1, k1, f1), (t2, _m2, k2, f2) = figures
        x = shape.layers / chunks
        t = scale(t1, t2, x)
        # Peak memory need not grow evenly with the layers (the logits may dominate): never below either model's.
        peak = max(scale(k1, k2, x), k1, k2) if k1 is not None and k2 is not None else None
        mfu = figures[0][1]
        if mfu is not None and f1 > 0:
            mfu = mfu * t1 / f1 * scale(f1, f2, x) / t
        return t, mfu, peak
