"""Benchmark of the library kernels with fused epilogues (docs/codegen.md, "Library kernels").

    .venv/bin/python bench/bench_library.py                    # both parts, 1 thread, 30 rounds
    .venv/bin/python bench/bench_library.py --part linear      # only the fp32 linear paths
    .venv/bin/python bench/bench_library.py --part models --rounds 40
    .venv/bin/python bench/bench_library.py --part gemm        # the generated GEMM against ORT's
    .venv/bin/python bench/bench_library.py --part attention   # generated attention against flash
    .venv/bin/python bench/bench_library.py --part conv        # Winograd, direct, oneDNN convolutions
    .venv/bin/python bench/bench_library.py --quick            # tiny sizes, 3 rounds (a smoke test)

Part ``linear``: the fp32 CPU ways to compute ``x @ W + b`` (and with GELU after it) on the
shapes of an MLP 1024-4096-4096-1024 at batch 32 and of GPT-2 small's layers [512,256]x[256,768]:
``torch.matmul`` + add (what the executor ran before), ``torch.addmm`` on W [K, N],
``F.linear`` on W^T [N, K], ``mkldnn._linear_pointwise`` on the [N, K] copy and on the
transposed view, ``mkl._mkl_linear`` with the weight packed by ``mkl._mkl_reorder_linear_weight``;
and three small products, where a library call's fixed cost shows.

Part ``gemm``: partita's generated GEMM (codegen/gemm.py, B packed once, bias in the epilogue)
called the way the executor calls it (``library.linear_step``), against ONNX Runtime's Gemm node
(MLAS; one session per shape, one intra-op thread, the weight an initializer), oneDNN's
``_linear_pointwise`` and ``torch.addmm``, on the linear shapes of the models of
bench/bench_codegen.py (MLP, GPT-2, BERT, Llama, ViT) and three small ones.

Part ``attention``: partita's generated attention kernel (codegen/attention.py, called as the
executor calls it, ``PreparedAttention``) against the library's flash kernel (the attention
op's own step, ``aten._scaled_dot_product_flash_attention_for_cpu``), on q, k, v as a model
makes them ([B, T, H, E] viewed as [B, H, T, E]): the bench models' shapes (4 x 4 heads x 128
tokens causal, masked; ViT's 37 tokens), longer sequences, and the rotary form (Llama's) against
torch's rotation followed by the generated kernel.

Part ``conv``: partita's generated convolutions called as the executor calls them (packed
weight, channels-last tensors, bias and ReLU in the epilogue): Winograd's F(2x2, 3x3)
(codegen/winograd.py) and the direct kernel (codegen/conv.py), against oneDNN's
``_convolution_pointwise`` on its prepacked weight, on the 3 x 3 stride-1 shapes of
bench/bench_codegen.py's CNN; and the largest difference of each from float64.

Part ``models``: a ResNet-style CNN (8 x 3 x 64 x 64; stem conv 3->32 + BN + ReLU; residual
blocks 32->32, 32->64 with stride 2 and a 1x1 downsampling conv, 64->64; global average pool;
linear head to 10 classes; Conv2d(bias=False)-BatchNorm2d-ReLU throughout) and the MLP
1024-4096-4096-1024 with GELU at batch 32, both imported by ``partita.import_torch`` in eval mode:

  eager   the module under torch.inference_mode
  before  ``TorchProgram`` on the graph after ``canonicalize,fuse-activations,cse,dce``
  after   ``partita.codegen.CompiledProgram`` on the graph after
          ``canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce``
  after-unpacked  the same with ``library.PREPACK = False`` (what packing the weights buys)

Every partita program gets its params as torch tensors, the same objects at every call (the
inference case the packed weights are for), and its outputs are checked against eager (1e-4
relative) before timing. One thread (``torch.set_num_threads(1)`` and the OMP/MKL variables set
before torch is imported); after warm-up, each round times every candidate once, the starting
candidate rotating per round; figures are medians over the rounds, ratios medians of the
per-round ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

BEFORE = "canonicalize,fuse-activations,cse,dce"
AFTER = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


def rounds_of(cands: dict, rounds: int, warmup: int = 3) -> dict[str, list[float]]:
    """Per candidate, the seconds of one call in each round (candidates interleaved)."""
    names = list(cands)
    with torch.inference_mode():
        for f in cands.values():
            for _ in range(warmup):
                f()
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            f = cands[k]
            with torch.inference_mode():
                t = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t)
    return times


def med_ms(v: list[float]) -> float:
    return statistics.median(v) * 1e3


def ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


# --- part 1: the fp32 linear paths -----------------------------------------------------------

LINEAR_SHAPES = [(32, 1024, 4096), (32, 4096, 4096), (32, 4096, 1024), (512, 256, 768)]
# Small products, where a library call's fixed cost shows (library.LINEAR_MIN_FLOPS).
SMALL_SHAPES = [(8, 64, 10), (32, 256, 256), (64, 512, 512)]


def bench_linear(rounds: int, quick: bool) -> None:
    shapes = [(4, 64, 128)] if quick else LINEAR_SHAPES + SMALL_SHAPES
    print("\n### fp32 linear paths, one thread (ms, median of %d rounds)\n" % rounds)
    heads = None
    for m, k, n in shapes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(m, k, generator=g)
        w = torch.randn(k, n, generator=g) * 0.02
        b = torch.randn(n, generator=g)
        wt = w.t().contiguous()
        packed = torch.ops.mkl._mkl_reorder_linear_weight(wt, m)
        lp = torch.ops.mkldnn._linear_pointwise
        cands = {
            "matmul + add": lambda: torch.matmul(x, w) + b,
            "addmm W[K,N]": lambda: torch.addmm(b, x, w),
            "F.linear W^T[N,K]": lambda: F.linear(x, wt, b),
            "mkldnn linear [N,K] copy": lambda: lp(x, wt, b, "none", [], None),
            "mkldnn linear W.t() view": lambda: lp(x, w.t(), b, "none", [], None),
            "mkl_linear packed": lambda: torch.ops.mkl._mkl_linear(x, packed, wt, b, m),
            "addmm, then gelu": lambda: F.gelu(torch.addmm(b, x, w)),
            "mkldnn linear + gelu post-op": lambda: lp(x, wt, b, "gelu", [], "none"),
        }
        ref = torch.addmm(b, x, w)
        for name, f in cands.items():
            want = F.gelu(ref) if "gelu" in name else ref
            got = f()
            assert float((got - want).abs().max()) <= 1e-4 * float(want.abs().max()) + 1e-5, name
        t = rounds_of(cands, rounds)
        if heads is None:
            heads = list(cands)
            print("| shape | " + " | ".join(heads) + " |")
            print("|---" * (len(heads) + 1) + "|")
        print(f"| [{m},{k}]x[{k},{n}] | " + " | ".join(f"{med_ms(t[h]):.3f}" for h in heads) + " |", flush=True)


# --- part 1b: the generated GEMM against ONNX Runtime's -----------------------------------------

# (M, K, N): MLP batch 32; GPT-2/BERT 4 x 128 tokens, 256 wide (qkv, proj, fc1, fc2); Llama's
# FFN 688; ViT 4 x 37 tokens; small layers.
GEMM_SHAPES = [(32, 1024, 4096), (32, 4096, 4096), (512, 256, 768), (512, 256, 256), (512, 256, 1024),
               (512, 1024, 256), (512, 256, 688), (512, 688, 256), (148, 256, 768), (148, 256, 256),
               (148, 256, 1024), (148, 1024, 256), (8, 64, 10), (32, 256, 256), (64, 512, 512)]


def _ort_gemm(w: torch.Tensor, b: torch.Tensor, m: int):
    """An ORT session of one Gemm node, ``x [m, K] @ W + b``, W and b initializers; None
    without onnxruntime."""
    try:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    k, n = w.shape
    g = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w", "b"], ["y"])], "gemm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(w.numpy(), "w"), numpy_helper.from_array(b.numpy(), "b")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess


def bench_gemm(rounds: int, quick: bool) -> None:
    from partita.codegen import library
    from partita.codegen.gemm import config

    shapes = [(4, 64, 128)] if quick else GEMM_SHAPES
    print("\n### the generated GEMM against ONNX Runtime's Gemm, one thread (ms, median of %d rounds; "
          "ratios are medians of per-round ratios)\n" % rounds)
    print("| shape | tile | partita | ORT Gemm | oneDNN linear | addmm | partita / ORT | partita / oneDNN |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for m, k, n in shapes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(m, k, generator=g)
        w = torch.randn(k, n, generator=g) * 0.02
        b = torch.randn(n, generator=g)
        step = library.linear_step((m, n), k, "kn", True, "none")
        for _ in range(2):  # the second sighting packs the weight
            step([x, w, b], {})
        wt = w.t().contiguous()
        lp = torch.ops.mkldnn._linear_pointwise
        cands = {
            "partita": lambda: step([x, w, b], {}),
            "oneDNN": lambda: lp(x, wt, b, "none", [], None),
            "addmm": lambda: torch.addmm(b, x, w),
        }
        sess = _ort_gemm(w, b, m)
        if sess is not None:
            xn = x.numpy()
            cands["ORT"] = lambda: sess.run(None, {"x": xn})
        ref = torch.addmm(b, x, w)
        for name, f in cands.items():
            got = f()
            got = torch.from_numpy(got[0]) if name == "ORT" else got
            assert float((got - ref).abs().max()) <= 1e-4 * float(ref.abs().max()) + 1e-5, name
        t = rounds_of(cands, rounds)
        ort_ms = f"{med_ms(t['ORT']):.3f}" if "ORT" in t else "-"
        vs_ort = f"{ratio(t['partita'], t['ORT']):.2f}" if "ORT" in t else "-"
        cfg = config(m, n)
        print(f"| [{m},{k}]x[{k},{n}] | {cfg.mr}x{cfg.nr} | {med_ms(t['partita']):.3f} | {ort_ms} | "
              f"{med_ms(t['oneDNN']):.3f} | {med_ms(t['addmm']):.3f} | {vs_ort} | "
              f"{ratio(t['partita'], t['oneDNN']):.2f} |", flush=True)


def bench_cold_weights(rounds: int, quick: bool) -> None:
    """In a model every layer's weight comes from memory, not cache: the generated GEMM and
    ORT's Gemm with one weight used over and over (hot) and with 8 weights used in turn."""
    from partita.codegen.gemm import PreparedGemm

    m, k, n = (4, 64, 128) if quick else (148, 256, 1024)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g)
    ws = [torch.randn(k, n, generator=g) * 0.02 for _ in range(8)]
    b = torch.randn(n, generator=g)
    pg = PreparedGemm(m, n, k)
    packed = [pg.pack(w) for w in ws]
    out = torch.empty(m, n)
    cands = {"partita hot": lambda: [pg(x, packed[0], b, out) for _ in range(8)],
             "partita 8 weights": lambda: [pg(x, p, b, out) for p in packed]}
    sessions = [_ort_gemm(w, b, m) for w in ws]
    if sessions[0] is not None:
        xn = x.numpy()
        cands["ORT hot"] = lambda: [sessions[0].run(None, {"x": xn}) for _ in range(8)]
        cands["ORT 8 weights"] = lambda: [s.run(None, {"x": xn}) for s in sessions]
    tm = rounds_of(cands, rounds)
    print(f"\ncold weights, [{m},{k}]x[{k},{n}], ms a call (8 calls a round): " +
          ", ".join(f"{name} {med_ms(v) / 8:.3f}" for name, v in tm.items()), flush=True)


# --- part 1c: the generated attention against the flash kernel ---------------------------------

# (B, H, T, E, causal, mask): the bench models' (GPT-2 and Llama causal, BERT with a padding
# mask, ViT's 37 tokens) and longer sequences.
ATTENTION_SHAPES = [(4, 4, 128, 64, True, False), (4, 4, 128, 64, False, True), (4, 4, 37, 64, False, False),
                    (1, 4, 512, 64, True, False), (1, 4, 512, 64, False, False), (1, 4, 2048, 64, True, False)]


def bench_attention(rounds: int, quick: bool) -> None:
    from partita.codegen.attention import PreparedAttention
    from partita.ops.nn import torch_attention

    shapes = [(1, 2, 16, 16, True, False)] if quick else ATTENTION_SHAPES
    print("\n### the generated attention against the flash kernel, one thread (ms, median of %d rounds; "
          "ratios are medians of per-round ratios)\n" % rounds)
    print("| B x H x T, E | causal | mask | flash | generated | generated / flash |")
    print("|---|---|---|---:|---:|---:|")
    for b, h, t, e, causal, masked in shapes:
        g = torch.Generator().manual_seed(0)
        q, k, v = (torch.randn(b, t, h, e, generator=g).transpose(1, 2) for _ in range(3))
        mask = (torch.rand(b, 1, 1, t, generator=g) > 0.1) if masked else None
        pa = PreparedAttention((b, h), t, t, e, e, None, causal, "bool" if masked else "")
        args = [q, k, v] + ([mask] if masked else [])
        attrs = {"causal": causal, "scale": None}
        cands = {"flash": lambda: torch_attention(args, attrs), "generated": lambda: pa(q, k, v, mask)}
        want, got = cands["flash"]()[0], cands["generated"]()[0]
        assert float((want - got).abs().max()) <= 1e-4, (b, h, t, e)
        tm = rounds_of(cands, rounds)
        print(f"| {b} x {h} x {t}, {e} | {'yes' if causal else 'no'} | {'bool' if masked else '-'} | "
              f"{med_ms(tm['flash']):.3f} | {med_ms(tm['generated']):.3f} | {ratio(tm['generated'], tm['flash']):.2f} |",
              flush=True)
    # Llama's rotary form: the rotation inside the kernel against torch's rotation first
    b, h, t, e = (1, 2, 16, 16) if quick else (4, 4, 128, 64)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(b, t, h, e, generator=g).transpose(1, 2) for _ in range(3))
    ang = torch.arange(t)[:, None] * torch.rand(e // 2, generator=g)[None]
    ang = torch.cat((ang, ang), -1)
    cos, sin = torch.cos(ang)[None, None], torch.sin(ang)[None, None]

    def rope(x):
        return x * cos + torch.cat((-x[..., e // 2:], x[..., :e // 2]), -1) * sin

    plain = PreparedAttention((b, h), t, t, e, e, None, True, "")
    rot = PreparedAttention((b, h), t, t, e, e, None, True, "", rope=True)
    cands = {"rotation in torch, then the kernel": lambda: plain(rope(q), rope(k), v),
             "rotation inside": lambda: rot(q, k, v, None, cos, sin),
             "no rotation": lambda: plain(q, k, v)}
    assert float((cands["rotation in torch, then the kernel"]()[0] - cands["rotation inside"]()[0]).abs().max()) <= 1e-4
    tm = rounds_of(cands, rounds)
    print(f"\nrotary, {b} x {h} x {t}, {e}, causal (ms): " +
          ", ".join(f"{n} {med_ms(v):.3f}" for n, v in tm.items()), flush=True)


# --- part 1d: the generated convolutions --------------------------------------------------------

# (N, C, H=W, Co): the 3 x 3 stride-1 convolutions of bench_codegen.py's CNN
CONV_SHAPES = [(8, 32, 64, 32), (8, 64, 32, 64), (8, 128, 16, 128)]


def bench_conv(rounds: int, quick: bool) -> None:
    from partita.codegen.conv import PreparedConv
    from partita.codegen.winograd import PreparedWinograd

    shapes = [(1, 16, 8, 16)] if quick else CONV_SHAPES
    print("\n### the generated convolutions against oneDNN's, 3 x 3, stride 1, bias + ReLU, one thread "
          "(ms, median of %d rounds; ratios are medians of per-round ratios)\n" % rounds)
    print("| shape | Winograd | direct | oneDNN | Winograd / direct | Winograd / oneDNN | "
          "max error / max value (Winograd, direct) |")
    print("|---|---:|---:|---:|---:|---:|---|")
    cl = torch.channels_last
    for n, c, h, co in shapes:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(n, c, h, h, generator=g).contiguous(memory_format=cl)
        w = torch.randn(co, c, 3, 3, generator=g) / (9 * c) ** 0.5
        b = torch.randn(co, generator=g)
        out = torch.empty(n, co, h, h).contiguous(memory_format=cl)
        wino = PreparedWinograd(tuple(x.shape), tuple(w.shape), [1, 1], "relu")
        direct = PreparedConv(tuple(x.shape), tuple(w.shape), [1, 1], [1, 1], "relu")
        pw, pd = wino.pack(w), direct.pack(w)
        ow = torch.ops.mkldnn._reorder_convolution_weight(w, [1, 1], [1, 1], [1, 1], 1, list(x.shape))
        conv = torch.ops.mkldnn._convolution_pointwise.default
        cands = {
            "winograd": lambda: wino(x, pw, b, None, out),
            "direct": lambda: direct(x, pd, b, None, out),
            "oneDNN": lambda: conv(x, ow, b, [1, 1], [1, 1], [1, 1], 1, "relu", [], None),
        }
        ref = torch.relu(F.conv2d(x.double(), w.double(), b.double(), padding=1))
        errs = []
        for name, f in cands.items():
            got = f().double()
            err = float((got - ref).abs().max() / ref.abs().max())
            assert err <= 1e-5, f"{name}: {err:.1e} off float64"
            errs.append(err)
        t = rounds_of(cands, rounds)
        print(f"| {n} x {c} x {h} x {h} -> {co} | {med_ms(t['winograd']):.3f} | {med_ms(t['direct']):.3f} | "
              f"{med_ms(t['oneDNN']):.3f} | {ratio(t['winograd'], t['direct']):.2f} | "
              f"{ratio(t['winograd'], t['oneDNN']):.2f} | {errs[0]:.1e}, {errs[1]:.1e} |", flush=True)


# --- part 2: the models ------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class ResNetish(nn.Module):
    """Stem conv 3->c0, residual blocks (c0->c0, c0->c1 stride 2, c1->c1), pool, linear head."""

    def __init__(self, c0: int = 32, c1: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c0, 3, 1, 1, bias=False), nn.BatchNorm2d(c0), nn.ReLU())
        self.blocks = nn.Sequential(Block(c0, c0, 1), Block(c0, c1, 2), Block(c1, c1, 1))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c1, classes)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.blocks(self.stem(x))), 1))


def randomize_bn(m: nn.Module, seed: int = 0) -> nn.Module:
    """Non-trivial running statistics and affine parameters (fresh ones fold to the identity)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm2d):
                c = mod.num_features
                mod.running_mean.copy_(torch.rand(c, generator=g) - 0.5)
                mod.running_var.copy_(torch.rand(c, generator=g) * 1.5 + 0.5)
                mod.weight.copy_(torch.rand(c, generator=g) + 0.5)
                mod.bias.copy_(torch.rand(c, generator=g) * 0.6 - 0.3)
    return m


def mlp(sizes=(1024, 4096, 4096, 1024)) -> nn.Module:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2:
            layers.append(nn.GELU())
    return nn.Sequential(*layers)


def tensor_weights(graph) -> dict:
    """The graph's params and state as torch tensors (made once: the same objects each call)."""
    return {k: torch.from_numpy(np.array(v, copy=True)) for k, v in graph.weights.items()}


def build(model: nn.Module, x: torch.Tensor) -> dict:
    import partita
    from partita.backend.torch_exec import TorchProgram
    from partita.codegen import CompiledProgram, library

    g = partita.import_torch(model, (x,))
    before = partita.optimize(g.clone(), BEFORE)
    after = partita.optimize(g.clone(), AFTER)
    wb, wa = tensor_weights(before), tensor_weights(after)
    pb = TorchProgram(before)
    pa = CompiledProgram(after)
    old = library.PREPACK
    library.PREPACK = False
    try:
        pu = CompiledProgram(after)
    finally:
        library.PREPACK = old
    ops = sorted({n.op for n in after.nodes})
    return {
        "graph": after, "ops": ops,
        "cands": {
            "eager": lambda: model(x),
            "before": lambda: pb([x], wb)[0],
            "after": lambda: pa([x], wa)[0],
            "after-unpacked": lambda: pu([x], wa)[0],
        },
    }


def bench_models(rounds: int, quick: bool) -> None:
    torch.manual_seed(0)
    if quick:
        cases = [("ResNet-style CNN 2x3x16x16", randomize_bn(ResNetish(8, 16).eval()), torch.randn(2, 3, 16, 16)),
                 ("MLP 64-128-128-64 GELU, batch 4", mlp((64, 128, 128, 64)).eval(), torch.randn(4, 64))]
    else:
        cases = [("ResNet-style CNN 8x3x64x64", randomize_bn(ResNetish().eval()), torch.randn(8, 3, 64, 64)),
                 ("MLP 1024-4096-4096-1024 GELU, batch 32", mlp().eval(), torch.randn(32, 1024))]
    print(f"\n### models, one thread (ms, median of {rounds} rounds; ratio = median of per-round ratios)\n")
    print("| model | eager | before | after | after, unpacked weights | after / before | after / eager |")
    print("|---|---|---|---|---|---|---|")
    notes = []
    for name, model, x in cases:
        b = build(model, x)
        with torch.inference_mode():
            want = model(x)
            for k, f in b["cands"].items():
                got = f()
                rel = float((got - want).abs().max() / want.abs().max())
                assert rel <= 1e-4, f"{name}: {k} is {rel:.2e} off eager in relative terms"
                if k != "eager":
                    notes.append(f"{name}: {k} max |error| / max |eager| = {rel:.1e}")
        t = rounds_of(b["cands"], rounds)
        print(f"| {name} | {med_ms(t['eager']):.2f} | {med_ms(t['before']):.2f} | {med_ms(t['after']):.2f} | "
              f"{med_ms(t['after-unpacked']):.2f} | {ratio(t['after'], t['before']):.3f} | "
              f"{ratio(t['after'], t['eager']):.3f} |", flush=True)
        notes.append(f"{name}: ops after the passes: {', '.join(b['ops'])}")
    print()
    for n in notes:
        print("- " + n)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("all", "linear", "gemm", "attention", "conv", "models"), default="all")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="tiny sizes and 3 rounds (a smoke test)")
    args = ap.parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        rounds = 3 if args.quick else args.rounds
        print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
        if args.part in ("all", "linear"):
            bench_linear(rounds, args.quick)
        if args.part in ("all", "gemm"):
            bench_gemm(rounds, args.quick)
            bench_cold_weights(rounds, args.quick)
        if args.part in ("all", "attention"):
            bench_attention(rounds, args.quick)
        if args.part in ("all", "conv"):
            bench_conv(rounds, args.quick)
        if args.part in ("all", "models"):
            bench_models(rounds, args.quick)
    finally:
        torch.set_num_threads(threads)  # as it was: a test calls main inside its own process
    return 0


if __name__ == "__main__":
    sys.exit(main())
