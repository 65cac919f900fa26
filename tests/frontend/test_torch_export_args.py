"""What import_torch does with the arguments people pass: Python constants (bool, None, int,
float, str) are constants of the export and leave the graph's inputs; the key/value cache of
transformers models is off in every config while the model is exported."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
import torch
import torch.nn as nn

import partita

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class _Options(nn.Module):
    def forward(self, x, mask=None, scale=2, mode="relu", flag=True, factor=0.5):
        y = x * scale * factor
        if mask is not None:
            y = y + mask
        if flag:
            y = y.relu() if mode == "relu" else torch.tanh(y)
        return y


@pytest.mark.parametrize("args,kwargs", [
    ((None, 3, "relu", False, 0.25), {}),
    ((None, 3, "tanh", True, 0.25), {}),
    ((), {"flag": True, "mode": "tanh", "scale": 4}),
])
def test_python_constant_arguments_leave_the_graph_inputs(args, kwargs):
    x = torch.randn(2, 3)
    g = partita.import_torch(_Options(), (x, *args), kwargs)
    assert [v.name for v in g.inputs] == ["x"]
    want = _Options()(x, *args, **kwargs).numpy()
    np.testing.assert_allclose(partita.run(g, [x.numpy()])[0], want, rtol=1e-6, atol=1e-7)


def test_a_tensor_argument_after_a_constant_keeps_its_name():
    x, m = torch.randn(2, 3), torch.randn(2, 3)
    g = partita.import_torch(_Options(), (x, m, 3), {"flag": False})
    assert [v.name for v in g.inputs] == ["x", "mask"]
    np.testing.assert_allclose(partita.run(g, [x.numpy(), m.numpy()])[0],
                               _Options()(x, m, 3, flag=False).numpy(), rtol=1e-6)


transformers = pytest.importorskip("transformers")


@functools.cache
def _gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_gpt2_with_use_cache_false_and_an_attention_mask():
    model = _gpt2()
    ids = torch.randint(0, 128, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0
    g = partita.import_torch(model, (ids,), {"attention_mask": mask, "use_cache": False})
    assert [v.name for v in g.inputs if v.role == "input"] == ["input_ids", "attention_mask"]
    with torch.no_grad():
        want = model(ids, attention_mask=mask, use_cache=False).logits.numpy()
    got = partita.run(g, [ids.numpy(), mask.numpy()], backend="torch")[0]
    assert np.max(np.abs(np.asarray(got) - want)) <= 1e-5 * np.max(np.abs(want))
    assert model.config.use_cache is True        # left as it was


def test_t5_encoder_decoder_imports_with_every_cache_off():
    torch.manual_seed(0)
    cfg = transformers.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4,
                                decoder_start_token_id=0)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    # The decoder stack holds its own copy of the config, with the cache on.
    assert model.decoder.config is not model.config and model.decoder.config.use_cache
    ids, dec = torch.randint(0, 128, (2, 7)), torch.randint(0, 128, (2, 5))
    g = partita.import_torch(model, (ids,), {"decoder_input_ids": dec})
    with torch.no_grad():
        want = model(input_ids=ids, decoder_input_ids=dec).logits.numpy()
    got = np.asarray(partita.run(g, [ids.numpy(), dec.numpy()], backend="torch")[0])
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
    assert model.decoder.config.use_cache is True and model.config.use_cache is True
