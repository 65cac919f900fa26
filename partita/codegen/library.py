"""Library kernels with fused epilogues: oneDNN convolution and linear with their post-ops.

Two ops and one pass (docs/codegen.md, "Library kernels"):

    %3 = conv2d_pointwise(%x, %w, %b, %skip) {padding=[1, 1], binary="add", unary="relu"} : f32[8,32,64,64]
    %5 = linear_pointwise(%h, %w1, %b1) {unary="gelu", weight_layout="nk"} : f32[32,4096]

- ``conv2d_pointwise(x, weight, bias?, other?)`` means conv2d(x, weight, bias), then
  ``binary(., other)`` (``add``: a residual of the result's shape), then ``unary``. The
  operands say which optional ones are there: ``other`` is the last operand when ``binary`` is
  not "none", so three operands with ``binary="add"`` are x, weight and other.
- ``linear_pointwise(x, weight, bias?)`` means matmul(x, W) + bias, then ``unary``, for
  ``x [..., K]`` and a 2-D weight: W is ``weight`` laid out [K, N] (``weight_layout="kn"``,
  as a graph built with matmul holds it) or ``transpose(weight)`` for a weight laid out [N, K]
  (``"nk"``, as torch.nn.Linear and the importer hold it).

Each op's NumPy reference composes the references of the ops it replaces (conv2d or
transpose+matmul, add, the activation) with the interpreter's rounding after each one, so the
reference gives bit-identical results before and after ``fuse-library``.

What runs is chosen by one rule table, ``KERNELS``: ``(op, (binary, unary)) -> Kernel``. A
pair the library cannot run in the graph's order (oneDNN's binary overload applies its
binary post-op first and then takes only ``relu``) has no entry; the pass leaves that
activation as its own node, and a node built by hand with such a pair runs on ATen op by op
(``aten_step``, codegen/aten_fallback.py). Nothing else branches on the epilogue.

Weights. A weight is a graph input (role ``param``) whose tensor the caller passes at every
call, the same tensor object each time in inference. The step that ``torch_prepare`` builds
keeps one packed copy per node (``PackedWeight``): oneDNN's blocked layout for a convolution
weight, the [N, K] contiguous copy for a [K, N] linear weight. The copy is used only while the
caller passes the same tensor object (a weak reference) at the same ``tensor._version`` (torch
bumps it on every in-place write); anything else runs the unpacked kernel for that call and
remembers the new tensor, which is packed when it comes again unchanged. So a new tensor or an
in-place update is noticed, a weight used once is never packed, and a NumPy weight (converted
to a new tensor at each call) always runs unpacked. Inference tensors (made under
torch.inference_mode) have no version counter and are never packed. The copy is also keyed by
the tensor's address, so a storage swapped under the same object (``w.data = other``) is
noticed. Writes torch cannot see (in place through ``tensor.data``, or the NumPy array a tensor
shares memory with) are not noticed: assign new tensors instead.
"""

from __future__ import annotations

import math
import os
import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

import numpy as np

from ..ir.diagnostics import TypeRuleError
from ..ir.dtypes import f32
from ..backend.common import describe_node
from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ops._lazy import torch
from ..ops.registry import AttrSpec, Cost, OPS, OpDef, register
from ..passes.manager import Pass, register_pass
from ..passes.rewrite import erase_if_dead, has_effects, sole_user
from .aten_fallback import aten_conv, aten_epilogue, aten_linear, aten_step, pad_uneven
from .choose import enabled as choose_enabled
from .epilogue import BINARY, CLAMPS, CONV_ATTRS, CONV_UNARY, UNARY, conv_padding_end, conv_parts, linear_parts
from .group_norm import fuse_mean
from .norm import fuse_add_norm
from .grn import fuse_grn
from .disentangled import fuse_rel_scores
from .one_key_attention import fuse_attention_one_key
from .trailing_slice import fold_trailing_slices
from .sibling_rows import flatten_sibling_linears
from .batched_weight import unbroadcast_weight
from .factored_gelu import take_factored_gelu
from .levit_blocks import tidy_after_library, tidy_for_library
from .move_chain import fold_move_chains
from .row_gather import fold_row_gathers
from .mix_ffn import hoist_activations
from .funnel_blocks import tidy_view_writes
from .fx_spelling import respell_folded_indices
from .empty_parts import drop_empty_parts
from .rotary import fuse_rotary

__all__ = ["UNARY", "BINARY", "KERNELS", "ANCHORS", "Kernel", "PackedWeight", "FuseLibrary", "kernel_for",
           "PREPACK", "packed_weight_stats", "LinearChoice", "aten_linear_run", "linear_step",
           "GEMM_MIN_FLOPS", "LINEAR_CANDIDATE_MIN_FLOPS"]

# Whether fuse-library takes ReLU6 and hardswish (``CLAMPS``) after a convolution as its
# "relu6" / "hardswish" epilogue: on unless PARTITA_CLAMP_EPILOGUES=0 (read when the pass runs).
# Taken, a MobileNet's convolutions hand their results straight to each other (mobilenet_v1 of
# the zoo: 109 steps -> 29, 0.58 of its time without them; docs/codegen.md), and the layout pass
# has no elementwise op left to move there.
CLAMP_EPILOGUES = os.environ.get("PARTITA_CLAMP_EPILOGUES", "1") != "0"

# Whether prepared steps keep packed weights (the benchmark turns it off to measure what
# packing buys; read when a program is prepared).
PREPACK = True


def unary_kind(op: str, attrs: dict) -> str | None:
    """The ``UNARY`` kind of a node ``op{attrs}``, or None when it is no epilogue."""
    for kind, u in UNARY.items():
        if u is not None and u.op == op and all(attrs.get(k) == v for k, v in u.attrs.items()):
            return kind
    return None


def binary_kind(op: str) -> str | None:
    for kind, b in BINARY.items():
        if b is not None and b.op == op:
            return kind
    return None


def _require_float(op: str, ts: list[tuple[TensorType | None, str]]) -> None:
    """Float operands of one dtype. The library kernels are f32; another float dtype (the
    reference's f64, say) runs on ATen."""
    x = ts[0][0]
    assert x is not None
    if not x.dtype.is_float or x.dtype.storage:
        raise TypeRuleError(f"{op}: the input must be a float tensor (f32 runs the library kernel), got {x}")
    for t, what in ts[1:]:
        if t is not None and t.dtype is not x.dtype:
            raise TypeRuleError(f"{op}: {what} must have the input's dtype {x.dtype}, got {t}")


def _conv_infer(ts: list[TensorType], attrs: dict) -> TensorType:
    binary = attrs["binary"]
    n = len(ts)
    if binary == "none" and n > 3:
        raise TypeRuleError(f"conv2d_pointwise: 4 operands (x, weight, bias, other) need a binary epilogue, "
                            f"but binary is \"none\"; give binary=\"add\" or drop the last operand")
    if binary != "none" and n < 3:
        raise TypeRuleError(f"conv2d_pointwise: binary=\"{binary}\" needs the operand 'other' after x and weight "
                            "(and the optional bias)")
    x, w, b, other = conv_parts(list(ts), attrs)
    _require_float("conv2d_pointwise", [(x, "the input"), (w, "the weight"), (b, "the bias"), (other, "other")])
    conv_attrs = {k: attrs[k] for k in CONV_ATTRS}
    end = attrs.get("padding_end")
    if end is not None:
        # the padding after each spatial dim as the conv2d of an input padded on both sides
        if len(end) != 2 or any(p < 0 for p in end) or len(attrs["padding"]) != 2 or x.rank != 4:
            raise TypeRuleError(f"conv2d_pointwise: padding_end must be two sizes >= 0 (bottom, right) with "
                                f"padding two (top, left) on a 4-d input, got padding {list(attrs['padding'])}, "
                                f"padding_end {list(end)} on {x}")
        (pt, pl), (pb, pr) = attrs["padding"], end
        x = TensorType(x.shape[:2] + (x.shape[2] + pt + pb, x.shape[3] + pl + pr), x.dtype)
        conv_attrs["padding"] = (0, 0)
    base = [x, w] + ([b] if b is not None else [])
    y = OPS["conv2d"].infer(base, conv_attrs)
    if isinstance(y, list):  # conv2d has one result
        y = y[0]
    if other is not None and other != y:
        raise TypeRuleError(f"conv2d_pointwise: other must have the convolution's type {y} "
                            f"(a residual of the same shape), got {other}")
    return y


def _linear_shapes(x: TensorType, w: TensorType, layout: str) -> tuple[int, int]:
    if w.rank != 2:
        raise TypeRuleError(f"linear_pointwise: the weight must be 2-d, got {w}")
    if x.rank < 2:
        raise TypeRuleError(f"linear_pointwise: the input must be at least 2-d [..., K], got {x}")
    k, n = (w.shape if layout == "kn" else w.shape[::-1])
    if x.shape[-1] != k:
        lay = "[K, N]" if layout == "kn" else "[N, K]"
        raise TypeRuleError(f"linear_pointwise: the input {x} has K={x.shape[-1]} but the weight {w} "
                            f"(laid out {lay}, weight_layout=\"{layout}\") has K={k}")
    return k, n


def _linear_infer(ts: list[TensorType], attrs: dict) -> TensorType:
    x, w, b = linear_parts(list(ts), attrs)
    _require_float("linear_pointwise", [(x, "the input"), (w, "the weight"), (b, "the bias")])
    _, n = _linear_shapes(x, w, attrs["weight_layout"])
    if b is not None and b.shape != (n,):
        raise TypeRuleError(f"linear_pointwise: the bias must have shape [{n}] (one per output feature), got {b}")
    return TensorType(x.shape[:-1] + (n,), x.dtype)


# --- NumPy references: the replaced ops' references, rounded after each as the interpreter does

def _ref(op: str, args: list, attrs: dict, dtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        a = np.asarray(OPS[op].reference(args, attrs))
    return a if a.dtype == dtype else a.astype(dtype)


def _epilogue_ref(y: np.ndarray, binary: str, other: Any, unary: str) -> np.ndarray:
    b = BINARY[binary]
    if b is not None:
        y = _ref(b.op, [y, other], {}, y.dtype)
    u = CONV_UNARY[unary]
    if u is not None and u.steps:
        x = y
        for op, c in u.steps:
            y = _ref(op, [y, x if c == "x" else np.array(c, dtype=y.dtype)], {}, y.dtype)
    elif u is not None:
        y = _ref(u.op, [y], dict(u.attrs), y.dtype)
    return y


def _conv_reference(args, attrs):
    x, w, b, other = conv_parts(list(args), attrs)
    end = conv_padding_end(attrs)
    if end is not None:  # zeros before and after, then no padding
        (pt, pl), (pb, pr) = attrs["padding"], end
        x = _ref("pad", [x], {"pads": (0, 0, 0, 0, pt, pb, pl, pr), "value": 0}, x.dtype)
        attrs = dict(attrs, padding=(0, 0))
    y = _ref("conv2d", [x, w] + ([b] if b is not None else []), {k: attrs[k] for k in CONV_ATTRS}, x.dtype)
    return _epilogue_ref(y, attrs["binary"], other, attrs["unary"])


def _linear_reference(args, attrs):
    x, w, b = linear_parts(list(args), attrs)
    if attrs["weight_layout"] == "nk":
        w = _ref("transpose", [w], {"perm": (1, 0)}, w.dtype)
    y = _ref("matmul", [x, w], {}, x.dtype)
    if b is not None:
        y = _ref("add", [y, b], {}, y.dtype)
    return _epilogue_ref(y, "none", None, attrs["unary"])


# --- packed weights ---------------------------------------------------------------------------

_STATS = {"packed": 0, "unpacked_calls": 0, "generated_conv_calls": 0, "winograd_calls": 0,
          "linear_generated": 0, "linear_aten": 0}


def packed_weight_stats() -> dict[str, int]:
    """How many weights this process packed, how many calls ran a kernel unpacked, how many
    convolutions ran on a generated kernel (codegen/winograd.py or codegen/conv.py), and how
    many of those on Winograd's; how many linear layers' measured choices (``LinearChoice``)
    kept the generated GEMM (``linear_generated``) and how many ATen's addmm (``linear_aten``)."""
    return dict(_STATS)


def count_calls(counts: list[tuple[str, int]]) -> None:
    """Add ``counts`` to ``packed_weight_stats``'s counters (codegen/step_chain.py: the calls
    its members' own steps would have counted)."""
    for k, v in counts:
        _STATS[k] += v


# fuse-library rewrites a patch convolution (stride = kernel) as a GEMM when the generated
# GEMM compiles (``_patch_conv``) and a patch row is at least PATCH_GEMM_MIN_KW floats: the
# gather of ConvNeXt's 4 x 4 and 2 x 2 patches (runs of 4 and 2 floats) cost more than the
# convolution it replaced (the zoo's ConvNeXt: 0.76 of the time with them left convolutions).
PATCH_CONV_AS_GEMM = True
PATCH_GEMM_MIN_KW = 8


_INFERENCE_WEIGHT_WARNED = [False]


def _warn_inference_weight() -> None:
    """Say once a process that a weight is an inference tensor, which no packed copy can be
    kept for (regnet's import path: 1.6 ms a call against 0.13 with the same weights made
    outside inference mode, one thread)."""
    if _INFERENCE_WEIGHT_WARNED[0]:
        return
    _INFERENCE_WEIGHT_WARNED[0] = True
    import warnings

    warnings.warn("partita: a weight passed to a compiled program is an inference tensor (made under "
                  "torch.inference_mode): it has no version counter, so no packed copy of it can be kept from "
                  "call to call and every call runs the unpacked kernels, several times slower. Make the weight "
                  "tensors outside torch.inference_mode (calling the program under it is fine).",
                  RuntimeWarning, stacklevel=3)


class PackedWeight:
    """One node's packed copy of its weight operand (see the module doc for the key).

    ``get(w)`` is the packed copy of ``w`` when ``w`` is the tensor seen at the previous call
    (the same object, at the same ``_version``), packing it on its second unchanged sighting;
    None otherwise (the caller runs the unpacked kernel)."""

    __slots__ = ("pack", "ref", "version", "packed", "view", "ptr")

    def __init__(self, pack: Callable) -> None:
        self.pack = pack
        self.view: Any = None
        self.ref: Any = None
        self.version = -1
        self.ptr = -1
        self.packed: Any = None

    def get(self, w: Any) -> Any:
        try:
            version = w._version
        except RuntimeError:  # an inference tensor: in-place writes would go unseen
            _warn_inference_weight()
            return None
        # A view of a weight (a reshape made by a step at every call) is a new tensor each
        # time: it is the same weight when its base is the same tensor and the view the same.
        base = w._base
        key = w if base is None else base
        view = None if base is None else (w.shape, w.stride(), w.storage_offset())
        ref = self.ref
        ptr = w.data_ptr()
        if ref is not None and version == self.version and ref() is key and view == self.view and ptr == self.ptr:
            packed = self.packed
            if packed is None:
                packed = self.packed = self.pack(w)
                _STATS["packed"] += 1
            return packed
        try:
            self.ref = weakref.ref(key)
        except TypeError:
            self.ref = None
            return None
        self.version = version
        self.view = view
        self.ptr = ptr
        self.packed = None
        return None


# --- the rule table: (op, (binary, unary)) -> the library kernel that runs it --------------------

@dataclass(frozen=True)
class Kernel:
    """A library kernel: ``name`` says what runs; ``prepare(node) -> step`` builds the torch
    executor's step function for one node (its packed weight cache included). Below
    ``min_flops`` (the node's cost) the call's fixed overhead outweighs what the kernel saves,
    and the node runs on ATen instead."""

    name: str
    prepare: Callable[..., Callable]
    min_flops: int | Callable[[], int] = 0

    def threshold(self) -> int:
        """``min_flops``, asked of this machine when it depends on what compiles here."""
        return self.min_flops() if callable(self.min_flops) else self.min_flops


def _mkldnn_ok() -> bool:
    return bool(torch.backends.mkldnn.is_available())


def _conv_kernel(binary: str, unary: str) -> Kernel:
    u = CONV_UNARY[unary]
    b = BINARY[binary]
    attr = "none" if u is None else u.onednn
    alg = None if u is None else u.algorithm
    if b is None:
        name = f"mkldnn._convolution_pointwise(attr={attr!r}" + (f", algorithm={alg!r})" if alg else ")")
    else:
        name = f"mkldnn._convolution_pointwise.binary(binary_attr={b.onednn!r}, unary_attr=" + \
            (f"{attr!r})" if u is not None else "None)")
    if binary in ("none", "add") and unary in ("none", "relu"):
        name = (f"partita.conv(packed weight, binary={binary!r}, unary={unary!r}): Winograd F(2x2, 3x3) where "
                f"codegen/winograd.py takes the node, else the direct kernel where codegen/conv.py does, or the "
                f"depthwise one of codegen/depthwise.py; measured against this and ATen's conv2d once its weight "
                f"is packed (codegen/choose.py); before packing and elsewhere {name}")

    def prepare(node, out: Any = None) -> Callable:
        attrs = node.attrs
        pad, stride, dil, groups = (list(attrs["padding"]), list(attrs["stride"]), list(attrs["dilation"]),
                                    attrs["groups"])
        in_size = list(node.operands[0].type.shape)
        uneven = conv_padding_end(attrs)
        if uneven is not None:  # oneDNN convolves the input padded first, with no padding of its own
            in_size = in_size[:2] + [in_size[2] + pad[0] + uneven[0], in_size[3] + pad[1] + uneven[1]]
            pad = [0, 0]
        fallback = aten_step("conv2d_pointwise")
        cache = PackedWeight(lambda w: torch.ops.mkldnn._reorder_convolution_weight(
            w, pad, stride, dil, groups, in_size)) if PREPACK else None
        # A result the caller gets back is contiguous; between library convolutions a
        # packed kernel's channels-last result is passed on as it is.
        to_caller = node.results[0].is_output
        channels_last = torch.channels_last
        has_other = b is not None
        has_bias = len(node.operands) == (4 if has_other else 3)
        if b is None:
            conv = torch.ops.mkldnn._convolution_pointwise.default
            scalars: list = [] if u is None else list(u.scalars)

            def call(x, w, bias, other):
                return conv(x, w, bias, pad, stride, dil, groups, attr, scalars, alg)
        else:
            convb = torch.ops.mkldnn._convolution_pointwise.binary
            uattr = None if u is None else u.onednn
            ualg = None if u is None else u.algorithm
            battr = b.onednn

            def call(x, w, bias, other):
                return convb(x, other, w, bias, pad, stride, dil, groups, battr, None, uattr, [], ualg)
        if uneven is not None:
            call = _padded_first(call, attrs)

        gen = _generated_conv(node, binary, unary) if PREPACK else None
        default = "generated"
        if gen is None and cache is not None and choose_enabled():
            # not the rules' kernel, but one the measured choice times against oneDNN's
            gen, default = _generated_conv(node, binary, unary, candidate=True), "onednn"
        st = _ConvState(gen, cache, node, default)

        def deliver(y: Any, into: Any) -> Any:
            if into is not None:  # the memory plan's buffer holds the result at every call
                into.copy_(y)
                return into
            return y.contiguous() if to_caller else y

        def run_generated(x, packed, bias, other, into):
            _STATS["generated_conv_calls"] += 1
            _STATS["winograd_calls"] += st.winograd
            y = st.gen(x, packed, bias, other, into)
            return y.contiguous() if to_caller else y

        def run_onednn(x, packed, bias, other, into):
            if not x.is_contiguous(memory_format=channels_last):
                x = x.contiguous(memory_format=channels_last)
            return deliver(call(x, packed, bias, other), into)

        def run_aten(args, attrs, into):
            return deliver(fallback(args, attrs), into)

        def step(args: list, attrs: dict) -> Any:
            x = args[0]
            fast = st.fast   # (weight's weakref, its version, packed, address) of the generated kernel's last call
            if fast is not None and fast[0]() is args[1] and args[1]._version == fast[1] \
                    and args[1].data_ptr() == fast[3] and x.is_cpu:
                _STATS["generated_conv_calls"] += 1   # run_generated, inlined: every call of the program
                _STATS["winograd_calls"] += st.winograd
                y = st.gen(x, fast[2], args[2] if has_bias else None, args[-1] if has_other else None, out)
                return y.contiguous() if to_caller else y
            if not x.is_cpu:
                return fallback(args, attrs)
            picked = st.picked
            if picked == "aten":
                return run_aten(args, attrs, out)
            w = args[1]
            bias = args[2] if has_bias else None
            other = args[-1] if has_other else None
            gp = st.gcache.get(w) if st.gcache is not None else None
            if gp is not None and picked is not None:
                # the same weight tensor unchanged next time: PackedWeight.get's answer again
                st.fast = (weakref.ref(w), w._version, gp, w.data_ptr()) if w._base is None else None
                return run_generated(x, gp, bias, other, out)
            op = st.cache.get(w) if st.cache is not None else None
            if picked is None and (gp is not None or st.gcache is None) and op is not None:
                # the steady state (every weight packed): time the kernels once, keep the fastest
                cands = {} if gp is None else {"generated": lambda: run_generated(x, gp, bias, other, None)}
                cands["onednn"] = lambda: run_onednn(x, op, bias, other, None)
                cands["aten"] = lambda: run_aten(args, attrs, None)
                picked = st.measure(x, cands)
                if picked == "aten":
                    return run_aten(args, attrs, out)
                if picked == "onednn":
                    return run_onednn(x, op, bias, other, out)
            if gp is not None:
                return run_generated(x, gp, bias, other, out)
            if op is None:
                _STATS["unpacked_calls"] += 1
                return deliver(call(x, w, bias, other), out)
            return run_onednn(x, op, bias, other, out)

        if out is not None and not to_caller:
            def native_entry(args: list | None) -> tuple[int, int] | None:
                """(entry, parameter block) of the kernel that a call with ``args`` (None: the
                tensors of the last call) would run as its one native call on one thread, or None
                where the call would do more (pack, measure, bind the block anew, copy)."""
                fast, gen = st.fast, st.gen
                if fast is None or gen is None:
                    return None
                w = fast[0]()
                if w is None or w._version != fast[1] or w.data_ptr() != fast[3]:
                    return None
                ask = getattr(gen, "native_entry", None)
                if ask is None:
                    return None
                if args is None:
                    return ask(None, fast[2], None, None, out)
                if args[1] is not w or not args[0].is_cpu:
                    return None
                return ask(args[0], fast[2], args[2] if has_bias else None, args[-1] if has_other else None, out)

            step.native_entry = native_entry  # type: ignore[attr-defined]  # codegen/step_chain.py
            step.native_out = out  # type: ignore[attr-defined]
            step.native_stats = st  # type: ignore[attr-defined]
        return step

    return Kernel(name, prepare)


def conv_step_stats(step: Any) -> dict[str, int]:
    """The counters one native call of a chained convolution step adds (``_STATS``), as its
    own fast path does."""
    st = getattr(step, "native_stats", None)
    if not isinstance(st, _ConvState):
        return {}
    return {"generated_conv_calls": 1, "winograd_calls": int(st.winograd)}


def _padded_first(call: Callable, attrs: dict) -> Callable:
    """``call(x, w, bias, other)`` of a library convolution with no padding, on ``x`` padded
    with the node's uneven zeros first (``pad_uneven``)."""
    def padded(x, w, bias, other):
        return call(pad_uneven(x, attrs)[0], w, bias, other)

    return padded


class _ConvState:
    """One convolution node's kernels (the generated one, ``gen``, and oneDNN's, each with its
    packed weight) and which runs it: ``picked`` is None until measured (``choose.py``, in the
    steady state: every weight packed), "rules" when not measured (the generated kernel where
    it has a packed weight, else oneDNN's), else the measured "generated", "onednn" or "aten"
    (the ops the node replaces, as eager runs them). The losers' packed weights are dropped.
    ``default``: the kernel a candidate must beat ("onednn" where the generated kernel is only
    a candidate, one the rules do not prefer)."""

    __slots__ = ("gen", "gcache", "cache", "winograd", "picked", "key", "where", "node", "default", "fast")

    def __init__(self, gen: Any, cache: "PackedWeight | None", node: Any, default: str = "generated") -> None:
        from . import choose

        self.default = default
        self.fast: tuple | None = None   # the steady state's generated call (ConvLibrary's step)
        self.gen = gen
        self.gcache = PackedWeight(gen.pack) if gen is not None else None
        self.cache = cache
        self.winograd = gen is not None and conv_kernel_name(gen) == "winograd"
        self.node = weakref.ref(node)
        self.picked: str | None = None if cache is not None and choose.enabled() else "rules"
        a = node.attrs
        self.key = (f"conv2d_pointwise x={list(node.operands[0].type.shape)} w={list(node.operands[1].type.shape)} "
                    f"stride={list(a['stride'])} padding={list(a['padding'])} dilation={list(a['dilation'])} "
                    f"groups={a['groups']} binary={a['binary']} unary={a['unary']} operands={len(node.operands)}"
                    + (f" padding_end={list(a['padding_end'])}" if conv_padding_end(a) is not None else ""))
        self.where = (f"{describe_node(node)} (x {'x'.join(map(str, node.operands[0].type.shape))}, "
                      f"w {'x'.join(map(str, node.operands[1].type.shape))}, groups {a['groups']})")

    def measure(self, x: Any, candidates: dict[str, Callable[[], Any]]) -> str:
        """Time ``candidates`` on this call's arguments (or take the cached choice) and keep
        the fastest for good."""
        from . import choose

        layout = ("channels_last" if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
                  else "contiguous" if x.is_contiguous() else "strided")
        default = self.default if self.default in candidates else "onednn"
        picked = choose.choose(f"{self.key} layout={layout}", candidates, where=self.where, default=default,
                               node=self.node())
        self.picked = picked
        if picked != "generated":
            self.gen = self.gcache = None
        if picked == "aten":
            self.cache = None
        return picked


# "generated" (the default) or "onednn": which kernel runs a convolution the generated kernels
# take (codegen/winograd.py, codegen/conv.py) once its weight is packed.
CONV = os.environ.get("PARTITA_CONV", "generated")
# "1" (the default) or "0": whether 3 x 3 convolutions of stride 1 run Winograd's F(2x2, 3x3)
# (codegen/winograd.py) rather than the direct kernel.
WINOGRAD = os.environ.get("PARTITA_WINOGRAD", "1") != "0"


def _winograd(xs: tuple, ws: tuple, a: dict, unary: str, other: bool) -> Any:
    from .winograd import PreparedWinograd, supported

    if not WINOGRAD or conv_padding_end(a) is not None or \
            supported(xs, ws, a["stride"], a["padding"], a["dilation"], a["groups"]):
        return None
    return PreparedWinograd(xs, ws, list(a["padding"]), unary, other)


def _direct(xs: tuple, ws: tuple, a: dict, unary: str, other: bool, candidate: bool = False) -> Any:
    from .conv import PreparedConv, supported

    if supported(xs, ws, a["stride"], a["padding"], a["dilation"], a["groups"], candidate):
        return None
    return PreparedConv(xs, ws, list(a["stride"]), list(a["padding"]), unary, other,
                        padding_end=conv_padding_end(a), groups=a["groups"])


def _depthwise(xs: tuple, ws: tuple, a: dict, unary: str, other: bool) -> Any:
    from .depthwise import PreparedDepthwise, supported

    end = conv_padding_end(a)
    if supported(xs, ws, a["stride"], a["padding"], a["dilation"], a["groups"], end):
        return None
    return PreparedDepthwise(xs, ws, list(a["stride"]), list(a["padding"]), unary, other, list(a["dilation"]), end)


def _grouped(xs: tuple, ws: tuple, a: dict, unary: str, other: bool) -> Any:
    from .grouped_conv import prepare

    return prepare(xs, ws, a, unary, other, conv_padding_end(a))


def _patch(xs: tuple, ws: tuple, a: dict, unary: str, other: bool) -> Any:
    from .patch_conv import PreparedPatchConv, supported

    if supported(xs, ws, a["stride"], a["padding"], a["dilation"], a["groups"], conv_padding_end(a), unary, other):
        return None
    return PreparedPatchConv(xs, ws)


# The generated convolution kernels, in order of preference: each returns its prepared kernel
# for a node it takes, or None. Winograd first: on the 3 x 3 convolutions of the CNN benchmark
# it took 0.50 to 0.67 of the direct kernel's time (8 x {32, 64, 128} channels at {64, 32, 16}
# pixels square; one thread, AMD EPYC Zen 4, bench/bench_library.py --part conv). The first two
# take groups=1 only (the direct kernel a few groups too, as a candidate of the measured choice:
# codegen/conv.py's ``block_diagonal``), the depthwise kernel (codegen/depthwise.py) groups =
# channels only. A patch convolution (stride = kernel, no epilogue but the bias: ConvNeXt's stem
# and downsampling) has its own kernel, reading the input in its own layout (codegen/patch_conv.py).
CONV_KERNELS: tuple[tuple[str, Callable[..., Any]], ...] = (("patch", _patch), ("winograd", _winograd),
                                                            ("direct", _direct), ("depthwise", _depthwise))


def conv_kernel_name(gen: Any) -> str:
    """Which of ``CONV_KERNELS`` a prepared convolution is."""
    from .depthwise import PreparedDepthwise
    from .winograd import PreparedWinograd

    from .patch_conv import PreparedPatchConv

    if isinstance(gen, PreparedWinograd):
        return "winograd"
    if isinstance(gen, PreparedPatchConv):
        return "patch"
    return "depthwise" if isinstance(gen, PreparedDepthwise) else "direct"


def _generated_conv(node: Any, binary: str, unary: str, candidate: bool = False) -> Any:
    """The generated convolution (the first of ``CONV_KERNELS`` that takes ``node``) prepared
    for it, or None where none does: another kernel asked for (``CONV``), an epilogue other
    than bias, add and the activations the kernels apply (conv.py's ``ACTS`` and ``CLAMP_ACTS``;
    depthwise.py's for the depthwise kernel),
    operands not f32 or not static, or no generated code on this machine. ``candidate``: the
    direct kernel where it can run the node at all, its tile padded included (a candidate of
    the measured choice, not the rules' pick)."""
    from .conv import ACTS, CLAMP_ACTS
    from .depthwise import ACTS as DW_ACTS

    DIRECT_ACTS, DEPTHWISE_ACTS = ACTS + CLAMP_ACTS, DW_ACTS + CLAMP_ACTS

    if CONV != "generated" or binary not in ("none", "add") or unary not in DEPTHWISE_ACTS:
        return None
    ops = node.operands
    if any(v.type.dtype is not f32 for v in ops) or node.results[0].type.dtype is not f32:
        return None
    xs, ws = tuple(ops[0].type.shape), tuple(ops[1].type.shape)
    if any(not isinstance(d, int) for d in (*xs, *ws)) or not _generated_gemm():
        return None
    # a candidate: a grouped convolution per group (codegen/grouped_conv.py) where its groups are wide
    kernels = (("grouped", _grouped), ("direct", partial(_direct, candidate=True))) if candidate else CONV_KERNELS
    for name, make in kernels:
        if unary not in (DEPTHWISE_ACTS if name == "depthwise" else DIRECT_ACTS if name in ("direct", "grouped")
                         else ("none", "relu")):
            continue
        try:
            gen = make(xs, ws, node.attrs, unary, binary == "add")
        except Exception as e:  # CodegenError: the next kernel, at last the library's, runs it
            import warnings

            warnings.warn(f"partita: the generated convolution ({name}) did not compile ({e}); "
                          "the next kernel runs it", RuntimeWarning, stacklevel=2)
            continue
        if gen is not None:
            return gen
    return None


# oneDNN's inner product costs some 15 microseconds more per call than ATen's addmm (one thread,
# AMD EPYC; bench/bench_library.py --part linear): [8,64]x[64,10] 21 vs 5 us, [32,256]x[256,256]
# 69 vs 51 us, [64,512]x[512,512] 353 vs 362 us. With a post-op, which saves ATen's separate
# activation, the break-even comes sooner: 73 vs 71 us and 374 vs 402 us on the last two.
LINEAR_MIN_FLOPS = 32_000_000
LINEAR_MIN_FLOPS_POST_OP = 8_000_000


# The generated GEMM's prepared call costs about what ATen's addmm does (10 vs 9 us on
# [8, 64] x [64, 10], 58 vs 61 on [32, 256] x [256, 256]; bench/bench_library.py --part gemm),
# and it applies the activation in the same pass; below this the packed copy is not worth its
# memory.
GEMM_MIN_FLOPS = 1_000_000
# With measured kernel choice on (codegen/choose.py), a linear layer from this size up to
# GEMM_MIN_FLOPS is a candidate of the generated GEMM too, measured against ATen's addmm (the
# rules' pick there); below it a call is a few microseconds either way and stays on ATen.
LINEAR_CANDIDATE_MIN_FLOPS = 200_000


def _generated_gemm() -> bool:
    """Whether partita's generated GEMM (codegen/gemm.py) compiles on this machine; asked once,
    the reason reported once as a warning when it does not."""
    global _GEMM_OK
    if _GEMM_OK is None:
        try:
            from .gemm import kernel

            kernel("none")
            _GEMM_OK = True
        except Exception as e:  # CodegenError, or llvmlite missing
            import warnings

            warnings.warn(f"partita: the generated GEMM is not available ({e}); packed linear layers run on oneDNN",
                          RuntimeWarning, stacklevel=3)
            _GEMM_OK = False
    return _GEMM_OK


_GEMM_OK: bool | None = None


def _linear_kernel(unary: str) -> Kernel:
    """A linear layer: oneDNN's inner product with the activation as its post-op until the
    weight is packed; then partita's generated GEMM over the packed panels with the bias and
    the activation applied to each tile while it is in L1 (codegen/gemm.py). The generated GEMM
    was 0.9 to 1.2 of ONNX Runtime's MLAS Gemm and faster than oneDNN on the transformer shapes
    measured interleaved on one thread ([512, 256] x [256, 1024], [32, 4096] x [4096, 4096],
    [148, 256] x [256, 256]; AMD EPYC, AVX2); the model-level figures are bench/bench_codegen.py's."""
    u = CONV_UNARY[unary]
    attr = "none" if u is None else u.onednn
    alg = None if u is None else u.algorithm
    name = (f"partita.gemm(packed B, epilogue={unary!r}); before packing mkldnn._linear_pointwise(attr={attr!r}" +
            (f", algorithm={alg!r})" if alg else ")"))

    def prepare(node, out: Any = None) -> Callable:
        return linear_step(tuple(node.results[0].type.shape), node.operands[0].type.shape[-1],
                           node.attrs["weight_layout"], len(node.operands) == 3, unary, out, node=node)

    def min_flops() -> int:
        if PREPACK and _generated_gemm():
            return LINEAR_CANDIDATE_MIN_FLOPS if choose_enabled() else GEMM_MIN_FLOPS
        return LINEAR_MIN_FLOPS if u is None else LINEAR_MIN_FLOPS_POST_OP

    return Kernel(name, prepare, min_flops)


class LinearChoice:
    """One linear layer's measured choice between the generated GEMM and ATen's addmm
    (``choose.py``), made at its first call with the weight packed: ``picked`` is None until
    then, else "generated" or "aten". ``default`` is the rules' pick: the generated GEMM from
    ``GEMM_MIN_FLOPS`` up, ATen's addmm below."""

    __slots__ = ("picked", "key", "where", "node", "default")

    def __init__(self, node: Any, m: int, k: int, n: int, layout: str, has_bias: bool, unary: str) -> None:
        self.picked: str | None = None
        from .cnn_blocks import HEAD_MAX_ROWS

        flops = 2 * m * k * n
        small = m <= HEAD_MAX_ROWS and flops < LINEAR_CANDIDATE_MIN_FLOPS   # cnn_blocks.head_linear
        self.default = "generated" if flops >= GEMM_MIN_FLOPS or small else "aten"
        self.key = f"linear_pointwise m={m} k={k} n={n} layout={layout} bias={has_bias} unary={unary}"
        self.where = f"{describe_node(node)} ([{m}, {k}] x [{k}, {n}], {unary})"
        self.node = weakref.ref(node)

    def measure(self, candidates: dict[str, Callable[[], Any]]) -> str:
        """Time ``candidates`` on this call's arguments (or take the cached choice); kept for good."""
        from . import choose

        self.picked = choose.choose(self.key, candidates, where=self.where, default=self.default,
                                    node=self.node())
        _STATS["linear_generated" if self.picked == "generated" else "linear_aten"] += 1
        return self.picked


def aten_linear_run(out_shape: tuple, k: int, kn: bool, unary: str, out: Any = None) -> Callable:
    """``run(x, w, bias)``: a linear layer as ATen's addmm (mm without a bias) on the weight
    as stored (a transposed view where it is [N, K]), written into ``out`` where given, then
    its activation (relu and silu in place)."""
    n = out_shape[-1]
    m = math.prod(out_shape[:-1])
    addmm, mm = torch.addmm, torch.mm
    out2 = None if out is None else out.view(m, n)
    inplace = {"relu": torch.relu_, "silu": lambda t: torch.nn.functional.silu(t, inplace=True)}.get(unary)
    plain = unary == "none"

    def run(x: Any, w: Any, bias: Any) -> Any:
        x2 = x.reshape(m, k)
        w2 = w if kn else w.t()
        y = mm(x2, w2, out=out2) if bias is None else addmm(bias, x2, w2, out=out2)
        if inplace is not None:
            inplace(y)
        elif not plain:
            z = aten_epilogue(y, "none", None, unary)
            y = z if out2 is None else out2.copy_(z)
        return out if out is not None else y.view(out_shape)

    return run


def linear_step(out_shape: tuple, k: int, layout: str, has_bias: bool, unary: str, out: Any = None,
                node: Any = None) -> Callable:
    """The torch executor's step for one ``linear_pointwise`` node with the result shape
    ``out_shape`` [..., N], the inner size ``k``, the weight layout ``layout`` ("kn" or
    "nk"), a bias or not, and the activation ``unary``: see ``_linear_kernel``. With the
    generated GEMM, the result is written into ``out`` (contiguous, ``out_shape``) where given.
    With ``node`` and measured choice on, the generated GEMM and ATen's addmm are timed once
    the weight is packed (``LinearChoice``) and the faster runs the node from then on."""
    u = CONV_UNARY[unary]
    attr = "none" if u is None else u.onednn
    alg = None if u is None else u.algorithm
    lin = torch.ops.mkldnn._linear_pointwise.default
    fallback = aten_step("linear_pointwise")
    kn = layout == "kn"
    scalars: list = [] if u is None else list(u.scalars)
    n = out_shape[-1]
    m = math.prod(out_shape[:-1])
    cache: PackedWeight | None
    if PREPACK and _generated_gemm():
        from .gemm import PreparedGemm

        run = PreparedGemm(m, n, k, unary)
        gcache = cache = PackedWeight(lambda w: run.pack(w if kn else w.t()))
        get = gcache.get
        f32_ = torch.float32
        out2 = None if out is None else out.view(m, n)
        choice = LinearChoice(node, m, k, n, layout, has_bias, unary) if node is not None and choose_enabled() \
            else None
        aten = aten_linear_run(tuple(out_shape), k, kn, unary, out)
        # the last generated call's weight (a weak reference), version, packed copy, address
        fast: list = [None, -1, None, 0]

        def gen_step(args: list, attrs: dict) -> Any:
            x = args[0]
            w = args[1]
            bias = args[2] if has_bias else None
            ref = fast[0]
            if ref is not None and ref() is w and w._version == fast[1] and w.data_ptr() == fast[3] \
                    and x.dtype is f32_ and x.is_cpu and (bias is None or bias.is_contiguous()):
                return run.rows(x, fast[2], bias, out, out_shape)  # the weight packed and chosen before
            if not x.is_cpu:
                return fallback(args, attrs)
            if choice is not None and choice.picked == "aten" and x.dtype is f32_:
                return aten(x, w, bias)
            packed = get(w)
            if packed is not None and x.dtype is f32_ and (bias is None or bias.is_contiguous()):
                if choice is not None and choice.picked is None:
                    x2 = x.reshape(m, k)
                    picked = choice.measure({"generated": lambda: run(x2, packed, bias, out2),
                                             "aten": lambda: aten(x, w, bias)})
                    if picked == "aten":
                        gcache.packed = None   # the packed copy is not used again
                        return aten(x, w, bias)
                if w._base is None:
                    fast[:] = [weakref.ref(w), w._version, packed, w.data_ptr()]
                return run.rows(x, packed, bias, out, out_shape)
            _STATS["unpacked_calls"] += 1
            y = lin(x, w.t() if kn else w, bias, attr, scalars, alg)
            if out is not None:  # the memory plan's buffer holds the result at every call
                out.copy_(y)
                return out
            return y

        # one f32 tensor, the node's dtype: the executor's generated call skips its result checks
        gen_step.exact_result = node is not None and _all_f32(*node.operands, *node.results)  # type: ignore[attr-defined]
        if out is not None:
            def native_entry(args: list | None) -> tuple[int, int] | None:
                """(entry, parameter block) of the GEMM a call with ``args`` (None: the last
                call's) would run as its one native call on one thread (codegen/step_chain.py)."""
                ref = fast[0]
                w = None if ref is None else ref()
                if w is None or w._version != fast[1] or w.data_ptr() != fast[3]:
                    return None
                if args is None:
                    return run.native_entry(None, fast[2], None, out)
                if args[1] is not w or args[0].dtype is not f32_ or not args[0].is_cpu:
                    return None
                return run.native_entry(args[0], fast[2], args[2] if has_bias else None, out)

            gen_step.native_entry = native_entry  # type: ignore[attr-defined]
            gen_step.native_out = out  # type: ignore[attr-defined]
        return gen_step
    # oneDNN takes the weight [N, K]; a [K, N] weight is passed as its transpose (a view, which
    # the library reads as it is) until the packed [N, K] copy exists.
    cache = PackedWeight(lambda w: w.t().contiguous()) if PREPACK and kn else None

    def step(args: list, attrs: dict) -> Any:
        x = args[0]
        if not x.is_cpu:
            return fallback(args, attrs)
        w = args[1]
        bias = args[2] if has_bias else None
        packed = cache.get(w) if cache is not None else None
        if kn:
            if packed is None:
                _STATS["unpacked_calls"] += 1
                packed = w.t()
            w = packed
        return lin(x, w, bias, attr, scalars, alg)

    return step


def matmul_kernel(node, inplace: bool = False) -> Callable | None:
    """A plain ``matmul`` of an f32 activation [..., K] by any 2-d [K, N] operand as oneDNN's
    inner product (``x @ b`` is ``linear(x, b.T)``, the transpose a view): 6 to 17 % faster than
    torch.matmul (MKL) on the training shapes of GPT-2 on one thread, measured on
    [512,256]x[256,768] to [512,2000]x[2000,256]. Used by CompiledProgram for every matmul
    fuse-library did not take (a training step's forward and backward products, whose weights
    change every step so nothing is packed). None (torch.matmul) below LINEAR_MIN_FLOPS, for
    other dtypes or ranks, or without oneDNN."""
    a, b = node.operands
    y = node.results[0]
    if a.type.rank < 2 or b.type.rank != 2 or not _all_f32(a, b, y) or not _mkldnn_ok():
        return None
    if y.type.numel == 0 or 2 * y.type.numel * a.type.shape[-1] < LINEAR_MIN_FLOPS:
        return None
    lin = torch.ops.mkldnn._linear_pointwise.default
    scalars: list = []

    def step(args: list, attrs: dict) -> Any:
        x, w = args
        if not x.is_cpu:
            return torch.matmul(x, w)
        return lin(x, w.t(), None, "none", scalars, None)

    return step


# oneDNN's convolution takes any one unary post-op, or the binary post-op followed by relu
# (its binary overload refuses every other unary post-op: "Unary Fusion behavior undefined");
# the linear kernel takes any one unary post-op. Each entry applies binary, then unary.
KERNELS: dict[tuple[str, tuple[str, str]], Kernel] = {
    **{("conv2d_pointwise", ("none", u)): _conv_kernel("none", u) for u in UNARY},
    ("conv2d_pointwise", ("add", "none")): _conv_kernel("add", "none"),
    ("conv2d_pointwise", ("add", "relu")): _conv_kernel("add", "relu"),
    **{("linear_pointwise", ("none", u)): _linear_kernel(u) for u in UNARY},
}


# The convolutions with a clamp (``CLAMPS``, ReLU6) after them: oneDNN's hardtanh post-op, the
# generated kernels' clamp in their store.
CLAMP_KERNELS: dict[tuple[str, tuple[str, str]], Kernel] = {
    **{("conv2d_pointwise", ("none", u)): _conv_kernel("none", u) for u in CLAMPS},
    # and the linear layers with one (LeViT's hardswish): the generated GEMM's epilogue
    **{("linear_pointwise", ("none", u)): _linear_kernel(u) for u in CLAMPS}}


def epilogue_of(attrs: dict) -> tuple[str, str]:
    return (attrs.get("binary", "none"), attrs["unary"])


def kernel_for(op: str, attrs: dict) -> Kernel | None:
    """The library kernel that runs ``op`` with the epilogue of ``attrs``, or None."""
    key = (op, epilogue_of(attrs))
    return KERNELS.get(key) or CLAMP_KERNELS.get(key)


def _library_kernel(node) -> Kernel | None:
    """The library kernel the prepared step of ``node`` runs, or None (ATen runs it)."""
    kernel = kernel_for(node.op, node.attrs)
    types = [v.type for v in node.operands] + [r.type for r in node.results]
    if kernel is None or any(t.numel == 0 or t.dtype is not f32 for t in types) or not _mkldnn_ok():
        return None
    flops = OPS[node.op].cost_of(types[:len(node.operands)], types[len(node.operands):], node.attrs).flops
    from .cnn_blocks import head_linear

    if flops < kernel.threshold() and not (head_linear(node) and choose_enabled() and PREPACK and _generated_gemm()):
        return None   # a classifier-sized layer is a generated GEMM candidate still (cnn_blocks.head_linear)
    return kernel


def _prepare(node) -> Callable:
    kernel = _library_kernel(node)
    return aten_step(node.op) if kernel is None else kernel.prepare(node)


def writes_into(node) -> bool:
    """Whether the prepared step of the ``conv2d_pointwise`` or ``linear_pointwise`` ``node``
    runs generated code (the convolution of codegen/conv.py, the GEMM), which can write its
    result into a buffer it is given (``step_into``): what the memory plan asks before it
    plans the result. A convolution whose generated kernel is only a candidate of the measured
    choice writes there too (oneDNN's or ATen's result copied in where one of them wins): a
    result allocated at every call cost the small steps of MobileNets about 2 us each."""
    if _library_kernel(node) is None:
        return False
    if node.op == "conv2d_pointwise":
        return _generated_conv(node, *epilogue_of(node.attrs)) is not None or (
            PREPACK and choose_enabled() and _generated_conv(node, *epilogue_of(node.attrs), candidate=True) is not None)
    return node.op == "linear_pointwise" and PREPACK and _generated_gemm()


def step_into(node, out: Any) -> Callable:
    """The step of a node that ``writes_into``, writing its result into ``out`` (of the
    result's shape; channels-last for a convolution, contiguous for a linear layer) at every
    call: the generated kernel writes it there once the weight is packed, the library's result
    before that is copied in (the program's views of the arena read it there)."""
    kernel = _library_kernel(node)
    assert kernel is not None
    return kernel.prepare(node, out)


def _library_runs(op: str, args: list, attrs: dict) -> bool:
    return (kernel_for(op, attrs) is not None and args[0].is_cpu and _mkldnn_ok()
            and all(a.dtype is torch.float32 and a.numel() for a in args))


def _torch_conv(args, attrs):
    """Without a prepared step (no packed weight): the library kernel on the weight as given."""
    if not _library_runs("conv2d_pointwise", args, attrs):
        return aten_conv(args, attrs)
    x, w, b, other = conv_parts(list(args), attrs)
    x, attrs = pad_uneven(x, attrs)
    u = CONV_UNARY[attrs["unary"]]
    pad, stride, dil, g = list(attrs["padding"]), list(attrs["stride"]), list(attrs["dilation"]), attrs["groups"]
    if other is None:
        return torch.ops.mkldnn._convolution_pointwise(x, w, b, pad, stride, dil, g, "none" if u is None else u.onednn,
                                                       [] if u is None else list(u.scalars),
                                                       None if u is None else u.algorithm)
    bb = BINARY[attrs["binary"]]
    assert bb is not None
    return torch.ops.mkldnn._convolution_pointwise.binary(x, other, w, b, pad, stride, dil, g, bb.onednn, None,
                                                          None if u is None else u.onednn, [],
                                                          None if u is None else u.algorithm)


def _torch_linear(args, attrs):
    if not _library_runs("linear_pointwise", args, attrs):
        return aten_linear(args, attrs)
    x, w, b = linear_parts(list(args), attrs)
    u = CONV_UNARY[attrs["unary"]]
    if attrs["weight_layout"] == "kn":
        w = w.t()
    return torch.ops.mkldnn._linear_pointwise(x, w, b, "none" if u is None else u.onednn,
                                              [] if u is None else list(u.scalars), None if u is None else u.algorithm)


def _epilogue_flops(n: int, attrs: dict) -> int:
    return n * ((attrs.get("binary", "none") != "none") + (attrs["unary"] != "none"))


def _conv_cost(ins, outs, attrs):
    w = ins[1]
    cg, k = w.shape[1], w.shape[2:]
    n = outs[0].numel
    return Cost(2 * n * cg * math.prod(k) + _epilogue_flops(n, attrs), sum(t.nbytes for t in ins), outs[0].nbytes)


def _linear_cost(ins, outs, attrs):
    k = ins[0].shape[-1]
    n = outs[0].numel
    return Cost(2 * n * k + _epilogue_flops(n, attrs), sum(t.nbytes for t in ins), outs[0].nbytes)


_CONV_UNARY_ATTR = AttrSpec("unary", "str", "none", choices=tuple(CONV_UNARY))

register(OpDef(
    name="conv2d_pointwise", operands=("x", "weight", "bias?", "other?"),
    attrs=(AttrSpec("stride", "ints", (1, 1)), AttrSpec("padding", "ints", (0, 0)),
           AttrSpec("dilation", "ints", (1, 1)), AttrSpec("groups", "int", 1),
           AttrSpec("binary", "str", "none", choices=tuple(BINARY)), _CONV_UNARY_ATTR,
           AttrSpec("padding_end", "ints", None)),
    infer=_conv_infer, reference=_conv_reference, torch=_torch_conv, cost=_conv_cost, torch_prepare=_prepare,
    doc="conv2d(x, weight, bias) then binary(., other) then unary, as one oneDNN convolution with post-ops "
        "(f32). other is the last operand when binary is not \"none\" and has the result's type. padding is "
        "the zeros before each spatial dim (top, left); padding_end, where given, those after (bottom, right: "
        "a \"same\" pad of uneven sides merged in), else padding's. Made by "
        "the fuse-library pass (docs/codegen.md, \"Library kernels\"); the weight is kept packed while the "
        "caller passes the same tensor unchanged.",
))

register(OpDef(
    name="linear_pointwise", operands=("x", "weight", "bias?"),
    attrs=(_CONV_UNARY_ATTR, AttrSpec("weight_layout", "str", "kn", choices=("kn", "nk"))),
    infer=_linear_infer, reference=_linear_reference, torch=_torch_linear, cost=_linear_cost,
    torch_prepare=_prepare,
    doc="matmul(x, W) + bias then unary, as one oneDNN inner product with a post-op (f32); x is [..., K], "
        "W is weight laid out [K, N] (weight_layout=\"kn\") or transpose(weight) for a weight [N, K] (\"nk\"). "
        "Made by the fuse-library pass (docs/codegen.md, \"Library kernels\").",
))


# --- the fuse-library pass ----------------------------------------------------------------------

def _other_operand(node: Node, v: Value) -> Value | None:
    """The operand of binary ``node`` that is not ``v``: ``v`` must be its lhs, or either
    operand of a commutative op, and must not be both."""
    if len(node.operands) != 2 or len(node.results) != 1:
        return None
    a, b = node.operands
    if a is v and b is not v:
        return b
    if b is v and a is not v and OPS[node.op].commutative:
        return a
    return None


def _is_weight(v: Value) -> bool:
    """A value whose tensor is the same at every call: a param or state input, or a constant."""
    if v.is_input:
        return v.role in ("param", "state")
    p = v.producer
    return p is not None and not p.operands and len(p.results) == 1 and not has_effects(p)


def _all_f32(*vs: Value) -> bool:
    return all(v.type.dtype is f32 for v in vs)


def _scalar_const(v: Value) -> float | None:
    """The value of ``v`` where it is a scalar constant (a ``full`` of shape []), else None."""
    p = v.producer
    if p is None or p.op != "full" or v.type.shape != () or p.operands:
        return None
    return float(p.attrs["value"])


def _take_steps(op: str, binary: str, y: Value, chain: list[Node]) -> tuple[str, Value]:
    """A ``UNARY`` epilogue of ``steps`` (binary ops by scalar constants, ReLU6's maximum by 0
    then minimum by 6) after ``y``, each step the one user of the value before; a step by "x"
    (hardswish's product) takes ``y`` itself, whose only other user is then the first step."""
    if not CLAMP_EPILOGUES:
        return "none", y
    for kind, u in CLAMPS.items():
        if (op, (binary, kind)) not in CLAMP_KERNELS:
            continue
        v, taken = y, list[Node]()
        twice = any(c == "x" for _, c in u.steps)
        for step_op, c in u.steps:
            n = _first_step(y, step_op) if twice and v is y else sole_user(v)
            other = None if n is None or n.op != step_op else _other_operand(n, v)
            if n is None or other is None or (other is not y if c == "x" else _scalar_const(other) != c) or \
                    n.results[0].type != y.type:
                break
            taken.append(n)
            v = n.results[0]
        else:
            chain.extend(taken)
            return kind, v
    return "none", y


def _first_step(y: Value, op: str) -> Node | None:
    """Of an epilogue that reads its input twice (hardswish): ``y``'s user of ``op`` where ``y``
    has two users, each reading it once, and is no graph output."""
    if y.is_output or len(y.users) != 2 or any(c != 1 for c in y.users.values()):
        return None
    found = [n for n in y.users if n.op == op]
    return found[0] if len(found) == 1 else None


def _take_unary(op: str, binary: str, y: Value, chain: list[Node]) -> tuple[str, Value]:
    kind, v = _take_steps(op, binary, y, chain)
    if kind != "none":
        return kind, v
    u = sole_user(y)
    if u is None or len(u.operands) != 1 or len(u.results) != 1 or u.results[0].type != y.type:
        return "none", y
    found = unary_kind(u.op, u.attrs)
    if found is None or (op, (binary, found)) not in KERNELS:
        return "none", y
    chain.append(u)
    return found, u.results[0]


def _replace_chain(graph: Graph, chain: list[Node], op: str, operands: list[Value], attrs: dict,
                   before: list[Node]) -> Node:
    last = chain[-1]
    new = Node(op, operands, OPS[op].normalize_attrs(attrs), [last.results[0].type], chain[0].loc)
    for n in before:
        graph.insert_before(last, n)
    graph.insert_before(last, new)
    graph.replace_all_uses(last.results[0], new.results[0])
    for n in reversed(chain):
        graph.erase(n)
    return new


def _patch_conv(graph: Graph, node: Node) -> Node | None:
    """A convolution whose windows tile its input (stride = kernel, no padding or dilation, one
    group: ViT's and Swin's patch embedding) as the GEMM it is: the patches gathered by one
    transpose, then a ``linear_pointwise`` by the weight viewed as [O, C * kh * kw], then the
    result moved back to [N, O, Ho, Wo] (a view). The generated GEMM runs it at 0.55 ms where
    oneDNN's convolution took 0.86 (ViT's [4, 3, 96, 96] by 16 x 16 patches, one thread)."""
    x, w = node.operands[:2]
    bias = node.operands[2] if len(node.operands) > 2 else None
    y = node.results[0]
    a = node.attrs
    if w.type.rank != 4 or a["groups"] != 1 or any(p for p in a["padding"]) or any(d != 1 for d in a["dilation"]):
        return None
    o, c, kh, kw = w.type.shape
    n, _, h, wd = x.type.shape
    # (a 1 x 1 convolution stays: oneDNN runs it in the CNN's layout with its post-ops)
    if kh * kw < 4 or kw < PATCH_GEMM_MIN_KW or tuple(a["stride"]) != (kh, kw) or h % kh or wd % kw \
            or not _is_weight(w):
        return None
    if bias is not None and not _is_weight(bias):
        return None
    ho, wo = h // kh, wd // kw

    def add(op: str, operand: Value, attrs: dict, shape: tuple) -> Value:
        nd = Node(op, [operand], OPS[op].normalize_attrs(attrs), [TensorType(shape, f32)], node.loc)
        graph.insert_before(node, nd)
        return nd.results[0]

    t = add("reshape", x, {"shape": (n, c, ho, kh, wo, kw)}, (n, c, ho, kh, wo, kw))
    t = add("transpose", t, {"perm": (0, 2, 4, 1, 3, 5)}, (n, ho, wo, c, kh, kw))
    t = add("reshape", t, {"shape": (n * ho * wo, c * kh * kw)}, (n * ho * wo, c * kh * kw))
    wk = add("reshape", w, {"shape": (o, c * kh * kw)}, (o, c * kh * kw))
    lin = Node("linear_pointwise", [t, wk] + ([bias] if bias is not None else []),
               OPS["linear_pointwise"].normalize_attrs({"unary": "none", "weight_layout": "nk"}),
               [TensorType((n * ho * wo, o), f32)], node.loc)
    graph.insert_before(node, lin)
    r = add("reshape", lin.results[0], {"shape": (n, ho, wo, o)}, (n, ho, wo, o))
    r = add("transpose", r, {"perm": (0, 3, 1, 2)}, (n, o, ho, wo))
    graph.replace_all_uses(y, r)
    graph.erase(node)
    return lin


def _fuse_conv(graph: Graph, node: Node) -> Node | None:
    y = node.results[0]
    if len(node.results) != 1 or y.type.rank != 4 or not _all_f32(*node.operands, y):
        return None
    patch = _patch_conv(graph, node) if PATCH_CONV_AS_GEMM and _generated_gemm() else None
    if patch is not None:
        return patch
    x, w = node.operands[:2]
    bias = node.operands[2] if len(node.operands) > 2 else None
    o = y.type.shape[1]
    chain = [node]
    before: list[Node] = []
    u = sole_user(y)
    # A per-channel bias added after a conv without one: the conv's bias operand.
    if bias is None and u is not None and u.op == "add":
        c = _other_operand(u, y)
        if c is not None and c.type.dtype is f32 and c.type.shape in ((1, o, 1, 1), (o, 1, 1)) and \
                u.results[0].type == y.type:
            p = c.producer
            if p is not None and p.op == "reshape" and p.operands[0].type == TensorType((o,), f32):
                bias = p.operands[0]
            else:
                r = Node("reshape", [c], OPS["reshape"].normalize_attrs({"shape": (o,)}), [TensorType((o,), f32)],
                         u.loc)
                before.append(r)
                bias = r.results[0]
            chain.append(u)
            y = u.results[0]
            u = sole_user(y)
    binary, other = "none", None
    if u is not None:
        kind = binary_kind(u.op)
        if kind is not None and ("conv2d_pointwise", (kind, "none")) in KERNELS:
            c = _other_operand(u, y)
            if c is not None and c.type == y.type and u.results[0].type == y.type:
                binary, other = kind, c
                chain.append(u)
                y = u.results[0]
    unary, y = _take_unary("conv2d_pointwise", binary, y, chain)
    attrs = {k: node.attrs[k] for k in CONV_ATTRS}
    pad = _zero_pad_of(x, node)
    pad_node = x.producer
    if pad is not None:
        x, attrs["padding"], attrs["padding_end"] = pad
    operands = [x, w] + ([bias] if bias is not None else []) + ([other] if other is not None else [])
    attrs.update(binary=binary, unary=unary)
    new = _replace_chain(graph, chain, "conv2d_pointwise", operands, attrs, before)
    if pad is not None and pad_node is not None:
        erase_if_dead(graph, pad_node)
    return new


def _zero_pad_of(x: Value, conv: Node) -> tuple[Value, list[int], list[int] | None] | None:
    """Where ``x`` is a zero ``pad`` of the spatial dims only whose one user is ``conv``
    (TensorFlow-style "same" padding, uneven sides): (the pad's input, the padding before,
    the padding after or None where equal), the conv's own padding added; else None."""
    p = x.producer
    if p is None or p.op != "pad" or sole_user(x) is not conv or p.attrs["value"] != 0 or x.type.rank != 4:
        return None
    pads = list(p.attrs["pads"])
    if pads[:4] != [0, 0, 0, 0] or len(conv.attrs["padding"]) != 2:
        return None
    ph, pw = conv.attrs["padding"]
    begin, end = [ph + pads[4], pw + pads[6]], [ph + pads[5], pw + pads[7]]
    return p.operands[0], begin, (None if end == begin else end)


def _fuse_linear(graph: Graph, node: Node) -> Node | None:
    unbroadcast_weight(graph, node)   # x [B, T, K] @ broadcast_to(w) as x @ w: codegen/batched_weight.py
    x, wv = node.operands
    y = node.results[0]
    if x.type.rank < 2 or wv.type.rank != 2 or not _all_f32(x, wv, y):
        return None
    p = wv.producer
    if p is not None and p.op == "transpose" and tuple(p.attrs["perm"]) == (1, 0) and _is_weight(p.operands[0]):
        layout, weight = "nk", p.operands[0]
    elif _is_weight(wv):
        layout, weight = "kn", wv
    else:
        return None  # a product of two activations: no weight to keep packed
    n = y.type.shape[-1]
    chain = [node]
    bias = None
    u = sole_user(y)
    if u is not None and u.op == "add":
        c = _other_operand(u, y)
        if c is not None and c.type == TensorType((n,), f32) and u.results[0].type == y.type:
            bias = c
            chain.append(u)
            y = u.results[0]
    unary, y2 = _take_unary("linear_pointwise", "none", y, chain)
    operands = [x, weight] + ([bias] if bias is not None else [])
    attrs = {"unary": unary, "weight_layout": layout}
    if unary == "none":
        # A reshape between the bias add and the activation (transformers' [B*T, N] -> [B, T, N]):
        # the activation is elementwise, so it is taken before the reshape, which stays.
        r = sole_user(y)
        if r is not None and r.op == "reshape":
            taken: list[Node] = []   # the activation's nodes (hardswish's five)
            unary2, act = _take_unary("linear_pointwise", "none", r.results[0], taken)
            if unary2 != "none":
                new = Node("linear_pointwise", operands, OPS["linear_pointwise"].normalize_attrs(
                    {"unary": unary2, "weight_layout": layout}), [y.type], chain[0].loc)
                graph.insert_before(r, new)
                graph.set_operand(r, 0, new.results[0])
                graph.replace_all_uses(act, r.results[0])
                for a in reversed(taken):
                    graph.erase(a)
                for old in reversed(chain):
                    graph.erase(old)
                return new
    return _replace_chain(graph, chain, "linear_pointwise", operands, attrs, [])


# The ops a library kernel starts from, and how each takes its epilogue.
ANCHORS: dict[str, Callable[[Graph, Node], "Node | None"]] = {
    "conv2d": _fuse_conv,
    "matmul": _fuse_linear,
    "attention": fuse_rotary,
    "layer_norm": fuse_add_norm,
    "rms_norm": fuse_add_norm,
    "mean": fuse_mean,          # RMSNorm, else GroupNorm written out (codegen/group_norm.py)
    # Attention written out in ops (Gemma2's soft-capped scores, DeBERTa-v2's disentangled
    # terms) taken back into one attention node: codegen/attention_spelled.py.
    "softmax": fuse_attention_one_key,   # and MobileViT's one-key rows (codegen/one_key_attention.py)
    "sqrt": fuse_grn,           # ConvNeXt v2's global response norm (codegen/grn.py)
    "gather": fuse_rel_scores,  # DeBERTa-v2's c2p / p2c terms (codegen/disentangled.py)
}


@register_pass
class FuseLibrary(Pass):
    """conv2d and matmul by a weight, with the bias add, residual add and activation after
    them, become ``conv2d_pointwise`` / ``linear_pointwise`` nodes run by oneDNN with fused
    post-ops (f32; inference). Runs before ``fuse-kernels``, which would otherwise take the
    bias add and the activation. An epilogue is taken only in the graph's order and only where
    ``KERNELS`` has a kernel for it; an intermediate result read by anything else ends it."""

    name = "fuse-library"

    def run(self, graph: Graph) -> Graph:
        drop_empty_parts(graph)   # empty concat parts, whole-axis slices: codegen/empty_parts.py
        respell_folded_indices(graph)   # folded gather/scatter indices as matched: codegen/fx_spelling.py
        tidy_for_library(graph)   # reshape round trips and unit-axis means: codegen/levit_blocks.py
        take_factored_gelu(graph)  # BLOOM's GELU as the op, for the GEMM's epilogue: codegen/factored_gelu.py
        hoist_activations(graph)  # activations moved across layout moves onto a conv: codegen/mix_ffn.py
        tidy_view_writes(graph)   # in-place writes into views read back: codegen/funnel_blocks.py
        for node in list(graph.nodes):
            if node.graph is not graph:
                continue  # taken into an earlier node's epilogue
            fuse = ANCHORS.get(node.op)
            if fuse is not None:
                fuse(graph, node)
        fold_trailing_slices(graph)   # a conv's dropped last columns as its padding: codegen/trailing_slice.py
        tidy_after_library(graph)   # unit dims sunk below linear layers, reshape chains merged
        flatten_sibling_linears(graph)   # q, k, v layers on a 3-d input as 2-d rows: codegen/sibling_rows.py
        fold_row_gathers(graph)   # rolls and window moves as one gather of rows: codegen/row_gather.py
        fold_move_chains(graph)   # reshape/transpose chains as one transpose: codegen/move_chain.py
        return graph
