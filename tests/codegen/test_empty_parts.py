"""Empty concat parts and whole-axis slices taken out before fuse-library (codegen/empty_parts.py):
Phi-3's "partial" rotary embedding over the whole head then becomes one rotary_attention."""
from __future__ import annotations

import numpy as np
import torch

from partita.codegen import CompiledProgram
from partita.codegen.empty_parts import drop_empty_parts
from partita.ir import Builder, TensorType, verify
from partita.ir.dtypes import DTYPES
from partita.passes import PassManager

from strategies import random_inputs, run_reference

F32 = DTYPES["f32"]
T = lambda *s: TensorType(tuple(s), F32)  # noqa: E731


def _rope_whole_as_partial(b, x, cos, sin):
    """concat(rope(x[..., :E]), x[..., E:]): a partial rotary embedding whose rotated part is the
    whole head (rd = E), as Phi-3 writes it."""
    e = x.type.shape[-1]
    rot = b.slice(x, axis=3, end=e)
    rest = b.slice(x, axis=3, start=e)
    lo = b.slice(rot, axis=3, end=e // 2)
    hi = b.slice(rot, axis=3, start=e // 2)
    rh = b.concat(b.neg(hi), lo, axis=3)
    return b.concat(b.add(b.mul(rot, cos), b.mul(rh, sin)), rest, axis=3)


def _graph():
    b = Builder()
    q, k, v = (b.input(n, T(2, 3, 10, 16)) for n in "qkv")
    cos, sin = b.input("cos", T(1, 1, 10, 16)), b.input("sin", T(1, 1, 10, 16))
    out, _ = b.attention(_rope_whole_as_partial(b, q, cos, sin), _rope_whole_as_partial(b, k, cos, sin), v,
                         causal=True)
    return verify(b.ret(out))


def test_the_whole_head_partial_rope_becomes_one_rotary_attention_with_the_same_reference():
    g = _graph()
    inputs = random_inputs(g, 4)
    before = run_reference(g, inputs)
    out = verify(PassManager.parse("fuse-library,dce").run(g))
    assert [n.op for n in out.nodes] == ["rotary_attention"]
    np.testing.assert_allclose(run_reference(out, inputs)[0], before[0], rtol=1e-5, atol=1e-6)
    got = CompiledProgram(out)({k: torch.from_numpy(a) for k, a in inputs.items()})
    np.testing.assert_allclose(got[0].numpy(), before[0], rtol=1e-5, atol=1e-5)


def test_only_empty_parts_and_whole_slices_go_and_outputs_stay():
    b = Builder()
    x = b.input("x", T(2, 5, 7))
    e = b.slice(x, axis=1, start=5)                   # empty along axis 1
    kept = b.concat(e, b.neg(x), axis=1)              # -> neg(x)
    whole = b.slice(kept, axis=2, start=0, end=7)     # -> kept
    part = b.slice(x, axis=2, start=1)                # stays: not the whole axis
    two = b.concat(x, x, axis=1)                      # stays: two non-empty parts
    out_slice = b.slice(x, axis=0, end=2)             # a graph output: stays
    g = verify(b.ret(b.neg(whole), part, two, out_slice))
    inputs = random_inputs(g, 1)
    before = run_reference(g, inputs)
    assert drop_empty_parts(g) == 2
    g = verify(PassManager.parse("dce").run(g))
    ops = [n.op for n in g.nodes]
    assert ops.count("concat") == 1 and ops.count("slice") == 2 and ops.count("neg") == 2
    for a, c in zip(before, run_reference(g, inputs)):
        np.testing.assert_array_equal(a, c)
