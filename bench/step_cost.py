"""Where a small model's per-step time goes on the torch executor (one thread, warm loop).

For each zoo model (bench/zoo_models.py, imported as bench_zoo.py's import path with
``CompiledProgram(freeze=True)``): the median of a whole call; the same program with every
step replaced by one returning its recorded result (the executor's own cost: its generated
function, input binding, output list); and every step called alone on its recorded operands,
by op (the median us a step). Times are the thread's CPU time (a loaded machine's
preemptions left out), medians of rounds. For the generated GEMM's steps (``library.linear_step``) the
step is split into the step function, ``PreparedGemm.__call__`` and the compiled kernel's
own entry (``PreparedGemm.call_kernel``), so the Python checks and the call's cost show
apart from the kernel.

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/step_cost.py gpt2,t5,llama,bert,mobilenet_v2 [--calls 200] [--json F]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import bench_zoo as Z  # noqa: E402
import zoo_models as ZM  # noqa: E402


def build(name: str, tmp: Path) -> tuple[Any, Callable[[], Any]]:
    """(the CompiledProgram of zoo model ``name``, a call of it)."""
    import partita
    from partita.codegen import CompiledProgram

    zm = {m.name: m for m in ZM.MODELS}[name]
    case = Z.Case(zm, tmp)
    with Z.quiet():
        g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)
    prog = CompiledProgram(g, freeze=True)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
    return prog, (lambda: prog(args, weights))


def per_call_us(fn: Callable[[], Any], reps: int) -> float:
    """Median us of ``fn()`` over 7 rounds of ``reps`` calls, in this thread's CPU time (the
    moments the machine gives the core to another process left out)."""
    clock = time.thread_time
    rounds = []
    for _ in range(7):
        t0 = clock()
        for _ in range(reps):
            fn()
        rounds.append((clock() - t0) / reps * 1e6)
    return statistics.median(rounds)


def closure(fn: Any) -> dict[str, Any]:
    """A step function's free variables by name."""
    cells = fn.__closure__ or ()
    return {k: c.cell_contents for k, c in zip(fn.__code__.co_freevars, cells)}


def gemm_split(fn: Any, a: list, at: Any, reps: int) -> dict[str, float] | None:
    """us of a generated-GEMM step: the step, PreparedGemm's call, the kernel's entry alone."""
    if getattr(fn, "__name__", "") != "gen_step":
        return None
    cl = closure(fn)
    run, out2 = cl.get("run"), cl.get("out2")
    packed = cl["gcache"].packed if "gcache" in cl else None
    if run is None or packed is None or getattr(run, "fn", None) is None:
        return None
    m, k = run.m, run.k
    x2 = a[0].reshape(m, k)
    bias = a[2] if len(a) > 2 else None
    out = {"step": per_call_us(lambda: fn(a, at), reps),
           "PreparedGemm": per_call_us(lambda: run(x2, packed, bias, out2), reps)}
    if hasattr(run, "rows"):
        out["PreparedGemm.rows"] = per_call_us(lambda: run.rows(a[0], packed, bias, cl["out"], cl["out_shape"]), reps)
    if hasattr(run, "call_kernel"):
        c = out2 if out2 is not None else torch.empty((m, run.n))
        ptrs = (x2.data_ptr(), x2.stride(0), x2.stride(1), packed.data_ptr(), 0 if bias is None else bias.data_ptr(),
                c.data_ptr(), c.stride(0))
        out["kernel entry"] = per_call_us(lambda: run.call_kernel(*ptrs), reps)
        if getattr(run, "entry", None) is not None:
            out["kernel alone"] = per_call_us(lambda: run.entry(run.blk_addr), reps)
    return out


def measure(name: str, calls: int) -> dict[str, Any]:
    """The figures of one model (see the module doc)."""
    with tempfile.TemporaryDirectory() as work:
        prog, call = build(name, Path(work))
        tp = getattr(prog, "program", prog)
        orig = list(tp.steps)
        seen: dict[int, tuple] = {}

        def recorder(k: int, fn: Callable) -> Callable:
            def step(a: Any, at: Any) -> Any:
                r = fn(a, at)
                seen[k] = (list(a), r)
                return r
            return step

        class Recorded:
            __slots__ = ("value",)

            def __init__(self, value: Any) -> None:
                self.value = value

            def __call__(self, a: Any, at: Any) -> Any:
                return self.value

        with torch.inference_mode():
            for _ in range(5):
                call()
            tp.steps[:] = [(recorder(k, st[0]), *st[1:]) for k, st in enumerate(orig)]
            call()
            noop = [(Recorded(seen[k][1] if k in seen else None), *st[1:]) for k, st in enumerate(orig)]
            real_r, noop_r = [], []
            for _ in range(5):
                tp.steps[:] = noop
                noop_r.append(per_call_us(call, calls // 5 or 1))
                tp.steps[:] = orig
                real_r.append(per_call_us(call, calls // 5 or 1))
            by_op: dict[str, list[float]] = defaultdict(list)
            gemm: list[dict[str, float]] = []
            for k, st in enumerate(orig):
                if k not in seen or type(st[0]).__name__ == "ConstantStep":
                    continue
                a, _ = seen[k]
                fn, at = st[0], st[2]
                by_op[st[7].op].append(per_call_us(lambda: fn(a, at), 50))
                g = gemm_split(fn, a, at, 50)
                if g is not None:
                    gemm.append(g)
    steps = sum(1 for st in orig if type(st[0]).__name__ != "ConstantStep")
    real, nop = statistics.median(real_r), statistics.median(noop_r)
    return {"model": name, "call_us": real, "executor_us": nop, "steps": steps, "all_steps": len(orig),
            "executor_us_a_step": nop / max(steps, 1),
            "ops": {op: {"count": len(v), "us_a_step": statistics.median(v), "sum_us": sum(v)}
                    for op, v in sorted(by_op.items(), key=lambda kv: -sum(kv[1]))},
            "gemm": {key: statistics.median(g[key] for g in gemm) for key in (gemm[0] if gemm else {})}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    results = []
    for name in args.models.split(","):
        r = measure(name, args.calls)
        results.append(r)
        print(f"{name}: call {r['call_us']:.1f} us, executor alone {r['executor_us']:.1f} us "
              f"({r['steps']} steps, {r['executor_us_a_step']:.2f} us a step; {r['all_steps']} with constants)")
        for op, e in r["ops"].items():
            print(f"  {op:22s} {e['count']:3d} x {e['us_a_step']:7.2f} us = {e['sum_us']:7.1f} us")
        if r["gemm"]:
            print("  generated GEMM, median us a step: " + ", ".join(f"{k} {v:.2f}" for k, v in r["gemm"].items()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
