"""The model world: which transformers architectures import, by which path, and how exactly.

    .venv/bin/python bench/bench_model_world.py                    # every architecture, all paths
    .venv/bin/python bench/bench_model_world.py --archs gpt2 bert --paths export-args onnx-ts

Each architecture is built from a small transformers config (2 layers, 64 wide, random
weights, nothing downloaded) and tried four ways:

- ``export-args``: ``import_torch(model, positional tensors)`` (``None`` where a positional
  argument is skipped, as T5 and BART need for the decoder ids);
- ``export-kwargs``: ``import_torch(model, (), kwargs)`` with what people pass:
  ``attention_mask`` (the second row padded), and ``use_cache=False`` for decoders;
- ``onnx-ts``: ``torch.onnx.export(..., dynamo=False, opset_version=17)`` (the TorchScript
  exporter), then ``import_onnx``;
- ``onnx-dynamo``: ``torch.onnx.export(..., dynamo=True)`` at its default opset.

Each import runs on partita's torch executor and is compared with eager (torch paths) or
with onnxruntime on the same file (ONNX paths): the error is max |partita - ref| divided by
max(1, max |ref|) over the first output; "ok" means it is at most 1e-5. For the torch paths
the import is split by ``import_torch(timings=...)`` into torch.export's part (export plus
decompositions) and partita's conversion, and their ratio is reported (target: at most 10%).
A failure is reported with the first line of its error. One thread; the table goes to
stdout as Markdown and the rows to bench/results/model_world.json.

``--quantize`` adds a second table: each architecture's graph (the keyword import) through
``partita.quantize`` in both modes (``weight-only``, ``dynamic``; a fresh import each), with
the param bytes saved and the accuracy change against the float graph on the same inputs:
the largest and the RMS error relative to the float outputs' RMS, and for the models with a
language-model head the share of positions whose top-1 token is unchanged. Random weights
are a proxy for trained ones (see docs/benchmarks.md, "Quantization").
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import argparse  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from contextlib import contextmanager, redirect_stderr, redirect_stdout  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from dataclasses import replace as dataclasses_replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable, Iterator  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)

TOL = 1e-5
PATHS = ("export-args", "export-kwargs", "onnx-ts", "onnx-dynamo")
V, B, S = 128, 2, 8      # vocab, batch, sequence


@dataclass
class Arch:
    """One architecture: its model, its positional inputs and the keyword inputs people pass."""

    name: str
    build: Callable[[], Any]
    args: Callable[[], tuple]
    kwargs: Callable[[], dict]
    # A mixture of experts: its ONNX files are written in partita's static dispatch form
    # (partita.frontend.moe.static_experts), as neither exporter handles transformers'
    # data-dependent expert loop (histc; a grouped_mm fallback).
    moe: bool = False


def _ids(lo: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    return torch.randint(lo, V, (B, S), generator=g)


def _mask() -> torch.Tensor:
    m = torch.ones(B, S, dtype=torch.int64)
    m[1, S - 2:] = 0
    return m


def _dec_ids() -> torch.Tensor:
    g = torch.Generator().manual_seed(2)
    return torch.randint(3, V, (B, 5), generator=g)


def _pixels(size: int = 32) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randn(1, 3, size, size, generator=g)


def _features() -> torch.Tensor:
    g = torch.Generator().manual_seed(4)
    return torch.randn(1, 16, 64, generator=g)


def _tf() -> Any:
    import transformers

    return transformers


def _decoder(cls: str, cfg: str, **kw: Any) -> Arch:
    name = cls.replace("ForCausalLM", "").replace("LMHeadModel", "").lower()

    def build() -> Any:
        t = _tf()
        torch.manual_seed(0)
        return getattr(t, cls)(getattr(t, cfg)(**kw)).eval()
    return Arch(name, build, lambda: (_ids(),), lambda: {"input_ids": _ids(), "attention_mask": _mask(),
                                                        "use_cache": False})


def _encoder(name: str, cls: str, cfg: str, **kw: Any) -> Arch:
    def build() -> Any:
        t = _tf()
        torch.manual_seed(0)
        return getattr(t, cls)(getattr(t, cfg)(**kw)).eval()
    return Arch(name, build, lambda: (_ids(),), lambda: {"input_ids": _ids(), "attention_mask": _mask()})


def _seq2seq(name: str, cls: str, cfg: str, **kw: Any) -> Arch:
    def build() -> Any:
        t = _tf()
        torch.manual_seed(0)
        return getattr(t, cls)(getattr(t, cfg)(**kw)).eval()
    return Arch(name, build, lambda: (_ids(), None, _dec_ids()),
                lambda: {"input_ids": _ids(), "attention_mask": _mask(), "decoder_input_ids": _dec_ids(),
                         "use_cache": False})


def _vision(name: str, cls: str, cfg: str, size: int = 32, **kw: Any) -> Arch:
    def build() -> Any:
        t = _tf()
        torch.manual_seed(0)
        return getattr(t, cls)(getattr(t, cfg)(**kw)).eval()
    return Arch(name, build, lambda: (_pixels(size),), lambda: {"pixel_values": _pixels(size)})


_DEC = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=V,
            max_position_embeddings=64)
_ENC = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=V,
            max_position_embeddings=64)


def _whisper_cfg() -> Any:
    return _tf().WhisperConfig(vocab_size=V, d_model=64, encoder_layers=2, decoder_layers=2,
                               encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                               decoder_ffn_dim=128, num_mel_bins=16, max_source_positions=32,
                               max_target_positions=32, decoder_start_token_id=1, pad_token_id=0,
                               bos_token_id=1, eos_token_id=2, suppress_tokens=None, begin_suppress_tokens=None)


class _WhisperEncoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.encoder = _tf().WhisperModel(_whisper_cfg()).get_encoder()

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_features).last_hidden_state


def _whisper_full() -> Any:
    torch.manual_seed(0)
    return _tf().WhisperForConditionalGeneration(_whisper_cfg()).eval()


ARCHS: list[Arch] = [
    _decoder("GPT2LMHeadModel", "GPT2Config", n_layer=2, n_embd=64, n_head=4, vocab_size=V, n_positions=64),
    _decoder("LlamaForCausalLM", "LlamaConfig", num_key_value_heads=2, **_DEC),
    _decoder("MistralForCausalLM", "MistralConfig", num_key_value_heads=2, sliding_window=None, **_DEC),
    _decoder("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=2, **_DEC),
    _decoder("GemmaForCausalLM", "GemmaConfig", num_key_value_heads=2, head_dim=16, **_DEC),
    _decoder("PhiForCausalLM", "PhiConfig", **_DEC),
    _decoder("FalconForCausalLM", "FalconConfig", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=V, new_decoder_architecture=False, multi_query=True, alibi=False),
    _decoder("GPTNeoXForCausalLM", "GPTNeoXConfig", **_DEC),
    _decoder("OPTForCausalLM", "OPTConfig", hidden_size=64, ffn_dim=128, num_hidden_layers=2, num_attention_heads=4,
             vocab_size=V, max_position_embeddings=64, word_embed_proj_dim=64),
    _decoder("BloomForCausalLM", "BloomConfig", hidden_size=64, n_layer=2, n_head=4, vocab_size=V),
    dataclasses_replace(_decoder("MixtralForCausalLM", "MixtralConfig", num_key_value_heads=2, num_local_experts=4,
                                 num_experts_per_tok=2, **_DEC), moe=True),
    _encoder("bert", "BertModel", "BertConfig", **_ENC),
    _encoder("roberta", "RobertaModel", "RobertaConfig", pad_token_id=1, **{**_ENC, "max_position_embeddings": 72}),
    _encoder("distilbert", "DistilBertModel", "DistilBertConfig", dim=64, hidden_dim=128, n_layers=2, n_heads=4,
             vocab_size=V, max_position_embeddings=64),
    _encoder("albert", "AlbertModel", "AlbertConfig", embedding_size=32, **_ENC),
    _encoder("t5-encoder", "T5EncoderModel", "T5Config", vocab_size=V, d_model=64, d_kv=16, d_ff=128, num_layers=2,
             num_heads=4),
    _seq2seq("t5", "T5ForConditionalGeneration", "T5Config", vocab_size=V, d_model=64, d_kv=16, d_ff=128,
             num_layers=2, num_heads=4, decoder_start_token_id=0),
    _seq2seq("bart", "BartForConditionalGeneration", "BartConfig", vocab_size=V, d_model=64, encoder_layers=2,
             decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
             decoder_ffn_dim=128, max_position_embeddings=64),
    _vision("vit", "ViTModel", "ViTConfig", image_size=32, patch_size=8, hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4),
    _vision("convnext", "ConvNextModel", "ConvNextConfig", num_stages=2, hidden_sizes=[16, 32], depths=[1, 1]),
    _vision("resnet", "ResNetModel", "ResNetConfig", embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1]),
    _vision("mobilenetv2", "MobileNetV2Model", "MobileNetV2Config", image_size=32, depth_multiplier=0.35),
    Arch("whisper-encoder", lambda: _WhisperEncoder().eval(), lambda: (_features(),),
         lambda: {"input_features": _features()}),
    Arch("whisper", _whisper_full, lambda: (_features(), None, _dec_ids()),
         lambda: {"input_features": _features(), "decoder_input_ids": _dec_ids(), "use_cache": False}),
]


@dataclass
class Row:
    arch: str
    path: str
    ok: bool = False
    # False when the exporter itself fails: no ONNX file exists to import.
    written: bool = True
    error: float | None = None
    failure: str = ""
    export_s: float | None = None
    convert_s: float | None = None
    seconds: float = 0.0


def _first(out: Any) -> torch.Tensor:
    if isinstance(out, torch.Tensor):
        return out
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, (tuple, list)):
        return _first(out[0])
    if isinstance(out, dict):
        return _first(next(iter(out.values())))
    raise TypeError(f"no tensor in {type(out).__name__}")


def _err(got: Any, want: np.ndarray) -> float:
    got = np.asarray(got, dtype=np.float64)
    if got.shape != want.shape:
        raise AssertionError(f"shape {list(got.shape)} against the reference's {list(want.shape)}")
    return float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))


def _why(e: BaseException) -> str:
    text = (str(e).strip() or type(e).__name__).split(". Supported: ")[0]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    head = lines[0] if lines else type(e).__name__
    return f"{type(e).__name__}: {head}"[:300]


@contextmanager
def _quiet_fds() -> Iterator[None]:
    """Standard output and error closed at the descriptor level: the TorchScript exporter
    prints its whole IR graph from C++ when it fails."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def _exporter_why(e: BaseException) -> str:
    text = str(e)
    if "## Exception summary" in text:
        text = text.split("## Exception summary", 1)[1]
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[0] if lines else type(e).__name__)[:200]


def _tensors(args: tuple, kwargs: dict) -> list[np.ndarray]:
    vals = [a for a in args if isinstance(a, torch.Tensor)] + [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    return [v.numpy() for v in vals]


def _torch_path(arch: Arch, model: Any, kw: bool) -> Row:
    import partita
    from partita.frontend.torch_export import import_torch

    row = Row(arch.name, "export-kwargs" if kw else "export-args")
    args, kwargs = ((), arch.kwargs()) if kw else (arch.args(), {})
    with torch.no_grad():
        want = _first(model(*args, **kwargs)).double().numpy()
    timings: dict[str, float] = {}
    g = import_torch(model, args, kwargs, timings=timings)
    row.export_s, row.convert_s = timings.get("export"), timings.get("convert")
    got = partita.run(g, _tensors(args, kwargs), backend="torch")[0]
    row.error = _err(np.asarray(got), want)
    return row


class _ByName(torch.nn.Module):
    """The model called with its keyword tensors given positionally (both exporters take
    positional inputs best), the Python constants bound, returning the first output."""

    def __init__(self, model: Any, names: list[str], consts: dict) -> None:
        super().__init__()
        self.model, self.names, self.consts = model, names, consts

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        return _first(self.model(**dict(zip(self.names, tensors)), **self.consts))


def _onnx_path(arch: Arch, model: Any, dynamo: bool, tmp: Path) -> Row:
    import onnxruntime as ort

    import partita

    row = Row(arch.name, "onnx-dynamo" if dynamo else "onnx-ts")
    kwargs = arch.kwargs()
    consts = {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}
    tensors = {k: v for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
    names = list(tensors)
    wrapped = _ByName(model, names, consts).eval()   # a new Module trains; exporters restore that mode
    path = tmp / f"{arch.name}-{row.path}.onnx"
    sink = io.StringIO()
    from partita.frontend.moe import static_experts

    try:
        with warnings.catch_warnings(), redirect_stdout(sink), redirect_stderr(sink), _quiet_fds(), \
                (static_experts(model, 1, None) if arch.moe else nullcontext()):
            warnings.simplefilter("ignore")
            if dynamo:
                torch.onnx.export(wrapped, tuple(tensors.values()), str(path), input_names=names, dynamo=True)
            else:
                torch.onnx.export(wrapped, tuple(tensors.values()), str(path), input_names=names, opset_version=17,
                                  dynamo=False)
    except Exception as e:  # noqa: BLE001: the exporter's own failure: there is no file to import
        row.written, row.failure = False, "the exporter fails: " + _exporter_why(e)
        return row
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed_names = [i.name for i in sess.get_inputs()]
    feed = {k: v.numpy() for k, v in tensors.items() if k in feed_names}
    want = np.asarray(sess.run(None, feed)[0], dtype=np.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        g = partita.import_onnx(str(path))
    got = partita.run(g, [feed[n] for n in feed_names], backend="torch")[0]
    row.error = _err(np.asarray(got), want)
    return row


# Public names for the other benchmarks that reuse these paths (bench/bench_zoo.py).
torch_path = _torch_path
onnx_path = _onnx_path
first_output = _first
rel_error = _err
why = _why
exporter_why = _exporter_why
quiet_fds = _quiet_fds
ByName = _ByName


@dataclass
class QRow:
    arch: str
    mode: str
    weights: int = 0
    before: int = 0
    after: int = 0
    max_error: float | None = None
    rms_error: float | None = None
    top1: float | None = None
    failure: str = ""


def quantize_rows(arch: Arch, model: Any) -> list[QRow]:
    import partita
    from partita.frontend.torch_export import import_torch

    kwargs = arch.kwargs()
    feed = _tensors((), kwargs)
    rows = []
    try:
        ref = np.asarray(partita.run(import_torch(model, (), kwargs), feed, backend="torch")[0], np.float64)
    except Exception as e:  # noqa: BLE001
        return [QRow(arch.name, m, failure=_why(e)) for m in ("weight-only", "dynamic")]
    scale = float(np.sqrt(np.mean(ref ** 2))) or 1.0
    for mode in ("weight-only", "dynamic"):
        row = QRow(arch.name, mode)
        try:
            g = import_torch(model, (), kwargs)
            rep = partita.quantize(g, mode)
            row.weights, row.before, row.after = len(rep.weights), rep.param_bytes_before, rep.param_bytes_after
            got = np.asarray(partita.run(g, feed, backend="torch")[0], np.float64)
            d = np.abs(got - ref)
            row.max_error, row.rms_error = float(d.max()) / scale, float(np.sqrt(np.mean(d ** 2))) / scale
            if ref.ndim == 3 and ref.shape[-1] == V:
                row.top1 = float(np.mean(got.argmax(-1) == ref.argmax(-1)))
        except Exception as e:  # noqa: BLE001
            row.failure = _why(e)
        rows.append(row)
        print(f"  {arch.name:16s} quantize {mode:12s} {row.failure or 'ok'}", file=sys.stderr, flush=True)
    return rows


def quantize_table(rows: list[QRow]) -> str:
    out = ["| architecture | mode | int8 weights | params before -> after | saved | max error | RMS error | top-1 same |",
           "|---|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        if r.failure:
            out.append(f"| {r.arch} | {r.mode} | **fail**: {r.failure} | | | | | |")
            continue
        saved = 1 - r.after / r.before if r.before else 0.0
        top1 = f"{r.top1:.1%}" if r.top1 is not None else ""
        out.append(f"| {r.arch} | {r.mode} | {r.weights} | {r.before / 1024:.0f} -> {r.after / 1024:.0f} KiB | "
                   f"{saved:.1%} | {r.max_error:.2e} | {r.rms_error:.2e} | {top1} |")
    return "\n".join(out)


def run(archs: list[Arch], paths: list[str], quantize: bool = False) -> tuple[list[Row], list[QRow]]:
    qrows: list[QRow] = []
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmpdir:
        for arch in archs:
            model = arch.build()
            for path in paths:
                t0 = time.perf_counter()
                try:
                    if path.startswith("export"):
                        row = _torch_path(arch, model, path == "export-kwargs")
                    else:
                        row = _onnx_path(arch, model, path == "onnx-dynamo", Path(tmpdir))
                    row.ok = row.error is not None and row.error <= TOL
                    if not row.ok and row.written:
                        row.failure = f"error {row.error:.1e} > {TOL:.0e}"
                except Exception as e:  # noqa: BLE001: a failed import is a row of the table
                    row = Row(arch.name, path, failure=_why(e))
                    if os.environ.get("MODEL_WORLD_TRACE"):
                        traceback.print_exc()
                row.seconds = time.perf_counter() - t0
                rows.append(row)
                print(f"  {arch.name:16s} {path:14s} {'ok' if row.ok else 'FAIL'} {row.failure[:150]}",
                      file=sys.stderr, flush=True)
            if quantize:
                qrows += quantize_rows(arch, model)
    return rows, qrows


def table(rows: list[Row], paths: list[str]) -> str:
    archs = list(dict.fromkeys(r.arch for r in rows))
    by = {(r.arch, r.path): r for r in rows}
    out = ["| architecture | " + " | ".join(paths) + " | convert / export |",
           "|---|" + "---|" * len(paths) + "---:|"]
    for a in archs:
        cells = []
        for p in paths:
            r = by.get((a, p))
            cells.append("" if r is None else "no file (exporter fails)" if not r.written else
                         ("ok" if r.ok else "**fail**") + (f" {r.error:.0e}" if r.error is not None else ""))
        ratios = [r.convert_s / r.export_s for p in paths if (r := by.get((a, p))) and r.ok and r.export_s and r.convert_s]
        out.append(f"| {a} | " + " | ".join(cells) + f" | {max(ratios):.1%} |" if ratios else
                   f"| {a} | " + " | ".join(cells) + " | |")
    total = {p: sum(1 for a in archs if (r := by.get((a, p))) and r.ok) for p in paths}
    written = {p: sum(1 for a in archs if (r := by.get((a, p))) and r.written) for p in paths}
    out.append("| **imports within 1e-5** | " + " | ".join(f"**{total[p]}/{written[p]}**" for p in paths) + " | |")
    fails = [r for r in rows if not r.ok]
    if fails:
        out.append("")
        out.append("Failures:")
        out.append("")
        for r in fails:
            out.append(f"- {r.arch}, {r.path}: {r.failure}")
    out.append("")
    out.append("Counts are of the imports attempted: every architecture for the torch.export paths, "
               "every file the exporter writes for the ONNX paths.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--archs", nargs="*", help="architecture names (default: all): " +
                    ", ".join(a.name for a in ARCHS))
    ap.add_argument("--paths", nargs="*", default=list(PATHS), choices=PATHS)
    ap.add_argument("--quantize", action="store_true", help="also quantize each graph in both modes")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "model_world.json"))
    ns = ap.parse_args(argv)
    chosen = ARCHS if not ns.archs else [a for a in ARCHS if a.name in ns.archs]
    unknown = set(ns.archs or ()) - {a.name for a in ARCHS}
    if unknown:
        ap.error(f"unknown architecture(s): {', '.join(sorted(unknown))}")
    rows, qrows = run(chosen, ns.paths, ns.quantize)
    print(table(rows, ns.paths))
    if qrows:
        print()
        print(quantize_table(qrows))
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"torch": torch.__version__, "rows": [asdict(r) for r in rows],
                                     "quantize": [asdict(r) for r in qrows]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
