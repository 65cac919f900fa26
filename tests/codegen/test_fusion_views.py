"""Views bound once or folded into kernels (partita/codegen/__init__.py ``_bind_arena_views``,
fusion.py, lowering.py): a split of a planned buffer is made once; reshapes and unsqueezes
read only by a fused kernel become the kernel's index maps. Results are checked against the
reference interpreter before and after the pass, and the compiled program against eager."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn

import partita
from partita.backend import numpy_ref
from partita.backend.torch_exec import ConstantStep
from partita.codegen import CompiledProgram, FuseKernels
from partita.ir import verify


class _SplitPlanned(nn.Module):
    """A fused kernel's result (planned in the arena) split in three, the pieces combined."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(x) * 2.0 + 1.0
        a, b, c = h.split(4, dim=-1)
        return torch.relu(a) * b - c


def _steps(prog: CompiledProgram) -> list:
    return list(prog.program.steps)


def test_split_of_a_planned_buffer_is_bound_once():
    torch.manual_seed(0)
    m = _SplitPlanned().eval()
    x = torch.randn(4, 8, 12)
    prog = CompiledProgram(partita.import_torch(m, (x,)))
    splits = [st for st in _steps(prog) if st[7].op == "split"]
    assert splits and all(type(st[0]) is ConstantStep for st in splits)
    want = m(x)
    for _ in range(2):   # the same views serve every call
        x = torch.randn(4, 8, 12)
        torch.testing.assert_close(prog([x])[0], m(x), rtol=1e-5, atol=1e-6)
    assert want.shape == (4, 8, 4)


class _MaskArith(nn.Module):
    """A padding mask unsqueezed twice and a column of counts unsqueezed, then combined with
    full-size arithmetic: the unsqueezes are index maps of one kernel."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor, col: torch.Tensor) -> torch.Tensor:
        m = mask.unsqueeze(1).unsqueeze(2)            # [b, 1, 1, n]
        c = col.reshape(-1, 1, 1, 1)                  # [b, 1, 1, 1]
        return torch.where(m, x * 2.0 + c, x - 1.0).sigmoid()


def _mask_case():
    torch.manual_seed(0)
    x, mask, col = torch.randn(3, 2, 5, 7), torch.rand(3, 7) > 0.3, torch.randn(3)
    m = _MaskArith().eval()
    return m, partita.import_torch(m, (x, mask, col)), (x, mask, col)


def test_views_read_only_by_a_fused_kernel_become_its_index_maps():
    m, g, args = _mask_case()
    before = numpy_ref.run(g, [a.numpy() for a in args])[0]
    fused = verify(FuseKernels().run(g.clone()))
    ops = [n.op for n in fused.nodes]
    assert ops.count("fused") == 1 and "unsqueeze" not in ops and "reshape" not in ops, ops
    after = numpy_ref.run(fused, [a.numpy() for a in args])[0]
    np.testing.assert_allclose(after, before, rtol=1e-6, atol=1e-6)
    prog = CompiledProgram(g)
    assert not [f for f in partita.codegen.fallbacks() if f.kernel in
                {partita.codegen.kernel_name(n.attrs["body"]) for n in prog.graph.nodes if n.op == "fused"}]
    steps = [st[7].op for st in _steps(prog)]
    assert steps == ["fused"], steps
    torch.testing.assert_close(prog(list(args))[0], m(*args), rtol=1e-5, atol=1e-6)


class _ViewReadTwice(nn.Module):
    """An unsqueeze also read outside the kernel stays a step of its own."""

    def forward(self, x: torch.Tensor, v: torch.Tensor):
        u = v.unsqueeze(0)
        return (x * u + 1.0).relu(), u


def test_a_view_read_outside_the_kernel_stays():
    torch.manual_seed(0)
    x, v = torch.randn(4, 6), torch.randn(6)
    m = _ViewReadTwice().eval()
    g = partita.import_torch(m, (x, v))
    fused = verify(FuseKernels().run(g.clone()))
    assert [n.op for n in fused.nodes].count("unsqueeze") == 1
    prog = CompiledProgram(g)
    for got, want in zip(prog([x, v]), m(x, v)):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


class _SmallLinears(nn.Module):
    """Small linear layers (ATen's addmm and mm, relu and silu after them) whose results are
    reshaped and transposed: written into the arena, their views made once."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(16, 16, bias=False)
        self.k = nn.Linear(16, 16)
        self.g = nn.Linear(16, 16, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.q(x).reshape(2, 3, 4, 4).transpose(1, 2)
        k = torch.relu(self.k(x)).reshape(2, 3, 4, 4).transpose(1, 2)
        g = torch.nn.functional.silu(self.g(x)).reshape(2, 3, 4, 4).transpose(1, 2)
        return (q @ k.transpose(-1, -2)) @ g


def test_small_linear_layers_write_into_the_arena_and_their_views_are_bound():
    torch.manual_seed(0)
    m = _SmallLinears().eval()
    x = torch.randn(2, 3, 16)
    g = partita.import_torch(m, (x,))
    prog = CompiledProgram(g, freeze=True)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 3, 16)
            torch.testing.assert_close(prog([x])[0], m(x), rtol=1e-5, atol=1e-5)
    views = [st for st in _steps(prog) if st[7].op in ("reshape", "transpose")
             and st[7].operands[0].producer is not None and st[7].operands[0].producer.op == "linear_pointwise"]
    assert prog.arena_view_steps >= 3 and all(type(st[0]) is ConstantStep for st in views)


def test_a_view_in_front_of_an_earlier_kernel_is_absorbed():
    m, g, args = _mask_case()
    fused = FuseKernels().run(g.clone())
    # views put in front of the kernel afterwards (as fold-params leaves one): the pass run
    # again takes them into the kernel's body
    from partita.ir.graph import Node
    k = next(n for n in fused.nodes if n.op == "fused")
    x = k.operands[0]
    flat = Node("reshape", [x], {"shape": (x.type.numel,)}, [x.type.with_shape((x.type.numel,))])
    back = Node("reshape", [flat.results[0]], {"shape": tuple(x.type.shape)}, [x.type])
    fused.insert_before(k, flat)
    fused.insert_before(k, back)
    fused.set_operand(k, 0, back.results[0])
    verify(fused)
    before = numpy_ref.run(fused, [a.numpy() for a in args])[0]
    again = verify(FuseKernels().run(fused))
    ops = [n.op for n in again.nodes]
    assert ops.count("fused") == 1 and ops.count("reshape") == 0, ops
    np.testing.assert_allclose(numpy_ref.run(again, [a.numpy() for a in args])[0], before, rtol=1e-6, atol=1e-6)
    prog = CompiledProgram(again, fuse=False)
    torch.testing.assert_close(prog(list(args))[0], m(*args), rtol=1e-5, atol=1e-6)
