"""Layout assignment (partita/codegen/layout.py, the ``assign-layout`` pass): which nodes form a
region, the cost rule, the rewrite checked by the reference interpreter before and after, what
the torch executor holds (contiguous NHWC values, channels-last convolution inputs), models
imported from torch against eager, and random graphs.

Run as a script, it is the benchmark of docs/codegen.md, "Layout assignment":

    .venv/bin/python tests/codegen/test_layout.py --rounds 40
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import io
import os
import sys
from pathlib import Path

if __name__ == "__main__":  # one thread, set before torch is imported
    for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_v, "1")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita
from partita.backend import numpy_ref
from partita.codegen import CompiledProgram, library
from partita.codegen.layout import (TO_NCHW, TO_NHWC, AssignLayout, Region, assign_layout, count_layout_changes,
                                    nhwc_type, plan_layout)
from partita.ir import Builder, TensorType, parse, print_graph, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import assert_same_outputs, random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "assign-layout"
BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_library.py"

# The pipelines of the benchmark and the model tests: without and with the pass.
WITHOUT = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"
WITH = "canonicalize,fold-batch-norm,fuse-library,assign-layout,fuse-kernels,cse,dce"


def _bench_library():
    spec = importlib.util.spec_from_file_location("bench_library", BENCH)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _golden_input(name: str):
    text = (GOLDEN / name).read_text().split("// EXPECT:\n")[0]
    return parse("".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith("//")))


def _relu6(b, y):
    return b.minimum(b.maximum(y, b.full(shape=(), value=0.0)), b.full(shape=(), value=6.0))


def _chain(n=2, c=8, h=10, w=12, skip=False):
    """conv -> (ReLU6 -> conv) * (n - 1), optionally adding a graph input after the first."""
    b = Builder()
    x = b.input("x", T(n, 3, h, w))
    y = b.conv2d_pointwise(x, b.param("w0", T(c, 3, 3, 3)), padding=(1, 1))
    if skip:
        y = b.add(y, b.input("s", T(n, c, h, w)))
    for i in range(1, 3):
        y = b.conv2d_pointwise(_relu6(b, y), b.param(f"w{i}", T(c, c, 3, 3)), padding=(1, 1))
    return verify(b.ret(y))


# --- what forms a region, and the cost rule -------------------------------------------------------

def test_relu6_between_convolutions_becomes_nhwc_with_views_only():
    g = _chain()
    (reg,) = plan_layout(g)
    assert reg.convs == 3 and reg.apply and reg.changes == 0 and reg.cost == 0
    assert reg.saved == 2 * (2 * 8 * 10 * 12)  # the second and third convolution's inputs
    before = run_reference(g, random_inputs(g, seed=1))
    assert assign_layout(g) == 0
    verify(g)
    ops = [n.op for n in g.nodes]
    assert ops.count("transpose") == 4 and ops.count("conv2d_pointwise") == 3
    for n in g.nodes:
        if n.op in ("maximum", "minimum"):
            assert n.results[0].type.shape == (2, 10, 12, 8)
    assert count_layout_changes(g) == 0
    assert_same_outputs(before, run_reference(g, random_inputs(g, seed=1)), "relu6 chain")


def test_entries_and_exits_are_counted_and_the_function_returns_them():
    g = _golden_input("entry-exit.pir")
    (reg,) = plan_layout(g)
    assert (reg.saved, reg.cost, reg.changes, reg.views) == (3 * 420, 2 * 420, 2, 7)
    assert assign_layout(g) == 2 == count_layout_changes(g)
    # The entry transposes the graph input, and the exit is what the graph returns.
    (entry,) = [n for n in g.nodes if n.op == "transpose" and n.operands[0].is_input]
    assert tuple(entry.attrs["perm"]) == TO_NHWC
    out = g.outputs[0].producer
    assert out.op == "transpose" and tuple(out.attrs["perm"]) == TO_NCHW


def test_trace_and_report_say_what_each_region_decided():
    out = io.StringIO()
    g = PassManager.parse("assign-layout{trace=true}", out=out).run(_golden_input("kept-by-the-cost-rule.pir"))
    text = out.getvalue()
    assert text.count("kept NCHW") == 3
    assert "saves 288 element(s) of conversions, layout changes cost 288: kept NCHW" in text
    assert text.endswith("// assign-layout: 0 layout change(s) placed; 0 of 3 region(s) in NHWC\n")
    p = AssignLayout()
    p.run(_golden_input("entry-exit.pir"))
    assert p.changes == 2 and len(p.regions) == 1
    assert "NHWC, 2 layout change(s) placed, 7 view(s)" in p.report
    assert g is not None


def test_a_cheaper_exit_than_the_saving_is_taken_and_an_equal_one_is_not():
    # The relu between two convolutions is also returned: its exit costs as much as the
    # second convolution saves, so nothing changes; a third convolution tips the balance.
    def graph(convs: int):
        b = Builder()
        x = b.input("x", T(1, 4, 6, 6))
        ws = [b.param(f"w{i}", T(4, 4, 3, 3)) for i in range(convs)]
        y = b.conv2d_pointwise(x, ws[0], padding=(1, 1))
        r = b.relu(y)
        outs = [r]
        y = b.conv2d_pointwise(r, ws[1], padding=(1, 1))
        for w in ws[2:]:
            y = b.conv2d_pointwise(b.relu(y), w, padding=(1, 1))
        return verify(b.ret(*outs, y))

    g = graph(2)
    text = print_graph(g)
    assert assign_layout(g) == 0 and print_graph(g) == text
    g = graph(3)
    before = run_reference(g, random_inputs(g))
    assert assign_layout(g) == 1
    assert_same_outputs(before, run_reference(g, random_inputs(g)), "exit taken")


def test_reductions_remap_their_axes_or_stay_outside():
    def graph(axes, keepdim):
        b = Builder()
        x = b.input("x", T(2, 3, 5, 7))
        y = b.conv2d_pointwise(x, b.param("w", T(4, 3, 1, 1)))
        y = b.conv2d_pointwise(b.relu(y), b.param("v", T(4, 4, 1, 1)))
        return verify(b.ret(b.sum(b.relu(y), axes=axes, keepdim=keepdim)))

    cases = {((2, 3), True): ((1, 2), (2, 1, 1, 4)),     # H, W kept as 1s: NHWC result, an exit
             ((2, 3), False): ((1, 2), (2, 4)),          # [N, C] either way: no exit
             ((1,), True): ((3,), (2, 5, 7, 1)),          # over the channels
             ((0, 1, 2, 3), False): ((0, 1, 2, 3), ())}
    for (axes, keepdim), (new_axes, shape) in cases.items():
        g = graph(axes, keepdim)
        before = run_reference(g, random_inputs(g, seed=3))
        assign_layout(g)
        (red,) = [n for n in g.nodes if n.op == "sum"]
        assert tuple(red.attrs["axes"]) == new_axes and red.results[0].type.shape == shape, (axes, keepdim)
        assert_same_outputs(before, run_reference(g, random_inputs(g, seed=3)), f"sum {axes}")
    # Over H alone without keepdim, the dims left ([N, C, W]) would come out as [N, W, C]:
    # the reduction stays outside and reads NCHW.
    g = graph((2,), False)
    assign_layout(g)
    (red,) = [n for n in g.nodes if n.op == "sum"]
    assert red.operands[0].type.shape == (2, 4, 5, 7)


def test_what_the_pass_leaves_alone():
    # A convolution in f64 (no oneDNN kernel), and a fused body with a constant that is not a
    # splat of one element (a [1,C,1,1] full), which cannot be rewritten on NHWC types.
    b = Builder()
    f64 = DTYPES["f64"]
    x = b.input("x", TensorType((1, 2, 5, 5), f64))
    w = b.param("w", TensorType((2, 2, 3, 3), f64))
    y = b.conv2d_pointwise(b.relu(b.conv2d_pointwise(x, w, padding=(1, 1))), w, padding=(1, 1))
    g = verify(b.ret(y))
    assert plan_layout(g) == [] and assign_layout(g) == 0
    body = ("graph @kernel(%x0: f32[1,4,5,5]) -> (f32[1,4,5,5]) {\n"
            "  %0 = full() {shape=[1, 4, 1, 1], value=2.0} : f32[1,4,1,1]\n"
            "  %1 = mul(%x0, %0) : f32[1,4,5,5]\n  %2 = relu(%1) : f32[1,4,5,5]\n  return %2\n}\n")
    text = ("graph @f(%x: f32[1,4,5,5], %w: f32[4,4,3,3] param) -> (f32[1,4,5,5]) {\n"
            "  %0 = conv2d_pointwise(%x, %w) {padding=[1, 1]} : f32[1,4,5,5]\n"
            f"  %1 = fused(%0) {{body={body!r}}} : f32[1,4,5,5]\n"
            "  %2 = conv2d_pointwise(%1, %w) {padding=[1, 1]} : f32[1,4,5,5]\n  return %2\n}\n")
    text = text.replace("body='", 'body="').replace("\\n'}", '\\n"}')
    g = parse(text)
    assert [len(r.nodes) for r in plan_layout(g)] == [1, 1]
    assert assign_layout(g) == 0 and print_graph(g) == print_graph(parse(text))


def test_a_second_run_changes_nothing():
    for name in sorted(p.name for p in GOLDEN.glob("*.pir")):
        g = _golden_input(name)
        assign_layout(g)
        once = print_graph(g)
        assert assign_layout(g) == 0 and print_graph(g) == once, name


def test_nhwc_type_pads_and_permutes():
    assert nhwc_type(T(2, 3, 4, 5)).shape == (2, 4, 5, 3)
    assert nhwc_type(T(3, 1, 1)).shape == (1, 1, 1, 3)
    assert nhwc_type(T(5)).shape == (1, 1, 5, 1)
    assert nhwc_type(T()).shape == (1, 1, 1, 1)


# --- the torch executor ----------------------------------------------------------------------------

def test_the_executor_holds_nhwc_values_contiguous_and_convolutions_read_channels_last():
    g = _chain(skip=True)
    prog = CompiledProgram(g)
    assert any(n.op == "transpose" for n in prog.graph.nodes)  # the pass ran inside CompiledProgram
    seen: dict[str, list] = {"fused": [], "conv": []}
    steps = prog.program.steps
    for i, st in enumerate(list(steps)):
        node = st[7]
        if node.op not in ("fused", "conv2d_pointwise"):
            continue

        def wrap(fn=st[0], op=node.op, node=node):
            def step(args, attrs):
                if op == "fused":
                    seen["fused"].append(sum(not a.is_contiguous() for a in args))
                elif node.operands[0].producer is not None:   # not the graph input
                    seen["conv"].append(args[0].is_contiguous(memory_format=torch.channels_last))
                return fn(args, attrs)
            return step
        steps[i] = (wrap(), *st[1:])
    args = {v.name: torch.randn(v.type.shape) for v in g.inputs}
    want = numpy_ref.run(g, {k: a.numpy() for k, a in args.items()})[0]
    for _ in range(3):  # unpacked twice, then packed
        got = prog({k: a for k, a in args.items() if not k.startswith("w")},
                   {k: a for k, a in args.items() if k.startswith("w")})[0]
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-4, atol=1e-4)
    # Packed (the last call): the kernels read contiguous NHWC tensors, except the one layout
    # change (the graph input %s, transposed to NHWC, which the first kernel copies), and every
    # convolution after the first reads a channels-last input, so nothing is copied between.
    assert count_layout_changes(prog.graph) == 1
    assert seen["fused"][-2:] == [1, 0] and seen["conv"][-2:] == [True, True]


class _InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expansion, 3x3 depthwise, 1x1 projection; BN and ReLU6."""

    def __init__(self, cin: int, cout: int, stride: int, t: int = 4) -> None:
        super().__init__()
        h = cin * t
        self.body = nn.Sequential(
            nn.Conv2d(cin, h, 1, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, h, 3, stride, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.res = stride == 1 and cin == cout

    def forward(self, x):
        y = self.body(x)
        return x + y if self.res else y


class MobileNetish(nn.Module):
    """Stem conv 3->c0 + BN + ReLU6, inverted residual blocks c0->c0, c0->c1 (stride 2),
    c1->c1, c1->c2 (stride 2), c2->c2, a 1x1 head conv + BN + ReLU6, pool, linear head."""

    def __init__(self, c0: int = 16, c1: int = 24, c2: int = 32, head: int = 128, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c0, 3, 1, 1, bias=False), nn.BatchNorm2d(c0), nn.ReLU6())
        self.blocks = nn.Sequential(_InvertedResidual(c0, c0, 1), _InvertedResidual(c0, c1, 2),
                                    _InvertedResidual(c1, c1, 1), _InvertedResidual(c1, c2, 2),
                                    _InvertedResidual(c2, c2, 1))
        self.head = nn.Sequential(nn.Conv2d(c2, head, 1, bias=False), nn.BatchNorm2d(head), nn.ReLU6())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(head, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.head(self.blocks(self.stem(x)))), 1))


def _tensor_weights(graph) -> dict:
    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in graph.weights.items()}


def _mobilenetish():
    """A MobileNet-like model, its input, its eager output and its graph after fuse-library."""
    bl = _bench_library()
    torch.manual_seed(0)
    model = bl.randomize_bn(MobileNetish(8, 8, 16, 32).eval())
    x = torch.randn(2, 3, 16, 16)
    with torch.inference_mode():
        want = model(x)
    g = partita.optimize(partita.import_torch(model, (x,)), "canonicalize,fold-batch-norm,fuse-library")
    return model, x, want, g


def test_mobilenet_style_model_becomes_one_nhwc_region_and_matches_eager(monkeypatch):
    # The subject is the layout pass on elementwise ops between convolutions: ReLU6 stays one
    # (PARTITA_CLAMP_EPILOGUES=0); by default it is a convolution epilogue (the next test).
    monkeypatch.setattr(library, "CLAMP_EPILOGUES", False)
    model, x, want, g = _mobilenetish()
    (reg,) = plan_layout(g)
    # The pool's [N, 1, 1, C] leaves through a reshape: no layout change.
    assert reg.apply and reg.convs == 17 and reg.changes == 0 and reg.cost == 0 and reg.reshapes == 1
    ref_in = {v.name: (x.numpy() if v.name == "x" else np.asarray(g.weights[v.name])) for v in g.inputs}
    before = numpy_ref.run(g, ref_in)
    after_g = g.clone()
    assert assign_layout(after_g) == 0
    assert_same_outputs(before, numpy_ref.run(after_g, ref_in), "mobilenet (reference)")
    prog = CompiledProgram(partita.optimize(partita.import_torch(model, (x,)), "canonicalize"))
    assert any(n.op == "transpose" for n in prog.graph.nodes)
    weights = _tensor_weights(prog.graph)
    for w in (weights, weights, weights, None):  # unpacked, packed, then the graph's own weights
        got = prog([x], w)[0]
        err = float((got - want).abs().max() / want.abs().max())
        assert err <= 1e-4, err


def test_mobilenet_style_model_with_relu6_epilogues_is_left_as_it_is():
    # By default fuse-library takes ReLU6 into the convolutions: as in a ResNet, they hand
    # channels-last results to each other and the pass has nothing to move.
    model, x, want, g = _mobilenetish()
    convs = [n for n in g.nodes if n.op == "conv2d_pointwise"]
    assert len(convs) == 17 and not [n for n in g.nodes if n.op in ("maximum", "minimum", "clamp")]
    assert {n.attrs["unary"] for n in convs} >= {"relu6"}
    (reg,) = plan_layout(g)
    assert reg.saved == 0 and not reg.apply
    got = CompiledProgram(g)([x])[0]
    err = float((got - want).abs().max() / want.abs().max())
    assert err <= 1e-4, err


def test_resnet_style_model_is_left_as_it_is():
    # fuse-library leaves only convolutions (and the mean): they hand channels-last results
    # to each other already, and the pass saves nothing there.
    bl = _bench_library()
    model = bl.randomize_bn(bl.ResNetish(8, 16).eval())
    x = torch.randn(2, 3, 16, 16)
    g = partita.optimize(partita.import_torch(model, (x,)), "canonicalize,fold-batch-norm,fuse-library")
    text = print_graph(g)
    (reg,) = plan_layout(g)
    assert reg.convs == 8 and reg.saved == 0 and not reg.apply
    assert assign_layout(g) == 0 and print_graph(g) == text


# --- random graphs --------------------------------------------------------------------------------

def _random_graph(rng: np.random.Generator):
    """A random chain over [2, C, H, W] of library convolutions, elementwise ops (with graph
    inputs, per-channel params and scalars), pools, reductions and ops outside any region
    (a transpose of H and W, a softmax over the channels); some intermediates returned."""
    b = Builder()
    c, h, w = int(rng.choice([3, 4])), int(rng.choice([4, 6])), int(rng.choice([4, 6]))
    y = b.input("x", T(2, c, h, w))
    outs = []
    k = 0
    kinds = ["conv", "relu6", "bias", "skip", "pool", "mean", "swap", "softmax", "exp"]
    weights = np.array([7, 3, 2, 1.5, 1.5, 1.5, 0.7, 0.7, 1.5])
    for j in range(int(rng.integers(5, 12))):
        k += 1
        op = "conv" if j == 0 else rng.choice(kinds, p=weights / weights.sum())
        if op == "conv":
            o = int(rng.choice([3, 4, 5]))
            binary = "add" if o == c and rng.random() < 0.3 else "none"
            ops = [y, b.param(f"w{k}", T(o, c, 3, 3))]
            if rng.random() < 0.5:
                ops.append(b.param(f"b{k}", T(o)))
            if binary == "add":
                ops.append(y)
            y = b.conv2d_pointwise(*ops, padding=(1, 1), binary=binary,
                                   unary=str(rng.choice(["none", "relu", "sigmoid"])))
            c = o
        elif op == "relu6":
            y = _relu6(b, y)
        elif op == "bias":
            y = b.add(y, b.param(f"c{k}", T(c, 1, 1)) if rng.random() < 0.5 else b.param(f"c{k}", T(1, c, 1, w)))
        elif op == "skip":
            y = b.mul(y, b.input(f"s{k}", T(2, c, h, w)))
        elif op == "pool" and h % 2 == 0 and w % 2 == 0:
            y = b.max_pool2d(y, kernel=(2, 2)) if rng.random() < 0.5 else b.avg_pool2d(y, kernel=(2, 2))
            h, w = h // 2, w // 2
        elif op == "mean":
            y = b.add(y, b.mean(y, axes=(2, 3), keepdim=True))
        elif op == "swap":
            y = b.transpose(y, perm=(0, 1, 3, 2))
            h, w = w, h
        elif op == "softmax":
            y = b.softmax(y, axis=1)
        elif op == "exp":
            y = b.exp(b.neg(b.abs(y)))
        if rng.random() < 0.2:
            outs.append(y)
    outs.append(y)
    return verify(b.ret(*outs))


def test_random_graphs_keep_their_meaning_on_the_reference_and_on_torch(monkeypatch):
    rng = np.random.default_rng(7)
    graphs = [_random_graph(rng) for _ in range(40)]

    def check(force: bool) -> int:
        applied = compiled = 0
        for i, g in enumerate(graphs):
            inputs = random_inputs(g, seed=i)
            before = run_reference(g, inputs)
            after = g.clone()
            n = assign_layout(after)
            verify(after)
            assert n == count_layout_changes(after), print_graph(after)
            assert_same_outputs(before, run_reference(after, inputs), f"random graph {i} (force={force})")
            if print_graph(after) == print_graph(g):
                continue
            applied += 1
            if force and compiled < 6:  # the torch executor on some of the rewritten ones
                compiled += 1
                prog = CompiledProgram(after)  # fuse-kernels makes NHWC kernels
                got = prog({k: torch.from_numpy(a) for k, a in inputs.items()})
                for a, r in zip(got, before):
                    np.testing.assert_allclose(a.numpy(), r, rtol=1e-4, atol=1e-4)
        return applied

    assert check(force=False) >= 8
    # Every region with a convolution rewritten, whatever the cost rule says: the rewrite
    # keeps the meaning of every one.
    monkeypatch.setattr(Region, "apply", property(lambda self: self.convs > 0))
    assert check(force=True) >= 30


# --- the benchmark --------------------------------------------------------------------------------

def bench(rounds: int, quick: bool) -> list[str]:
    """Eager (NCHW, and the model and input converted to channels-last), and CompiledProgram
    without and with the pass (packed weights, and unpacked with ``library.PREPACK = False``),
    on the ResNet-style CNN of bench/bench_library.py and the MobileNet-style CNN above; the
    table's lines. Every candidate is checked against eager first (1e-4 relative)."""
    bl = _bench_library()
    torch.manual_seed(0)
    if quick:
        cases = [("ResNet-style CNN 2x3x16x16", bl.ResNetish(8, 16), (2, 3, 16, 16)),
                 ("MobileNet-style CNN 2x3x16x16", MobileNetish(8, 8, 16, 32), (2, 3, 16, 16))]
    else:
        cases = [("ResNet-style CNN 8x3x64x64", bl.ResNetish(), (8, 3, 64, 64)),
                 ("MobileNet-style CNN 8x3x64x64", MobileNetish(), (8, 3, 64, 64))]
    lines = ["| model | eager | eager, channels-last | without | with | without, unpacked | with, unpacked | "
             "with / without | with / without, unpacked | with / eager | layout changes |", "|---" * 11 + "|"]
    for name, model, shape in cases:
        model = bl.randomize_bn(model.eval())
        x = torch.randn(*shape)
        g = partita.import_torch(model, (x,))
        a, b = partita.optimize(g.clone(), WITHOUT), partita.optimize(g.clone(), WITH)
        wa, wb = _tensor_weights(a), _tensor_weights(b)
        # fuse=False: the graphs have been through their pipelines already.
        pa, pb = CompiledProgram(a, fuse=False), CompiledProgram(b, fuse=False)
        old = library.PREPACK
        library.PREPACK = False
        try:
            ua, ub = CompiledProgram(a, fuse=False), CompiledProgram(b, fuse=False)
        finally:
            library.PREPACK = old
        model_cl = copy.deepcopy(model).to(memory_format=torch.channels_last)
        x_cl = x.contiguous(memory_format=torch.channels_last)
        cands = {"eager": lambda: model(x), "eager-cl": lambda: model_cl(x_cl),
                 "without": lambda: pa([x], wa)[0], "with": lambda: pb([x], wb)[0],
                 "without-unpacked": lambda: ua([x], wa)[0], "with-unpacked": lambda: ub([x], wb)[0]}
        with torch.inference_mode():
            want = model(x)
            for k, f in cands.items():
                rel = float((f() - want).abs().max() / want.abs().max())
                assert rel <= 1e-4, f"{name}: {k} is {rel:.2e} off eager"
        t = bl.rounds_of(cands, rounds)
        m = {k: bl.med_ms(v) for k, v in t.items()}
        lines.append(f"| {name} | {m['eager']:.2f} | {m['eager-cl']:.2f} | {m['without']:.2f} | {m['with']:.2f} | "
                     f"{m['without-unpacked']:.2f} | {m['with-unpacked']:.2f} | "
                     f"{bl.ratio(t['with'], t['without']):.3f} | "
                     f"{bl.ratio(t['with-unpacked'], t['without-unpacked']):.3f} | "
                     f"{bl.ratio(t['with'], t['eager']):.3f} | {count_layout_changes(b)} |")
        print(lines[-1] if len(lines) > 3 else "\n".join(lines), flush=True)
    return lines


def test_benchmark_quick_mode_runs_and_checks_every_candidate(monkeypatch):
    for v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        monkeypatch.setenv(v, os.environ.get(v, "1"))
    lines = bench(2, quick=True)
    assert len(lines) == 4 and lines[2].startswith("| ResNet-style") and lines[3].startswith("| MobileNet-style")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="assign-layout: CNNs without and with the pass, one thread")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
              f"median of {args.rounds} rounds (ms; ratios: median of per-round ratios)\n")
        bench(3 if args.quick else args.rounds, args.quick)
    finally:
        torch.set_num_threads(threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
