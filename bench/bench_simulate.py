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

``--speed``: how long partita takes to simulate one step of Megatron-LM's largest pipeline
plans (Narayanan et al. 2021, Table 1), the graph built from the config and parallelized with
the plan (``parallelize(..., unroll=False)``, the section-level simulation): the 1T-parameter
GPT on 3,072 GPUs (pp=64, dp=6, tp=8; 512 microbatches, 1F1B) and GPT-3 175B on 1,024
(pp=8, dp=16, tp=8; 96 microbatches, interleaved with 2 virtual stages); wall seconds of each
phase, peak RSS of the process, the simulated step time and MFU on Selene:

    OMP_NUM_THREADS=1 PYTHONPATH=. /usr/bin/time -v .venv/bin/python bench/bench_simulate.py --speed --only 1t
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


# Megatron-LM's Table 1 rows the speed check simulates: (gpt config, parallelize options).
SPEED_PLANS = {
    "175b": (dict(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200, batch=1536),
             dict(mesh="pp=8,dp=16,tp=8", strategy="pp+dp+megatron", microbatches=96, schedule="interleaved",
                  virtual_stages=2)),
    "1t": (dict(layers=128, hidden=25600, heads=160, seq=2048, vocab=51200, batch=3072),
           dict(mesh="pp=64,dp=6,tp=8", strategy="pp+dp+megatron", microbatches=512, schedule="1f1b")),
}


def speed(only: list[str]) -> list[dict]:
    import resource

    from partita.cluster import simulate

    rows = []
    for name in only:
        cfg, plan = SPEED_PLANS[name]
        t = {}
        t0 = time.perf_counter()
        fwd = partita.models.gpt(dtype="bf16", **cfg)
        t["gpt"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", master_weights=True,
                                     recompute="full")
        t["training_step"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        prog = partita.parallelize(step, unroll=False, **plan)
        t["parallelize"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        r = simulate(prog, "selene", trace=False, memory=False)
        t["simulate"] = time.perf_counter() - t0
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        row = {"model": name, "plan": plan, "seconds": t, "total_s": sum(t.values()), "peak_rss_MB": rss / 1e6,
               "step_s": r.step_time, "mfu": r.mfu, "hfu": r.hfu, "ranks_simulated": len(r.ranks),
               "parallelize_timings": dict(prog.timings)}
        rows.append(row)
        print(f"{name}: " + ", ".join(f"{k} {v:.2f} s" for k, v in t.items()) +
              f"; total {row['total_s']:.2f} s, peak RSS {rss / 1e6:.0f} MB (this process so far); simulated step "
              f"{r.step_time:.2f} s, MFU {r.mfu:.1%}, HFU {r.hfu:.1%} ({len(r.ranks)} ranks simulated)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bench_simulate.json"))
    ap.add_argument("--speed", action="store_true", help="time the simulation of the 1T and 175B pipeline plans")
    ap.add_argument("--only", action="append", choices=sorted(SPEED_PLANS), help="with --speed: this plan only")
    args = ap.parse_args()
    if args.speed:
        rows = speed(args.only or ["175b", "1t"])
        path = Path(args.out).with_name("bench_simulate_speed.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows, indent=1))
        print(f"wrote {path}")
        return
    out = {"zero_fig1": zero_memory()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
