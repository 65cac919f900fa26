"""partita's generated GEMM (codegen/gemm.py): every tile, activation, stride and edge shape
against torch in f64, and a linear layer that runs it once its weight is packed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from partita.codegen import gemm as G

ACTS = {"none": lambda y: y, "relu": torch.relu, "gelu": F.gelu,
        "gelu_tanh": lambda y: F.gelu(y, approximate="tanh"), "silu": F.silu,
        "sigmoid": torch.sigmoid, "tanh": torch.tanh}
# M, K, N: single elements, edge tiles in both directions, more than one KC slice and MC block,
# and K = 0.
SHAPES = [(1, 1, 1), (7, 5, 3), (37, 300, 700), (148, 256, 256), (200, 600, 50), (13, 0, 5)]


def _check(y, a, w_kn, b, act):
    pre = a.double() @ w_kn.double() + (b.double() if b is not None else 0)
    want = ACTS[act](pre)
    scale = float(pre.abs().max()) + 1.0 if pre.numel() else 1.0
    assert y.shape == want.shape
    assert y.numel() == 0 or float((y.double() - want).abs().max()) <= 2e-6 * scale


@pytest.mark.parametrize("lanes", [8, 16])
def test_every_tile_matches_torch_on_edge_shapes_and_strides(lanes):
    # 16 lanes are AVX-512's tiles; on a CPU without it LLVM splits the vectors, slower but exact.
    g = torch.Generator().manual_seed(0)
    for cfg in G.gemm_configs(lanes):
        for m, k, n in SHAPES:
            for transposed in (False, True):
                a = torch.randn(m, k, generator=g) if not transposed else torch.randn(k, m, generator=g).t()
                w = torch.randn(k, n, generator=g)
                for b in (None, torch.randn(n, generator=g)):
                    y = G.gemm(a, G.pack_b(w, cfg.nr), n, b, "none", cfg=cfg)
                    _check(y, a, w, b, "none")


@pytest.mark.parametrize("act", sorted(ACTS))
def test_each_activation_is_applied_to_the_tile(act):
    g = torch.Generator().manual_seed(1)
    cfg = G.config()
    for m, k, n in [(37, 300, 70), (6, 16, 16)]:
        a, w, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g) * 0.1, torch.randn(n, generator=g)
        _check(G.gemm(a, G.pack_b(w, cfg.nr), n, b, act, cfg=cfg), a, w, b, act)


def test_two_threads_split_the_panels_and_agree_with_one():
    a, w = torch.randn(512, 256), torch.randn(256, 1000)
    cfg = G.config(512, 1000)
    p = G.pack_b(w, cfg.nr)
    old = torch.get_num_threads()
    try:
        prepared = G.PreparedGemm(512, 1000, 256, cfg=cfg)
        torch.set_num_threads(1)
        one = G.gemm(a, p, 1000, cfg=cfg)
        one_p = prepared(a, p)
        torch.set_num_threads(2)
        two = G.gemm(a, p, 1000, cfg=cfg)
        two_p = prepared(a, p)
    finally:
        torch.set_num_threads(old)
    assert prepared.parallel
    # the split runs on torch's OpenMP team (libgomp, which the torch wheel ships on Linux)
    assert G._omp_launcher() is not None
    assert torch.equal(one, two) and torch.equal(one_p, two_p) and torch.equal(one, one_p)
    _check(one, a, w, None, "none")


@pytest.mark.parametrize("lanes", [8, 16])
def test_reading_a_in_place_equals_packing_it(lanes):
    # The same products in the same order: bit-identical, edge tiles (rows past M) included.
    g = torch.Generator().manual_seed(3)
    for cfg in G.gemm_configs(lanes):
        for m, k, n in SHAPES + [(2 * cfg.mr + 1, 2 * cfg.kc + 3, cfg.nr + 1)]:
            if not (m and k and n):
                continue
            a, w, b = torch.randn(m, k, generator=g), torch.randn(k, n, generator=g), torch.randn(n, generator=g)
            packed, direct = G.PreparedGemm(m, n, k, "gelu", cfg), G.PreparedGemm(m, n, k, "gelu", cfg)
            packed.direct, direct.direct = False, True
            p = packed.pack(w)
            y = direct(a, p, b)
            assert torch.equal(y, packed(a, p, b)), (cfg, m, k, n)
            _check(y, a, w, b, "gelu")
            # a transposed view (k stride != 1) is packed, whatever was asked
            assert torch.equal(direct(a.t().contiguous().t(), p, b), y)


def test_rows_4_kib_apart_are_packed():
    assert G.read_a_in_place(256) and G.read_a_in_place(688) and G.read_a_in_place(1000)
    assert not G.read_a_in_place(1024) and not G.read_a_in_place(4096)


def test_the_python_pool_split_agrees_where_libgomp_is_missing(monkeypatch):
    monkeypatch.setattr(G, "_OMP", False)   # as on a machine whose torch uses no libgomp
    a, w = torch.randn(512, 300), torch.randn(300, 1000)
    old = torch.get_num_threads()
    try:
        for direct in (True, False):
            prepared = G.PreparedGemm(512, 1000, 300)
            prepared.direct = direct
            p = prepared.pack(w)
            torch.set_num_threads(1)
            one = prepared(a, p)
            torch.set_num_threads(2)
            assert torch.equal(prepared(a, p), one)
            assert torch.equal(prepared(a.t().contiguous().t(), p), one)   # A packed per thread
            _check(one, a, w, None, "none")
    finally:
        torch.set_num_threads(old)


def test_the_tile_is_chosen_by_padded_work():
    assert (G.choose(32, 4096, 8).mr, G.choose(32, 4096, 8).nr) == (4, 24)   # 32 rows: 6 x 16 pads to 36
    assert (G.choose(516, 1024, 8).mr, G.choose(516, 1024, 8).nr) == (6, 16)
    assert (G.choose(512, 1024, 16).mr, G.choose(512, 1024, 16).nr) == (6, 64)   # AVX-512: ties to 6 x 64
    assert (G.choose(512, 8192, 16).mr, G.choose(512, 8192, 16).nr) == (6, 64)   # 516 rows: 0.8% more work
    assert (G.choose(32, 4096, 16).mr, G.choose(32, 4096, 16).nr) == (8, 48)     # 6 rows would pad 32 to 36


def _packs_when_compiled(model, x, atol):
    """``model`` imported and run by a CompiledProgram three times (each against eager); how
    many weights were packed and how many calls ran unpacked meanwhile."""
    import numpy as np

    import partita
    from partita.codegen import CompiledProgram, library

    assert library._generated_gemm()
    graph = partita.import_torch(model, (x,))
    prog = CompiledProgram(graph)
    weights = {k: torch.from_numpy(np.array(v)) for k, v in graph.weights.items()}
    before = library.packed_weight_stats()
    with torch.no_grad():
        want = model(x)
        for _ in range(3):
            got = prog([x], weights)
            got = got[0] if isinstance(got, (list, tuple)) else got
            assert torch.allclose(got, want, atol=atol, rtol=1e-4)
    after = library.packed_weight_stats()
    return after["packed"] - before["packed"], after["unpacked_calls"] - before["unpacked_calls"]


def test_a_linear_layer_runs_the_generated_gemm_once_packed():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256)).eval()
    x = torch.randn(256, 256)      # both layers above the library kernels' minimum work
    # The first call runs oneDNN on the weights as given; both are packed at the second call,
    # which with the rest runs the generated GEMM.
    assert _packs_when_compiled(model, x, atol=1e-4) == (2, 2)


def test_small_layers_take_the_generated_gemm_and_tiny_ones_stay_on_aten():
    from partita.codegen import library

    torch.manual_seed(0)
    # [32, 256] x [256, 256]: 4 MFLOP, under the oneDNN kernels' minimum (32M) and above the
    # generated GEMM's (1M); [32, 256] x [256, 4]: 65 KFLOP, under both.
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.SiLU(), torch.nn.Linear(256, 4)).eval()
    x = torch.randn(32, 256)
    assert _packs_when_compiled(model, x, atol=1e-5)[0] == 1
    assert library.GEMM_MIN_FLOPS <= 2 * 32 * 256 * 256 < library.LINEAR_MIN_FLOPS_POST_OP


@pytest.mark.parametrize("act", ["gelu", "gelu_tanh"])
def test_gelu_epilogues_keep_relative_accuracy_in_the_negative_tail(act):
    # x @ I + 0 is x exactly, so the tile holds x and the epilogue alone is measured. The
    # references are the forms without cancellation: x erfc(-x / sqrt 2) / 2 and
    # x / (1 + exp(-2u)) (F.gelu's own f64 form loses all digits near x = -8).
    n = 64
    x = torch.linspace(-12, 12, 64 * 64).reshape(-1, n)
    prepared = G.PreparedGemm(x.shape[0], n, n, act)
    y = prepared(x, prepared.pack(torch.eye(n))).double()
    xd = x.double()
    if act == "gelu":
        want = 0.5 * xd * torch.special.erfc(-xd / 2 ** 0.5)
    else:
        want = xd / (1 + torch.exp(-2 * 0.7978845608028654 * (xd + 0.044715 * xd ** 3)))
    big = want.abs() > 1e-30
    assert float(((y - want).abs()[big] / want.abs()[big]).max()) < 5e-5
    assert float((y - want).abs().max()) < 1e-6


@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 5, 3), (37, 300, 70)])
def test_rows_and_block_entry_match_torch_as_strides_change(m, k, n):
    # The linear step's call (PreparedGemm.rows) on one prepared GEMM: a contiguous [2, m, k]
    # read in place, a transposed view, a row slice, with and without bias and planned result,
    # in turns (the block's stride fields are set again whenever A's strides change); then the
    # same through the kernel's 14 arguments where the block entry is missing.
    torch.manual_seed(0)
    prepared = G.PreparedGemm(2 * m, n, k, "gelu")
    w, b = torch.randn(k, n), torch.randn(n)
    packed = prepared.pack(w)
    for entry in (prepared.entry, None):
        prepared.entry = entry
        for _ in range(2):
            x = torch.randn(2, m, k)
            xt = torch.randn(k, 2 * m).t()
            xs = torch.randn(2 * m, k + 3)[:, 1:k + 1]
            for a, bias in ((x, b), (xt, None), (xs, b), (x, None)):
                out = torch.empty(*a.shape[:-1], n)
                for o in (out, None):
                    y = prepared.rows(a, packed, bias, o, (*a.shape[:-1], n))
                    assert o is None or y is o
                    _check(y.reshape(-1, n), a.reshape(-1, k), w, bias, "gelu")
                y = prepared(a.reshape(-1, k), packed, bias)
                _check(y, a.reshape(-1, k), w, bias, "gelu")
