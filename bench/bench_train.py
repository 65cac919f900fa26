"""Benchmark of one training step: partita's training-step graph against a PyTorch eager step.

    .venv/bin/python bench/bench_train.py                      # all models
    .venv/bin/python bench/bench_train.py --models mlp --repeats 30

For each model, partita's step is the graph from ``partita.training_step(import_torch(model),
loss="cross_entropy", optimizer="adamw")`` run by ``partita.autodiff.Trainer`` on the torch
executor (forward, backward and AdamW update in one graph, the new params and optimizer state
fed back each step). PyTorch's step is the plain eager loop on the same model, batch and
initial weights: ``zero_grad(); loss = cross_entropy(model(x), y); loss.backward();
opt.step()`` with ``torch.optim.AdamW`` (its default single-tensor implementation on CPU).
Both run on one thread. The two are interleaved: each round times one partita step and one
eager step, so a slow moment of the machine hits both; the figure is the median over the
rounds, and the ratio partita / eager is the median of the per-round ratios.

Also timed: the ``grad`` pass itself (autodiff of the forward graph, including the loss)
on GPT-2 with 12 layers, 768 wide (target: under 1 s), and the whole ``training_step``
build (grad + adamw + dce + verify) on the same graph.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import partita  # noqa: E402
from partita.autodiff import Trainer, grad  # noqa: E402
from partita.autodiff.training import _append_loss  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
RATIO_TARGET = 1.0
GRAD_PASS_TARGET_S = 1.0


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(F.relu(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):
    """A small ResNet-style CNN: conv/batch-norm (inference statistics)/relu/pool and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16)
        self.c2, self.b2 = nn.Conv2d(16, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32)
        self.c3, self.b3 = nn.Conv2d(32, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.b1(self.c1(x)))
        x = F.relu(self.b2(self.c2(x)))
        x = self.pool(F.relu(self.b3(self.c3(x)) + x))
        return self.fc(torch.flatten(x, 1))


class Logits(nn.Module):
    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, use_cache=False).logits


def gpt2(layers: int, width: int, heads: int, vocab: int, positions: int) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab, n_positions=positions,
                     use_cache=False, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    return Logits(GPT2LMHeadModel(cfg))


def make(key: str) -> tuple[str, nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    if key == "mlp":
        return "MLP 784-256-128-10, batch 64", MLP(), torch.randn(64, 784), torch.randint(0, 10, (64,))
    if key == "cnn":
        return ("CNN (3 conv+bn, 32x32 images), batch 16", CNN(), torch.randn(16, 3, 32, 32),
                torch.randint(0, 10, (16,)))
    if key == "gpt2":
        model = gpt2(2, 128, 4, 512, 64)
        return ("GPT-2 (2 layers, 128 wide, vocab 512), batch 4 x 64 tokens", model,
                torch.randint(0, 512, (4, 64)), torch.randint(0, 512, (4, 64)))
    raise SystemExit(f"unknown model {key!r}; choose from mlp, cnn, gpt2")


def eager_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def bench_step(key: str, rounds: int, warmup: int = 3) -> dict[str, Any]:
    label, model, x, y = make(key)
    model.eval()  # no dropout; batch norm with its running statistics, the same in both
    fwd = partita.import_torch(model, (x,))
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", lr=1e-3)
    trainer = Trainer(step)
    (xname,) = [str(v.name) for v in fwd.inputs if v.role == "input"]
    batch = {xname: x, "target": y}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def eager_step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = eager_loss(model, x, y)
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(warmup):
        trainer.step(batch)
        eager_step()
    ours, theirs, ratios = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        trainer.step(batch)
        t1 = time.perf_counter()
        eager_step()
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        theirs.append(t2 - t1)
        ratios.append((t1 - t0) / (t2 - t1))
    return {"model": key, "label": label, "nodes": len(step), "partita_ms": statistics.median(ours) * 1e3,
            "eager_ms": statistics.median(theirs) * 1e3, "ratio": statistics.median(ratios),
            "partita_runs_ms": [t * 1e3 for t in ours], "eager_runs_ms": [t * 1e3 for t in theirs]}


def bench_grad_pass(repeats: int, layers: int = 12) -> dict[str, Any]:
    model = gpt2(layers, 768, 12, 50257, 1024).eval()
    ids = torch.randint(0, 50257, (1, 32))
    fwd = partita.import_torch(model, (ids,))
    grad_s, build_s = [], []
    for _ in range(repeats):
        g = fwd.clone()
        _append_loss(g, "cross_entropy", 0)
        t0 = time.perf_counter()
        grad(g)
        grad_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw")
        build_s.append(time.perf_counter() - t0)
    from partita.autodiff.recompute import analyze, recompute

    before = analyze(step)
    t0 = time.perf_counter()
    n_rec = recompute(step)
    recompute_s = time.perf_counter() - t0
    after = analyze(step)
    return {"forward_nodes": len(fwd), "grad_nodes": len(g), "step_nodes": len(step),
            "saved_bytes": before.saved_bytes, "peak_bytes": before.peak_bytes,
            "recomputed": n_rec, "recompute_s": recompute_s, "saved_bytes_recompute": after.saved_bytes,
            "peak_bytes_recompute": after.peak_bytes,
            "grad_pass_s": statistics.median(grad_s), "training_step_s": statistics.median(build_s),
            "grad_runs_s": grad_s, "build_runs_s": build_s, "layers": layers}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["mlp", "cnn", "gpt2"])
    ap.add_argument("--rounds", type=int, default=30, help="interleaved timing rounds per model (default 30)")
    ap.add_argument("--grad-repeats", type=int, default=3, help="runs of the grad-pass timing (default 3)")
    ap.add_argument("--skip-grad-pass", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = [bench_step(k, args.rounds) for k in args.models]
    print("| model | step nodes | partita step (ms) | eager step (ms) | partita / eager |")
    print("|---|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['label']} | {r['nodes']} | {r['partita_ms']:.2f} | {r['eager_ms']:.2f} | {r['ratio']:.2f} |")
    gp = None
    if not args.skip_grad_pass:
        gp = bench_grad_pass(args.grad_repeats)
        print(f"\ngrad pass on GPT-2 ({gp['layers']} layers, 768 wide): {gp['grad_pass_s']:.3f} s "
              f"({gp['forward_nodes']} forward nodes -> {gp['grad_nodes']} with the backward); whole "
              f"training_step build {gp['training_step_s']:.3f} s ({gp['step_nodes']} nodes)")
        mib = 1 << 20
        print(f"memory of that step (batch 1 x 32 tokens): kept for backward {gp['saved_bytes'] / mib:.1f} MiB, "
              f"peak {gp['peak_bytes'] / mib:.1f} MiB; recompute ({gp['recomputed']} values, "
              f"{gp['recompute_s']:.2f} s): kept {gp['saved_bytes_recompute'] / mib:.1f} MiB, "
              f"peak {gp['peak_bytes_recompute'] / mib:.1f} MiB")
    for r in results:
        verdict = "met" if r["ratio"] <= RATIO_TARGET else "NOT met"
        print(f"{r['model']}: ratio {r['ratio']:.2f} (target <= {RATIO_TARGET}): {verdict}")
    if gp is not None:
        verdict = "met" if gp["grad_pass_s"] < GRAD_PASS_TARGET_S else "NOT met"
        print(f"grad pass {gp['grad_pass_s']:.3f} s (target < {GRAD_PASS_TARGET_S} s): {verdict}")
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    out = RESULTS_DIR / f"train-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps({"machine": platform.platform(), "torch": torch.__version__, "threads": 1,
                               "steps": results, "grad_pass": gp}, indent=1))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
