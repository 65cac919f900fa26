"""A grouped convolution (``1 < groups < channels``) as one generated direct convolution per
group (codegen/conv.py), on the input copied once into group-major order.

conv.py runs a grouped convolution as the dense one of its block-diagonal weight: every zero
between the groups is multiplied too, ``groups`` times the work. On few channels a group
(RegNet's 8) that is still the fastest, but on wider groups it loses to the library: HuBERT's
and wav2vec2's positional convolution (x 4 x 64 x 1 x 31, w 64 x 16 x 1 x 8, 4 groups) took
208 us on oneDNN and 233 on the block-diagonal kernel. Here each group runs the direct kernel
on its own ``C / groups`` channels, reading a group-major copy of the input
(``[groups, N, H, W, C / groups]``, one strided copy) and writing a group-major result that one
more copy puts back in channels-last order: 42 us on that shape against 107 for ATen's
``conv2d`` timed beside it (one thread, loaded machine, interleaved medians).

``PreparedGroupedConv`` has ``conv.PreparedConv``'s interface (``pack(w)`` once, then
``__call__(x, packed, bias, other, out)``); it is a candidate of the measured kernel choice
(codegen/choose.py), never the rules' pick, for groups of at least ``MIN_GROUP_CHANNELS``
input channels (narrower ones keep the block-diagonal kernel) and no residual operand.
"""

from __future__ import annotations

from typing import Any

from ..ops._lazy import torch
from .conv import PreparedConv, conv_dims
from .conv import supported as direct_supported

__all__ = ["MIN_GROUP_CHANNELS", "supported", "PreparedGroupedConv", "prepare"]

# A group narrower than this runs as the block-diagonal dense convolution (conv.py): on RegNet's
# 8-channel groups its wasted multiplies cost less than the two copies here.
MIN_GROUP_CHANNELS = 16


def supported(x_shape: tuple, w_shape: tuple, stride: list, padding: list, dilation: list, groups: int,
              other: bool = False) -> str:
    """Why the per-group kernel does not take these, or "" where it does."""
    if len(x_shape) != 4 or len(w_shape) != 4:
        return "not a 2-d convolution"
    c, co = x_shape[1], w_shape[0]
    if groups <= 1 or groups >= c:
        return f"groups={groups} on {c} channels (the per-group kernel takes 1 < groups < channels)"
    if c % groups or co % groups or w_shape[1] * groups != c:
        return f"{c} input and {co} output channels do not split into {groups} groups"
    if c // groups < MIN_GROUP_CHANNELS:
        return (f"{c // groups} channels a group (under {MIN_GROUP_CHANNELS}: the block-diagonal "
                f"kernel of codegen/conv.py takes it)")
    if other:
        return "a residual operand (the per-group kernel applies bias and activation only)"
    xg = (x_shape[0], c // groups, x_shape[2], x_shape[3])
    wg = (co // groups, w_shape[1], w_shape[2], w_shape[3])
    return direct_supported(xg, wg, stride, padding, dilation, 1, candidate=True)


class PreparedGroupedConv:
    """One node's grouped convolution: a ``PreparedConv`` per group over the group-major copy
    of the input, the results copied back into channels-last order. One call at a time (the
    group-major buffers are reused)."""

    def __init__(self, x_shape: tuple, w_shape: tuple, stride: list, padding: list, groups: int,
                 act: str = "none", padding_end: list | None = None) -> None:
        n, c, h, w = x_shape
        co = w_shape[0]
        self.groups, self.cg, self.cog = groups, c // groups, co // groups
        xg_shape = (n, self.cg, h, w)
        wg_shape = (self.cog, w_shape[1], w_shape[2], w_shape[3])
        self.convs = [PreparedConv(xg_shape, wg_shape, stride, padding, act, False, padding_end=padding_end)
                      for _ in range(groups)]
        dims = conv_dims(x_shape, (co, c, w_shape[2], w_shape[3]), stride, padding, padding_end)
        self.ho, self.wo = dims["ho"], dims["wo"]
        self.shape = (n, co, self.ho, self.wo)
        self.in_shape = (n, c, h, w)
        self.xg = torch.empty((groups, n, h, w, self.cg), dtype=torch.float32)
        self.yg = torch.empty((groups, n, self.ho, self.wo, self.cog), dtype=torch.float32)
        self.x_views = [self.xg[g].permute(0, 3, 1, 2) for g in range(groups)]
        self.y_views = [self.yg[g].permute(0, 3, 1, 2) for g in range(groups)]
        self.y_source = self.yg.permute(1, 2, 3, 0, 4)
        self.packed_sizes: list[int] = []
        self.bias_views: tuple[Any, list[Any]] | None = None   # (bias, its per-group slices)
        self.out_view: tuple[Any, Any] | None = None           # (out, its group-split view)
        self.packed_views: tuple[Any, list[Any]] | None = None  # (packed, its per-group slices)

    def pack(self, w: Any) -> Any:
        """Every group's packed weight, one after the other in one flat tensor."""
        parts = [conv.pack(w[g * self.cog:(g + 1) * self.cog].contiguous()).reshape(-1)
                 for g, conv in enumerate(self.convs)]
        self.packed_sizes = [int(p.numel()) for p in parts]
        return torch.cat(parts)

    def _biases(self, bias: Any) -> list[Any]:
        """The per-group slices of ``bias`` (kept while the same tensor comes back)."""
        kept = self.bias_views
        if kept is not None and kept[0] is bias:
            return kept[1]
        bias = bias.contiguous()
        views = [bias[g * self.cog:(g + 1) * self.cog] for g in range(self.groups)]
        self.bias_views = (bias, views)
        return views

    def _weights(self, packed: Any) -> list[Any]:
        """The per-group slices of the packed weight (the same objects while it comes back, so
        each group's kernel finds its bound call)."""
        kept = self.packed_views
        if kept is not None and kept[0] is packed:
            return kept[1]
        views, offset = [], 0
        for size in self.packed_sizes:
            views.append(packed[offset:offset + size])
            offset += size
        self.packed_views = (packed, views)
        return views

    def _target(self, out: Any) -> tuple[Any, Any]:
        """The result tensor (``out`` where given) and its view split into groups."""
        kept = self.out_view
        if out is not None and kept is not None and kept[0] is out:
            return out, kept[1]
        n, co, ho, wo = self.shape
        y = torch.empty(self.shape, dtype=torch.float32, memory_format=torch.channels_last) if out is None else out
        view = y.permute(0, 2, 3, 1).view(n, ho, wo, self.groups, self.cog)
        if out is not None:
            self.out_view = (out, view)
        return y, view

    def __call__(self, x: Any, packed: Any, bias: Any = None, other: Any = None, out: Any = None) -> Any:
        if other is not None:
            raise ValueError("PreparedGroupedConv: a residual operand is not taken (supported() refuses it)")
        n, c, h, w = self.in_shape
        self.xg.copy_(x.permute(0, 2, 3, 1).reshape(n, h, w, self.groups, self.cg).permute(3, 0, 1, 2, 4))
        biases = self._biases(bias) if bias is not None else [None] * self.groups
        weights = self._weights(packed)
        for g, conv in enumerate(self.convs):
            conv(self.x_views[g], weights[g], biases[g], None, self.y_views[g])
        y, view = self._target(out)
        view.copy_(self.y_source)
        return y


def prepare(x_shape: tuple, w_shape: tuple, attrs: dict, unary: str, other: bool,
            padding_end: list | None = None) -> PreparedGroupedConv | None:
    """The per-group kernel prepared for a ``conv2d_pointwise`` node's shapes and attributes,
    or None where it does not take them (``supported``)."""
    if supported(x_shape, w_shape, attrs["stride"], attrs["padding"], attrs["dilation"], attrs["groups"], other):
        return None
    return PreparedGroupedConv(x_shape, w_shape, list(attrs["stride"]), list(attrs["padding"]), attrs["groups"],
                               unary, padding_end)
