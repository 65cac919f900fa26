"""What the quantize pass saves and what it costs in accuracy, on the benchmark models.

    .venv/bin/python bench/bench_quantize.py                 # all models, the sizes of bench_codegen.py
    .venv/bin/python bench/bench_quantize.py --quick --models mlp gpt2

Each model of bench/bench_codegen.py (MLP, ResNet-style CNN, BERT, GPT-2, Llama, ViT; weights
from ``torch.manual_seed(0)``, random, not trained) is imported with ``partita.import_torch``,
then quantized with ``partita.quantize`` in each mode (``weight-only``, ``dynamic``) on a
fresh import. Reported per model and mode:

- params: the bytes of every param before and after, and the share saved;
- accuracy against the float graph on the same inputs: the largest and the RMS error of the
  outputs relative to the float outputs' RMS, and for the language models the share of
  positions whose top-1 token is unchanged. Random weights are a proxy: a trained model's
  weights and activations have other ranges (outliers especially), so these figures say that
  the forms are right and how much rounding they add, not what a trained model loses;
- time (``--rounds`` > 0): the median over interleaved rounds of the torch executor running
  the quantized graph over the float one, one thread.

The script prints a Markdown table and writes JSON to bench/results/.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

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
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import partita  # noqa: E402
from bench_codegen import FULL, QUICK, make_case  # noqa: E402

MODELS = ("mlp", "cnn", "bert", "gpt2", "llama", "vit")
LANGUAGE_MODELS = ("gpt2", "llama")
MODES = ("weight-only", "dynamic")


def _outputs(graph: partita.Graph, args: tuple) -> list[np.ndarray]:
    return [np.asarray(o) for o in partita.run(graph, list(args), backend="torch")]


def accuracy(key: str, got: list[np.ndarray], ref: list[np.ndarray]) -> dict[str, float]:
    """Errors of ``got`` relative to the RMS of ``ref`` (over every output), and for a
    language model the share of positions whose argmax is unchanged."""
    diff = np.concatenate([(g.astype(np.float64) - r).ravel() for g, r in zip(got, ref)])
    scale = float(np.sqrt(np.mean(np.concatenate([r.ravel().astype(np.float64) for r in ref]) ** 2))) or 1.0
    out = {"max_rel": float(np.max(np.abs(diff))) / scale, "rms_rel": float(np.sqrt(np.mean(diff ** 2))) / scale}
    if key in LANGUAGE_MODELS:
        out["top1_same"] = float(np.mean(np.argmax(got[0], -1) == np.argmax(ref[0], -1)))
    return out


def _time(fns: dict[str, Any], rounds: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def bench_model(key: str, sizes: Any, rounds: int) -> dict[str, Any]:
    case = make_case(key, sizes)
    case.module.eval()
    args = tuple(case.args)
    with torch.no_grad():
        base = partita.import_torch(case.module, args)
    ref = _outputs(base, args)
    row: dict[str, Any] = {"model": case.label, "key": key, "modes": {}}
    fns = {"float": lambda: partita.run(base, list(args), backend="torch")}
    for mode in MODES:
        g = partita.import_torch(case.module, args)
        report = partita.quantize(g, mode)
        partita.verify(g)
        got = _outputs(g, args)
        row["modes"][mode] = {
            "weights": len(report.weights), "integer_matmuls": sum(1 for n in g.nodes if n.op == "matmul_integer"),
            "param_bytes_before": report.param_bytes_before, "param_bytes_after": report.param_bytes_after,
            "saved": report.saved / report.param_bytes_before, **accuracy(key, got, ref)}
        fns[mode] = (lambda gg: lambda: partita.run(gg, list(args), backend="torch"))(g)
    if rounds > 0:
        t = _time(fns, rounds)
        for mode in MODES:
            row["modes"][mode]["time_ratio"] = t[mode] / t["float"]
        row["float_ms"] = t["float"] * 1e3
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | mode | weights | integer matmuls | params before -> after | saved | max error | RMS error | top-1 same | time vs float |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        for mode, m in r["modes"].items():
            top1 = f"{m['top1_same']:.1%}" if "top1_same" in m else ""
            t = f"{m['time_ratio']:.2f}" if "time_ratio" in m else ""
            lines.append(f"| {r['model']} | {mode} | {m['weights']} | {m['integer_matmuls']} | {m['param_bytes_before'] / 2**20:.2f} -> "
                         f"{m['param_bytes_after'] / 2**20:.2f} MiB | {m['saved']:.1%} | {m['max_rel']:.2e} | "
                         f"{m['rms_rel']:.2e} | {top1} | {t} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    ap.add_argument("--quick", action="store_true", help="the small sizes (a smoke run)")
    ap.add_argument("--rounds", type=int, default=10, help="timing rounds per model (0: no timing)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    sizes = QUICK if a.quick else FULL
    rows = []
    for key in a.models:
        print(f"[bench_quantize] {key} ...", file=sys.stderr, flush=True)
        rows.append(bench_model(key, sizes, a.rounds))
    print(table(rows))
    out = a.json or ROOT / "bench" / "results" / f"quantize-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": platform.processor() or platform.machine(), "threads": 1,
                               "sizes": "quick" if a.quick else "full", "rows": rows}, indent=1))
    print(f"wrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
