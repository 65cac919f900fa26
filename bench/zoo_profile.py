"""Where a zoo model's time goes: partita's import path step by step beside ONNX Runtime's nodes.

One model of bench/zoo_models.py is imported (``import_torch``, bench_zoo's IMPORT_PIPELINE,
``CompiledProgram(freeze=True)``, as bench_zoo.py's import path) and exported for ORT (a
TorchScript export, opset 17, as bench_zoo.py). The two are called in turn ``--calls`` times
after warm-up calls; each of partita's steps (the constant ones excepted) is timed on every call
and its median kept, and ORT's own profiler gives each node's median. Medians, not sums, so that
a moment when the machine is busy elsewhere does not land on one op. Printed: the wall medians,
partita's steps per op (count, us, us a step) and ORT's nodes per op type, and with ``-v`` every
step with its operand shapes. ``--dispatch`` also times the program with every step replaced by
one returning its recorded result: the executor's own cost per call (its generated function,
input conversion), apart from what the steps do.

``--backend`` compares the torch.compile backend with the import path instead (no ORT): the
call of each, in interleaved rounds, wall and CPU time (the thread's CPU time leaves out the
moments the machine gives the core to another process), beside eager and dynamo's own frame
(the same model compiled by a backend whose graph returns a result made once: guards, dynamo's
bytecode and nothing else); then every step of the backend's program beside the same step of
the import path's.

``--programs`` compares the two programs themselves, outside any dynamo frame: the backend's
(compiled with ``choose="partita"``, called with the inputs dynamo passes it) and the import
path's, called in turn; their steps by op (count and sum of step medians), whether the backend
froze its params and what its default measured choice picked; ``--dump DIR`` writes both graphs.

``--pieces`` splits the backend's call by swapping what dynamo calls (partita's entry) for less
of it, in interleaved rounds of CPU time: the whole entry; the frozen program's runner without
the frozen-params check; the program alone; a fixed result (dynamo's frame alone); and the import
path's program called from the same frame (what the frame's memory traffic costs any program).

``--split`` times each piece of one backend call inside that call (the thread's clock around the
entry, with the entry swapped in turn for the whole entry, the runner without the frozen check, the
program alone and a fixed result; medians over ``--calls`` calls): dynamo's frame, the frozen check,
the runner, the program; beside them the program, the import path and eager called alone, and the
graphs, graph breaks and guards ``torch._dynamo.explain`` finds.

Run:  .venv/bin/python bench/zoo_profile.py mobilenet_v1 [--calls 100] [-v] [--dispatch] [--backend] [--programs [--dump DIR]] [--pieces] [--split]
(one thread; PARTITA_CACHE_DIR=<a copy of the kernel cache without choices.json> makes the
convolutions measure their kernel choice afresh).
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

import bench_codegen as B  # noqa: E402
import bench_zoo as Z  # noqa: E402
import zoo_models as ZM  # noqa: E402


def median(v: list[float]) -> float:
    return statistics.median(v) if v else 0.0


def build(name: str, tmp: Path) -> tuple[Any, Callable[[], Any], Any, dict[str, Any]]:
    """(the CompiledProgram, a call of it, an ORT session with profiling on, ORT's feeds)."""
    import onnxruntime as ort

    import partita
    from partita.codegen import CompiledProgram

    by_name = {m.name: m for m in ZM.MODELS}
    if name not in by_name:
        raise SystemExit(f"zoo_profile: no zoo model {name!r}; the models: {', '.join(sorted(by_name))}")
    case = Z.Case(by_name[name], tmp)
    with Z.quiet():
        g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)
    prog = CompiledProgram(g, freeze=True)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
    Z.ort_session(case, 1)   # writes the export
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = 1, 1
    so.enable_profiling, so.profile_file_prefix = True, str(tmp / "ort-profile")
    sess = ort.InferenceSession(str(tmp / f"{name}-time.onnx"), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: case.tensors[i.name].numpy() for i in sess.get_inputs()}
    return prog, (lambda: prog(args, weights)), sess, feeds


def profile(prog: Any, call: Callable[[], Any], sess: Any, feeds: dict, calls: int) -> tuple[dict, dict, list]:
    """Wall medians, per-step times of partita and per-node times of ORT over ``calls`` turns."""
    from partita.backend.torch_exec import ConstantStep

    tp = B._torch_program(prog)
    with torch.inference_mode():
        for _ in range(10):
            call()
            sess.run(None, feeds)
    orig = list(tp.steps)
    times: dict[int, list[float]] = defaultdict(list)
    clock = time.perf_counter

    def timed(k: int, fn: Callable) -> Callable:
        def step(a: Any, at: Any) -> Any:
            t0 = clock()
            r = fn(a, at)
            times[k].append(clock() - t0)
            return r
        return step

    tp.steps[:] = [(st[0] if type(st[0]) is ConstantStep else timed(k, st[0]), *st[1:]) for k, st in enumerate(orig)]
    walls: dict[str, list[float]] = {"partita": [], "ort": []}
    try:
        with torch.inference_mode():
            for _ in range(calls):
                t0 = clock()
                call()
                walls["partita"].append(clock() - t0)
                t0 = clock()
                sess.run(None, feeds)
                walls["ort"].append(clock() - t0)
    finally:
        tp.steps[:] = orig
    nodes: dict[tuple, list[float]] = defaultdict(list)
    for e in json.loads(Path(sess.end_profiling()).read_text()):
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            nodes[(e["name"][:-len("_kernel_time")], e["args"].get("op_name", "?"))].append(e["dur"] / 1e3)
    return walls, {k: median(v) * 1e3 for k, v in times.items()}, [(op, median(v)) for (_, op), v in nodes.items()]


def dispatch_ms(prog: Any, call: Callable[[], Any], calls: int) -> tuple[float, float]:
    """Median ms a call of the program as it is and with every step returning its recorded
    result at once (what is left is the executor's own cost)."""
    tp = B._torch_program(prog)
    orig = list(tp.steps)
    seen: dict[int, Any] = {}

    def recorder(k: int, fn: Callable) -> Callable:
        def step(a: Any, at: Any) -> Any:
            seen[k] = r = fn(a, at)
            return r
        return step

    class Recorded:
        __slots__ = ("value",)

        def __init__(self, value: Any) -> None:
            self.value = value

        def __call__(self, a: Any, at: Any) -> Any:
            return self.value

    out = {"real": [], "noop": []}
    with torch.inference_mode():
        tp.steps[:] = [(recorder(k, st[0]), *st[1:]) for k, st in enumerate(orig)]
        call()
        noop = [(Recorded(seen.get(k)), *st[1:]) for k, st in enumerate(orig)]
        try:
            for _ in range(5):
                for key, steps in (("noop", noop), ("real", orig)):
                    tp.steps[:] = steps
                    for _ in range(3):
                        call()
                    for _ in range(max(1, calls // 5)):
                        t0 = time.perf_counter()
                        call()
                        out[key].append(time.perf_counter() - t0)
        finally:
            tp.steps[:] = orig
    return median(out["real"]) * 1e3, median(out["noop"]) * 1e3


def frame_only(gm: Any, example_inputs: Any) -> Callable[..., Any]:
    """A dynamo backend whose graph returns the outputs of its first call: what is left of a
    call is dynamo's own frame (guards, the transformed bytecode)."""
    made: list = []

    def call(*args: Any) -> Any:
        if not made:
            made.append(gm(*args))
        return made[0]
    return call


def backend_candidates(name: str, tmp: Path, guard_filter: bool = False) -> tuple[dict[str, Callable[[], Any]], Any]:
    """The backend, the import path, eager and dynamo's frame as calls, and the import path's
    CompiledProgram; with ``guard_filter`` also the backend and the frame compiled with torch's
    ``skip_guard_on_all_nn_modules_unsafe`` guard filter (a user's choice, docs/codegen.md)."""
    import partita
    from partita.codegen import CompiledProgram

    case = Z.Case(ZM.BY_NAME[name], tmp)
    with Z.quiet():
        g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), Z.IMPORT_PIPELINE)
    prog = CompiledProgram(g, freeze=True)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
    flat = tuple(case.tensors.values())
    torch._dynamo.reset()
    compiled = torch.compile(case.wrapped(), backend="partita")
    frame = torch.compile(case.wrapped(), backend=frame_only)
    eager = case.wrapped()
    cands = {"backend": lambda: compiled(*flat), "import": lambda: prog(args, weights),
             "eager": lambda: eager(*flat), "frame": lambda: frame(*flat)}
    if guard_filter:
        skip = torch.compiler.skip_guard_on_all_nn_modules_unsafe
        filtered = torch.compile(case.wrapped(), backend="partita", options={"guard_filter_fn": skip})
        filtered_frame = torch.compile(case.wrapped(), backend=frame_only, options={"guard_filter_fn": skip})
        cands["backend+filter"] = lambda: filtered(*flat)
        cands["frame+filter"] = lambda: filtered_frame(*flat)
    return cands, prog


def time_calls(cands: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, dict[str, float]]:
    """Median ms a call of each candidate over interleaved rounds, by wall clock and by the
    thread's CPU time."""
    wall: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    names = list(cands)
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            fn = cands[n]
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(calls):
                fn()
            cpu[n].append((time.thread_time() - c0) / calls)
            wall[n].append((time.perf_counter() - t0) / calls)
    return {"wall": {n: median(v) * 1e3 for n, v in wall.items()}, "cpu": {n: median(v) * 1e3 for n, v in cpu.items()}}


def backend_steps(cands: dict[str, Callable[[], Any]], prog: Any, calls: int) -> list[tuple[Any, float, float]]:
    """(node, median us in the import path's program, median us in the backend's) of each step
    of the backend's program, matched with the import path's by position and op."""
    import partita.codegen.dynamo as D
    from partita.backend.torch_exec import ConstantStep

    made = [g.program for g in D.stats().graphs if g.program is not None]
    if len(made) != 1:
        print(f"(the backend compiled {len(made)} programs: no step comparison, which needs one)")
        return []
    progs = {"import": B._torch_program(prog), "backend": B._torch_program(made[0])}
    times: dict[str, dict[int, list[float]]] = {k: defaultdict(list) for k in progs}
    origs = {k: list(tp.steps) for k, tp in progs.items()}

    def timed(into: list, fn: Callable) -> Callable:
        def step(a: Any, at: Any) -> Any:
            t0 = time.perf_counter()
            r = fn(a, at)
            into.append(time.perf_counter() - t0)
            return r
        return step

    for k, tp in progs.items():
        tp.steps[:] = [(st[0] if type(st[0]) is ConstantStep else timed(times[k][i], st[0]), *st[1:])
                       for i, st in enumerate(origs[k])]
    try:
        with torch.inference_mode():
            for _ in range(calls):
                cands["backend"]()
                cands["import"]()
    finally:
        for k, tp in progs.items():
            tp.steps[:] = origs[k]
    out = []
    for i, st in enumerate(origs["backend"]):
        theirs = origs["import"][i][7] if i < len(origs["import"]) else None
        same = theirs is not None and theirs.op == st[7].op
        out.append((st[7], median(times["import"][i]) * 1e6 if same else float("nan"),
                    median(times["backend"][i]) * 1e6))
    return out


def compare_backend(name: str, tmp: Path, calls: int, verbose: bool, guard_filter: bool = False) -> None:
    """Print the backend against the import path: calls, then steps."""
    import partita.codegen.dynamo as D

    D.reset_stats()
    cands, prog = backend_candidates(name, tmp, guard_filter)
    with torch.inference_mode():
        for fn in cands.values():
            for _ in range(2 * (D.WARMUP_CALLS + D.TIMED_CALLS) + 4):
                fn()
        per_round = max(1, min(50, calls // 5))
        t = time_calls(cands, 15, per_round)
    for how in ("wall", "cpu"):
        ms = t[how]
        print(f"{name} ({how}, ms a call): " + ", ".join(f"{k} {v:.3f}" for k, v in ms.items())
              + f"; backend / import {ms['backend'] / ms['import']:.2f}, backend / (import + frame) "
              f"{ms['backend'] / (ms['import'] + ms['frame']):.2f}, backend / eager {ms['backend'] / ms['eager']:.2f}")
    if guard_filter:
        print(f"with the nn-module guards filtered (CPU): backend {t['cpu']['backend+filter'] / t['cpu']['backend']:.3f} "
              f"of the default, frame {t['cpu']['frame+filter'] / t['cpu']['frame']:.3f}")
        return
    print(D.stats().report())
    steps = backend_steps(cands, prog, calls)
    if not steps:
        return
    both = [(a, b) for _, a, b in steps if a == a]
    print(f"steps: {len(steps)} in the backend's program, {len(B._torch_program(prog).steps)} in the import "
          f"path's; sums of step medians over the matched ones: import {sum(a for a, _ in both):.1f} us, "
          f"backend {sum(b for _, b in both):.1f} us")
    if verbose:
        for k, (n, a, b) in enumerate(steps):
            print(f"  {k:4d} {n.op:28s} import {a:8.1f} us  backend {b:8.1f} us")


def step_label(n: Any) -> str:
    """A step's op, with its fused unary epilogue if any (``conv2d_pointwise+relu``)."""
    return n.op + (f"+{n.attrs['unary']}" if n.attrs.get("unary", "none") != "none" else "")


def backend_program(name: str, tmp: Path) -> tuple[Any, list, str, Any]:
    """The torch.compile backend's program of ``name`` (compiled with ``choose="partita"`` so that
    it runs), the inputs dynamo passes it, the measured choice of a default compile (its
    ``Choice.text()``), and the import path's CompiledProgram with its call."""
    import gc

    import partita.codegen.dynamo as D

    D.reset_stats()
    cands, prog = backend_candidates(name, tmp)
    with torch.inference_mode():
        for _ in range(2 * (D.WARMUP_CALLS + D.TIMED_CALLS) + 2):
            cands["backend"]()
    chosen = "; ".join(f"{g.name}: {g.choice.text() if g.choice else g.fallback}" for g in D.stats().graphs)
    case = Z.Case(ZM.BY_NAME[name], tmp)
    flat = tuple(case.tensors.values())
    torch._dynamo.reset()
    D.reset_stats()
    compiled = torch.compile(case.wrapped(), backend="partita", options={"choose": "partita"})
    with torch.inference_mode():
        for _ in range(3):   # a model that writes a cache at its first call (LeViT) is compiled again
            compiled(*flat)
    # the runner of the graph compiled last (frozen or not), found by its Choice
    made = [g for g in D.stats().graphs if g.program is not None][-1:]
    runners = [o for o in gc.get_objects() if type(o) in (D._FrozenRunner, D._Runner)
               and made and o.choice is made[0].choice]
    if len(made) != 1 or len(runners) != 1:
        raise SystemExit(f"zoo_profile --programs: {name} has {len(made)} compiled graph(s) and {len(runners)} "
                         f"runners of them; the comparison needs one ({D.stats().report()})")
    inner = runners[0]
    frozen = isinstance(inner, D._FrozenRunner) and inner.run is not None
    run = inner.run if frozen else inner
    bprog, seen = run.program, []
    run.program = lambda a: (seen.append(list(a)), bprog(a))[1]
    with torch.inference_mode():
        compiled(*flat)
    run.program = bprog
    args = seen[0]
    return bprog, args, ("frozen; " if frozen else "not frozen; ") + chosen, (prog, cands["import"])


def program_step_times(progs: dict[str, tuple[Any, Callable[[], Any]]], calls: int) -> dict[str, list[tuple[Any, float]]]:
    """(node, median us) of every non-constant step of each program, the programs called in
    turn, each on its own inputs, outside any dynamo frame."""
    from partita.backend.torch_exec import ConstantStep

    times: dict[str, dict[int, list[float]]] = {k: defaultdict(list) for k in progs}
    origs = {k: list(B._torch_program(p).steps) for k, (p, _) in progs.items()}

    def timed(into: list, fn: Callable) -> Callable:
        def step(a: Any, at: Any) -> Any:
            t0 = time.perf_counter()
            r = fn(a, at)
            into.append(time.perf_counter() - t0)
            return r
        return step

    for k, (p, _) in progs.items():
        B._torch_program(p).steps[:] = [(st[0] if type(st[0]) is ConstantStep else timed(times[k][i], st[0]), *st[1:])
                                        for i, st in enumerate(origs[k])]
    try:
        with torch.inference_mode():
            for _ in range(calls):
                for _, call in progs.values():
                    call()
    finally:
        for k, (p, _) in progs.items():
            B._torch_program(p).steps[:] = origs[k]
    return {k: [(st[7], median(times[k][i]) * 1e6) for i, st in enumerate(origs[k]) if i in times[k]]
            for k in progs}


def compare_programs(name: str, tmp: Path, calls: int, verbose: bool, dump: str | None) -> dict[str, Any]:
    """Print the import path's program beside the torch.compile backend's: steps by op (count,
    sum of step medians), both called alone in turn; with ``dump``, both graphs' text written
    there. Returns the table row."""
    bprog, bargs, chosen, (iprog, icall) = backend_program(name, tmp)
    progs = {"import": (iprog, icall), "backend": (bprog, lambda: bprog(list(bargs)))}
    with torch.inference_mode():
        for _ in range(5):
            for _, call in progs.values():
                call()
    steps = program_step_times(progs, calls)
    by_op: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"import": [0, 0.0], "backend": [0, 0.0]})
    for k, rows in steps.items():
        for n, us in rows:
            by_op[step_label(n)][k][0] += 1
            by_op[step_label(n)][k][1] += us
    tot = {k: (len(rows), sum(us for _, us in rows)) for k, rows in steps.items()}
    print(f"{name}: steps import {tot['import'][0]} / backend {tot['backend'][0]}; sums of step medians import "
          f"{tot['import'][1]:.1f} us / backend {tot['backend'][1]:.1f} us (ratio "
          f"{tot['backend'][1] / max(tot['import'][1], 1e-9):.2f}); backend {chosen}")
    for op, d in sorted(by_op.items(), key=lambda kv: -max(kv[1]["import"][1], kv[1]["backend"][1])):
        mark = "" if d["import"][0] == d["backend"][0] else "  <- count differs"
        print(f"  {op:30s} import {d['import'][0]:3d} steps {d['import'][1]:8.1f} us   backend "
              f"{d['backend'][0]:3d} steps {d['backend'][1]:8.1f} us{mark}")
    if verbose:
        for k, rows in steps.items():
            print(f" {k}'s steps:")
            for i, (n, us) in enumerate(rows):
                shapes = str([tuple(v.type.shape) for v in n.operands][:3])
                print(f"  {i:4d} {step_label(n):28s} {shapes:56s} {us:8.1f} us")
    if dump:
        from partita.ir.printer import print_graph

        os.makedirs(dump, exist_ok=True)
        for k, (p, _) in progs.items():
            Path(dump, f"{name}-{k}.txt").write_text(print_graph(p.graph))
    return {"model": name, "steps": {k: v[0] for k, v in tot.items()}, "us": {k: v[1] for k, v in tot.items()},
            "choice": chosen}


def backend_pieces(name: str, tmp: Path, rounds: int = 21, calls: int = 30) -> dict[str, float]:
    """Median CPU us a call of the backend with its entry swapped for less of it (see the
    module docstring, ``--pieces``); needs one graph that dynamo calls partita's runner for."""
    import partita.codegen.dynamo as D

    D.reset_stats()
    cands, _ = backend_candidates(name, tmp)
    with torch.inference_mode():
        for _ in range(2 * (D.WARMUP_CALLS + D.TIMED_CALLS) + 4):
            cands["backend"]()
    entries = [g for g in D.stats().graphs if g.program is not None]
    import gc

    # dynamo's entry into partita: the one _Unboxed the backend made
    unboxed = [o for o in gc.get_objects() if type(o).__name__ == "_Unboxed" and type(o).__module__ == D.__name__]
    if len(entries) != 1 or len(unboxed) != 1:
        raise SystemExit(f"zoo_profile --pieces: {name} has {len(entries)} compiled graph(s) and "
                         f"{len(unboxed)} direct entries; the split needs one of each")
    entry = unboxed[0]
    real = entry.boxed
    inner = real.runner if isinstance(real, D._Chooser) else real
    seen: list = []
    entry.boxed = lambda a: (seen.append(list(a)), real(a))[1]
    with torch.inference_mode():
        cands["backend"]()
    args = seen[0]
    entry.boxed = real
    run = inner.run if isinstance(inner, D._FrozenRunner) else inner
    kept = inner.pick_kept if isinstance(inner, D._FrozenRunner) else (lambda a: a)
    fixed = tuple(run(list(kept(args))))
    swaps: dict[str, Callable[[list], Any]] = {
        "entry": real, "runner, no frozen check": lambda a: run(list(kept(a))),
        "program only": lambda a: tuple(run.program(list(kept(a)))), "fixed result": lambda a: fixed}
    times: dict[str, list[float]] = defaultdict(list)
    try:
        with torch.inference_mode():
            for _ in range(rounds):
                for k, fn in swaps.items():
                    entry.boxed = fn
                    for _ in range(3):
                        cands["backend"]()
                    c0 = time.thread_time()
                    for _ in range(calls):
                        cands["backend"]()
                    times[k].append((time.thread_time() - c0) / calls)
                c0 = time.thread_time()
                for _ in range(calls):
                    cands["import"]()
                times["import path alone"].append((time.thread_time() - c0) / calls)
    finally:
        entry.boxed = real
    return {k: median(v) * 1e6 for k, v in times.items()}


def dynamo_shape(name: str, tmp: Path) -> dict[str, int]:
    """The graphs, graph breaks, ops and guards dynamo makes of the zoo model
    (``torch._dynamo.explain``, which resets dynamo's caches; run it before compiling)."""
    case = Z.Case(ZM.BY_NAME[name], tmp)
    torch._dynamo.reset()
    ex = torch._dynamo.explain(case.wrapped())(*case.tensors.values())
    torch._dynamo.reset()
    return {"graphs": ex.graph_count, "breaks": ex.graph_break_count, "ops": ex.op_count,
            "guards": len(ex.out_guards or [])}


def backend_split(name: str, tmp: Path, calls: int = 400) -> dict[str, float]:
    """Median CPU us of each piece of one backend call, each timed inside the call it belongs to
    (``--split``): the entry swapped in turn for the whole entry, the runner without the frozen
    check, the program alone and a fixed result, the time inside the entry read with the
    thread's clock around it; beside them the same program, the import path and eager called
    alone, after them. Each timed call follows an untimed one of its own kind, as in a loop of
    calls, and the swaps' order turns each round. Unlike ``--pieces`` (rounds of calls, differences of their means) a piece is never
    charged for what another costs more after it (the frame's own cache misses)."""
    import gc

    import partita.codegen.dynamo as D

    shape = dynamo_shape(name, tmp)
    D.reset_stats()
    cands, _ = backend_candidates(name, tmp)
    with torch.inference_mode():
        for _ in range(2 * (D.WARMUP_CALLS + D.TIMED_CALLS) + 4):
            cands["backend"]()
    unboxed = [o for o in gc.get_objects() if type(o).__name__ == "_Unboxed" and type(o).__module__ == D.__name__]
    real = unboxed[0].boxed if len(unboxed) == 1 else None
    inner = real.runner if isinstance(real, D._Chooser) else real
    if real is None or not isinstance(inner, D._FrozenRunner) or inner.run is None:
        raise SystemExit(f"zoo_profile --split: {name} has {len(unboxed)} direct entries; the split needs one "
                         "frozen graph that dynamo calls partita's runner for")
    entry, run, kept, whole = unboxed[0], inner.run, inner.pick_kept, real
    seen: list = []

    def record(a: list) -> Any:
        seen.append(list(a))
        return whole(a)

    entry.boxed = record
    with torch.inference_mode():
        cands["backend"]()
    args = seen[0]
    fixed = tuple(run(list(kept(args))))
    ns, inside = time.thread_time_ns, [0]

    def timed(fn: Callable[[list], Any]) -> Callable[[list], Any]:
        def call(a: list) -> Any:
            c0 = ns()
            out = fn(a)
            inside[0] = ns() - c0
            return out
        return call

    swaps = {"entry": timed(whole), "runner": timed(lambda a: run(list(kept(a)))),
             "program": timed(lambda a: tuple(run.program(list(kept(a))))), "fixed": timed(lambda a: fixed)}
    alone = {"program alone": lambda: run.program(list(kept(args))), "import alone": cands["import"],
             "eager": cands["eager"]}
    times: dict[str, list[float]] = defaultdict(list)
    try:
        with torch.inference_mode():
            names = list(swaps)
            for r in range(calls):
                # each timed call follows an untimed one of its own kind, and the order turns each
                # round: the first call after other work pays for the caches that work emptied
                for k in names[r % len(names):] + names[:r % len(names)]:
                    entry.boxed = swaps[k]
                    cands["backend"]()
                    c0 = ns()
                    cands["backend"]()
                    times[k + " call"].append(ns() - c0)
                    times[k + " inside"].append(inside[0])
            entry.boxed = whole
            for k, f in alone.items():      # apart: eager's call empties the caches the most
                for _ in range(calls // 2):
                    f()
                    c0 = ns()
                    f()
                    times[k].append(ns() - c0)
    finally:
        entry.boxed = whole
    us = {k: median(v) / 1e3 for k, v in times.items()}
    return {**{k: float(v) for k, v in shape.items()}, "frozen": float(len(inner.frozen)),
            "call": us["entry call"], "frame": us["fixed call"] - us["fixed inside"],
            "frozen check": us["entry inside"] - us["runner inside"],
            "runner": us["runner inside"] - us["program inside"], "program in the call": us["program inside"],
            "program alone": us["program alone"], "import alone": us["import alone"], "eager": us["eager"]}


def report(name: str, prog: Any, walls: dict, steps: dict, nodes: list, verbose: bool) -> None:
    from partita.backend.torch_exec import ConstantStep

    tp = B._torch_program(prog)
    print(f"{name}: wall medians, partita {median(walls['partita']) * 1e3:.3f} ms, ORT {median(walls['ort']) * 1e3:.3f} ms")
    by_op: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    total = 0.0
    for k, st in enumerate(tp.steps):
        if k not in steps:
            continue
        n = st[7]
        op = n.op + (f"+{n.attrs['unary']}" if n.attrs.get("unary", "none") != "none" else "")
        by_op[op][0] += steps[k]
        by_op[op][1] += 1
        total += steps[k]
        if verbose:
            shapes = str([tuple(v.type.shape) for v in n.operands][:3])
            print(f"  {k:4d} {op:28s} {shapes:56s} {steps[k] * 1e3:8.1f} us")
    constant = sum(1 for st in tp.steps if type(st[0]) is ConstantStep)
    print(f"partita: {len(tp.steps)} steps ({constant} constant), sum of step medians {total:.3f} ms")
    for op, (ms, c) in sorted(by_op.items(), key=lambda kv: -kv[1][0]):
        print(f"  {op:30s} {c:4d} steps {ms * 1e3:9.1f} us ({ms * 1e3 / c:6.1f} us a step)")
    by_type: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for op, ms in nodes:
        by_type[op][0] += ms
        by_type[op][1] += 1
    print(f"ORT: {len(nodes)} nodes, sum of node medians {sum(ms for _, ms in nodes):.3f} ms")
    for op, (ms, c) in sorted(by_type.items(), key=lambda kv: -kv[1][0]):
        print(f"  {op:30s} {c:4d} nodes {ms * 1e3:9.1f} us ({ms * 1e3 / c:6.1f} us a node)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", help="a model of bench/zoo_models.py (with --backend, several: a,b,c)")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("-v", "--verbose", action="store_true", help="every step with its operand shapes")
    ap.add_argument("--dispatch", action="store_true", help="also the executor's own cost a call")
    ap.add_argument("--guard-filter", action="store_true",
                    help="with --backend: also the backend and the frame with the nn-module guards filtered")
    ap.add_argument("--pieces", action="store_true",
                    help="the backend's call split by swapping its entry for less of it (CPU us)")
    ap.add_argument("--split", action="store_true",
                    help="the backend's call split into pieces each timed inside the call (CPU us, medians)")
    ap.add_argument("--programs", action="store_true",
                    help="the import path's program beside the backend's: steps by op, each program called alone")
    ap.add_argument("--dump", help="with --programs: write both programs' graphs here")
    ap.add_argument("--backend", action="store_true",
                    help="the torch.compile backend against the import path, call and steps")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    if args.split:
        for name in args.model.split(","):
            with tempfile.TemporaryDirectory() as work:
                us = backend_split(name, Path(work), max(args.calls, 100))
            print(f"{name} (CPU us a call, medians): " + ", ".join(f"{k} {v:.1f}" for k, v in us.items())
                  + f"; call / import {us['call'] / us['import alone']:.2f}, call / eager {us['call'] / us['eager']:.2f}")
        return 0
    if args.pieces:
        for name in args.model.split(","):
            with tempfile.TemporaryDirectory() as work:
                us = backend_pieces(name, Path(work))
            own, check = us["entry"] - us["program only"], us["entry"] - us["runner, no frozen check"]
            print(f"{name} (CPU us a call): " + ", ".join(f"{k} {v:.1f}" for k, v in us.items())
                  + f"; partita's own {own:.1f} (the frozen check {check:.1f}), the frame "
                  f"{us['fixed result']:.1f}, the program in the frame {us['program only'] - us['fixed result']:.1f}")
        return 0
    if args.programs:
        for name in args.model.split(","):
            with tempfile.TemporaryDirectory() as work:
                compare_programs(name, Path(work), args.calls, args.verbose, args.dump)
        return 0
    if args.backend:
        for name in args.model.split(","):
            with tempfile.TemporaryDirectory() as work:
                compare_backend(name, Path(work), args.calls, args.verbose, args.guard_filter)
        return 0
    with tempfile.TemporaryDirectory() as work:
        prog, call, sess, feeds = build(args.model, Path(work))
        walls, steps, nodes = profile(prog, call, sess, feeds, args.calls)
        report(args.model, prog, walls, steps, nodes, args.verbose)
        if args.dispatch:
            real, noop = dispatch_ms(prog, call, args.calls)
            n = len(B._torch_program(prog).steps)
            print(f"executor: {real:.3f} ms a call as it is, {noop:.3f} ms with every step's result recorded "
                  f"({noop * 1e3 / max(n, 1):.2f} us a step of its own)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
