"""Benchmark of single-device execution: partita's executor against PyTorch eager, torch.compile
(Inductor) and ONNX Runtime, on inference of seven models and one GPT-2 AdamW training step.

    .venv/bin/python bench/bench_codegen.py                            # everything, 1 thread
    .venv/bin/python bench/bench_codegen.py --threads 2 --rounds 30
    .venv/bin/python bench/bench_codegen.py --models gpt2,llama --peers eager,ort
    .venv/bin/python bench/bench_codegen.py --executors aten           # only the ATen executor
    .venv/bin/python bench/bench_codegen.py --memory                   # and measured peak memory (+5 min)
    .venv/bin/python bench/bench_codegen.py --quick                    # tiny sizes, 3 rounds, no Inductor

partita's side: the model is imported with ``partita.import_torch`` (torch.export), optimized with
``PIPELINE`` (the command line's default pipeline, ``partita.cli.common.DEFAULT_PIPELINE``, with
``fuse-activations`` before it, as ``training_step`` runs it) and run by one of ``EXECUTORS``:

  aten     ``partita.backend.torch_exec.TorchProgram(graph)``: one ATen call per node
  codegen  ``partita.codegen.CompiledProgram(graph)`` with its default options (fold-batch-norm,
           fuse-library, fuse-kernels, the memory plan, the generated run function), when
           ``import partita.codegen`` succeeds and the module has ``CompiledProgram``;
           otherwise the column is left out with a note

Both are called the same way: ``prog(inputs) -> list of outputs``, where ``inputs`` is the list
of the graph's ``input``-role values (CPU torch tensors, in the graph's order) and params and
buffers come from ``graph.weights``. For the training step the executor gets a dict by name
that also holds the params and optimizer state, as ``partita.autodiff.Trainer`` feeds
``TorchProgram`` (with ``donate=True`` when the executor's constructor takes ``donate``, as
both do: ``CompiledProgram(step, donate=True)`` runs AdamW as generated kernels and leaves the
library passes out). Outputs may be torch tensors or NumPy arrays.

Before timing, every candidate's outputs are compared with eager's (the max absolute error,
and that error over the output's largest magnitude); a partita executor above 1e-3 relative
fails the run (exit status 1) after the tables are printed.

Peers: ``eager`` (the module under ``torch.inference_mode``), ``inductor`` (``torch.compile``
in its default mode, under ``torch.no_grad``; its cold compile is the first call, timed with a
fresh ``TORCHINDUCTOR_CACHE_DIR`` per model and Inductor's in-memory caches cleared, after one
untimed compile of a tiny function at start-up that takes Inductor's own imports out of the
first model's figure) and ``ort`` (``torch.onnx.export`` with the TorchScript exporter,
``dynamo=False``, opset 17; an ONNX Runtime session with ``ORT_ENABLE_ALL``, sequential
execution, ``intra_op_num_threads`` = the thread count, ``inter_op_num_threads`` = 1, and with
more than one thread its pool's spinning off unless ``--ort-spinning``: ``_no_spinning``). A
failed export is recorded in the table, not raised.

Training step: ``partita.training_step(import_torch(model), loss="cross_entropy",
optimizer="adamw")`` run by ``partita.autodiff.Trainer`` (as bench/bench_train.py does),
against the eager loop with ``torch.optim.AdamW`` (its default implementation on CPU) and
against ``torch.compile`` of the same step function with ``torch.optim.AdamW(fused=True)``.
All three start from the same weights and their first two losses are compared.

Measurement: one thread by default (the OMP/MKL/OpenBLAS variables are set before torch is
imported, ``torch.set_num_threads``); ``--threads N`` for more. After warm-up calls, all
candidates of a model are timed in the same rounds: each round times each candidate once
(``--calls`` calls, the per-call mean), the starting candidate rotating per round. Times are
medians over rounds; every ratio (partita / peer: above 1 means partita is slower) is the
median of the per-round ratios. Compile times: partita's is ``optimize`` plus the executor's
construction (``import_torch`` is reported apart, split into torch.export and partita's
conversion); its first call is reported too.

Codegen's compile, cold and warm (``--compile-probe``, on unless ``--quick``): the imported
graph is saved (``partita.save``) and loaded in a fresh interpreter, which times ``optimize``
and ``CompiledProgram`` (``training_step`` and ``CompiledProgram(step, donate=True)`` for the
training step), torch.export being outside it. Cold: ``PARTITA_CACHE_DIR`` is a new, empty
directory for that model, and nothing of partita has compiled in that process before (its
kernels are also cached in memory, so a build later in the same process would not be cold).
Warm: a second fresh process on the cache the first one filled. Each is done
``--compile-repeats`` times (3) and the median is reported, with the slowest and the kernels
that process compiled or read from disk.

Peak memory (``--memory``; it adds minutes, so it is off by default): partita's plan
(``CompiledProgram.memory_plan.peak_bytes``, with ``arena_bytes``), and for every candidate a
fresh process (``_worker_memory``) with ``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB (so what a
call frees goes back to the system), which builds the candidate, warms it up, resets the
kernel's peak counter (``/proc/self/clear_refs``), runs it a few times and reports VmHWM minus
the resident size before those runs, and apart from it what building and warming up kept.
Two such processes run at a time, after every model's timed rounds.

Profile (``--profile``, on unless ``--quick``): after the rounds, 10 more interleaved rounds
(5 for the training step) of one profiled call per candidate (``profile_rounds``): each
partita program's steps timed one by one (``StepProfiler``), eager and Inductor under
``torch.profiler`` and a second ONNX Runtime session with its own profiler; the ops are
summed by category (GEMM, conv, attention, norm, other) beside the time outside them.

The script prints Markdown tables, the issue's targets for codegen (met or missed), and writes
JSON to bench/results/codegen-<time>.json. ``--worker`` is the fresh processes' entry.
"""

from __future__ import annotations

import os
import sys


def _threads_from_argv(argv: list[str]) -> int:
    """``--threads N`` read before torch is imported (the BLAS variables must be set first)."""
    for i, a in enumerate(argv):
        if a == "--threads" and i + 1 < len(argv):
            return max(int(argv[i + 1]), 1) if argv[i + 1].isdigit() else 1
        if a.startswith("--threads="):
            v = a.split("=", 1)[1]
            return max(int(v), 1) if v.isdigit() else 1
    return 1


THREADS = _threads_from_argv(sys.argv[1:])
ORT_SPINNING = "--ort-spinning" in sys.argv[1:]  # ORT's default; off here with more than one thread
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = str(THREADS)

import argparse  # noqa: E402
import contextlib  # noqa: E402
import copy  # noqa: E402
import functools  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import partita  # noqa: E402
from partita.backend.torch_exec import TorchProgram  # noqa: E402
from partita.cli.common import DEFAULT_PIPELINE  # noqa: E402
from partita.frontend.torch_export import import_torch  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
PIPELINE = "fuse-activations," + DEFAULT_PIPELINE
ACCURACY_RTOL = 1e-3
PEERS = ("eager", "inductor", "ort")
LR = 1e-3


# --- partita's executors -------------------------------------------------------------------

def _aten(graph: partita.Graph) -> Callable:
    return TorchProgram(graph)


EXECUTORS: dict[str, Callable[..., Callable]] = {"aten": _aten}  # (graph, donate=...) -> program
EXECUTOR_NOTES: list[str] = []


def _find_codegen() -> None:
    """Adds ``EXECUTORS["codegen"]`` when partita.codegen imports and has CompiledProgram."""
    import importlib
    import importlib.util

    err: Exception | None = None
    try:
        spec = importlib.util.find_spec("partita.codegen")
    except Exception as e:
        spec, err = None, e
    if spec is None:
        EXECUTOR_NOTES.append("codegen executor left out: there is no partita.codegen"
                              + (f" ({type(err).__name__}: {err})" if err else ""))
        return
    here = Path(partita.__file__).resolve().parent
    if spec.origin is None or not Path(spec.origin).resolve().is_relative_to(here):
        # An editable install's finder can serve a submodule from another checkout than the
        # partita imported here (a copy of an older tree, run for "before" figures).
        EXECUTOR_NOTES.append(f"codegen executor left out: partita.codegen would come from {spec.origin}, "
                              f"outside the partita imported here ({here})")
        return
    try:
        codegen = importlib.import_module("partita.codegen")
    except Exception as e:  # the code generator is optional: absent, or failing to import
        EXECUTOR_NOTES.append(f"codegen executor left out: import partita.codegen failed ({_first_line(e)})")
        return
    if hasattr(codegen, "CompiledProgram"):
        EXECUTORS["codegen"] = codegen.CompiledProgram
    else:
        EXECUTOR_NOTES.append("codegen executor left out: partita.codegen has no CompiledProgram")


# --- models --------------------------------------------------------------------------------

class MLP(nn.Module):
    """Linear layers with GELU between them."""

    def __init__(self, widths: tuple[int, ...]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths, widths[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.gelu(x)
        return x


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNetStyle(nn.Module):
    """A 3x3 conv-bn-relu stem, two basic blocks per stage (the first of each later stage with
    stride 2 and a 1x1 conv-bn shortcut), global average pooling and a linear head."""

    def __init__(self, widths: tuple[int, ...], classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        blocks, cin = [], widths[0]
        for i, w in enumerate(widths):
            blocks += [BasicBlock(cin, w, 1 if i == 0 else 2), BasicBlock(w, w, 1)]
            cin = w
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(F.relu(self.bn(self.stem(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Chain(nn.Module):
    """The elementwise chain of docs/codegen-choice.md: 12 x (clamp(-2, 2), * 1.01, + 0.1)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(12):
            x = x.clamp(-2.0, 2.0)
            x = x * 1.01
            x = x + 0.1
        return x


class Logits(nn.Module):
    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, use_cache=False).logits


class LogitsAllOnesMask(Logits):
    """The same logits with an explicit all-ones attention mask: the computation eager runs for
    ``Logits`` (no padding), spelled so that the TorchScript ONNX exporter can trace it
    (transformers' packed-sequence check for a missing mask calls ``aten::diff``, which that
    exporter has no symbolic for)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits


class BertHidden(nn.Module):
    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state


class VitHidden(nn.Module):
    def __init__(self, vit: nn.Module) -> None:
        super().__init__()
        self.vit = vit

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.vit(pixel_values=pixels).last_hidden_state


@dataclass
class Case:
    """One model: the module (eval mode, fp32), its example inputs (positional), and the
    variants of it the ONNX exporter is tried on, in order (label, module)."""

    key: str
    label: str
    module: nn.Module
    args: tuple
    names: tuple[str, ...]
    onnx_variants: list[tuple[str, nn.Module]] = field(default_factory=list)
    train_target: torch.Tensor | None = None


def _randomize_bn(model: nn.Module) -> None:
    """Running statistics and affine parameters away from 0/1, so batch norm does something."""
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)


@dataclass(frozen=True)
class Sizes:
    mlp: tuple[int, ...]
    mlp_batch: int
    cnn_widths: tuple[int, ...]
    cnn_input: tuple[int, int, int, int]
    layers: int
    width: int
    heads: int
    ffn: int
    llama_ffn: int
    vocab: int
    batch: int
    tokens: int
    image: int
    patch: int
    chain: tuple[int, int]


FULL = Sizes(mlp=(1024, 4096, 4096, 1024), mlp_batch=32, cnn_widths=(32, 64, 128), cnn_input=(8, 3, 64, 64),
             layers=4, width=256, heads=4, ffn=1024, llama_ffn=688, vocab=8192, batch=4, tokens=128, image=96,
             patch=16, chain=(256, 4096))
QUICK = Sizes(mlp=(64, 128, 64), mlp_batch=4, cnn_widths=(8, 16), cnn_input=(2, 3, 16, 16), layers=1, width=32,
              heads=2, ffn=64, llama_ffn=64, vocab=128, batch=2, tokens=16, image=32, patch=16, chain=(16, 64))


def _gpt2_lm(s: Sizes) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=s.layers, n_embd=s.width, n_head=s.heads, vocab_size=s.vocab, n_positions=s.tokens,
                     use_cache=False, bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0)
    return Logits(GPT2LMHeadModel(cfg))


def _lm_onnx_variants(m: Logits) -> list[tuple[str, nn.Module]]:
    return [("the model as is", m), ("an all-ones attention_mask passed", LogitsAllOnesMask(m.lm))]


def _transformer_label(name: str, s: Sizes, extra: str = "") -> str:
    return f"{name} {s.layers} layer{'s' if s.layers > 1 else ''} {s.width} wide, {s.batch} x {s.tokens} tokens{extra}"


def make_case(key: str, s: Sizes) -> Case:
    """The model ``key`` at sizes ``s``, weights from ``torch.manual_seed(0)``, in eval mode."""
    torch.manual_seed(0)
    if key == "mlp":
        w = "-".join(map(str, s.mlp))
        m = MLP(s.mlp)
        return Case(key, f"MLP {w} GELU, batch {s.mlp_batch}", m, (torch.randn(s.mlp_batch, s.mlp[0]),), ("x",))
    if key == "cnn":
        m = ResNetStyle(s.cnn_widths)
        _randomize_bn(m)
        shape = " x ".join(map(str, s.cnn_input))
        return Case(key, f"ResNet-style CNN (conv-bn-relu, residual adds), {shape}", m, (torch.randn(*s.cnn_input),),
                    ("x",))
    if key == "bert":
        from transformers import BertConfig, BertModel

        bert_cfg = BertConfig(hidden_size=s.width, intermediate_size=s.ffn, num_hidden_layers=s.layers,
                         num_attention_heads=s.heads, vocab_size=s.vocab, max_position_embeddings=s.tokens,
                         pad_token_id=0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        m = BertHidden(BertModel(bert_cfg, add_pooling_layer=False))
        ids = torch.randint(0, s.vocab, (s.batch, s.tokens))
        mask = torch.ones(s.batch, s.tokens, dtype=torch.int64)
        mask[1, s.tokens * 3 // 4:] = 0  # padding in one row
        return Case(key, _transformer_label("BERT", s, ", mask"), m, (ids, mask), ("ids", "mask"))
    if key == "gpt2":
        m = _gpt2_lm(s)
        return Case(key, _transformer_label("GPT-2", s), m, (torch.randint(0, s.vocab, (s.batch, s.tokens)),),
                    ("ids",), onnx_variants=_lm_onnx_variants(m))
    if key == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        llama_cfg = LlamaConfig(hidden_size=s.width, intermediate_size=s.llama_ffn, num_hidden_layers=s.layers,
                          num_attention_heads=s.heads, num_key_value_heads=s.heads, vocab_size=s.vocab,
                          max_position_embeddings=s.tokens, bos_token_id=0, eos_token_id=0, pad_token_id=0)
        lm = LlamaForCausalLM(llama_cfg)
        m = Logits(lm)
        return Case(key, _transformer_label("Llama", s, f", FFN {s.llama_ffn}"), m,
                    (torch.randint(0, s.vocab, (s.batch, s.tokens)),), ("ids",),
                    onnx_variants=_lm_onnx_variants(m))
    if key == "vit":
        from transformers import ViTConfig, ViTModel

        vit_cfg = ViTConfig(hidden_size=s.width, num_hidden_layers=s.layers, num_attention_heads=s.heads,
                        intermediate_size=s.ffn, image_size=s.image, patch_size=s.patch, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0)
        m = VitHidden(ViTModel(vit_cfg, add_pooling_layer=False))
        tokens = (s.image // s.patch) ** 2 + 1
        return Case(key, f"ViT {s.layers} layer{'s' if s.layers > 1 else ''} {s.width} wide, {s.batch} x 3 x "
                         f"{s.image} x {s.image}, patch {s.patch} ({tokens} tokens)", m,
                    (torch.randn(s.batch, 3, s.image, s.image),), ("pixels",))
    if key == "chain":
        return Case(key, f"elementwise chain on {list(s.chain)} (clamp(-2,2), mul 1.01, add 0.1, repeated x12)", Chain(),
                    (torch.randn(*s.chain) * 3,), ("x",))
    if key == "gpt2-train":
        m = _gpt2_lm(s)
        ids = torch.randint(0, s.vocab, (s.batch, s.tokens))
        return Case(key, _transformer_label("GPT-2 AdamW training step,", s), m, (ids,), ("ids",),
                    train_target=torch.randint(0, s.vocab, (s.batch, s.tokens)))
    raise SystemExit(f"unknown model {key!r}; choose from {', '.join(MODELS)}")


MODELS = ("mlp", "cnn", "bert", "gpt2", "llama", "vit", "chain", "gpt2-train")


# --- measurement ---------------------------------------------------------------------------

def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200] if text else ''}"


def _tensors(outs: Any) -> list[torch.Tensor]:
    if isinstance(outs, (torch.Tensor, np.ndarray)):
        outs = [outs]
    res = []
    for o in outs:
        if isinstance(o, np.ndarray):
            o = torch.from_numpy(np.ascontiguousarray(o))
        elif not isinstance(o, torch.Tensor):
            o = torch.as_tensor(o)
        res.append(o.detach().to(torch.float64))
    return res


def accuracy(outs: Any, refs: list[torch.Tensor]) -> dict[str, Any]:
    """Max absolute error against the reference outputs, and that error over the largest
    reference magnitude (``rel``)."""
    got = _tensors(outs)
    if len(got) != len(refs):
        return {"max_abs_err": float("inf"), "rel": float("inf"), "error": f"{len(got)} outputs, eager has {len(refs)}"}
    err = scale = 0.0
    for o, r in zip(got, refs):
        if tuple(o.shape) != tuple(r.shape):
            return {"max_abs_err": float("inf"), "rel": float("inf"),
                    "error": f"shape {tuple(o.shape)}, eager has {tuple(r.shape)}"}
        err = max(err, float((o - r).abs().max()))
        scale = max(scale, float(r.abs().max()))
    return {"max_abs_err": err, "rel": err / max(scale, 1e-30)}


def time_rounds(cands: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, list[float]]:
    """Seconds per call of each candidate in each round; every round times every candidate
    once (``calls`` calls), starting from the next candidate each round."""
    names = list(cands)
    times: dict[str, list[float]] = {n: [] for n in names}
    gc.collect()
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            fn = cands[n]
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[n].append((time.perf_counter() - t0) / calls)
    return times


def _median_ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b))


def warm_inductor(workdir: str | None = None) -> float:
    """One untimed compile of a tiny function, so that Inductor's imports and process-wide
    set-up are not charged to the first model's cold compile."""
    d = tempfile.mkdtemp(prefix="inductor-warm-", dir=workdir)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    t0 = time.perf_counter()
    f = torch.compile(lambda x: torch.relu(x) * 2.0 + 1.0)
    with torch.no_grad():
        f(torch.randn(8, 8))
    torch._dynamo.reset()
    return time.perf_counter() - t0


def warm_export() -> float:
    """One untimed ``import_torch`` of a tiny module: the first torch.export in a process pays
    for dynamo's imports and set-up (seconds), which would be charged to the first model."""
    t0 = time.perf_counter()
    import_torch(nn.Linear(4, 4).eval(), (torch.randn(2, 4),))
    return time.perf_counter() - t0


def _fresh_inductor_cache(workdir: str, key: str) -> str:
    """A new, empty Inductor cache directory for ``key``, with Inductor's in-memory caches and
    dynamo's compiled frames cleared, so the next compile is cold."""
    from torch._inductor.utils import clear_caches

    d = tempfile.mkdtemp(prefix=f"inductor-{key}-", dir=workdir)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    torch._dynamo.reset()
    clear_caches()
    return d


@contextlib.contextmanager
def _quiet_fds(log_path: str):
    """File descriptors 1 and 2 go to ``log_path`` meanwhile: the TorchScript exporter prints
    the whole graph from C++ when it fails, which would bury the tables."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def ort_session(path: str) -> Any:
    """An ONNX Runtime session as the benchmark runs it: all graph optimizations, sequential
    execution, ``THREADS`` intra-op threads, one inter-op thread, the CPU provider."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = THREADS
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    _no_spinning(so)
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _no_spinning(so: Any) -> None:
    """With more than one thread, ORT's intra-op pool does not spin while idle. Its default
    (spinning) keeps the idle workers running after a call, on the cores the next candidate of
    an interleaved round needs: ViT at 2 threads, partita 6.9 ms a call alone, 15.6 right after
    ORT's calls even after a 20 ms pause, 7.4 after ORT without spinning, which itself ran
    9.1 ms a call alone against 9.9 with spinning (AMD EPYC, 2 cores). Alone, ORT with spinning
    is 5 to 20% faster than without on these models: ``--ort-spinning`` keeps ORT's default
    (and then ORT's figure is its best and the next candidate's is not)."""
    if THREADS > 1 and not ORT_SPINNING:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")


def build_ort(case: Case, workdir: str) -> dict[str, Any]:
    """Export with the TorchScript exporter (opset 17), trying ``case.onnx_variants`` in
    order; returns the session and its feeds, or the errors."""
    variants = case.onnx_variants or [("as is", case.module)]
    errors: list[str] = []
    for label, module in variants:
        path = os.path.join(workdir, f"{case.key}-{len(errors)}.onnx")
        try:
            t0 = time.perf_counter()
            with warnings.catch_warnings(), _quiet_fds(os.path.join(workdir, "onnx-export.log")):
                warnings.simplefilter("ignore")
                torch.onnx.export(module, case.args, path, input_names=list(case.names), output_names=["out"],
                                  dynamo=False, opset_version=17)
            t1 = time.perf_counter()
            sess = ort_session(path)
            t2 = time.perf_counter()
        except Exception as e:  # exporters raise many types; the table needs the message
            errors.append(f"{label}: {_first_line(e)}")
            continue
        by_name = dict(zip(case.names, case.args))
        # The exporter drops inputs the graph does not use; feed only those the session has.
        feeds = {i.name: by_name[i.name].numpy() for i in sess.get_inputs()}
        return {"session": sess, "feeds": feeds, "path": path, "export_s": t1 - t0, "session_s": t2 - t1, "variant": label,
                "errors": errors, "nodes": _onnx_nodes(path)}
    return {"session": None, "errors": errors}


def _onnx_nodes(path: str) -> int | None:
    try:
        import onnx

        return len(onnx.load(path, load_external_data=False).graph.node)
    except Exception:
        return None


def build_partita(name: str, imported: partita.Graph, args: tuple, refs: list[torch.Tensor]) -> dict[str, Any]:
    """Optimize (a copy of) the imported graph and build executor ``name``; time both, the
    first call, and check the outputs against eager's."""
    factory = EXECUTORS[name]
    g0 = imported.clone()
    try:
        t0 = time.perf_counter()
        g = partita.optimize(g0, PIPELINE)
        t1 = time.perf_counter()
        prog = factory(g)
        t2 = time.perf_counter()
        inputs = list(args)
        outs = prog(inputs)
        t3 = time.perf_counter()
    except Exception as e:  # a partita bug: reported in the row, and the run fails
        traceback.print_exc()
        return {"error": _first_line(e)}
    r = {"prog": prog, "inputs": inputs, "optimize_s": t1 - t0, "build_s": t2 - t1, "compile_s": t2 - t0,
         "first_call_s": t3 - t2, "nodes": len(g), "check": accuracy(outs, refs)}
    r.update(_program_facts(prog))
    return r


def _program_facts(prog: Any) -> dict[str, Any]:
    """What a CompiledProgram says about itself: its memory plan and its kernels."""
    out: dict[str, Any] = {}
    plan = getattr(prog, "memory_plan", None)
    if plan is not None:
        out["plan"] = {"peak_bytes": plan.peak_bytes, "arena_bytes": plan.arena_bytes,
                       "unplanned_peak_bytes": getattr(plan, "unplanned_peak", None)}
    if hasattr(prog, "kernels"):
        out["fused_nodes"] = len(prog.kernels)
    if getattr(prog, "optimizer_kernels", None):
        out["adamw_kernels"] = len(prog.optimizer_kernels)
    return out


@dataclass
class Extras:
    """The measurements besides the timed rounds (see the module's docstring)."""

    quick: bool = False
    compile_probe: bool = True   # codegen's cold and warm compile, each in a fresh process
    compile_repeats: int = 3
    memory: bool = False         # measured peak memory, a fresh process per candidate
    profile: bool = True         # per-op time of each partita program
    dirs: dict[str, str] = field(default_factory=dict)  # per model: Inductor's cache dir, the ONNX file
    memory_jobs: list[tuple[str, str, dict, dict]] = field(default_factory=list)


def bench_inference(case: Case, executors: list[str], peers: list[str], rounds: int, calls: int, warmup: int,
                    workdir: str, extras: Extras | None = None) -> dict[str, Any]:
    extras = extras or Extras(compile_probe=False, profile=False)
    model, args = case.module.eval(), case.args
    res: dict[str, Any] = {"model": case.key, "label": case.label, "executors": {}, "peers": {}}
    with torch.inference_mode():
        refs = _tensors(model(*args))
    timings: dict[str, float] = {}
    imported = import_torch(model, args, timings=timings)
    res["import"] = {"export_s": timings["export"], "convert_s": timings["convert"], "nodes": len(imported)}
    graph_path = _save_graph(imported, case.key, workdir) if extras.compile_probe or extras.memory else None
    if graph_path is not None and extras.compile_probe and "codegen" in executors:
        res["compile_probe"] = compile_probe(case.key, graph_path, False, workdir, extras.compile_repeats)
    cands: dict[str, Callable[[], Any]] = {}
    progs: dict[str, Any] = {}
    for name in executors:
        r = build_partita(name, imported, args, refs)
        res["executors"][name] = {k: v for k, v in r.items() if k not in ("prog", "inputs")}
        if "prog" in r:
            cands[f"partita:{name}"] = functools.partial(r["prog"], r["inputs"])
            progs[name] = r["prog"]
    if "eager" in peers:
        def eager() -> Any:
            with torch.inference_mode():
                return model(*args)
        cands["eager"] = eager
        res["peers"]["eager"] = {}
    if "inductor" in peers:
        extras.dirs[f"{case.key}:inductor"] = _fresh_inductor_cache(workdir, case.key)
        compiled = torch.compile(model)
        try:
            t0 = time.perf_counter()
            with torch.no_grad():
                out = compiled(*args)
            cold = time.perf_counter() - t0

            def inductor() -> Any:
                with torch.no_grad():
                    return compiled(*args)
            cands["inductor"] = inductor
            res["peers"]["inductor"] = {"cold_compile_s": cold, "check": accuracy(out, refs)}
        except Exception as e:
            traceback.print_exc()
            res["peers"]["inductor"] = {"error": _first_line(e)}
    if "ort" in peers:
        o = build_ort(case, workdir)
        if o["session"] is None:
            res["peers"]["ort"] = {"error": "; ".join(o["errors"])}
        else:
            sess, feeds = o["session"], o["feeds"]
            extras.dirs[f"{case.key}:onnx"] = o["path"]
            ort_feeds = feeds
            cands["ort"] = functools.partial(sess.run, None, feeds)
            res["peers"]["ort"] = {"export_s": o["export_s"], "session_s": o["session_s"], "variant": o["variant"],
                                   "export_errors": o["errors"], "onnx_nodes": o["nodes"],
                                   "check": accuracy(sess.run(None, feeds), refs)}
    for fn in cands.values():
        for _ in range(warmup):
            fn()
    times = time_rounds(cands, rounds, calls)
    _summarize(res, times)
    if extras.profile:
        profs: dict[str, Any] = {f"partita:{name}": StepProfiler(_torch_program(prog), cands[f"partita:{name}"])
                                 for name, prog in progs.items()}
        profs.update({peer: TorchOpProfiler(cands[peer]) for peer in ("eager", "inductor") if peer in cands})
        if "ort" in cands:
            profs["ort"] = OrtProfiler(extras.dirs[f"{case.key}:onnx"], ort_feeds, workdir)
        for n, pr in profile_rounds(profs, 2 if extras.quick else 10).items():
            (res["executors"][n.split(":", 1)[1]] if n.startswith("partita:") else res["peers"][n])["profile"] = pr
    if extras.memory:
        queue_memory_jobs(case, executors, peers, graph_path, extras, workdir)
    return res


def _summarize(res: dict[str, Any], times: dict[str, list[float]]) -> None:
    """Medians (ms) and median per-round ratios of each partita executor against each peer."""
    res["runs_ms"] = {n: [t * 1e3 for t in ts] for n, ts in times.items()}
    for n, ts in times.items():
        entry = res["executors"][n.split(":", 1)[1]] if n.startswith("partita:") else res["peers"][n]
        entry["ms"] = statistics.median(ts) * 1e3
    for n, ts in times.items():
        if not n.startswith("partita:"):
            continue
        entry = res["executors"][n.split(":", 1)[1]]
        entry["ratio"] = {p: _median_ratio(ts, times[p]) for p in PEERS if p in times}


class ProgramTrainer:
    """``partita.autodiff.Trainer``'s loop over any executor: the step's params and optimizer
    state are fed by name and each output that aliases an input becomes its next value. The
    trainer owns those buffers, so an executor that takes ``donate`` (as ``TorchProgram``
    and ``CompiledProgram`` do) gets ``donate=True``, as ``Trainer`` gives its program."""

    def __init__(self, step: partita.Graph, factory: Callable) -> None:
        import inspect

        from partita.backend.torch_exec import to_tensor

        try:
            takes_donate = "donate" in inspect.signature(factory).parameters
        except (TypeError, ValueError):
            takes_donate = False
        self.prog = factory(step, donate=True) if takes_donate else factory(step)
        self.aliases = [(i, str(a.name)) for i, a in enumerate(step.output_aliases) if a is not None]
        self.values = {str(v.name): to_tensor(np.array(step.weights[str(v.name)]))
                       for v in step.inputs if v.role != "input"}

    def step(self, batch: dict[str, Any]) -> float:
        feed = dict(self.values)
        feed.update(batch)
        outs = self.prog(feed)
        for i, name in self.aliases:
            self.values[name] = outs[i]
        return float(_tensors([outs[0]])[0])


def _ce_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def partita_trainer(name: str, fwd: partita.Graph) -> tuple[Any, float, float]:
    """``training_step`` of the imported forward graph, run by executor ``name`` (``Trainer``
    for aten, ``ProgramTrainer`` otherwise); the trainer, and the seconds of each part."""
    from partita.autodiff import Trainer

    t0 = time.perf_counter()
    step = partita.training_step(fwd, loss="cross_entropy", optimizer="adamw", lr=LR)
    t1 = time.perf_counter()
    trainer = Trainer(step) if name == "aten" else ProgramTrainer(step, EXECUTORS[name])
    return trainer, t1 - t0, time.perf_counter() - t1


def eager_train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], float]:
    """One step of the eager loop with ``torch.optim.AdamW`` (its default implementation)."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = _ce_loss(model, x, y)
        loss.backward()
        opt.step()
        return loss.item()
    return step


def inductor_train_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], float]:
    """``torch.compile`` of the whole step with ``torch.optim.AdamW(fused=True)``; compiled on
    its first call."""
    opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=True)

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        loss = _ce_loss(model, x, y)
        loss.backward()
        opt.step()
        return loss

    compiled_step = torch.compile(train_step)
    return lambda: compiled_step(x, y).item()


def _trainer_program(trainer: Any) -> Any:
    return trainer.prog if isinstance(trainer, ProgramTrainer) else trainer._program


def bench_training(case: Case, executors: list[str], peers: list[str], rounds: int, calls: int, warmup: int,
                   workdir: str, extras: Extras | None = None) -> dict[str, Any]:
    extras = extras or Extras(compile_probe=False, profile=False)
    model = case.module.eval()  # no dropout, as in bench/bench_train.py
    (x,), y = case.args, case.train_target
    res: dict[str, Any] = {"model": case.key, "label": case.label, "executors": {}, "peers": {}, "training": True}
    compiled_model = copy.deepcopy(model)  # the same initial weights for every side
    timings: dict[str, float] = {}
    fwd = import_torch(model, (x,), timings=timings)
    res["import"] = {"export_s": timings["export"], "convert_s": timings["convert"], "nodes": len(fwd)}
    graph_path = _save_graph(fwd, case.key, workdir) if extras.compile_probe or extras.memory else None
    if graph_path is not None and extras.compile_probe and "codegen" in executors:
        res["compile_probe"] = compile_probe(case.key, graph_path, True, workdir, extras.compile_repeats)
    (xname,) = [str(v.name) for v in fwd.inputs if v.role == "input"]
    batch = {xname: x, "target": y}
    steps: dict[str, Callable[[], float]] = {}
    trainers: dict[str, Any] = {}
    first_losses: dict[str, list[float]] = {}
    for name in executors:
        try:
            trainer, opt_s, build_s = partita_trainer(name, fwd)
            t2 = time.perf_counter()
            losses = [trainer.step(batch)]
            t3 = time.perf_counter()
            losses.append(trainer.step(batch))
        except Exception as e:
            traceback.print_exc()
            res["executors"][name] = {"error": _first_line(e)}
            continue
        res["executors"][name] = {"optimize_s": opt_s, "build_s": build_s, "compile_s": opt_s + build_s,
                                  "first_call_s": t3 - t2, "nodes": len(trainer.graph if name == "aten" else
                                                                         trainer.prog.graph)}
        res["executors"][name].update(_program_facts(_trainer_program(trainer)))
        first_losses[f"partita:{name}"] = losses
        steps[f"partita:{name}"] = functools.partial(trainer.step, batch)
        trainers[name] = trainer
    eager_step = eager_train_step(model, x, y)
    # Eager is always run for the check; it is timed only when asked for.
    first_losses["eager"] = [eager_step(), eager_step()]
    if "eager" in peers:
        steps["eager"] = eager_step
        res["peers"]["eager"] = {}
    if "inductor" in peers:
        extras.dirs[f"{case.key}:inductor"] = _fresh_inductor_cache(workdir, case.key)
        compiled_step = inductor_train_step(compiled_model, x, y)
        try:
            t0 = time.perf_counter()
            losses = [compiled_step()]
            cold = time.perf_counter() - t0
            losses.append(compiled_step())
            first_losses["inductor"] = losses
            steps["inductor"] = compiled_step
            res["peers"]["inductor"] = {"cold_compile_s": cold, "optimizer": "torch.optim.AdamW(fused=True)"}
        except Exception as e:
            traceback.print_exc()
            res["peers"]["inductor"] = {"error": _first_line(e)}
    ref = first_losses["eager"]
    for n, losses in first_losses.items():
        if n == "eager":
            continue
        err = max(abs(a - b) for a, b in zip(losses, ref))
        check = {"losses": losses, "eager_losses": ref, "max_abs_err": err, "rel": err / max(abs(r) for r in ref)}
        if n.startswith("partita:"):
            res["executors"][n.split(":", 1)[1]]["check"] = check
        elif n in res["peers"]:
            res["peers"][n]["check"] = check
    for fn in steps.values():
        for _ in range(warmup):
            fn()
    times = time_rounds(steps, rounds, calls)
    _summarize(res, times)
    if extras.profile:
        profs: dict[str, Any] = {f"partita:{name}": StepProfiler(_torch_program(_trainer_program(trainer)),
                                                                 steps[f"partita:{name}"])
                                 for name, trainer in trainers.items()}
        profs.update({peer: TorchOpProfiler(steps[peer]) for peer in ("eager", "inductor") if peer in steps})
        for n, pr in profile_rounds(profs, 2 if extras.quick else 5).items():
            (res["executors"][n.split(":", 1)[1]] if n.startswith("partita:") else res["peers"][n])["profile"] = pr
    if extras.memory:
        queue_memory_jobs(case, executors, peers, graph_path, extras, workdir)
    return res


# --- per-op profile of a partita program --------------------------------------------------

def _torch_program(prog: Any) -> Any:
    """The ``TorchProgram`` that runs ``prog`` (a CompiledProgram holds one as ``.program``)."""
    return getattr(prog, "program", prog)


def _profile_result(wall_s: float, ops: dict[str, dict[str, float]], calls: int) -> dict[str, Any]:
    """Per-call figures: ``ops`` holds totals (seconds, steps) over ``calls`` calls."""
    out = {op: {"ms": e["s"] / calls * 1e3, "steps": e["steps"] // calls} for op, e in ops.items() if e["s"] > 0}
    wall = wall_s / calls * 1e3
    inside = sum(e["ms"] for e in out.values())
    return {"wall_ms": wall, "steps_ms": inside, "outside_ms": wall - inside, "calls": calls,
            "ops": dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"]))}


class StepProfiler:
    """Per-op time of a ``TorchProgram``: each step's function is wrapped with a timer while
    the profiler is open (the program regenerates its run function when its steps are
    replaced) and put back by ``result``. ``outside_ms`` is the call's time that no step
    accounts for: the generated run function, input conversion, the caller (a trainer's
    feed), and the timers themselves (about 0.1 us a step)."""

    def __init__(self, tp: Any, call: Callable[[], Any]) -> None:
        self.tp, self.fn, self.orig = tp, call, list(tp.steps)
        self.acc = [0.0] * len(self.orig)
        self.wall, self.calls = 0.0, 0
        clock = time.perf_counter
        acc = self.acc

        def timed(k: int, fn: Callable) -> Callable:
            def step(args: Any, attrs: Any) -> Any:
                t0 = clock()
                r = fn(args, attrs)
                acc[k] += clock() - t0
                return r
            return step

        tp.steps[:] = [(timed(k, st[0]), *st[1:]) for k, st in enumerate(self.orig)]

    def call(self) -> None:
        t0 = time.perf_counter()
        self.fn()
        self.wall += time.perf_counter() - t0
        self.calls += 1

    def reset(self) -> None:
        self.acc[:] = [0.0] * len(self.acc)
        self.wall, self.calls = 0.0, 0

    def result(self) -> dict[str, Any]:
        self.tp.steps[:] = self.orig
        ops: dict[str, dict[str, float]] = {}
        for st, t in zip(self.orig, self.acc):
            node = st[7]
            op = node.op
            if op in ("linear_pointwise", "conv2d_pointwise") and node.attrs.get("unary", "none") != "none":
                op = f"{op}+{node.attrs['unary']}"
            e = ops.setdefault(op, {"s": 0.0, "steps": 0})
            e["s"] += t
            e["steps"] += self.calls
        return _profile_result(self.wall, ops, max(self.calls, 1))


class TorchOpProfiler:
    """Per-op self time of eager or Inductor code under ``torch.profiler`` (CPU), one profiler
    session per call. Inductor's generated C++ has no events of its own: its time is the self
    time of its compiled region; the ops it calls (the GEMMs, convolutions, SDPA) have theirs."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.fn = call
        self.reset()

    def reset(self) -> None:
        self.ops: dict[str, dict[str, float]] = {}
        self.wall, self.calls = 0.0, 0

    def call(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            t0 = time.perf_counter()
            self.fn()
            self.wall += time.perf_counter() - t0
        self.calls += 1
        for ev in prof.key_averages():
            e = self.ops.setdefault(ev.key, {"s": 0.0, "steps": 0})
            e["s"] += ev.self_cpu_time_total / 1e6
            e["steps"] += ev.count

    def result(self) -> dict[str, Any]:
        return _profile_result(self.wall, self.ops, max(self.calls, 1))


class OrtProfiler:
    """Per-op-type kernel time of an ONNX Runtime session made like the timed one, with ORT's
    own profiler on; only the nodes of the calls after the last ``reset`` count."""

    def __init__(self, path: str, feeds: dict[str, Any], workdir: str) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads = THREADS
        so.inter_op_num_threads = 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        _no_spinning(so)
        so.enable_profiling = True
        so.profile_file_prefix = os.path.join(workdir, "ort-profile")
        self.sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
        self.feeds = feeds
        self.skip = 0
        self.wall, self.calls = 0.0, 0

    def call(self) -> None:
        t0 = time.perf_counter()
        self.sess.run(None, self.feeds)
        self.wall += time.perf_counter() - t0
        self.calls += 1

    def reset(self) -> None:
        self.skip += self.calls
        self.wall, self.calls = 0.0, 0

    def result(self) -> dict[str, Any]:
        events = json.loads(Path(self.sess.end_profiling()).read_text())
        runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e["name"] == "model_run")
        start = runs[self.skip] if len(runs) > self.skip else 0
        ops: dict[str, dict[str, float]] = {}
        for e in events:
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time") and e["ts"] >= start:
                o = ops.setdefault(e["args"].get("op_name", "?"), {"s": 0.0, "steps": 0})
                o["s"] += e["dur"] / 1e6
                o["steps"] += 1
        return _profile_result(self.wall, ops, max(self.calls, 1))


def profile_rounds(profilers: dict[str, Any], rounds: int) -> dict[str, dict[str, Any]]:
    """One untimed call of each, then ``rounds`` rounds of one profiled call of each, the
    starting candidate rotating as in ``time_rounds``, so that the profiles share the
    machine's state as the timed rounds do."""
    names = list(profilers)
    for n in names:
        profilers[n].call()
        profilers[n].reset()
    for r in range(rounds):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            profilers[n].call()
    return {n: pr.result() for n, pr in profilers.items()}


_CATEGORIES = (("conv", ("conv",)),
               ("GEMM", ("linear", "matmul", "gemm", "addmm", "aten::mm", "bmm")),
               ("attention", ("attention", "scaled_dot_product", "softmax")),
               ("norm", ("norm",)))


def op_category(op: str) -> str:
    """conv, GEMM, attention, norm or other: a rough grouping of the op names of partita,
    ATen and ONNX Runtime (an ORT ``Attention`` node holds its QKV GEMM; an exported
    attention that was not fused is MatMul and Softmax nodes)."""
    n = op.lower()
    for cat, keys in _CATEGORIES:
        if any(k in n for k in keys):
            return cat
    return "other"


# --- fresh processes: compile cold and warm, peak memory -----------------------------------

WORKER = "--worker"
_WORKER_MARK = "bench_codegen worker result: "
MEMORY_PEERS = ("eager", "inductor", "ort")
MEMORY_JOBS = 2


def _save_graph(graph: partita.Graph, key: str, workdir: str) -> str:
    """The imported graph as .pir (and .safetensors), for the fresh processes to load."""
    path = os.path.join(workdir, f"{key}.pir")
    partita.save(graph, path)
    return path


def _run_worker(spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Runs this script's worker mode in a fresh interpreter; its JSON result or an error."""
    import subprocess

    cmd = [sys.executable, str(Path(__file__).resolve()), "--threads", str(THREADS), WORKER, json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=timeout,
                              cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"worker timed out after {timeout:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_WORKER_MARK):
            return json.loads(line[len(_WORKER_MARK):])
    tail = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()][-1:] or [""]
    return {"error": f"worker exited with status {proc.returncode}: {tail[0][:200]}"}


def compile_probe(key: str, graph_path: str, training: bool, workdir: str, repeats: int = 3) -> dict[str, Any]:
    """partita's compile of the codegen executor, each in a fresh process: cold (an empty
    ``PARTITA_CACHE_DIR`` made for this model) and warm (a second process on the cache the
    cold one filled), ``repeats`` times each; ``cold`` and ``warm`` are the runs with the
    median time, with every run's time in ``compile_s_all``."""
    spec = {"kind": "compile", "graph": graph_path, "training": training}
    runs = []
    for _ in range(repeats):
        env = {"PARTITA_CACHE_DIR": tempfile.mkdtemp(prefix=f"partita-kernels-{key}-", dir=workdir)}
        runs.append({"cold": _run_worker(spec, env, 600), "warm": _run_worker(spec, env, 600)})
    out: dict[str, Any] = {"runs": runs}
    for kind in ("cold", "warm"):
        got = [r[kind] for r in runs]
        bad = [g for g in got if "error" in g]
        if bad:
            out[kind] = bad[0]
            continue
        got.sort(key=lambda g: g["compile_s"])
        out[kind] = {**got[(len(got) - 1) // 2], "compile_s_all": [g["compile_s"] for g in got]}
    return out


def queue_memory_jobs(case: Case, executors: list[str], peers: list[str], graph_path: str | None, extras: Extras,
                      workdir: str) -> None:
    """The memory measurements of ``case``, one job per candidate, run at the end of the run
    (``run_memory_jobs``), after every timed round."""
    training = case.train_target is not None
    inputs_path = os.path.join(workdir, f"{case.key}-inputs.pt")
    torch.save({"args": case.args, "target": case.train_target}, inputs_path)
    for cand in [p for p in MEMORY_PEERS if p in peers] + list(executors):
        if cand == "ort" and (training or f"{case.key}:onnx" not in extras.dirs):
            continue
        spec = {"kind": "memory", "key": case.key, "quick": extras.quick, "candidate": cand, "graph": graph_path,
                "inputs": inputs_path, "onnx": extras.dirs.get(f"{case.key}:onnx")}
        # Blocks of 128 KiB and more are mapped and unmapped one by one (a fixed threshold, not
        # glibc's sliding one), so what a call frees goes back to the system and the resident
        # size between calls is what the candidate keeps.
        env = {"MALLOC_MMAP_THRESHOLD_": "131072"}
        if cand == "inductor" and f"{case.key}:inductor" in extras.dirs:
            env["TORCHINDUCTOR_CACHE_DIR"] = extras.dirs[f"{case.key}:inductor"]
        extras.memory_jobs.append((case.key, cand, spec, env))


def run_memory_jobs(results: list[dict[str, Any]], extras: Extras) -> float:
    """Runs the queued memory jobs, ``MEMORY_JOBS`` fresh processes at a time (memory, not
    time, is measured, so they may share the CPUs); the results go to each model's
    ``memory``. Returns the seconds taken."""
    from concurrent.futures import ThreadPoolExecutor

    by_key = {r["model"]: r for r in results}
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=MEMORY_JOBS) as pool:
        futs = [(key, cand, pool.submit(_run_worker, spec, env, 900)) for key, cand, spec, env in extras.memory_jobs]
        for key, cand, fut in futs:
            by_key[key].setdefault("memory", {})[cand] = fut.result()
    return time.perf_counter() - t0


def _proc_status() -> dict[str, int]:
    """VmRSS and VmHWM of this process, in bytes."""
    got: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                got[k] = int(v.split()[0]) * 1024
    return got


def _worker_compile(spec: dict[str, Any]) -> dict[str, Any]:
    """Loads the imported graph (outside the timing), then times what partita does to it:
    ``optimize`` and the codegen executor's construction (``training_step`` and the executor
    with ``donate=True`` for the training step). Nothing of partita has compiled in this
    process before, so the kernels come from the disk cache or LLVM."""
    from partita.codegen import cache_dir

    factory = EXECUTORS["codegen"]
    g = partita.load(spec["graph"])
    entries_before = sum(1 for _ in cache_dir().rglob("*.o")) if cache_dir().exists() else 0
    t0 = time.perf_counter()
    if spec["training"]:
        step = partita.training_step(g, loss="cross_entropy", optimizer="adamw", lr=LR)
        t1 = time.perf_counter()
        prog = factory(step, donate=True)
    else:
        opt = partita.optimize(g, PIPELINE)
        t1 = time.perf_counter()
        prog = factory(opt)
    t2 = time.perf_counter()
    entries_after = sum(1 for _ in cache_dir().rglob("*.o")) if cache_dir().exists() else 0
    return {"optimize_s": t1 - t0, "build_s": t2 - t1, "compile_s": t2 - t0,
            "program_compile_seconds": getattr(prog, "compile_seconds", None), "cache": getattr(prog, "cache", None),
            "cache_entries_before": entries_before, "cache_entries_after": entries_after, **_program_facts(prog)}


def _worker_memory(spec: dict[str, Any]) -> dict[str, Any]:
    """One candidate's memory: its inputs, and the model (eager, Inductor, ORT) or the
    imported graph with its weights (partita), are made first; then the resident size
    ``rss_start`` is read; the candidate is built and
    warmed up (3 calls); ``rss_before`` is read, the peak counter is reset (``clear_refs``
    5), the candidate runs ``calls`` times and VmHWM is read. ``peak_bytes`` = VmHWM -
    rss_before: what the calls themselves take above what stays between them. ``held_bytes``
    = rss_before - rss_start: what building and warming up kept (compiled code, packed or
    copied weights, an arena, allocator caches)."""
    cand = spec["candidate"]
    saved = torch.load(spec["inputs"])
    args, target = saved["args"], saved["target"]
    training = target is not None
    if cand in EXECUTORS:  # partita needs only its graph; the peers need the model
        graph, model = partita.load(spec["graph"]), None
    else:
        case = make_case(spec["key"], QUICK if spec["quick"] else FULL)
        graph, model = None, case.module.eval()
    warmup, calls = (1, 2) if spec["quick"] else (3, 5)
    facts: dict[str, Any] = {}
    gc.collect()
    rss_start = _proc_status()["VmRSS"]
    fn: Callable[[], Any]
    if training:
        (x,), y = args, target
        if cand == "eager":
            fn = eager_train_step(model, x, y)
        elif cand == "inductor":
            fn = inductor_train_step(model, x, y)
        else:
            assert graph is not None
            trainer, _, _ = partita_trainer(cand, graph)
            (xname,) = [str(v.name) for v in graph.inputs if v.role == "input"]
            fn = functools.partial(trainer.step, {xname: x, "target": y})
            facts = _program_facts(_trainer_program(trainer))
    else:
        if cand == "eager":
            assert model is not None

            def fn() -> Any:
                with torch.inference_mode():
                    return model(*args)
        elif cand == "inductor":
            compiled = torch.compile(model)

            def fn() -> Any:
                with torch.no_grad():
                    return compiled(*args)
        elif cand == "ort":
            sess = ort_session(spec["onnx"])
            by_name = dict(zip(case.names, args))  # the exporter may drop an unused input
            feeds = {i.name: by_name[i.name].numpy() for i in sess.get_inputs()}
            fn = functools.partial(sess.run, None, feeds)
        else:
            assert graph is not None
            prog = EXECUTORS[cand](partita.optimize(graph, PIPELINE))
            fn = functools.partial(prog, list(args))
            facts = _program_facts(prog)
    for _ in range(warmup):
        fn()
    gc.collect()
    rss_before = _proc_status()["VmRSS"]
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    for _ in range(calls):
        fn()
    st = _proc_status()
    return {"rss_start": rss_start, "rss_before": rss_before, "hwm": st["VmHWM"], "calls": calls,
            "peak_bytes": st["VmHWM"] - rss_before, "held_bytes": rss_before - rss_start, **facts}


def worker_main(argv: list[str]) -> int:
    """``--worker SPEC``: one fresh-process measurement, printed as a marked JSON line."""
    spec = json.loads(argv[argv.index(WORKER) + 1])
    torch.set_num_threads(THREADS)
    warnings.filterwarnings("ignore")
    try:
        res = _worker_compile(spec) if spec["kind"] == "compile" else _worker_memory(spec)
    except Exception as e:
        traceback.print_exc()
        res = {"error": _first_line(e)}
    res["partita"] = str(Path(partita.__file__).resolve().parent)  # the tree this process ran
    print(_WORKER_MARK + json.dumps(res, default=str), flush=True)
    return 0


_find_codegen()


# --- report --------------------------------------------------------------------------------

def _ms(d: dict[str, Any] | None) -> str:
    if d is None:
        return "-"
    if "error" in d:
        return "failed"
    return f"{d['ms']:,.2f}" if "ms" in d else "-"


def _ratio(e: dict[str, Any], peer: str, peers: dict[str, Any]) -> str:
    p = peers.get(peer)
    if p is not None and "error" in p:
        return "failed"
    r = e.get("ratio", {}).get(peer)
    return "-" if r is None else f"{r:.2f}"


def format_tables(results: list[dict[str, Any]], executors: list[str]) -> str:
    rows = ["| model | executor | partita (ms) | eager (ms) | Inductor (ms) | ORT (ms) | vs eager | vs Inductor "
            "| vs ORT | max abs err (rel) |",
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    notes: list[str] = []
    for r in results:
        peers = r["peers"]
        for name in executors:
            e = r["executors"].get(name)
            if e is None:
                continue
            if "error" in e:
                rows.append(f"| {r['label']} | {name} | failed: {e['error']} | | | | | | | |")
                continue
            c = e["check"]
            rows.append(f"| {r['label']} | {name} | {_ms(e)} | {_ms(peers.get('eager'))} | "
                        f"{_ms(peers.get('inductor'))} | {_ms(peers.get('ort'))} | {_ratio(e, 'eager', peers)} | "
                        f"{_ratio(e, 'inductor', peers)} | {_ratio(e, 'ort', peers)} | "
                        f"{c['max_abs_err']:.1e} ({c['rel']:.1e}) |")
        for peer, p in peers.items():
            if "error" in p:
                notes.append(f"{r['label']}: {peer} failed: {p['error']}")
            elif p.get("export_errors"):
                notes.append(f"{r['label']}: ORT model exported with {p['variant']} after: "
                             f"{'; '.join(p['export_errors'])}")
        if r.get("training") and "inductor" in peers and "error" not in peers["inductor"]:
            notes.append(f"{r['label']}: the Inductor column is torch.compile of the step with "
                         "torch.optim.AdamW(fused=True); eager uses torch.optim.AdamW's default")
    probed = any("compile_probe" in r for r in results)
    rows += ["", "| model | nodes (imported / optimized, or step) | torch.export (s) | partita convert (s) | "
             + " | ".join(f"partita compile, {n} (s) | first call, {n} (ms)" for n in executors)
             + (" | codegen cold, fresh process (s, median) | codegen warm, fresh process (s, median)" if probed
                else "")
             + " | Inductor cold compile (s) | ORT export + session (s) |",
             "|---|---:|---:|---:|" + "---:|---:|" * len(executors) + "---:|---:|" * probed + "---:|---:|"]
    for r in results:
        imp, peers = r["import"], r["peers"]
        built = [r["executors"][n]["nodes"] for n in executors if "nodes" in r["executors"].get(n, {})]
        opt_nodes = str(built[0]) if built else "-"  # the same pipeline for every executor
        cells = []
        for n in executors:
            e = r["executors"].get(n, {})
            cells += ([f"{e['compile_s']:.3f}", f"{e['first_call_s'] * 1e3:,.1f}"] if "compile_s" in e
                      else ["-", "-"])
        if probed:
            probe = r.get("compile_probe", {})
            cells += [_probe_cell(probe.get("cold")), _probe_cell(probe.get("warm"))]
        ind = peers.get("inductor", {})
        ort = peers.get("ort", {})
        cells.append(f"{ind['cold_compile_s']:.1f}" if "cold_compile_s" in ind else "-")
        cells.append(f"{ort['export_s'] + ort['session_s']:.2f}" if "export_s" in ort else "-")
        rows.append(f"| {r['label']} | {imp['nodes']} / {opt_nodes} | {imp['export_s']:.2f} | "
                    f"{imp['convert_s']:.3f} | " + " | ".join(cells) + " |")
    if notes:
        rows += [""] + [f"- {n}" for n in notes]
    return "\n".join(rows)


def _probe_cell(p: dict[str, Any] | None) -> str:
    if p is None:
        return "-"
    if "error" in p:
        return "failed"
    c = p.get("cache") or {}
    how = []
    if c.get("compiled"):
        how.append(f"{c['compiled']} compiled")
    if c.get("disk_hits"):
        how.append(f"{c['disk_hits']} from disk")
    times = p.get("compile_s_all", [])
    spread = f"max {max(times):.3f}; " if len(times) > 1 else ""
    return f"{p['compile_s']:.3f} ({spread}{', '.join(how) if how else 'no kernels'})"


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f}"


def format_memory(results: list[dict[str, Any]], executors: list[str]) -> str:
    """Peak memory: codegen's plan, and what each candidate's calls took (held between calls)."""
    cands = [c for c in MEMORY_PEERS + tuple(executors) if any(c in r.get("memory", {}) for r in results)]
    plan_of = [n for n in executors if any("plan" in r["executors"].get(n, {}) for r in results)]
    if not cands and not plan_of:
        return ""
    head = ["model"] + [f"{n} plan peak (arena)" for n in plan_of] + [_LABEL.get(c, c) for c in cands]
    rows = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for r in results:
        cells = [r["label"]]
        for n in plan_of:
            pl = r["executors"].get(n, {}).get("plan")
            cells.append(f"{_mib(pl['peak_bytes'])} ({_mib(pl['arena_bytes'])})" if pl else "-")
        mem = r.get("memory", {})
        for c in cands:
            m = mem.get(c)
            cells.append("-" if m is None else "failed" if "error" in m
                         else f"{_mib(m['peak_bytes'])} (+{_mib(m['held_bytes'])})")
        rows.append("| " + " | ".join(cells) + " |")
    errs = [f"- {r['label']}: {c} memory worker failed: {m['error']}" for r in results
            for c, m in r.get("memory", {}).items() if "error" in m]
    return "\n".join(rows + ([""] + errs if errs else []))


_LABEL = {"eager": "eager", "inductor": "Inductor", "ort": "ORT", "aten": "partita aten", "codegen": "partita codegen"}


def format_profiles(results: list[dict[str, Any]], executors: list[str], top: int = 6) -> str:
    """Where the time goes: per model and candidate, ms a call by op category (``op_category``)
    and outside the ops; then each partita program's ops by share of a call."""
    cats = [c for c, _ in _CATEGORIES] + ["other"]
    rows = ["| model | candidate | ms a call, profiled | " + " | ".join(cats) + " | outside the ops |",
            "|---|---|---:|" + "---:|" * (len(cats) + 1)]
    lines = []
    for r in results:
        for name, entry in ([(f"partita {n}", r["executors"].get(n, {})) for n in executors]
                            + [(_LABEL[p], r["peers"].get(p, {})) for p in PEERS]):
            pr = entry.get("profile")
            if not pr:
                continue
            by = dict.fromkeys(cats, 0.0)
            for op, e in pr["ops"].items():
                by[op_category(op)] += e["ms"]
            rows.append(f"| {r['label']} | {name} | {pr['wall_ms']:,.2f} | " + " | ".join(f"{by[c]:,.2f}" for c in cats)
                        + f" | {pr['outside_ms']:,.2f} |")
        for n in executors:
            pr = r["executors"].get(n, {}).get("profile")
            if not pr:
                continue
            wall = pr["wall_ms"]
            parts = [f"{op} {e['ms'] / wall:.0%} ({e['steps']})" for op, e in list(pr["ops"].items())[:top]]
            lines.append(f"- {r['label']}, {n}: {wall:,.2f} ms a call: " + ", ".join(parts)
                         + f"; outside the steps {pr['outside_ms'] / wall:.0%}")
    if len(rows) == 2:
        return ""
    return "\n".join(rows + [""] + lines)


def _geomean(xs: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def targets(results: list[dict[str, Any]], name: str = "codegen") -> list[str]:
    """The issue's targets for executor ``name``, each met or missed, with the figure."""
    lines = []

    def mark(ok: bool) -> str:
        return "met" if ok else "MISSED"

    inf = [r for r in results if not r.get("training") and "ratio" in r["executors"].get(name, {})]
    for r in inf:
        e, peers = r["executors"][name], r["peers"]
        timed = [p for p in ("inductor", "ort") if p in e["ratio"] and "ms" in peers.get(p, {})]
        if not timed:
            continue
        best = min(timed, key=lambda p: peers[p]["ms"])
        ratio = e["ratio"][best]
        lines.append(f"{r['label']}: {name} / better of Inductor and ORT ({_LABEL[best]}) {ratio:.2f}: "
                     f"{mark(ratio <= 1.0)}")
    rs = [r["executors"][name]["ratio"]["eager"] for r in inf if "eager" in r["executors"][name]["ratio"]]
    if rs:
        g = _geomean(rs)
        lines.append(f"geometric mean over eager ({len(rs)} inference models): {1 / g:.2f}x faster (target 1.4x): "
                     f"{mark(1 / g >= 1.4)}")
    for r in results:
        e = r["executors"].get(name, {})
        if r.get("training") and "inductor" in e.get("ratio", {}):
            ratio = e["ratio"]["inductor"]
            lines.append(f"{r['label']}: {name} / torch.compile + fused AdamW {ratio:.2f}: {mark(ratio <= 1.0)}")
    for r in results:
        probe = r.get("compile_probe", {})
        cold, warm = probe.get("cold", {}), probe.get("warm", {})
        if "compile_s" in cold and "compile_s" in warm:
            lines.append(f"{r['label']}: compile cold {cold['compile_s']:.3f} s (target <= 2 s): "
                         f"{mark(cold['compile_s'] <= 2.0)}, warm {warm['compile_s']:.3f} s (target < 0.2 s): "
                         f"{mark(warm['compile_s'] < 0.2)}")
    return lines


def geomeans(results: list[dict[str, Any]], executors: list[str]) -> list[str]:
    lines = []
    for name in executors:
        for peer in PEERS:
            rs = [r["executors"][name]["ratio"][peer] for r in results if not r.get("training")
                  and peer in r["executors"].get(name, {}).get("ratio", {})]
            if rs:
                g = math.exp(statistics.fmean(math.log(x) for x in rs))
                lines.append(f"geometric mean of partita ({name}) / {peer} over {len(rs)} inference models: {g:.2f}")
    return lines


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _names(text: str, allowed: tuple[str, ...], what: str) -> list[str]:
    names = [n for part in text.split(",") if (n := part.strip())]
    bad = [n for n in names if n not in allowed]
    if bad:
        raise SystemExit(f"unknown {what} {', '.join(bad)}; choose from {', '.join(allowed)}")
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=None, help=f"comma- or space-separated, from {', '.join(MODELS)}")
    ap.add_argument("--peers", default=None, help="comma-separated, from eager,inductor,ort (default: all; "
                                                   "eager,ort with --quick)")
    ap.add_argument("--executors", default=None, help=f"comma-separated partita executors (default: all available: "
                                                       f"{','.join(EXECUTORS)})")
    ap.add_argument("--threads", type=int, default=1, help="threads for torch, the BLAS and ORT (default 1)")
    ap.add_argument("--ort-spinning", action="store_true",
                    help="with more than one thread, leave ORT's idle workers spinning (its default; off "
                         "otherwise, since they take the cores of the candidate timed next)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved timing rounds per model (default 60; "
                                                             "3 with --quick)")
    ap.add_argument("--calls", type=int, default=None, help="calls per candidate per round (default 3 for inference, "
                                                            "1 for the training step; 1 with --quick)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed calls per candidate before the rounds (default 3)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, 3 rounds, Inductor only if --peers names it")
    ap.add_argument("--compile-probe", action=argparse.BooleanOptionalAction, default=None,
                    help="codegen's compile cold and warm, each in a fresh process (default: on; off with --quick)")
    ap.add_argument("--compile-repeats", type=int, default=3, help="cold and warm compile processes per model; the "
                                                                    "median is reported (default 3)")
    ap.add_argument("--memory", action=argparse.BooleanOptionalAction, default=None,
                    help="measured peak memory, a fresh process per candidate and model (default: off; it adds "
                         "about 5 minutes to the full run)")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                    help="per-op time of each partita program (default: on; off with --quick)")
    ap.add_argument("--out", type=Path, default=None, help="JSON file (default: bench/results/codegen-TIME.json)")
    args = ap.parse_args(argv)
    if args.threads != THREADS:
        # main() called with other arguments than the command line's: the BLAS variables
        # were already set from sys.argv, so the thread counts would disagree.
        raise SystemExit(f"--threads {args.threads} must be given on the command line (it is read before torch "
                         f"is imported; this process has {THREADS})")
    torch.set_num_threads(THREADS)
    models = _names(",".join(args.models), MODELS, "model") if args.models else list(MODELS)
    peers = _names(args.peers, PEERS, "peer") if args.peers else (["eager", "ort"] if args.quick else list(PEERS))
    available = tuple(EXECUTORS)
    if args.executors:
        wanted = [n for part in args.executors.split(",") if (n := part.strip())]
        unknown = [n for n in wanted if n not in ("aten", "codegen")]
        if unknown:
            raise SystemExit(f"unknown executor {', '.join(unknown)}; choose from aten, codegen")
        executors = [n for n in wanted if n in available]
        for n in wanted:
            if n not in available:
                print(f"note: {n} executor not available; its column is left out", file=sys.stderr)
    else:
        executors = list(available)
    if not executors:
        raise SystemExit("no partita executor to run")
    for note in EXECUTOR_NOTES:
        print(f"note: {note}", file=sys.stderr)
    sizes = QUICK if args.quick else FULL
    rounds = args.rounds or (3 if args.quick else 60)
    warmup = 1 if args.quick else args.warmup
    extras = Extras(quick=args.quick,
                    compile_probe=not args.quick if args.compile_probe is None else args.compile_probe,
                    compile_repeats=max(args.compile_repeats, 1), memory=bool(args.memory),
                    profile=not args.quick if args.profile is None else args.profile)
    workdir = tempfile.mkdtemp(prefix="bench_codegen-")
    t_start = time.perf_counter()
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's own, from torch.export internals
    warm_export_s = warm_export()
    warm_s = warm_inductor(workdir) if "inductor" in peers else None
    results = []
    try:
        for key in models:
            case = make_case(key, sizes)
            training = case.train_target is not None
            calls = args.calls or (1 if args.quick or training else 3)
            t0 = time.perf_counter()
            bench = bench_training if training else bench_inference
            r = bench(case, executors, peers, rounds, calls, warmup, workdir, extras)
            r["rounds"], r["calls"], r["wall_s"] = rounds, calls, time.perf_counter() - t0
            print(f"{case.label}: done in {r['wall_s']:.0f} s", file=sys.stderr, flush=True)
            results.append(r)
        if extras.memory_jobs:
            gc.collect()
            memory_s = run_memory_jobs(results, extras)
            print(f"memory: {len(extras.memory_jobs)} fresh processes in {memory_s:.0f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    total_s = time.perf_counter() - t_start

    print(format_tables(results, executors))
    print()
    for line in geomeans(results, executors):
        print(line)
    mem = format_memory(results, executors)
    if mem:
        print("\nPeak memory, MiB: partita's plan (its arena), and per candidate what its calls took above the "
              "resident size between calls (+ what building and warming up kept):\n")
        print(mem)
    prof = format_profiles(results, executors)
    if prof:
        print("\nWhere the time goes (ms a call by op category, profiled: partita's steps timed one by one, eager "
              "and Inductor under torch.profiler, ORT with its own profiler); then partita's ops by share of a call "
              "(steps per op in parentheses):\n")
        print(prof)
    if "codegen" in executors:
        lines = targets(results)
        if lines:
            print("\nTargets (codegen):")
            for line in lines:
                print(f"  {line}")
    failures = []
    for r in results:
        for name, e in r["executors"].items():
            if "error" in e:
                failures.append(f"{r['label']}: partita ({name}) failed: {e['error']}")
            elif e["check"]["rel"] > ACCURACY_RTOL:
                failures.append(f"{r['label']}: partita ({name}) differs from eager by {e['check']['max_abs_err']:.3g} "
                                f"({e['check']['rel']:.3g} of the output's scale; limit {ACCURACY_RTOL})")
    broken = [f"{r['label']}: {what} {c}: {m['error']}" for r in results
              for what, group in (("compile probe", r.get("compile_probe", {})), ("memory worker", r.get("memory", {})))
              for c, m in group.items() if isinstance(m, dict) and "error" in m]
    print(f"threads {THREADS}, {rounds} rounds, pipeline {PIPELINE}, total {total_s:.0f} s")
    if failures:
        print("\nACCURACY CHECK FAILED:")
        for f in failures:
            print(f"  {f}")
    else:
        worst = max(((e["check"]["rel"], e["check"]["max_abs_err"], name, r["label"]) for r in results
                     for name, e in r["executors"].items()), default=None)
        print(f"accuracy check passed: every partita output within {ACCURACY_RTOL} (relative) of eager"
              + (f"; the largest difference {worst[1]:.2g} ({worst[0]:.2g} relative), {worst[2]} on {worst[3]}"
                 if worst else ""))
    if broken:
        print("\nMEASUREMENT FAILED:")
        for f in broken:
            print(f"  {f}")

    out = args.out or RESULTS_DIR / time.strftime("codegen-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"partita": str(Path(partita.__file__).resolve().parent), "git_head": _git_head(),
            "command": "python bench/bench_codegen.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "cpu": cpu_model(), "cpus": os.cpu_count(),
            "threads": THREADS, "python": platform.python_version(), "torch": torch.__version__,
            "onnxruntime": _version("onnxruntime"), "transformers": _version("transformers"),
            "pipeline": PIPELINE, "executors": executors, "executor_notes": EXECUTOR_NOTES, "peers": peers,
            "rounds": rounds, "quick": args.quick, "compile_probe": extras.compile_probe, "memory": extras.memory,
            "profile": extras.profile, "export_warmup_s": warm_export_s, "inductor_warmup_s": warm_s, "total_s": total_s}
    for r in results:
        for e in (*r["executors"].values(), *r["peers"].values()):
            e.pop("prog", None)
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1, default=str))
    print(f"\nwrote {out}", file=sys.stderr)
    return 1 if failures or broken else 0


def _git_head() -> str | None:
    """The commit of the tree partita was imported from, with "+changes" if it has any."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "partita"], cwd=ROOT, capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if dirty else "")


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:
        return None


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]) if WORKER in sys.argv[1:] else main())
