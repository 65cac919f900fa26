"""GroupNorm as one step: the ``group_norm`` op, its matcher and its kernel.

Both importers write ``native_group_norm`` out in ops (frontend/torch_export.py's
``_group_norm``, which the FX path shares), and so does torch.export's decomposition:

    %g = reshape(%x) {shape=[N, G, M]}              M = C / G * H * W
    %m = mean(%g) {axes=[2], keepdim}
    %d = sub(%g, %m)
    %v = mean(mul(%d, %d)) {axes=[2], keepdim}
    %r = rsqrt(add(%v, eps))
    %y = reshape(mul(%d, %r)) {shape=x's}
    %y = add(mul(%y, w[1,C,1,1]), b[1,C,1,1])       (optional)
    %y = relu(%y)                                    (optional: one of epilogue.UNARY)

That is five to six steps on ATen and fused kernels, and on a channels-last input the first
reshape is a copy. ``fuse_group_norm`` (an anchor of fuse-library on ``mean``, beside
``norm.fuse_rms_norm``) rewrites it into

    %y = group_norm(%x, %w, %b) {groups=G, eps=1e-05, unary="relu"}

whose reference is the pattern's ops' references one after another (so the rewrite is bit for
bit on the reference interpreter) and whose torch implementation is ATen's
``F.group_norm`` followed by the activation. The step (``group_norm_kernel``) runs ATen's
kernel on the tensor as it comes (NCHW or channels-last) with the activation in place.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node, Value
from ..ops._lazy import torch
from ..ops.registry import AttrSpec, Cost, OPS, OpDef, register
from .epilogue import UNARY

__all__ = ["fuse_group_norm", "fuse_mean", "group_norm_kernel", "GROUP_NORM_UNARY"]

# The activations group_norm applies after its affine part (epilogue.UNARY's).
GROUP_NORM_UNARY = tuple(UNARY)


# --- the op ----------------------------------------------------------------------------------

def _infer(ts: list, attrs: dict) -> Any:
    x = ts[0]
    g = attrs["groups"]
    if x.rank < 2:
        raise TypeRuleError(f"group_norm: x must be [N, C, ...], got {x}")
    c = x.shape[1]
    if g < 1 or c % g:
        raise TypeRuleError(f"group_norm: groups={g} must divide the {c} channels of {x}")
    per_c = (1, c) + (1,) * (x.rank - 2)
    for t in ts[1:]:
        if t.shape not in ((c,), per_c, per_c[1:]) or t.dtype != x.dtype:
            raise TypeRuleError(f"group_norm: weight and bias must be [{c}] (or {list(per_c)}, {list(per_c[1:])}) "
                                f"of {x.dtype}, got {t}")
    if not x.dtype.is_float:
        raise TypeRuleError(f"group_norm: x must be a float tensor, got {x}")
    return x


def _step(op: str, args: list, attrs: dict, dtype: Any) -> np.ndarray:
    """One op's reference, rounded to ``dtype`` as the interpreter rounds after each node."""
    with np.errstate(all="ignore"):
        r = np.asarray(OPS[op].reference(args, attrs))
    return r if r.dtype == dtype else r.astype(dtype)


def _reference(args: list, attrs: dict) -> np.ndarray:
    x = np.asarray(args[0])
    dt, shape = x.dtype, x.shape
    n, c, g = shape[0], shape[1], attrs["groups"]
    gx = x.reshape(n, g, -1)
    mean = _step("mean", [gx], {"axes": (2,), "keepdim": True}, dt)
    d = _step("sub", [gx, mean], {}, dt)
    var = _step("mean", [_step("mul", [d, d], {}, dt)], {"axes": (2,), "keepdim": True}, dt)
    r = _step("rsqrt", [_step("add", [var, np.asarray(attrs["eps"], dtype=dt)], {}, dt)], {}, dt)
    y = _step("mul", [d, r], {}, dt).reshape(shape)
    per_c = (1, c) + (1,) * (len(shape) - 2)
    if len(args) > 1:
        y = _step("mul", [y, np.asarray(args[1]).reshape(per_c)], {}, dt)
    if len(args) > 2:
        y = _step("add", [y, np.asarray(args[2]).reshape(per_c)], {}, dt)
    u = UNARY[attrs["unary"]]
    if u is not None:
        y = _step(u.op, [y], dict(u.attrs), dt)
    return y


def _unary_inplace(kind: str) -> Callable[[Any], Any] | None:
    """The in-place torch form of an epilogue (None for "none")."""
    u = UNARY[kind]
    if u is None:
        return None
    if u.op == "gelu":
        approx = u.attrs.get("approximate", "none")
        return lambda y: y.copy_(torch.nn.functional.gelu(y, approximate=approx))
    return {"relu": torch.relu_, "silu": lambda y: torch.nn.functional.silu(y, inplace=True),
            "sigmoid": torch.sigmoid_, "tanh": torch.tanh_}[u.op]


def _torch(args: list, attrs: dict) -> Any:
    x = args[0]
    w = args[1].reshape(-1) if len(args) > 1 else None
    b = args[2].reshape(-1) if len(args) > 2 else None
    y = torch.nn.functional.group_norm(x, attrs["groups"], w, b, attrs["eps"])
    act = _unary_inplace(attrs["unary"])
    return y if act is None else act(y)


def _cost(ins: list, outs: list, attrs: dict) -> Cost:
    n = ins[0].numel
    return Cost(n * 10, sum(t.nbytes for t in ins), outs[0].nbytes)


register(OpDef(
    name="group_norm", operands=("x", "weight?", "bias?"),
    attrs=(AttrSpec("groups", "int"), AttrSpec("eps", "float", 1e-5),
           AttrSpec("unary", "str", "none", choices=GROUP_NORM_UNARY)),
    infer=_infer, reference=_reference, torch=_torch, cost=_cost,
    doc="GroupNorm of x [N, C, ...]: per sample and group of C / groups channels, (x - mean) / "
        "sqrt(var + eps) (var the mean of the squared deviations), then * weight[C] and + bias[C], "
        "then the activation ``unary``. Made by fuse-library from the ops the importers write "
        "(codegen/group_norm.py); inference.",
))


# --- the rewrite -----------------------------------------------------------------------------

def _live_users(v: Value) -> list[Node]:
    """The nodes reading ``v`` whose results something reads (a dead reshape of the mean, left
    by the importer for native_group_norm's second result, does not count)."""
    return [u for u in v.users if any(r.has_uses for r in u.results)]


def _only(v: Value, op: str) -> Node | None:
    """The one live reader of ``v`` when it is an ``op`` and ``v`` is no graph output."""
    users = _live_users(v)
    if v.is_output or len(users) != 1 or users[0].op != op or v.users.get(users[0], 0) != 1:
        return None
    return users[0]


def _other(node: Node, v: Value) -> Value | None:
    """The operand of the binary ``node`` that is not ``v``."""
    a, b = node.operands
    return b if a is v and b is not v else a if b is v and a is not v else None


def _scalar(v: Value | None) -> float | None:
    from ..passes.rewrite import splat_value

    if v is None or v.type.numel != 1:
        return None
    s = splat_value(v)
    return None if s is None or isinstance(s, bool) else float(s)


def _per_channel(v: Value | None, shape: tuple) -> bool:
    """Whether ``v`` is a [1, C, 1, ...] or [C, 1, ...] value (one number per channel)."""
    if v is None or v.type.dtype is not f32:
        return False
    want = (1, shape[1]) + (1,) * (len(shape) - 2)
    return v.type.shape in (want, want[1:])


def _statistics(node: Node) -> tuple[Value, int, float, Node] | None:
    """(x, groups, eps, the mul by rstd) of the pattern's statistics part from its first mean."""
    g = node.operands[0]
    rs = g.producer
    if rs is None or rs.op != "reshape" or g.type.rank != 3 or not node.attrs.get("keepdim"):
        return None
    if [a % 3 for a in node.attrs["axes"]] != [2]:
        return None
    x = rs.operands[0]
    if x.type.dtype is not f32 or x.type.rank < 2 or x.type.shape[0] != g.type.shape[0]:
        return None
    groups = g.type.shape[1]
    if x.type.shape[1] % groups or g.type.numel != x.type.numel:
        return None
    sub = _only(node.results[0], "sub")
    if sub is None or sub.operands[0] is not g or sub.operands[1] is not node.results[0]:
        return None
    d = sub.results[0]
    users = _live_users(d)
    sq = next((u for u in users if u.op == "mul" and u.operands[0] is d and u.operands[1] is d), None)
    scale = next((u for u in users if u.op == "mul" and u is not sq), None)
    if sq is None or scale is None or len(users) != 2 or d.is_output:
        return None
    m2 = _only(sq.results[0], "mean")
    if m2 is None or m2.attrs["axes"] != node.attrs["axes"] or not m2.attrs.get("keepdim"):
        return None
    add = _only(m2.results[0], "add")
    eps = None if add is None else _scalar(_other(add, m2.results[0]))
    if add is None or eps is None:
        return None
    rsq = _only(add.results[0], "rsqrt")
    if rsq is None or _only(rsq.results[0], "mul") is not scale or _other(scale, rsq.results[0]) is not d:
        return None
    return x, groups, eps, scale


def _affine(x: Value, y: Value) -> tuple[Value | None, Value | None, Value, list[Node]]:
    """(weight, bias, the last value, the nodes) of the per-channel mul and add after ``y``."""
    w = b = None
    taken: list[Node] = []
    mul = _only(y, "mul")
    if mul is not None and _per_channel(_other(mul, y), x.type.shape) and mul.results[0].type == x.type:
        w, y = _other(mul, y), mul.results[0]
        taken.append(mul)
        add = _only(y, "add")
        if add is not None and _per_channel(_other(add, y), x.type.shape) and add.results[0].type == x.type:
            b, y = _other(add, y), add.results[0]
            taken.append(add)
    return w, b, y, taken


def _as_channels(v: Value) -> Value:
    """``v`` (per channel): its [C] source where it is a reshape of one, else ``v`` itself (the
    op takes [C], [1, C, 1, ...] and [C, 1, ...]; a folded param is one of the last two)."""
    c = v.type.numel
    p = v.producer
    if p is not None and p.op in ("reshape", "unsqueeze") and p.operands[0].type.shape == (c,):
        return p.operands[0]
    return v


def _unary_kind(node: Node) -> str | None:
    """The ``epilogue.UNARY`` kind a node stands for, or None."""
    for kind, u in UNARY.items():
        if u is not None and u.op == node.op and all(node.attrs.get(k) == v for k, v in u.attrs.items()):
            return kind
    return None


def fuse_group_norm(graph: Graph, node: Node) -> Node | None:
    """The written-out GroupNorm from its first ``mean`` (the module doc) into ``group_norm``,
    with the per-channel affine part and an activation after it; None where it does not apply."""
    found = _statistics(node)
    if found is None:
        return None
    x, groups, eps, scale = found
    back = _only(scale.results[0], "reshape")
    if back is None or back.results[0].type != x.type:
        return None
    w, b, y, taken = _affine(x, back.results[0])
    if b is not None and w is None:
        return None
    unary = "none"
    readers = _live_users(y)
    if len(readers) == 1 and not y.is_output and readers[0].results[0].type == x.type:
        kind = _unary_kind(readers[0])
        if kind is not None and len(readers[0].operands) == 1:
            unary, y = kind, readers[0].results[0]
            taken.append(readers[0])
    last = y.producer
    assert last is not None
    operands = [x] + [_as_channels(v) for v in (w, b) if v is not None]
    if any(v.producer is not None and not v.producer.is_before(last) for v in operands):
        return None
    new = Node("group_norm", operands, OPS["group_norm"].normalize_attrs(
        {"groups": groups, "eps": eps, "unary": unary}), [x.type], last.loc)
    graph.insert_before(last, new)
    graph.replace_all_uses(y, new.results[0])
    from ..passes.rewrite import erase_if_dead

    for v in (node.results[0], scale.operands[0], scale.operands[1]):   # the importer's dead reshapes
        for u in [u for u in v.users if u not in _live_users(v)]:
            erase_if_dead(graph, u)
    erase_if_dead(graph, last)
    return new


def fuse_mean(graph: Graph, node: Node) -> Node | None:
    """fuse-library's anchor on ``mean``: RMSNorm (norm.fuse_rms_norm), else GroupNorm."""
    from .norm import fuse_rms_norm

    return fuse_rms_norm(graph, node) or fuse_group_norm(graph, node)


# --- the step --------------------------------------------------------------------------------

def group_norm_kernel(node: Node, inplace: bool = False) -> Callable | None:
    """The step running a ``group_norm`` node: ATen's group norm on the tensor as it comes
    (NCHW or channels-last), the activation in place on its result."""
    del inplace
    groups, eps = int(node.attrs["groups"]), float(node.attrs["eps"])
    act = _unary_inplace(node.attrs["unary"])
    gn = torch.nn.functional.group_norm

    def step(args: list, attrs: dict) -> Any:
        x = args[0].contiguous()
        w = args[1].reshape(-1) if len(args) > 1 else None
        b = args[2].reshape(-1) if len(args) > 2 else None
        y = gn(x, groups, w, b, eps)
        return y if act is None else act(y)
    return step
