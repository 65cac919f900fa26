"""Pipelines on reshapes and gathers that keep each microbatch's rows to themselves (the
zoo's Swin, MoE and MobileViT rows; pipeline/microbatch_rewrites.py), each against one
device, and the look-alikes that do mix microbatches, still refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest

import partita
from partita.parallel.pipeline.schedule import PipelineError

torch = pytest.importorskip("torch")

LOSS_TOL = 1e-5     # the loss, relative
TOL = 1e-4          # the updated params and optimizer states, relative in the L2 norm (as test_pipeline.py)
CASES = [("pp=2", "pp", dict(microbatches=2, schedule="1f1b")),
         ("pp=2,dp=2", "pp+dp", dict(microbatches=2, schedule="1f1b")),
         ("pp=2", "pp", dict(microbatches=4, schedule="gpipe"))]


def _rel(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-6 * np.sqrt(b.size)))


def _step(module, *args):
    from partita.autodiff.training import training_step
    from partita.frontend.torch_export import import_torch

    torch.manual_seed(0)
    fwd = import_torch(module, tuple(args))
    step = training_step(fwd, optimizer="sgd", lr=0.1, momentum=0.9)
    names = [v.name for v in fwd.inputs if v.role == "input"]
    return step, dict(zip(names, [a.numpy() for a in args]))


def _check(step, inputs, mesh, strategy, **kw):
    from partita.backend.numpy_ref import run as run_np

    want = run_np(step, {**{k: np.asarray(a) for k, a in step.weights.items()}, **inputs})
    got = partita.parallelize(step, mesh=mesh, strategy=strategy, **kw).simulate(inputs)
    assert _rel(got[0], want[0]) <= LOSS_TOL, (float(got[0]), float(want[0]))
    bad = [f"%{v.name}: {_rel(o, w):.2e}" for o, w, v in zip(got, want, step.outputs) if not _rel(o, w) <= TOL]
    assert not bad, f"{strategy} on {mesh} {kw}: {', '.join(bad[:6])}"


def _ops(step) -> set[str]:
    return {n.op for n in step.nodes}


class Pooled(torch.nn.Module):
    """Swin's head: tokens, a norm, the adaptive average pool over the tokens, a classifier."""

    def __init__(self):
        super().__init__()
        self.h = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))
        self.norm = torch.nn.LayerNorm(8)
        self.pool = torch.nn.AdaptiveAvgPool1d(1)
        self.out = torch.nn.Linear(8, 3)

    def forward(self, x, y):
        for layer in self.h:
            x = torch.tanh(layer(x)) + x
        p = self.pool(self.norm(x).transpose(1, 2)).flatten(1)
        return ((self.out(p) - y) ** 2).mean()


class Gathered(torch.nn.Module):
    """Activations gathered at ``b * S + (S - 1 - j)`` (each sequence reversed, by an index built
    from shapes, as a vmapped function imports) between layers; ``flip``: the whole batch
    reversed instead, so that each row reads a row of another microbatch."""

    def __init__(self, flip: bool = False):
        super().__init__()
        self.flip = flip
        self.h = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        b, s, d = x.shape
        idx = (torch.arange(b)[:, None] * s + (s - 1 - torch.arange(s))[None, :]).reshape(-1)
        if self.flip:
            idx = torch.arange(b * s).flip(0)
        for layer in self.h:
            x = torch.tanh(layer(x))
            x = x.reshape(b * s, d)[idx].reshape(b, s, d) + x
        return (x ** 2).mean()


class Unfold(torch.nn.Module):
    """MobileViT's unfolding of feature maps into patches and folding back, between convolutions."""

    def __init__(self):
        super().__init__()
        self.conv_in = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.mix = torch.nn.Linear(4, 4)
        self.conv_out = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x):
        x = torch.tanh(self.conv_in(x))
        b, c, h, w = x.shape
        ph = pw = 2
        nh, nw = h // ph, w // pw
        p = x.reshape(b * c * nh, ph, nw, pw).transpose(1, 2).reshape(b, c, nh * nw, ph * pw)
        p = p.transpose(1, 3).reshape(b * ph * pw, nh * nw, c)
        p = torch.tanh(self.mix(p))
        f = p.reshape(b, ph * pw, nh * nw, c).transpose(1, 3).reshape(b * c * nh, nw, ph, pw)
        f = f.transpose(1, 2).reshape(b, c, h, w)
        return self.conv_out(f) + x


class Unfolded(torch.nn.Module):
    """Two unfolding blocks (the pipeline's layers)."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Unfold() for _ in range(2))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return (x ** 2).mean()


class Grouped(torch.nn.Module):
    """An MoE layer's token groups: ``[B, S, d] -> [G, B*S/G, d]``, a softmax over each group's
    tokens (as its capacity count is), and back."""

    def __init__(self, groups: int = 2):
        super().__init__()
        self.groups = groups
        # no bias: a softmax over the tokens does not depend on it (a gradient of rounding noise)
        self.h = torch.nn.ModuleList(torch.nn.Linear(8, 8, bias=False) for _ in range(3))

    def forward(self, x):
        b, s, d = x.shape
        for layer in self.h:
            g = layer(x).reshape(self.groups, b * s // self.groups, d)
            x = torch.softmax(g, dim=1).reshape(b, s, d) + x
        return (x ** 2).mean()


@pytest.fixture(scope="module")
def pooled():
    return _step(Pooled(), torch.randn(8, 4, 8), torch.randn(8, 3))


@pytest.fixture(scope="module")
def gathered():
    return _step(Gathered(), torch.randn(8, 4, 8))


@pytest.fixture(scope="module")
def unfolded():
    return _step(Unfolded(), torch.randn(8, 4, 4, 4))


@pytest.fixture(scope="module")
def grouped():
    return _step(Grouped(), torch.randn(8, 4, 8))


@pytest.mark.parametrize("mesh,strategy,kw", CASES)
def test_identity_gather_of_a_pool_over_tokens_matches_one_device(pooled, mesh, strategy, kw):
    assert "index_select" in _ops(pooled[0])
    _check(*pooled, mesh, strategy, **kw)


@pytest.mark.parametrize("mesh,strategy,kw", CASES)
def test_rows_gathered_at_a_shape_built_index_match_one_device(gathered, mesh, strategy, kw):
    assert "embedding" in _ops(gathered[0])  # rows of a matrix taken by a list: an embedding lookup
    _check(*gathered, mesh, strategy, **kw)


@pytest.mark.parametrize("mesh,strategy,kw", CASES)
def test_unfolding_into_patches_and_back_matches_one_device(unfolded, mesh, strategy, kw):
    _check(*unfolded, mesh, strategy, **kw)


@pytest.mark.parametrize("mesh,strategy,kw", CASES[:2])
def test_token_groups_that_microbatches_divide_match_one_device(grouped, mesh, strategy, kw):
    _check(*grouped, mesh, strategy, **kw)


def test_token_groups_split_across_microbatches_are_refused(grouped):
    # 4 microbatches of 2 groups: a group's softmax would span two microbatches
    with pytest.raises(PipelineError, match="mixes the rows of different microbatches"):
        partita.parallelize(grouped[0], mesh="pp=2", strategy="pp", microbatches=4)


def test_a_constant_index_that_reads_other_microbatches_is_refused_with_the_reason():
    step, _ = _step(Gathered(flip=True), torch.randn(8, 4, 8))
    with pytest.raises(PipelineError, match="constant index does not read"):
        partita.parallelize(step, mesh="pp=2", strategy="pp", microbatches=2)


def test_an_index_computed_at_run_time_is_refused_with_the_reason():
    class Permuted(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.h = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

        def forward(self, x, perm):
            x = torch.tanh(self.h[0](x))
            x = x[perm]  # rows chosen by the data: which microbatch each reads is known only at run time
            return (self.h[1](x) ** 2).mean()

    step, _ = _step(Permuted(), torch.randn(8, 8), torch.arange(8))
    with pytest.raises(PipelineError, match="is computed at run time"):
        partita.parallelize(step, mesh="pp=2", strategy="pp", microbatches=2)


def test_the_rewrites_are_identities():
    from partita.parallel.pipeline.microbatch_rewrites import block_offsets, factored_shapes

    assert factored_shapes((128, 2, 2, 2), (4, 16, 4, 4), 2) == ([2, 64, 2, 2, 2], [2, 2, 16, 4, 4])
    assert factored_shapes((4, 8, 64), (32, 64), 2) is None          # a merge: the rule splits it already
    assert factored_shapes((4, 8, 64), (2, 16, 64), 4) is None       # 4 microbatches of 2 groups
    assert list(block_offsets(np.arange(8), 8, 2)) == [0, 1, 2, 3]
    assert list(block_offsets(np.array([1, 0, 5, 4]), 8, 2)) == [1, 0]
    assert block_offsets(np.arange(8)[::-1], 8, 2) is None
    assert block_offsets(np.array([0, 1, 4, 6]), 8, 2) is None
