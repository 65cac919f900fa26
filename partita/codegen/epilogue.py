"""The epilogues a library kernel can fuse after its main op (an activation, an add), and
their ATen form for the fallbacks."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..ops.registry import OPS


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


def aten_epilogue(y, binary: str, other, unary: str):
    """The epilogue ``binary`` (with ``other``) then ``unary`` applied to ``y`` by the ops' ATen forms."""
    b = BINARY[binary]
    if b is not None:
        y = OPS[b.op].torch([y, other], {})
    u = UNARY[unary]
    if u is not None:
        y = OPS[u.op].torch([y], dict(u.attrs))
    return y
