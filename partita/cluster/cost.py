"""The cost model: how long one op of a per-rank program takes on a cluster's device, and how
long a collective takes over the links its group crosses.

Compute ops are priced from their op record's ``Cost`` (FLOPs, bytes read and written), the
device's peaks and the cluster's ``[efficiency]`` table (``Efficiency``, fitted once per
machine and written in the cluster file, never tuned per model):

- **GEMMs** (matmul, convolutions; ``GEMM_OPS``): ``flops / (peak(dtype) * e)`` with
  ``e = gemm * prod(d / (d + gemm_knee))`` over the product's m, n and k, so a thin matmul
  (a small tensor-parallel shard, a microbatch of one sequence) runs further from the peak
  than a square one;
- **attention** (the fused ``attention`` op and its backward; ``ATTENTION_OPS``):
  ``flops / (peak(dtype) * attention)``, a causal one's FLOPs those of the tiles a flash
  kernel scores (about half; ``attention_pairs`` in partita/ops/nn.py). An attention that
  context parallelism gave its balanced causal mask (``causal_cp``) is priced at the pairs
  that mask keeps, as a flash kernel run per query chunk against the keys up to it
  (``masked_attention_pairs``); any other explicit mask at every pair, as the kernel that
  takes a mask tensor computes it;
- **everything else** is memory-bound or nearly so: the roofline ``max(bytes / (bandwidth *
  memory), flops / peak(f32))``, with ``stream`` in place of ``memory`` for the streaming ops
  (``STREAM_OPS``: optimizer updates, concat, split) where the cluster file measured it (a CPU
  thread streams an AdamW step 4x nearer its bandwidth than a norm); ops that only view their
  operand (``VIEW_OPS``: reshape, squeeze, unsqueeze) cost nothing;

and every op that runs a kernel adds ``op_overhead`` (its launch). ``fusion="eager"`` prices the
ops eager PyTorch runs as several kernels (RMSNorm, cross-entropy, AdamW; partita/cluster/eager.py)
as that chain: each kernel's bytes at the memory roofline, each with its launch (a collection of
op names prices only those so). The dtype of an op is its
first floating-point operand's (its result's when it has none); a dtype the device file has no
peak for is priced at the nearest one it has (``peak_for``).

Collectives are priced with the alpha-beta model of the algorithm a library picks, where
``alpha`` is the latency and ``beta`` the bandwidth (times ``network``) of the slowest link
the group crosses (``Cluster.link``: NVLink inside a node, the network once the group spans
nodes), ``n`` the group size and ``S`` the bytes of the larger of operand and result:

- all_reduce: the faster of a ring, ``2(n-1) alpha + 2 (n-1)/n S / beta``, and a double
  binary tree, ``2 log2(n) alpha + 2 S / beta`` (NCCL's two algorithms);
- all_gather, reduce_scatter, all_to_all: ``(n-1) alpha + (n-1)/n S / beta``;
- broadcast: ``log2(n) alpha + S / beta`` (pipelined);
- ring_shift: ``alpha + S / beta`` (each rank sends its value to one neighbour, all at once);
- send/recv: ``alpha + S / beta`` over the link between the two ranks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Collection, Sequence

from ..ir.graph import Node
from ..ir.types import TensorType
from ..ops.kinds import ATTENTION_OPS, COLLECTIVE_OPS, FREE_OPS, GEMM_OPS, P2P_OPS, VIEW_OPS
from ..ops.registry import OPS, Cost
from .eager import eager_kernels, eager_ops
from .hardware import Cluster, ClusterError, Link

# The op groups priced alike (gemm, attention, views, collectives, free) live beside the op
# records, in partita/ops/kinds.py.

# partita dtype name -> the peak FLOP/s entry of a device file it runs at.
_PEAK_OF = {"f64": "f64", "f32": "f32", "bf16": "bf16", "f16": "f16", "f8e4m3fn": "f8", "f8e5m2": "f8",
            "f8e4m3fnuz": "f8", "f8e5m2fnuz": "f8", "i8": "i8", "u8": "i8"}
_FALLBACK = ("f32", "tf32", "bf16", "f16", "f64")
# Ops that stream their bytes with little arithmetic a byte (the optimizer's updates, the
# gradient bucket's concat and split): priced at ``Efficiency.stream`` where the file gives it.
STREAM_OPS = frozenset({"adamw_update", "sgd_update", "concat", "split"})


@dataclass(frozen=True)
class OpTime:
    """The priced time of one op: ``seconds`` in all, of which ``kind`` says what bound it
    (``gemm``, ``attention``, ``memory``, ``compute``, ``view``, ``collective``, ``p2p``)."""

    seconds: float
    kind: str
    flops: int = 0
    bytes: int = 0


class CostModel:
    """Prices the ops of per-rank programs on ``cluster``'s devices and links."""

    def __init__(self, cluster: Cluster, fusion: str | Collection[str] = "fused",
                 groups: bool = False) -> None:
        try:
            self.eager_ops = eager_ops(fusion)
        except ValueError as e:
            raise ClusterError(f"CostModel: {e}") from None
        if not isinstance(groups, bool):
            raise ClusterError(f"CostModel: groups={groups!r}; give True or False")
        self.cluster = cluster
        self.device = cluster.device
        self.eff = cluster.efficiency
        self._peaks: dict[str, float] = {}
        # Elementwise chains priced as the fusion pass groups them (fused_groups.py), when asked.
        self.groups = groups
        self.group_cache: dict[int, tuple[object, dict]] = {}   # id(graph) -> (graph, node -> OpTime)
        self.groupings = 0                                      # graphs grouped so far

    # --- compute ------------------------------------------------------------------------------
    def peak_for(self, dtype_name: str) -> float:
        """Peak dense FLOP/s for a partita dtype: its own entry, else the nearest one listed
        (f32, then tf32, bf16, f16, f64)."""
        got = self._peaks.get(dtype_name)
        if got is not None:
            return got
        peaks = self.device.peak_flops
        want = _PEAK_OF.get(dtype_name, "f32")
        for name in (want, *_FALLBACK):
            if name in peaks:
                self._peaks[dtype_name] = peaks[name]
                return peaks[name]
        raise ClusterError(f"device '{self.device.name}' lists no peak FLOP/s; give [device.peak_flops]")

    def record_cost(self, node: Node) -> Cost:
        """The op record's FLOPs and bytes of ``node``."""
        return OPS[node.op].cost_of([v.type for v in node.operands], [v.type for v in node.results], node.attrs)

    def compute_time(self, node: Node) -> OpTime:
        """Seconds one compute op takes on one device."""
        op = node.op
        if op in VIEW_OPS or op in FREE_OPS or operand_transpose(node):
            return OpTime(0.0, "view")
        c = self.record_cost(node)
        moved = c.bytes_read + c.bytes_written
        dtype = _dtype_of(node)
        if op in GEMM_OPS:
            e = self.eff.gemm * _shape_factor(node, self.eff.gemm_knee)
            t = c.flops / (self.peak_for(dtype) * e)
            kind = "gemm"
        elif op in ATTENTION_OPS:
            t = c.flops / (self.peak_for(dtype) * self.eff.attention)
            kind = "attention"
        elif op in self.eager_ops and (kernels := eager_kernels(node)) is not None:
            # eager PyTorch's chain of kernels for this fused op (eager.py), each its own pass
            t = sum(b for b in kernels) / (self.device.memory_bandwidth * self.eff.memory)
            t += (len(kernels) - 1) * self.eff.op_overhead
            return OpTime(t + self.eff.op_overhead, "memory", c.flops, int(sum(kernels)))
        else:
            t, kind = self.roofline(moved, c.flops, op)
        return OpTime(t + self.eff.op_overhead, kind, c.flops, moved)

    def roofline(self, moved: float, flops: float, op: str) -> tuple[float, str]:
        """A memory-bound kernel's seconds (without its launch) and what bound it: ``max(moved /
        (bandwidth * memory_efficiency(op)), flops / peak(f32))``, the cache's bandwidth where
        the bytes fit in it."""
        d = self.device
        bw = d.cache_bandwidth if d.cache is not None and d.cache_bandwidth is not None and moved <= d.cache \
            else d.memory_bandwidth
        tm = moved / (bw * self.memory_efficiency(op))
        tc = flops / self.peak_for("f32")
        return (tm, "memory") if tm >= tc else (tc, "compute")

    def memory_efficiency(self, op: str) -> float:
        """The fraction of the memory bandwidth ``op`` reaches: ``stream`` for the streaming ops
        (``STREAM_OPS``) where the cluster file gives it, else ``memory``."""
        stream = self.eff.stream
        return stream if stream is not None and op in STREAM_OPS else self.eff.memory

    def sum_in_gemm(self, gemm: Node, ty: TensorType) -> OpTime:
        """What adding ``gemm``'s product to a running sum of type ``ty`` costs when the
        matrix product does it in its epilogue (beta = 1: it reads the sum and writes it back
        in place of writing its product), over the product alone: the roofline of the fused
        kernel, ``max(t_gemm, (its bytes + the sum read) / (bandwidth * memory))``, less
        ``t_gemm``; no launch of its own. Zero wherever the product is compute-bound."""
        if gemm.op not in GEMM_OPS:
            raise ValueError(f"sum_in_gemm: {gemm.op} is not a matrix product (GEMM_OPS); price its sum as an add")
        own = self.compute_time(gemm).seconds - self.eff.op_overhead
        c = self.record_cost(gemm)
        fused = (c.bytes_read + c.bytes_written + ty.nbytes) / (self.device.memory_bandwidth * self.eff.memory)
        return OpTime(max(0.0, fused - own), "gemm", ty.numel, ty.nbytes)

    # --- communication ------------------------------------------------------------------------
    def collective_time(self, node: Node, ranks: Sequence[int]) -> OpTime:
        """Seconds a collective takes over the group ``ranks`` (global ranks of the cluster);
        for send/recv, ``ranks`` is the pair (this rank, its peer)."""
        op = node.op
        link = self.cluster.link(list(ranks))
        n = len(ranks)
        if op in P2P_OPS:
            t = node.operands[0].type if op == "send" else node.results[0].type
            return OpTime(self.transfer(link, t.nbytes), "p2p", 0, t.nbytes)
        ins = [v.type for v in node.operands]
        outs = [v.type for v in node.results]
        size = max(t.nbytes for t in ins + outs) if ins or outs else 0
        return OpTime(self.collective(op, size, n, link), "collective", 0, size)

    def _measured(self, op: str, nbytes: float, n: int, link: Link) -> float | None:
        """``op`` on ``n`` ranks from the times measured for it (``Link.measured``): log-log
        interpolation between the measured sizes (below the smallest: its time; above the
        largest: the last two points' slope in bytes), scaled by the alpha-beta model's ratio
        of n ranks to the measured ranks. None where nothing was measured."""
        got = link.measured_for(op)
        if got is None:
            return None
        n0, pts = got
        if nbytes <= pts[0][0]:
            t = pts[0][1]
        elif nbytes >= pts[-1][0]:
            (x0, t0), (x1, t1) = pts[-2] if len(pts) > 1 else pts[-1], pts[-1]
            slope = (t1 - t0) / (x1 - x0) if x1 > x0 else 0.0
            t = t1 + max(slope, 0.0) * (nbytes - x1)
        else:
            i = next(k for k in range(1, len(pts)) if pts[k][0] >= nbytes)
            (x0, t0), (x1, t1) = pts[i - 1], pts[i]
            f = (math.log(nbytes) - math.log(x0)) / (math.log(x1) - math.log(x0))
            t = math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
        if n != n0 and op not in ("send", "recv", "send_recv"):
            t *= self._formula(op, nbytes, n, link) / self._formula(op, nbytes, n0, link)
        return t

    def transfer(self, link: Link, nbytes: float) -> float:
        """One point-to-point transfer of ``nbytes`` over ``link``."""
        got = self._measured("send_recv", nbytes, 2, link)
        if got is not None:
            return got
        own = link.for_op("send_recv")
        a, bw = own if own is not None else (link.latency, link.bandwidth)
        return a + nbytes / (bw * self.eff.network)

    def collective(self, op: str, nbytes: float, n: int, link: Link) -> float:
        """Seconds of collective ``op`` on a buffer of ``nbytes`` over ``n`` ranks joined by
        ``link``: from its measured times where the link has them, else the formulas of the
        module docstring."""
        if n <= 1:
            return 0.0
        got = self._measured(op, nbytes, n, link)
        if got is not None:
            return got
        return self._formula(op, nbytes, n, link)

    def _formula(self, op: str, nbytes: float, n: int, link: Link) -> float:
        own = link.for_op(op)
        if own is not None:
            # Figures measured for this collective, fitted to the ring's formula (calibrate).
            a, b = own[0], own[1] * self.eff.network
            if op == "all_reduce":
                return 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / b
        else:
            a, b = link.latency, link.bandwidth * self.eff.network
        if op == "all_reduce":
            ring = 2 * (n - 1) * a + 2 * (n - 1) / n * nbytes / b
            tree = 2 * math.log2(n) * a + 2 * nbytes / b
            return min(ring, tree)
        if op in ("all_gather", "reduce_scatter", "all_to_all"):
            return (n - 1) * a + (n - 1) / n * nbytes / b
        if op == "broadcast":
            return math.log2(n) * a + nbytes / b
        if op == "ring_shift":
            return a + nbytes / b
        raise ClusterError(f"the cost model has no formula for the collective '{op}'")


# The products that read an operand transposed in its last two dims without a copy.
MATMUL_OPS = frozenset({"matmul", "linear_pointwise"})


def operand_transpose(node: Node) -> bool:
    """Whether ``node`` is a transpose of its last two dims (the others in place) whose every
    reader is a matrix product (``MATMUL_OPS``), and no graph output: the product reads the
    operand transposed, so no copy is made. (The price of alike nodes is cached by their
    signature; ``price_key`` tells such a transpose from a copying one.)"""
    if node.op != "transpose":
        return False
    perm = list(node.attrs.get("perm") or ())
    r = len(perm)
    if r < 2 or perm != list(range(r - 2)) + [r - 1, r - 2]:
        return False
    res = node.results[0]
    users = res.users
    return bool(users) and not res.is_output and all(u.op in MATMUL_OPS for u in users)


def price_key(node: Node) -> tuple:
    """What a compute op's price depends on: op, operand and result types, attributes, and
    for a transpose whether a matrix product reads it in place (``operand_transpose``)."""
    from .steps import attr_key

    key = (node.op, tuple((v.type.shape, v.type.dtype.name) for v in node.operands),
           tuple((v.type.shape, v.type.dtype.name) for v in node.results), attr_key(node.attrs))
    return key + (operand_transpose(node),) if node.op == "transpose" else key


def _dtype_of(node: Node) -> str:
    for v in node.operands:
        if v.type.dtype.is_float:
            return v.type.dtype.name
    for v in node.results:
        return v.type.dtype.name
    return "f32"


def _shape_factor(node: Node, knee: float) -> float:
    """prod(d / (d + knee)) over a GEMM's m, n and k (convolutions: output pixels x batch,
    output channels, and the reduction over input channels x kernel)."""
    op = node.op
    if op in ("matmul", "matmul_integer", "linear_pointwise"):
        a, b = node.operands[0].type.shape, node.operands[1].type.shape
        k = a[-1] if a else 1
        n = b[-1] if len(b) >= 2 else 1
        # A weight (rank-2 rhs) sees every leading dim of the lhs as rows.
        m = math.prod(a[:-1]) if len(b) <= 2 else (a[-2] if len(a) >= 2 else 1)
    else:
        out = node.results[0].type.shape
        w = node.operands[1].type.shape if len(node.operands) > 1 else out
        m = math.prod(out) // max(out[1], 1) if len(out) > 1 else 1
        n = out[1] if len(out) > 1 else 1
        k = math.prod(w[1:]) if len(w) > 1 else 1
    f = 1.0
    for d in (m, n, k):
        f *= d / (d + knee)
    return f
