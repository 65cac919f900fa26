"""Training as a graph transformation, and a small loop that runs the resulting step.

``training_step(forward, loss=..., optimizer="adamw")`` returns one functional graph::

    train_step(batch inputs, params, opt_state) -> (loss, new params, new opt state)

built from the forward graph by (1) appending a loss when asked, (2) the ``grad`` pass and
(3) the optimizer pass. Parameters and optimizer state are inputs, their new versions are
outputs that alias them, and the initial values sit in the graph's weights, so the step
prints, parses, verifies and saves like any graph. ``Trainer`` runs it repeatedly, feeding
each step's new versions back in as the next step's inputs.
"""

from __future__ import annotations

from typing import Any, Callable, Literal, Mapping

import numpy as np

from ..ir.builder import Builder
from ..ir.graph import Graph, Value
from ..ir.types import TensorType
from ..ir.verifier import verify
from ..ir.weights import Weights
from .grad import AutodiffError, grad
from .optim import apply_adamw, apply_sgd, initial_state

LOSSES = ("cross_entropy", "mse")
_OPTIMIZERS: dict[str, Callable[..., Any]] = {"adamw": apply_adamw, "sgd": apply_sgd}


def _append_loss(graph: Graph, loss: str, output: int) -> None:
    if not 0 <= output < len(graph.outputs):
        raise AutodiffError(f"@{graph.name} has {len(graph.outputs)} output(s); there is no output {output} "
                            f"to compute the {loss} loss from")
    y = graph.outputs[output]
    loc = y.producer.loc if y.producer is not None else None
    b = Builder(graph, loc=loc)
    if not y.type.dtype.is_float:
        raise AutodiffError(f"@{graph.name}: output {output} has dtype {y.type.dtype}; a {loss} loss needs "
                            f"float model outputs")
    if loss == "cross_entropy":
        if y.type.rank < 1:
            raise AutodiffError(f"@{graph.name}: output {output} is a scalar; cross_entropy needs logits "
                                f"[..., classes]")
        from ..ir.dtypes import i64
        lead, ncls = y.type.shape[:-1], y.type.shape[-1]
        target = graph.add_input("target", TensorType(lead, i64), "input")
        logits = y
        if len(lead) != 1:
            n = 1
            for s in lead:
                n *= s
            logits = b.reshape(y, shape=(n, ncls))
            target_v: Value = b.reshape(target, shape=(n,))
        else:
            target_v = target
        out = b.cross_entropy(logits, target_v, name="loss")
    elif loss == "mse":
        target = graph.add_input("target", y.type, "input")
        d = b.sub(y, target)
        out = b.mean(b.mul(d, d), name="loss")
    else:
        raise AutodiffError(f"unknown loss '{loss}'; choose one of {', '.join(LOSSES)}, or pass the index of "
                            f"an output that already is a scalar loss")
    graph.set_outputs([out])


def training_step(forward: Graph, loss: int | str | None = None, optimizer: Literal["adamw", "sgd"] | None = "adamw",
                  *, output: int = 0, wrt: list[str] | None = None, unused: Literal["zeros", "error"] = "zeros",
                  recompute: bool | str = False, **optimizer_options: Any) -> Graph:
    """Build the training step of ``forward`` (the input graph is not changed).

    loss: None or an int: that output of ``forward`` is already the scalar loss (default 0);
      ``"cross_entropy"``: output ``output`` holds logits ``[..., C]`` and a new i64 input
      ``target`` holds the classes; ``"mse"``: mean squared error against a new ``target``
      input of the output's type.
    optimizer: ``"adamw"`` or ``"sgd"`` with ``optimizer_options`` (lr, weight_decay, ...), or
      None to return ``(loss, <p>.grad...)`` without an update.
    recompute: which forward values the backward computes again instead of keeping them alive
      (``partita.autodiff.recompute``; docs/autodiff.md, "Recomputation"): False or ``"none"``;
      True or ``"cheap"`` (cheap elementwise and data-movement values); ``"selective"`` (each
      layer's attention core); ``"full"`` (each layer keeps only its input and runs its
      forward again right before its backward). The recomputed nodes carry
      ``Location.recompute``, which is also how a pipeline built from the step finds the policy.
    The forward is first run through ``fuse-activations`` (spelled-out GELU/SiLU -> one op).
    """
    if not isinstance(forward, Graph):
        raise AutodiffError(f"training_step: the forward graph must be a partita.Graph, got {type(forward).__name__}")
    if loss is not None and not isinstance(loss, str):
        if isinstance(loss, bool) or not isinstance(loss, (int, np.integer)):
            raise AutodiffError(f"training_step: loss must be None, the index of the output that is the loss, or "
                                f"one of {', '.join(LOSSES)}; got {type(loss).__name__} {loss!r:.60}")
        if not 0 <= loss < len(forward.outputs):
            raise AutodiffError(f"training_step: loss={loss}, but @{forward.name} has {len(forward.outputs)} "
                                f"output(s); give the index of the output that is the scalar loss")
    from .recompute import apply_recompute, recompute_policy

    policy = recompute_policy(recompute, "training_step: recompute")
    update = None
    if optimizer is not None:
        update = _OPTIMIZERS.get(optimizer) if isinstance(optimizer, str) else None
        if update is None:
            raise AutodiffError(f"training_step: unknown optimizer {optimizer!r:.60}; choose 'adamw' or 'sgd', or "
                                f"None for the gradients without an update")
        import inspect

        known = [p.name for p in list(inspect.signature(update).parameters.values())[1:]
                 if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]
        unknown = sorted(set(optimizer_options) - set(known))
        if unknown:
            raise AutodiffError(f"training_step: unknown option(s) {', '.join(unknown)} for optimizer '{optimizer}'; "
                                f"its options are {', '.join(known)}")
    elif optimizer_options:
        raise AutodiffError(f"training_step: option(s) {', '.join(sorted(optimizer_options))} need an optimizer; "
                            f"with optimizer=None there is no update to configure")
    g = forward.clone()
    if isinstance(loss, str):
        _append_loss(g, loss, output)
        loss_index = 0
    else:
        loss_index = 0 if loss is None else int(loss)
    # Only the loss is kept as a forward output: the step returns what training needs.
    g.set_outputs([g.outputs[loss_index]] if g.outputs else [])
    from ..passes.manager import PassManager

    # Before grad, so a spelled-out GELU/SiLU differentiates as one gelu_grad/silu_grad.
    PassManager.parse("fuse-activations", verify_each=False).run(g)
    grad(g, wrt, loss_index=0, unused=unused)
    if update is not None:
        update(g, **optimizer_options)
    # Clean up what the rules emit one op at a time (transposes of transposes, repeated
    # broadcasts, unused forward values), as any other graph would be. Without an optimizer
    # the gradients are outputs known by their names (<p>.grad), which canonicalize and cse
    # may merge or replace, so that graph only loses its dead code.
    PassManager.parse("canonicalize,cse,dce" if optimizer is not None else "dce", verify_each=False).run(g)
    # After the cleanup: cse would merge each clone back into its forward original (it keeps
    # recomputed nodes apart now, but the cleanup runs on the graph before they exist anyway).
    apply_recompute(g, policy)
    g.name = f"{forward.name}.train_step" if optimizer is not None else f"{forward.name}.grad"
    verify(g)
    return g


class Trainer:
    """Runs a training-step graph step after step, carrying params and optimizer state.

    The values of ``param``/``state`` inputs start from the graph's weights (or ``weights``);
    after each step, every output that aliases an input becomes that input's next value.
    """

    def __init__(self, step: Graph, weights: Mapping[str, Any] | None = None, backend: str = "torch") -> None:
        self.graph = step
        self.backend = backend
        src = step.weights if weights is None else weights
        self.aliases = [(i, a.name) for i, a in enumerate(step.output_aliases) if a is not None]
        carried = {str(v.name) for v in step.inputs if v.role != "input"}
        # Optimizer state without a value starts as training_step's does (zeros; a master
        # copy from its param), so a weightless step trains once its params are given.
        src = dict(src)
        for v in step.inputs:
            if v.role == "state" and str(v.name) not in src:
                src[str(v.name)] = initial_state(str(v.name), v.type, src)
        missing = sorted(n for n in carried if n not in src)
        if missing:
            raise AutodiffError(f"@{step.name}: no initial value for {', '.join('%' + n for n in missing)}")
        self._program: Any = None
        if backend in ("torch", "codegen"):
            from ..backend.torch_exec import TorchProgram, to_tensor

            # The trainer owns its copies of the params and state and donates them to each
            # step, so the optimizer updates them in place (the outputs alias them).
            if backend == "codegen":
                from ..codegen import CompiledProgram

                self._program = CompiledProgram(step, donate=True)
            else:
                self._program = TorchProgram(step, donate=True)
            self.values: dict[str, Any] = {n: to_tensor(np.array(src[n])) for n in carried}
        elif backend == "numpy":
            self.values = {n: np.asarray(src[n]) for n in carried}
        else:
            raise AutodiffError(f"unknown backend '{backend}'; choose 'torch', 'codegen' (generated kernels, "
                                f"docs/codegen.md) or 'numpy'")

    def step(self, batch: Mapping[str, Any]) -> float:
        """Run one step on ``batch`` (the ``input``-role inputs by name); returns the loss."""
        feed = dict(self.values)
        feed.update(batch)
        if self._program is not None:
            outs = self._program(feed)
        else:
            from ..backend.numpy_ref import run as run_numpy

            outs = run_numpy(self.graph, feed)
        for i, name in self.aliases:
            self.values[str(name)] = outs[i]
        return float(outs[0])

    def weights(self) -> Weights:
        """The current params and optimizer state as NumPy arrays."""
        w = Weights()
        for n, v in self.values.items():
            w[n] = v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v)
        return w
