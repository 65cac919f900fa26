"""The parallel part of ``partita demo``: a GPT-2-style model trained on a pp=2 x dp=2 x tp=2 mesh.

A small GPT-2 is built from a config (random weights; nothing is downloaded), imported,
its fused q/k/v projection split in three (``split-projections``), turned into one training
step (cross-entropy, SGD with momentum), parallelized with ``pp+dp+megatron`` for
``mesh(pp=2, dp=2, tp=2)``: two pipeline stages running the 1F1B schedule over 4
microbatches, each stage data- and tensor-parallel over 4 ranks. It runs for a few steps on
8 local CPU processes over gloo, with the single-device step on the same batches beside it;
the demo prints the plan and the schedule, one rank's program, both losses per step, and
ends with the check's verdict.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

SGD = {"lr": 0.05, "momentum": 0.9}


def gpt2_from_config(layers: int = 2, width: int = 64, heads: int = 4, vocab: int = 257, positions: int = 64):
    """A GPT-2 LM with random weights from a config, as a module returning the logits. The
    vocabulary is odd, as GPT-2's own 50,257 words are: megatron pads it to split it."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=positions,
                     use_cache=False, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = GPT2LMHeadModel(cfg)

        def forward(self, ids):
            return self.lm(input_ids=ids, use_cache=False).logits

    return Logits().eval(), cfg


_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "shard_slice", "broadcast")


def _excerpt(text: str, head: int = 14, p2p_only: bool = False) -> str:
    """The first lines of a per-rank program, then every collective (with ``p2p_only``: every
    send and recv, the collectives between them counted) with its line."""
    lines = text.splitlines()
    out = lines[:head]
    hidden = colls = 0

    def flush() -> None:
        nonlocal hidden, colls
        if hidden:
            out.append(f"    ... {hidden} lines" + (f", {colls} collective(s)" if colls else "") + " ...")
        hidden = colls = 0

    for line in lines[head:-1]:
        is_coll = any(f"= {op}(" in line for op in _COLLECTIVES)
        is_p2p = "= recv(" in line or line.lstrip().startswith("send(")
        if is_p2p or (is_coll and not p2p_only):
            flush()
            out.append(line[:150] + (" ..." if len(line) > 150 else ""))
        else:
            hidden += 1
            colls += is_coll
    flush()
    out.append(lines[-1])
    return "\n".join(out)


def demo_parallel(seed: int = 0, steps: int = 5, mesh: str = "pp=2,dp=2,tp=2", strategy: str = "pp+dp+megatron",
                  out_dir: Path | None = None, microbatches: int = 4, schedule: str = "1f1b",
                  layers: int = 4) -> bool:
    """Run the demo; returns whether every step agreed with the single-device step."""
    import torch

    from ..autodiff.training import training_step
    from ..frontend.torch_export import import_torch
    from ..ir.printer import print_graph
    from ..parallel.strategy import parallelize
    from ..passes.manager import PassManager
    from .parallel_run import launch

    torch.manual_seed(seed)
    model, cfg = gpt2_from_config(layers=layers)
    batch, seq = 8, 32
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    t0 = time.perf_counter()
    fwd = import_torch(model, (ids,))
    # GPT-2 computes q, k and v with one fused weight; one projection each lets tensor
    # parallelism split the attention by heads (see partita/passes/split_projections.py).
    fwd = PassManager.parse("split-projections").run(fwd)
    step = training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=SGD["lr"], momentum=SGD["momentum"])
    print(f"GPT-2 from a config: {cfg.n_layer} layers, {cfg.n_embd} wide, {cfg.n_head} heads, vocab "
          f"{cfg.vocab_size}; batch {batch} x {seq} tokens. Imported, its fused q/k/v projections split "
          f"(split-projections), and turned into one training step "
          f"(cross-entropy, SGD lr={SGD['lr']} momentum={SGD['momentum']}): {len(step)} nodes in "
          f"{time.perf_counter() - t0:.1f} s")
    pipelined = "pp" in strategy.split("+")
    extra: dict[str, Any] = dict(microbatches=microbatches, schedule=schedule) if pipelined else {}
    t1 = time.perf_counter()
    prog = parallelize(step, mesh, strategy, **extra)
    opts = "".join(f", {k}={v!r}" for k, v in extra.items())
    print(f"\npartita.parallelize(step, mesh='{mesh}', strategy='{strategy}'{opts}) in "
          f"{time.perf_counter() - t1:.2f} s\n")
    print(prog.plan.summary())
    if pipelined:
        print("\nthe schedule, one row per pp rank (every rank of a stage runs the same row):")
        print(prog.plan.chart)
    text = print_graph(prog.local)
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "rank_program.pir").write_text(text)
        (out_dir / "plan.json").write_text(prog.plan.to_json())
    coords = ", ".join(f"{a}={c}" for a, c in zip(prog.mesh.names, prog.mesh.coords(0)))
    same = "the other ranks of its stage run the same program" if pipelined else "as every rank does"
    print(f"\nrank 0's program ({len(prog.local)} nodes; rank 0 at {coords} runs it on its own pieces; {same}), "
          f"its first lines and every " + ("send and recv" if pipelined else "collective")
          + (f" (all of it: {out_dir / 'rank_program.pir'})" if out_dir is not None else "") + ":")
    print(_excerpt(text, p2p_only=pipelined))
    rng = np.random.default_rng(seed)
    data = [{"ids": rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int64),
             "target": rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int64)} for _ in range(steps)]
    (inp,) = [str(v.name) for v in step.inputs if v.role == "input" and v.name != "target"]
    data = [{inp: d["ids"], "target": d["target"]} for d in data]
    n = prog.mesh.size
    from .launch import resolve_backend

    print(f"\ntraining {steps} steps on {n} local processes ({resolve_backend('auto', n)}), with the single-device "
          "step beside it ...", flush=True)
    t1 = time.perf_counter()
    res = launch(prog, n, data, check=True)
    print(f"{steps} steps in {time.perf_counter() - t1:.1f} s including process start-up; median step "
          f"{np.median(res.step_seconds) * 1e3:.0f} ms on the slowest rank"
          + (f"; bubble predicted {prog.plan.bubble:.0%}, measured {prog.plan.measured_bubble:.0%} (time in recv)"
             if pipelined and prog.plan.measured_bubble is not None else "") + "\n")
    print(f"{'step':>4}  {'loss (' + str(n) + ' ranks)':>16}  {'loss (1 device)':>16}  {'worst rel. error':>17}")
    for c in res.checks:
        print(f"{c.step:>4}  {c.loss:>16.6f}  {c.single_loss:>16.6f}  {c.worst:>17.2e}")
    worst = max(res.checks, key=lambda c: c.worst)
    if res.passed:
        print(f"\ncheck: PASS: the loss and every updated parameter of every step are within {res.tolerance:g} "
              f"(relative, per tensor) of the single-device step; worst {worst.worst:.1e} (%{worst.worst_output})")
    else:
        print(f"\ncheck: FAIL: step {worst.step}, %{worst.worst_output} differs by {worst.worst:.2e}")
    return bool(res.passed)
