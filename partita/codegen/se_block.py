"""Squeeze-excitation as one step: the ``se_block`` op, its matcher and its kernel.

A squeeze-excitation block is ``y = x * gate(W2 act(W1 mean_{H,W}(x) + b1) + b2)``: a global mean
over H and W of x [N, C, H, W], two 1 x 1 convolutions on the [N, C, 1, 1] means (C -> Cr -> C),
an activation between them (ReLU or SiLU) and a gate after (sigmoid or hardsigmoid), and the
product with x broadcast over H and W. After ``fuse-library`` it is five to seven steps (the mean,
two ``conv2d_pointwise`` of a 1 x 1 map, the gate's elementwise ops, the ``mul``).
``fuse_se_blocks`` (run by ``CompiledProgram`` after ``assign-layout``) rewrites it into

    %y = se_block(%x, %w1, %b1, %w2, %b2) {act="relu", gate="hardsigmoid"}

whose reference is the ops' references in order. The step (``se_block_kernel``) measures two
candidates at its first call (codegen/choose.py): the generated kernel (``se_ir``: per image
the mean over the channels-last map, the two matvecs and activations on the stack, the scaling
pass into a channels-last result) against ATen's ops in turn.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from typing import Any, Callable

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node, Value
from ..ops._lazy import torch
from ..ops.registry import AttrSpec, Cost, OpDef, register
from .norm import f32_hex

__all__ = ["fuse_se_blocks", "se_block_kernel", "ACTS", "GATES"]

ACTS = ("none", "relu", "silu")
GATES = ("sigmoid", "hardsigmoid")


# --- the op ----------------------------------------------------------------------------------

def _infer(ts: list, attrs: dict) -> Any:
    x, w1, b1, w2, b2 = ts
    if x.rank != 4 or not x.dtype.is_float:
        raise TypeRuleError(f"se_block: x must be a float [N, C, H, W], got {x}")
    if any(t.dtype != x.dtype for t in ts[1:]):
        raise TypeRuleError(f"se_block: weights and biases must be {x.dtype} as x is, got {[str(t) for t in ts[1:]]}")
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
    """(the gate's kind, its result) of the elementwise ops after the second convolution (written
    out, or a ``fused`` kernel of just them, fuse-library's)."""
    n = _only_user(g)
    if n is not None and n.op == "fused" and len(n.operands) == 1 and len(n.results) == 1:
        from .fused_body import body_graph

        body = body_graph(n.attrs["body"])
        inner = _gate(body.inputs[0]) if len(body.inputs) == 1 and len(body.outputs) == 1 else None
        others = [b for b in body.nodes if b.op not in ("full", "sigmoid", "add", "maximum", "minimum", "div")]
        if inner is None or inner[1] is not body.outputs[0] or others or body.outputs[0].type != g.type:
            return None
        return inner[0], n.results[0]
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
    """One node's block on x [N, C, H, W] in channels-last memory: ``se_ir``'s kernel (the mean,
    the two matvecs and activations on the stack, the scaling pass) into a channels-last result
    (a new tensor, or ``out``: the arena's buffer of the node's result). A call with the very
    tensors of the last one (the arena's input and result, the same contiguous weights) at the
    same addresses is the whole-range entry on the parameter block as it stands; ``native_entry``
    offers it to codegen/step_chain.py."""

    def __init__(self, shape: tuple, act: str, gate: str, cr: int) -> None:
        n, c, h, w = (int(v) for v in shape)
        self.shape = (n, c, h, w)
        self.fn, self.whole = se_kernels(n, h * w, c, cr, act, gate)
        self.params = (ctypes.c_int64 * 6)()
        self.addr = ctypes.addressof(self.params)
        self.w: Any = None   # the weights as contiguous tensors, with the tensor they came from
        # (x, out, the weights, x's address, the weights' addresses) the block points at
        self.last: tuple | None = None

    def native_entry(self, args: list | None, out: Any) -> tuple[int, int] | None:
        """(the whole-range entry's address, the parameter block's) where a call with ``args``
        (None: the last call's) into ``out`` is that entry on the block as it stands, else None."""
        last = self.last
        if last is None or out is None or last[1] is not out:
            return None
        if args is not None:
            if not _bound(last, args, out):
                return None
        return ctypes.cast(self.whole, ctypes.c_void_p).value or 0, self.addr

    def __call__(self, args: list, out: Any = None) -> Any:
        x = args[0]
        last = self.last
        if last is not None and out is not None and _bound(last, args, out):
            self.whole(self.addr)
            return out
        self.last = None
        cl = torch.channels_last
        if not x.is_contiguous(memory_format=cl):
            x = x.contiguous(memory_format=cl)
        w = self.w
        if w is None or w[4] is not args[1]:
            w = self.w = (*(t.contiguous() for t in args[1:]), args[1])
        y = torch.empty(self.shape, dtype=torch.float32, memory_format=cl) if out is None else out
        p = self.params
        p[0], p[1], p[2], p[3], p[4], p[5] = (x.data_ptr(), y.data_ptr(), w[0].data_ptr(), w[1].data_ptr(),
                                              w[2].data_ptr(), w[3].data_ptr())
        if out is not None and x is args[0] and all(a is b for a, b in zip(args[1:], w[:4])):
            # the block points at the caller's own tensors: the next call with them is bound
            self.last = (x, out, tuple(args[1:]), x.data_ptr(), tuple(a.data_ptr() for a in args[1:]))
        self.fn(p, 0, self.shape[0], 0)
        return y


def _bound(last: tuple, args: list, out: Any) -> bool:
    """Whether a call with ``args`` into ``out`` takes the very tensors the parameter block
    points at, at the same addresses (a tensor's storage can be swapped under it)."""
    return (last[0] is args[0] and last[1] is out and args[0].data_ptr() == last[3]
            and all(a is b for a, b in zip(args[1:], last[2]))
            and all(a.data_ptr() == q for a, q in zip(args[1:], last[4])))


_LOCK = threading.Lock()
_KERNELS: dict[tuple, tuple[Any, Any]] = {}


def se_kernels(n: int, hw: int, c: int, cr: int, act: str, gate: str) -> tuple[Any, Any]:
    """The compiled kernel over a range of images and its whole-range entry (``fn(params)``:
    the ``n`` images on the calling thread), as ctypes functions, made once a process."""
    from .jit import RANGE_ARGTYPES, CodegenError, jit
    from .lowering import vector_width

    key = (vector_width(), n, hw, c, cr, act, gate)
    with _LOCK:
        fns = _KERNELS.get(key)
        if fns is None:
            name = f"pt_se_l{vector_width()}_n{n}_hw{hw}_c{c}_r{cr}_{act}_{gate}"
            ir = se_ir(name, hw, c, cr, act, gate) + "\n".join([
                f"define void @{name}_all(ptr %pp) nounwind {{",
                f"  call void @{name}(ptr %pp, i64 0, i64 {n}, i64 0)",
                "  ret void",
                "}"]) + "\n"
            j = jit()
            fn = j.kernel(name, ir, 0, argtypes=RANGE_ARGTYPES).fn
            with j.lock:   # loaded with the kernel: the same object file
                addr = j.engine.get_function_address(f"{name}_all")
            if not addr:
                raise CodegenError(f"kernel {name}_all is missing from its machine code")
            fns = _KERNELS[key] = (fn, ctypes.CFUNCTYPE(None, ctypes.c_void_p)(addr))
        return fns


def se_block_kernel(node: Any, inplace: bool = False, outs: list | None = None) -> Callable | None:
    """The step of an ``se_block`` node: ``PreparedSE`` measured against ATen's ops at the first
    call (codegen/choose.py); ATen's ops where x is not f32 on the CPU. ``outs``: the memory
    plan's buffer of the result (or None), which the step writes at every call; with it the
    step offers the generated kernel's ``native_entry`` (codegen/step_chain.py)."""
    from . import choose
    from ..backend.common import describe_node

    del inplace
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
    out = None
    if outs is not None and outs[0] is not None and not node.results[0].is_output:
        n, c, h, w = shape   # the result channels-last in its buffer, as the generated kernel writes it
        out = outs[0].view(-1).view(n, h, w, c).permute(0, 3, 1, 2)
    key = f"se_block v2 x={'x'.join(map(str, shape))} cr={node.operands[1].type.shape[0]} {node.attrs['act']} " \
          f"{node.attrs['gate']}"
    ref = weakref.ref(node)
    where = describe_node(node)
    picked: list[str] = []

    def run_aten(args: list, attrs: dict) -> Any:
        r = _torch(args, attrs)
        return r if out is None else out.copy_(r)

    def step(args: list, attrs: dict) -> Any:
        x = args[0]
        if not x.is_cpu or any(a.dtype is not torch.float32 for a in args):
            return run_aten(args, attrs)
        if not picked:
            picked.append(choose.choose(key, {"generated": lambda: gen(args), "aten": lambda: _torch(args, attrs)},
                                        where=where, default="generated", node=ref()))
        if picked[0] == "generated":
            return gen(args, out)
        return run_aten(args, attrs)

    if out is not None:
        def native_entry(args: list | None) -> tuple[int, int] | None:
            """(entry, parameter block) of the kernel a call with ``args`` (None: the last call's
            tensors) runs as its one native call on one thread, or None where it would do more."""
            if picked != ["generated"]:
                return None
            if args is not None and (not args[0].is_cpu or any(a.dtype is not torch.float32 for a in args)):
                return None
            return gen.native_entry(args, out)

        step.native_entry = native_entry  # type: ignore[attr-defined]  # codegen/step_chain.py
        step.native_out = out  # type: ignore[attr-defined]
    return step


# --- the generated kernel --------------------------------------------------------------------

def _act_ir(a: Callable[[str], None], v: str, out: str, kind: str) -> None:
    """IR computing ``out`` = the activation or gate ``kind`` of the float ``v``."""
    if kind == "relu":
        a(f"  {out} = call float @llvm.maxnum.f32(float {v}, float 0.0)")
    elif kind in ("sigmoid", "silu"):
        a(f"  {out}.n = fneg float {v}")
        a(f"  {out}.e = call float @llvm.exp.f32(float {out}.n)")
        a(f"  {out}.d = fadd float {out}.e, 1.0")
        a(f"  {out} = fdiv float {'1.0' if kind == 'sigmoid' else v}, {out}.d")
    elif kind == "hardsigmoid":
        a(f"  {out}.a = fadd float {v}, 3.0")
        a(f"  {out}.b = call float @llvm.maxnum.f32(float {out}.a, float 0.0)")
        a(f"  {out}.c = call float @llvm.minnum.f32(float {out}.b, float 6.0)")
        a(f"  {out} = fdiv float {out}.c, 6.0")
    else:
        a(f"  {out} = fadd float {v}, 0.0")


def _matvec_ir(a: Callable[[str], None], tag: str, rows: int, cols: int, src: str, w: str, b: str, dst: str,
               kind: str, after: str) -> None:
    """IR of ``dst[r] = kind(b[r] + sum_k w[r, k] src[k])`` for r < rows, then a branch to ``after``."""
    a(f"  br label %{tag}.r")
    a(f"{tag}.r:")
    a(f"  %{tag}.i = phi i64 [ 0, %{tag}.start ], [ %{tag}.i1, %{tag}.k.end ]")
    a(f"  %{tag}.bp = getelementptr inbounds float, ptr %{b}, i64 %{tag}.i")
    a(f"  %{tag}.b0 = load float, ptr %{tag}.bp, align 4")
    a(f"  %{tag}.wo = mul i64 %{tag}.i, {cols}")
    a(f"  br label %{tag}.k")
    a(f"{tag}.k:")
    a(f"  %{tag}.j = phi i64 [ 0, %{tag}.r ], [ %{tag}.j1, %{tag}.k ]")
    a(f"  %{tag}.acc = phi float [ %{tag}.b0, %{tag}.r ], [ %{tag}.acc1, %{tag}.k ]")
    a(f"  %{tag}.wi = add i64 %{tag}.wo, %{tag}.j")
    a(f"  %{tag}.wp = getelementptr inbounds float, ptr %{w}, i64 %{tag}.wi")
    a(f"  %{tag}.wv = load float, ptr %{tag}.wp, align 4")
    a(f"  %{tag}.sp = getelementptr inbounds float, ptr %{src}, i64 %{tag}.j")
    a(f"  %{tag}.sv = load float, ptr %{tag}.sp, align 4")
    a(f"  %{tag}.acc1 = call reassoc float @llvm.fmuladd.f32(float %{tag}.wv, float %{tag}.sv, float %{tag}.acc)")
    a(f"  %{tag}.j1 = add i64 %{tag}.j, 1")
    a(f"  %{tag}.jm = icmp ult i64 %{tag}.j1, {cols}")
    a(f"  br i1 %{tag}.jm, label %{tag}.k, label %{tag}.k.end")
    a(f"{tag}.k.end:")
    _act_ir(a, f"%{tag}.acc1", f"%{tag}.o", kind)
    a(f"  %{tag}.dp = getelementptr inbounds float, ptr %{dst}, i64 %{tag}.i")
    a(f"  store float %{tag}.o, ptr %{tag}.dp, align 4")
    a(f"  %{tag}.i1 = add i64 %{tag}.i, 1")
    a(f"  %{tag}.im = icmp ult i64 %{tag}.i1, {rows}")
    a(f"  br i1 %{tag}.im, label %{tag}.r, label %{after}")


def _pixels_ir(a: Callable[[str], None], tag: str, hw: int, c: int, lanes: int, body: Callable[[str], None],
               after: str) -> None:
    """IR of a loop over the ``hw`` pixels and, inside, the ``c`` channels of one image (element
    offset ``%{tag}.o``, channel ``%{tag}.ch``, ``lanes`` channels a time), ``body`` emitting
    their work, then a branch to ``after``."""
    a(f"  br label %{tag}.px")
    a(f"{tag}.px:")
    a(f"  %{tag}.p = phi i64 [ 0, %{tag}.start ], [ %{tag}.p1, %{tag}.l ]")
    a(f"  %{tag}.po0 = mul i64 %{tag}.p, {c}")
    a(f"  %{tag}.po = add i64 %xo, %{tag}.po0")
    a(f"  br label %{tag}.c")
    a(f"{tag}.c:")
    a(f"  %{tag}.ch = phi i64 [ 0, %{tag}.px ], [ %{tag}.ch1, %{tag}.c ]")
    a(f"  %{tag}.o = add i64 %{tag}.po, %{tag}.ch")
    body(tag)
    a(f"  %{tag}.ch1 = add i64 %{tag}.ch, {lanes}")
    a(f"  %{tag}.chm = icmp ult i64 %{tag}.ch1, {c}")
    a(f"  br i1 %{tag}.chm, label %{tag}.c, label %{tag}.l")
    a(f"{tag}.l:")
    a(f"  %{tag}.p1 = add i64 %{tag}.p, 1")
    a(f"  %{tag}.pm = icmp ult i64 %{tag}.p1, {hw}")
    a(f"  br i1 %{tag}.pm, label %{tag}.px, label %{after}")


def _lanes(c: int, width: int) -> int:
    """The widest vector of at most ``width`` lanes that divides ``c`` (1 for odd counts)."""
    lanes = width
    while c % lanes:
        lanes //= 2
    return lanes


def se_ir(name: str, hw: int, c: int, cr: int, act: str, gate: str) -> str:
    """The LLVM IR of one squeeze-excitation over images [lo, hi) of x [N, H, W, C] memory:
    ``params`` holds the i64 addresses of x, y, w1 [Cr, C], b1, w2 [C, Cr], b2."""
    from .lowering import vector_width

    L = _lanes(c, vector_width())
    vt = f"<{L} x float>"
    out: list[str] = []
    a = out.append
    for f in ("exp", "maxnum", "minnum"):
        a(f"declare float @llvm.{f}.f32(float{', float' if f != 'exp' else ''})")
    a("declare float @llvm.fmuladd.f32(float, float, float)")
    a(f"define void @{name}(ptr noalias %pp, i64 %lo, i64 %hi, i64 %tid) nounwind {{")
    a("entry:")
    for i, p in enumerate(["x", "y", "w1", "b1", "w2", "b2"]):
        a(f"  %{p}.p = getelementptr inbounds i64, ptr %pp, i64 {i}")
        a(f"  %{p}.i = load i64, ptr %{p}.p, align 8")
        a(f"  %{p} = inttoptr i64 %{p}.i to ptr")
    a(f"  %m = alloca [{c} x float], align 64")
    a(f"  %h = alloca [{cr} x float], align 64")
    a(f"  %s = alloca [{c} x float], align 64")
    a("  %empty = icmp sge i64 %lo, %hi")
    a("  br i1 %empty, label %exit, label %img")
    a("img:")
    a("  %n = phi i64 [ %lo, %entry ], [ %n1, %sc.end ]")
    a(f"  %xo = mul i64 %n, {hw * c}")
    a(f"  call void @llvm.memset.p0.i64(ptr align 64 %m, i8 0, i64 {4 * c}, i1 false)")
    a("  br label %sum.start")
    a("sum.start:")

    def add_in(t: str) -> None:
        a(f"  %{t}.xp = getelementptr inbounds float, ptr %x, i64 %{t}.o")
        a(f"  %{t}.xv = load {vt}, ptr %{t}.xp, align 4")
        a(f"  %{t}.mp = getelementptr inbounds float, ptr %m, i64 %{t}.ch")
        a(f"  %{t}.mv = load {vt}, ptr %{t}.mp, align 4")
        a(f"  %{t}.mv1 = fadd {vt} %{t}.mv, %{t}.xv")
        a(f"  store {vt} %{t}.mv1, ptr %{t}.mp, align 4")
    _pixels_ir(a, "sum", hw, c, L, add_in, "div.start")
    a("div.start:")
    a("  br label %div.l")
    a("div.l:")
    a("  %dv.i = phi i64 [ 0, %div.start ], [ %dv.i1, %div.l ]")
    a("  %dv.p = getelementptr inbounds float, ptr %m, i64 %dv.i")
    a("  %dv.v = load float, ptr %dv.p, align 4")
    a(f"  %dv.r = fdiv float %dv.v, {f32_hex(float(hw))}")
    a("  store float %dv.r, ptr %dv.p, align 4")
    a("  %dv.i1 = add i64 %dv.i, 1")
    a(f"  %dv.im = icmp ult i64 %dv.i1, {c}")
    a("  br i1 %dv.im, label %div.l, label %fc1.start")
    a("fc1.start:")
    _matvec_ir(a, "fc1", cr, c, "m", "w1", "b1", "h", act, "fc2.start")
    a("fc2.start:")
    _matvec_ir(a, "fc2", c, cr, "h", "w2", "b2", "s", gate, "sc.start")
    a("sc.start:")

    def scale(t: str) -> None:
        a(f"  %{t}.xp = getelementptr inbounds float, ptr %x, i64 %{t}.o")
        a(f"  %{t}.xv = load {vt}, ptr %{t}.xp, align 4")
        a(f"  %{t}.sp = getelementptr inbounds float, ptr %s, i64 %{t}.ch")
        a(f"  %{t}.sv = load {vt}, ptr %{t}.sp, align 4")
        a(f"  %{t}.yv = fmul {vt} %{t}.xv, %{t}.sv")
        a(f"  %{t}.yp = getelementptr inbounds float, ptr %y, i64 %{t}.o")
        a(f"  store {vt} %{t}.yv, ptr %{t}.yp, align 4")
    _pixels_ir(a, "sc", hw, c, L, scale, "sc.end")
    a("sc.end:")
    a("  %n1 = add i64 %n, 1")
    a("  %nm = icmp slt i64 %n1, %hi")
    a("  br i1 %nm, label %img, label %exit")
    a("exit:")
    a("  ret void")
    a("}")
    a("declare void @llvm.memset.p0.i64(ptr, i8, i64, i1)")
    return "\n".join(out) + "\n"
