"""bench_zoo.py's timing column measured in the calling thread's CPU time, for a loaded machine.

On a machine shared with other jobs, a wall-clock round of a few milliseconds is often cut by
the scheduler giving the core to another process, and medians of a few rounds are then noise.
At one thread every candidate of the timing column runs on the calling thread (eager and
Inductor with ``torch.set_num_threads(1)``, ONNX Runtime with one intra-op thread, partita's
program), so the thread's CPU time counts each call's own work and leaves out the moments the
core was given away. This script runs ``bench_zoo.main`` unchanged except that the interleaved
rounds (``bench_codegen.time_rounds``) read ``time.thread_time`` instead of
``time.perf_counter``, and, with ``--shared-inductor-cache DIR``, Inductor compiles into one
persistent cache directory instead of a fresh one per model (models with the same kernels then
compile them once; the cold-compile column is then not a cold compile and is to be ignored).
``--no-inductor`` leaves Inductor out altogether (for models whose better peer is known to be
ONNX Runtime; its cold compile takes minutes on a loaded machine).

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/zoo_cpu_time.py [--shared-inductor-cache DIR] [--no-inductor]
          [--check-threads] <bench_zoo.py options>
The check that every candidate stays on the calling thread: ``--check-threads`` prints, for each
candidate of the first model, the process's CPU time over the thread's for a batch of calls
(1.0: nothing ran on another thread).
"""
from __future__ import annotations

import os
import sys
import time
import types
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import bench_zoo  # noqa: E402  (first: it sets the thread variables before torch loads)
import bench_codegen  # noqa: E402


def thread_clock() -> types.SimpleNamespace:
    """A stand-in for the ``time`` module whose ``perf_counter`` is the thread's CPU time."""
    return types.SimpleNamespace(perf_counter=time.thread_time)


def shared_cache(directory: str) -> None:
    """Make bench_zoo's fresh Inductor cache one persistent directory, not cleared."""
    Path(directory).mkdir(parents=True, exist_ok=True)

    def fresh(tmp: Path) -> None:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory

    bench_zoo.fresh_inductor_cache = fresh  # type: ignore[assignment]


def without_inductor() -> None:
    """Leave Inductor out of the timing column (its cold compile is minutes on a loaded machine):
    eager and partita's backend only; the cold-compile figure of Inductor is NaN."""
    def candidates(case: Any) -> tuple[dict[str, Any], dict[str, float]]:
        bench_zoo.torch._dynamo.reset()
        args = tuple(case.tensors.values())
        eager_m = case.wrapped()
        part = bench_zoo.torch.compile(case.wrapped(), backend="partita")
        cold = {"partita": bench_zoo.cold_call(lambda: part(*args)), "inductor": float("nan")}
        return {"partita": lambda: part(*args), "eager": lambda: eager_m(*args)}, cold

    bench_zoo.compiled_candidates = candidates  # type: ignore[assignment]


def check_threads(rounds: int, calls: int) -> None:
    """Wrap ``time_rounds`` so that it also prints process / thread CPU time per candidate."""
    inner = bench_codegen.time_rounds

    def checked(cands: dict[str, Any], r: int, c: int) -> dict[str, list[float]]:
        for name, fn in cands.items():
            p0, t0 = time.process_time(), time.thread_time()
            for _ in range(max(c, calls)):
                fn()
            p, t = time.process_time() - p0, time.thread_time() - t0
            print(f"  {name:10s} process/thread CPU time {p / max(t, 1e-9):.3f}", flush=True)
        return inner(cands, r, c)

    bench_codegen.time_rounds = checked  # type: ignore[assignment]


def main(argv: list[str]) -> int:
    if "--shared-inductor-cache" in argv:
        i = argv.index("--shared-inductor-cache")
        shared_cache(argv[i + 1])
        del argv[i:i + 2]
    if "--no-inductor" in argv:
        argv.remove("--no-inductor")
        without_inductor()
    bench_codegen.time = thread_clock()  # type: ignore[assignment]
    if "--check-threads" in argv:
        argv.remove("--check-threads")
        check_threads(1, 20)
    return bench_zoo.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
