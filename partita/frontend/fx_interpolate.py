"""``F.interpolate`` kept whole through AOTAutograd, as torch.export keeps it (issue 37).

Under AOTAutograd torch's Python kernels for ``upsample_bilinear2d`` and ``upsample_nearest2d``
(registered at the CompositeImplicitAutograd and Autograd keys, which a decomposition table
cannot override) break an interpolation into ``iota``, ``where``, index gathers and arithmetic:
MobileViT's two bilinear resizes became 8 ``index_select`` and 18 reshapes and transposes in the
backend's program, where the import path (torch.export keeps ``upsample_bilinear2d.vec``) has two
products with constant interpolation matrices.

``keep_interpolations(gm)`` therefore points dynamo's graph's 4-D bilinear and nearest
``F.interpolate`` calls at the custom op ``partita::interpolate`` while AOTAutograd traces an
inference graph (a custom op is never decomposed); ``convert_interpolate`` converts that op with
the torch.export converters of ``upsample_bilinear2d.vec`` / ``upsample_nearest2d.vec``, so the
backend's program has the import path's steps. The op's own kernel is ``F.interpolate`` itself.
Training graphs are left alone (the op has no autograd formula)."""

from __future__ import annotations

import contextlib
import inspect
import math
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from ..ir.graph import Value
from .torch_export import ATEN_TO_PARTITA, AtenConverter, Unsupported

aten = torch.ops.aten

__all__ = ["INTERPOLATE_OP", "convert_interpolate", "keep_interpolations", "interpolation_args"]

INTERPOLATE_OP = "partita::interpolate"
_MODES = ("bilinear", "nearest")
_SIGNATURE = inspect.signature(F.interpolate)


@torch.library.custom_op(INTERPOLATE_OP, mutates_args=())
def interpolate(x: torch.Tensor, size: list[int] | None, scale_factor: list[float] | None, mode: str,
                align_corners: bool | None, recompute_scale_factor: bool | None) -> torch.Tensor:
    """``F.interpolate`` of a 4-D tensor, bilinear or nearest, kept as one op while traced."""
    return F.interpolate(x, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners,
                         recompute_scale_factor=recompute_scale_factor).contiguous()


@interpolate.register_fake
def _interpolate_fake(x: torch.Tensor, size: list[int] | None, scale_factor: list[float] | None, mode: str,
                      align_corners: bool | None, recompute_scale_factor: bool | None) -> torch.Tensor:
    out, _ = upsample_args(tuple(x.shape[2:]), size, scale_factor, recompute_scale_factor)
    assert out is not None
    return x.new_empty((*x.shape[:2], *out))


def upsample_args(spatial: tuple[int, ...], size: list[int] | None, scale_factor: list[float] | None,
                  recompute_scale_factor: bool | None) -> tuple[list[int] | None, list[float] | None]:
    """(output_size, scale_factors) as ``F.interpolate`` hands them to the upsample kernel; the
    output size is always filled in for a caller that needs the shape."""
    if size is not None:
        return [int(s) for s in size], None
    if scale_factor is None:
        raise Unsupported("interpolate without a size or a scale factor")
    out = [int(math.floor(float(n) * float(s))) for n, s in zip(spatial, scale_factor)]
    if recompute_scale_factor:
        return out, None
    return out, [float(s) for s in scale_factor]


def interpolation_args(node: Any) -> dict[str, Any] | None:
    """The custom op's arguments for a dynamo graph node calling ``F.interpolate``, or None
    where the call is not one it takes (another mode or rank, antialias, a size or scale that
    is not a plain number)."""
    if node.op != "call_function" or node.target is not F.interpolate:
        return None
    try:
        bound = _SIGNATURE.bind(*node.args, **node.kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    a = bound.arguments
    val = getattr(a["input"], "meta", {}).get("example_value")
    if a["mode"] not in _MODES or a["antialias"] or not isinstance(val, torch.Tensor) or val.dim() != 4:
        return None
    size, scale = a["size"], a["scale_factor"]
    if size is not None:
        size = list(size) if isinstance(size, (list, tuple)) else [size, size]
        if len(size) != 2 or not all(type(s) is int for s in size):
            return None
    if scale is not None:
        scale = list(scale) if isinstance(scale, (list, tuple)) else [scale, scale]
        if len(scale) != 2 or not all(type(s) in (int, float) for s in scale):
            return None
        scale = [float(s) for s in scale]
    if (size is None) == (scale is None):
        return None
    align, recompute = a["align_corners"], a["recompute_scale_factor"]
    if not all(v is None or type(v) is bool for v in (align, recompute)):
        return None
    return {"size": size, "scale_factor": scale, "mode": a["mode"], "align_corners": align,
            "recompute_scale_factor": recompute}


@contextlib.contextmanager
def keep_interpolations(gm: Any) -> Iterator[int]:
    """Within the block, dynamo's graph ``gm`` calls ``partita::interpolate`` for each
    ``F.interpolate`` it takes (yields how many); afterwards ``gm`` is as it was."""
    changed: list[tuple[Any, Any, tuple, dict]] = []
    for node in gm.graph.nodes:
        taken = interpolation_args(node)
        if taken is None:
            continue
        x = node.args[0] if node.args else node.kwargs["input"]
        changed.append((node, node.target, node.args, node.kwargs))
        node.target, node.args = torch.ops.partita.interpolate.default, (x,)
        node.kwargs = taken
    if changed:
        gm.recompile()
    try:
        yield len(changed)
    finally:
        if changed:
            for node, target, old_args, old_kwargs in changed:
                node.target, node.args, node.kwargs = target, old_args, old_kwargs
            gm.recompile()


def convert_interpolate(cx: AtenConverter, x: Value, size: list[int] | None, scale_factor: list[float] | None,
                        mode: str, align_corners: bool | None, recompute_scale_factor: bool | None) -> Value:
    """``partita::interpolate`` as torch.export's converters of the upsample op it calls."""
    if x.type.rank != 4 or mode not in _MODES:
        raise Unsupported(f"interpolate of mode {mode!r} on a rank-{x.type.rank} tensor")
    out, scales = upsample_args(tuple(x.type.shape[2:]), size, scale_factor, recompute_scale_factor)
    output_size = None if scales is not None else out
    if mode == "nearest":
        return ATEN_TO_PARTITA[aten.upsample_nearest2d.vec](cx, x, output_size, scales)
    return ATEN_TO_PARTITA[aten.upsample_bilinear2d.vec](cx, x, output_size, bool(align_corners), scales)
