"""The shape of a transformer read off its forward graph: what the planner's bounds need.

``model_shape(graph)`` finds the batch and sequence (the integer ``input`` [batch, seq]),
the parameter count, the repeated layers (params named ``<prefix>.<i>.<rest>``), the hidden
size (the commonest 1-D param size), the vocabulary (the largest 2-D param's rows), the MLP
width, the heads (a 4-D reshape [.., heads, head_dim] with heads x head_dim = hidden) and
whether attention is fused (flash: the scores are never stored).

A model without an integer [batch, seq] input is read as a chain of linear layers
(``mlp_shape``): matmuls onto 2-D params, each feeding the next through elementwise ops,
the batch the float input's dim 0; ``DenseShape`` prices its layers by their own widths.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any

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
    # Bytes one layer keeps for the backward per batch row (0: the transformer formulas of bounds.py).
    row_activation_bytes: float = 0.0
    # Whether partita's pipeline can cut the model between its layers (params named <prefix>.<i>.<name>).
    pipeline: bool = True

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


@dataclass(frozen=True)
class DenseShape(ModelShape):
    """A chain of linear layers (an MLP): no sequence (``seq`` 1), no attention, no vocabulary;
    ``widths`` the layers' in and out sizes in order, ``heads`` the widths' greatest common
    divisor (what a tp must divide)."""

    widths: tuple[int, ...] = ()

    def layer_flops(self, batch: int) -> float:
        """Forward FLOPs of the average linear layer on ``batch`` rows."""
        return 2.0 * batch * sum(a * b for a, b in zip(self.widths, self.widths[1:])) / max(self.layers, 1)

    def head_flops(self, batch: int) -> float:
        """No output projection beyond the layers."""
        return 0.0


def model_shape(graph: Graph) -> ModelShape:
    """Read a transformer's sizes off its forward graph (or training step), or a chain of linear
    layers' (``mlp_shape``) where it has no integer [batch, seq] input; PlanError if neither."""
    where = f"plan: @{graph.name}"
    ids = [v for v in graph.inputs if v.role == "input" and len(v.type.shape) == 2 and "i" in str(v.type.dtype)]
    if not ids:
        return mlp_shape(graph)
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


def mlp_shape(graph: Graph) -> DenseShape:
    """The sizes of a chain of linear layers with elementwise ops between them (an MLP); PlanError
    naming what is missing where the graph is not one."""
    from ..parallel.pipeline.build import forward_of

    where = f"plan: @{graph.name}"
    hint = ("the planner plans transformers built by partita.models (or imported ones with an integer "
            "[batch, seq] input) and chains of linear layers (matmuls onto 2-D params, elementwise ops between)")
    fwd, _training = forward_of(graph)
    params = {id(v): v for v in fwd.inputs if v.role == "param"}
    if not params:
        raise PlanError(f"{where} has no param inputs; nothing to shard")
    linears = [n for n in fwd.nodes if n.op == "matmul" and len(n.operands) == 2 and id(n.operands[1]) in params
               and len(n.operands[1].type.shape) == 2]
    used = {id(n.operands[1]) for n in linears}
    extra = [v for i, v in params.items() if i not in used and len(v.type.shape) != 1]
    if not linears or extra or len(linears) != len(used):
        raise PlanError(f"{where} has no integer input [batch, seq] and is not a chain of linear layers (each param "
                        f"the 2-D weight of one matmul x @ w, or a 1-D bias); {hint}")
    for k in range(1, len(linears)):
        if not feeds(linears[k - 1], linears[k].operands[0]):
            raise PlanError(f"{where}: linear layer {k} (param %{linears[k].operands[1].name}) does not take the "
                            f"layer before's output through elementwise ops alone; it is not a chain of linear "
                            f"layers; {hint}")
    widths = [int(linears[0].operands[1].type.shape[0])]
    for k, n in enumerate(linears):
        a, b = (int(d) for d in n.operands[1].type.shape)
        if a != widths[-1]:
            raise PlanError(f"{where}: linear layer {k} (param %{n.operands[1].name}) takes {a} features but the "
                            f"layer before gives {widths[-1]}; the planner plans chains of linear layers; {hint}")
        widths.append(b)
    x = linears[0].operands[0]
    if len(x.type.shape) != 2:
        raise PlanError(f"{where}: the first linear layer's input is {len(x.type.shape)}-D, not [batch, features]; {hint}")
    batch = int(x.type.shape[0])
    numel = sum(v.type.numel for v in params.values())
    item = int(getattr(x.type.dtype, "itemsize", 4) or 4)
    # A layer keeps its input and its output (the elementwise op's input) for the backward.
    keep = item * sum(widths) / len(linears)
    names = [LAYER_NAME.match(str(n.operands[1].name or "")) for n in linears]
    cuttable = all(names) and len({m.group(1) for m in names if m}) == 1 and \
        len({int(m.group(2)) for m in names if m}) == len(linears)
    return DenseShape(batch, 1, numel, len(linears), max(widths), math.gcd(*widths), 0, max(widths),
                      numel // len(linears), True, item, keep, cuttable, tuple(widths))


def feeds(layer: Any, v: Any) -> bool:
    """Whether ``v`` is ``layer``'s result or made from it alone by ops of one data operand
    (the others params or constants): the elementwise ops between two linear layers."""
    while v.producer is not layer:
        node = v.producer
        if node is None or node.op == "matmul":
            return False
        data = [u for u in node.operands if (u.producer is not None and u.producer.operands) or u.role == "input"]
        if len(data) != 1:
            return False
        v = data[0]
    return True
