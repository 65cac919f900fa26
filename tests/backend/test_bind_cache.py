"""The generated input binding's shortcut for a param bound before: the very tensor at the same
version skips its checks; a resized, re-set or other tensor is checked again."""

from __future__ import annotations

import torch

from partita.backend import torch_exec as TE


def _bind() -> tuple:
    plan = ([(0, torch.float32, (2, 3))], [(1, torch.float32, (3,), "w"), (2, torch.float32, (3, 3), "a.b")])
    return TE.bind_function(plan), plan


def test_the_same_weights_bind_again_and_an_in_place_write_keeps_binding():
    bind, plan = _bind()
    x, w, ab = torch.randn(2, 3), torch.randn(3), torch.randn(3, 3)
    weights = {"w": w, "a.b": ab}
    for _ in range(3):
        env = [None] * 3
        assert bind(env, [x], weights) and env[1] is w and env[2] is ab
    w.add_(1.0)   # a new version: checked again, still good
    env = [None] * 3
    assert bind(env, [x], weights) and env[1] is w


def test_a_resized_or_reset_param_is_checked_again():
    bind, plan = _bind()
    x, w, ab = torch.randn(2, 3), torch.randn(3), torch.randn(3, 3)
    weights = {"w": w, "a.b": ab}
    assert bind([None] * 3, [x], weights)
    w.resize_(4)
    assert not bind([None] * 3, [x], weights)
    assert not TE._bind_ready(plan, [None] * 3, [x], weights)
    w.resize_(3)
    assert bind([None] * 3, [x], weights)
    ab.set_(torch.randn(9))
    assert not bind([None] * 3, [x], weights)


def test_a_param_whose_data_is_swapped_is_checked_again():
    """``.data =`` gives the same tensor another storage and shape without a new version."""
    bind, plan = _bind()
    x, w, ab = torch.randn(2, 3), torch.randn(3), torch.randn(3, 3)
    weights = {"w": w, "a.b": ab}
    assert bind([None] * 3, [x], weights)
    version = w._version
    w.data = torch.randn(5)
    assert w._version == version   # nothing but the address says it changed
    assert not bind([None] * 3, [x], weights)
    w.data = torch.randn(3)
    env = [None] * 3
    assert bind(env, [x], weights) and env[1] is w


def test_other_tensors_and_inference_tensors_are_checked_every_call():
    bind, _ = _bind()
    x = torch.randn(2, 3)
    good = {"w": torch.randn(3), "a.b": torch.randn(3, 3)}
    assert bind([None] * 3, [x], good)
    assert not bind([None] * 3, [x], {"w": torch.randn(4), "a.b": good["a.b"]})
    assert not bind([None] * 3, [x], {"w": good["w"]})
    with torch.inference_mode():
        iw, iab = torch.randn(3), torch.randn(3, 3)
        env = [None] * 3
        assert bind(env, [x], {"w": iw, "a.b": iab}) and env[1] is iw
        assert bind(env, [x], {"w": iw, "a.b": iab})
        assert not bind([None] * 3, [x], {"w": torch.randn(2), "a.b": iab})
