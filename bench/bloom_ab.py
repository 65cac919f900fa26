"""BLOOM's import-path program with and without its ALiBi attention taken (attention_spelled.py),
its factored GELU taken as the GEMM's epilogue (factored_gelu.py) and slices bound as arena views,
built in one process and called in turn: thread CPU time a call, medians of 21 rounds of 100 calls.

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/bloom_ab.py
"""
from __future__ import annotations

import sys, tempfile, time, statistics
from pathlib import Path
sys.path.insert(0, "bench")
import torch
import bench_zoo as Z, zoo_models as ZM
import partita
import partita.codegen as C
from partita.codegen import CompiledProgram, library
by = {m.name: m for m in ZM.MODELS}
case = Z.Case(by["bloom"], Path(tempfile.mkdtemp()))

def build(new: bool) -> tuple:
    """(the frozen program, its inputs, its graph); ``new=False`` turns this round's three changes off."""
    saved = (library.ANCHORS["softmax"], library.take_factored_gelu, C._VIEW_OPS)
    if not new:
        library.ANCHORS["softmax"] = lambda g, n: None
        library.take_factored_gelu = lambda g: 0
        C._VIEW_OPS = C._VIEW_OPS - {"slice"}
    try:
        with Z.quiet():
            g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)
        prog = CompiledProgram(g, freeze=True)
    finally:
        library.ANCHORS["softmax"], library.take_factored_gelu, C._VIEW_OPS = saved
    args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
    return prog, args, g

progs = {k: build(k == "new") for k in ("old", "new")}
with torch.inference_mode():
    outs = {k: p(a)[0] for k, (p, a, g) in progs.items()}
    with torch.no_grad():
        want = case.model(**case.kwargs)
    print("old vs new max diff", float((outs["old"] - outs["new"]).abs().max()))
    for k, (p, a, g) in progs.items():
        print(k, "nodes", len(list(g.nodes)))
    for _ in range(50):
        for p, a, g in progs.values(): p(a)
    res = {k: [] for k in progs}
    for r in range(21):
        for k, (p, a, g) in progs.items():
            t0 = time.thread_time()
            for _ in range(100): p(a)
            res[k].append((time.thread_time() - t0) / 100 * 1e6)
m = {k: statistics.median(v) for k, v in res.items()}
ratios = [n / o for n, o in zip(res["new"], res["old"])]
print("thread CPU us a call, medians of 21 rounds of 100:", {k: round(v, 1) for k, v in m.items()},
      "new/old median of per-round ratios %.3f" % statistics.median(ratios))
