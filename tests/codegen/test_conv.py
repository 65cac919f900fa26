"""partita's generated direct convolution (codegen/conv.py): against the formula in float64 on
edge shapes (one pixel, channels left over by the tile, kernels wider than the image, strides
and paddings apart in each direction, 1 x 1 to 7 x 7), every epilogue (bias, residual add,
relu), both tiles of each vector width, NaN, NCHW input, a given result buffer, two threads,
and the executor running CNN convolutions on it with their results in the memory plan, the
residual's buffer written over in place."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from partita.codegen import conv as K
from partita.codegen import cpu
from partita.codegen import library as lib


def _cl(t):
    return t.contiguous(memory_format=torch.channels_last)


def _run(n, c, co, h, w, kh, kw, stride, padding, act="none", bias=True, other=False, cfg=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = _cl(torch.randn(n, c, h, w, generator=g))
    wt = torch.randn(co, c, kh, kw, generator=g) / (c * kh * kw) ** 0.5
    b = torch.randn(co, generator=g) if bias else None
    pc = K.PreparedConv(tuple(x.shape), tuple(wt.shape), list(stride), list(padding), act, other, cfg=cfg)
    ref = F.conv2d(x.double(), wt.double(), None if b is None else b.double(), stride=stride, padding=padding)
    o = _cl(torch.randn(ref.shape, generator=g)) if other else None
    if other:
        ref = ref + o.double()
    if act == "relu":
        ref = torch.relu(ref)
    y = pc(x, pc.pack(wt), b, o)
    assert y.shape == ref.shape and y.is_contiguous(memory_format=torch.channels_last)
    assert float((y.double() - ref).abs().max()) <= 1e-5 * max(1.0, float(ref.abs().max()))
    return y


SHAPES = [
    # n, c, co, h, w, kh, kw, stride, padding
    (1, 1, 1, 1, 1, 1, 1, (1, 1), (0, 0)),          # one pixel, one channel
    (2, 3, 32, 9, 11, 3, 3, (1, 1), (1, 1)),         # the stem's 3 channels, a tile over rows
    (1, 5, 17, 6, 4, 3, 3, (1, 1), (1, 1)),          # channels left over in the one panel
    (3, 16, 70, 5, 7, 3, 3, (2, 2), (1, 1)),         # a second panel, stride 2
    (2, 32, 64, 8, 8, 1, 1, (2, 2), (0, 0)),         # a 1 x 1 shortcut
    (1, 8, 24, 13, 5, 5, 3, (2, 1), (2, 0)),         # strides and paddings differ per direction
    (1, 4, 8, 3, 3, 7, 7, (1, 1), (3, 3)),           # a kernel wider than the image
    (1, 6, 16, 2, 20, 1, 3, (1, 3), (0, 1)),
    (2, 33, 31, 7, 7, 3, 3, (1, 1), (0, 0)),         # no padding (every tile inside)
]


@pytest.mark.parametrize("shape", SHAPES, ids=[str(s[:7]) for s in SHAPES])
@pytest.mark.parametrize("lanes", [8, 16])
def test_the_formula_on_edge_shapes(shape, lanes):
    for cfg in K.conv_configs(lanes):
        _run(*shape, cfg=cfg)


@pytest.mark.parametrize("act,bias,other", [("relu", True, False), ("none", False, True), ("relu", True, True),
                                            ("relu", False, False)])
def test_each_epilogue(act, bias, other):
    for cfg in K.conv_configs(16):
        _run(2, 12, 40, 10, 9, 3, 3, (1, 1), (1, 1), act, bias, other, cfg=cfg, seed=3)


def test_nan_stays_nan_through_relu_and_input_in_nchw_is_taken():
    x = torch.randn(1, 4, 5, 5)
    x[0, 1, 2, 2] = float("nan")
    w = torch.randn(8, 4, 3, 3)
    pc = K.PreparedConv(tuple(x.shape), tuple(w.shape), [1, 1], [1, 1], "relu")
    y = pc(x, pc.pack(w))                       # NCHW memory: converted first
    ref = torch.relu(F.conv2d(x, w, padding=1))
    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and int(torch.isnan(y).sum()) == 9 * 8
    ok = ~torch.isnan(ref)
    assert float((y[ok] - ref[ok]).abs().max()) < 1e-4


def test_the_result_goes_where_it_is_asked_even_over_the_residual():
    g = torch.Generator().manual_seed(1)
    x = _cl(torch.randn(2, 8, 6, 6, generator=g))
    w = torch.randn(8, 8, 3, 3, generator=g)
    o = _cl(torch.randn(2, 8, 6, 6, generator=g))
    want = torch.relu(F.conv2d(x, w, padding=1) + o)
    pc = K.PreparedConv(tuple(x.shape), tuple(w.shape), [1, 1], [1, 1], "relu", other=True)
    y = pc(x, pc.pack(w), None, o, o)            # in place of the residual
    assert y is o and float((o - want).abs().max()) < 1e-4


def test_two_threads_agree_with_one_on_the_team_and_on_the_pool(monkeypatch):
    g = torch.Generator().manual_seed(2)
    x = _cl(torch.randn(4, 16, 12, 12, generator=g))
    w = torch.randn(32, 16, 3, 3, generator=g)
    pc = K.PreparedConv(tuple(x.shape), tuple(w.shape), [1, 1], [1, 1], "relu")
    wp = pc.pack(w)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = pc(x, wp).clone()
        torch.set_num_threads(2)
        two = pc(x, wp).clone()
        monkeypatch.setattr(cpu, "_SPLIT", False)    # as on a machine whose torch uses no libgomp
        pool = pc(x, wp)
    finally:
        torch.set_num_threads(old)
    assert torch.equal(one, two) and torch.equal(one, pool)


def test_what_the_kernel_does_not_take_is_said():
    assert K.supported((1, 4, 8, 8), (32, 4, 3, 3), [1, 1], [1, 1], [1, 1], 1) == ""
    assert "groups" in K.supported((1, 4, 8, 8), (4, 2, 3, 3), [1, 1], [1, 1], [1, 1], 2)
    assert "dilation" in K.supported((1, 4, 8, 8), (4, 4, 3, 3), [1, 1], [1, 1], [2, 2], 1)
    assert "channels" in K.supported((1, K.MAX_CHANNELS + 1, 2, 2), (1, K.MAX_CHANNELS + 1, 1, 1), [1, 1], [0, 0],
                                     [1, 1], 1)
    lanes16 = K.vector_width() >= 16
    assert ("fill" in K.supported((1, 4, 8, 8), (16, 4, 3, 3), [1, 1], [1, 1], [1, 1], 1)) == lanes16
    with pytest.raises(ValueError, match="activation"):
        K.conv_ir("x", K.conv_configs(16)[0], "gelu_tanh", {})


# --- in the executor ------------------------------------------------------------------------

class _Block(torch.nn.Module):
    """A stem and two basic blocks (conv-bn-relu, conv-bn + residual, relu); then a stride-2
    conv and a 1 x 1 shortcut added."""

    def __init__(self, c=32):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, c, 3, 1, 1, bias=False)
        self.bn0 = torch.nn.BatchNorm2d(c)
        self.c1 = torch.nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(c)
        self.c2 = torch.nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(c)
        self.c3 = torch.nn.Conv2d(c, c, 3, 1, 1)
        self.c4 = torch.nn.Conv2d(c, c, 3, 1, 1)
        self.down = torch.nn.Conv2d(c, 2 * c, 3, 2, 1)
        self.short = torch.nn.Conv2d(c, 2 * c, 1, 2, 0)

    def forward(self, x):
        x = F.relu(self.bn0(self.stem(x)))
        y = F.relu(self.bn1(self.c1(x)))
        x = F.relu(self.bn2(self.c2(y)) + x)
        x = F.relu(self.c4(F.relu(self.c3(x))) + x)     # a second block: its result over the first's
        return F.relu(self.down(x) + self.short(x)).mean((2, 3))


def _program():
    import partita
    from partita.codegen import CompiledProgram

    torch.manual_seed(0)
    m = _Block().eval().requires_grad_(False)
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.uniform_(-0.5, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 12, 12)
    return m, x, CompiledProgram(partita.optimize(partita.import_torch(m, (x,))))


@pytest.mark.parametrize("winograd", [True, False])
def test_compiled_programs_run_convolutions_on_the_kernel_from_the_memory_plan(monkeypatch, winograd):
    monkeypatch.setattr(lib, "WINOGRAD", winograd)   # the 3 x 3 ones on Winograd's kernel or this one
    m, x, prog = _program()
    convs = [n for n in prog.graph.nodes if n.op == "conv2d_pointwise"]
    assert len(convs) == 7 and all(lib.writes_into(n) for n in convs)
    plan = prog.memory_plan
    planned = {b.value for b in plan.planned()}
    # every conv result is planned, or written over the residual it adds (in place)
    assert all(n.results[0] in planned or n.results[0] in plan.shared for n in convs)
    assert plan.shared and "in place" in plan.text()
    # a chain: the block's result over its input, which was written over the stem's result
    assert any(plan.buffer_of(r) is not o for r, o in plan.shared.items())
    # every step of a planned or shared result writes into the arena
    assert all(plan.buffer_of(n.results[0]) in planned for n in convs)
    before = lib.packed_weight_stats()["generated_conv_calls"]
    want = m(x)
    for i in range(4):          # the first call packs; the arena is reused call after call
        xi = x + i
        (got,) = prog([xi])
        assert float((got - m(xi)).abs().max()) <= 1e-4 * max(1.0, float(m(xi).abs().max()))
    assert lib.packed_weight_stats()["generated_conv_calls"] - before >= 3 * len(convs)
    assert want.shape == got.shape


def test_onednn_is_kept_when_asked_and_results_agree(monkeypatch):
    m, x, prog = _program()
    monkeypatch.setattr(lib, "CONV", "onednn")
    _, _, prog2 = _program()
    assert not any(lib.writes_into(n) for n in prog2.graph.nodes if n.op == "conv2d_pointwise")
    assert not prog2.memory_plan.shared
    before = lib.packed_weight_stats()["generated_conv_calls"]
    for _ in range(3):
        (a,) = prog2([x])
    assert lib.packed_weight_stats()["generated_conv_calls"] == before
    monkeypatch.setattr(lib, "CONV", "generated")
    for _ in range(3):
        (b,) = prog([x])
    assert float((a - b).abs().max()) < 1e-4


def _chain(read_later=False, view=False, same=False):
    """m2 = matmul(m1 or a view of it, w) then exp: the plan's rules, with matmuls (planned) as
    the stand-in for a convolution and the residual it writes over."""
    from partita.ir import Builder, TensorType, verify
    from partita.ir.dtypes import DTYPES

    b = Builder()
    t = TensorType((8, 8), DTYPES["f32"])
    x, w = b.input("x", t), b.input("w", t)
    m1 = b.matmul(x, w)
    m2 = b.matmul(b.transpose(m1, perm=[1, 0]) if view else m1, m1 if same else w)
    y = b.exp(m2)
    if read_later:
        y = b.add(y, b.exp(m1))
    g = verify(b.ret(b.exp(y)))
    nodes = list(g.nodes)
    return g, nodes, [n for n in nodes if n.op == "matmul"][1]


def test_in_place_where_the_operand_dies_and_refused_where_it_is_read_later_or_is_a_view():
    from partita.codegen.arena import plan_memory

    g, nodes, m2 = _chain()
    plan = plan_memory(g, nodes, in_place={m2: 0})
    assert plan.shared == {m2.results[0]: m2.operands[0]}
    assert m2.results[0] not in plan.by_value             # no buffer of its own
    assert "is written over" in plan.text()
    # read later, a view, or read by the node through another operand too (a convolution whose
    # input is its residual: found by the random nets below)
    for kw in ({"read_later": True}, {"view": True}, {"same": True}):
        g, nodes, m2 = _chain(**kw)
        assert plan_memory(g, nodes, in_place={m2: 0}).shared == {}
    g, nodes, m2 = _chain()
    assert plan_memory(g, nodes, unplanned={m2}, in_place={m2: 0}).shared == {}   # its step allocates


def test_emit_kernels_prints_the_convolution_kernels(monkeypatch):
    from partita.codegen import emit_kernels

    monkeypatch.setattr(lib, "WINOGRAD", False)   # every 3 x 3 one on the direct kernel too
    _, _, prog = _program()
    text = emit_kernels(prog.graph)
    assert text.count("; ---- convolution kernel pt_conv_") >= 4 and "(as above)" in text
    assert "define void @pt_conv_" in text and "llvm.fma" in text


class _RandomNet(torch.nn.Module):
    """conv-relu, then a conv with the first's result added (a residual), then a strided conv:
    sizes drawn from ``seed``."""

    def __init__(self, seed):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=g))]  # noqa: E731
        c, co = pick([3, 5, 32]), pick([32, 40, 64])
        k = pick([1, 3, 5])
        self.a = torch.nn.Conv2d(c, co, k, padding=k // 2)
        self.b = torch.nn.Conv2d(co, co, 3, padding=1, bias=bool(seed % 2))
        self.c = torch.nn.Conv2d(co, 64, pick([1, 3]), stride=pick([1, 2]), padding=pick([0, 1]))
        self.shape = (pick([1, 2]), c, pick([5, 9, 12]), pick([6, 11]))

    def forward(self, x):
        y = F.relu(self.a(x))
        y = F.relu(self.b(y) + y)
        return self.c(y)


@pytest.mark.parametrize("winograd", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_random_conv_nets_agree_with_eager_call_after_call(monkeypatch, seed, winograd):
    import partita
    from partita.codegen import CompiledProgram

    monkeypatch.setattr(lib, "WINOGRAD", winograd)

    torch.manual_seed(seed)
    m = _RandomNet(seed).eval().requires_grad_(False)
    x = torch.randn(*m.shape)
    prog = CompiledProgram(partita.optimize(partita.import_torch(m, (x,))))
    for i in range(3):                  # unpacked, then the generated kernel into the arena
        xi = x * (1 + i)
        (got,) = prog([xi])
        want = m(xi)
        assert float((got - want).abs().max()) <= 1e-4 * max(1.0, float(want.abs().max()))
