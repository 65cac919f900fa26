"""A zoo CNN's import path (bench_zoo's IMPORT_PIPELINE, ``CompiledProgram(freeze=True)``, as
zoo_profile.py builds it) against ONNX Runtime (bench_zoo's session, no profiling), in
interleaved rounds of ``--calls`` calls each, the order alternating; printed: the median ms a
call of each and the median of the rounds' ratios (partita / ORT).

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/mbconv_ab.py mobilenet_v2 mobilenet_v3 efficientnet regnet
(``PARTITA_SRC=<an export of another commit>`` times that commit's partita the same way: it is
loaded ahead of the editable install's finder, which ``PYTHONPATH`` does not override;
``--cpu`` times the calling thread's CPU time instead of the wall clock, so that a machine
loaded by other processes does not land on one candidate).
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

import torch  # noqa: E402

if os.environ.get("PARTITA_SRC"):   # another commit's partita, ahead of the editable install's finder
    import importlib.util

    _src = Path(os.environ["PARTITA_SRC"]) / "partita"
    _spec = importlib.util.spec_from_file_location("partita", _src / "__init__.py",
                                                   submodule_search_locations=[str(_src)])
    assert _spec is not None and _spec.loader is not None
    sys.modules["partita"] = _mod = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)

import bench_zoo as Z  # noqa: E402
import zoo_models as ZM  # noqa: E402
import zoo_profile as P  # noqa: E402


def rounds_of(cands: dict[str, Callable[[], Any]], rounds: int, calls: int) -> tuple[dict[str, list[float]], list[float]]:
    """Ms a call of each candidate per round, and partita / ORT per round."""
    ms: dict[str, list[float]] = {k: [] for k in cands}
    ratios: list[float] = []
    order = list(cands.items())
    for r in range(rounds):
        got = {}
        for k, fn in (order if r % 2 else order[::-1]):
            t0 = CLOCK()
            for _ in range(calls):
                fn()
            got[k] = (CLOCK() - t0) / calls * 1e3
            ms[k].append(got[k])
        ratios.append(got["partita"] / got["ort"])
    return ms, ratios


CLOCK = time.perf_counter


def main() -> None:
    global CLOCK
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--cpu", action="store_true", help="the thread's CPU time, not the wall clock")
    a = ap.parse_args()
    if a.cpu:
        CLOCK = time.thread_time
    for name in a.models:
        with tempfile.TemporaryDirectory() as d:
            prog, call, sess, _ = P.build(name, Path(d))
            ort = Z.ort_session(Z.Case(ZM.BY_NAME[name], Path(d)), 1)
            with torch.inference_mode():
                for _ in range(10):
                    call()
                    ort()
                ms, ratios = rounds_of({"partita": call, "ort": ort}, a.rounds, a.calls)
            sess.end_profiling()
        print(f"{name}: partita {statistics.median(ms['partita']):.3f} ms, ORT {statistics.median(ms['ort']):.3f} ms, "
              f"partita / ORT {statistics.median(ratios):.2f} (median of {a.rounds} rounds)", flush=True)


if __name__ == "__main__":
    main()
