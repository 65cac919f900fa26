"""Squeeze-excitation as one step: the ``se_block`` op, its matcher and its kernel.

A squeeze-excitation block is ``y = x * gate(W2 act(W1 mean_{H,W}(x) + b1) + b2)``: a global mean
over H and W of x [N, C, H, W], two 1 x 1 convolutions on the [N, C, 1, 1] means (C -> Cr -> C),
an activation between them (ReLU or SiLU) and a gate after (sigmoid or hardsigmoid), and the
product with x broadcast over H and W. After ``fuse-library`` it is five to seven steps (the mean,
two ``conv2d_pointwise`` of a 1 x 1 map, the gate's elementwise ops, the ``mul``).
``fuse_se_blocks`` (run by ``CompiledProgram`` after ``assign-layout``) rewrites it into

    %y = se_block(%x, %w1, %b1, %w2, %b2) {act="relu", gate="hardsigmoid"}

whose reference is the ops' references in order. The step (``se_block_kernel``) measures two
candidates at its first call (codegen/choose.py): the generated global mean (pool.py's kernel
over channels-last or NCHW memory), the two matvecs and activations on the [N, C] means in
place, and the scaling written in x's memory format, against ATen's ops in turn.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node, Value
from ..ops._lazy import torch
from ..ops.registry import AttrSpec, Cost, OpDef, register

__all__ = ["fuse_se_blocks", "se_block_kernel", "ACTS", "GATES"]

ACTS = ("none", "relu", "silu")
GATES = ("sigmoid", "hardsigmoid")


# --- the op ----------------------------------------------------------------------------------

def _infer(ts: list, attrs: dict) -> Any:
    x, w1, b1, w2, b2 = ts
    if x.rank != 4 or x.dtype is not f32:
        raise TypeRuleError(f"se_block: x must be an f32 [N, C, H, W], got {x}")
    c = x.shape[1]
    if w1.rank != 4 or w1.shape[1] != c or tuple(w1.shape[2:]) != (1, 1):
        raise TypeRuleError(f"se_block: w1 must be [Cr, {c}, 1, 1], got {w1}")
    cr = w1.shape[0]
    if tuple(w2.shape) != (c, cr, 1, 1) or b1.numel != cr or b2.numel != c:
        raise TypeRuleError(f"se_block: w2 must be [{c}, {cr}, 1, 1], b1 {cr} values, b2 {c}; got {w2}, {b1}, {b2}")
    if attrs["act"] not in ACTS or attrs["gate"] not in GATES:
        raise TypeRuleError(f"se_block: act must be one of {ACTS} and gate one of {GATES}, got "
                            f"{attrs['act']!r}, {attrs['gate']!r}")
    return x


def _act_np(v: np.ndarray, kind: str) -> np.ndarray:
    """The activation or gate ``kind`` of ``v`` in numpy."""
    if kind == "relu":
        return np.maximum(v, 0)
    if kind == "silu":
        return v / (1 + np.exp(-v))
    if kind == "sigmoid":
        return 1 / (1 + np.exp(-v))
    if kind == "hardsigmoid":
        return np.minimum(np.maximum(v + 3, 0), 6) / 6
    return v


def _reference(args: list, attrs: dict) -> np.ndarray:
    x = np.asarray(args[0])
    w1, w2 = (np.asarray(a)[:, :, 0, 0] for a in (args[1], args[3]))
    b1, b2 = (np.asarray(a).reshape(-1) for a in (args[2], args[4]))
    with np.errstate(all="ignore"):
        m = x.mean(axis=(2, 3), dtype=x.dtype)
        h = _act_np(m @ w1.T + b1, attrs["act"])
        s = _act_np(h @ w2.T + b2, attrs["gate"])
        return (x * s[:, :, None, None].astype(x.dtype)).astype(x.dtype)


def _act_torch(v: Any, kind: str) -> Any:
    """The activation or gate ``kind`` of ``v``, in place."""
    if kind == "relu":
        return v.relu_()
    if kind == "silu":
        return torch.nn.functional.silu(v, inplace=True)
    if kind == "sigmoid":
        return v.sigmoid_()
    if kind == "hardsigmoid":
        return torch.nn.functional.hardsigmoid(v, inplace=True)
    return v


def _torch(args: list, attrs: dict) -> Any:
    x = args[0]
    m = x.mean(dim=(2, 3))
    h = _act_torch(torch.addmm(args[2].reshape(-1), m, args[1].flatten(1).t()), attrs["act"])
    s = _act_torch(torch.addmm(args[4].reshape(-1), h, args[3].flatten(1).t()), attrs["gate"])
    return x * s[:, :, None, None]


def _cost(ins: list, outs: list, attrs: dict) -> Cost:
    x, w1 = ins[0], ins[1]
    return Cost(2 * x.numel + 4 * x.shape[0] * w1.numel, sum(t.nbytes for t in ins), outs[0].nbytes)


register(OpDef(
    name="se_block", operands=("x", "w1", "b1", "w2", "b2"),
    attrs=(AttrSpec("act", "str", "relu"), AttrSpec("gate", "str", "sigmoid")),
    infer=_infer, reference=_reference, torch=_torch, cost=_cost,
    doc="Squeeze-excitation x * gate(conv1x1(act(conv1x1(mean_{H,W}(x), w1, b1)), w2, b2)) of x "
        "[N, C, H, W]; act relu/silu/none, gate sigmoid/hardsigmoid. Made from the ops by "
        "CompiledProgram (codegen/se_block.py); inference.",
))


# --- the rewrite -----------------------------------------------------------------------------

def _only_user(v: Value) -> Node | None:
    """The one node reading ``v`` (not a graph output), else None."""
    if v.is_output or len(v.users) != 1:
        return None
    return next(iter(v.users))


def _pointwise_1x1(n: Node | None, v: Value) -> bool:
    """Whether ``n`` is a plain 1 x 1 ``conv2d_pointwise`` of ``v`` with a bias."""
    if n is None or n.op != "conv2d_pointwise" or len(n.operands) != 3 or n.operands[0] is not v:
        return False
    a = n.attrs
    return (a.get("binary", "none") == "none" and int(a.get("groups", 1)) == 1
            and all(int(s) == 1 for s in a.get("stride") or (1, 1))
            and all(int(p) == 0 for p in a.get("padding") or (0, 0))
            and all(int(d) == 1 for d in a.get("dilation") or (1, 1))
            and tuple(n.operands[1].type.shape[2:]) == (1, 1))


def _const(v: Value) -> float | None:
    """The scalar a ``full`` makes, else None."""
    p = v.producer
    if p is None or p.op != "full" or v.type.numel != 1:
        return None
    return float(p.attrs["value"])


def _binary_const(n: Node | None, v: Value, op: str, value: float) -> Node | None:
    """``n`` where it is ``op(v, value)`` (the constant second, or either side for add)."""
    if n is None or n.op != op or len(n.operands) != 2 or n.operands[0] is not v:
        return None
    return n if _const(n.operands[1]) == value else None


def _gate(g: Value) -> tuple[str, Value] | None:
    """(the gate's kind, its result) of the elementwise ops after the second convolution."""
    n = _only_user(g)
    if n is not None and n.op == "sigmoid" and len(n.operands) == 1:
        return "sigmoid", n.results[0]
    add = _binary_const(n, g, "add", 3.0)
    mx = _binary_const(_only_user(add.results[0]), add.results[0], "maximum", 0.0) if add else None
    mn = _binary_const(_only_user(mx.results[0]), mx.results[0], "minimum", 6.0) if mx else None
    dv = _binary_const(_only_user(mn.results[0]), mn.results[0], "div", 6.0) if mn else None
    return ("hardsigmoid", dv.results[0]) if dv else None


def match_se(mean: Node) -> tuple[dict, Node, list[Value]] | None:
    """(the attrs, the final ``mul``, the operands) of the block starting at ``mean``, or None."""
    x = mean.operands[0]
    axes = sorted(int(a) % 4 for a in mean.attrs.get("axes") or ())
    if mean.op != "mean" or x.type.rank != 4 or x.type.dtype is not f32 or axes != [2, 3]:
        return None
    if not mean.attrs.get("keepdim") or any(not isinstance(d, int) for d in x.type.shape):
        return None
    m = mean.results[0]
    fc1 = _only_user(m)
    if fc1 is None or not _pointwise_1x1(fc1, m) or fc1.attrs.get("unary", "none") not in ACTS:
        return None
    h = fc1.results[0]
    fc2 = _only_user(h)
    if fc2 is None or not _pointwise_1x1(fc2, h):
        return None
    g = fc2.results[0]
    if fc2.attrs.get("unary", "none") == "sigmoid":
        gate: tuple[str, Value] | None = ("sigmoid", g)
    elif fc2.attrs.get("unary", "none") == "none":
        gate = _gate(g)
    else:
        gate = None
    if gate is None:
        return None
    mul = _only_user(gate[1])
    if mul is None or mul.op != "mul" or len(mul.operands) != 2 or x not in mul.operands:
        return None
    if mul.operands[0] is mul.operands[1] or mul.results[0].type != x.type:
        return None
    attrs = {"act": str(fc1.attrs.get("unary", "none")), "gate": gate[0]}
    return attrs, mul, [x, fc1.operands[1], fc1.operands[2], fc2.operands[1], fc2.operands[2]]


def fuse_se_blocks(graph: Graph) -> int:
    """Rewrite each squeeze-excitation block of ``graph`` (module doc) into ``se_block``; how many."""
    from ..ops.registry import OPS
    from ..passes.rewrite import erase_if_dead

    done = 0
    for mean in list(graph.nodes):
        if mean.graph is not graph or mean.op != "mean":
            continue
        found = match_se(mean)
        if found is None:
            continue
        attrs, mul, operands = found
        new = Node("se_block", operands, OPS["se_block"].normalize_attrs(attrs), [mul.results[0].type], mul.loc)
        graph.insert_before(mul, new)
        graph.replace_all_uses(mul.results[0], new.results[0])
        erase_if_dead(graph, mul)
        done += 1
    return done


# --- the step --------------------------------------------------------------------------------

class PreparedSE:
    """One node's block on x [N, C, H, W]: the generated mean in x's memory format, the matvecs
    on the [N, C] means in preallocated buffers, the scaling into a result of x's format."""

    def __init__(self, shape: tuple, act: str, gate: str, cr: int) -> None:
        from .pool import PreparedMean

        n, c = int(shape[0]), int(shape[1])
        self.shape = tuple(int(v) for v in shape)
        self.means = {cl: PreparedMean(self.shape, (n, c), cl) for cl in (True, False)}
        self.act, self.gate = act, gate
        self.h = torch.empty((n, cr), dtype=torch.float32)
        self.s = torch.empty((n, c), dtype=torch.float32)
        self.w: Any = None   # the weights transposed once: (w1t, b1, w2t, b2)

    def __call__(self, args: list) -> Any:
        x = args[0]
        w = self.w
        if w is None or w[4] is not args[1]:
            w = self.w = (args[1].flatten(1).t().contiguous(), args[2].reshape(-1),
                          args[3].flatten(1).t().contiguous(), args[4].reshape(-1), args[1])
        cl = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        m = self.means[cl](x)
        _act_torch(torch.addmm(w[1], m, w[0], out=self.h), self.act)
        _act_torch(torch.addmm(w[3], self.h, w[2], out=self.s), self.gate)
        return x * self.s.view(self.shape[0], self.shape[1], 1, 1)


def se_block_kernel(node: Any, inplace: bool = False) -> Callable | None:
    """The step of an ``se_block`` node: ``PreparedSE`` measured against ATen's ops at the first
    call (codegen/choose.py); ATen's ops where x is not f32 on the CPU."""
    from . import choose
    from ..backend.common import describe_node

    shape = tuple(node.operands[0].type.shape)
    if any(not isinstance(d, int) for d in shape):
        return None
    try:
        gen = PreparedSE(shape, node.attrs["act"], node.attrs["gate"], int(node.operands[1].type.shape[0]))
    except Exception as e:  # no code generator here, or CodegenError: ATen runs it
        import warnings

        warnings.warn(f"partita: the generated squeeze-excitation did not compile ({e}); ATen runs it",
                      RuntimeWarning, stacklevel=2)
        return None
    key = f"se_block x={'x'.join(map(str, shape))} cr={node.operands[1].type.shape[0]} {node.attrs['act']} " \
          f"{node.attrs['gate']}"
    ref = weakref.ref(node)
    where = describe_node(node)
    picked: list[Callable[[list], Any]] = []

    def step(args: list, attrs: dict) -> Any:
        x = args[0]
        if not x.is_cpu or x.dtype is not torch.float32:
            return _torch(args, attrs)
        if not picked:
            name = choose.choose(key, {"generated": lambda: gen(args), "aten": lambda: _torch(args, attrs)},
                                 where=where, default="generated", node=ref())
            picked.append(gen if name == "generated" else (lambda a: _torch(a, attrs)))
        return picked[0](args)
    return step
