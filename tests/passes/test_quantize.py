"""The quantize pass (partita/passes/quantize.py): int8 weight-only and dynamic forms."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import partita
from partita.ir import PassError, verify
from partita.ir.dtypes import i8
from partita.passes import PassManager
from partita.passes.quantize import quantize, quantize_weight


class _MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(64, 128), nn.Linear(128, 64), nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(F.gelu(self.fc2(torch.relu(self.fc1(x)))))


class _Tied(nn.Module):
    """An embedding whose table is also the output projection (GPT-2's tied head)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.proj = nn.Linear(32, 32)

    def forward(self, ids):
        return F.linear(torch.tanh(self.proj(self.emb(ids))), self.emb.weight)


class _CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32, 20)

    def forward(self, x):
        y = F.relu(self.c2(F.relu(self.c1(x))))
        return self.fc(y.mean(dim=(2, 3)))


@functools.cache
def _model(kind: str):
    torch.manual_seed(0)
    m, x = {"mlp": (_MLP, lambda: torch.randn(8, 64)),
            "tied": (_Tied, lambda: torch.randint(0, 100, (2, 6))),
            "cnn": (_CNN, lambda: torch.randn(2, 3, 12, 12))}[kind]
    module = m().eval()
    arg = x()
    with torch.no_grad():
        want = module(arg).numpy()
    return module, arg, want


def _graph(kind: str):
    module, arg, want = _model(kind)
    return partita.import_torch(module, (arg,)), arg.numpy(), want


def _rel(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a) - b)) / np.max(np.abs(b)))


def test_quantize_weight_is_symmetric_per_channel_within_half_a_step():
    w = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)
    w[:, 2] = 0.0
    q, s = quantize_weight(w, axis=1)
    assert q.dtype == np.int8 and s.shape == (5,)
    assert np.all(np.abs(q) <= 127) and np.all(np.max(np.abs(q), axis=0)[[0, 1, 3, 4]] == 127)
    assert s[2] == 1.0 and np.all(q[:, 2] == 0)           # an all-zero channel: no division by zero
    assert np.all(np.abs(q * s - w) <= s / 2 + 1e-7)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_weight_only_mlp_is_close_and_a_quarter_of_the_bytes(backend):
    g, x, want = _graph("mlp")
    before = partita.run(g, [x], backend=backend)[0]
    report = quantize(g, "weight-only", min_elements=256)
    verify(g)
    assert [w.name for w in report.weights] == ["fc1.weight", "fc2.weight", "fc3.weight"]
    assert all(w.axis == 0 for w in report.weights)     # [out, in]: one scale per output feature
    assert {n for n, _ in report.skipped} == {"fc1.bias", "fc2.bias", "fc3.bias"}
    assert "fc1.weight" not in g.weights and g.weights["fc1.weight.qweight"].dtype == np.int8
    assert sum(1 for n in g.nodes if n.op == "dequantize_linear") == 3
    weight_bytes = sum(w.bytes_before for w in report.weights)
    assert sum(w.bytes_after for w in report.weights) == weight_bytes // 4 + 4 * (128 + 64 + 10)
    assert report.saved == report.param_bytes_before - report.param_bytes_after > 0.7 * weight_bytes
    got = np.asarray(partita.run(g, [x], backend=backend)[0])
    assert _rel(before, want) < 1e-5
    assert 0 < _rel(got, want) < 2e-2
    assert "3 weight(s) to int8" in str(report)


def _dynamic_oracle(module: _MLP, x: np.ndarray) -> np.ndarray:
    """The dynamic form computed independently in NumPy: per-tensor activation scales,
    per-output-channel weight scales, exact integer products."""
    def linear(layer, a):
        w = layer.weight.detach().numpy()
        qw, sw = quantize_weight(w, axis=0)
        sx = max(float(np.max(np.abs(a))), 1e-12) / 127
        qx = np.clip(np.rint(a / np.float32(sx)), -127, 127).astype(np.int64)
        acc = qx @ qw.astype(np.int64).T
        return acc * (sw * np.float32(sx)) + layer.bias.detach().numpy()
    h = np.maximum(linear(module.fc1, x), 0)
    h = torch.nn.functional.gelu(torch.from_numpy(linear(module.fc2, h).astype(np.float32))).numpy()
    return linear(module.fc3, h)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_dynamic_mlp_runs_integer_matmuls_and_matches_an_independent_oracle(backend):
    g, x, want = _graph("mlp")
    report = quantize(g, "dynamic", min_elements=256)
    verify(g)
    assert [w.form for w in report.weights] == ["dynamic"] * 3
    ops = [n.op for n in g.nodes]
    assert ops.count("matmul_integer") == 3 and "matmul" not in ops
    got = np.asarray(partita.run(g, [x], backend=backend)[0])
    oracle = _dynamic_oracle(_model("mlp")[0], x)
    assert _rel(got, oracle) < 1e-5
    assert 0 < _rel(got, want) < 5e-2


def test_tied_weight_is_quantized_once_for_both_uses():
    g, ids, want = _graph("tied")
    report = quantize(g, "dynamic", min_elements=512)
    verify(g)
    # The table feeds an embedding and a transposed matmul: weight-only, rows as channels.
    (emb,) = [w for w in report.weights if w.name == "emb.weight"]
    assert emb.form == "weight-only" and emb.axis == 0
    assert sum(1 for n in g.nodes if n.op == "dequantize_linear" and n.operands[0].name == "emb.weight.qweight") == 1
    got = np.asarray(partita.run(g, [ids], backend="torch")[0])
    assert _rel(got, want) < 3e-2


def test_cnn_convolutions_are_quantized_per_output_channel():
    g, x, want = _graph("cnn")
    report = quantize(g, "dynamic", min_elements=500)
    verify(g)
    conv = {w.name: w for w in report.weights}
    assert conv["c2.weight"].axis == 0 and conv["c2.weight"].form == "weight-only"
    assert conv["fc.weight"].form == "dynamic"
    assert "c1.weight" in dict(report.skipped)          # 432 elements, under the limit
    got = np.asarray(partita.run(g, [x], backend="torch")[0])
    assert _rel(got, want) < 3e-2


def test_pipeline_text_and_bad_options():
    g, x, _ = _graph("mlp")
    PassManager.parse("quantize{mode=dynamic,min-elements=256}").run(g)
    assert any(n.op == "matmul_integer" for n in g.nodes)
    with pytest.raises(PassError, match="mode must be one of weight-only, dynamic"):
        quantize(_graph("mlp")[0], "int4")


def test_quantized_graph_round_trips_through_the_text_form():
    g, x, _ = _graph("mlp")
    quantize(g, "dynamic", min_elements=256)
    text = partita.print_graph(g)
    again = partita.parse(text)
    again.weights.update(g.weights)
    np.testing.assert_array_equal(partita.run(again, [x])[0], partita.run(g, [x])[0])
    assert any(v.type.dtype is i8 for v in again.inputs)


@pytest.mark.parametrize("mode", ["weight-only", "dynamic"])
def test_generated_code_runs_the_quantized_forms(mode):
    from partita.codegen import CompiledProgram

    g, x, _ = _graph("mlp")
    quantize(g, mode, min_elements=256)
    want = np.asarray(partita.run(g, [x], backend="torch")[0])
    got = CompiledProgram(g)([torch.from_numpy(x)])[0]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
