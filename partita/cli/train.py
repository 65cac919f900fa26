"""``partita train``: train a forward graph for a few steps on synthetic data.

The forward ``.pir`` (with its ``.safetensors``) becomes a training step
(``partita.training_step``); each step feeds a fresh random batch: token ids for integer
inputs (below the vocabulary of the embedding that reads them), normal floats for float
inputs (images for a CNN), and random targets for the loss. The loss is printed each step
with a progress bar, and the trained parameters are written as safetensors.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..ir.diagnostics import PartitaError
from ..ir.graph import Graph, Value, input_name
from ..ir.weights import Weights
from ..autodiff.recompute import analyze, apply_recompute
from ..autodiff.training import Trainer, training_step
from .common import float_arg, int_arg, random_array, seed_arg


class TrainError(PartitaError):
    """A training run that cannot start (the message says why and what to change)."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    t = sub.add_parser("train", parents=[common], help="train a .pir model for a few steps on synthetic data",
                       description="Build the training step of FILE.pir (grad + optimizer passes) and run it on "
                                   "random batches, printing the loss of each step; saves the trained weights.")
    t.add_argument("file", metavar="FILE.pir")
    t.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw", help="default adamw")
    t.add_argument("--steps", type=int_arg(1), default=10, help="number of steps (default 10)")
    t.add_argument("--lr", type=float_arg(0, above=True), default=1e-3, help="learning rate (default 1e-3)")
    t.add_argument("--weight-decay", type=float_arg(0), default=None,
                   help="weight decay (default: 0.01 for adamw, 0 for sgd)")
    t.add_argument("--momentum", type=float_arg(0), default=0.0, help="sgd momentum (default 0)")
    t.add_argument("--loss", choices=("auto", "cross_entropy", "mse"), default="auto",
                   help="auto: output 0 if it is a scalar, else cross entropy over its last dim")
    t.add_argument("--backend", choices=("torch", "numpy"), default="torch", help="executor (default torch)")
    t.add_argument("--recompute", nargs="?", const="cheap", default="none",
                   choices=("none", "cheap", "selective", "full"),
                   help="recompute forward values in backward instead of keeping them: cheap (the default when "
                        "given alone), selective (each layer's attention core) or full (each layer keeps only "
                        "its input)")
    t.add_argument("--seed", type=seed_arg, default=0, help="seed of the synthetic data (default 0)")
    t.add_argument("--same-batch", action="store_true",
                   help="reuse one batch every step (the loss then falls as the model fits it)")
    t.add_argument("-o", "--output", metavar="OUT.safetensors",
                   help="where to save the trained weights (default: FILE.trained.safetensors)")
    t.add_argument("--save-step", metavar="STEP.pir", help="also write the training-step graph")
    t.set_defaults(handler=cmd_train)


def _vocab(v: Value) -> int | None:
    """The number of rows of the embedding table that reads ``v`` as indices, if any."""
    for user in v.users:
        if user.op == "embedding" and user.operands[1] is v:
            return user.operands[0].type.shape[0]
        if user.op in ("reshape", "cast", "unsqueeze", "squeeze", "broadcast_to") and user.results:
            n = _vocab(user.results[0])
            if n is not None:
                return n
    return None


def synthetic_batch(step: Graph, fwd: Graph, rng: np.random.Generator, classes: int | None) -> dict[str, Any]:
    """One random batch for the ``input``-role inputs of ``step``."""
    batch: dict[str, Any] = {}
    for v in step.inputs:
        if v.role != "input":
            continue
        name, t = input_name(v), v.type
        if name == "target" and t.dtype.is_int:
            batch[name] = random_array(v, lambda: rng.integers(0, classes or 2, size=t.shape).astype(t.dtype.np))
        elif t.dtype.is_float:
            batch[name] = random_array(v, lambda: rng.standard_normal(t.shape).astype(t.dtype.np))
        elif t.dtype.is_int:
            fv = next((u for u in fwd.inputs if input_name(u) == name), None)
            high = (_vocab(fv) if fv is not None else None) or 8
            batch[name] = random_array(v, lambda: rng.integers(0, high, size=t.shape).astype(t.dtype.np))
        else:
            batch[name] = random_array(v, lambda: rng.random(t.shape) < 0.5)
    return batch


def _bar(i: int, n: int, width: int = 24) -> str:
    done = int(width * i / max(n, 1))
    return "[" + "=" * done + (">" if done < width else "") + " " * max(width - done - 1, 0) + "]"


def cmd_train(args: argparse.Namespace) -> int:
    from ..ir.parser import parse_file
    from ..ir.verifier import verify
    from .common import require_weights

    fwd = parse_file(args.file)
    verify(fwd)
    require_weights(fwd, args.file)
    if not fwd.outputs:
        raise TrainError(f"@{fwd.name} has no outputs to train")
    out0 = fwd.outputs[0]
    loss: int | str
    if args.loss == "auto":
        loss = 0 if out0.type.shape == () else "cross_entropy"
    else:
        loss = args.loss
    classes = out0.type.shape[-1] if loss == "cross_entropy" and out0.type.rank else None
    opts: dict[str, Any] = {"lr": args.lr}
    wd = args.weight_decay if args.weight_decay is not None else (0.01 if args.optimizer == "adamw" else 0.0)
    opts["weight_decay"] = wd
    if args.optimizer == "sgd":
        opts["momentum"] = args.momentum
    elif args.momentum:
        raise TrainError("--momentum applies to --optimizer sgd only")
    t0 = time.perf_counter()
    step = training_step(fwd, loss=loss, optimizer=args.optimizer, **opts)
    n_recomputed = apply_recompute(step, args.recompute)
    build_s = time.perf_counter() - t0
    params = [v for v in step.inputs if v.role == "param"]
    nparams = sum(int(np.prod(v.type.shape)) for v in params)
    mem = analyze(step)
    print(f"@{fwd.name}: {len(params)} parameter tensors ({nparams:,} values), loss "
          f"{loss if isinstance(loss, str) else 'output ' + str(loss)}, {args.optimizer} "
          f"{', '.join(f'{k}={v:g}' for k, v in opts.items())}")
    print(f"training step: {len(step)} nodes, built in {build_s:.2f} s"
          + (f", {n_recomputed} values recomputed in backward" if args.recompute != "none" else ""))
    print(mem.text(top=3))
    if args.save_step:
        from .. import save
        save(step, args.save_step)
        print(f"wrote the training step to {args.save_step}")
    trainer = Trainer(step, backend=args.backend)
    rng = np.random.default_rng(args.seed)
    batch = synthetic_batch(step, fwd, rng, classes)
    losses = []
    t_run = time.perf_counter()
    tty = sys.stdout.isatty()
    for i in range(1, args.steps + 1):
        if i > 1 and not args.same_batch:
            batch = synthetic_batch(step, fwd, rng, classes)
        ts = time.perf_counter()
        val = trainer.step(batch)
        dt = time.perf_counter() - ts
        losses.append(val)
        if not np.isfinite(val):
            raise TrainError(f"step {i}: the loss is {val}; lower --lr (now {args.lr:g})")
        line = f"step {i:>4}/{args.steps} {_bar(i, args.steps)} loss {val:.6f}  {dt * 1e3:7.1f} ms"
        print(("\r" + line) if tty else line, end="" if tty and i < args.steps else "\n", flush=True)
    total = time.perf_counter() - t_run
    print(f"{args.steps} steps in {total:.2f} s ({total / args.steps * 1e3:.1f} ms/step); "
          f"loss {losses[0]:.6f} -> {losses[-1]:.6f}")
    out = Path(args.output) if args.output else Path(args.file).with_suffix(".trained.safetensors")
    # The forward graph's weights with the parameters trained: a drop-in replacement for the
    # model's .safetensors (buffers such as running statistics are kept as they were).
    trained = trainer.weights()
    keep = Weights({n: fwd.weights[n] for n in fwd.weights})
    for v in params:
        keep[input_name(v)] = trained[input_name(v)]
    keep.save(out)
    print(f"saved the weights with {len(params)} trained parameter tensors to {out}")
    return 0


def demo_training(forward: Graph, seed: int, steps: int = 6) -> bool:
    """The training part of ``partita demo``: build the step of ``forward`` (MSE against a
    random target, AdamW), show its shape and memory, and train a few steps on the same batch
    with both executors; returns whether their losses agree."""
    from ..ir.printer import print_graph

    step = training_step(forward, loss="mse", optimizer="adamw", lr=1e-2)
    start = next(i for i, n in enumerate(step.nodes) if any(r.name == "grad.seed" for r in n.results))
    updates = sum(1 for n in step.nodes if n.op == "adamw_update")
    aliased = sum(1 for a in step.output_aliases if a is not None)
    print(f"partita.training_step(@{forward.name}, loss='mse', optimizer='adamw', lr=0.01) -> "
          f"@{step.name}: {len(step)} nodes ({start} forward, {len(step) - start - updates - 1} backward, "
          f"{updates} adamw_update), {len(step.inputs)} inputs, {len(step.outputs)} outputs of which "
          f"{aliased} alias the input they replace")
    head = print_graph(step).splitlines()
    sig_end = next(i for i, line in enumerate(head) if line.startswith(")") or line.endswith("{"))
    print("signature (outputs):", head[sig_end].strip()[:160] + (" ..." if len(head[sig_end]) > 160 else ""))
    print(analyze(step).text(top=3))
    rng = np.random.default_rng(seed)
    batch = synthetic_batch(step, forward, rng, None)
    runs = {b: Trainer(step, backend=b) for b in ("numpy", "torch")}
    print(f"\n{'step':>4}  {'loss (numpy)':>14}  {'loss (torch)':>14}")
    ok = True
    for i in range(1, steps + 1):
        a, b = runs["numpy"].step(batch), runs["torch"].step(batch)
        ok &= abs(a - b) <= 1e-4 * max(1.0, abs(a))
        print(f"{i:>4}  {a:>14.6f}  {b:>14.6f}")
    return ok
