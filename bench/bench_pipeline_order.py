"""bench/bench_pipeline_order.py: what ordering a pipeline rank's dp/tp collectives by
readiness cost, measured. A GPT-2 (8 layers, 256 wide, vocab 1024, batch 16 x 64, M = 8,
1F1B) on pp=2 x dp=2 and pp=2 x tp=2, 4 gloo ranks, one thread each: the programs built with
the old order (``order_collectives`` by readiness) and with ``keep_order=True`` (what
pipelines use), launched in alternating rounds of 8 steps, the first 2 dropped; a step is the
slowest rank's; the ratio is the median of the per-round ratios.

    .venv/bin/python bench/bench_pipeline_order.py [ROUNDS]     # default 3: about 5 minutes
"""

from __future__ import annotations

import statistics
import sys
import warnings

import numpy as np
import torch

import partita
from partita.frontend.torch_export import import_torch
from partita.parallel import bucket as Bk
from partita.passes.manager import PassManager
from partita.runtime.demo import gpt2_from_config

warnings.filterwarnings("ignore")


def main():
    torch.manual_seed(0)
    B, T = 16, 64
    m, cfg = gpt2_from_config(layers=8, width=256, heads=4, vocab=1024, positions=64)
    fwd = import_torch(m, (torch.randint(0, cfg.vocab_size, (B, T)),))
    fwd = PassManager.parse("split-projections").run(fwd)
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    data = [{"ids": rng.integers(0, cfg.vocab_size, (B, T)).astype(np.int64),
             "target": rng.integers(0, cfg.vocab_size, (B, T)).astype(np.int64)} for _ in range(8)]
    orig = Bk.order_collectives

    def build(mesh, strat, keep):
        def oc(g, prefetch=1, keep_order=False):
            return orig(g, prefetch, keep_order=keep)
        Bk.order_collectives = oc
        try:
            return partita.parallelize(step, mesh, strat, microbatches=8, schedule="1f1b")
        finally:
            Bk.order_collectives = orig

    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    for mesh, strat in [("pp=2,dp=2", "pp+dp"), ("pp=2,tp=2", "pp+megatron")]:
        progs = {k: build(mesh, strat, k) for k in (False, True)}
        t = {False: [], True: []}
        for r in range(rounds):
            for k in (False, True):
                res = partita.launch(progs[k], 4, data, threads=1, timeout_s=120)
                t[k].append(statistics.median(res.run.step_seconds()[2:]))
        ratio = statistics.median([a / b for a, b in zip(t[True], t[False])])
        print(f"{mesh} {strat}: readiness order {statistics.median(t[False])*1e3:.0f} ms, keep_order "
              f"{statistics.median(t[True])*1e3:.0f} ms, after/before {ratio:.2f}", flush=True)


if __name__ == "__main__":
    main()
