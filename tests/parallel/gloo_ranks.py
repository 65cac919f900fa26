"""Run a worker function on N local gloo ranks and collect what each reports, never hanging.

The worker is called as ``worker(rank, port, results)`` in a spawned process; it initializes
its process group on ``tcp://127.0.0.1:port`` and puts ``(rank, failures)`` on ``results``
(a list of messages, empty when all went well), also when it fails.
"""

from __future__ import annotations

import multiprocessing
import queue
from typing import Callable

from partita.runtime.launch import free_port


def run_on_gloo_ranks(worker: Callable, nranks: int = 2, timeout: float = 90.0) -> dict[int, list[str]]:
    """Start ``nranks`` processes running ``worker`` and return each rank's failures; ranks
    that hang or die are missing from the result (the caller asserts on that). A run whose
    port was taken before rank 0 bound it is run again on another port."""
    for _ in range(3):
        got = _run_once(worker, nranks, timeout)
        taken = any("address already in use" in m.lower() or "eaddrinuse" in m.lower()
                    for msgs in got.values() for m in msgs)
        if not taken:
            break
    return got


def _run_once(worker: Callable, nranks: int, timeout: float) -> dict[int, list[str]]:
    port = free_port()
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, port, results), daemon=True) for r in range(nranks)]
    for p in procs:
        p.start()
    got: dict[int, list[str]] = {}
    try:
        for _ in procs:
            rank, failures = results.get(timeout=timeout)
            got[rank] = failures
    except queue.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
    return got


def assert_all_ranks_passed(got: dict[int, list[str]], nranks: int = 2) -> None:
    assert sorted(got) == list(range(nranks)), f"ranks that reported: {sorted(got)} (the others hung or died)"
    assert all(got[r] == [] for r in got), "\n".join(m for r in sorted(got) for m in got[r])


def record_overlap(tp) -> list[tuple[str, int, str]]:
    """Wrap every step of the TorchProgram ``tp`` to record, in the order they happen, each
    step's call and, for a collective in flight (a ``Pending``), its issue and its wait
    (``Pending.result`` calls ``finish`` once the transfer is done). Returns the log the
    program's calls append to."""
    from partita.ops.collective import Pending

    log: list[tuple[str, int, str]] = []
    steps = list(tp.steps)
    for i, st in enumerate(steps):
        fn, node = st[0], st[7]

        def wrapped(args, attrs, fn=fn, i=i, op=node.op):
            log.append(("call", i, op))
            res = fn(args, attrs)
            if type(res) is Pending:
                log.append(("issue", i, op))
                done = res.finish

                def finish(t, done=done, i=i, op=op):
                    log.append(("wait", i, op))
                    return t if done is None else done(t)
                res.finish = finish
            return res
        steps[i] = (wrapped, *st[1:])
    tp.steps = steps
    return log
