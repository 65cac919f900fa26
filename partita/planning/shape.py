"""The shape of a transformer read off its forward graph: what the planner's bounds need.

``model_shape(graph)`` finds the batch and sequence (the integer ``input`` [batch, seq]),
the parameter count, the repeated layers (params named ``<prefix>.<i>.<rest>``), the hidden
size (the commonest 1-D param size), the vocabulary (the largest 2-D param's rows), the MLP
width, the heads (a 4-D reshape [.., heads, head_dim] with heads x head_dim = hidden) and
whether attention is fused (flash: the scores are never stored).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from ..ir import Graph, PartitaError

LAYER_NAME = re.compile(r"^(.*?)\.(\d+)\.(.+)$")


class PlanError(PartitaError):
    """The planner cannot plan: a bad input or no plan that fits; the message says what would."""


@dataclass(frozen=True)
class ModelShape:
    """A transformer's sizes, as the planner's memory and time bounds use them."""

    batch: int
    seq: int
    params: int
    layers: int
    hidden: int
    heads: int
    vocab: int
    ffn: int
    layer_params: int           # parameters of one repeated layer
    fused_attention: bool       # flash attention: no [heads, seq, seq] scores stored
    param_bytes: int = 2        # bytes of one parameter element

    def layer_flops(self, batch: int) -> float:
        """Forward FLOPs of one layer on ``batch`` sequences (projections, MLP, scores)."""
        s, h = self.seq, self.hidden
        return batch * (8 * s * h * h + 4 * s * h * self.ffn + 4 * s * s * h)

    def head_flops(self, batch: int) -> float:
        """Forward FLOPs of the output projection onto the vocabulary."""
        return 2.0 * batch * self.seq * self.hidden * self.vocab

    def step_model_flops(self) -> float:
        """Model FLOPs of one training step (forward and backward, no recomputation)."""
        return 3.0 * (self.layers * self.layer_flops(self.batch) + self.head_flops(self.batch))


def model_shape(graph: Graph) -> ModelShape:
    """Read a transformer's sizes off its forward graph (or training step); PlanError if it has none."""
    where = f"plan: @{graph.name}"
    ids = [v for v in graph.inputs if v.role == "input" and len(v.type.shape) == 2 and "i" in str(v.type.dtype)]
    if not ids:
        raise PlanError(f"{where} has no integer input [batch, seq] (token ids); the planner plans transformers "
                        "built by partita.models or imported ones with such an input")
    batch, seq = (int(d) for d in ids[0].type.shape)
    params = [v for v in graph.inputs if v.role == "param"]
    if not params:
        raise PlanError(f"{where} has no param inputs; nothing to shard")
    total = sum(v.type.numel for v in params)
    per_layer: dict[tuple[str, int], int] = Counter()
    for v in params:
        m = LAYER_NAME.match(v.name or "")
        if m:
            per_layer[(m.group(1), int(m.group(2)))] += v.type.numel
    prefixes = Counter(p for p, _ in per_layer)
    if not prefixes:
        raise PlanError(f"{where}: no repeated layers (params named <prefix>.<i>.<name>); the planner cuts "
                        "stages between layers")
    prefix, layers = prefixes.most_common(1)[0]
    layer_params = max(n for (p, _), n in per_layer.items() if p == prefix)
    ones = Counter(int(v.type.shape[0]) for v in params if len(v.type.shape) == 1)
    hidden = ones.most_common(1)[0][0] if ones else int(max(params, key=lambda v: v.type.numel).type.shape[-1])
    two = [v for v in params if len(v.type.shape) == 2]
    outer = [v for v in two if not LAYER_NAME.match(v.name or "")]
    vocab = max((int(d) for v in outer for d in v.type.shape if int(d) != hidden), default=hidden)
    widths = [int(d) for v in two if LAYER_NAME.match(v.name or "") for d in v.type.shape if int(d) != hidden]
    ffn = max(widths) if widths else 4 * hidden
    heads = 1
    for n in graph.nodes:
        for r in n.results:
            sh = [int(d) for d in r.type.shape]
            if len(sh) == 4 and sh[-2] * sh[-1] == hidden and n.op == "reshape":
                heads = max(heads, sh[-2])
    fused = any(n.op == "attention" for n in graph.nodes)
    return ModelShape(batch, seq, total, layers, hidden, heads, vocab, ffn, layer_params, fused,
                      params[0].type.dtype.itemsize if hasattr(params[0].type.dtype, "itemsize") else 2)
