"""Optimizer passes: append the parameter update to a graph that returns gradients.

After ``grad``, a graph returns ``(loss, ..., <p>.grad for each param p)``. ``sgd`` and
``adamw`` replace the gradient outputs with the new version of each parameter (``%p.1``,
aliasing ``%p``) and of each optimizer state. The state tensors become ``state`` inputs
(initialized to zeros in the graph's weights, as PyTorch's optimizers start), so the whole
step is one functional graph:

    train_step(inputs, params, opt_state) -> (loss, new_params, new_opt_state)

The state names follow PyTorch's optimizer state (``<p>.exp_avg``, ``<p>.exp_avg_sq``,
``<p>.momentum_buffer``) plus one shared ``step`` counter for AdamW's bias correction.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.builder import Builder
from ..ir.dtypes import f32
from ..ir.graph import Graph, Value
from ..ir.types import TensorType
from ..passes.manager import Pass, register_pass
from .grad import AutodiffError


def gradient_outputs(graph: Graph) -> list[tuple[Value, int]]:
    """(param, output index of its gradient) for every param whose ``<p>.grad`` is an output."""
    by_name = {v.name: i for i, v in enumerate(graph.outputs) if v.name}
    found = []
    for p in graph.inputs:
        if p.role == "param" and f"{p.name}.grad" in by_name:
            found.append((p, by_name[f"{p.name}.grad"]))
    if not found:
        raise AutodiffError(f"@{graph.name} returns no parameter gradients (outputs named <param>.grad); "
                            f"run the grad pass before the optimizer, e.g. --passes grad,adamw")
    return found


def _fresh_name(graph: Graph, base: str) -> str:
    taken = {v.name for v in graph.inputs}
    name, i = base, 1
    while name in taken:
        name, i = f"{base}{i}", i + 1
    return name


def _state(graph: Graph, name: str, t: TensorType) -> Value:
    name = _fresh_name(graph, name)
    v = graph.add_input(name, t, "state")
    graph.weights[name] = np.zeros(t.shape, dtype=t.dtype.np)
    return v


def _finish(graph: Graph, grads: list[tuple[Value, int]], new_params: list[tuple[Value, Value]],
            new_states: list[tuple[Value, Value]], keep_grads: bool) -> None:
    grad_idx = {i for _, i in grads}
    aliases = graph.output_aliases or [None] * len(graph.outputs)
    outs = [(v, a) for i, (v, a) in enumerate(zip(graph.outputs, aliases)) if keep_grads or i not in grad_idx]
    outs += [(new, old) for old, new in new_params]
    outs += [(new, old) for old, new in new_states]
    graph.set_outputs([v for v, _ in outs], [a for _, a in outs])


def apply_sgd(graph: Graph, lr: float = 1e-3, momentum: float = 0.0, weight_decay: float = 0.0,
              nesterov: bool = False, keep_grads: bool = False) -> Graph:
    """Append one ``torch.optim.SGD`` step (see ``sgd_update``); in place."""
    grads = gradient_outputs(graph)
    b = Builder(graph)
    new_params, new_states = [], []
    for p, i in grads:
        g = graph.outputs[i]
        attrs = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
        if momentum != 0.0:
            buf = _state(graph, f"{p.name}.momentum_buffer", p.type)
            p2, buf2 = b.sgd_update(p, g, buf, **attrs)
            buf2.name = f"{buf.name}.1"
            new_states.append((buf, buf2))
        else:
            p2 = b.sgd_update(p, g, **attrs)
        p2.name = f"{p.name}.1"
        new_params.append((p, p2))
    _finish(graph, grads, new_params, new_states, keep_grads)
    return graph


def apply_adamw(graph: Graph, lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
                weight_decay: float = 1e-2, keep_grads: bool = False) -> Graph:
    """Append one ``torch.optim.AdamW`` step (see ``adamw_update``); in place."""
    grads = gradient_outputs(graph)
    b = Builder(graph)
    step = _state(graph, "step", TensorType((), f32))
    step2 = b.add(step, b.full(shape=(), value=1.0, dtype=f32), name="step.1")
    new_params, new_states = [], []
    for p, i in grads:
        g = graph.outputs[i]
        m = _state(graph, f"{p.name}.exp_avg", p.type)
        v = _state(graph, f"{p.name}.exp_avg_sq", p.type)
        p2, m2, v2 = b.adamw_update(p, g, m, v, step2, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                                    weight_decay=weight_decay)
        p2.name, m2.name, v2.name = f"{p.name}.1", f"{m.name}.1", f"{v.name}.1"
        new_params.append((p, p2))
        new_states += [(m, m2), (v, v2)]
    new_states.append((step, step2))
    _finish(graph, grads, new_params, new_states, keep_grads)
    return graph


@register_pass
class Sgd(Pass):
    """Replace the ``<p>.grad`` outputs with one SGD step: new params ``%p.1`` (aliasing
    ``%p``) and, with momentum, new momentum buffers (``state`` inputs starting at zero)."""

    name = "sgd"

    @dataclass
    class Options:
        lr: float = 1e-3
        momentum: float = 0.0
        weight_decay: float = 0.0
        nesterov: bool = False
        keep_grads: bool = False

    def run(self, graph: Graph) -> Graph:
        o = self.options
        return apply_sgd(graph, o.lr, o.momentum, o.weight_decay, o.nesterov, o.keep_grads)


@register_pass
class AdamW(Pass):
    """Replace the ``<p>.grad`` outputs with one AdamW step: new params ``%p.1`` (aliasing
    ``%p``), new ``exp_avg``/``exp_avg_sq`` states and the step counter."""

    name = "adamw"

    @dataclass
    class Options:
        lr: float = 1e-3
        beta1: float = 0.9
        beta2: float = 0.999
        eps: float = 1e-8
        weight_decay: float = 1e-2
        keep_grads: bool = False

    def run(self, graph: Graph) -> Graph:
        o = self.options
        return apply_adamw(graph, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.keep_grads)
