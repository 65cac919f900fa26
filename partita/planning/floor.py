"""A step-time floor of a candidate that the simulator can never beat, from the model's own ops.

``layer_costs(graph, cluster, layers)`` prices the matmuls and attention ops of one
repeated layer and of the output head of the forward graph with the cluster's cost model on
their global shapes (a rank's share of an op has thinner shapes, which the cost model's
thin-shape knee prices no faster a FLOP), plus each op's launch overhead; every other op
(memory-bound, collectives, transfers) is left out, so the figure is a floor.

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
    """Seconds of one layer's and of the head's GEMM and attention ops at the global batch."""

    layer: float            # one repeated layer's forward, whole batch, one device
    head: float             # the ops outside the layers (the output projection), whole batch
    layer_ops: int          # GEMM and attention ops of one layer (each pays the launch overhead)
    head_ops: int
    overhead: float         # seconds of launch overhead an op pays


def layer_costs(graph: Graph, cluster: Cluster, layers: int) -> LayerCosts | None:
    """The forward graph's layer and head costs (see the module docstring); None unless its
    GEMM and attention ops fall into ``layers`` alike layers by their location scopes
    (``<prefix>.<i>`` or ``<prefix>.<i>.<name>``) and the rest."""
    from ..cluster.cost import CostModel
    from ..ops.kinds import ATTENTION_OPS, GEMM_OPS
    from ..parallel.pipeline.build import forward_of

    fwd, _training = forward_of(graph)
    model = CostModel(cluster)
    eff = cluster.efficiency
    per: dict[tuple[str, int], list[float]] = {}
    head = 0.0
    head_ops = 0
    for n in fwd.nodes:
        if n.op not in GEMM_OPS and n.op not in ATTENTION_OPS:
            continue
        m = SCOPE.match(getattr(n.loc, "scope", "") or "")
        # Priced on the global shapes: a rank's share of it runs on thinner shapes, no faster a FLOP.
        t = max(model.compute_time(n).seconds - eff.op_overhead, 0.0)
        if m:
            per.setdefault((m.group(1), int(m.group(2))), []).append(t)
        else:
            head += t
            head_ops += 1
    prefixes = {p for p, _ in per}
    if len(prefixes) != 1 or sorted(i for _, i in per) != list(range(layers)):
        return None
    first = per[(prefixes.pop(), 0)]
    one = sum(first)
    if any(len(ts) != len(first) or abs(sum(ts) - one) > 1e-6 * max(one, 1e-30) for ts in per.values()):
        return None
    return LayerCosts(one, head, len(first), head_ops, eff.op_overhead)


def step_floor(costs: LayerCosts, shape: ModelShape, c: Candidate, stages: list[int] | None = None) -> float:
    """Seconds the simulated step of ``c`` takes at least (see the module docstring); ``stages``:
    the layers of each pipeline stage when the cut is known (1F1B)."""
    share = c.micro / shape.batch / c.tp         # the global batch's work one rank does for one microbatch
    fwd = costs.layer * share + costs.layer_ops * costs.overhead
    again = fwd if c.recompute == "full" else 0.0
    bwd = costs.layer * share * BACKWARD + costs.layer_ops * costs.overhead
    per_layer = fwd + bwd + again
    head = costs.head * share * (1 + BACKWARD) + 2 * costs.head_ops * costs.overhead
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
