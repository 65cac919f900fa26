"""The epilogues a library kernel can fuse after its main op (an activation, an add), and
where the two library ops keep their operands (the epilogue's ``other`` among them). Their
ATen forms are in aten_fallback.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Unary:
    """A unary epilogue: the partita op (and attributes) it stands for, and oneDNN's post-op
    (with its ``scalars``). An epilogue that is no one op (``op`` empty) stands for ``steps``:
    binary ops by a scalar, applied in order (ReLU6: maximum by 0, then minimum by 6), the
    scalar "x" standing for the epilogue's input (hardswish's product)."""

    op: str
    attrs: dict = field(default_factory=dict)
    onednn: str = ""
    algorithm: str | None = None
    steps: tuple = ()
    scalars: tuple = ()


@dataclass(frozen=True)
class Binary:
    """A binary epilogue: the partita op it stands for and oneDNN's binary post-op."""

    op: str
    onednn: str


# The epilogues the ops can express. "none" is no epilogue. oneDNN names SiLU "swish" and
# takes GELU's form as its algorithm ("none": erf, "tanh").
UNARY: dict[str, Unary | None] = {
    "none": None,
    "relu": Unary("relu", {}, "relu"),
    "gelu": Unary("gelu", {"approximate": "none"}, "gelu", "none"),
    "gelu_tanh": Unary("gelu", {"approximate": "tanh"}, "gelu", "tanh"),
    "silu": Unary("silu", {}, "swish"),
    "sigmoid": Unary("sigmoid", {}, "sigmoid"),
    "tanh": Unary("tanh", {}, "tanh"),
}
# The epilogues written as a chain of ops by scalars, convolutions only: ReLU6 (nn.ReLU6,
# F.hardtanh(x, 0, 6)), as the importers write it: maximum(x, 0), then minimum(., 6); oneDNN's
# hardtanh post-op with its bounds as scalars.
CLAMPS: dict[str, Unary] = {
    "relu6": Unary("", {}, "hardtanh", steps=(("maximum", 0.0), ("minimum", 6.0)), scalars=(0.0, 6.0)),
    # hardswish (nn.Hardswish) as torch.export decomposes it: x * min(max(x + 3, 0), 6) / 6
    "hardswish": Unary("", {}, "hardswish", steps=(("add", 3.0), ("maximum", 0.0), ("minimum", 6.0), ("mul", "x"),
                                                   ("div", 6.0))),
}
# Every unary epilogue of conv2d_pointwise.
CONV_UNARY: dict[str, Unary | None] = {**UNARY, **CLAMPS}
BINARY: dict[str, Binary | None] = {
    "none": None,
    "add": Binary("add", "add"),
}


# --- the operands of the two ops -----------------------------------------------------------

# conv2d_pointwise's attributes that are conv2d's.
CONV_ATTRS = ("stride", "padding", "dilation", "groups")


def conv_padding_end(attrs: dict) -> list | None:
    """A ``conv2d_pointwise`` node's zeros after each spatial dim (bottom, right) where they
    differ from ``padding``'s before (top, left), else None (the padding is symmetric)."""
    end = attrs.get("padding_end")
    if end is None or list(end) == list(attrs["padding"]):
        return None
    return list(end)


def conv_parts(args: list, attrs: dict) -> tuple[Any, Any, Any, Any]:
    """(x, weight, bias or None, other or None) of a conv2d_pointwise node's operands."""
    has_other = attrs["binary"] != "none"
    other = args[-1] if has_other else None
    rest = args[:-1] if has_other else args
    return rest[0], rest[1], (rest[2] if len(rest) > 2 else None), other


def linear_parts(args: list, attrs: dict) -> tuple[Any, Any, Any]:
    """(x, weight, bias or None) of a linear_pointwise node's operands."""
    return args[0], args[1], (args[2] if len(args) > 2 else None)
