"""A step-time floor of a candidate that the simulator can never beat, from the model's own ops.

``layer_costs(graph, cluster, layers)`` prices the ops of one repeated layer and of the
head (what follows the layers: the final norm, the output projection, the loss; what comes
before them, the embedding, is left out) of the forward graph, cleaned up as a chunk's program is, with
the cluster's cost model on their global shapes: a rank's share of a matmul or attention has
thinner shapes, which the cost model's thin-shape knee prices no faster a FLOP; a
memory-bound op moves its share of the bytes at the fastest bandwidth the device has; each
op pays its launch overhead. The backward of a matmul or attention does at least twice its
forward's FLOPs; the backward's memory-bound ops, collectives, transfers and the optimizer
are left out, so the figure is a floor.

``step_floor(costs, c)``: a rank's work is at least its share (1 / tp of its stage's
microbatch rows) of those ops; the backward does at least twice the forward's GEMM FLOPs
(each matmul's input and weight gradients), full recomputation runs the forward once more.
Without a pipeline the step is at least the one replica's work. With one (1F1B, or
interleaved with ``V`` chunks a rank), pp rank ``r`` cannot start before the first
microbatch's forward went through the ``r`` chunks before its first one, and its last
action (the backward of its first chunk for the last microbatch: every other action of a
microbatch on that rank comes before it) is followed by the backwards of ``r`` chunks; every
chunk holds at least one layer. So the last rank, which holds ``V`` chunks and the head,
gives ``(pp - 1) * (F + B) + M * (head + V * layer)`` (with a known 1F1B cut, the layers of
each stage), and the average rank its share of all the work plus ``(pp - 1) / 2`` layers'
``F + B``. The larger is the floor. Transfers, collectives and the optimizer only add to
it. tests/plan checks the floor against the simulator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..cluster.hardware import Cluster
from ..ir import Graph
from .bounds import Candidate
from .shape import ModelShape

# A layer's op: its location scope names the layer, <prefix>.<i> or <prefix>.<i>.<name>.
SCOPE = re.compile(r"^(.*?)\.(\d+)(?:\.|$)")
# The backward of a matmul computes its input's and its weight's gradients: twice its FLOPs.
BACKWARD = 2.0


@dataclass(frozen=True)
class LayerCosts:
    """Seconds of one layer's and of the head's forward ops at the global batch on one device:
    the GEMM and attention ops (whose backward does twice their FLOPs) and the other ops (the
    forward alone counted)."""

    layer: float            # one repeated layer's GEMM and attention ops
    head: float             # those outside the layers (the output projection)
    layer_ops: int          # how many (each pays the launch overhead)
    head_ops: int
    overhead: float         # seconds of launch overhead an op pays
    layer_rest: float = 0.0     # one layer's other (memory-bound) forward ops
    head_rest: float = 0.0
    layer_rest_ops: int = 0
    head_rest_ops: int = 0


def layer_costs(graph: Graph, cluster: Cluster, layers: int) -> LayerCosts | None:
    """The forward graph's layer and head costs (see the module docstring); None unless its
    ops fall into ``layers`` alike layers by their location scopes (``<prefix>.<i>`` or
    ``<prefix>.<i>.<name>``) and the rest. The forward is cleaned up first as a pipeline
    chunk's program is (canonicalize, cse, dce), so no op counted is one the chunks drop."""
    from ..cluster.cost import CostModel
    from ..passes.manager import PassManager
    from ..parallel.pipeline.build import forward_of

    fwd, _training = forward_of(graph)
    fwd = fwd.clone()
    PassManager.parse("canonicalize,cse,dce", verify_each=False).run(fwd)
    model = CostModel(cluster)
    per: dict[tuple[str, int], list[tuple[bool, float]]] = {}
    outer: list[tuple[bool, float]] = []
    for n in fwd.nodes:
        priced = op_floor(model, cluster, n)
        if priced is None:
            continue
        m = SCOPE.match(getattr(n.loc, "scope", "") or "")
        if m:
            per.setdefault((m.group(1), int(m.group(2))), []).append(priced)
        elif per:
            # After the first layer: the head, on the last pipeline rank. What comes before
            # the layers (the embedding, on the first rank) is left out of the floor.
            outer.append(priced)
    prefixes = {p for p, _ in per}
    if len(prefixes) != 1 or sorted(i for _, i in per) != list(range(layers)):
        return None
    first = per[(prefixes.pop(), 0)]

    def sums(ts: list[tuple[bool, float]]) -> tuple[float, int, float, int]:
        g = [t for k, t in ts if k]
        r = [t for k, t in ts if not k]
        return sum(g), len(g), sum(r), len(r)

    one = sums(first)
    if any(len(ts) != len(first) or abs(sum(t for _, t in ts) - (one[0] + one[2])) > 1e-6 * (one[0] + one[2])
           for ts in per.values()) or one[1] == 0:
        return None
    head = sums(outer)
    return LayerCosts(one[0], head[0], one[1], head[1], cluster.efficiency.op_overhead, one[2], head[2], one[3],
                      head[3])


def op_floor(model: Any, cluster: Cluster, n: Any) -> tuple[bool, float] | None:
    """(whether a GEMM or attention op, seconds without the launch overhead) of ``n`` on its
    global shapes, the least any rank's share of it costs per share (a thinner GEMM is no
    faster a FLOP; a memory-bound op moves at the fastest bandwidth the device has); None
    for an op that runs no kernel."""
    from ..cluster.cost import operand_transpose
    from ..ops.kinds import ATTENTION_OPS, COLLECTIVE_OPS, FREE_OPS, GEMM_OPS, P2P_OPS, VIEW_OPS

    op = n.op
    if op in VIEW_OPS or op in FREE_OPS or op in COLLECTIVE_OPS or op in P2P_OPS or operand_transpose(n):
        return None
    if op in GEMM_OPS or op in ATTENTION_OPS:
        return True, max(model.compute_time(n).seconds - cluster.efficiency.op_overhead, 0.0)
    c = model.record_cost(n)
    d = cluster.device
    e = cluster.efficiency
    bw = max(d.memory_bandwidth, d.cache_bandwidth or 0.0) * max(e.memory, e.stream or 0.0)
    return False, max((c.bytes_read + c.bytes_written) / bw, c.flops / model.peak_for("f32"))


def step_floor(costs: LayerCosts, shape: ModelShape, c: Candidate, stages: list[int] | None = None) -> float:
    """Seconds the simulated step of ``c`` takes at least (see the module docstring); ``stages``:
    the layers of each pipeline stage when the cut is known (1F1B)."""
    # The global batch's work one rank does for one microbatch (cp: its share of the tokens and,
    # balanced, of the attention's query-key pairs).
    share = c.micro / shape.batch / c.tp / c.cp
    fwd = (costs.layer + costs.layer_rest) * share + (costs.layer_ops + costs.layer_rest_ops) * costs.overhead
    again = fwd if c.recompute == "full" else 0.0
    bwd = costs.layer * share * BACKWARD + costs.layer_ops * costs.overhead
    per_layer = fwd + bwd + again
    head = (costs.head * (1 + BACKWARD) + costs.head_rest) * share + \
        (2 * costs.head_ops + costs.head_rest_ops) * costs.overhead
    if c.pp == 1:
        return shape.layers * per_layer + head
    M = c.microbatches
    # Pipeline rank r waits for r chunks' forwards of the first microbatch before its first
    # action and r chunks' backwards of the last after its last one (every chunk holds a
    # layer at least): some rank is busy and idle at least the average of that.
    average = M * (shape.layers * per_layer + head) / c.pp + (c.pp - 1) / 2 * per_layer
    if stages is not None and len(stages) == c.pp and c.virtual_stages == 1:
        last = sum(stages[:-1]) * per_layer + M * (stages[-1] * per_layer + head)
    else:
        last = (c.pp - 1) * per_layer + M * (head + c.virtual_stages * per_layer)
    return max(average, last)
