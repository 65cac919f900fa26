"""Runs of generated convolution steps as one native call (codegen/step_chain.py): inverted
residual blocks of odd sizes chained once their kernels settle, the chain's one call against
eager at every call, and what makes it run its steps one by one again: weights changed in place,
new weight tensors, a bias changed in place, more than one thread; a chain whose member is
not native is split around it; the switch that turns chains off."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita
from partita.codegen import CompiledProgram, step_chain
from partita.codegen.step_chain import ChainStep, chain_ir


class InvertedResidual(nn.Module):
    def __init__(self, c: int, e: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(c, e, 1), nn.ReLU6(), nn.Conv2d(e, e, 3, stride, 1, groups=e), nn.ReLU6(),
                                  nn.Conv2d(e, c, 1))
        self.residual = stride == 1

    def forward(self, x):
        y = self.body(x)
        return x + y if self.residual else y


def _net(c: int = 16) -> nn.Module:
    """MobileNet v2's blocks; channel counts the rules' generated kernels take (their tiles
    filled well enough), odd image sizes, a last layer of 5 channels (on oneDNN)."""
    return nn.Sequential(nn.Conv2d(3, c, 3, 2, 1), nn.ReLU6(), InvertedResidual(c, 48, 1),
                         InvertedResidual(c, 32, 2), InvertedResidual(c, 64, 1), nn.Conv2d(c, 5, 1)).eval()


def _program(m: nn.Module, x: torch.Tensor, freeze: bool = False) -> tuple[CompiledProgram, dict]:
    g = partita.optimize(partita.import_torch(m, (x,)), "canonicalize,fuse-library,fuse-kernels,cse,dce")
    prog = CompiledProgram(g, freeze=freeze)
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    return prog, weights


def _chains(prog: CompiledProgram) -> list[ChainStep]:
    return [st[0] for st in prog.program.steps if type(st[0]) is ChainStep]


def _want(weights: dict, x: torch.Tensor, c: int = 16) -> torch.Tensor:
    ref = _net(c)
    ref.load_state_dict(weights)
    with torch.inference_mode():
        return ref.double()(x.double()).float()


def _assert_calls_match(prog: CompiledProgram, weights: dict, x: torch.Tensor, want: torch.Tensor, calls: int) -> None:
    """``calls`` calls of ``prog`` on ``x``, each against ``want``."""
    with torch.inference_mode():
        for _ in range(calls):
            torch.testing.assert_close(prog([x], weights)[0], want, rtol=1e-4, atol=1e-5)


def _native_calls(prog: CompiledProgram) -> int:
    return sum(c.native_calls for c in _chains(prog))


@pytest.mark.parametrize("hw", [(11, 9), (6, 6), (3, 5)])
def test_chained_program_matches_eager_at_every_call(chain_cache, hw):
    torch.manual_seed(0)
    m = _net()
    x = torch.randn(3, 3, *hw)
    prog, weights = _program(m, x)
    assert set(weights) == set(m.state_dict())
    _assert_calls_match(prog, weights, x, _want(weights, x), 6)
    chains = _chains(prog)
    assert chains and all(c.armed for c in chains)
    assert prog.chained_steps == sum(len(c.members) for c in chains) == 9   # all but the stem and the head
    before = _native_calls(prog)
    with torch.inference_mode():
        for _ in range(3):
            x2 = torch.randn(3, 3, *hw)   # a new input each call: read by the stem, outside any chain
            torch.testing.assert_close(prog([x2], weights)[0], _want(weights, x2), rtol=1e-4, atol=1e-5)
    assert _native_calls(prog) == before + 3 * len(chains)


def test_changed_weights_run_stepwise_and_arm_again(chain_cache):
    torch.manual_seed(1)
    x = torch.randn(2, 3, 10, 7)
    prog, weights = _program(_net(), x)
    with torch.inference_mode():
        for _ in range(5):
            prog([x], weights)
    assert _chains(prog) and all(c.armed for c in _chains(prog))
    cases = ["in place", "new tensors", "bias in place"]
    for case in cases:
        if case == "in place":
            for w in weights.values():
                w.mul_(0.5)
        elif case == "new tensors":
            weights = {k: v * -1.5 for k, v in weights.items()}
        else:
            k = next(k for k in weights if k.endswith("bias") and k != "0.bias")
            weights[k].add_(0.25)
        native = _native_calls(prog)
        with torch.inference_mode():
            got = prog([x], weights)[0]
        torch.testing.assert_close(got, _want(weights, x), rtol=1e-4, atol=1e-5, msg=case)
        if case == "bias in place":   # the kernels read biases where they are: still the one native call
            assert _native_calls(prog) == native + len(_chains(prog)), case
            continue
        assert _native_calls(prog) == native, case   # the first call after the change: step by step
        for _ in range(3):   # a changed weight is packed again once seen unchanged (library.PackedWeight)
            with torch.inference_mode():
                got = prog([x], weights)[0]
            torch.testing.assert_close(got, _want(weights, x), rtol=1e-4, atol=1e-5, msg=case)
        assert _native_calls(prog) > native, case    # armed again


def test_more_threads_run_stepwise(chain_cache):
    torch.manual_seed(2)
    x = torch.randn(2, 3, 12, 12)
    prog, weights = _program(_net(), x)
    want = _want(weights, x)
    with torch.inference_mode():
        for _ in range(8):
            prog([x], weights)
    native = _native_calls(prog)
    assert native > 0
    try:
        torch.set_num_threads(2)
        _assert_calls_match(prog, weights, x, want, 2)
        assert _native_calls(prog) == native   # two threads: each step as it was
    finally:
        torch.set_num_threads(1)
    _assert_calls_match(prog, weights, x, want, 2)
    assert _native_calls(prog) > native


def test_a_member_that_is_not_native_is_split_out(chain_cache, monkeypatch):
    torch.manual_seed(3)
    x = torch.randn(2, 3, 9, 9)
    prog, weights = _program(_net(), x)
    with torch.inference_mode():
        for _ in range(2):
            prog([x], weights)
    native = step_chain.native_steps(prog.program)
    assert len(native) >= 6
    # a step that says it is native but never binds: its chain cannot arm
    k = native[len(native) // 2]
    fn = prog.program.steps[k][0]
    monkeypatch.setattr(fn, "native_entry", lambda args: None if args is not None else (1, 1), raising=False)
    _assert_calls_match(prog, weights, x, _want(weights, x), 8)
    chains = _chains(prog)
    assert chains and all(c.armed for c in chains)
    assert all(m.index != k for c in chains for m in c.members)
    assert prog.program.steps[k][0] is fn    # the step as it was
    assert prog.chained_steps == sum(len(c.members) for c in chains) >= len(native) - 3


def test_switched_off_no_chain(chain_cache, monkeypatch):
    monkeypatch.setattr(step_chain, "ENABLED", False)
    torch.manual_seed(4)
    x = torch.randn(2, 3, 8, 8)
    prog, weights = _program(_net(), x)
    _assert_calls_match(prog, weights, x, _want(weights, x), 5)
    assert not _chains(prog) and prog.chained_steps == 0


def test_frozen_program_chains(chain_cache):
    torch.manual_seed(5)
    x = torch.randn(4, 3, 16, 16)
    m = _net(32)
    prog, weights = _program(m, x, freeze=True)
    with torch.inference_mode():
        want = m.double()(x.double()).float()
    _assert_calls_match(prog, weights, x, want, 6)
    assert _chains(prog) and all(c.armed for c in _chains(prog))


def test_the_loop_calls_each_entry_in_order():
    import ctypes

    from partita.codegen.jit import jit

    ir = chain_ir("pt_step_chain_test") + "\n".join([
        "define void @pt_chain_test_digit(ptr %p) nounwind {",   # *acc = *acc * 10 + digit
        "  %av = load i64, ptr %p, align 8",
        "  %a = inttoptr i64 %av to ptr",
        "  %v = load i64, ptr %a, align 8",
        "  %w = mul i64 %v, 10",
        "  %q = getelementptr inbounds i64, ptr %p, i64 1",
        "  %d = load i64, ptr %q, align 8",
        "  %s = add i64 %w, %d",
        "  store i64 %s, ptr %a, align 8",
        "  ret void",
        "}"]) + "\n"
    try:
        k = jit().kernel("pt_step_chain_test", ir, 0, argtypes=[ctypes.c_void_p])
    except Exception as e:   # no LLVM here: nothing to test
        pytest.skip(f"no generated code: {e}")
    with jit().lock:
        digit = jit().engine.get_function_address("pt_chain_test_digit")
    acc = (ctypes.c_int64 * 1)(0)
    blocks = [(ctypes.c_int64 * 2)(ctypes.addressof(acc), d) for d in (3, 1, 4, 1, 5)]
    table = (ctypes.c_int64 * 11)(5, *[v for b in blocks for v in (digit, ctypes.addressof(b))])
    k.fn(ctypes.addressof(table))
    assert acc[0] == 31415


def test_params_epoch_moves_only_when_a_param_changes(chain_cache):
    torch.manual_seed(6)
    x = torch.randn(2, 3, 8, 8)
    prog, weights = _program(_net(), x)
    epoch = prog.program.params_epoch
    with torch.inference_mode():
        prog([x], weights)
        start = epoch[0]
        for _ in range(3):
            prog([torch.randn(2, 3, 8, 8)], weights)   # new inputs: not params
        assert epoch[0] == start
        next(iter(weights.values())).add_(1.0)        # in place: a new version
        prog([x], weights)
        assert epoch[0] > start
        start = epoch[0]
        prog([x], weights)
        assert epoch[0] == start
        prog([x], dict(weights))                      # another dict, the same tensors
        assert epoch[0] == start
        k = next(iter(weights))
        prog([x], {**weights, k: weights[k].clone()})  # another tensor
        assert epoch[0] > start


def test_a_step_reading_the_input_stays_out_of_chains(chain_cache):
    """A channels-last input the stem could read where it is: the stem still stays out of the
    chain, so that a new input tensor at every call finds the chain's operands unchanged (the
    stem's result) and runs it as its one native call, where a chained stem would run the
    steps one by one and arm the chain again at each call."""
    torch.manual_seed(7)
    shape = (2, 3, 11, 7)
    x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
    prog, weights = _program(_net(), x)
    with torch.inference_mode():
        for _ in range(6):
            torch.testing.assert_close(prog([x], weights)[0], _want(weights, x), rtol=1e-4, atol=1e-5)
        assert prog.chained_steps == 9
        native = _native_calls(prog)
        x.mul_(-2.0)                      # the same tensor, new contents
        torch.testing.assert_close(prog([x], weights)[0], _want(weights, x), rtol=1e-4, atol=1e-5)
        assert _native_calls(prog) == native + 1
        for _ in range(3):                # a new input tensor each call: the chain's one call each time
            x2 = torch.randn(shape).contiguous(memory_format=torch.channels_last)
            torch.testing.assert_close(prog([x2], weights)[0], _want(weights, x2), rtol=1e-4, atol=1e-5)
        assert _native_calls(prog) == native + 4


def test_a_member_reading_a_new_tensor_each_call_is_split_out(chain_cache):
    torch.manual_seed(8)
    x = torch.randn(2, 3, 9, 9)
    prog, weights = _program(_net(), x)
    steps = prog.program.steps
    stem = steps[0][0]

    def fresh(args, attrs):   # the stem's result as a new tensor at every call
        return stem(args, attrs).clone(memory_format=torch.channels_last)

    steps[0] = (fresh, *steps[0][1:])
    _assert_calls_match(prog, weights, x, _want(weights, x), 8)
    chains = _chains(prog)
    assert chains and all(c.armed and c.native_calls for c in chains)
    readers = {i for i, st in enumerate(prog.program.steps) if steps[0][3][0] in st[1]}
    assert readers and all(m.index not in readers for c in chains for m in c.members)
    # the nine less the two readers of the stem's result (the first block's expansion and its
    # projection, which adds the residual), and the depthwise step between them, alone now
    assert prog.chained_steps == 6
