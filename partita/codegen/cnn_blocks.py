"""Rewrites of the small CNN blocks the zoo's models are made of (docs/codegen.md, "On the zoo's
CNNs").

``pools_as_depthwise``: an ``avg_pool2d`` of an f32 NCHW value (one no channels-last op made)
becomes the depthwise library convolution of a weight of ones, divided by each window's count
(a constant [1, 1, Ho, Wo]): the sum and the division of the op's reference. ATen's average pool
on NCHW memory is slow on the zoo's small maps (PoolFormer's 3 x 3 pool of 4 x 16 x 8 x 8: 118
us against 9 us on channels-last memory, one thread), and the depthwise convolution takes the
NCHW input in one conversion and runs the generated kernel (codegen/depthwise.py; measured
against oneDNN and ATen as every convolution is, codegen/choose.py). The ``assign-layout`` pass
runs it first (``PARTITA_POOL_AS_CONV=0`` leaves the pools as they are).

``global_pools_flattened``: a global average pool kept as [N, C, 1, 1] (``mean`` over H and W
with keepdim) whose one reader is a ``reshape`` to [N, C] (the flatten before a classifier)
becomes the mean without keepdim: the same values in the same order, one step fewer (the
generated pool of codegen/pool.py writes [N, C] either way). ``CompiledProgram`` runs it after ``assign-layout``.

``head_linear``: a linear layer of at most ``HEAD_MAX_ROWS`` rows (a classifier's head) below the
measured band of ``library.LINEAR_CANDIDATE_MIN_FLOPS`` is a candidate of the generated GEMM too,
the GEMM the default: standalone the two are within a microsecond, but in the program, after the
convolutions, ATen's addmm runs cold (ResNet's [4, 64] x [64, 10]: 14 to 21 us a step in
zoo_profile against 4 us standalone), and the whole program ran 0.97 of its time with the GEMM
(ResNet and MobileNetV2, interleaved).
"""

from __future__ import annotations

import os

import numpy as np

from ..ir.attrs import DenseAttr
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node
from ..ir.types import TensorType
from ..ops.registry import OPS

__all__ = ["POOL_AS_CONV", "global_pools_flattened", "pools_as_depthwise", "window_counts", "HEAD_MAX_ROWS",
           "head_linear"]

# The most rows a linear layer below the measured band may have to be a generated GEMM candidate.
HEAD_MAX_ROWS = 64

# Whether assign-layout rewrites NCHW average pools as depthwise convolutions (read when it runs).
POOL_AS_CONV = os.environ.get("PARTITA_POOL_AS_CONV", "1") != "0"

# The ops whose results are channels-last memory already: a pool of them stays a pool.
_CHANNELS_LAST_MAKERS = ("conv2d_pointwise", "max_pool2d", "avg_pool2d", "batch_norm")


def window_counts(size: tuple[int, ...], out: tuple[int, ...], k: tuple[int, ...], s: tuple[int, ...],
                  p: tuple[int, ...], include_pad: bool) -> np.ndarray:
    """Each output position's divisor [Ho, Wo] of an average pool (ceil_mode off, dilation 1):
    the window's taps inside the padded input with ``include_pad``, else inside the input."""
    per_dim = []
    for n, o, ki, si, pi in zip(size, out, k, s, p):
        pos = (np.arange(o) * si - pi)[:, None] + np.arange(ki)[None, :]
        lo, hi = (-pi, n + pi) if include_pad else (0, n)
        per_dim.append(np.maximum(np.count_nonzero((pos >= lo) & (pos < hi), axis=1), 1))
    return np.multiply.outer(per_dim[0], per_dim[1]).astype(np.float32)


def _takes(n: Node) -> bool:
    """Whether ``n`` is an average pool the rewrite takes (see the module doc)."""
    from .depthwise import supported

    if n.op != "avg_pool2d" or len(n.results) != 1:
        return False
    x, a = n.operands[0], n.attrs
    if x.type.dtype is not f32 or n.results[0].type.dtype is not f32 or x.type.rank != 4:
        return False
    if a["ceil_mode"] or any(d != 1 for d in a["dilation"]):
        return False
    if x.producer is not None and x.producer.op in _CHANNELS_LAST_MAKERS:
        return False  # channels-last memory: ATen's pool is fast there
    if any(not isinstance(d, int) for d in x.type.shape):
        return False
    c = x.type.shape[1]
    k = list(a["kernel"])
    s = k if a["stride"] is None else list(a["stride"])
    return supported(tuple(x.type.shape), (c, 1, *k), s, list(a["padding"]), [1, 1], c) == ""


def pools_as_depthwise(graph: Graph) -> int:
    """Rewrite ``graph``'s NCHW average pools in place (module doc); how many."""
    done = 0
    for n in list(graph.nodes):
        if n.graph is not graph or not _takes(n):
            continue
        x, a, r = n.operands[0], n.attrs, n.results[0]
        c = x.type.shape[1]
        k = tuple(a["kernel"])
        s = k if a["stride"] is None else tuple(a["stride"])
        p = tuple(a["padding"])
        out = tuple(r.type.shape[2:])
        counts = window_counts(tuple(x.type.shape[2:]), out, k, s, p, bool(a["count_include_pad"]))
        ones = Node("constant", [], {"value": DenseAttr(np.ones((c, 1) + k, np.float32))},
                    [TensorType((c, 1) + k, f32)], n.loc)
        attrs = OPS["conv2d_pointwise"].normalize_attrs({"stride": s, "padding": p, "dilation": (1, 1), "groups": c,
                                                         "binary": "none", "unary": "none"})
        conv = Node("conv2d_pointwise", [x, ones.results[0]], attrs, [r.type], n.loc)
        div = Node("constant", [], {"value": DenseAttr(counts.reshape((1, 1) + out))},
                   [TensorType((1, 1) + out, f32)], n.loc)
        avg = Node("div", [conv.results[0], div.results[0]], {}, [r.type], n.loc)
        for m in (ones, conv, div, avg):
            graph.insert_before(n, m)
        graph.replace_all_uses(r, avg.results[0])
        graph.erase(n)
        done += 1
    return done


def global_pools_flattened(graph: Graph) -> int:
    """Fold each ``reshape`` to [N, C] of a keepdim global mean [N, C, 1, 1] (its one reader)
    into the mean (module doc); how many."""
    from ..passes.rewrite import sole_user
    from .pool import global_mean_axes

    done = 0
    for n in list(graph.nodes):
        if n.graph is not graph or len(n.results) != 1 or not global_mean_axes(n) or not n.attrs["keepdim"]:
            continue
        r = n.results[0]
        user = sole_user(r)
        shape = tuple(r.type.shape)
        if user is None or user.op != "reshape" or len(user.results) != 1 or user.operands[0] is not r:
            continue
        flat = user.results[0]
        if tuple(flat.type.shape) != shape[:2] or flat.type.dtype is not r.type.dtype:
            continue
        attrs = OPS["mean"].normalize_attrs({"axes": tuple(n.attrs["axes"]), "keepdim": False})
        mean = Node("mean", [n.operands[0]], attrs, [flat.type], n.loc)
        graph.insert_before(user, mean)
        graph.replace_all_uses(flat, mean.results[0])
        graph.erase(user)
        graph.erase(n)
        done += 1
    return done


def head_linear(node: Node) -> bool:
    """Whether ``node`` is a ``linear_pointwise`` of at most ``HEAD_MAX_ROWS`` rows (module doc)."""
    if node.op != "linear_pointwise":
        return False
    shape = node.operands[0].type.shape
    return all(isinstance(d, int) for d in shape) and int(np.prod(shape[:-1])) <= HEAD_MAX_ROWS
