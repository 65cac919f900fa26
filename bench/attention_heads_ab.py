"""Before and after of the narrow-vector attention kernel and the one-key attention rewrite (or, with
``--change rows``, of ``flatten_sibling_linears``, codegen/sibling_rows.py, alone), in one
process: each zoo model's import path (bench_zoo's ``import_candidate``: ``import_torch``,
IMPORT_PIPELINE, ``CompiledProgram(freeze=True)``) built twice, with both off (heads the lanes do
not divide on the library's flash kernel, softmax anchored on ``fuse_spelled_attention`` alone)
and with both on, and ONNX Runtime on the TorchScript export; the three called in interleaved
rounds (bench_codegen's ``time_rounds``) on one thread, the medians of the per-round ratios
printed, with each program's error against eager. ``--cpu`` times the thread's CPU time instead of
the wall clock (leaving out the moments a loaded machine gives the core to another process).

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/attention_heads_ab.py mobilevit,swin [--rounds 21] [--calls 30] [--change rows] [--cpu]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_codegen as B  # noqa: E402
import bench_zoo as Z  # noqa: E402
import zoo_models as ZM  # noqa: E402


def build(case: Any, on: bool, change: str) -> tuple[Callable[[], Any], float]:
    """The import path's call with ``change`` on or off, and its error against eager."""
    import partita
    from partita.codegen import CompiledProgram, library, narrow_attention
    from partita.codegen.attention_spelled import fuse_spelled_attention
    from partita.codegen.one_key_attention import fuse_attention_one_key
    from partita.codegen.sibling_rows import flatten_sibling_linears

    if change == "rows":
        library.flatten_sibling_linears = flatten_sibling_linears if on else (lambda g: 0)  # type: ignore[assignment]
    else:
        narrow_attention.ENABLED = on
        library.ANCHORS["softmax"] = fuse_attention_one_key if on else fuse_spelled_attention
    try:
        with Z.quiet():
            g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)
        prog = CompiledProgram(g, freeze=True)
        weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
        args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
        err = Z.mw.rel_error(np.asarray(prog(args, weights)[0]), case.eager().double().numpy())
    finally:
        narrow_attention.ENABLED = True
        library.ANCHORS["softmax"] = fuse_attention_one_key
        library.flatten_sibling_linears = flatten_sibling_linears  # type: ignore[assignment]
    return (lambda: prog(args, weights)), err


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", help="comma-separated zoo model names")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--change", choices=("attention", "rows"), default="attention",
                    help="attention: the narrow kernel and the one-key rewrite; rows: flatten_sibling_linears")
    ap.add_argument("--cpu", action="store_true", help="the thread's CPU time, not the wall clock")
    a = ap.parse_args()
    if a.cpu:
        B.time = type("CpuClock", (), {"perf_counter": staticmethod(time.thread_time)})  # time_rounds' clock
    tmp = Path(tempfile.mkdtemp(prefix="attention-ab-"))
    for name in a.models.split(","):
        case = Z.Case(ZM.BY_NAME[name], tmp)
        before, e0 = build(case, on=False, change=a.change)
        after, e1 = build(case, on=True, change=a.change)
        ort = Z.ort_session(case, 1)
        cands = {"before": before, "after": after, "ort": ort}
        with torch.inference_mode():
            for _ in range(20):
                for f in cands.values():
                    f()
            t = B.time_rounds(cands, a.rounds, a.calls)
        ms = {k: statistics.median(v) * 1e3 for k, v in t.items()}

        def ratio(x: str, y: str) -> float:
            return statistics.median(p / q for p, q in zip(t[x], t[y]))

        print(f"{name}: error before {e0:.1e} after {e1:.1e}; ms before {ms['before']:.3f} after {ms['after']:.3f} "
              f"ORT {ms['ort']:.3f}; after/before {ratio('after', 'before'):.3f} before/ORT "
              f"{ratio('before', 'ort'):.3f} after/ORT {ratio('after', 'ort'):.3f}", flush=True)


if __name__ == "__main__":
    main()
