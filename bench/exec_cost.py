"""The executor's own cost a call on zoo models' import path, split: the input binding (its
checks of every param: in the weights, a tensor, of its dtype and shape), and the generated
run function with every step replaced by one returning its recorded result (what is left a
step); beside the whole call. Then a bound ``conv.PreparedConv`` call against its kernel's
one-argument whole-range entry and four-argument range kernel on two 1 x 1 shapes of
MobileNetV2. Thread CPU time, medians of 7 rounds, one thread.

Run:  OMP_NUM_THREADS=1 .venv/bin/python bench/exec_cost.py mobilenet_v2,resnet,gpt2,bert
"""
from __future__ import annotations

import inspect
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import step_cost as S  # noqa: E402


def per_call_us(fn: Callable[[], Any], reps: int = 1000) -> float:
    """Median us of ``fn()`` over 7 rounds of ``reps`` calls, in this thread's CPU time."""
    rounds = []
    for _ in range(7):
        t0 = time.thread_time_ns()
        for _ in range(reps):
            fn()
        rounds.append((time.thread_time_ns() - t0) / reps / 1e3)
    return statistics.median(rounds)


class Recorded:
    """A step returning its recorded result at once."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __call__(self, a: Any, at: Any) -> Any:
        return self.value


def executor_cost(name: str) -> str:
    """One line: the model's steps, params, whole call, executor alone, binding, us a step."""
    prog, call = S.build(name, Path(tempfile.mkdtemp()))
    call()
    tp = prog.program
    free = inspect.getclosurevars(call).nonlocals
    args, weights = free["args"], free["weights"]
    env: list = [None] * tp.num_slots
    orig = list(tp.steps)
    seen: dict[int, Any] = {}

    def recorder(k: int, fn: Callable) -> Callable:
        def step(a: Any, at: Any) -> Any:
            seen[k] = r = fn(a, at)
            return r
        return step

    with torch.inference_mode():
        tp.steps[:] = [(recorder(k, st[0]), *st[1:]) for k, st in enumerate(orig)]
        call()
        tp.steps[:] = [(Recorded(seen.get(k)), *st[1:]) for k, st in enumerate(orig)]
        noop = per_call_us(call)
        bind = tp._bind
        bound = per_call_us(lambda: bind(env, args, weights))
        tp.steps[:] = orig
        real = per_call_us(call, 200)
    n = len(orig)
    return (f"{name}: {n} steps, {len(tp._bind_plan[1])} params; call {real:.1f} us, executor alone "
            f"{noop:.1f}, of which binding {bound:.1f}; the rest {(noop - bound) / n:.2f} us a step")


def conv_call_cost() -> list[str]:
    """A bound ``PreparedConv`` call against its kernel's entries, on two 1 x 1 shapes."""
    from partita.codegen.conv import PreparedConv

    cl = torch.channels_last
    lines = []
    for xs, ws in [((1, 96, 7, 7), (24, 96, 1, 1)), ((1, 32, 14, 14), (192, 32, 1, 1))]:
        k = PreparedConv(xs, ws, [1, 1], [0, 0], "none")
        x = torch.randn(xs).contiguous(memory_format=cl)
        b = torch.randn(ws[0])
        out = torch.empty(k.shape).contiguous(memory_format=cl)
        p = k.pack(torch.randn(ws))
        k(x, p, b, None, out)
        lines.append(f"{xs} by {ws}: bound call {per_call_us(lambda: k(x, p, b, None, out), 5000):.2f} us, "
                     f"whole-range entry {per_call_us(lambda: k.whole(k.addr), 5000):.2f}, "
                     f"range kernel (four arguments) {per_call_us(lambda: k.fn(k.addr, 0, k.tiles, 0), 5000):.2f}")
    return lines


def main() -> int:
    torch.set_num_threads(1)
    for name in (sys.argv[1] if len(sys.argv) > 1 else "mobilenet_v2,resnet,gpt2,bert").split(","):
        print(executor_cost(name), flush=True)
    for line in conv_call_cost():
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
