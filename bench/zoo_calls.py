"""Per-call medians of a zoo model's import path against ONNX Runtime, without ORT's profiler.

``zoo_profile.py``'s wall column times ORT with its profiler on, which adds about 2 us a node
(ResNet: 129 us of node medians against 93 us a call without it), and bench_zoo's rounds of
consecutive calls take the scheduler's cuts (a round on a loaded machine can lose 4 to 8 ms).
This script times single calls, ``--calls`` in a block, blocks of the import path and of ORT
in turn (``--blocks`` of each), and prints the medians of the block medians and the median of
their ratios: a figure that a busy moment of the machine barely moves.

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/zoo_calls.py poolformer,resnet [--calls 400] [--blocks 4]
(the import path as bench_zoo's: ``import_torch``, IMPORT_PIPELINE, ``CompiledProgram(freeze=True)``,
checked against eager; ORT on bench_zoo's TorchScript export, one thread).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import bench_zoo as Z  # noqa: E402
import zoo_models as ZM  # noqa: E402


def block_median(fn: object, calls: int) -> float:
    """The median microseconds of ``calls`` single calls of ``fn``."""
    clock = time.perf_counter
    ts = []
    for _ in range(calls):
        t0 = clock()
        fn()  # type: ignore[operator]
        ts.append(clock() - t0)
    return statistics.median(ts) * 1e6


def zoo_case(name: str, tool: str) -> "Z.Case":
    """bench_zoo's case of the zoo model ``name``, or a SystemExit naming the models."""
    if name not in ZM.BY_NAME:
        raise SystemExit(f"{tool}: no zoo model {name!r}; the models: {', '.join(sorted(ZM.BY_NAME))}")
    return Z.Case(ZM.BY_NAME[name], Path(tempfile.mkdtemp()))


def models_main(argv: list[str] | None, doc: str, line: Callable[[str, int, int], str],
                calls: int, blocks: int) -> int:
    """The command line shared by the per-call scripts: a comma-separated list of zoo models,
    ``--calls`` and ``--blocks``; one thread; ``line(name, calls, blocks)`` printed per model."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("models", help="comma-separated zoo model names")
    ap.add_argument("--calls", type=int, default=calls)
    ap.add_argument("--blocks", type=int, default=blocks)
    ns = ap.parse_args(argv)
    torch.set_num_threads(1)
    for name in ns.models.split(","):
        print(line(name, ns.calls, ns.blocks), flush=True)
    return 0


def measure(name: str, calls: int, blocks: int) -> tuple[float, float, float]:
    """(import path us, ORT us, median ratio) of one zoo model."""
    case = zoo_case(name, "zoo_calls")
    cands = {"import": Z.import_candidate(case), "ort": Z.ort_session(case, 1)}
    res: dict[str, list[float]] = {k: [] for k in cands}
    with torch.inference_mode():
        for f in cands.values():
            for _ in range(20):
                f()
        for _ in range(blocks):
            for k, f in cands.items():
                res[k].append(block_median(f, calls))
    ratio = statistics.median(a / b for a, b in zip(res["import"], res["ort"]))
    return statistics.median(res["import"]), statistics.median(res["ort"]), ratio


def line(name: str, calls: int, blocks: int) -> str:
    imp, ort, ratio = measure(name, calls, blocks)
    return f"{name}: import path {imp:.1f} us, ORT {ort:.1f} us a call; import / ORT {ratio:.3f}"


def main(argv: list[str] | None = None) -> int:
    return models_main(argv, __doc__ or "", line, calls=400, blocks=4)


if __name__ == "__main__":
    raise SystemExit(main())
