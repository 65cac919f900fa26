"""fold-params (partita/codegen/inference.py): what is computed from params alone is computed
once and becomes params, with the same results before and after (the reference interpreter and
the compiled program against eager); what it must leave alone it leaves."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.backend import numpy_ref
from partita.codegen import CompiledProgram
from partita.ir import parse, verify
from partita.passes import PassManager


class _StdConv(nn.Module):
    """BiT's weight-standardized convolution, then a linear layer whose weight is scaled."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 3, 3, 3))
        self.lin = nn.Linear(8, 5)

    def forward(self, x):
        w = self.w
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        var = w.var(dim=(1, 2, 3), keepdim=True, unbiased=False)
        h = F.conv2d(x, (w - mean) / torch.sqrt(var + 1e-6), padding=1)
        h = h.mean(dim=(2, 3))
        return F.linear(h, self.lin.weight * 0.5, self.lin.bias)


def _model_graph():
    torch.manual_seed(0)
    m = _StdConv().eval()
    x = torch.randn(2, 3, 6, 6)
    g = partita.import_torch(m, (x,))
    with torch.no_grad():
        want = m(x)
    return g, x, want


def test_param_only_subgraphs_become_params_with_the_same_results():
    g, x, want = _model_graph()
    before = numpy_ref.run(g, [x.numpy()])[0]
    folded = verify(PassManager.parse("fold-params,dce").run(g.clone()))
    ops = [n.op for n in folded.nodes]
    # the standardization and the scaling are gone; only the activation's ops are left
    assert ops.count("conv2d") == 1 and "sqrt" not in ops and "var" not in ops
    assert all(n.operands[0].role == "input" or not n.operands[0].is_input for n in folded.nodes if n.op == "conv2d")
    new = [v for v in folded.inputs if v.role == "param" and v.name.endswith(".folded")]
    assert new and all(str(v.name) in folded.weights for v in new)
    assert "w" not in folded.weights                  # read by nothing any more: dropped
    after = numpy_ref.run(folded, [x.numpy()])[0]
    np.testing.assert_allclose(after, before, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(after, want.numpy(), rtol=1e-5, atol=1e-5)


def test_a_frozen_compiled_program_folds_and_takes_weights_by_the_graph_names():
    g, x, want = _model_graph()
    prog = CompiledProgram(g, freeze=True)
    assert not any(n.op in ("sqrt", "div") for n in prog.graph.nodes)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    for _ in range(3):
        torch.testing.assert_close(prog([x], weights)[0], want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(prog([x])[0], want, rtol=1e-4, atol=1e-5)


def test_broadcasts_to_activation_size_outputs_and_effects_are_left():
    text = """
graph @m(%x: f32[64,256], %b: f32[256] param, %w: f32[4,4] param) -> (f32[64,256], f32[4,4]) {
  %bb = broadcast_to(%b) {shape=[64, 256]} : f32[64,256]
  %y = add(%x, %bb) : f32[64,256]
  %w2 = mul(%w, %w) : f32[4,4]
  return %y, %w2
}
"""
    g = parse(text)
    g.weights["b"] = np.ones(256, np.float32)
    g.weights["w"] = np.full((4, 4), 3.0, np.float32)
    out = PassManager.parse("fold-params").run(g.clone())
    ops = [n.op for n in out.nodes]
    assert "broadcast_to" in ops                      # 16,384 elements from 256: not stored
    assert "mul" in ops                               # a graph output: left for the program


def test_without_freeze_new_weights_are_used_as_they_come():
    g, x, _ = _model_graph()
    prog = CompiledProgram(g)
    assert not any(k.endswith(".folded") for k in prog.graph.weights)   # nothing folded
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    prog([x], weights)
    w2 = dict(weights, w=weights["w"] * 2.0 + 1.0)          # another weight: another result
    want = numpy_ref.run(g, [x.numpy()], {k: v.numpy() for k, v in w2.items()})[0]
    torch.testing.assert_close(prog([x], w2)[0], torch.from_numpy(want), rtol=1e-4, atol=1e-5)


def test_the_torch_compile_backend_folds_a_frozen_graph_s_param_subgraphs():
    import torch._dynamo

    import partita.codegen.dynamo as pd

    torch._dynamo.reset()
    pd.reset_stats()
    torch.manual_seed(0)
    m = _StdConv().eval()
    x = torch.randn(2, 3, 6, 6)
    compiled = torch.compile(m, backend="partita", options={"choose": "partita"})
    with torch.no_grad():
        want = m(x)
        for _ in range(3):
            torch.testing.assert_close(compiled(x), want, rtol=1e-4, atol=1e-5)
    progs = [g.program for g in pd.stats().graphs if g.program is not None]
    assert progs and any(k.endswith(".folded") for p in progs for k in p.graph.weights)
    torch._dynamo.reset()
