"""The epilogues a library kernel can fuse after its main op (an activation, an add), and
where the two library ops keep their operands (the epilogue's ``other`` among them). Their
ATen forms are in aten_fallback.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Unary:
    """A unary epilogue: the partita op (and attributes) it stands for, and oneDNN's post-op."""

    op: str
    attrs: dict = field(default_factory=dict)
    onednn: str = ""
    algorithm: str | None = None


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
BINARY: dict[str, Binary | None] = {
    "none": None,
    "add": Binary("add", "add"),
}


# --- the operands of the two ops -----------------------------------------------------------

# conv2d_pointwise's attributes that are conv2d's.
CONV_ATTRS = ("stride", "padding", "dilation", "groups")


def conv_parts(args: list, attrs: dict) -> tuple[Any, Any, Any, Any]:
    """(x, weight, bias or None, other or None) of a conv2d_pointwise node's operands."""
    has_other = attrs["binary"] != "none"
    other = args[-1] if has_other else None
    rest = args[:-1] if has_other else args
    return rest[0], rest[1], (rest[2] if len(rest) > 2 else None), other


def linear_parts(args: list, attrs: dict) -> tuple[Any, Any, Any]:
    """(x, weight, bias or None) of a linear_pointwise node's operands."""
    return args[0], args[1], (args[2] if len(args) > 2 else None)
