"""Step chains through a transformer's blocks (codegen/step_chain.py): fused elementwise
kernels, norms (with and without the residual add) and attention offer native entries too, so
an encoder's layers run as one native call. Against eager at every call; a norm weight changed
in place is read where it is; the pieces of a split made once (the merged q, k, v projection)
are read by the chain as fixed tensors; an operand made anew by a step before the run at every
call (which dies after the call) is split out with its readers and the rest chained."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.codegen import CompiledProgram
from partita.codegen.step_chain import ChainStep

PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"
# wide enough that the rules take the generated GEMM for every projection (library.GEMM_MIN_FLOPS
# at 32 rows), which offers its native entry
D = 128


class Block(nn.Module):
    """A pre-norm encoder layer: layer norm, attention, residual; layer norm, GELU MLP, residual."""

    def __init__(self, d: int = D, heads: int = 4, fresh: bool = False) -> None:
        super().__init__()
        self.heads, self.fresh = heads, fresh
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        y = self.ln1(x)

        def heads(z):
            return z.view(b, t, self.heads, d // self.heads).transpose(1, 2)

        a = F.scaled_dot_product_attention(heads(self.q(y)), heads(self.k(y)), heads(self.v(y)))
        a = a.transpose(1, 2).reshape(b, t, d)
        if self.fresh:   # an ATen op's new tensor at every call, read by the projection
            a = torch.cumsum(a, dim=1) * 0.25
        x = x + self.o(a)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)) * 1.5 + 0.5))


def _program(m: nn.Module, x: torch.Tensor, freeze: bool) -> tuple[CompiledProgram, dict]:
    g = partita.optimize(partita.import_torch(m, (x,)), PIPELINE)
    return CompiledProgram(g, freeze=freeze), {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}


def _chains(prog: CompiledProgram) -> list[ChainStep]:
    return [st[0] for st in prog.program.steps if type(st[0]) is ChainStep]


def _ops(prog: CompiledProgram) -> set[str]:
    return {m.node.op for c in _chains(prog) for m in c.members}


def _check(prog: CompiledProgram, weights: dict, m: nn.Module, x: torch.Tensor, calls: int) -> None:
    with torch.inference_mode():
        want = m.double()(x.double()).float()
        m.float()
        for _ in range(calls):
            torch.testing.assert_close(prog([x], weights)[0], want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("freeze", [False, True])
def test_encoder_layers_run_as_one_chain(chain_cache, freeze):
    torch.manual_seed(0)
    m = nn.Sequential(Block(), Block()).eval()
    x = torch.randn(4, 8, D)
    prog, weights = _program(m, x, freeze)
    _check(prog, weights, m, x, 10)
    ops = _ops(prog)
    assert {"attention", "add_norm", "linear_pointwise"} <= ops, ops
    chains = _chains(prog)
    assert chains and all(c.armed and c.native_calls for c in chains)
    calls = sum(c.native_calls for c in chains)
    with torch.inference_mode():
        for _ in range(3):   # a new input each call
            x2 = torch.randn(4, 8, D)
            torch.testing.assert_close(prog([x2], weights)[0], m(x2), rtol=1e-4, atol=1e-5)
    assert sum(c.native_calls for c in chains) > calls


def test_norm_weight_changed_in_place(chain_cache):
    torch.manual_seed(1)
    m = nn.Sequential(Block(), Block()).eval()
    x = torch.randn(4, 8, D)
    prog, weights = _program(m, x, False)
    _check(prog, weights, m, x, 10)
    assert "add_norm" in _ops(prog) or "layer_norm" in _ops(prog)
    for k in [k for k in weights if ".ln" in k]:
        weights[k].mul_(-0.75).add_(0.125)
    m.load_state_dict(weights)
    _check(prog, weights, m, x, 4)


def test_an_operand_made_anew_each_call_is_split_out(chain_cache):
    torch.manual_seed(2)
    m = nn.Sequential(Block(fresh=True), Block()).eval()
    x = torch.randn(4, 8, D)
    prog, weights = _program(m, x, True)
    _check(prog, weights, m, x, 12)
    chains = _chains(prog)
    assert chains and all(c.armed and c.native_calls for c in chains)
    # the second block, at least, is chained whole
    assert {"attention", "add_norm"} <= _ops(prog)


class Residual(nn.Module):
    """Two linear layers with a lone residual add between them (no norm to fold it into)."""

    def __init__(self, d: int = D) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        h = self.a(x)
        h = h + self.b(h)   # a lone elementwise op
        return self.c(h) * 2.0


@pytest.mark.parametrize("freeze", [False, True])
def test_a_lone_add_is_a_kernel_in_the_chain_when_frozen(chain_cache, freeze):
    torch.manual_seed(3)
    m = Residual().eval()
    x = torch.randn(4, 8, D)
    prog, weights = _program(m, x, freeze)
    _check(prog, weights, m, x, 10)
    ops = [n.op for n in prog.graph.nodes]
    if freeze:   # a frozen program's lone add is a one-op kernel, chained with the GEMMs around it
        assert "add" not in ops and "fused" in _ops(prog), ops
    else:        # elsewhere it stays ATen's call
        assert "add" in ops, ops
