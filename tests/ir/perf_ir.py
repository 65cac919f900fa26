"""Scaling check for the IR text path (a script, not a test).

Parses, prints and verifies synthetic chains of elementwise nodes of growing size and prints
nodes per second of CPU time (process time, so other jobs on the machine do not
count) for each stage, so a superlinear stage shows up as a falling rate.

    .venv/bin/python tests/ir/perf_ir.py [--sizes 1000,10000,100000] [--profile parse]
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import partita  # noqa: E402
from partita.ir.printer import print_graph  # noqa: E402


def synthetic_text(n: int) -> str:
    """A graph of ``n`` elementwise nodes, each using one or two recent values."""
    ops1 = ("neg", "relu", "exp", "tanh", "abs")
    ops2 = ("add", "mul", "sub", "maximum")
    lines = ["graph @chain(%x: f32[8,16], %y: f32[8,16]) -> (f32[8,16]) {"]
    prev = ["x", "y"]
    for i in range(n):
        if i % 3 == 2:
            op = ops2[i % len(ops2)]
            lines.append(f"  %{i} = {op}(%{prev[-1]}, %{prev[-2]}) : f32[8,16]")
        elif i % 7 == 3:
            lines.append(f"  %{i} = gelu(%{prev[-1]}) {{approximate=\"tanh\"}} : f32[8,16]")
        else:
            op = ops1[i % len(ops1)]
            lines.append(f"  %{i} = {op}(%{prev[-1]}) : f32[8,16]")
        prev.append(str(i))
    lines.append(f"  return %{prev[-1]}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def best_of(fn, repeat: int) -> float:
    """Best CPU time of ``repeat`` runs. Garbage of earlier runs is collected outside the
    timed region; the collector's first pass over what the run built is timed with it."""
    best = float("inf")
    for _ in range(repeat):
        gc.collect()
        t0 = time.process_time()
        out = fn()
        gc.collect(0)
        best = min(best, time.process_time() - t0)
        del out
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--profile", choices=("parse", "print", "verify", "clone"), default=None)
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"{'nodes':>8} {'parse n/s':>12} {'print n/s':>12} {'verify n/s':>12} {'clone n/s':>12}")
    for n in sizes:
        text = synthetic_text(n)
        g = partita.parse(text)
        assert print_graph(g) == text, "synthetic text is not in printed form"
        rep = args.repeat if n <= 10000 else max(1, args.repeat - 1)
        tp = best_of(lambda: partita.parse(text), rep)
        tr = best_of(lambda: print_graph(g), rep)
        tv = best_of(lambda: partita.verify(g), rep)
        tc = best_of(lambda: g.clone(), rep)
        print(f"{n:>8} {n / tp:>12,.0f} {n / tr:>12,.0f} {n / tv:>12,.0f} {n / tc:>12,.0f}")
    if args.profile:
        n = sizes[-1]
        text = synthetic_text(n)
        g = partita.parse(text)
        fn = {"parse": lambda: partita.parse(text), "print": lambda: print_graph(g),
              "verify": lambda: partita.verify(g), "clone": lambda: g.clone()}[args.profile]
        prof = cProfile.Profile()
        prof.runcall(fn)
        pstats.Stats(prof).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
