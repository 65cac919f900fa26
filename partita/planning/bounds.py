"""Analytic bounds of a candidate plan: memory per device and a step-time estimate, no simulation.

Memory (bytes, the most loaded stage): model states (bf16 params and gradients, f32 master
weights and Adam moments: 16 bytes a parameter, the optimizer's 12 sharded by zero1), the
activations of the microbatches in flight by the per-layer formulas of Korthikanti et al.
2022 (Table 2: 34sbh + 5as^2b bytes a layer without recomputation, 34sbh with selective
recomputation, 2sbh with full; divided by t with sequence parallelism), and the logits.
Time (seconds): the stage's FLOPs at the cluster's gemm efficiency, the memory-bound
traffic at its memory efficiency, the pipeline bubble, the tensor-parallel all-reduces on
the node's links and the data-parallel gradient all-reduce (exposed after a pipeline's
flush; overlapped with the backward otherwise). The estimate ranks candidates; the
simulator prices the survivors.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from ..cluster.hardware import Cluster
from .shape import ModelShape


@dataclass(frozen=True)
class Candidate:
    """One point of the search: mesh sizes, data-parallel kind, pipeline options, recomputation."""

    pp: int
    dp: int
    tp: int
    zero: str               # "dp", "zero1" or "zero3"
    sp: bool
    micro: int              # sequences per microbatch
    microbatches: int
    schedule: str | None
    virtual_stages: int
    recompute: str
    fsdp: int = 1           # hsdp: the zero3 group inside a node (``dp`` counts every data-parallel rank)
    cp: int = 1             # context parallelism: ranks that split the sequence
    # One recomputation per pipeline stage (1F1B; ``recompute`` is then "none"); empty: ``recompute`` on every stage.
    stage_recompute: tuple[str, ...] = ()
    # Set on the memory family's candidates (zero3 beside a pipeline), offered where zero1 does not fit.
    saves_memory: bool = False

    def family(self) -> str:
        """The family a rejected candidate is reported under: its axes and recomputation."""
        sizes = (("pp", self.pp), ("dp", self.dp // self.fsdp), ("fsdp", self.fsdp), ("cp", self.cp), ("tp", self.tp))
        axes = "x".join(a for a, n in sizes if n > 1) or "one device"
        return f"{axes} {self.zero if self.dp > 1 else ''} recompute={self.recompute_text()}".replace("  ", " ")

    def recompute_text(self) -> str:
        """The recomputation as the report writes it: one policy, or one per stage joined with commas."""
        return ",".join(self.stage_recompute) if self.stage_recompute else self.recompute

    def kind(self) -> str:
        """The search family: "hsdp", "cp", "memory" (per-stage recomputation, zero3 beside a
        pipeline) or "base" (the pp x dp x tp meshes)."""
        if self.stage_recompute or self.saves_memory:
            return "memory"
        return "hsdp" if self.zero == "hsdp" else "cp" if self.cp > 1 else "base"


def stage_layers(shape: ModelShape, pp: int) -> int:
    """Layers of the most loaded stage."""
    return math.ceil(shape.layers / pp)


def layer_activation_bytes(shape: ModelShape, c: Candidate, recompute: str | None = None) -> float:
    """Bytes one layer keeps for the backward of one microbatch (Korthikanti et al. 2022, Table 2)."""
    rc = c.recompute if recompute is None else recompute
    if shape.row_activation_bytes:              # a chain of linear layers: its input and output per row
        return (2.0 if rc == "full" else shape.row_activation_bytes) * c.micro / c.tp
    s, b, h, a, t = shape.seq // c.cp, c.micro, shape.hidden, shape.heads, c.tp
    base = s * b * h * (15 + 19 * shape.ffn / (4 * h))          # 34sbh at ffn = 4h
    scores = 0.0 if shape.fused_attention else 5.0 * a * s * s * b
    if rc == "full":
        return 2.0 * s * b * h / (t if c.sp else 1)
    if c.sp or t == 1:
        kept = base / t
    else:
        kept = s * b * h * (10 + (base / (s * b * h) - 10) / t)
    # cp: the keys and values gathered over the whole sequence, which attention's backward reads again.
    gathered = 4.0 * shape.seq * b * h / t if c.cp > 1 else 0.0
    return kept + gathered + (scores / t if rc == "none" else 0.0)


def in_flight(c: Candidate) -> float:
    """Microbatches whose activations the first stage holds at once."""
    if c.pp == 1:
        return 1.0
    if c.schedule == "gpipe":
        return float(c.microbatches)
    held = float(min(c.microbatches, c.pp))
    if c.schedule == "interleaved":
        held *= 1 + (c.pp - 1) / (c.pp * c.virtual_stages)
    return held


def stage_params(shape: ModelShape, c: Candidate) -> float:
    """Parameters on the most loaded rank (its layers and, conservatively, the embeddings)."""
    outer = shape.params - shape.layers * shape.layer_params
    return (stage_layers(shape, c.pp) * shape.layer_params + outer) / c.tp


def memory_bytes(shape: ModelShape, c: Candidate) -> float:
    """Peak bytes per device of ``c`` (see the module docstring); with a policy per stage, the
    most loaded stage's (stage i of p holds min(M, p - i) microbatches under 1F1B)."""
    if c.stage_recompute:
        cut = recompute_stage_cut(shape, c)
        outer = shape.params - shape.layers * shape.layer_params
        return max(stage_memory_bytes(shape, c, (n * shape.layer_params + outer) / c.tp, n,
                                      float(min(c.microbatches, c.pp - i)), rc)
                   for i, (n, rc) in enumerate(zip(cut, c.stage_recompute)))
    return stage_memory_bytes(shape, c, stage_params(shape, c), stage_layers(shape, c.pp), in_flight(c), c.recompute)


def stage_memory_bytes(shape: ModelShape, c: Candidate, p: float, layers: int, held: float, recompute: str) -> float:
    """Peak bytes of a stage of ``layers`` layers and ``p`` parameters per device that holds
    ``held`` microbatches' activations, recomputing with ``recompute``."""
    states = p * (4 + 12 / c.dp) if c.zero == "zero1" else p * 16
    if c.zero in ("zero3", "hsdp"):   # every state sharded; two layers' bf16 params and grads gathered at once
        states = p * 16 / (c.fsdp if c.zero == "hsdp" else c.dp) + 2 * 4 * shape.layer_params / c.tp
    acts = held * layers * layer_activation_bytes(shape, c, recompute)
    if recompute == "full":                       # one layer rebuilt whole during its backward
        acts += layer_activation_bytes(shape, c, "none")
    logits = 16.0 * (shape.seq // c.cp) * c.micro * shape.vocab / c.tp       # bf16 logits, f32 softmax, grads
    return states + acts + logits


def allreduce_seconds(nbytes: float, n: int, bandwidth: float) -> float:
    """A ring all-reduce of ``nbytes`` over ``n`` ranks at ``bandwidth`` bytes/s."""
    return 0.0 if n <= 1 else 2.0 * (n - 1) / n * nbytes / bandwidth


def time_parts(shape: ModelShape, c: Candidate, cluster: Cluster) -> dict[str, float]:
    """The estimate's parts (seconds): compute, recompute, memory, bubble, tp, p2p, dp (and cp with a cp axis)."""
    eff = cluster.efficiency
    flops = cluster.device.flops("bf16") * eff.gemm
    mem_bw = cluster.device.memory_bandwidth * eff.memory
    intra, inter = cluster.intra_node, cluster.inter_node
    ls = shape.layers / c.pp
    ranks = c.tp * c.cp               # cp: a rank's share of the tokens (balanced, so of the attention too)
    fwd = (ls * shape.layer_flops(c.micro) + shape.head_flops(c.micro) / c.pp) / ranks
    s, b, h = shape.seq // c.cp, c.micro, shape.hidden
    scores = 0.0 if shape.fused_attention else 4.0 * s * s * h * b
    per_layer = {"none": 0.0, "selective": scores / c.tp, "full": shape.layer_flops(c.micro) / ranks}
    extra = ls * per_layer[c.recompute]
    if c.stage_recompute:
        # The slowest stage paces 1F1B's steady state: its excess over an even share without recomputation.
        lf = 3 * shape.layer_flops(c.micro) / ranks
        extra = max(n * (lf + per_layer[rc]) for n, rc in zip(recompute_stage_cut(shape, c), c.stage_recompute)) \
            - ls * lf
    traffic = ls * 3 * (layer_activation_bytes(shape, c, "none") if c.tp == 1 or c.sp else 34 * s * b * h / c.tp)
    t_mb = (3 * fwd + extra) / flops + traffic / mem_bw
    bubble = {"1f1b": c.pp - 1, "gpipe": c.pp - 1, "interleaved": (c.pp - 1) / c.virtual_stages,
              "zero-bubble": (c.pp - 1) / 3}.get(c.schedule or "", 0.0)
    ar = allreduce_seconds(2.0 * s * b * h, c.tp, intra.bandwidth * eff.network)
    tp_per_layer = (6 if "full" in (c.recompute,) + c.stage_recompute else 4) * ar
    if shape.row_activation_bytes:   # megatron pairs the linears: a pair all-reduces once forward, once backward
        tp_per_layer = allreduce_seconds(shape.param_bytes * b * h, c.tp, intra.bandwidth * eff.network)
    grads = 2.0 * stage_params(shape, c)
    dp_time = dp_seconds(grads, c, cluster)
    compute = c.microbatches * 3 * fwd / flops
    parts = {"compute": compute, "recompute": c.microbatches * extra / flops,
             "memory": c.microbatches * traffic / mem_bw, "bubble": bubble * (t_mb + ls * tp_per_layer),
             "tp": c.microbatches * ls * tp_per_layer,
             "p2p": 0.0 if c.pp == 1 else (c.microbatches + c.pp) * 2 * s * b * h * 2 / c.tp / inter.bandwidth,
             # zero1's parameter all-gather follows the optimizer step: exposed, as after a pipeline's flush;
             # zero3's gathers and scatters run beside the layers' compute (prefetched), as dp's all-reduce does.
             "dp": dp_time if c.pp > 1 or c.zero == "zero1" else max(0.1 * dp_time, dp_time - 0.6 * compute)}
    if c.cp > 1:
        parts["cp"] = c.microbatches * ls * cp_seconds_per_layer(shape, c, cluster)
    return parts


def dp_seconds(grads: float, c: Candidate, cluster: Cluster) -> float:
    """The data-parallel gradient traffic of ``grads`` bytes a step: an all-reduce over dp (and cp,
    which sums the weight gradients over the tokens too); zero3 moves 1.5 times as much (params
    gathered for the forward and the backward, grads reduce-scattered), and beside a pipeline
    gathers the params again for every microbatch; hsdp does that inside its
    fsdp group and all-reduces 1/fsdp of the gradient across the groups."""
    eff, gpn = cluster.efficiency, cluster.gpus_per_node
    intra, inter = cluster.intra_node, cluster.inter_node
    if c.zero == "hsdp":
        inside = intra if c.fsdp * c.tp <= gpn else inter
        return 1.5 * allreduce_seconds(grads, c.fsdp, inside.bandwidth * eff.network) + \
            allreduce_seconds(grads / c.fsdp, c.dp // c.fsdp, inter.bandwidth * eff.network)
    n = c.dp * c.cp
    link = intra if n * c.tp <= gpn else inter
    t = allreduce_seconds(grads, n, link.bandwidth * eff.network)
    if c.zero == "zero3" and c.pp > 1:     # a stage's params gathered again for each microbatch's forward and backward
        return (0.5 + c.microbatches) * t
    return 1.5 * t if c.zero == "zero3" else t


def cp_seconds_per_layer(shape: ModelShape, c: Candidate, cluster: Cluster) -> float:
    """cp's exposed traffic of one layer and microbatch: the keys and values all-gathered over cp
    for the forward (again with full recomputation) and their gradients reduce-scattered back."""
    link = cluster.intra_node if c.cp * c.tp <= cluster.gpus_per_node else cluster.inter_node
    kv = 2.0 * 2.0 * shape.seq * c.micro * shape.hidden / c.tp          # bf16 k and v, whole sequence
    times = 3 if c.recompute == "full" else 2
    return times * (c.cp - 1) / c.cp * kv / (link.bandwidth * cluster.efficiency.network)


def lower_bound(shape: ModelShape, c: Candidate, cluster: Cluster) -> float:
    """A step-time lower bound: the model's FLOPs (with recomputation) at the device's peak, plus the bubble."""
    parts = time_parts(shape, c, cluster)
    busy = parts["compute"] + parts["recompute"] + parts["memory"]
    work = (parts["compute"] + parts["recompute"]) * cluster.efficiency.gemm
    return work * (1 + parts["bubble"] / max(busy, 1e-30))


def stage_cut(costs: list[float], stages: int, last_extra: float = 0.0, first_extra: float = 0.0) -> list[int]:
    """Layers per stage minimizing the most loaded stage (dynamic programming over contiguous cuts)."""
    n = len(costs)
    pre = [0.0]
    for x in costs:
        pre.append(pre[-1] + x)
    inf = float("inf")
    # best[k][i]: the least max-stage cost of the first i layers in k stages (stage 0 has first_extra).
    best = [[inf] * (n + 1) for _ in range(stages + 1)]
    arg = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                cost = pre[i] - pre[j] + (first_extra if k == 1 else 0.0) + (last_extra if k == stages and i == n else 0.0)
                v = max(best[k - 1][j], cost)
                if v < best[k][i]:
                    best[k][i], arg[k][i] = v, j
    cut, i = [], n
    for k in range(stages, 0, -1):
        j = arg[k][i]
        cut.append(i - j)
        i = j
    return cut[::-1]


def recompute_stage_cut(shape: ModelShape, c: Candidate) -> list[int]:
    """Layers per stage of a candidate with a recomputation per stage: the stages that recompute
    get fewer layers (a layer costs 4/3 of its work there with full recomputation)."""
    scores = 0.0 if shape.fused_attention else 4.0 * shape.seq * shape.seq * shape.hidden * c.micro
    lf = shape.layer_flops(c.micro)
    factor = {"none": 1.0, "selective": 1.0 + scores / (3 * lf), "full": 4.0 / 3.0}
    return list(weighted_stage_cut(shape.layers, tuple(factor[rc] for rc in c.stage_recompute),
                                   last_extra=shape.head_flops(c.micro) / lf))


@functools.lru_cache(maxsize=4096)
def weighted_stage_cut(layers: int, factors: tuple[float, ...], last_extra: float = 0.0) -> tuple[int, ...]:
    """Layers per stage minimizing the most loaded stage when stage k's layers cost ``factors[k]``
    each (and the last stage ``last_extra`` more), every stage holding a layer at least. Dynamic
    programming over contiguous cuts; the best previous cut point found by bisection, since the
    first k - 1 stages' least maximum grows with their layers while stage k's cost falls."""
    stages = len(factors)
    inf = float("inf")
    best = [[inf] * (layers + 1) for _ in range(stages + 1)]
    arg = [[0] * (layers + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for k in range(1, stages + 1):
        f, prev = factors[k - 1], best[k - 1]
        for i in range(k, layers + 1):
            extra = last_extra if k == stages else 0.0
            lo, hi = k - 1, i - 1                   # the first j whose prev[j] >= stage k's cost
            while lo < hi:
                mid = (lo + hi) // 2
                if prev[mid] >= (i - mid) * f + extra:
                    hi = mid
                else:
                    lo = mid + 1
            j = lo
            v = max(prev[j], (i - j) * f + extra)
            if j > k - 1:
                w = max(prev[j - 1], (i - j + 1) * f + extra)
                if w <= v:
                    j, v = j - 1, w
            best[k][i], arg[k][i] = v, j
    cut, i = [], layers
    for k in range(stages, 0, -1):
        j = arg[k][i]
        cut.append(i - j)
        i = j
    return tuple(cut[::-1])
