"""What runs on ATen when no generated or library kernel can: the ops' torch forms, and the
record of fused nodes that fell back.

- ``run_body_on_aten``: a ``fused`` node's body op by op (the torch executor's program of the
  body, built once per body text). It is the ``fused`` op's torch implementation, and the step
  ``prepare_fused`` returns where the body cannot be lowered or compiled; such a node is
  recorded (``record_fallback``) and listed by ``fallbacks()`` (``partita.codegen.fallbacks``).
- ``aten_conv``, ``aten_linear`` (``ATEN``, ``aten_step``): ``conv2d_pointwise`` and
  ``linear_pointwise`` as the ops they replace, one after another: off the CPU, without oneDNN,
  for dtypes other than f32, for empty tensors, below a kernel's ``min_flops``, and for an
  epilogue pair the library has no kernel for.
- ``aten_epilogue``: a library kernel's epilogue (the binary, then the unary) by the ops' torch
  forms.
- ``op_on_aten``: an op's own torch implementation, which a generated kernel's step (attention,
  the norms, AdamW) calls for what it does not take (a tensor off the CPU, a donated view).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from ..ops._lazy import torch
from ..ops.registry import OPS
from .epilogue import BINARY, CONV_ATTRS, CONV_UNARY, conv_padding_end, conv_parts, linear_parts
from .fused_body import body_graph

__all__ = ["Fallback", "fallbacks", "record_fallback", "run_body_on_aten", "aten_conv", "pad_uneven", "aten_linear", "ATEN",
           "aten_step", "aten_epilogue", "op_on_aten"]


# --- fused nodes: the body op by op, and the record of those that fell back ---------------------

@dataclass(frozen=True)
class Fallback:
    """A fused node that runs on ATen: its kernel's name, where it is, and why."""

    kernel: str
    where: str
    reason: str


_FALLBACKS: list[Fallback] = []


def fallbacks() -> list[Fallback]:
    """The fused nodes of this process that run on ATen instead of a generated kernel, and why."""
    return list(_FALLBACKS)


def record_fallback(kernel: str, where: str, reason: str) -> Fallback:
    """Record that the fused node of kernel ``kernel`` (at ``where``) runs on ATen, and why."""
    fb = Fallback(kernel, where, reason)
    _FALLBACKS.append(fb)
    return fb


@functools.lru_cache(maxsize=1024)
def _aten_program(text: str):
    from ..backend.torch_exec import TorchProgram

    return TorchProgram(body_graph(text))


def run_body_on_aten(args, attrs):
    """The body op by op on ATen: what runs when no kernel was prepared."""
    out = _aten_program(attrs["body"])(list(args))
    return out[0] if len(out) == 1 else out


# --- library ops: the replaced ops' torch implementations, one after another ------------------

def aten_epilogue(y, binary: str, other, unary: str):
    """The epilogue ``binary`` (with ``other``) then ``unary`` applied to ``y`` by the ops' ATen forms."""
    b = BINARY[binary]
    if b is not None:
        y = OPS[b.op].torch([y, other], {})
    u = CONV_UNARY[unary]
    if u is not None and u.steps:
        x = y
        for op, c in u.steps:
            y = OPS[op].torch([y, x if c == "x" else torch.tensor(c, dtype=y.dtype)], {})
    elif u is not None:
        y = OPS[u.op].torch([y], dict(u.attrs))
    return y


def pad_uneven(x: Any, attrs: dict) -> tuple[Any, dict]:
    """For a ``conv2d_pointwise`` whose padding after differs from before (``padding_end``):
    ``x`` padded with zeros on both sides and the attributes with no padding left, which
    conv2d and oneDNN take; else ``x`` and ``attrs`` as they are."""
    end = conv_padding_end(attrs)
    if end is None:
        return x, attrs
    (pt, pl), (pb, pr) = attrs["padding"], end
    return torch.nn.functional.pad(x, (pl, pr, pt, pb)), dict(attrs, padding=(0, 0), padding_end=None)


def aten_conv(args, attrs):
    """``conv2d_pointwise`` as conv2d, then its epilogue, on ATen."""
    x, w, b, other = conv_parts(list(args), attrs)
    x, attrs = pad_uneven(x, attrs)
    y = OPS["conv2d"].torch([x, w] + ([b] if b is not None else []), {k: attrs[k] for k in CONV_ATTRS})
    return aten_epilogue(y, attrs["binary"], other, attrs["unary"])


def aten_linear(args, attrs):
    """``linear_pointwise`` as addmm (or matmul and add), then its activation, on ATen."""
    x, w, b = linear_parts(list(args), attrs)
    if attrs["weight_layout"] == "nk":
        w = w.t()
    if b is not None and x.dim() == 2:
        y = torch.addmm(b, x, w)
    else:
        y = OPS["matmul"].torch([x, w], {})
        if b is not None:
            y = OPS["add"].torch([y, b], {})
    return aten_epilogue(y, "none", None, attrs["unary"])


ATEN = {"conv2d_pointwise": aten_conv, "linear_pointwise": aten_linear}


def aten_step(op: str) -> Callable:
    """The op run as the ops it replaces, on ATen: for a device other than the CPU, a build of
    torch without oneDNN, a dtype other than f32, an empty tensor, a node below its kernel's
    ``min_flops``, or an epilogue pair the library has no kernel for."""
    return ATEN[op]


# --- ops with a generated kernel: the op's own torch implementation ---------------------------

def op_on_aten(op: str, inplace: bool = False) -> Any:
    """The torch implementation of ``op`` (its in-place one, ``inplace``): what a generated
    kernel's step calls for arguments the kernel does not take."""
    opdef = OPS[op]
    return opdef.torch_inplace if inplace else opdef.torch
