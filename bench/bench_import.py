"""Benchmark of import time: how much of an import is torch's (or onnx's) and how much is partita's.

    .venv/bin/python bench/bench_import.py                  # all models, 5 runs each
    .venv/bin/python bench/bench_import.py --models mlp gpt2 --repeats 3

PyTorch models (an MLP, a ResNet-18-style CNN, and GPT-2, Llama and BERT from small
transformers configs, built as tests/frontend/test_torch_export.py builds them): the time of
``torch.export.export`` plus ``run_decompositions`` ("torch"), against partita's part, the
conversion of the exported program into a Graph plus ``verify`` ("partita"). The split comes
from ``import_torch(..., timings=...)``, so both parts are measured in the same call.

ONNX (light_resnet50.onnx, shipped in the onnx wheel's backend test data): ``onnx.load``
("onnx") against ``import_onnx`` on the loaded proto plus ``verify`` ("partita"); partita's
part includes the ONNX shape inference it runs, which is also reported on its own.

Every figure is the median of ``--repeats`` runs on one thread, after one untimed warm-up run
per model. The script prints a Markdown table and writes JSON to bench/results/.
"""

from __future__ import annotations

import os

# One thread everywhere, set before NumPy, torch and onnx are imported.
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[_var] = "1"

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import partita  # noqa: E402
from partita.frontend.torch_export import import_torch  # noqa: E402

RESULTS_DIR = ROOT / "bench" / "results"
# Targets the numbers are judged against (docs/benchmarks.md, "Import time").
HF_SHARE_TARGET = 0.10
ONNX_RESNET50_TARGET_S = 0.5


# --- models --------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.head = nn.Linear(784, 256), nn.Linear(256, 128), nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(self.head(F.gelu(self.fc2(F.gelu(self.fc1(x))))), dim=-1)


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


class ResNet18Style(nn.Module):
    """ResNet-18's layout (stem, four stages of two basic blocks, pooled head), narrower."""

    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.pool = nn.MaxPool2d(3, 2, 1)
        stages, cin = [], width
        for i in range(4):
            cout = width * 2 ** i
            stages += [BasicBlock(cin, cout, 1 if i == 0 else 2), BasicBlock(cout, cout, 1)]
            cin = cout
        self.blocks = nn.Sequential(*stages)
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(self.pool(F.relu(self.bn(self.stem(x)))))
        return self.fc(torch.flatten(self.avg(x), 1))


class _Logits(nn.Module):
    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=ids, use_cache=False).logits


class _BertHidden(nn.Module):
    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state


def _gpt2() -> tuple[nn.Module, tuple]:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=32, use_cache=False,
                     bos_token_id=0, eos_token_id=0)
    return _Logits(GPT2LMHeadModel(cfg)), (torch.randint(0, 128, (2, 16)),)


def _llama() -> tuple[nn.Module, tuple]:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=32, bos_token_id=0,
                      eos_token_id=0, pad_token_id=0)
    return _Logits(LlamaForCausalLM(cfg)), (torch.randint(0, 128, (2, 16)),)


def _bert() -> tuple[nn.Module, tuple]:
    from transformers import BertConfig, BertModel

    cfg = BertConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     vocab_size=128, max_position_embeddings=32, pad_token_id=0)
    mask = torch.ones(2, 16, dtype=torch.int64)
    mask[1, 10:] = 0
    return _BertHidden(BertModel(cfg, add_pooling_layer=False)), (torch.randint(0, 128, (2, 16)), mask)


TORCH_MODELS: dict[str, tuple[str, Callable[[], tuple[nn.Module, tuple]]]] = {
    "mlp": ("MLP 784-256-128-10", lambda: (MLP(), (torch.randn(32, 784),))),
    "resnet18": ("ResNet-18-style CNN", lambda: (ResNet18Style(), (torch.randn(1, 3, 64, 64),))),
    "gpt2": ("GPT-2 (2 layers, 64 wide)", _gpt2),
    "llama": ("Llama (2 layers, 64 wide, GQA)", _llama),
    "bert": ("BERT (2 layers, 64 wide)", _bert),
}
HF_MODELS = ("gpt2", "llama", "bert")


def onnx_resnet50_path() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_resnet50.onnx"


# --- measurement ---------------------------------------------------------------------------

def bench_torch(key: str, repeats: int) -> dict[str, Any]:
    """Median torch.export (+ decompositions) and partita (convert + verify) seconds for one model."""
    title, build = TORCH_MODELS[key]
    torch.manual_seed(0)
    module, args = build()
    module.eval()
    runs: list[dict[str, float]] = []
    nodes = 0
    with torch.no_grad():
        for i in range(repeats + 1):
            timings: dict[str, float] = {}
            g = import_torch(module, args, timings=timings)
            t0 = time.perf_counter()
            partita.verify(g)
            timings["verify"] = time.perf_counter() - t0
            nodes = len(g)
            if i:  # the first run warms torch.export's caches and is not counted
                runs.append(timings)
    torch_s = statistics.median(r["export"] for r in runs)
    partita_s = statistics.median(r["convert"] + r["verify"] for r in runs)
    return {"model": key, "title": title, "nodes": nodes, "framework": "torch.export + run_decompositions",
            "framework_s": torch_s, "partita_s": partita_s,
            "convert_s": statistics.median(r["convert"] for r in runs),
            "verify_s": statistics.median(r["verify"] for r in runs),
            "share": partita_s / torch_s, "runs": runs}


def _at_least_opset_13(path: Path) -> Path:
    """The model itself when its opset is 13 or newer; otherwise a copy converted to opset 13
    (untimed, once) in bench/results/, since partita imports opset 13 and newer."""
    import onnx

    proto = onnx.load(str(path))
    opset = max((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset >= 13:
        return path
    out = RESULTS_DIR / f"{path.stem}-opset13.onnx"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(onnx.version_converter.convert_version(proto, 13), str(out))
    return out


def bench_onnx(path: Path, repeats: int) -> dict[str, Any]:
    """Median onnx.load against import_onnx (shape inference included) + verify."""
    import onnx

    from partita.frontend.onnx import import_onnx

    path = _at_least_opset_13(path)
    runs: list[dict[str, float]] = []
    nodes = 0
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        proto = onnx.load(str(path))
        t1 = time.perf_counter()
        g = import_onnx(proto)
        t2 = time.perf_counter()
        partita.verify(g)
        t3 = time.perf_counter()
        onnx.shape_inference.infer_shapes(proto, strict_mode=False)
        t4 = time.perf_counter()
        nodes = len(g)
        if i:
            runs.append({"load": t1 - t0, "import": t2 - t1, "verify": t3 - t2, "shape_inference": t4 - t3})
    load_s = statistics.median(r["load"] for r in runs)
    partita_s = statistics.median(r["import"] + r["verify"] for r in runs)
    return {"model": "onnx-resnet50", "title": f"ResNet-50 from ONNX ({path.name})", "nodes": nodes,
            "framework": "onnx.load", "framework_s": load_s, "partita_s": partita_s,
            "convert_s": statistics.median(r["import"] for r in runs),
            "verify_s": statistics.median(r["verify"] for r in runs),
            "shape_inference_s": statistics.median(r["shape_inference"] for r in runs),
            "share": partita_s / load_s if load_s else float("inf"), "runs": runs}


def verdicts(results: list[dict[str, Any]]) -> list[str]:
    """One line per target: met or not, with the figure."""
    lines = []
    for r in results:
        if r["model"] in HF_MODELS:
            ok = r["share"] <= HF_SHARE_TARGET
            lines.append(f"{r['title']}: partita's part is {r['share']:.1%} of torch.export "
                         f"(target <= {HF_SHARE_TARGET:.0%}): {'met' if ok else 'NOT met'}")
        elif r["model"] == "onnx-resnet50":
            ok = r["partita_s"] < ONNX_RESNET50_TARGET_S
            lines.append(f"{r['title']}: partita's part takes {r['partita_s']:.3f} s "
                         f"(target < {ONNX_RESNET50_TARGET_S} s): {'met' if ok else 'NOT met'}")
    return lines


def format_table(results: list[dict[str, Any]]) -> str:
    """The Markdown table of docs/benchmarks.md."""
    rows = ["| model | nodes | framework part | framework (ms) | partita convert (ms) | partita verify (ms) "
            "| partita total (ms) | partita / framework |",
            "|---|---:|---|---:|---:|---:|---:|---:|"]
    for r in results:
        rows.append(f"| {r['title']} | {r['nodes']:,} | {r['framework']} | {r['framework_s'] * 1e3:,.1f} "
                    f"| {r['convert_s'] * 1e3:,.1f} | {r['verify_s'] * 1e3:,.1f} | {r['partita_s'] * 1e3:,.1f} "
                    f"| {r['share']:.1%} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print the table and the verdicts; write JSON."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    choices = [*TORCH_MODELS, "onnx-resnet50"]
    ap.add_argument("--models", nargs="+", choices=choices, default=choices)
    ap.add_argument("--repeats", type=int, default=5, help="timed runs per model (median reported; default 5)")
    ap.add_argument("--onnx-model", type=Path, default=None,
                    help="the ONNX file for onnx-resnet50 (default: light_resnet50.onnx from the onnx wheel)")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON file (default: bench/results/bench_import-TIME.json)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)

    results = []
    for key in args.models:
        if key == "onnx-resnet50":
            r = bench_onnx(args.onnx_model or onnx_resnet50_path(), args.repeats)
            extra = f", of which ONNX shape inference {r['shape_inference_s'] * 1e3:.1f} ms"
        else:
            r = bench_torch(key, args.repeats)
            extra = ""
        print(f"{r['title']}: {r['framework']} {r['framework_s'] * 1e3:.1f} ms, partita "
              f"{r['partita_s'] * 1e3:.1f} ms{extra}", file=sys.stderr)
        results.append(r)
    print(format_table(results))
    print()
    for line in verdicts(results):
        print(line)

    out = args.out or RESULTS_DIR / time.strftime("bench_import-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"python": platform.python_version(), "torch": torch.__version__, "machine": platform.machine(),
            "repeats": args.repeats, "threads": 1,
            "command": "python bench/bench_import.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
