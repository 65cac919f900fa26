"""Measure this machine and describe it as a cluster file (``partita calibrate``).

The shipped cluster files hold data-sheet figures of GPUs partita cannot run on. To check the
simulator against real runs, this module measures the machine it runs on: the "device" is one
CPU rank running torch on ``threads`` threads, the "cluster" is ``nproc`` gloo ranks on
loopback (one node). What it measures, each as the median of repeated timings:

- peak FLOP/s per dtype: large square matmuls, the best size (there is no data sheet for a
  CPU rank: the achieved rate of large matmuls is the peak);
- ``[efficiency]``: ``gemm`` and ``gemm_knee`` fitted (least squares in log space) to a sweep
  of matmuls with one small dim, ``memory_bandwidth`` from large adds and copies, ``memory``
  as the fraction of it that layer_norm, gelu and softmax reach, ``attention`` as the
  fraction of the f32 peak that scaled_dot_product_attention reaches, ``op_overhead`` as the
  seconds per node of a graph of tiny adds under partita's torch executor;
- gloo's latency (alpha) and bandwidth (beta): all_reduce, all_gather, reduce_scatter,
  broadcast and send/recv over message sizes of 4 B to 64 MiB, fitted to the alpha-beta
  models of ``COLLECTIVE_MODELS``.

The fits are plain functions of numbers (``fit_alpha_beta``, ``fit_gemm_knee``) so they can be
checked on synthetic data.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ..ir.diagnostics import PartitaError
from .hardware import Cluster, Device, Efficiency, Link, format_quantity


class CalibrationError(PartitaError):
    """A measurement that could not be made (a gloo rank that failed or never answered)."""


# --- the models and their fits -----------------------------------------------------------------

# collective -> n -> (latency terms, bandwidth terms): time = a * alpha + b * S / beta, with S
# the full buffer's bytes (all_reduce: each rank's buffer; all_gather: the gathered output;
# reduce_scatter: the input that is scattered; send/recv: the message).
COLLECTIVE_MODELS: dict[str, Callable[[int], tuple[float, float]]] = {
    "all_reduce": lambda n: (2.0 * (n - 1), 2.0 * (n - 1) / n),      # ring: reduce-scatter + all-gather
    "all_gather": lambda n: (float(n - 1), (n - 1) / n),
    "reduce_scatter": lambda n: (float(n - 1), (n - 1) / n),
    "broadcast": lambda n: (float(math.ceil(math.log2(n))), 1.0),    # a tree of whole-buffer hops
    "send_recv": lambda n: (1.0, 1.0),
}
# The collectives the link's alpha and beta are fitted to together (broadcast's algorithm in
# gloo is not a ring: its own fit is recorded, it does not set the link).
LINK_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


@dataclass(frozen=True)
class AlphaBetaFit:
    """``time = a * alpha + b * S / beta`` fitted to timings: alpha in s, beta in bytes/s, and
    the RMS relative error of the fitted times."""

    alpha: float
    beta: float
    error: float
    points: int

    def time(self, a: float, b: float, nbytes: float) -> float:
        return a * self.alpha + b * nbytes / self.beta


@dataclass(frozen=True)
class KneeFit:
    """``eff(m, n, k) = gemm * prod(d / (d + knee))`` fitted to measured efficiencies, and the
    RMS error of the fit in log space (about the relative error)."""

    gemm: float
    knee: float
    error: float


def fit_alpha_beta(nbytes: Sequence[float], times: Sequence[float], latency_terms: Sequence[float],
                   bandwidth_terms: Sequence[float]) -> AlphaBetaFit:
    """Least squares of the relative error of ``t_i = a_i * alpha + b_i * S_i / beta`` (so a
    4-byte message counts as much as a 64 MiB one), with alpha >= 0 and beta > 0. Points of
    several collectives fit one link together: each point brings its own terms ``a_i, b_i``
    (``COLLECTIVE_MODELS``)."""
    s = np.asarray(nbytes, dtype=np.float64)
    t = np.asarray(times, dtype=np.float64)
    a = np.asarray(latency_terms, dtype=np.float64) * np.ones_like(t)
    b = np.asarray(bandwidth_terms, dtype=np.float64) * np.ones_like(t)
    if len(t) < 2 or np.any(t <= 0):
        raise ValueError("fit_alpha_beta needs at least two positive timings")
    rows = np.stack([a / t, b * s / t], axis=1)   # unknowns: alpha and 1/beta
    ones = np.ones_like(t)

    def cost(x: tuple[float, float]) -> float:
        return float(np.sum((rows @ np.asarray(x) - ones) ** 2))

    (alpha, inv_beta), *_ = np.linalg.lstsq(rows, ones, rcond=None)
    if alpha < 0 or inv_beta <= 0:
        # A bound is active: the best of the two edges, each one column of the same system.
        only_beta = (0.0, float(rows[:, 1] @ ones / (rows[:, 1] @ rows[:, 1])))
        only_alpha = (float(rows[:, 0] @ ones / (rows[:, 0] @ rows[:, 0])), 0.0)
        alpha, inv_beta = min((only_beta, only_alpha), key=cost)
        if inv_beta <= 0:
            # Only latency shows (every message small): take the bandwidth the largest
            # message allows at most beside that latency, rather than an infinite one.
            i = int(np.argmax(b * s))
            inv_beta = max(t[i] - a[i] * alpha, t[i] * 1e-3) / (b[i] * s[i])
    pred = a * alpha + b * s * inv_beta
    error = float(np.sqrt(np.mean(((pred - t) / t) ** 2)))
    return AlphaBetaFit(float(alpha), float(1.0 / inv_beta), error, len(t))


def gemm_model(shape: Sequence[float], gemm: float, knee: float) -> float:
    """The efficiency the cost model gives an (m, k) x (k, n) matmul of ``shape = (m, n, k)``."""
    eff = gemm
    for d in shape:
        eff *= d / (d + knee)
    return eff


def fit_gemm_knee(shapes: Sequence[Sequence[float]], efficiencies: Sequence[float]) -> KneeFit:
    """``gemm`` (at most 1) and ``gemm_knee`` of ``gemm_model`` by least squares in log space:
    for each knee the best log(gemm) is the mean residual, so the fit is a search over the
    knee alone (a log grid, then golden-section refinement)."""
    dims = np.asarray(shapes, dtype=np.float64)
    y = np.log(np.asarray(efficiencies, dtype=np.float64))
    if dims.ndim != 2 or len(y) != len(dims) or len(y) < 2:
        raise ValueError("fit_gemm_knee needs at least two (m, n, k) shapes and one efficiency each")

    def solve(knee: float) -> tuple[float, float]:
        shape_term = np.sum(np.log(dims / (dims + knee)), axis=1)
        log_gemm = min(0.0, float(np.mean(y - shape_term)))   # gemm is a fraction: at most 1
        r = y - log_gemm - shape_term
        return float(np.mean(r ** 2)), log_gemm

    grid = np.geomspace(1e-3, 1e5, 161)
    costs = [solve(k)[0] for k in grid]
    i = int(np.argmin(costs))
    lo, hi = math.log(grid[max(i - 1, 0)]), math.log(grid[min(i + 1, len(grid) - 1)])
    phi = (math.sqrt(5) - 1) / 2
    for _ in range(60):
        m1, m2 = hi - phi * (hi - lo), lo + phi * (hi - lo)
        if solve(math.exp(m1))[0] < solve(math.exp(m2))[0]:
            hi = m2
        else:
            lo = m1
    knee = math.exp((lo + hi) / 2)
    cost, log_gemm = solve(knee)
    return KneeFit(math.exp(log_gemm), knee, math.sqrt(cost))


# --- timing ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Measurement:
    """One figure of the machine: its value in base units, its relative error (the fit's RMS
    relative error, or the spread of the repeated timings), and how it was measured."""

    name: str
    value: float
    unit: str
    error: float
    how: str


@dataclass(frozen=True)
class Calibration:
    """What ``measure`` found: the cluster file's contents and every figure behind it."""

    cluster: Cluster
    measurements: tuple[Measurement, ...]
    fits: Mapping[str, AlphaBetaFit] = field(default_factory=dict)
    seconds: float = 0.0


def _samples(fn: Callable[[], Any], repeats: int, min_seconds: float) -> list[float]:
    """Seconds per call of ``fn``: ``repeats`` samples, each of enough calls to last
    ``min_seconds`` (after one warm-up call)."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    inner = max(1, int(min_seconds / max(one, 1e-9)))
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        out.append((time.perf_counter() - t0) / inner)
    return out


def _spread(samples: Sequence[float]) -> float:
    """The median absolute deviation relative to the median."""
    med = statistics.median(samples)
    return statistics.median(abs(x - med) for x in samples) / med if med > 0 else 0.0


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (or what the platform module says)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def total_memory() -> float:
    """This machine's physical memory in bytes."""
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 8.0 * 2 ** 30


_TORCH_DTYPES = {"f64": "float64", "f32": "float32", "bf16": "bfloat16"}


def _matmul_rate(torch: Any, m: int, n: int, k: int, dtype: Any, repeats: int, min_s: float) -> tuple[float, float]:
    a = torch.randn(m, k, dtype=dtype)
    b = torch.randn(k, n, dtype=dtype)
    out = torch.empty(m, n, dtype=dtype)
    s = _samples(lambda: torch.matmul(a, b, out=out), repeats, min_s)
    return 2.0 * m * n * k / statistics.median(s), _spread(s)


def _bf16_usable(torch: Any) -> bool:
    """torch's CPU bf16 matmul runs and agrees with f32 to bf16's precision."""
    try:
        a = torch.randn(64, 64)
        b = torch.randn(64, 64)
        got = (a.bfloat16() @ b.bfloat16()).float()
    except (RuntimeError, TypeError):
        return False
    want = a.bfloat16().float() @ b.bfloat16().float()
    return bool(torch.allclose(got, want, rtol=0.05, atol=0.5))


def _add_copy_bandwidth(torch: Any, n_el: int, reps: int, min_s: float) -> tuple[float, float, float, float]:
    """Bytes read + written per second of f32 adds and copies of ``n_el`` elements: (the
    faster, its spread, the add's, the copy's)."""
    x, y, out = torch.randn(n_el), torch.randn(n_el), torch.empty(n_el)
    s_add = _samples(lambda: torch.add(x, y, out=out), reps, min_s)
    s_copy = _samples(lambda: out.copy_(x), reps, min_s)
    bw_add = 3 * 4 * n_el / statistics.median(s_add)
    bw_copy = 2 * 4 * n_el / statistics.median(s_copy)
    best, spread = max((bw_add, _spread(s_add)), (bw_copy, _spread(s_copy)))
    return best, spread, bw_add, bw_copy


def measure_compute(quick: bool, progress: Callable[[str], Any]) -> tuple[dict[str, float], Efficiency, float,
                                                                      list[Measurement]]:
    """Peak FLOP/s per dtype, the compute and memory part of ``[efficiency]`` and the memory
    bandwidth of one rank on torch's current thread count."""
    import torch
    import torch.nn.functional as F

    reps = 3 if quick else 5
    min_s = 0.02 if quick else 0.05
    found: list[Measurement] = []
    peak: dict[str, float] = {}
    sizes = (512, 1024) if quick else (512, 1024, 2048)
    dtypes = ["f32", "f64"] + (["bf16"] if _bf16_usable(torch) else [])
    for name in dtypes:
        dt = getattr(torch, _TORCH_DTYPES[name])
        rates: list[tuple[float, float, int]] = []
        for n in sizes:
            rates.append(_matmul_rate(torch, n, n, n, dt, reps, min_s) + (n,))
            if 2.0 * n ** 3 / rates[-1][0] > 0.25:
                # A dtype the processor has no instructions for (bf16 without AVX-512 BF16 or
                # AMX) runs a 2048 square matmul for tens of seconds a call: larger sizes would
                # take minutes and not be faster.
                break
        best = max(rates, key=lambda r: r[0])
        peak[name] = best[0]
        found.append(Measurement(f"peak_flops.{name}", best[0], "FLOP/s", best[1],
                                 f"{name} square matmuls of {', '.join(str(r[2]) for r in rates)}: the best size ({best[2]}), "
                                 f"median of {reps} timings"))
        progress(f"  peak {name}: {format_quantity(best[0], 'FLOP/s')} (square matmul {best[2]})")

    # gemm / gemm_knee: one small dim in each position, the others large; plus the large
    # squares themselves (the plateau the knee bends away from).
    big = 512 if quick else 1024
    small = (8, 32, 128, 512) if quick else (8, 16, 32, 64, 128, 256, 512)
    shapes: list[tuple[int, int, int]] = [(n, n, n) for n in sizes]
    for d in small:
        for pos in range(3):
            shape = [big, big, big]
            shape[pos] = d
            shapes.append((shape[0], shape[1], shape[2]))
    effs = []
    for m, n, k in shapes:
        rate, _ = _matmul_rate(torch, m, n, k, torch.float32, reps, min_s / 2)
        effs.append(rate / peak["f32"])
    knee = fit_gemm_knee(shapes, effs)
    found.append(Measurement("efficiency.gemm", knee.gemm, "", knee.error,
                             f"fitted with gemm_knee to {len(shapes)} f32 matmuls (one dim of {', '.join(map(str, small))},"
                             f" the others {big}, and the squares), relative to peak f32"))
    found.append(Measurement("efficiency.gemm_knee", knee.knee, "", knee.error,
                             "eff(m,n,k) = gemm * prod(d/(d+knee)), least squares in log space"))
    progress(f"  gemm: {knee.gemm:.3g} of peak, knee {knee.knee:.3g} (fit error {knee.error:.1%})")

    # Memory bandwidth: bytes read + written per second of large adds and copies.
    n_el = (8 if quick else 16) * 2 ** 20
    bandwidth, bw_spread, bw_add, bw_copy = _add_copy_bandwidth(torch, n_el, reps, min_s)
    found.append(Measurement("memory_bandwidth", bandwidth, "B/s", bw_spread,
                             f"f32 add and copy of {n_el * 4 // 2 ** 20} MiB arrays, bytes read + written per second, "
                             f"the faster (add {format_quantity(bw_add, 'B/s')}, copy {format_quantity(bw_copy, 'B/s')})"))
    progress(f"  memory bandwidth: {format_quantity(bandwidth, 'B/s')} (add {format_quantity(bw_add, 'B/s')}, "
             f"copy {format_quantity(bw_copy, 'B/s')})")

    rows = 2048 if quick else 4096
    h = torch.randn(rows, n_el // rows)
    ops = {"layer_norm": lambda: F.layer_norm(h, (h.shape[-1],)), "gelu": lambda: F.gelu(h),
           "softmax": lambda: torch.softmax(h, dim=-1)}
    fractions = {}
    for name, fn in ops.items():
        fractions[name] = 2 * 4 * h.numel() / statistics.median(_samples(fn, reps, min_s)) / bandwidth
    memory = min(1.0, statistics.median(fractions.values()))
    found.append(Measurement("efficiency.memory", memory, "", _relative_range(list(fractions.values())),
                             "median over layer_norm, gelu, softmax (each allocating its result, as the executor does; on one "
                             "thread their arithmetic, not memory, bounds them) of f32 "
                             f"[{rows}, {h.shape[-1]}] of bytes read + written per second over the memory bandwidth ("
                             + ", ".join(f"{k} {v:.2f}" for k, v in fractions.items()) + ")"))
    progress(f"  memory-bound ops: {memory:.3g} of the bandwidth (" +
             ", ".join(f"{k} {v:.2f}" for k, v in fractions.items()) + ")")
    stream_n = 2 ** 20       # 4 MB a tensor, 28 MB a step: beyond one rank's share of the cache
    stream, stream_spread = measure_stream(torch, stream_n, reps, min_s, bandwidth)
    found.append(Measurement("efficiency.stream", stream, "", stream_spread,
                             f"an in-place AdamW step (as the executor runs it) of f32 [{stream_n}], 28 B an element "
                             "read + written per second over the memory bandwidth, median; prices adamw_update, "
                             "sgd_update, concat, split"))
    progress(f"  streaming ops (AdamW step): {stream:.3g} of the bandwidth")

    # Attention: scaled_dot_product_attention's forward FLOP/s over the f32 peak.
    attn_shapes = ((1, 8, 256, 64), (1, 8, 512, 64)) if quick else ((1, 8, 512, 64), (1, 16, 1024, 64), (2, 8, 512, 128))
    att = []
    for b, heads, seq, dim in attn_shapes:
        q, kk, v = (torch.randn(b, heads, seq, dim) for _ in range(3))
        s = _samples(lambda: F.scaled_dot_product_attention(q, kk, v), reps, min_s)
        att.append(4.0 * b * heads * seq * seq * dim / statistics.median(s) / peak["f32"])
    attention = min(1.0, statistics.median(att))
    found.append(Measurement("efficiency.attention", attention, "", _relative_range(att),
                             "forward scaled_dot_product_attention f32 (batch, heads, seq, head_dim) "
                             + ", ".join(map(str, attn_shapes)) + ": 4*b*h*s^2*d FLOP per call over peak f32, median"))
    progress(f"  attention: {attention:.3g} of peak f32 ({', '.join(f'{a:.2f}' for a in att)})")

    overhead, ov_spread = _op_overhead(200 if quick else 1000, reps)
    found.append(Measurement("efficiency.op_overhead", overhead, "s", ov_spread,
                             "seconds per node of a chain of 1-element f32 adds run by partita's torch executor "
                             "(TorchProgram)"))
    progress(f"  op overhead: {format_quantity(overhead, 's')} per node (torch executor)")
    eff = Efficiency(gemm=knee.gemm, gemm_knee=knee.knee, attention=attention, memory=memory, op_overhead=overhead,
                     network=1.0, stream=stream)
    return peak, eff, bandwidth, found


def measure_stream(torch: Any, n_el: int, reps: int, min_s: float, bandwidth: float) -> tuple[float, float]:
    """``Efficiency.stream``: an in-place AdamW step of ``n_el`` f32 elements (as the executor
    runs it: param, grad and both moments read, the three states written, 28 B an element),
    bytes per second over ``bandwidth`` (at most 1); returns it and its samples' spread. The
    optimizer's step is most of a training step's streamed bytes; the gradient bucket's concat
    and split, priced alike, run nearer the bandwidth (so they are priced on the safe side)."""
    from ..ops.optim import torch_adamw_inplace

    attrs = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2)
    p, g, m = (torch.randn(n_el) for _ in range(3))
    v = torch.rand(n_el)
    samples = _samples(lambda: torch_adamw_inplace([p, g, m, v, 3], attrs), reps, min_s)
    return min(1.0, 28 * n_el / statistics.median(samples) / bandwidth), _spread(samples)


def _relative_range(xs: Sequence[float]) -> float:
    med = statistics.median(xs)
    return (max(xs) - min(xs)) / (2 * med) if med > 0 else 0.0


def _op_overhead(nodes: int, repeats: int) -> tuple[float, float]:
    """Seconds per node of a graph of ``nodes`` tiny adds under the torch executor."""
    from ..backend.torch_exec import TorchProgram
    from ..ir.parser import parse

    lines = ["graph @tiny(%x: f32[1]) -> (f32[1]) {", "  %v0 = add(%x, %x) : f32[1]"]
    lines += [f"  %v{i} = add(%v{i - 1}, %x) : f32[1]" for i in range(1, nodes)]
    lines += [f"  return %v{nodes - 1}", "}"]
    prog = TorchProgram(parse("\n".join(lines)))
    x = np.ones(1, np.float32)
    s = _samples(lambda: prog([x]), repeats, 0.05)
    return statistics.median(s) / nodes, _spread(s)


# --- gloo on loopback ------------------------------------------------------------------------

def message_sizes(quick: bool) -> list[int]:
    """Bytes per message: powers of 4 from 4 B to 64 MiB (quick: every other one, to 4 MiB)."""
    return [4 * 16 ** i for i in range(6)] if quick else [4 * 4 ** i for i in range(13)]


def _calls(nbytes: int, quick: bool) -> int:
    """Timed calls per collective and size: the same on every rank (a count one rank chose
    alone would leave the others waiting in a collective it never enters)."""
    if nbytes <= 2 ** 16:
        return 10 if quick else 40
    if nbytes <= 2 ** 22:
        return 4 if quick else 15
    return 3 if quick else 5


def _gloo_worker(rank: int, nproc: int, port: int, threads: int, sizes: list[int], quick: bool,
                 results: Any) -> None:
    """One rank of the gloo measurement: times each call of every collective at every size and
    puts ``(rank, {collective: {bytes: [seconds per call]}}, skipped)`` on ``results``, or
    ``(rank, None, traceback)`` when something failed."""
    import traceback
    import warnings
    from datetime import timedelta

    try:
        import torch
        import torch.distributed as dist

        warnings.filterwarnings("ignore")
        torch.set_num_threads(threads)
        # The timeout bounds every collective: a rank whose peer died raises instead of waiting.
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=nproc,
                                timeout=timedelta(seconds=_GLOO_TIMEOUT_S))
        out: dict[str, dict[int, list[float]]] = {}

        def ops(nbytes: int) -> dict[str, Callable[[], Any]]:
            full = torch.ones(max(1, nbytes // 4))           # S bytes: the whole buffer
            per = max(1, full.numel() // nproc)              # one rank's piece of it
            piece = torch.ones(per)
            pieces = [torch.empty(per) for _ in range(nproc)]
            inputs = [torch.ones(per) for _ in range(nproc)]

            def send_recv() -> None:                         # a round trip between ranks 0 and 1
                if rank == 0:
                    dist.send(full, 1)
                    dist.recv(full, 1)
                elif rank == 1:
                    dist.recv(full, 0)
                    dist.send(full, 0)
            return {"all_reduce": lambda: dist.all_reduce(full),
                    "all_gather": lambda: dist.all_gather(pieces, piece),
                    "reduce_scatter": lambda: dist.reduce_scatter(piece, inputs),
                    "broadcast": lambda: dist.broadcast(full, 0),
                    "send_recv": send_recv}

        # Every rank tries each collective once; gloo raises on one it does not implement
        # (reduce_scatter in some torch versions) on every rank alike.
        skipped: set[str] = set()
        for name, fn in ops(4 * nproc).items():
            try:
                fn()
            except (RuntimeError, NotImplementedError, ValueError):
                skipped.add(name)
        dist.barrier()
        for nbytes in sizes:
            table = ops(nbytes)
            for name, fn in table.items():
                if name in skipped:
                    continue
                fn()                                         # warm-up
                dist.barrier()
                times = []
                for _ in range(_calls(nbytes, quick)):
                    t0 = time.perf_counter()
                    fn()
                    t = time.perf_counter() - t0
                    times.append(t / 2 if name == "send_recv" else t)   # a round trip is two messages
                out.setdefault(name, {})[nbytes] = times
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, out, sorted(skipped)))
    except BaseException:  # noqa: BLE001 -- the parent reports whatever stopped a rank
        results.put((rank, None, traceback.format_exc()))


_GLOO_TIMEOUT_S = 60.0


def measure_gloo(nproc: int, threads: int, quick: bool, progress: Callable[[str], Any],
                 timeout_s: float = 300.0) -> tuple[dict[str, dict[int, float]], list[str]]:
    """Seconds per collective and message size on ``nproc`` gloo ranks on loopback: for each
    call the slowest rank's time, and the median over the calls (loopback on a few shared cores
    has a long tail of slow calls, which a mean would follow); and the collectives gloo does
    not support. Never waits more than ``timeout_s``: a rank that fails or hangs stops the
    measurement with a CalibrationError, and every rank is joined (or killed) before it returns."""
    from ..runtime.launch import check_spawnable

    if nproc < 2:
        raise CalibrationError(f"calibrate: gloo needs at least 2 processes to measure a link, got nproc={nproc}")
    check_spawnable("calibrate")
    for attempt in range(3):
        try:
            got, skipped = _run_gloo_ranks(nproc, threads, quick, progress, timeout_s)
            break
        except CalibrationError as e:
            # The free port was taken between choosing it and rank 0 binding it: choose again.
            if attempt == 2 or "address already in use" not in str(e).lower():
                raise
            progress("  the port was taken meanwhile; again on another one")
    medians: dict[str, dict[int, float]] = {}
    for name in got[0]:
        ranks = [0, 1] if name == "send_recv" else list(range(nproc))
        medians[name] = {nbytes: statistics.median(max(calls) for calls in zip(*(got[r][name][nbytes] for r in ranks)))
                         for nbytes in got[0][name]}
    return medians, skipped


def _run_gloo_ranks(nproc: int, threads: int, quick: bool, progress: Callable[[str], Any],
                    timeout_s: float) -> tuple[dict[int, Any], list[str]]:
    """Spawn the ranks of ``_gloo_worker`` on a free port; each rank's timings by rank, and the
    collectives gloo skipped."""
    import multiprocessing
    import queue as queue_mod

    from ..runtime.launch import free_port

    sizes = message_sizes(quick)
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_gloo_worker, args=(r, nproc, port, threads, sizes, quick, results), daemon=True,
                         name=f"partita-calibrate-{r}") for r in range(nproc)]
    for p in procs:
        p.start()
    progress(f"  {nproc} gloo ranks on 127.0.0.1:{port}, {len(sizes)} sizes "
             f"({format_quantity(sizes[0], 'B')} .. {format_quantity(sizes[-1], 'B')}), "
             f"{_calls(sizes[-1], quick)}-{_calls(sizes[0], quick)} calls each")
    got: dict[int, Any] = {}
    skipped: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(got) < nproc:
            try:
                rank, data, extra = results.get(timeout=0.5)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in got]
                if dead or time.monotonic() > deadline:
                    why = (f"rank {dead[0]} exited with code {procs[dead[0]].exitcode}" if dead
                           else f"no result after {timeout_s:g} s")
                    raise CalibrationError(f"calibrate: the gloo measurement failed: {why}") from None
                continue
            if data is None:
                raise CalibrationError(f"calibrate: gloo rank {rank} failed:\n{extra}")
            got[rank] = data
            skipped = extra
    finally:
        for p in procs:
            p.join(timeout=10 if len(got) == nproc else 0.5)
            if p.exitcode is None:
                p.kill()
                p.join(timeout=5)
        results.close()
        results.join_thread()
    return got, skipped


def fit_collectives(medians: Mapping[str, Mapping[int, float]], nproc: int) -> dict[str, AlphaBetaFit]:
    """Each collective's alpha-beta fit, and ``"link"``: one fit of the collectives in
    ``LINK_COLLECTIVES`` together."""
    fits: dict[str, AlphaBetaFit] = {}
    joint: list[tuple[float, float, float, float]] = []
    for name, by_size in medians.items():
        a, b = COLLECTIVE_MODELS[name](nproc if name != "send_recv" else 2)
        pts = sorted(by_size.items())
        fits[name] = fit_alpha_beta([s for s, _ in pts], [t for _, t in pts], [a] * len(pts), [b] * len(pts))
        if name in LINK_COLLECTIVES:
            joint += [(s, t, a, b) for s, t in pts]
    if joint:
        fits["link"] = fit_alpha_beta([p[0] for p in joint], [p[1] for p in joint], [p[2] for p in joint],
                                      [p[3] for p in joint])
    return fits


# --- the whole calibration -------------------------------------------------------------------

# The most gloo ranks and threads per rank a calibration starts: one machine's loopback.
MAX_NPROC = 256
MAX_THREADS = 1024


def _check_counts(nproc: Any, threads: Any, quick: Any) -> None:
    for name, x, lo, hi in (("nproc", nproc, 1, MAX_NPROC), ("threads", threads, 1, MAX_THREADS)):
        if isinstance(x, bool) or not isinstance(x, int) or not lo <= x <= hi:
            raise CalibrationError(f"calibrate: {name} must be a whole number from {lo} to {hi}, got {x!r:.40}")
    if not isinstance(quick, bool):
        raise CalibrationError(f"calibrate: quick must be True or False, got {quick!r:.40}")


def measure(nproc: int = 4, threads: int = 1, quick: bool = False,
            progress: Callable[[str], Any] = print) -> Calibration:
    """Measure this machine (see the module docstring): the cluster and every figure behind it."""
    import torch

    _check_counts(nproc, threads, quick)

    start = time.perf_counter()
    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    cpu = cpu_model()
    before = torch.get_num_threads()
    progress(f"calibrating {cpu}: torch on {threads} thread(s){', quick' if quick else ''}")
    try:
        torch.set_num_threads(threads)
        peak, eff, bandwidth, found = measure_compute(quick, progress)
    finally:
        torch.set_num_threads(before)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        cache = measure_cache(nproc, quick, progress)
    finally:
        torch.set_num_threads(before)
    if cache is not None:
        found += [cache[2], cache[3]]
    shared: int | None = None
    if nproc > 1:
        # The ranks share this machine's cores: the device is a rank computing beside the others.
        cont = measure_contention(nproc, threads, quick, progress)
        found.append(cont)
        if cont.value < 0.95:
            # The simulator shares the cores between the ranks that compute at each moment
            # (Cluster.cores_per_node); the peaks stay those of one rank alone.
            shared = max(1, min(nproc, round(nproc * cont.value)))
    progress("gloo collectives:")
    medians, skipped = measure_gloo(nproc, threads, quick, progress)
    fits = fit_collectives(medians, nproc)
    for name, fit in fits.items():
        if name != "link":
            progress(f"  {name}: alpha {format_quantity(fit.alpha, 's')}, beta {format_quantity(fit.beta, 'B/s')} "
                     f"(fit error {fit.error:.1%})")
    if skipped:
        progress(f"  skipped (gloo does not support them): {', '.join(skipped)}")
    link_fit = fits["link"]
    link = Link(link_fit.beta, link_fit.alpha,
                tuple((name, f.alpha, f.beta) for name, f in fits.items() if name != "link"),
                tuple((name, 2 if name == "send_recv" else nproc, tuple((float(x), t) for x, t in sorted(by.items())))
                      for name, by in medians.items()))
    memory = total_memory() / nproc
    sizes = message_sizes(quick)
    net_how = (f"one fit of {', '.join(n for n in LINK_COLLECTIVES if n in medians)} on {nproc} gloo ranks on "
               f"loopback, {format_quantity(sizes[0], 'B')} .. {format_quantity(sizes[-1], 'B')}, "
               "relative least squares")
    found += [Measurement("intra_node.latency", link.latency, "s", link_fit.error, net_how),
              Measurement("intra_node.bandwidth", link.bandwidth, "B/s", link_fit.error, net_how),
              Measurement("device.memory", memory, "B", 0.0, f"total RAM {format_quantity(total_memory(), 'B')} / "
                                                             f"{nproc} ranks")]
    sources = [f"measured by partita calibrate {_partita_version()} on {when}: {cpu}, torch {torch.__version__} on "
               f"{threads} thread(s) per rank, {nproc} gloo ranks on loopback{', quick' if quick else ''}"]
    sources += [f"{m.name}: {m.how}" for m in found]
    sources += [f"gloo {name}: alpha {format_quantity(f.alpha, 's')}, beta {format_quantity(f.beta, 'B/s')}, "
                f"RMS relative error {f.error:.1%} over {f.points} sizes"
                + (" (model: " + _model_text(name) + ")" if name != "link" else " (all of them together)")
                for name, f in fits.items()]
    sources += [f"gloo {name}: not supported, not measured" for name in skipped]
    device = Device(f"{cpu}, {threads} thread(s)", peak, memory, bandwidth,
                    cache[0] if cache is not None else None, cache[1] if cache is not None else None)
    cluster = Cluster("this-machine", device, 1, nproc, link, link,
                      description=f"this machine ({cpu}) as {nproc} gloo ranks on loopback, measured {when}",
                      sources=tuple(sources), efficiency=eff, cores_per_node=shared, fused_groups=False)
    return Calibration(cluster, tuple(found), fits, time.perf_counter() - start)


def last_level_cache() -> int | None:
    """Bytes of this CPU's last-level cache (Linux sysfs), or None."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    best: tuple[int, int] | None = None
    for d in sorted(base.glob("index*")) if base.exists() else []:
        try:
            level = int((d / "level").read_text())
            kind = (d / "type").read_text().strip()
            size = (d / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        mult = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(size[-1:], 1)
        try:
            n = int(size.rstrip("KMG")) * mult
        except ValueError:
            continue
        if best is None or level > best[0]:
            best = (level, n)
    return best[1] if best else None


def measure_cache(nproc: int, quick: bool, progress: Callable[[str], Any]) -> tuple[float, float, Measurement,
                                                                                    Measurement] | None:
    """A rank's share of the last-level cache (its size over ``nproc``) and the bandwidth of
    f32 adds and copies whose arrays fit in half of it; None where the cache is unknown."""
    import torch

    size = last_level_cache()
    if size is None:
        return None
    share = size / nproc
    n_el = max(1024, int(share / 2 / 12))
    reps, min_s = (3, 0.02) if quick else (5, 0.05)
    bw, spread, bw_add, bw_copy = _add_copy_bandwidth(torch, n_el, reps, min_s)
    progress(f"  cache: {format_quantity(share, 'B')} per rank ({format_quantity(size, 'B')} / {nproc}), "
             f"{format_quantity(bw, 'B/s')} (add {format_quantity(bw_add, 'B/s')}, copy {format_quantity(bw_copy, 'B/s')})")
    return share, bw, \
        Measurement("cache", share, "B", 0.0, f"the last-level cache ({format_quantity(size, 'B')}, sysfs) over {nproc} "
                                             "ranks"), \
        Measurement("cache_bandwidth", bw, "B/s", spread,
                    f"f32 add and copy of {n_el * 4 // 1024} KiB arrays (half the cache share), bytes read + written "
                    f"per second, the faster (add {format_quantity(bw_add, 'B/s')}, copy {format_quantity(bw_copy, 'B/s')})")


def _contention_probe(threads: int, seconds: float) -> float:
    """Units of work per second of a mix of a rank's kernels (an f32 matmul of 512 and a
    layer_norm of [1024, 1024]), run for ``seconds``."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    a, b = torch.randn(512, 512), torch.randn(512, 512)
    h = torch.randn(1024, 1024)
    torch.matmul(a, b)
    F.layer_norm(h, (1024,))
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        torch.matmul(a, b)
        F.layer_norm(h, (1024,))
        n += 1
    return n / (time.perf_counter() - t0)


def _contention_worker(threads: int, seconds: float, start: Any, out: Any) -> None:
    start.wait()
    out.put(_contention_probe(threads, seconds))


def measure_contention(nproc: int, threads: int, quick: bool, progress: Callable[[str], Any]) -> Measurement:
    """How fast a rank computes while all ``nproc`` ranks compute at once, relative to alone:
    the ranks of this machine share its cores (4 ranks on 2 cores run at about half speed),
    which a GPU cluster's devices do not. The median rank's rate over the rate of one process
    alone, at most 1."""
    import multiprocessing as mp

    seconds = 0.5 if quick else 1.5
    solo = _contention_probe(threads, seconds)
    ctx = mp.get_context("spawn")
    start, out = ctx.Barrier(nproc), ctx.Queue()
    procs = [ctx.Process(target=_contention_worker, args=(threads, seconds, start, out), daemon=True)
             for _ in range(nproc)]
    for p in procs:
        p.start()
    rates = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    ratio = min(1.0, statistics.median(rates) / solo)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    progress(f"  contention: {nproc} ranks computing at once run at {ratio:.2f} of one alone "
             f"({cores} cores, {threads} thread(s) per rank)")
    return Measurement("contention", ratio, "", _relative_range(rates),
                       f"an f32 matmul of 512 and a layer_norm of [1024, 1024] in a loop on {nproc} processes at once "
                       f"({threads} thread(s) each, {cores} cores), the median rank's rate over one process alone; "
                       "below 0.95, cores_per_node = round(ranks x it)")


def _partita_version() -> str:
    # The installed distribution's version: cluster/ may not import the top-level package (api/).
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("partita")
    except PackageNotFoundError:
        return "(not installed)"


def _model_text(name: str) -> str:
    return {"all_reduce": "2(n-1) alpha + 2(n-1)/n S/beta", "all_gather": "(n-1) alpha + (n-1)/n S/beta",
            "reduce_scatter": "(n-1) alpha + (n-1)/n S/beta", "broadcast": "ceil(log2 n) alpha + S/beta",
            "send_recv": "alpha + S/beta"}[name]


def calibrate(nproc: int = 4, threads: int = 1, quick: bool = False,
              progress: Callable[[str], Any] = print) -> Cluster:
    """This machine as a cluster: ``nproc`` ranks of torch on ``threads`` threads each, talking
    over gloo on loopback. How each figure was measured is in the cluster's ``sources``."""
    return measure(nproc, threads, quick, progress).cluster


def summary_rows(cal: Calibration) -> list[list[str]]:
    """One row per measured figure (name, value, relative error), then each collective's alpha
    and beta: the table ``partita calibrate`` prints."""
    rows = [[m.name, format_quantity(m.value, m.unit) if m.unit else f"{m.value:.4g}", f"{m.error:.1%}"]
            for m in cal.measurements]
    for name, fit in cal.fits.items():
        if name == "link":
            continue
        rows.append([f"gloo {name} alpha", format_quantity(fit.alpha, "s"), f"{fit.error:.1%}"])
        rows.append([f"gloo {name} beta", format_quantity(fit.beta, "B/s"), f"{fit.error:.1%}"])
    return rows


# --- the file --------------------------------------------------------------------------------

def _toml_string(s: str) -> str:
    return json.dumps(s)    # a JSON string is a TOML basic string


def _number(x: float) -> str:
    text = repr(float(x))
    return text if ("." in text or "e" in text or "inf" in text or "nan" in text) else text + ".0"


def cluster_toml(cluster: Cluster) -> str:
    """The TOML text of ``cluster``: numbers in base units, written exactly (``load_cluster``
    reads back an equal Cluster), each with its value in readable units beside it, and the
    cluster's sources (how and when each figure was measured) as comments at the top."""
    d = cluster.device
    lines = [f"# {cluster.name}: {cluster.description or 'a cluster file'}"]
    if cluster.sources:
        lines.append("#")
        lines += [f"# {s}" for s in cluster.sources]
    lines += ["", f"name = {_toml_string(cluster.name)}"]
    if cluster.description:
        lines.append(f"description = {_toml_string(cluster.description)}")
    lines += [f"nodes = {cluster.nodes}", f"gpus_per_node = {cluster.gpus_per_node}"]
    if cluster.cores_per_node is not None:
        lines.append(f"cores_per_node = {cluster.cores_per_node}    # ranks that compute at full speed at once")
    if not cluster.fused_groups:
        lines.append("fused_groups = false    # the runtime runs each op as its own kernel (no fused groups)")
    if cluster.sources:
        lines.append("sources = [")
        lines += [f"  {_toml_string(s)}," for s in cluster.sources]
        lines.append("]")

    def q(key: str, x: float, unit: str) -> str:
        return f"{key} = {_number(x)}    # {format_quantity(x, unit)}"

    lines += ["", "[device]", f"name = {_toml_string(d.name)}", q("memory", d.memory, "B"),
              q("memory_bandwidth", d.memory_bandwidth, "B/s")]
    if d.cache is not None and d.cache_bandwidth is not None:
        lines += [q("cache", d.cache, "B"), q("cache_bandwidth", d.cache_bandwidth, "B/s")]
    lines += ["", "[device.peak_flops]"]
    lines += [q(k, v, "FLOP/s") for k, v in sorted(d.peak_flops.items())]
    for table, link in (("intra_node", cluster.intra_node), ("inter_node", cluster.inter_node)):
        lines += ["", f"[{table}]", q("bandwidth", link.bandwidth, "B/s"), q("latency", link.latency, "s")]
        if link.collectives:
            lines += ["", f"[{table}.collectives]    # each collective's own fit"]
            lines += [f"{op} = {{ latency = {_number(a)}, bandwidth = {_number(b)} }}    # "
                      f"{format_quantity(a, 's')}, {format_quantity(b, 'B/s')}" for op, a, b in link.collectives]
        if link.measured:
            lines += ["", f"[{table}.measured]    # medians per message size; these price the collective"]
            lines += [f"{op} = {{ ranks = {n}, bytes = [{', '.join(_number(x) for x, _ in pts)}], "
                      f"seconds = [{', '.join(_number(t) for _, t in pts)}] }}" for op, n, pts in link.measured]
    e = cluster.efficiency
    lines += ["", "[efficiency]", f"gemm = {_number(e.gemm)}", f"gemm_knee = {_number(e.gemm_knee)}",
              f"attention = {_number(e.attention)}", f"memory = {_number(e.memory)}",
              q("op_overhead", e.op_overhead, "s"), f"network = {_number(e.network)}"]
    if e.stream is not None:
        lines.append(f"stream = {_number(e.stream)}")
    return "\n".join(lines) + "\n"


def write_cluster(cluster: Cluster, path: "str | os.PathLike[str]") -> Path:
    """Write ``cluster`` as a cluster file at ``path`` (``cluster_toml``); return the path."""
    p = Path(path)
    try:
        p.write_text(cluster_toml(cluster))
    except OSError as e:
        raise CalibrationError(f"{p}: cannot write the cluster file: {e.strerror or e}") from None
    return p


__all__ = ["AlphaBetaFit", "COLLECTIVE_MODELS", "Calibration", "CalibrationError", "KneeFit", "MAX_NPROC", "MAX_THREADS",
           "Measurement",
           "calibrate", "cluster_toml", "cpu_model", "fit_alpha_beta", "fit_collectives", "fit_gemm_knee",
           "gemm_model", "measure", "measure_gloo", "measure_stream", "message_sizes", "summary_rows", "write_cluster"]

