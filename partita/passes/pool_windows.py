"""An average pool whose windows tile its input exactly, as a reshape and a mean (issue 37).

Funnel Transformer pools its queries in pairs: ``avg_pool2d`` of a ``(2, 1)`` window with
stride ``(2, 1)`` over ``[N, 1, T, D]``. Each window there takes its own ``k`` elements of an
axis, side by side, none left over and none padded, so the pool is a mean over a new axis of
size ``k``:

    avg_pool2d(x: [N, C, H, W]) {kernel=[kh, kw], stride=[kh, kw]}
      = reshape(mean(reshape(x, [N, C, H/kh, kh, W/kw, kw]), axes=[3, 5]), [N, C, H/kh, W/kw])

(a window of 1 along an axis leaves that axis as it is). The reshapes are views and the mean
is one library reduction; the pool's step, which works its geometry out again at every call,
took 19.5 us of Funnel's call against 6 for the mean (one thread, loaded machine). Only
windows longer than 1 along a single axis are taken: a mean over two axes apart in the view (a
2 x 2 window) is a strided reduction not measured against the pool's kernel, so those stay
pools.

``pool_as_window_mean`` is a canonicalize rule's replacement (passes/canonicalize.py): it
applies where stride equals kernel, padding 0, dilation 1, the window longer than 1 along one
axis only and every spatial size a multiple of its window (then ``ceil_mode`` and ``count_include_pad`` change nothing).
"""

from __future__ import annotations

from ..ir.graph import Value
from .rewrite import Match

__all__ = ["pool_as_window_mean", "window_tiling"]


def _per_axis(value: object, nd: int, default: int) -> list[int] | None:
    """A pool attribute as ``nd`` ints (one int or a one-element list repeated), or None."""
    if value is None:
        return [default] * nd
    if isinstance(value, int):
        return [value] * nd
    vals = [int(v) for v in value]  # type: ignore[attr-defined]
    if len(vals) == 1:
        return vals * nd
    return vals if len(vals) == nd else None


def window_tiling(shape: tuple, attrs: dict) -> list[int] | None:
    """The window sizes of an average pool over ``shape`` whose windows tile every spatial axis
    exactly (stride = kernel, no padding, dilation 1, sizes divisible), else None."""
    nd = len(shape) - 2
    k = _per_axis(attrs.get("kernel"), nd, 1)
    s = k if attrs.get("stride") is None else _per_axis(attrs.get("stride"), nd, 1)
    p = _per_axis(attrs.get("padding"), nd, 0)
    d = _per_axis(attrs.get("dilation"), nd, 1)
    if k is None or s is None or p is None or d is None or nd < 1:
        return None
    if s != k or any(p) or any(v != 1 for v in d):
        return None
    spatial = shape[2:]
    if any(not isinstance(size, int) or size % ki for size, ki in zip(spatial, k)):
        return None
    if sum(ki > 1 for ki in k) != 1:
        return None      # the identity (canonicalize's pool-as-mean rule), or windows over 2+ axes
    return k


def pool_as_window_mean(m: Match) -> Value | None:
    """``avg_pool`` of exactly tiling windows as reshape, mean over the window axes, reshape."""
    x = m.root.operands[0]
    shape = tuple(x.type.shape)
    k = window_tiling(shape, m.root.attrs)
    if k is None:
        return None
    split: list[int] = list(shape[:2])
    axes: list[int] = []
    for size, ki in zip(shape[2:], k):
        split.append(size // ki)
        if ki > 1:
            split.append(ki)
            axes.append(len(split) - 1)
    out = list(m.root.results[0].type.shape)
    if out != list(shape[:2]) + [size // ki for size, ki in zip(shape[2:], k)]:
        return None
    v = m.emit("reshape", x, shape=split)
    v = m.emit("mean", v, axes=axes, keepdim=False)
    return v if list(v.type.shape) == out else m.emit("reshape", v, shape=out)
