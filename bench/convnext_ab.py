"""The zoo's ConvNeXt v1/v2 on the import path with and without this codegen's ConvNeXt changes,
and ONNX Runtime, interleaved in one process (docs/codegen.md, "ConvNeXt v1 and v2").

"before" turns off: the generated patch convolution (``CONV_KERNELS[1:]``), the rule that keeps
small patches convolutions (``PATCH_GEMM_MIN_KW = 1``), GRN as one op (the ``sqrt`` anchor) and
``add_norm`` through transposes. Each round calls every candidate ``--calls`` times; printed are
the median ms and the median of the per-round ratios against ORT.

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/convnext_ab.py [--models convnext,convnext_v2] [--rounds 21]
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

import bench_zoo as Z  # noqa: E402
import zoo_models as ZM  # noqa: E402


def build(name: str, before: bool) -> tuple[Callable[[], Any], float]:
    """(a call of the import path's program, its largest error against eager)."""
    import partita
    import partita.codegen.library as L
    import partita.codegen.norm as N
    from partita.codegen import CompiledProgram

    saved = (L.CONV_KERNELS, L.PATCH_GEMM_MIN_KW, L.ANCHORS.get("sqrt"), N.fuse_transposed_add_norm)
    if before:
        L.CONV_KERNELS, L.PATCH_GEMM_MIN_KW = L.CONV_KERNELS[1:], 1
        L.ANCHORS.pop("sqrt", None)
        N.fuse_transposed_add_norm = lambda graph, node: None
    try:
        case = Z.Case(ZM.BY_NAME[name], Path(tempfile.mkdtemp()))
        with Z.quiet():
            g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)
        prog = CompiledProgram(g, freeze=True)
        weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
        args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
        with torch.inference_mode():
            for _ in range(3):
                out = prog(args, weights)[0]
        err = float((out - case.eager()).abs().max())
        return (lambda: prog(args, weights)), err
    finally:
        L.CONV_KERNELS, L.PATCH_GEMM_MIN_KW = saved[0], saved[1]
        if saved[2] is not None:
            L.ANCHORS["sqrt"] = saved[2]
        N.fuse_transposed_add_norm = saved[3]


def ort_call(name: str) -> Callable[[], Any]:
    """ORT on bench_zoo's export of the model, one thread."""
    import onnxruntime as ort

    tmp = Path(tempfile.mkdtemp())
    case = Z.Case(ZM.BY_NAME[name], tmp)
    Z.ort_session(case, 1)
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(tmp / f"{name}-time.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: case.tensors[i.name].numpy() for i in sess.get_inputs()}
    return lambda: sess.run(None, feeds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="convnext,convnext_v2")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=50)
    o = ap.parse_args()
    for name in o.models.split(","):
        now, e_now = build(name, False)
        before, e_before = build(name, True)
        cands = {"ort": ort_call(name), "now": now, "before": before}
        t: dict[str, list[float]] = {k: [] for k in cands}
        with torch.inference_mode():
            for _ in range(o.rounds):
                for k, f in cands.items():
                    for _ in range(5):
                        f()
                    t0 = time.perf_counter()
                    for _ in range(o.calls):
                        f()
                    t[k].append((time.perf_counter() - t0) / o.calls * 1e3)
        print(f"{name}: error against eager, now {e_now:.1e}, before {e_before:.1e}")
        for k in cands:
            r = statistics.median(a / b for a, b in zip(t[k], t["ort"]))
            print(f"  {k:7s} {statistics.median(t[k]):.4f} ms   / ORT {r:.2f}")
        print(f"  now / before {statistics.median(a / b for a, b in zip(t['now'], t['before'])):.2f}")


if __name__ == "__main__":
    main()
