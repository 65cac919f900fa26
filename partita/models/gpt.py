"""``gpt(...)``: a GPT-2 language model as a weightless forward graph.

The graph is what ``import_torch`` of Hugging Face's ``GPT2LMHeadModel`` gives after the
``split-projections`` pass: token and position embeddings, pre-norm blocks (layer_norm; q, k
and v as three projections ``x @ W + b`` named ``...attn.c_attn.weight.split0..2``; causal
``attention``; ``c_proj``; a tanh-GELU MLP), the final norm and the LM head tied to the
token embedding. Conv1D weights are stored ``[in, out]``, as GPT-2's are.
"""

from __future__ import annotations

import math

from ..ir.dtypes import DType, i64
from ..ir.builder import Builder
from ..ir.graph import Graph, Value
from ..ir.types import TensorType
from ._build import ModelError, ScopedBuilder, check_positive, linear, model_dtype


def gpt(layers: int, hidden: int, heads: int, seq: int, vocab: int, batch: int = 1, dtype: str | DType = "bf16",
        *, ffn: int | None = None, positions: int | None = None, eps: float = 1e-5, attention: str = "fused",
        dropout: float = 0.0, layout: str = "bsh", name: str = "gpt") -> Graph:
    """The forward graph ``ids [batch, seq] i64 -> logits [batch, seq, vocab]`` of a GPT-2
    model; params are ``param`` inputs named as GPT2LMHeadModel's state_dict (the fused
    ``c_attn`` split in three), with no arrays. ``ffn``: the MLP width (4 * hidden);
    ``positions``: rows of the position embedding (``seq``).

    ``attention``: ``"fused"`` (one ``attention`` op, as flash attention computes it) or
    ``"eager"`` (the scores ``q k^T`` materialized, masked, softmaxed and multiplied by ``v``,
    as GPT-2's eager attention computes it) or ``"fused_softmax"`` (the scores materialized,
    then scaled, causally masked and softmaxed by one ``masked_softmax`` op, as Megatron-LM
    computes attention before flash attention, with its fused scale-mask-softmax kernel: what
    a simulation of its published runs must price). ``dropout``: the training dropout probability
    after the embeddings, the attention output and the MLP, and on the attention
    probabilities with the scores materialized (GPT-2 and Megatron-LM train with 0.1); 0 adds
    no dropout op. ``layout``: the activations between the layers as ``[batch, seq, hidden]``
    (``"bsh"``, GPT-2's) or ``[seq, batch, hidden]`` (``"sbh"``, Megatron-LM's): the projections
    multiply the flattened ``[rows, hidden]`` view, whose leading dim is then the sequence, so
    that sequence parallelism splits it whatever the batch (a microbatch of one sequence on
    tp=8); the logits come back as ``[batch, seq, vocab]`` either way."""
    check_positive("gpt", layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, batch=batch)
    if attention not in ("fused", "eager", "fused_softmax"):
        raise ModelError(f"gpt: attention={attention!r:.40} is not 'fused', 'eager' or 'fused_softmax'")
    if layout not in ("bsh", "sbh"):
        raise ModelError(f"gpt: layout={layout!r:.40} is not 'bsh' or 'sbh'")
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0.0 <= dropout < 1.0:
        raise ModelError(f"gpt: dropout={dropout!r:.40} must be in [0, 1)")
    if hidden % heads:
        raise ModelError(f"gpt: hidden={hidden} is not a multiple of heads={heads}")
    dt = model_dtype(dtype)
    ffn = 4 * hidden if ffn is None else ffn
    positions = seq if positions is None else positions
    check_positive("gpt", ffn=ffn, positions=positions)
    if positions < seq:
        raise ModelError(f"gpt: positions={positions} < seq={seq}")
    hd = hidden // heads
    B, S, H = batch, seq, hidden
    g = Graph(name)
    sb = ScopedBuilder(g, "partita/models/gpt.py")
    ids = sb.b.input("ids", TensorType((B, S), i64))
    wte = sb.param("transformer.wte.weight", (vocab, H), dt)
    wpe = sb.param("transformer.wpe.weight", (positions, H), dt)

    sbh = layout == "sbh"
    lead = (S, B) if sbh else (B, S)
    b = sb.at("transformer.wte")
    tok = b.embedding(wte, b.transpose(ids, perm=(1, 0)) if sbh else ids)
    b = sb.at("transformer")
    pos_ids = b.unsqueeze(b.iota(shape=(S,)), axes=(1 if sbh else 0,))
    pos = sb.at("transformer.wpe").embedding(wpe, pos_ids)
    x = sb.at("transformer").add(tok, pos)
    seeds = iter(range(1, 4 * layers + 2))

    def drop(b: Builder, t: Value) -> Value:
        return b.dropout(t, p=dropout, train=True, seed=next(seeds)) if dropout > 0 else t

    x = drop(sb.at("transformer.drop"), x)
    causal = None
    if attention == "eager":
        b = sb.at("transformer")
        rows = b.unsqueeze(b.iota(shape=(S,)), axes=(1,))
        causal = b.greater_equal(rows, b.unsqueeze(b.iota(shape=(S,)), axes=(0,)))     # [S, S]: key <= query

    for i in range(layers):
        s = f"transformer.h.{i}"
        P = lambda n, shape: sb.param(f"{s}.{n}", shape, dt)  # noqa: E731
        ln1 = sb.at(f"{s}.ln_1").layer_norm(x, P("ln_1.weight", (H,)), P("ln_1.bias", (H,)), eps=eps)
        b = sb.at(f"{s}.attn.c_attn")
        x2 = b.reshape(ln1, shape=(-1, H))
        qkv = []
        for j in range(3):
            w, bias = P(f"attn.c_attn.weight.split{j}", (H, H)), P(f"attn.c_attn.bias.split{j}", (H,))
            qkv.append(b.reshape(linear(b, x2, w, bias, False), shape=(*lead, H)))
        b = sb.at(f"{s}.attn")
        heads_first = (1, 2, 0, 3) if sbh else (0, 2, 1, 3)          # -> [B, heads, S, hd]
        q, k, v = (b.transpose(b.reshape(t, shape=(*lead, -1, hd)), perm=heads_first) for t in qkv)
        if attention == "fused":
            out, _lse = b.attention(q, k, v, scale=1.0 / math.sqrt(hd), causal=True)
        elif attention == "fused_softmax":
            scores = b.matmul(q, b.transpose(k, perm=(0, 1, 3, 2)))
            out = b.matmul(drop(b, b.masked_softmax(scores, scale=1.0 / math.sqrt(hd), causal=True)), v)
        else:
            assert causal is not None
            scores = b.matmul(b.mul(q, b.full(shape=(), value=1.0 / math.sqrt(hd), dtype=q.type.dtype)),
                              b.transpose(k, perm=(0, 1, 3, 2)))
            scores = b.where(causal, scores, b.full(shape=(), value=-1e4, dtype=q.type.dtype))
            out = b.matmul(drop(b, b.softmax(scores, axis=-1)), v)
        att = b.reshape(b.transpose(out, perm=(2, 0, 1, 3) if sbh else (0, 2, 1, 3)), shape=(*lead, -1))
        b = sb.at(f"{s}.attn.c_proj")
        proj = linear(b, b.reshape(att, shape=(-1, H)), P("attn.c_proj.weight", (H, H)), P("attn.c_proj.bias", (H,)),
                      False)
        x = sb.at(s).add(drop(b, b.reshape(proj, shape=(*lead, H))), x)
        ln2 = sb.at(f"{s}.ln_2").layer_norm(x, P("ln_2.weight", (H,)), P("ln_2.bias", (H,)), eps=eps)
        b = sb.at(f"{s}.mlp.c_fc")
        h = linear(b, b.reshape(ln2, shape=(-1, H)), P("mlp.c_fc.weight", (H, ffn)), P("mlp.c_fc.bias", (ffn,)), False)
        h = sb.at(f"{s}.mlp.act").gelu(b.reshape(h, shape=(*lead, ffn)), approximate="tanh")
        b = sb.at(f"{s}.mlp.c_proj")
        h = linear(b, b.reshape(h, shape=(-1, ffn)), P("mlp.c_proj.weight", (ffn, H)), P("mlp.c_proj.bias", (H,)),
                   False)
        x = sb.at(s).add(x, drop(b, b.reshape(h, shape=(*lead, H))))

    lnf_w = sb.param("transformer.ln_f.weight", (H,), dt)
    lnf_b = sb.param("transformer.ln_f.bias", (H,), dt)
    x = sb.at("transformer.ln_f").layer_norm(x, lnf_w, lnf_b, eps=eps)
    b = sb.at("lm_head")
    logits = b.matmul(b.reshape(x, shape=(B * S, H)), b.transpose(wte, perm=(1, 0)))
    if sbh:
        return b.ret(b.transpose(b.reshape(logits, shape=(S, B, vocab)), perm=(1, 0, 2)))
    return b.ret(b.reshape(logits, shape=(B, S, vocab)))
