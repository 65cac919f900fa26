"""The model zoo: what users bring, through every path partita has, one row per architecture.

    .venv/bin/python bench/bench_zoo.py --no-time --md docs/zoo.md       # correctness of every model
    .venv/bin/python bench/bench_zoo.py --threads 1,2 --json zoo.json     # with timings (a benchmark)
    .venv/bin/python bench/bench_zoo.py --quick --models resnet,vit,llama # the timing path, 3 rounds
    .venv/bin/python bench/bench_zoo.py --families decoder,moe --columns export,train,dp

The architectures (bench/zoo_models.py) are built from small transformers configs with random
weights, nothing downloaded. Columns, each computed on its own (an exception is a cell with
the first line of the error, never the end of the run) and under a time limit
(``--timeout`` seconds a cell, SIGALRM), the model under one overall limit too:

- ``export``, ``onnx-ts``, ``onnx-dynamo``: the import paths of bench/bench_model_world.py
  (``import_torch`` with keyword inputs; the TorchScript exporter at opset 17; the dynamo
  exporter), partita's torch executor against eager or ONNX Runtime on the same file:
  max |error| / max(1, max |reference|) of the first output, a pass at most ``TOL``. An
  exporter that writes no file is "no file", not counted (not partita's failure);
- ``infer``: ``torch.compile(model, backend="partita")`` against eager, the same error, and
  whether any graph fell back to ATen (``partita.codegen.dynamo.stats()``): a pass needs none;
- ``train``: ``partita.training_step(import_torch(model, labels=...), loss=0, optimizer="sgd")``
  (the model's own loss, output 0 with ``labels=``; SGD with momentum) run once by
  ``partita.autodiff.Trainer`` against torch's step from the same weights (``torch.optim.SGD``):
  the loss and every updated param, relative error ||a - b|| / max(||b||, 1e-3 sqrt(size)) at
  most ``TOL``;
- ``dp``, ``zero3``, ``megatron+sp``, ``dp+megatron``, ``pp`` (1f1b, 2 stages, 2
  microbatches), ``pp+dp``, ``ep`` (MoE only): ``partita.parallelize`` of that step, every
  rank run by ``run_mesh`` (``ParallelProgram.simulate``), against the single-device step
  (``partita.run``): every output (loss, params, optimizer state) within ``TOL``. A strategy
  that does not apply to the model says "n/a" with the reason and is not counted;
- ``time`` (left out by ``--no-time``): partita's backend against eager, Inductor
  (``torch.compile`` default) and ONNX Runtime (a TorchScript export, opset 17) at each of
  ``--threads`` (default 1), medians of per-round ratios over ``--rounds`` interleaved rounds
  (bench/bench_codegen.py's ``time_rounds``); the import path (``import_torch``, ``optimize``,
  ``CompiledProgram``) against eager; and the cold compile seconds of partita's backend and of
  Inductor (the first call after ``torch._dynamo.reset()``, Inductor on an empty cache).

``--md PATH`` writes the table with the command that made it, pass counts per column, the
distribution of each timing column (geomean, median, the worst five) and every failure.
``--json PATH`` writes the cells.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_model_world as mw  # noqa: E402  (sets the thread variables before torch loads)

import argparse  # noqa: E402
import copy  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import signal  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402
from contextlib import contextmanager, redirect_stderr, redirect_stdout  # noqa: E402
from dataclasses import asdict, dataclass, field  # noqa: E402
from typing import Any, Callable, Iterator  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from zoo_models import FAMILIES, MODELS, ZooModel  # noqa: E402

TOL = 1e-4
CORRECTNESS = ("export", "onnx-ts", "onnx-dynamo", "infer", "train", "dp", "zero3", "megatron+sp", "dp+megatron",
               "pp", "pp+dp", "ep")
COLUMNS = CORRECTNESS + ("time",)
# strategy column -> (mesh, strategy, parallelize options)
STRATEGIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "dp": ("dp=2", "dp", {}),
    "zero3": ("dp=2", "zero3", {}),
    "megatron+sp": ("tp=2", "megatron+sp", {}),
    "dp+megatron": ("dp=2,tp=2", "dp+megatron", {}),
    "pp": ("pp=2", "pp", {"microbatches": 2, "schedule": "1f1b"}),
    "pp+dp": ("pp=2,dp=2", "pp+dp", {"microbatches": 2, "schedule": "1f1b"}),
    "ep": ("ep=2", "ep", {}),
}
MOE_GROUPS = 2          # the token groups of an MoE import: a multiple of the ep axis
LR, MOMENTUM = 0.1, 0.9
TIMING = ("eager", "inductor", "ort")


@dataclass
class Cell:
    """One column of one model: ``ok`` True (a pass), False (a failure) or None (not
    attempted: n/a, no file, skipped), with its text and error."""

    ok: bool | None
    text: str
    error: float | None = None
    seconds: float = 0.0

    @classmethod
    def of_error(cls, err: float, extra: str = "") -> "Cell":
        """A pass when ``err`` is at most TOL."""
        ok = err <= TOL
        return cls(ok, f"{'ok' if ok else 'error'} {err:.0e}{extra}" + ("" if ok else f" > {TOL:.0e}"), err)


@dataclass
class Row:
    """Every column of one model."""

    model: str
    family: str
    what: str
    cells: dict[str, Cell] = field(default_factory=dict)
    timing: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


class CellTimeout(Exception):
    """A cell ran past its time limit."""


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Raise CellTimeout in this (main) thread after ``seconds``."""
    def on_alarm(signum: int, frame: Any) -> None:
        raise CellTimeout(f"over the {seconds:.0f} s limit")
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 1.0))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@contextmanager
def quiet() -> Iterator[None]:
    """No warnings, no prints from transformers, dynamo or the exporters."""
    sink = io.StringIO()
    with warnings.catch_warnings(), redirect_stdout(sink), redirect_stderr(sink):
        warnings.simplefilter("ignore")
        yield


# The smallest root-mean-square a relative error divides by: an exactly-zero gradient
# (attention's key bias: softmax ignores a shift; it is the momentum of the first step) is
# f32 rounding noise whose relative error means nothing; every param and loss is far above it.
RMS_FLOOR = 1e-3


def rel_norm(a: Any, b: Any) -> float:
    """||a - b|| / max(||b||, RMS_FLOOR * sqrt(size)) (shapes must agree)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"shape {list(a.shape)} against the reference's {list(b.shape)}")
    return float(np.linalg.norm(a - b) / max(float(np.linalg.norm(b)), RMS_FLOOR * math.sqrt(max(b.size, 1))))


class Case:
    """One model while its columns run: the module, its inputs, and what columns share (the
    eager output, the training step and its single-device outputs), built on first use."""

    def __init__(self, zm: ZooModel, tmp: Path) -> None:
        self.zm, self.tmp = zm, tmp
        self.model = zm.build()
        self.kwargs = zm.inputs()
        self.tensors = zm.tensors()
        self.consts = zm.constants()
        self.memo: dict[str, Any] = {}

    def arch(self) -> mw.Arch:
        """The model as bench_model_world's Arch, for its import paths."""
        zm = self.zm
        return mw.Arch(zm.name, zm.build, lambda: tuple(zm.tensors().values()), zm.inputs, moe=zm.moe)

    def wrapped(self) -> torch.nn.Module:
        """The model called with its tensors positionally, returning its first output."""
        return mw.ByName(self.model, list(self.tensors), self.consts).eval()

    def eager(self) -> torch.Tensor:
        """The first output of eager, no grad."""
        if "eager" not in self.memo:
            with torch.no_grad():
                self.memo["eager"] = mw.first_output(self.model(**self.kwargs)).detach().clone()
        return self.memo["eager"]

    def train_feed(self) -> dict[str, np.ndarray]:
        """The training inputs by name: the tensors and the labels."""
        assert self.zm.labels is not None
        return {**{k: v.numpy() for k, v in self.tensors.items()}, "labels": self.zm.labels().numpy()}

    def step(self) -> Any:
        """The training step of the keyword import with ``labels=`` (loss = output 0)."""
        if "step" not in self.memo:
            import partita

            if self.zm.labels is None:
                raise NotImplementedError("the model has no labels= loss")
            kwargs = {**self.kwargs, "labels": self.zm.labels()}
            opts = {"moe_groups": MOE_GROUPS} if self.zm.moe else {}
            with quiet():
                fwd = partita.import_torch(self.model, (), kwargs, **opts)
            if fwd.outputs[0].type.rank != 0:
                raise AssertionError(f"output 0 of the import is {fwd.outputs[0].type}, not the scalar loss")
            self.memo["step"] = partita.training_step(fwd, loss=0, optimizer="sgd", lr=LR, momentum=MOMENTUM)
        return self.memo["step"]

    def logits_step(self) -> Any:
        """The training step of the import without labels, with partita's own
        ``cross_entropy`` of the logits against the labels (input ``target``)."""
        if "logits_step" not in self.memo:
            import partita

            opts = {"moe_groups": MOE_GROUPS} if self.zm.moe else {}
            with quiet():
                fwd = partita.import_torch(self.model, (), self.kwargs, **opts)
            self.memo["logits_step"] = partita.training_step(fwd, loss="cross_entropy", optimizer="sgd", lr=LR,
                                                             momentum=MOMENTUM)
        return self.memo["logits_step"]

    def feed(self, step: Any = None) -> dict[str, np.ndarray]:
        """The ``input``-role inputs of ``step`` (default: the own-loss step) by name."""
        step = self.step() if step is None else step
        given = self.train_feed()
        given["target"] = given["labels"]
        names = [str(v.name) for v in step.inputs if v.role == "input"]
        missing = [n for n in names if n not in given]
        if missing:
            raise KeyError(f"the step's input(s) {', '.join(missing)} are not the model's arguments")
        return {n: given[n] for n in names}

    def single_device(self, step: Any = None) -> list[np.ndarray]:
        """A step's outputs on one device (NumPy reference, as ``run_mesh`` computes)."""
        step = self.step() if step is None else step
        key = ("single", id(step))
        if key not in self.memo:
            import partita

            self.memo[key] = [np.asarray(o) for o in partita.run(step, self.feed(step), step.weights)]
        return self.memo[key]


# --- the columns ------------------------------------------------------------------------------------


def col_export(case: Case) -> Cell:
    """import_torch with the keyword inputs, partita's torch executor against eager."""
    with quiet():
        row = mw.torch_path(case.arch(), case.model, True)
    return Cell.of_error(row.error)


def col_onnx(case: Case, dynamo: bool) -> Cell:
    """An exporter's file imported by partita, against ONNX Runtime on the same file."""
    with quiet():
        row = mw.onnx_path(case.arch(), case.model, dynamo, case.tmp)
    if not row.written:
        return Cell(None, "no file: " + row.failure.removeprefix("the exporter fails: "))
    return Cell.of_error(row.error)


def col_infer(case: Case) -> Cell:
    """torch.compile(backend="partita") against eager, and the graphs that fell back."""
    from partita.codegen import dynamo as pdyn

    torch._dynamo.reset()
    pdyn.reset_stats()
    compiled = torch.compile(case.wrapped(), backend="partita")
    with quiet(), torch.no_grad():
        got = compiled(*case.tensors.values())
    want = case.eager()
    err = mw.rel_error(got.detach().numpy(), want.double().numpy())
    st = pdyn.stats()
    extra = f", {len(st.graphs)} graphs" if len(st.graphs) > 1 else ""
    if st.fallbacks:
        first = next(g for g in st.graphs if g.fallback)
        return Cell(False, f"{st.fallbacks}/{len(st.graphs)} graph(s) on ATen: {first.fallback.splitlines()[0]}", err)
    return Cell.of_error(err, extra)


def torch_sgd_step(case: Case) -> tuple[float, dict[str, np.ndarray]]:
    """torch's own step from the same weights: the loss and the updated params by name."""
    model = copy.deepcopy(case.model)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    with quiet():
        out = model(**case.kwargs, labels=case.zm.labels())
    loss = mw.first_output(out)
    loss.backward()
    opt.step()
    return float(loss.detach()), {n: p.detach().numpy() for n, p in model.named_parameters()}


def col_train(case: Case) -> Cell:
    """One partita training step against torch's: the loss and every updated param."""
    from partita.autodiff import Trainer

    step = case.step()
    trainer = Trainer(step, backend="torch")
    loss = trainer.step(case.feed())
    got = trainer.weights()
    want_loss, want = torch_sgd_step(case)
    worst, where = abs(loss - want_loss) / max(abs(want_loss), 1e-30), "the loss"
    missing = [n for n in want if n not in got]
    if missing:
        return Cell(False, f"param(s) {', '.join(missing[:3])} not in the step ({len(missing)} of {len(want)})")
    for n, w in want.items():
        e = rel_norm(got[n], w)
        if e > worst:
            worst, where = e, n
    cell = Cell.of_error(worst)
    if not cell.ok:
        cell.text += f" ({where})"
    return cell


def not_applicable(case: Case, column: str) -> str | None:
    """Why a strategy does not apply to the model, or None."""
    if column == "ep" and not case.zm.moe:
        return "no experts"
    if "megatron" in column and case.zm.family == "cnn":
        return "a CNN: megatron splits attention heads and MLP columns"
    return None


def strategy_cell(case: Case, column: str, step: Any) -> Cell:
    """``step`` parallelized for ``column``, every rank run by run_mesh, against one device."""
    import partita

    mesh, strategy, opts = STRATEGIES[column]
    want = case.single_device(step)
    with quiet():
        prog = partita.parallelize(step, mesh, strategy, **opts)
    got = prog.simulate(case.feed(step), step.weights)
    if len(got) != len(want):
        raise AssertionError(f"{len(got)} outputs, the single-device step has {len(want)}")
    worst, where = 0.0, ""
    for v, g, w in zip(step.outputs, got, want):
        if np.shape(g) != np.shape(w):
            raise AssertionError(f"%{v.name} has shape {list(np.shape(g))}, the single-device step's "
                                 f"{list(np.shape(w))}")
        e = rel_norm(g, w)
        if e > worst:
            worst, where = e, str(v.name)
    cell = Cell.of_error(worst)
    if not cell.ok:
        cell.text += f" (%{where})"
    return cell


def col_strategy(case: Case, column: str) -> Cell:
    """The own-loss step under a strategy against the single-device step. When a pipeline
    refuses the model's own loss (a mean over the whole batch), the cell fails and also says
    what the same strategy gives on the logits with partita's cross_entropy."""
    why = not_applicable(case, column)
    if why:
        return Cell(None, "n/a: " + why)
    try:
        return strategy_cell(case, column, case.step())
    except Exception as e:  # noqa: BLE001: a pipeline's refusal of the loss is told apart below
        if not column.startswith("pp") or "mixes the rows of different microbatches" not in str(e):
            raise
        first = mw.why(e)
    try:
        other = strategy_cell(case, column, case.logits_step())
        also = other.text
    except Exception as e2:  # noqa: BLE001
        also = mw.why(e2)
    return Cell(False, f"{first} [with cross_entropy on the logits: {also}]")


# --- timing -----------------------------------------------------------------------------------------


def fresh_inductor_cache(tmp: Path) -> None:
    """An empty Inductor cache directory and cleared in-memory caches: the next compile is cold."""
    from torch._inductor.utils import clear_caches

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-", dir=tmp)
    clear_caches()


def cold_call(fn: Callable[[], Any]) -> float:
    """Seconds of the first call (the compile)."""
    t0 = time.perf_counter()
    with quiet(), torch.inference_mode():
        fn()
    return time.perf_counter() - t0


def ort_session(case: Case, threads: int) -> Callable[[], Any]:
    """ONNX Runtime on a TorchScript export (opset 17), ``threads`` intra-op threads."""
    import onnxruntime as ort

    path = case.tmp / f"{case.zm.name}-time.onnx"
    if not path.exists():
        with quiet(), mw.quiet_fds():
            torch.onnx.export(case.wrapped(), tuple(case.tensors.values()), str(path), input_names=list(case.tensors),
                              opset_version=17, dynamo=False)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    if threads > 1:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    names = {i.name for i in sess.get_inputs()}
    feed = {k: v.numpy() for k, v in case.tensors.items() if k in names}
    return lambda: sess.run(None, feed)


IMPORT_PIPELINE = "canonicalize,fold-batch-norm,fuse-library,fuse-kernels,cse,dce"


def import_candidate(case: Case) -> Callable[[], Any]:
    """The import path: ``import_torch``, the pipeline of bench_library's models, a
    ``CompiledProgram`` with ``freeze=True`` called with torch tensors (params made once),
    checked against eager."""
    import partita
    from partita.codegen import CompiledProgram

    with quiet():
        g = partita.optimize(partita.import_torch(case.model, (), case.kwargs), IMPORT_PIPELINE)
    prog = CompiledProgram(g, freeze=True)   # inference with fixed weights: params as constants
    weights = {k: torch.from_numpy(np.array(v, copy=True)) for k, v in g.weights.items()}
    args = [case.tensors[str(v.name)] for v in g.inputs if v.role == "input"]
    err = mw.rel_error(np.asarray(prog(args, weights)[0]), case.eager().double().numpy())
    if err > TOL:
        raise AssertionError(f"the import path's error {err:.1e} > {TOL:.0e}")
    return lambda: prog(args, weights)


def compiled_candidates(case: Case) -> tuple[dict[str, Callable[[], Any]], dict[str, float]]:
    """Eager, partita's backend and Inductor as calls, and the cold compile seconds of the two."""
    torch._dynamo.reset()
    args = tuple(case.tensors.values())
    eager_m = case.wrapped()
    part = torch.compile(case.wrapped(), backend="partita")
    cold = {"partita": cold_call(lambda: part(*args))}
    fresh_inductor_cache(case.tmp)
    ind = torch.compile(case.wrapped())
    cold["inductor"] = cold_call(lambda: ind(*args))
    return {"partita": lambda: part(*args), "eager": lambda: eager_m(*args), "inductor": lambda: ind(*args)}, cold


WARM_CALLS = 18


def col_time(case: Case, threads: list[int], rounds: int) -> Cell:
    """partita's backend against eager, Inductor and ORT per thread count, and cold compiles."""
    from bench_codegen import time_rounds

    cands, cold = compiled_candidates(case)
    case.memo["timing"] = out = {"cold_s": cold, "threads": {}}
    try:
        cands["import"] = import_candidate(case)
    except Exception as e:  # noqa: BLE001: no import-path figure for this model, the others stand
        out["import_failure"] = mw.why(e)
    texts = []
    for n in threads:
        torch.set_num_threads(n)
        try:
            cs = dict(cands)
            try:
                cs["ort"] = ort_session(case, n)
            except Exception as e:  # noqa: BLE001: no ORT figure for this model, the others stand
                out.setdefault("ort_failure", mw.why(e))
            with torch.inference_mode():
                # enough warm-up calls for the backend's measured choice between its program
                # and ATen (partita.codegen.dynamo: 2 x (WARMUP_CALLS + TIMED_CALLS) calls)
                for f in cs.values():
                    for _ in range(WARM_CALLS):
                        f()
                t0 = time.perf_counter()
                cs["eager"]()
                calls = max(1, min(50, int(0.02 / max(time.perf_counter() - t0, 1e-6))))
                times = time_rounds(cs, rounds, calls)
        finally:
            torch.set_num_threads(1)
        ratios = {k: statistics.median(a / b for a, b in zip(times["partita"], times[k])) for k in TIMING if k in times}
        if "import" in times:
            ratios["import/eager"] = statistics.median(a / b for a, b in zip(times["import"], times["eager"]))
        out["threads"][str(n)] = {"ratios": ratios, "ms": {k: statistics.median(v) * 1e3 for k, v in times.items()}}
        texts.append(f"{n}t: " + " ".join(f"{k} {v:.2f}x" for k, v in ratios.items()))
    return Cell(True, "; ".join(texts) + f"; cold {cold['partita']:.1f}s vs {cold['inductor']:.1f}s")


# --- the run ----------------------------------------------------------------------------------------


def column_runner(column: str, threads: list[int], rounds: int) -> Callable[[Case], Cell]:
    """The function that computes ``column`` of a case."""
    if column == "export":
        return col_export
    if column in ("onnx-ts", "onnx-dynamo"):
        return lambda c: col_onnx(c, column == "onnx-dynamo")
    if column == "infer":
        return col_infer
    if column == "train":
        return col_train
    if column == "time":
        return lambda c: col_time(c, threads, rounds)
    return lambda c: col_strategy(c, column)


def run_model(zm: ZooModel, columns: list[str], tmp: Path, threads: list[int], rounds: int, timeout: float,
              model_timeout: float) -> Row:
    """Every asked column of one model, each caught and under its time limit."""
    row = Row(zm.name, zm.family, zm.what)
    t_model = time.perf_counter()
    try:
        with quiet(), deadline(timeout):
            case = Case(zm, tmp)
    except Exception as e:  # noqa: BLE001: a model that does not build is a row of failures
        for c in columns:
            row.cells[c] = Cell(False, "the model does not build: " + mw.why(e))
        return row
    for column in columns:
        left = model_timeout - (time.perf_counter() - t_model)
        if left <= 1:
            row.cells[column] = Cell(None, f"skipped: the model's {model_timeout:.0f} s were spent")
            continue
        t0 = time.perf_counter()
        try:
            with deadline(min(timeout, left)):
                cell = column_runner(column, threads, rounds)(case)
        except Exception as e:  # noqa: BLE001: a failure is a cell with its first line
            cell = Cell(False, mw.why(e))
            if os.environ.get("ZOO_TRACE"):
                traceback.print_exc()
        cell.seconds = time.perf_counter() - t0
        row.cells[column] = cell
        print(f"  {zm.name:22s} {column:12s} {cell.seconds:6.1f}s  {cell.text[:160]}", file=sys.stderr, flush=True)
    row.timing = case.memo.get("timing", {})
    row.seconds = time.perf_counter() - t_model
    torch._dynamo.reset()
    return row


def run(models: list[ZooModel], columns: list[str], threads: list[int], rounds: int, timeout: float,
        model_timeout: float) -> list[Row]:
    """Every model's row."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="zoo-") as tmpdir:
        for zm in models:
            d = Path(tmpdir) / zm.name
            d.mkdir()
            rows.append(run_model(zm, columns, d, threads, rounds, timeout, model_timeout))
    return rows


# --- the tables -------------------------------------------------------------------------------------


def short_paths(text: str) -> str:
    """Source paths cut to the file's name and line (``modeling_t5.py:356``)."""
    import re

    return re.sub(r"/\S+/(\w+\.py:\d+)", r"\1", text)


def md_cell(cell: Cell | None, width: int = 44) -> str:
    """A cell for a Markdown table: short (the reason of an n/a up to its first colon; the
    whole text of a failure is in the list below the table), pipes escaped."""
    if cell is None:
        return ""
    text = short_paths(cell.text).replace("|", "\\|").replace("\n", " ")
    if cell.ok is None and text.startswith("n/a: "):
        text = "n/a: " + text[5:].split(":")[0]
    if cell.ok is False:
        text = "**fail** " + text
    return text if len(text) <= width else text[:width - 1] + "…"


def pass_counts(rows: list[Row], columns: list[str]) -> dict[str, tuple[int, int]]:
    """Per column, (passes, attempts): n/a, no file and skipped cells are not attempts."""
    out = {}
    for c in columns:
        cells = [r.cells[c] for r in rows if c in r.cells]
        out[c] = (sum(1 for x in cells if x.ok), sum(1 for x in cells if x.ok is not None))
    return out


def correctness_table(rows: list[Row], columns: list[str]) -> str:
    """One row per model, one column per check, and the pass counts."""
    cols = [c for c in columns if c != "time"]
    out = ["| model | family | " + " | ".join(cols) + " |", "|---|---|" + "---|" * len(cols)]
    for r in rows:
        out.append(f"| {r.model} | {r.family} | " + " | ".join(md_cell(r.cells.get(c)) for c in cols) + " |")
    counts = pass_counts(rows, cols)
    out.append("| **passes** | | " + " | ".join(f"**{p}/{n}**" for p, n in (counts[c] for c in cols)) + " |")
    return "\n".join(out)


def geomean(xs: list[float]) -> float:
    """The geometric mean."""
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def timing_tables(rows: list[Row]) -> str:
    """Per model the ratios and cold compiles; per timing column its distribution."""
    timed = [r for r in rows if r.timing.get("threads")]
    if not timed:
        return ""
    out = ["| model | threads | partita / eager | / Inductor | / ORT | import path / eager | cold partita s | "
           "cold Inductor s |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    dist: dict[str, list[tuple[float, str]]] = {}
    for r in timed:
        cold = r.timing["cold_s"]
        for n, t in r.timing["threads"].items():
            ratios = t["ratios"]
            out.append(f"| {r.model} | {n} | " + " | ".join(f"{ratios[k]:.2f}" if k in ratios else ""
                                                         for k in (*TIMING, "import/eager"))
                       + f" | {cold['partita']:.1f} | {cold['inductor']:.1f} |")
            for k, v in ratios.items():
                label = "import path / eager" if k == "import/eager" else f"partita / {k}"
                dist.setdefault(f"{label}, {n} thread(s)", []).append((v, r.model))
        dist.setdefault("cold compile partita / Inductor", []).append((cold["partita"] / cold["inductor"], r.model))
    out += ["", "Ratios are partita's time over the other's: below 1 partita is faster. Distribution per column "
            "(the worst five are the largest ratios):", "",
            "| column | models | geomean | median | worst five |", "|---|---:|---:|---:|---|"]
    for k, vals in dist.items():
        xs = [v for v, _ in vals]
        worst = ", ".join(f"{m} {v:.2f}" for v, m in sorted(vals, reverse=True)[:5])
        out.append(f"| {k} | {len(xs)} | {geomean(xs):.2f} | {statistics.median(xs):.2f} | {worst} |")
    return "\n".join(out)


def cause(text: str) -> str:
    """A failure's text without what differs between models (value names, source lines,
    numbers, parameter names), so that failures with one cause group together."""
    import re

    text = text.split(" [with cross_entropy")[0]
    text = re.sub(r"cannot import \w+", "cannot import <model>", text)
    text = re.sub(r"cannot convert \w+", "cannot convert <graph>", text)
    text = re.sub(r"\([^()]*\.[^()]*\)$", "(<tensor>)", text)
    text = re.sub(r"%[\w.]+", "%_", text)
    text = re.sub(r"\S+\.onnx\b", "<file>", text)
    text = re.sub(r"(/\S+/)?\b[\w]+\.py:\d+", "<source>", text)
    text = re.sub(r"(?<!\w)\d+(\.\d+)?(e[-+]?\d+)?(?!\w)", "N", text)
    return text[:200]


def causes(rows: list[Row], columns: list[str]) -> str:
    """The failures grouped by cause: how many cells, which columns and models."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for r in rows:
        for c in columns:
            cell = r.cells.get(c)
            if cell is not None and cell.ok is False:
                groups.setdefault(cause(cell.text), []).append((r.model, c))
    out = ["| cause (first line, names and numbers elided) | cells | columns | models |", "|---|---:|---|---|"]
    for k, cells in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        cols = ", ".join(dict.fromkeys(c for _, c in cells))
        models = ", ".join(dict.fromkeys(m for m, _ in cells))
        out.append(f"| {k.replace('|', '/')} | {len(cells)} | {cols} | {models} |")
    return "\n".join(out)


def failures(rows: list[Row], columns: list[str]) -> tuple[list[str], list[str]]:
    """Partita's failures (model, column, first line), and the exporters' (no file)."""
    ours, theirs = [], []
    for r in rows:
        for c in columns:
            cell = r.cells.get(c)
            if cell is None:
                continue
            if cell.ok is False:
                ours.append(f"- {r.model}, {c}: {short_paths(cell.text)}")
            elif cell.text.startswith("no file"):
                theirs.append(f"- {r.model}, {c}: {short_paths(cell.text)}")
    return ours, theirs


INTRO = """# The model zoo

`bench/bench_zoo.py` runs {n} architectures, built from small transformers configs with random
weights (bench/zoo_models.py; nothing downloaded), through every path partita has: the three
imports, the `torch.compile` backend, a training step against torch's, and every parallel
strategy on the in-process mesh against the single-device step. They are chosen to cover what
users bring, not what partita is good at: depthwise, grouped and dilated convolutions,
squeeze-excitation, BatchNorm/GroupNorm/LayerNorm in channels-last, shifted windows, relative
position biases, GQA, sliding windows, ALiBi, partial rotary, soft-capping, parallel blocks,
tied and untied heads, disentangled attention, sequence pooling, a convolutional speech
front end and mixtures of experts. What each column checks is in the script's docstring;
errors are relative (a pass is at most {tol:.0e}); every cell is computed on its own and a
failure shows the first line of its error.

`tests/test_zoo.py` (part of `make test`) checks a fast subset for correctness only: a CNN
with depthwise convolutions and BatchNorm, a ViT, a GQA decoder, an encoder and a speech model.
"""


def markdown(rows: list[Row], columns: list[str], command: str) -> str:
    """docs/zoo.md: the command, the table, the timings (or how to make them), the failures."""
    import transformers

    ours, theirs = failures(rows, columns)
    parts = [INTRO.format(n=len(rows), tol=TOL).rstrip(), "", "## Correctness", "",
             f"Made by `{command}` (torch {torch.__version__}, transformers {transformers.__version__}, one "
             f"thread). n/a: the strategy does not apply (a CNN: megatron splits attention heads and MLP columns, "
             f"a CNN has neither; no experts: ep splits a mixture's experts); no file: the exporter wrote none "
             f"(not counted; listed below). A failed cell shows the start of its error; the whole first line is "
             f"under \"What the zoo finds\".", "", correctness_table(rows, columns), "", "## Timing", ""]
    timing = timing_tables(rows)
    if timing:
        parts += [f"Made by `{command}`.", "", timing]
    else:
        parts += ["No timing figures are recorded here (they need a quiet machine). To make them:", "",
                  "```", ".venv/bin/python bench/bench_zoo.py --threads 1,2 --md docs/zoo.md", "```", "",
                  "`--quick` (3 rounds) checks the timing path on a few models: "
                  "`.venv/bin/python bench/bench_zoo.py --quick --models resnet,vit,llama --columns time`."]
    parts += ["", "## What the zoo finds", "",
              f"{len(ours)} failure(s) of partita, each the model, the column and the first line of its error: "
              "the bugs to fix next. Grouped by cause first, then every cell." if ours else "No failure of partita.",
              ""]
    if ours:
        parts += [causes(rows, columns), ""]
    parts += ours
    if theirs:
        parts += ["", "The exporters' own failures (no ONNX file to import; not partita's):", ""] + theirs
    return "\n".join(parts) + "\n"


def head_commit() -> str:
    """The working tree's commit (short), or "?"."""
    import subprocess

    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "?"
    except (OSError, subprocess.SubprocessError):
        return "?"


def rows_from_json(paths: str) -> tuple[list[Row], str]:
    """The rows and the command of ``--json`` files (comma-separated): a model's cells from
    every file, a later file's cell replacing an earlier one's of the same column; the
    commands joined, each with the commit its file records."""
    by_model: dict[str, Row] = {}
    commands = []
    for path in paths.split(","):
        data = json.loads(Path(path).read_text())
        commands.append(data["command"])
        for r in data["rows"]:
            cells = {k: Cell(**v) for k, v in r.pop("cells").items()}
            if r["model"] in by_model:
                by_model[r["model"]].cells.update(cells)
                by_model[r["model"]].timing.update(r.get("timing") or {})
            else:
                by_model[r["model"]] = Row(**r, cells=cells)
    return list(by_model.values()), "` and `".join(commands)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--models", help="comma-separated names (default: all): " + ",".join(m.name for m in MODELS))
    ap.add_argument("--families", help="comma-separated: " + ",".join(FAMILIES))
    ap.add_argument("--columns", help="comma-separated (default: all): " + ",".join(COLUMNS))
    ap.add_argument("--no-time", action="store_true", help="leave out the timing column")
    ap.add_argument("--quick", action="store_true", help="3 timing rounds")
    ap.add_argument("--rounds", type=int, default=15, help="interleaved timing rounds (default 15)")
    ap.add_argument("--threads", default="1", help="thread counts of the timing column, e.g. 1,2")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a cell may take")
    ap.add_argument("--model-timeout", type=float, default=900.0, help="seconds a model's columns may take")
    ap.add_argument("--json", help="write the cells as JSON")
    ap.add_argument("--md", help="write the Markdown report (docs/zoo.md)")
    ap.add_argument("--from-json", help="run nothing: write the report of earlier --json files (comma-separated, "
                                        "their cells merged by model)")
    return ap.parse_args(argv)


def choose(ns: argparse.Namespace) -> tuple[list[ZooModel], list[str]]:
    """The models and columns the options ask for (unknown names are an error)."""
    models = list(MODELS)
    if ns.models:
        names = ns.models.split(",")
        unknown = sorted(set(names) - {m.name for m in MODELS})
        if unknown:
            raise SystemExit(f"unknown model(s): {', '.join(unknown)}")
        models = [m for m in models if m.name in names]
    if ns.families:
        fams = ns.families.split(",")
        unknown = sorted(set(fams) - set(FAMILIES))
        if unknown:
            raise SystemExit(f"unknown famil(ies): {', '.join(unknown)}")
        models = [m for m in models if m.family in fams]
    columns = list(COLUMNS) if not ns.columns else ns.columns.split(",")
    unknown = sorted(set(columns) - set(COLUMNS))
    if unknown:
        raise SystemExit(f"unknown column(s): {', '.join(unknown)}")
    if ns.no_time:
        columns = [c for c in columns if c != "time"]
    return models, columns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    models, columns = choose(ns)
    if ns.from_json:
        rows, command = rows_from_json(ns.from_json)
        columns = [c for c in columns if any(c in r.cells for r in rows)]
    else:
        torch.set_num_threads(1)
        threads = [int(t) for t in ns.threads.split(",")]
        rounds = 3 if ns.quick else ns.rounds
        command = "bench/bench_zoo.py " + " ".join(sys.argv[1:] if argv is None else argv)
        command += f"` at {time.strftime('%Y-%m-%d')}, on commit `{head_commit()}"   # the tree it starts on
        rows = run(models, columns, threads, rounds, ns.timeout, ns.model_timeout)
    print(correctness_table(rows, columns))
    timing = timing_tables(rows)
    if timing:
        print()
        print(timing)
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({"command": command, "torch": torch.__version__,
                                             "rows": [asdict(r) for r in rows]}, indent=1))
    if ns.md:
        Path(ns.md).write_text(markdown(rows, columns, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
