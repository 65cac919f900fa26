"""bench/bench_simulate.py: the simulator and the memory report against published figures.

Today: the memory arithmetic of ZeRO's Figure 1 (Rajbhandari et al. 2020): a 7.5B-parameter
model, 64-way data parallel, Adam in mixed precision (bf16 params and gradients, f32 master
weights and moments: K = 12), per device 120 GB as plain data parallelism, 31.4 GB with the
optimizer states sharded (zero1), 16.6 GB with the gradients too (zero2), 1.9 GB with the
parameters too (zero3); GB = 1e9 bytes. The figures come from partita's own per-rank memory
report (``partita.cluster.memory_report``) of the programs ``parallelize`` emits, the model
a weightless GPT (``partita.models.gpt``) with exactly 7.5e9 parameters: 40 layers, hidden
3840 (30 heads), vocab 107,355, 2,048 positions. The Megatron-LM and Korthikanti et al. rows
(docs/benchmarks.md, issue 16) are still to come.

    .venv/bin/python bench/bench_simulate.py            # about 15 s
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import partita
from partita.cluster import memory_report

# Rajbhandari et al. 2020, Figure 1 (per-device memory of model states, GB).
ZERO_FIG1 = {"dp": 120.0, "zero1": 31.4, "zero2": 16.6, "zero3": 1.9}


def zero_memory() -> list[dict]:
    fwd = partita.models.gpt(layers=40, hidden=3840, heads=30, seq=8, vocab=107355, batch=64, positions=2048,
                             dtype="bf16")
    params = sum(v.type.numel for v in fwd.inputs if v.role == "param")
    assert params == 7_500_000_000, params
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True)
    rows = []
    for strategy, published in ZERO_FIG1.items():
        t0 = time.perf_counter()
        prog = partita.parallelize(step, mesh="dp=64", strategy=strategy)
        m = memory_report(prog.local)
        got = m.model_states / 1e9
        rows.append({"strategy": strategy, "published_GB": published, "partita_GB": round(got, 3),
                     "params_GB": m.params / 1e9, "grads_GB": m.grads / 1e9, "optimizer_GB": m.optimizer / 1e9,
                     "matches": round(got, 1) == published, "parallelize_s": time.perf_counter() - t0})
        print(f"{strategy:>6}: published {published:6.1f} GB, partita {got:8.3f} GB (params {m.params / 1e9:.3f}, "
              f"gradients {m.grads / 1e9:.3f}, optimizer {m.optimizer / 1e9:.3f}) "
              f"{'exact to the stated precision' if round(got, 1) == published else 'DIFFERS'}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_simulate.json"))
    args = ap.parse_args()
    out = {"zero_fig1": zero_memory()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
