"""Optimizer passes: append the parameter update to a graph that returns gradients.

After ``grad``, a graph returns ``(loss, ..., <p>.grad for each param p)``. ``sgd`` and
``adamw`` replace the gradient outputs with the new version of each parameter (``%p.1``,
aliasing ``%p``) and of each optimizer state. The state tensors become ``state`` inputs
(initialized to zeros in the graph's weights, as PyTorch's optimizers start), so the whole
step is one functional graph:

    train_step(inputs, params, opt_state) -> (loss, new_params, new_opt_state)

The state names follow PyTorch's optimizer state (``<p>.exp_avg``, ``<p>.exp_avg_sq``,
``<p>.momentum_buffer``) plus one shared ``step`` counter for AdamW's bias correction.

A weightless graph (no param has an array in its weights, e.g. ``partita.models.gpt``)
gets no state arrays either: a ``state`` input without an array starts at zeros by
definition (``ParallelProgram.shard_weights``, the pipeline stages and ``Trainer`` fill
them), so building a step allocates nothing proportional to the parameter count.

``adamw`` with ``master_weights=True`` trains f16/bf16 params as Megatron-LM does: an f32
master copy ``<p>.master`` (a ``state`` input; its initial value is the param's, cast), f32
moments, the gradient cast to f32, the update on the master, and the new param
``cast(master', p.dtype)``: per param 2 bytes of param, 2 of gradient and 12 of optimizer
state (ZeRO's K = 12).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

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


def has_weights(graph: Graph) -> bool:
    """Whether some param of ``graph`` has an array in its weights (else the graph is
    weightless, and so is the optimizer state added to it)."""
    return any(v.role == "param" and v.name in graph.weights for v in graph.inputs)


def initial_state(name: str, t: TensorType, values: Mapping[str, Any]) -> np.ndarray:
    """The initial value of the ``state`` input ``name`` that ``values`` lacks: an f32 master
    copy ``<p>.master`` starts as the param ``<p>`` cast (when ``values`` has it), any other
    state at zeros."""
    if name.endswith(".master") and name[:-len(".master")] in values:
        return np.asarray(values[name[:-len(".master")]], dtype=np.float32).astype(t.dtype.np)
    return np.zeros(t.shape, dtype=t.dtype.np)


class _StateInputs:
    """Adds ``state`` inputs to a graph under fresh names (the names taken are read once, so
    adding one per param is linear, not quadratic, in the inputs); with ``fill``, each gets
    its initial array (``init``, or zeros) in the weights."""

    def __init__(self, graph: Graph, fill: bool) -> None:
        self.graph, self.fill = graph, fill
        self.taken = {v.name for v in graph.inputs}

    def new(self, base: str, t: TensorType, init: np.ndarray | None = None, fill: bool = True) -> Value:
        name, i = base, 1
        while name in self.taken:
            name, i = f"{base}{i}", i + 1
        self.taken.add(name)
        v = self.graph.add_input(name, t, "state")
        if self.fill and fill:
            self.graph.weights[name] = np.zeros(t.shape, dtype=t.dtype.np) if init is None else init
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
    states = _StateInputs(graph, has_weights(graph))
    b = Builder(graph)
    new_params, new_states = [], []
    for p, i in grads:
        g = graph.outputs[i]
        attrs = dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
        if momentum != 0.0:
            buf = states.new(f"{p.name}.momentum_buffer", p.type)
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
                weight_decay: float = 1e-2, keep_grads: bool = False, master_weights: bool = False) -> Graph:
    """Append one ``torch.optim.AdamW`` step (see ``adamw_update``); in place. With
    ``master_weights``, f16/bf16 params are updated through an f32 master copy (see the
    module docstring); f32 params are updated as without it."""
    grads = gradient_outputs(graph)
    states = _StateInputs(graph, has_weights(graph))
    b = Builder(graph)
    step = states.new("step", TensorType((), f32))
    step2 = b.add(step, b.full(shape=(), value=1.0, dtype=f32), name="step.1")
    new_params, new_states = [], []
    for p, i in grads:
        g = graph.outputs[i]
        low = master_weights and p.type.dtype.is_float and p.type.dtype.bits < 32
        st = TensorType(p.type.shape, f32) if low else p.type
        w = p
        if low:
            init = np.asarray(graph.weights[str(p.name)], dtype=np.float32) if p.name in graph.weights else None
            w = states.new(f"{p.name}.master", st, init, fill=init is not None)
            g = b.cast(g, dtype=f32)
        m = states.new(f"{p.name}.exp_avg", st)
        v = states.new(f"{p.name}.exp_avg_sq", st)
        w2, m2, v2 = b.adamw_update(w, g, m, v, step2, lr=lr, beta1=beta1, beta2=beta2, eps=eps,
                                    weight_decay=weight_decay)
        m2.name, v2.name = f"{m.name}.1", f"{v.name}.1"
        if low:
            w2.name = f"{w.name}.1"
            p2 = b.cast(w2, dtype=p.type.dtype, name=f"{p.name}.1")
            new_states.append((w, w2))
        else:
            p2 = w2
            p2.name = f"{p.name}.1"
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
        master_weights: bool = False

    def run(self, graph: Graph) -> Graph:
        o = self.options
        return apply_adamw(graph, o.lr, o.beta1, o.beta2, o.eps, o.weight_decay, o.keep_grads, o.master_weights)
