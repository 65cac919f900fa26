"""The fuzzing campaign: seeded generators and one function per target.

The promise every target checks: for any input a user can give, partita either succeeds or
raises a ``partita.PartitaError`` whose message names the place (a ``file:line:col``, a
``%value`` or ``@graph``, an input, argument or function name); the CLI exits 0, 1 or 2 and
prints no traceback; nothing hangs (each case runs under a time limit); and on random valid
graphs both executors and every optimization pass agree.

Targets (each ``target_*`` function returns a ``Counts``):

- ``pir``: structure-aware mutations of ``.pir`` text (characters, tokens and lines of the
  seeds of tests/ir/test_fuzz.py, plus literals, dtypes, dims, attribute values, dense
  literals, meshes and placements, deep nesting, huge shapes and splats, out-of-range
  literals for every dtype); accepted text must print and parse back, and small accepted
  graphs run on both executors and through fold-constants with the same results.
- ``onnx``: small valid models built with ``onnx.helper``, mutated field by field (dims,
  element types, raw data, attributes, names, opsets, op types and domains) or as bytes
  (truncated, bit-flipped), imported with ``partita.import_onnx``.
- ``api``: the public functions called with junk arguments of many types.
- ``graphs``: random valid graphs (``strategies.graphs``) through every optimization pass
  and both executors, and casts of extreme values through both executors and folding.
- ``cli``: ``partita`` commands on mutated files and bad flags, in process and as
  subprocesses.
- ``cluster``: mutated cluster TOML files (removed fields and tables, junk quantities,
  non-UTF-8 bytes, deep arrays), bad paths, ``Cluster.with_nodes`` and ``parse_quantity``;
  every accepted cluster must simulate a small program to a finite, positive step time.
- ``simulate``: ``partita simulate``/``cluster``/``calibrate`` command lines in process with
  bad model configs, meshes, pipeline flags, trace and output paths (calibrate never
  measures: reaching its measurement with a flag it must refuse is a violation).
- ``compile``: small integer and float programs under ``torch.compile(backend="partita")``
  on edge values, compared with eager dtype by dtype.
- ``pipeline``: ``partita.parallelize`` with bad and huge pipeline options.

Every case is deterministic in ``(seed, target, case number)``. A violation carries a
reproducer (text, model bytes, an argv, or a line of Python) and violations with the same
signature are counted together. tests/fuzz/test_campaign.py runs a bounded campaign;
tools/fuzz.py runs a long one.
"""

from __future__ import annotations

import base64
import contextlib
import io
import math
import os
import random
import re
import resource
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

_TESTS = Path(__file__).resolve().parent.parent
if str(_TESTS) not in sys.path:
    sys.path.insert(0, str(_TESTS))
REPO = _TESTS.parent

import numpy as np  # noqa: E402

import partita  # noqa: E402
from partita.ir import PartitaError  # noqa: E402

TARGETS = ("pir", "onnx", "api", "graphs", "cli", "cluster", "simulate", "compile", "pipeline")

# --- time limits ----------------------------------------------------------------------------


class CaseTimeout(BaseException):
    """A case ran past its time limit (a BaseException, so ``except Exception`` in the code
    under test cannot swallow it)."""


@contextlib.contextmanager
def time_limit(seconds: float):
    """Raise CaseTimeout in the main thread after ``seconds``. An outer timer (pytest-timeout's)
    is saved and re-armed with what is left of it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum, frame):
        raise CaseTimeout(f"ran past {seconds} s")

    old_handler = signal.signal(signal.SIGALRM, on_alarm)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    start = time.monotonic()
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:
            left = max(old_delay - (time.monotonic() - start), 0.001)
            signal.setitimer(signal.ITIMER_REAL, left, old_interval)


# --- counts and violations ------------------------------------------------------------------


@dataclass
class Violation:
    target: str
    kind: str          # crash, hang, unplaced-message, empty-message, roundtrip, mismatch, exit-code, traceback
    message: str
    reproducer: dict
    count: int = 1

    def render(self) -> str:
        lines = [f"[{self.target}] {self.kind} (x{self.count}): {self.message}"]
        for k, v in self.reproducer.items():
            lines.append(f"  {k}: {v!r}" if not isinstance(v, str) or "\n" not in v else f"  {k}:\n{v}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"target": self.target, "kind": self.kind, "message": self.message, "count": self.count,
                "reproducer": self.reproducer}


@dataclass
class Counts:
    target: str
    cases: int = 0
    accepted: int = 0
    clean: int = 0
    seconds: float = 0.0
    violations: dict[str, Violation] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)

    @property
    def n_violations(self) -> int:
        return sum(v.count for v in self.violations.values())

    def note(self, what: str) -> None:
        self.notes[what] = self.notes.get(what, 0) + 1

    def violate(self, signature: str, kind: str, message: str, reproducer: dict) -> None:
        sig = f"{kind}|{signature}"
        v = self.violations.get(sig)
        if v is None:
            self.violations[sig] = Violation(self.target, kind, message[:2000], reproducer)
        else:
            v.count += 1
            # Keep the smallest reproducer of a signature.
            if len(repr(reproducer)) < len(repr(v.reproducer)):
                v.reproducer, v.message = reproducer, message[:2000]

    def to_json(self) -> dict:
        return {"target": self.target, "cases": self.cases, "accepted": self.accepted, "clean_errors": self.clean,
                "violations": self.n_violations, "distinct_violations": len(self.violations),
                "seconds": round(self.seconds, 2), "notes": dict(sorted(self.notes.items())),
                "details": [v.to_json() for v in self.violations.values()]}


def _where(e: BaseException, line: bool = True) -> str:
    """The innermost frame of partita's own code (else the innermost frame) of a traceback:
    ``file:line`` (for messages) or ``file:function`` (for signatures, which must not move
    when someone edits the file)."""
    frames = traceback.extract_tb(e.__traceback__)
    mine = [f for f in frames if "/partita/" in f.filename.replace("\\", "/")]
    f = (mine or frames or [None])[-1]
    if f is None:
        return "?"
    name = f.filename.replace("\\", "/")
    name = name[name.rfind("/partita/") + 1:] if "/partita/" in name else os.path.basename(name)
    return f"{name}:{f.lineno}" if line else f"{name}:{f.name}"


def _entry_where(e: BaseException) -> str:
    """``file:function`` of the outermost frame of partita below its command line and its
    public functions (``partita/models/gpt.py:gpt`` for a command stuck building a model):
    where a hang entered partita's work, stable however deep it was stopped."""
    for f in traceback.extract_tb(e.__traceback__):
        name = f.filename.replace("\\", "/")
        if "/partita/" not in name:
            continue
        name = name[name.rfind("/partita/") + 1:]
        if not name.startswith("partita/cli/") and name != "partita/__init__.py":
            return f"{name}:{f.name}"
    return _where(e, False)


_PLACE = re.compile(r"[\w./<>-]+:\d+:\d+|[%@][\w.]+")


def names_place(msg: str, places: Iterable[str] = ()) -> bool:
    """Whether an error message says where: a file:line:col, a %value or @graph, or one of
    ``places`` (the file, argument or function names of the case)."""
    return bool(_PLACE.search(msg)) or any(p and p in msg for p in places)


def attempt(counts: Counts, fn: Callable[[], Any], reproducer: dict, places: Iterable[str] = (),
            timeout: float = 10.0, hang_where: bool = False) -> tuple[str, Any]:
    """Run one case: ('ok', value), ('error', PartitaError) or ('violation', exception).
    Counts a clean error; records a violation for anything else (and for an error message
    that is empty or does not say where). A hang's signature is the call, or with
    ``hang_where`` the function of partita it was stopped in."""
    try:
        with time_limit(timeout):
            value = fn()
    except CaseTimeout as e:
        sig = f"CaseTimeout@{_where(e, False)}" if hang_where else (reproducer.get("call", "") or "hang")
        counts.violate(sig, "hang", f"no answer within {timeout} s" + (f" (stopped at {_where(e)})" if hang_where
                                                                         else ""), reproducer)
        return "violation", None
    except PartitaError as e:
        msg = str(e)
        if not msg.strip():
            counts.violate(type(e).__name__ + _where(e, False), "empty-message", f"{type(e).__name__} with no message",
                           reproducer)
            return "violation", e
        if not names_place(msg, places):
            counts.violate(f"{type(e).__name__}@{_where(e, False)}", "unplaced-message",
                           f"{type(e).__name__} names no place (expected a file:line:col, %value, or one of "
                           f"{sorted(set(p for p in places if p))}): {msg}", reproducer)
            return "violation", e
        counts.clean += 1
        return "error", e
    except (Exception, RecursionError, MemoryError) as e:  # noqa: BLE001  (the point of the campaign)
        counts.violate(f"{type(e).__name__}@{_where(e, False)}", "crash",
                       f"{type(e).__name__} at {_where(e)}: {str(e)[:500]}", reproducer)
        return "violation", e
    return "ok", value


# --- comparing outputs ----------------------------------------------------------------------

_TOL = {"f64": (1e-9, 1e-12), "f32": (1e-4, 1e-5), "f16": (1e-2, 1e-3), "bf16": (2e-2, 1e-2)}


def to_numpy(x: Any) -> np.ndarray:
    """An output as a NumPy array: a torch tensor through the torch executor's own conversion
    (bf16 and float8 included), anything else through ``np.asarray``."""
    if hasattr(x, "detach"):
        from partita.backend.torch_exec import to_numpy as torch_to_numpy

        return torch_to_numpy(x)
    return np.asarray(x)


def compare(a: Any, b: Any, dtype_name: str) -> str | None:
    """None if two outputs agree (floats within the dtype's tolerance, NaN at the same places,
    infinities equal; other dtypes exactly), else what differs."""
    a, b = to_numpy(a), to_numpy(b)
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    if a.dtype.kind in "biu" and b.dtype.kind in "biu":
        if not np.array_equal(a, b):
            return f"values differ: {a.ravel()[:8]} vs {b.ravel()[:8]}"
        return None
    try:
        x, y = a.astype(np.float64), b.astype(np.float64)
    except (TypeError, ValueError):
        return None if np.array_equal(a, b) else "values differ"
    nx, ny = np.isnan(x), np.isnan(y)
    if not np.array_equal(nx, ny):
        return f"NaN at different places: {a.ravel()[:8]} vs {b.ravel()[:8]}"
    rtol, atol = _TOL.get(dtype_name, (0.13, 1e-3))  # storage floats: one step of the mantissa
    x, y = x[~nx], y[~ny]
    inf = np.isinf(x) | np.isinf(y)
    if not np.array_equal(x[inf], y[inf]):
        return f"infinities differ: {a.ravel()[:8]} vs {b.ravel()[:8]}"
    if not np.allclose(x[~inf], y[~inf], rtol=rtol, atol=atol):
        return f"values differ beyond rtol={rtol}, atol={atol}: {a.ravel()[:8]} vs {b.ravel()[:8]}"
    return None


def compare_all(got: Sequence[Any], want: Sequence[Any], graph: Any) -> str | None:
    if len(got) != len(want):
        return f"{len(got)} outputs vs {len(want)}"
    # The tolerance of the least precise float dtype in the graph: an f64 output computed
    # from f16 values carries f16's rounding.
    floats = {r.type.dtype.name for n in graph.nodes for r in n.results} | {v.type.dtype.name for v in graph.inputs}
    order = ["f64", "f32", "bf16", "f16"]
    worst = max((order.index(f) for f in floats if f in order), default=0)
    for i, (a, b) in enumerate(zip(got, want)):
        dtype_name = graph.outputs[i].type.dtype.name if i < len(graph.outputs) else "f32"
        if dtype_name in order:
            dtype_name = order[max(order.index(dtype_name), worst)]
        d = compare(a, b, dtype_name)
        if d:
            return f"output {i} ({dtype_name}): {d}"
    return None


def small_inputs(graph: Any, seed: int) -> dict[str, np.ndarray]:
    """Random arrays for the graph's inputs of role ``input`` (params and state come from the
    graph's weights, or random when it has none), as strategies.random_inputs makes them."""
    from strategies import random_inputs

    arrays = random_inputs(graph, seed)
    return {k: v for k, v in arrays.items() if k not in graph.weights}


def numel_of(graph: Any) -> int:
    total = 0
    for v in list(graph.inputs) + [r for n in graph.nodes for r in n.results]:
        total += int(np.prod(v.type.shape, dtype=object))
    return total


# --- target: .pir text ----------------------------------------------------------------------

DTYPE_NAMES = ("bool", "u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64", "f16", "bf16", "f32", "f64",
               "f8e4m3fn", "f8e4m3fnuz", "f8e5m2", "f8e5m2fnuz", "f8e8m0", "f4e2m1", "i4", "u4", "i2", "u2")
_INT_RANGE = {"u8": (0, 255), "u16": (0, 2**16 - 1), "u32": (0, 2**32 - 1), "u64": (0, 2**64 - 1),
              "i8": (-128, 127), "i16": (-2**15, 2**15 - 1), "i32": (-2**31, 2**31 - 1), "i64": (-2**63, 2**63 - 1),
              "i4": (-8, 7), "u4": (0, 15), "i2": (-2, 1), "u2": (0, 3), "bool": (0, 1)}
_FLOAT_MAX = {"f16": 65504.0, "bf16": 3.3895e38, "f32": 3.4028235e38, "f64": 1.7976931348623157e308,
              "f8e4m3fn": 448.0, "f8e4m3fnuz": 240.0, "f8e5m2": 57344.0, "f8e5m2fnuz": 57344.0,
              "f8e8m0": 1.7e38, "f4e2m1": 6.0}
EXTREME_LITERALS = ("0", "-0", "1", "-1", "255", "256", "-129", "128", "65535", "65536", "-32769",
                    "2147483648", "-2147483649", "4294967296", "9223372036854775807", "9223372036854775808",
                    "-9223372036854775809", "18446744073709551616", "99999999999999999999999999999", "1e400",
                    "-1e400", "1e39", "3.5e38", "65505.0", "65520.0", "449.0", "241.0", "57345.0", "6.5", "7.0",
                    "0.3", "1e-50", "-0.0", "nan", "inf", "-inf", "0.5", "1.5", "-8", "-9", "15", "16", "-2",
                    "-3", "3", "4", "true", "false", "none", '"s"', "1" * 400, "0." + "0" * 300 + "1")
HUGE_DIMS = ("0", "1", "100000", "2147483647", "2147483648", "4294967296", "9223372036854775807",
             "9223372036854775808", "99999999999999999999999", "1" * 60)
NESTING = (3, 40, 1000, 50000, 300000)

LITERALS_SEED = """graph @lit(%x: f32[2,2], %n: i32[2]) -> (f32[2,2], i4[3], u8[2], i32[2]) {
  %a = constant() {value=dense<i4[3], [-8, 0, 7]>} : i4[3]
  %b = constant() {value=dense<u4[2], [0, 15]>} : u4[2]
  %c = constant() {value=dense<i2[2], [-2, 1]>} : i2[2]
  %d = constant() {value=dense<u2[2], 3>} : u2[2]
  %e = constant() {value=dense<f8e4m3fn[2], [448.0, -0.5]>} : f8e4m3fn[2]
  %f = full() {value=255, shape=[2], dtype=u8} : u8[2]
  %g = full() {value=1.5, shape=[2,2]} : f32[2,2]
  %h = add(%x, %g) : f32[2,2]
  %k = cast(%h) {dtype=i8} : i8[2,2]
  %m = cast(%k) {dtype=f32} : f32[2,2]
  %p = cast(%e) {dtype=f32} : f32[2]
  %q = cast(%p) {dtype=i32} : i32[2]
  %r = add(%n, %q) : i32[2]
  return %m, %a, %f, %r
}
"""

OPS_SEED = """graph @ops(%x: f32[2,3,4], %y: f32[4,5] param) -> (f32[2,3,5], f32[2,5]) {
  %0 = matmul(%x, %y) : f32[2,3,5]
  %1 = sum(%0) {axes=[1]} : f32[2,5]
  %2 = transpose(%0) {perm=[0, 2, 1]} : f32[2,5,3]
  %3 = reshape(%2) {shape=[10, 3]} : f32[10,3]
  %4 = slice(%3) {axis=0, start=1, end=9, step=2} : f32[4,3]
  %5 = concat(%4, %4) {axis=1} : f32[4,6]
  %6 = softmax(%5) {axis=-1} : f32[4,6]
  %7 = relu(%0) : f32[2,3,5]
  return %7, %1
}
"""


def _pir_seeds() -> tuple[list[str], list[str], Any]:
    from ir.test_fuzz import SEEDS, VOCAB, _TOKEN

    return list(SEEDS) + [LITERALS_SEED, OPS_SEED], list(VOCAB), _TOKEN


@contextlib.contextmanager
def ir_test_ops_registered():
    """The test-only ops of tests/ir/conftest.py (one attribute of every kind, one with
    several results), which some seeds use; removed afterwards."""
    from ir.conftest import _make_test_ops
    from partita.ops.registry import OPS

    added = []
    for op in _make_test_ops():
        if op.name not in OPS:
            OPS[op.name] = op
            added.append(op.name)
    try:
        yield
    finally:
        for name in added:
            OPS.pop(name, None)


def _literal_for(rng: random.Random, dtype: str) -> str:
    """A literal at or just past the edge of ``dtype``'s range, or an odd one."""
    r = rng.random()
    if r < 0.35 and dtype in _INT_RANGE:
        lo, hi = _INT_RANGE[dtype]
        return str(rng.choice((lo, hi, lo - 1, hi + 1, lo - 2**rng.randint(1, 70), hi + 2**rng.randint(1, 70))))
    if r < 0.6 and dtype in _FLOAT_MAX:
        m = _FLOAT_MAX[dtype]
        return repr(float(rng.choice((m, -m, m * 1.0001, m * 2, m * 1e10, m / 3, 1e-45, 2.0**-127))))
    return rng.choice(EXTREME_LITERALS)


def _shape_text(rng: random.Random, huge: bool) -> str:
    n = rng.randint(0, 4)
    dims = [rng.choice(HUGE_DIMS) if huge and rng.random() < 0.5 else str(rng.randint(0, 3)) for _ in range(n)]
    return ",".join(dims)


def _nested(depth: int, leaf: str) -> str:
    return "[" * depth + leaf + "]" * depth


def _constant_line(name: str, dt: str, shape: str, lit: str) -> str:
    """A ``constant`` of the dense literal ``lit``, as a line of a graph body."""
    return f"  %{name} = constant() {{value=dense<{dt}[{shape}], {lit}>}} : {dt}[{shape}]"


def _full_line(name: str, lit: str, shape: str, dt: str | None = None) -> str:
    """A ``full`` of ``lit`` (of ``dt``; f32 with no dtype attribute when None), as a line."""
    dtype = f", dtype={dt}" if dt else ""
    return f"  %{name} = full() {{value={lit}, shape=[{shape}]{dtype}}} : {dt or 'f32'}[{shape}]"


def _insert_before_return(text: str, line: str) -> str:
    i = text.rfind("  return")
    if i < 0:
        return text + line
    return text[:i] + line + "\n" + text[i:]


_NUMBER = re.compile(r"(?<![\w.%@])-?(?:\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\.\d+(?:[eE][-+]?\d+)?|\d+)(?![\w.])")
_DTYPE_TOK = re.compile(r"\b(?:" + "|".join(sorted(DTYPE_NAMES, key=len, reverse=True)) + r")\b")
_DIM = re.compile(r"(?<=[\[,])\d+(?=[\],@])")
_ATTR_VALUE = re.compile(r"(?<=[{,] )?\b([a-z_]+)=([^,}]+)")
ATTR_VALUES = ("1", "-1", "0.5", "nan", "-inf", "true", "none", '"x"', '""', "f32", "i4", "[]", "[1, 2]", "[[1]]",
               "[1, 2.5]", "[true]", '["a"]', "[none]", "dense<f32[2], 1.0>", "dense<f32[], nan>",
               "dense<i4[2], [7, 8]>", "dense<u2[1], 4>", "dense<bool[1], 2>", "dense<f8e5m2[1], 1e9>",
               "dense<f32[2], [1.0]>", "dense<f32[2], [[1.0, 2.0]]>", "9223372036854775808", "-9223372036854775809",
               "1e400", "[" * 200 + "]" * 200, '"\\ud800"', '"\\u0000"')
MESH_TEXTS = (" mesh(dp=2)", " mesh(dp=0)", " mesh(dp=-1)", " mesh(dp=2, dp=2)", " mesh(tp=99999999999999999999)",
              " mesh()", " mesh(dp=2, tp=2)", " mesh(dp=1.5)", " mesh(9=2)", " mesh(dp=2,)", " mesh(dp)",
              " mesh(" + ", ".join(f"a{i}=2" for i in range(70)) + ")", " mesh(dp=4294967296, tp=4294967296)")
PLACEMENTS = ("@dp", "@tp", "@dp@tp", "@dp@dp", "@xp", "@", "@0", " partial(dp)", " partial(dp, dp)",
              " partial()", " partial(zz)")


def mutate_pir(rng: random.Random, text: str, vocab: Sequence[str], token_re: Any) -> tuple[str, str]:
    """One mutation of ``text``; returns (new text, the mutation's name)."""
    kind = rng.choice(("del_char", "ins_char", "rep_char", "del_tok", "ins_tok", "rep_tok", "swap_lines",
                       "dup_line", "del_line", "truncate",
                       "literal", "literal", "dtype", "dtype", "dim", "dim", "attr", "attr", "nest", "nest",
                       "splat", "range", "range", "full", "cast", "mesh", "placement"))
    if not text:
        return text, kind
    lines = text.split("\n")
    i = rng.randrange(len(text))

    def pick(regex):
        ms = list(regex.finditer(text))
        return rng.choice(ms) if ms else None

    if kind in ("del_char", "ins_char", "rep_char"):
        ch = chr(rng.choice((rng.randrange(0x20, 0x7f), rng.randrange(0, 0x300), 0, 0x663, 0xe9, 0x2028)))
        if kind == "del_char":
            return text[:i] + text[i + 1:], kind
        return text[:i] + ch + text[i + (kind == "rep_char"):], kind
    if kind in ("del_tok", "ins_tok", "rep_tok"):
        toks = [m.span() for m in token_re.finditer(text)]
        a, b = rng.choice(toks)
        if kind == "del_tok":
            return text[:a] + text[b:], kind
        return text[:a] + rng.choice(vocab) + text[b if kind == "rep_tok" else a:], kind
    if kind == "swap_lines":
        x, y = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[x], lines[y] = lines[y], lines[x]
        return "\n".join(lines), kind
    if kind == "dup_line":
        x = rng.randrange(len(lines))
        lines.insert(x, lines[x])
        return "\n".join(lines), kind
    if kind == "del_line":
        del lines[rng.randrange(len(lines))]
        return "\n".join(lines), kind
    if kind == "truncate":
        return text[:i], kind
    if kind == "literal":
        m = pick(_NUMBER)
        if m:
            return text[:m.start()] + rng.choice(EXTREME_LITERALS + tuple(_literal_for(rng, d) for d in ("i4", "u8"))) \
                + text[m.end():], kind
    if kind == "dtype":
        m = pick(_DTYPE_TOK)
        if m:
            return text[:m.start()] + rng.choice(DTYPE_NAMES) + text[m.end():], kind
    if kind == "dim":
        m = pick(_DIM)
        if m:
            return text[:m.start()] + rng.choice(HUGE_DIMS) + text[m.end():], kind
    if kind == "attr":
        ms = [m for m in _ATTR_VALUE.finditer(text) if "{" in text[max(0, m.start() - 200):m.start()]]
        if ms:
            m = rng.choice(ms)
            return text[:m.start(2)] + rng.choice(ATTR_VALUES) + text[m.end(2):], kind
    if kind == "nest":
        depth = rng.choice(NESTING)
        where = rng.random()
        if where < 0.4:
            line = _constant_line("zn", "f32", "1", _nested(depth, "1.0"))
        elif where < 0.7:
            line = f"  %zn = sum(%{_first_input(text)}) {{axes={_nested(depth, '0')}}} : f32[]"
        else:
            line = _full_line("zn", _nested(depth, "1"), "1")
        return _insert_before_return(text, line), kind
    if kind == "splat":
        dt = rng.choice(DTYPE_NAMES)
        shape = _shape_text(rng, huge=True)
        op = rng.choice(("constant", "full"))
        lit = _literal_for(rng, dt) if rng.random() < 0.3 else ("true" if dt == "bool" else "1")
        line = _constant_line("zs", dt, shape, lit) if op == "constant" else _full_line("zs", lit, shape, dt)
        return _insert_before_return(text, line), kind
    if kind == "range":
        dt = rng.choice(DTYPE_NAMES)
        n = rng.randint(0, 3)
        lits = [_literal_for(rng, dt) for _ in range(max(n, 1))]
        lit = lits[0] if n == 0 else "[" + ", ".join(lits[:n]) + "]"
        shape = "" if n == 0 else str(n)
        line = _constant_line("zr", dt, shape, lit)
        return _insert_before_return(text, line), kind
    if kind == "full":
        dt = rng.choice(DTYPE_NAMES)
        line = _full_line("zf", _literal_for(rng, dt), "2", dt)
        return _insert_before_return(text, line), kind
    if kind == "cast":
        src, dst = rng.choice(DTYPE_NAMES), rng.choice(DTYPE_NAMES)
        lit = _literal_for(rng, dst) if rng.random() < 0.7 else _literal_for(rng, src)
        attrs = rng.choice(("", ", saturate=false", ", round_mode=\"down\"", ", round_mode=\"nearest\"",
                            ", saturate=1", ", round_mode=\"sideways\""))
        body = _constant_line("zc0", src, "1", f"[{lit}]") + f"\n  %zc1 = cast(%zc0) {{dtype={dst}{attrs}}} : {dst}[1]"
        return _insert_before_return(text, body), kind
    if kind == "mesh":
        m = re.search(r" mesh\([^)]*\)", text)
        new = rng.choice(MESH_TEXTS)
        if m:
            return text[:m.start()] + new + text[m.end():], kind
        j = text.find(" {\n")
        if j >= 0:
            return text[:j] + new + text[j:], kind
    if kind == "placement":
        m = pick(_DIM)
        if m:
            p = rng.choice(PLACEMENTS)
            if p.startswith(" partial"):
                k = text.find("]", m.end())
                return text[:k + 1] + p + text[k + 1:], kind
            return text[:m.end()] + p + text[m.end():], kind
    # The structural mutation found nothing to work on: a generic one instead.
    return mutate_pir(rng, text, vocab, token_re)


def _first_input(text: str) -> str:
    m = re.search(r"\(%([\w.]+)", text)
    return m.group(1) if m else "x"


def check_pir_text(counts: Counts, text: str, run_small: bool = True, timeout: float = 10.0) -> None:
    """One case of the ``pir`` target (also used by tests to replay a reproducer)."""
    from partita.ir import parse, print_graph, verify

    counts.cases += 1
    repro = {"text": text}
    status, g = attempt(counts, lambda: verify(parse(text, "fuzz.pir")), repro, ("fuzz.pir",), timeout)
    if status != "ok":
        return
    counts.accepted += 1

    def roundtrip():
        printed = print_graph(g)
        g2 = verify(parse(printed, "printed.pir"))
        again = print_graph(g2)
        if again != printed:
            return f"print -> parse -> print changes the text:\n{printed}\nvs\n{again}"
        return None

    status, diff = attempt(counts, roundtrip, repro, ("printed.pir",), timeout)
    if status == "error":
        counts.clean -= 1
        counts.violate(_where(diff, False), "roundtrip", f"accepted text does not survive print -> parse: {diff}", repro)
        return
    if status == "ok" and diff:
        counts.violate(diff.split("\n")[0], "roundtrip", diff, repro)
        return
    if run_small and g.mesh is None and numel_of(g) <= 20000:
        check_executors(counts, g, repro, timeout, passes=("fold-constants",))


def _run(graph: Any, inputs: dict, backend: str) -> list:
    return partita.run(graph, inputs, backend=backend)


def check_executors(counts: Counts, g: Any, repro: dict, timeout: float, passes: Sequence[str] = ()) -> None:
    """Both executors on the same random inputs agree, and so does the graph after each of
    ``passes``; a clean error from an executor is allowed (u64 ops on torch, say)."""
    from partita.ir import parse, print_graph
    from partita.passes import PassManager

    text = print_graph(g)
    seed = zlib.crc32(text.encode())
    try:
        inputs = small_inputs(g, seed)
    except Exception:  # noqa: BLE001  (dtypes random_inputs cannot make)
        counts.note("inputs-not-made")
        return
    ref_repro = dict(repro, inputs_seed=seed)
    status, ref = attempt(counts, lambda: _run(g, inputs, "numpy"), dict(ref_repro, backend="numpy"), (), timeout)
    if status != "ok":
        return
    status, got = attempt(counts, lambda: _run(g, inputs, "torch"), dict(ref_repro, backend="torch"), (), timeout)
    if status == "ok":
        d = compare_all(got, ref, g)
        if d:
            counts.violate(_mismatch_sig("torch", g, d), "mismatch", f"torch vs numpy: {d}",
                           dict(ref_repro, graph=text, compare="torch vs numpy"))
    for name in passes:
        def optimized(name=name):
            return PassManager.parse(name, reproducer_dir=None).run(parse(text, "fuzz.pir"))

        status, out = attempt(counts, optimized, dict(ref_repro, graph=text, passes=name), tuple(name.split(",")),
                              timeout)
        if status == "error":
            # A pass that keeps meaning must take every verified graph: its error is a bug.
            counts.clean -= 1
            counts.violate(f"{name}|{type(out).__name__}@{_where(out, False)}", "pass-failed",
                           f"{name} fails on a verified graph: {str(out)[:600]}", dict(ref_repro, graph=text, passes=name))
        if status != "ok":
            continue
        if [v.name for v in out.inputs] != [v.name for v in g.inputs]:
            counts.note(f"{name}: inputs renamed, not compared")
            continue
        out.weights = g.weights
        status, after = attempt(counts, lambda: _run(out, inputs, "numpy"), dict(ref_repro, passes=name), (), timeout)
        if status == "ok":
            d = compare_all(after, ref, g)
            if d:
                counts.violate(_mismatch_sig(name, g, d), "mismatch", f"{name} changes the numpy result: {d}",
                               dict(ref_repro, graph=text, passes=name, after=print_graph(out)))


def _mismatch_sig(what: str, g: Any, d: str) -> str:
    ops = sorted({n.op for n in g.nodes})
    return f"{what}|{','.join(ops)}|{re.sub(r'[-0-9.e+]+', '#', d.split(':')[0])}"


def target_pir(seed: int = 0, cases: int | None = 100, seconds: float | None = None,
               timeout: float = 10.0) -> Counts:
    counts = Counts("pir")
    seeds, vocab, token_re = _pir_seeds()
    start = time.monotonic()
    with ir_test_ops_registered():
        for i in _case_numbers(cases, seconds, start):
            rng = random.Random(f"{seed}:pir:{i}")
            text = rng.choice(seeds)
            for _ in range(rng.randint(1, 3)):
                text, _kind = mutate_pir(rng, text, vocab, token_re)
            check_pir_text(counts, text, timeout=timeout)
    counts.seconds = time.monotonic() - start
    return counts


def _case_numbers(cases: int | None, seconds: float | None, start: float):
    i = 0
    while (cases is None or i < cases) and (seconds is None or time.monotonic() - start < seconds):
        yield i
        i += 1


# --- target: ONNX models --------------------------------------------------------------------


def onnx_models() -> list[Any]:
    """Small valid models over several op types the importer claims."""
    import onnx
    from onnx import TensorProto as T
    from onnx import helper as h
    from onnx import numpy_helper as nh

    def model(name, nodes, inputs, outputs, inits=(), opset=17):
        graph = h.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
        m = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])
        m.ir_version = 8
        onnx.checker.check_model(m)
        return m

    vi = h.make_tensor_value_info
    f = np.float32
    rng = np.random.default_rng(0)
    out = [
        model("add_relu", [h.make_node("Add", ["x", "y"], ["s"], name="add0"),
                           h.make_node("Relu", ["s"], ["z"], name="relu0")],
              [vi("x", T.FLOAT, [2, 3]), vi("y", T.FLOAT, [2, 3])], [vi("z", T.FLOAT, [2, 3])]),
        model("gemm_softmax", [h.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
                               h.make_node("Add", ["m", "b"], ["a"], name="bias"),
                               h.make_node("Softmax", ["a"], ["z"], name="sm", axis=-1)],
              [vi("x", T.FLOAT, [2, 3])], [vi("z", T.FLOAT, [2, 4])],
              [nh.from_array(rng.standard_normal((3, 4)).astype(f), "w"), nh.from_array(np.ones(4, f), "b")]),
        model("reshape_cast", [h.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
                               h.make_node("Transpose", ["r"], ["t"], name="tr", perm=[1, 0]),
                               h.make_node("Cast", ["t"], ["z"], name="cast", to=T.INT32)],
              [vi("x", T.FLOAT, [2, 3])], [vi("z", T.INT32, [2, 3])],
              [nh.from_array(np.array([3, 2], np.int64), "shape")]),
        model("conv_pool", [h.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1],
                                        kernel_shape=[3, 3]),
                            h.make_node("MaxPool", ["c"], ["z"], name="pool", kernel_shape=[2, 2], strides=[2, 2])],
              [vi("x", T.FLOAT, [1, 1, 4, 4])], [vi("z", T.FLOAT, [1, 2, 2, 2])],
              [nh.from_array(rng.standard_normal((2, 1, 3, 3)).astype(f), "w")]),
        model("concat_slice_sum", [h.make_node("Concat", ["x", "x"], ["c"], name="cat", axis=0),
                                   h.make_node("Slice", ["c", "st", "en"], ["s"], name="slice"),
                                   h.make_node("ReduceSum", ["s", "ax"], ["z"], name="rsum", keepdims=1)],
              [vi("x", T.FLOAT, [2, 3])], [vi("z", T.FLOAT, [1, 3])],
              [nh.from_array(np.array([1], np.int64), "st"), nh.from_array(np.array([3], np.int64), "en"),
               nh.from_array(np.array([0], np.int64), "ax")]),
        model("gather_where", [h.make_node("Gather", ["table", "i"], ["g"], name="gather", axis=0),
                               h.make_node("Greater", ["g", "zero"], ["p"], name="gt"),
                               h.make_node("Where", ["p", "g", "zero"], ["z"], name="where")],
              [vi("i", T.INT64, [2])], [vi("z", T.FLOAT, [2, 3])],
              [nh.from_array(rng.standard_normal((5, 3)).astype(f), "table"), nh.from_array(np.zeros((), f), "zero")]),
        model("const_expand", [h.make_node("ConstantOfShape", ["shp"], ["c"], name="cos",
                                           value=nh.from_array(np.array([2.5], f))),
                               h.make_node("Expand", ["c", "shp2"], ["e"], name="expand"),
                               h.make_node("Mul", ["e", "x"], ["z"], name="mul")],
              [vi("x", T.FLOAT, [2, 3])], [vi("z", T.FLOAT, [2, 3])],
              [nh.from_array(np.array([1, 3], np.int64), "shp"), nh.from_array(np.array([2, 3], np.int64), "shp2")]),
        model("layernorm_gemm", [h.make_node("LayerNormalization", ["x", "g", "b"], ["n"], name="ln", axis=-1,
                                             epsilon=1e-5),
                                 h.make_node("Gemm", ["n", "w", "b2"], ["z"], name="gemm", transB=1, alpha=0.5)],
              [vi("x", T.FLOAT, [2, 3])], [vi("z", T.FLOAT, [2, 4])],
              [nh.from_array(np.ones(3, f), "g"), nh.from_array(np.zeros(3, f), "b"),
               nh.from_array(rng.standard_normal((4, 3)).astype(f), "w"), nh.from_array(np.ones(4, f), "b2")]),
        model("constant_cast_f16", [h.make_node("Constant", [], ["k"], name="k",
                                                value=nh.from_array(np.array([1.0, -2.0, 300.0], f))),
                                    h.make_node("Cast", ["k"], ["c"], name="c8", to=T.FLOAT16),
                                    h.make_node("Cast", ["x"], ["xh"], name="xh", to=T.FLOAT16),
                                    h.make_node("Add", ["xh", "c"], ["z"], name="add")],
              [vi("x", T.FLOAT, [3])], [vi("z", T.FLOAT16, [3])]),
    ]
    return out


_DTYPE_CODES = tuple(range(-2, 28)) + (40, 2**20, 2**31 - 1)


def mutate_onnx(rng: random.Random, m: Any) -> str:
    """Mutate ModelProto ``m`` in place, one structural field; returns what was done."""
    g = m.graph
    kind = rng.choice(("dim", "dim", "elem_type", "init_dtype", "raw_data", "raw_data", "init_dims", "attr",
                       "attr", "attr_type", "name", "name", "opset", "op_type", "domain", "drop_node", "dup_node",
                       "ir_version", "drop_output", "drop_attr", "typed_data"))
    vis = list(g.input) + list(g.output)
    if kind == "dim":
        v = rng.choice(vis)
        dims = v.type.tensor_type.shape.dim
        if dims:
            d = rng.choice(dims)
            choice = rng.random()
            if choice < 0.2:
                d.dim_param = rng.choice(("N", "", "batch size", "?"))
            elif choice < 0.3:
                d.Clear()
            else:
                d.dim_value = rng.choice((0, 1, 7, -1, -5, 2**31, 2**40, 2**62, 2**63 - 1))
        else:
            v.type.tensor_type.shape.dim.add().dim_value = rng.choice((0, 3, 2**40))
        return f"dim of {v.name}"
    if kind == "elem_type":
        v = rng.choice(vis)
        v.type.tensor_type.elem_type = rng.choice(_DTYPE_CODES)
        return f"elem_type of {v.name}"
    inits = list(g.initializer)
    consts = [a.t for n in g.node for a in n.attribute if a.type == a.TENSOR]
    tensors = inits + consts
    if kind == "init_dtype" and tensors:
        t = rng.choice(tensors)
        t.data_type = rng.choice(_DTYPE_CODES)
        return f"data_type of {t.name}"
    if kind == "raw_data" and tensors:
        t = rng.choice(tensors)
        raw = bytes(t.raw_data)
        c = rng.random()
        if c < 0.3:
            t.raw_data = raw[:rng.randrange(len(raw) + 1)] if raw else b"\x01"
        elif c < 0.6:
            t.raw_data = raw + bytes(rng.randrange(1, 9))
        elif c < 0.8:
            t.raw_data = b""
        else:
            t.raw_data = bytes(rng.randrange(256) for _ in range(len(raw)))
        return f"raw_data of {t.name}"
    if kind == "init_dims" and tensors:
        t = rng.choice(tensors)
        dims = list(t.dims)
        c = rng.random()
        if c < 0.3 or not dims:
            dims.append(rng.choice((0, 1, 2, 2**40)))
        elif c < 0.6:
            dims[rng.randrange(len(dims))] = rng.choice((-1, 0, 5, 2**31, 2**62))
        else:
            dims.pop()
        del t.dims[:]
        t.dims.extend(dims)
        return f"dims of {t.name}"
    if kind == "typed_data" and tensors:
        t = rng.choice(tensors)
        t.raw_data = b""
        if rng.random() < 0.5:
            t.float_data.extend([1.0] * rng.randint(0, 9))
        else:
            t.int64_data.extend([rng.choice((0, -1, 2**62, 300))] * rng.randint(0, 9))
        return f"typed data of {t.name}"
    nodes = list(g.node)
    if not nodes:
        g.node.add().op_type = rng.choice(("Relu", "Identity", ""))
        return "a node without inputs or outputs"
    n = rng.choice(nodes)
    if kind in ("attr", "attr_type", "drop_attr") and n.attribute:
        a = rng.choice(list(n.attribute))
        if kind == "attr_type":
            a.type = rng.choice((0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 14))
        elif kind == "drop_attr":
            n.attribute.remove(a)
        elif a.type == a.INT:
            a.i = rng.choice((-2**63, -100, -1, 0, 1, 5, 100, 2**62))
        elif a.type == a.FLOAT:
            a.f = rng.choice((float("nan"), float("inf"), -1.0, 0.0, 1e38))
        elif a.type == a.INTS:
            vals = [rng.choice((-2**63, -5, -1, 0, 1, 3, 2**40)) for _ in range(rng.randint(0, 6))]
            del a.ints[:]
            a.ints.extend(vals)
        elif a.type == a.TENSOR:
            a.t.data_type = rng.choice(_DTYPE_CODES)
        else:
            a.s = b"\xff\xfe"
        return f"attribute {a.name} of {n.name}"
    if kind == "attr":
        from onnx import helper as h
        n.attribute.append(h.make_attribute(rng.choice(("axis", "perm", "to", "junk", "kernel_shape")),
                                            rng.choice((3, -9, [1, 2, 3], 1.5, "s", [0.5]))))
        return f"extra attribute on {n.name}"
    if kind == "name":
        names = [v.name for v in vis] + [x for nd in nodes for x in list(nd.input) + list(nd.output)]
        new = rng.choice(names + ["", "missing", "x" * 300, "a b", "%x"])
        c = rng.random()
        if c < 0.4 and n.input:
            n.input[rng.randrange(len(n.input))] = new
        elif c < 0.7 and n.output:
            n.output[rng.randrange(len(n.output))] = new
        elif c < 0.85:
            rng.choice(vis).name = new
        else:
            n.name = new
        return f"a name in {n.name}"
    if kind == "opset":
        op = m.opset_import[0]
        op.version = rng.choice((-1, 0, 1, 7, 12, 13, 18, 21, 22, 23, 24, 99, 2**40))
        if rng.random() < 0.2:
            m.opset_import.add(domain="ai.onnx.ml", version=rng.choice((1, 99)))
        return "opset"
    if kind == "op_type":
        from partita.frontend.onnx import ONNX_TO_PARTITA
        n.op_type = rng.choice(sorted(ONNX_TO_PARTITA) + ["Junk", "", "relu", "LSTM", "If", "Loop"])
        return f"op_type of {n.name}"
    if kind == "domain":
        n.domain = rng.choice(("com.microsoft", "ai.onnx.ml", "junk", "ai.onnx"))
        return f"domain of {n.name}"
    if kind == "drop_node":
        g.node.remove(n)
        return f"removed {n.name}"
    if kind == "dup_node":
        g.node.append(n)
        return f"duplicated {n.name}"
    if kind == "ir_version":
        m.ir_version = rng.choice((0, 1, 3, 11, 99))
        return "ir_version"
    if kind == "drop_output" and len(g.output):
        del g.output[:]
        return "no outputs"
    return "nothing"


def check_onnx_bytes(counts: Counts, data: bytes, what: str, tmp: Path, timeout: float = 10.0,
                     run_small: bool = True) -> None:
    """One case of the ``onnx`` target: import the model file ``data``."""
    counts.cases += 1
    path = tmp / "fuzz.onnx"
    path.write_bytes(data)
    repro = {"mutation": what, "model_b64": base64.b64encode(data).decode()}
    died = _dies_in_shape_inference(data)
    if died:
        # import_onnx would take this process down with it: record it, do not run it here.
        counts.violate(f"shape-inference|{died}", "abort",
                       f"import_onnx kills the process ({died}) in onnx.shape_inference.infer_shapes", repro)
        return
    status, g = attempt(counts, lambda: partita.verify(partita.import_onnx(str(path))), repro,
                        (str(path), "fuzz.onnx"), timeout)
    if status != "ok":
        return
    counts.accepted += 1
    if run_small and numel_of(g) <= 20000:
        check_executors(counts, g, repro, timeout, passes=("canonicalize,cse,fold-constants,dce",))


def _dies_in_shape_inference(data: bytes) -> str | None:
    """Whether ONNX's shape inference (which import_onnx runs, in C++) kills the process on
    this model: tried in a forked child. None if it returns or raises; else the signal."""
    if not hasattr(os, "fork"):
        return None
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            import onnx

            proto = onnx.ModelProto()
            proto.ParseFromString(data)
            onnx.shape_inference.infer_shapes(proto, strict_mode=False)
        except BaseException:  # noqa: BLE001  (an exception is not what this looks for)
            code = 0
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return signal.Signals(os.WTERMSIG(status)).name
    return None


def target_onnx(seed: int = 0, cases: int | None = 100, seconds: float | None = None,
                timeout: float = 10.0) -> Counts:
    import onnx

    counts = Counts("onnx")
    models = onnx_models()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for i in _case_numbers(cases, seconds, start):
            rng = random.Random(f"{seed}:onnx:{i}")
            base = rng.choice(models)
            m = onnx.ModelProto()
            m.CopyFrom(base)
            whats = [base.graph.name]
            if rng.random() < 0.8:
                for _ in range(rng.randint(1, 3)):
                    try:
                        whats.append(mutate_onnx(rng, m))
                    except (ValueError, TypeError, IndexError):  # protobuf refused the value
                        counts.note("mutation refused by protobuf")
            data = m.SerializeToString()
            if rng.random() < 0.25:
                raw = bytearray(data)
                if rng.random() < 0.5:
                    raw = raw[:rng.randrange(len(raw))]
                    whats.append("truncated")
                else:
                    for _ in range(rng.randint(1, 4)):
                        raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
                    whats.append("bit flips")
                data = bytes(raw)
            check_onnx_bytes(counts, data, "; ".join(whats), tmp, timeout)
    counts.seconds = time.monotonic() - start
    return counts


# --- target: API misuse ---------------------------------------------------------------------

API_TEXT = """graph @mlp(%x: f32[4,8], %w: f32[8,4] param) -> (f32[4,4]) {
  %0 = matmul(%x, %w) : f32[4,4]
  %1 = relu(%0) : f32[4,4]
  return %1
}
"""


class WouldSpawn(Exception):
    """Raised in place of starting rank processes: launch got this far with the arguments."""


def _junk_values() -> list[tuple[str, Any]]:
    import torch

    g = partita.parse(API_TEXT, "junk.pir")
    return [
        ("None", None), ("True", True), ("0", 0), ("-1", -1), ("7", 7), ("2**70", 2**70), ("-2**70", -2**70),
        ("1.5", 1.5), ("nan", float("nan")), ("inf", float("inf")), ("''", ""), ("'x'", "x"), ("'dp=2'", "dp=2"),
        ("'f32[2]'", "f32[2]"), ("'%x'", "%x"), ("'\\x00'", "\x00"), ("'a'*10000", "a" * 10000),
        ("b'bytes'", b"bytes"), ("bytearray(b'x')", bytearray(b"x")), ("[]", []), ("[None]", [None]),
        ("[1, 2]", [1, 2]), ("['x']", ["x"]), ("()", ()), ("{}", {}), ("{'x': None}", {"x": None}),
        ("{'x': 'str'}", {"x": "str"}), ("{'nope': 1}", {"nope": 1}), ("{1: 2}", {1: 2}),
        ("{'x': [[1]]}", {"x": [[1]]}), ("{'x': {}}", {"x": {}}), ("object()", object()),
        ("np.float32(1)", np.float32(1)), ("np.array(1.0)", np.array(1.0)), ("np.zeros((2, 2))", np.zeros((2, 2))),
        ("np.zeros((4, 8), np.int64)", np.zeros((4, 8), np.int64)), ("np.array(['a'])", np.array(["a"])),
        ("np.array([None], dtype=object)", np.array([None], dtype=object)),
        ("np.zeros((4, 8), np.complex64)", np.zeros((4, 8), np.complex64)),
        ("np.full((4, 8), np.nan, np.float32)", np.full((4, 8), np.nan, np.float32)),
        ("torch.zeros(4, 8)", torch.zeros(4, 8)), ("torch.zeros(4, 8, dtype=torch.bool)", torch.zeros(4, 8, dtype=torch.bool)),
        ("1j", 1j), ("set()", set()), ("lambda: 0", lambda: 0), ("type", type), ("Ellipsis", ...),
        ("range(3)", range(3)), ("Path('/nonexistent/x.pir')", Path("/nonexistent/x.pir")),
        ("a Graph", g), ("[np.zeros((4, 8), np.float32)] * 3", [np.zeros((4, 8), np.float32)] * 3),
        ("{'x': np.zeros((4, 8), np.float32), 'w': 'w'}", {"x": np.zeros((4, 8), np.float32), "w": "w"}),
        ("iter([1])", None),  # replaced per call (an iterator is used up)
    ]


def _api_calls() -> list[tuple[str, tuple[str, ...], Callable[[Any, Any], Any]]]:
    """(call text with J for the junk, names that may appear in the message, fn(env, junk))."""
    from partita.ir import Builder

    def g_(env):
        return partita.parse(API_TEXT, "api.pir")

    def step(env):
        return env["step"]

    def prog(env):
        return env["prog"]

    X = np.ones((4, 8), np.float32)
    batch = {"x": X, "target": np.zeros(4, np.int64)}
    calls = [
        ("partita.parse(J)", ("parse", "text"), lambda e, j: partita.parse(j)),
        ("partita.parse(API_TEXT, J)", ("parse", "name"), lambda e, j: partita.parse(API_TEXT, j)),
        ("partita.load(J)", ("load", "path"), lambda e, j: partita.load(j)),
        ("partita.verify(J)", ("verify", "graph"), lambda e, j: partita.verify(j)),
        ("partita.print_graph(J)", ("print_graph", "graph"), lambda e, j: partita.print_graph(j)),
        ("partita.optimize(J)", ("optimize", "graph"), lambda e, j: partita.optimize(j, reproducer_dir=None)),
        ("partita.optimize(g, passes=J)", ("optimize", "passes", "pipeline"),
         lambda e, j: partita.optimize(g_(e), passes=j, reproducer_dir=None)),
        ("partita.optimize(g, 'dce', verify_each=J)", ("optimize", "verify_each"),
         lambda e, j: partita.optimize(g_(e), "dce", verify_each=j, reproducer_dir=None)),
        ("partita.optimize(g, 'dce', print_ir_after=J)", ("optimize", "print_ir_after", "print-ir-after"),
         lambda e, j: partita.optimize(g_(e), "dce", print_ir_after=j, out=io.StringIO(), reproducer_dir=None)),
        ("partita.optimize(g, 'dce', reproducer_dir=J)", ("optimize", "reproducer_dir"),
         lambda e, j: partita.optimize(g_(e), "dce", reproducer_dir=j)),
        ("partita.optimize(g, 'dce', junk=J)", ("optimize", "junk"), lambda e, j: partita.optimize(g_(e), "dce", junk=j)),
        ("partita.run(J)", ("run", "graph"), lambda e, j: partita.run(j, {"x": X})),
        ("partita.run(g, J)", ("run", "inputs"), lambda e, j: partita.run(g_(e), j, {"w": np.ones((8, 4), np.float32)})),
        ("partita.run(g, J, backend='torch')", ("run", "inputs"),
         lambda e, j: partita.run(g_(e), j, {"w": np.ones((8, 4), np.float32)}, backend="torch")),
        ("partita.run(g, {'x': J})", ("run", "x"), lambda e, j: partita.run(g_(e), {"x": j}, {"w": np.ones((8, 4), np.float32)})),
        ("partita.run(g, [J], backend='torch')", ("run", "x"),
         lambda e, j: partita.run(g_(e), [j], {"w": np.ones((8, 4), np.float32)}, backend="torch")),
        ("partita.run(g, {'x': X}, weights=J)", ("run", "weights", "w"), lambda e, j: partita.run(g_(e), {"x": X}, j)),
        ("partita.run(g, {'x': X}, weights=J, backend='torch')", ("run", "weights", "w"),
         lambda e, j: partita.run(g_(e), {"x": X}, j, backend="torch")),
        ("partita.run(g, {'x': X}, weights={'w': J})", ("run", "w"), lambda e, j: partita.run(g_(e), {"x": X}, {"w": j})),
        ("partita.run(g, {'x': X}, backend=J)", ("run", "backend"), lambda e, j: partita.run(g_(e), {"x": X}, backend=j)),
        ("partita.training_step(J)", ("training_step", "graph"), lambda e, j: partita.training_step(j, loss="cross_entropy")),
        ("partita.training_step(g, loss=J)", ("training_step", "loss"), lambda e, j: partita.training_step(g_(e), loss=j)),
        ("partita.training_step(g, 'cross_entropy', optimizer=J)", ("training_step", "optimizer"),
         lambda e, j: partita.training_step(g_(e), "cross_entropy", optimizer=j)),
        ("partita.training_step(g, 'cross_entropy', lr=J)", ("training_step", "lr"),
         lambda e, j: partita.training_step(g_(e), "cross_entropy", lr=j)),
        ("partita.training_step(g, 'cross_entropy', junk=J)", ("training_step", "junk"),
         lambda e, j: partita.training_step(g_(e), "cross_entropy", junk=j)),
        ("partita.parallelize(J, 'dp=2', 'dp')", ("parallelize", "graph"), lambda e, j: partita.parallelize(j, "dp=2", "dp")),
        ("partita.parallelize(step, J, 'dp')", ("parallelize", "mesh"), lambda e, j: partita.parallelize(step(e), j, "dp")),
        ("partita.parallelize(step, 'dp=2', J)", ("parallelize", "strategy"), lambda e, j: partita.parallelize(step(e), "dp=2", j)),
        ("partita.parallelize(step, 'dp=2', annotations=J)", ("parallelize", "annotations"),
         lambda e, j: partita.parallelize(step(e), "dp=2", annotations=j)),
        ("partita.parallelize(step, 'dp=2', 'dp', junk=J)", ("parallelize", "junk"),
         lambda e, j: partita.parallelize(step(e), "dp=2", "dp", junk=j)),
        ("partita.launch(J, 2, batch)", ("launch", "program"), lambda e, j: partita.launch(j, 2, batch)),
        ("partita.launch(prog, J, batch)", ("launch", "nproc"), lambda e, j: partita.launch(prog(e), j, batch)),
        ("partita.launch(prog, 2, J)", ("launch", "inputs"), lambda e, j: partita.launch(prog(e), 2, j)),
        ("partita.launch(prog, 2, batch, weights=J)", ("launch", "weights"),
         lambda e, j: partita.launch(prog(e), 2, batch, weights=j)),
        ("partita.launch(prog, 2, batch, steps=J)", ("launch", "steps"), lambda e, j: partita.launch(prog(e), 2, batch, steps=j)),
        ("partita.launch(prog, 2, batch, timeout_s=J)", ("launch", "timeout_s"),
         lambda e, j: partita.launch(prog(e), 2, batch, timeout_s=j)),
        ("partita.launch(prog, 2, batch, tolerance=J)", ("launch", "tolerance"),
         lambda e, j: partita.launch(prog(e), 2, batch, tolerance=j)),
        ("partita.launch(prog, 2, batch, threads=J)", ("launch", "threads"),
         lambda e, j: partita.launch(prog(e), 2, batch, threads=j)),
        ("partita.launch(prog, 2, batch, backend=J)", ("launch", "backend"),
         lambda e, j: partita.launch(prog(e), 2, batch, backend=j)),
        ("partita.launch(prog, 2, batch, check=J)", ("launch", "check"), lambda e, j: partita.launch(prog(e), 2, batch, check=j)),
        ("partita.import_onnx(J)", ("import_onnx", "model", "onnx"), lambda e, j: partita.import_onnx(j)),
        ("partita.import_onnx(model, input_shapes=J)", ("import_onnx", "input_shapes", "<onnx>"),
         lambda e, j: partita.import_onnx(e["onnx"], input_shapes=j)),
        ("Builder(g).emit(J, x)", ("emit", "op"), lambda e, j: Builder(e["g"]).emit(j, e["g"].inputs[0])),
        ("Builder(g).emit('add', x, J)", ("emit", "add", "operand"), lambda e, j: Builder(e["g"]).emit("add", e["g"].inputs[0], j)),
        ("Builder(g).emit('sum', x, axes=J)", ("emit", "sum", "axes"),
         lambda e, j: Builder(e["g"]).emit("sum", e["g"].inputs[0], axes=j)),
        ("Builder(g).emit('full', value=J, shape=(2,))", ("emit", "full", "value"),
         lambda e, j: Builder(e["g"]).emit("full", value=j, shape=(2,))),
        ("Builder(g).emit('reshape', x, shape=J)", ("emit", "reshape", "shape"),
         lambda e, j: Builder(e["g"]).emit("reshape", e["g"].inputs[0], shape=j)),
        ("Builder(g).input(J, TensorType((2,), f32))", ("input", "name"),
         lambda e, j: Builder(e["g"]).input(j, partita.TensorType((2,), partita.dtypes.f32))),
    ]
    return calls


@contextlib.contextmanager
def _no_spawning():
    """Replace the rank runner of partita.launch with one that raises WouldSpawn."""
    import partita.runtime.parallel_run as pr

    def refuse(*args, **kwargs):
        raise WouldSpawn("launch reached run_ranks")

    saved = pr.run_ranks
    pr.run_ranks = refuse
    try:
        yield
    finally:
        pr.run_ranks = saved


def target_api(seed: int = 0, cases: int | None = 200, seconds: float | None = None,
               timeout: float = 20.0) -> Counts:
    counts = Counts("api")
    start = time.monotonic()
    g = partita.parse(API_TEXT, "api.pir")
    g.weights["w"] = np.ones((8, 4), np.float32)
    env: dict[str, Any] = {}
    step = partita.training_step(g, loss="cross_entropy", optimizer="sgd", lr=0.1)
    env["step"] = step
    env["prog"] = partita.parallelize(step, "dp=2", "dp")
    env["onnx"] = onnx_models()[0]
    calls = _api_calls()
    junk = _junk_values()
    with tempfile.TemporaryDirectory() as d, contextlib.chdir(d), _no_spawning():
        for i in _case_numbers(cases, seconds, start):
            rng = random.Random(f"{seed}:api:{i}")
            text, places, fn = calls[i % len(calls)] if i < len(calls) else rng.choice(calls)
            jtext, j = rng.choice(junk)
            if jtext == "iter([1])":
                j = iter([1])
            env["g"] = partita.parse(API_TEXT, "api.pir")
            counts.cases += 1
            call = text.replace("J", jtext, 1) if "J" in text else text
            repro = {"call": call}
            # A message may name the place by quoting the junk itself (a path, a mesh text).
            # A bytes or PathLike path is named by its text, as Python's own file errors name it.
            named = os.fsdecode(os.fspath(j)) if isinstance(j, (bytes, os.PathLike)) else j
            quoted = (named[:80],) if isinstance(named, str) and named.strip() else ()
            status, _ = _attempt_api(counts, lambda: fn(env, j), repro, places + ("@mlp", "%x") + quoted, timeout)
            if status == "ok":
                counts.accepted += 1
    counts.seconds = time.monotonic() - start
    return counts


def _attempt_api(counts, fn, repro, places, timeout):
    def guarded():
        try:
            return fn()
        except WouldSpawn:
            counts.note("launch reached run_ranks")
            return None

    return attempt(counts, guarded, repro, places, timeout)


# --- target: random valid graphs ------------------------------------------------------------

GRAPH_PIPELINE = "canonicalize,cse,fold-constants,dce"
# Passes that map a valid graph to one with the same meaning, with no options needed.
MEANING_PRESERVING = ("canonicalize", "cse", "dce", "fold-constants", "fuse-activations", "split-projections")

CAST_VALUES = (0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, 7.9, -8.5, 15.5, 127.5, 128.0, -129.0, 255.5, 256.0, 300.0,
               -300.0, 65504.0, 65520.0, 1e5, 2.0**31, -2.0**31 - 1, 2.0**32, 2.0**63, -2.0**63, 2.0**64, 1e20, 448.0,
               449.0, 464.0, 57344.0, 61440.0, 1e38, -1e38, float("inf"), float("-inf"), float("nan"), 1e-40, 3.0e-39)


def optimization_passes() -> list[str]:
    from partita.passes.manager import PASSES

    return [p for p in MEANING_PRESERVING if p in PASSES] + [GRAPH_PIPELINE]


def check_graph(counts: Counts, g: Any, timeout: float = 20.0) -> None:
    """One random valid graph: both executors agree, and so does the graph after each pass."""
    counts.cases += 1
    counts.accepted += 1
    from partita.ir import print_graph

    check_executors(counts, g, {"text": print_graph(g)}, timeout, passes=optimization_passes())


def cast_case(counts: Counts, rng: random.Random, timeout: float = 20.0) -> None:
    """A cast of extreme values: numpy, torch, and folding the cast of a constant agree."""
    from partita.ir import parse, print_graph
    from partita.passes import PassManager

    src = rng.choice(("f32", "f64", "f16", "bf16", "i32", "i64", "i8", "u8", "f8e4m3fn", "f8e5m2"))
    dst = rng.choice(DTYPE_NAMES)
    attrs = rng.choice(("", ", saturate=false", ', round_mode="down"', ', round_mode="nearest"'))
    if attrs and "saturate" in attrs and not dst.startswith("f8e"):
        attrs = ""
    if "round_mode" in attrs and dst != "f8e8m0":
        attrs = ""
    vals = [rng.choice(CAST_VALUES) for _ in range(rng.randint(1, 6))]
    arr = np.array(vals, np.float64)
    from partita.ir.dtypes import DTYPES
    with np.errstate(all="ignore"):
        if DTYPES[src].is_int:
            info = np.iinfo(DTYPES[src].np)
            arr = np.nan_to_num(arr, nan=0.0, posinf=info.max, neginf=info.min)
            arr = np.clip(np.trunc(arr), info.min, info.max)
        src_arr = arr.astype(DTYPES[src].np)
    lits = ", ".join(_fmt_literal(float(x), src) for x in src_arr.astype(np.float64))
    n = len(vals)
    text = (f"graph @cast(%x: {src}[{n}]) -> ({dst}[{n}], {dst}[{n}]) {{\n"
            f"  %c = constant() {{value=dense<{src}[{n}], [{lits}]>}} : {src}[{n}]\n"
            f"  %0 = cast(%x) {{dtype={dst}{attrs}}} : {dst}[{n}]\n"
            f"  %1 = cast(%c) {{dtype={dst}{attrs}}} : {dst}[{n}]\n"
            f"  return %0, %1\n}}\n")
    counts.cases += 1
    repro = {"text": text}
    status, g = attempt(counts, lambda: parse(text, "cast.pir"), repro, ("cast.pir",), timeout)
    if status != "ok":
        return
    counts.accepted += 1
    inputs = {"x": src_arr}
    status, ref = attempt(counts, lambda: _run(g, inputs, "numpy"), dict(repro, backend="numpy"), (), timeout)
    if status != "ok":
        return
    d = compare(ref[0], ref[1], dst)
    if d:
        counts.violate(f"numpy-input-vs-constant|{src}->{dst}", "mismatch", f"numpy: cast of input vs of constant: {d}",
                       repro)
    status, got = attempt(counts, lambda: _run(g, inputs, "torch"), dict(repro, backend="torch"), (), timeout)
    if status == "ok":
        d = compare_all(got, ref, g)
        if d:
            counts.violate(f"torch|{src}->{dst}", "mismatch", f"cast {src}->{dst}: torch vs numpy: {d}",
                           dict(repro, compare="torch vs numpy", values=[repr(x) for x in src_arr.tolist()]))
    status, out = attempt(counts, lambda: PassManager.parse("fold-constants", reproducer_dir=None).run(
        parse(text, "cast.pir")), dict(repro, passes="fold-constants"), (), timeout)
    if status == "ok":
        status, folded = attempt(counts, lambda: _run(out, inputs, "numpy"), dict(repro, passes="fold-constants"),
                                 (), timeout)
        if status == "ok":
            d = compare(folded[1], ref[1], dst)
            if d:
                counts.violate(f"fold|{src}->{dst}", "mismatch", f"cast {src}->{dst}: folded vs numpy: {d}",
                               dict(repro, passes="fold-constants", after=print_graph(out)))


def _fmt_literal(x: float, src: str) -> str:
    from partita.ir.dtypes import DTYPES
    if DTYPES[src].is_int:
        return str(int(x))
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return repr(x)


def target_graphs(seed: int = 0, cases: int | None = 60, seconds: float | None = None,
                  timeout: float = 20.0, batch: int = 20) -> Counts:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    from strategies import graphs

    counts = Counts("graphs")
    start = time.monotonic()
    b = 0
    while (cases is None or counts.cases < cases) and (seconds is None or time.monotonic() - start < seconds):
        n = batch if cases is None else max(1, min(batch, (cases - counts.cases) // 2 or 1))

        @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate], print_blob=False,
                  suppress_health_check=list(HealthCheck))
        @hseed(seed * 100003 + b)
        @given(g=graphs())
        def one_batch(g):
            check_graph(counts, g, timeout)

        one_batch()
        for k in range(n):
            cast_case(counts, random.Random(f"{seed}:cast:{b}:{k}"), timeout)
        b += 1
    counts.seconds = time.monotonic() - start
    return counts


# --- target: the command line ---------------------------------------------------------------

BAD_FLAGS = ("--passes", "--passes=", "--passes=nope", "--passes=dce{x=1}", "--passes=fold-constants{max-elements=-1}",
             "--passes=,,", "--seed", "--seed=-1", "--seed=abc", "--seed=99999999999999999999", "--backend=cuda",
             "--backend=", "-o", "-o=/nonexistent/dir/o.pir", "--print-ir-after=zz", "--print-ir-after=all",
             "--timing", "--no-verify", "--mesh=dp=0", "--mesh=junk", "--mesh=dp=2", "--steps=-1", "--steps=0",
             "--lr=nan", "--lr=-1", "--optimizer=nope", "--example", "--example=f32[", "--example=f32[2,-1]",
             "--", "-", "--x", "-h", "--input-shape=x:2,3", "--nproc=0")
CLI_COMMANDS = ("verify", "opt", "run", "import", "train", "ops")
SUBPROCESS_LIMIT_BYTES = 8 << 30


def _limit_memory():  # pragma: no cover - runs in the child
    resource.setrlimit(resource.RLIMIT_AS, (SUBPROCESS_LIMIT_BYTES, SUBPROCESS_LIMIT_BYTES))


def run_cli_subprocess(argv: Sequence[str], cwd: Path, timeout: float) -> tuple[int | None, str]:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        p = subprocess.run([sys.executable, "-m", "partita", *argv], cwd=cwd, capture_output=True, text=True,
                           timeout=timeout, env=env, preexec_fn=_limit_memory, errors="replace")
    except subprocess.TimeoutExpired as e:
        return None, (e.stderr or b"").decode("utf-8", "replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    return p.returncode, p.stderr


def run_cli_inprocess(argv: Sequence[str], timeout: float) -> tuple[int | None, str]:
    from partita.cli import main

    err, out = io.StringIO(), io.StringIO()
    try:
        with time_limit(timeout), contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            rc = main(list(argv))
    except CaseTimeout:
        return None, err.getvalue()
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException:  # noqa: BLE001  (an exception escaping main is itself the finding)
        return -1, err.getvalue() + traceback.format_exc()
    return rc, err.getvalue()


def check_cli(counts: Counts, argv: Sequence[str], files: dict[str, bytes], cwd: Path, subprocess_: bool,
              timeout: float) -> None:
    counts.cases += 1
    for name, data in files.items():
        (cwd / name).write_bytes(data)
    rc, err = (run_cli_subprocess(argv, cwd, timeout) if subprocess_ else run_cli_inprocess(argv, timeout))
    repro = {"argv": "partita " + shlex.join(argv)}
    for name, data in files.items():
        try:
            repro[name] = data.decode("utf-8") if name.endswith(".pir") else base64.b64encode(data).decode()
        except UnicodeDecodeError:
            repro[name + " (base64)"] = base64.b64encode(data).decode()
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if rc is None:
        counts.violate(f"{argv[0]}|hang", "hang", f"no exit within {timeout} s", repro)
    elif "Traceback" in err:
        counts.violate(f"{argv[0]}|{_traceback_sig(err)}", "traceback", f"exit {rc}, traceback: {last}", repro)
    elif rc not in (0, 1, 2):
        counts.violate(f"{argv[0]}|{rc}|{re.sub(r'[0-9]+', '#', last)[:80]}", "exit-code",
                       f"exit {rc}: {err.strip()[:600]}", repro)
    elif rc == 1 and "error" not in err:
        counts.violate(f"{argv[0]}|silent", "empty-message", f"exit 1 without an error message: {err[:300]}", repro)
    elif rc == 0:
        counts.accepted += 1
    else:
        counts.clean += 1


def _traceback_sig(err: str) -> str:
    frames = re.findall(r'File "([^"]+)", line (\d+)', err)
    mine = [f for f in frames if "/partita/" in f[0]]
    f = (mine or frames or [("?", "0")])[-1]
    return f"{os.path.basename(f[0])}:{f[1]}"


def cli_case(rng: random.Random, seeds: Sequence[str], vocab: Sequence[str], token_re: Any,
             models: Sequence[Any]) -> tuple[list[str], dict[str, bytes]]:
    """An argv and the files it reads."""
    import onnx

    cmd = rng.choice(CLI_COMMANDS)
    files: dict[str, bytes] = {}
    if cmd == "import":
        m = onnx.ModelProto()
        m.CopyFrom(rng.choice(models))
        for _ in range(rng.randint(0, 2)):
            try:
                mutate_onnx(rng, m)
            except (ValueError, TypeError, IndexError):  # protobuf refused the value
                pass
        files["m.onnx"] = m.SerializeToString()
        argv = ["import", "m.onnx", "-o", "out.pir"]
    elif cmd == "ops":
        argv = ["ops"] + ([rng.choice(("matmul", "nope", "", "cast", "full", "x" * 100))] if rng.random() < 0.7 else [])
    else:
        text = rng.choice([s for s in seeds if "ir_test." not in s])
        for _ in range(rng.randint(0, 2)):
            text, _k = mutate_pir(rng, text, vocab, token_re)
        files["m.pir"] = text.encode("utf-8", "surrogatepass")
        argv = [cmd, "m.pir"]
        if cmd == "opt":
            argv.append("--passes=" + rng.choice(("canonicalize,cse,fold-constants,dce", "dce", "fuse-activations",
                                                   "grad", "split-projections", "grad,adamw{lr=0.01}")))
        if cmd == "train":
            argv += ["--steps", "1"]
    for _ in range(rng.randint(0, 2)):
        argv.insert(rng.randint(1, len(argv)), rng.choice(BAD_FLAGS))
    return argv, files


def target_cli(seed: int = 0, cases: int | None = 40, seconds: float | None = None, timeout: float = 60.0,
               subprocesses: int = 3) -> Counts:
    """In-process cases (``partita.cli.main``), and every so often (``subprocesses`` in a
    bounded run; one in ten in a timed one) a real ``python -m partita`` process, where
    ``run`` cases go too (random inputs of a huge type could fill memory: the child has an
    address-space limit)."""
    counts = Counts("cli")
    seeds, vocab, token_re = _pir_seeds()
    models = onnx_models()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as d:
        cwd = Path(d)
        for i in _case_numbers(cases, seconds, start):
            rng = random.Random(f"{seed}:cli:{i}")
            argv, files = cli_case(rng, seeds, vocab, token_re, models)
            if i == 0:  # always one huge-dims run with a negative seed, as a subprocess
                files = {"m.pir": b"graph @big(%x: f32[100000,100000,100000]) -> (f32[100000,100000,100000]) {\n"
                                  b"  %0 = neg(%x) : f32[100000,100000,100000]\n  return %0\n}\n"}
                argv = ["run", "m.pir", "--seed", "-1"]
            sub = (i < subprocesses) if cases is not None else (i % 10 == 0)
            if argv[0] in ("run", "train") and not sub:
                sub = _is_big(files.get("m.pir", b""))
            check_cli(counts, argv, files, cwd, sub, timeout if sub else min(timeout, 30.0))
            if sub:
                counts.note("subprocess cases")
            for f in list(cwd.iterdir()):
                if f.is_file():
                    f.unlink()
    counts.seconds = time.monotonic() - start
    return counts


def _is_big(text: bytes) -> bool:
    """Whether a .pir file might ask for big random inputs (or does not parse far enough to tell)."""
    from partita.ir import parse

    try:
        g = parse(text.decode("utf-8", "replace"), "m.pir")
    except Exception:  # noqa: BLE001  (the command stops at the same parse error)
        return False
    return numel_of(g) > 100000


# --- shared by the newer targets ------------------------------------------------------------


def _vm_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@contextlib.contextmanager
def memory_limit(extra_bytes: int):
    """At most ``extra_bytes`` more address space for the duration (an in-process case that
    tries to build 10^8 of something meets a MemoryError instead of the machine's limit)."""
    vm = _vm_bytes()
    if not vm:
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    want = vm + extra_bytes
    if hard != resource.RLIM_INFINITY:
        want = min(want, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


CASE_MEMORY_BYTES = 3 << 30


def _silently_wrong(counts: Counts, what: str, message: str, repro: dict) -> None:
    counts.violate(what, "silently-wrong", message, repro)


def _tiny_gpt_step(layers: int = 2) -> Any:
    """A training step of a 2-layer GPT (bf16, no weights): small enough to parallelize and
    simulate in a few milliseconds."""
    from partita.models import gpt

    fwd = gpt(layers, 32, 2, 8, 64, batch=4)
    return partita.training_step(fwd, loss="cross_entropy", optimizer="sgd")


# --- target: cluster files ------------------------------------------------------------------

CLUSTER_SHIPPED = sorted((REPO / "partita" / "cluster" / "clusters").glob("*.toml"))

# A calibrated-looking extra: measured and fitted collectives, a cache, shared cores, the
# [efficiency] table; merged into a shipped file so that every table appears in some seeds.
CLUSTER_EXTRA = {
    "cores_per_node": 2,
    "device": {"cache": "32 MiB", "cache_bandwidth": "200 GB/s"},
    "efficiency": {"gemm": 0.7, "gemm_knee": 48, "attention": 0.5, "memory": 0.6, "op_overhead": "4 us",
                   "network": 0.7},
    "intra_node": {"collectives": {"all_reduce": {"latency": "119 us", "bandwidth": "899 MB/s"},
                                   "send_recv": {"latency": "40 us", "bandwidth": "2 GB/s"}},
                   "measured": {"all_reduce": {"ranks": 4, "bytes": [4, 65536, 4194304],
                                               "seconds": [5e-4, 6e-3, 2e-2]},
                                "all_gather": {"ranks": 2, "bytes": [4, 1048576], "seconds": [1e-4, 3e-3]}}},
    "inter_node": {"collectives": {"all_gather": {"latency": "30 us", "bandwidth": "10 GB/s"}}},
}

# Junk for any field: numbers at and past every edge, strings with wrong or no units,
# NaN-ish strings, and every other TOML type.
CLUSTER_JUNK: tuple[Any, ...] = (
    10 ** 400, -10 ** 400, 2 ** 63, 2 ** 64, 1e308, -1e308, 5e-324, -5e-324, 0, -1, 0.0, -0.0, 0.5, 1.5, 2.5,
    float("nan"), float("inf"), float("-inf"), "nan", "NaN GB/s", "inf B", "-inf us", "1e400 B", "1e400 GB/s",
    "1e-400 s", "-5 us", "0 GB/s", "5 parsecs", "80 GiB", "2039 GB/s", "200 Gb/s", "312 TFLOP/s", "5 us", "5",
    "", " ", "1" * 400 + " B", "\u00b5s", True, False, [], [1], [1, "x"], [[1, [2]]], {}, {"a": 1},
    {"latency": "1 us"}, {"ranks": 4}, "x" * 300,
)
CLUSTER_PATH_JUNK = ("c\x00.toml", "", "nosuch", "nosuch.toml", ".", "missing/dir/c.toml", "/dev/null",
                     "selene", "SELENE", "selene.toml", "/proc/self/status")


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def cluster_seeds() -> list[dict]:
    """The shipped cluster files as data, and each merged with ``CLUSTER_EXTRA``."""
    import tomllib

    base = [tomllib.loads(p.read_text()) for p in CLUSTER_SHIPPED]
    return base + [_merge(d, CLUSTER_EXTRA) for d in base]


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(k)


def _toml_value(v: Any) -> str:
    import json

    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }"
    return json.dumps(str(v))


def to_toml(data: dict) -> str:
    """TOML text of ``data`` as the shipped files are written: top-level values first, then a
    ``[table]`` per table and a ``[table.sub]`` per table inside it (deeper ones inline)."""
    lines = [f"{_toml_key(k)} = {_toml_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, t in data.items():
        if not isinstance(t, dict):
            continue
        lines += ["", f"[{_toml_key(k)}]"]
        lines += [f"{_toml_key(a)} = {_toml_value(v)}" for a, v in t.items() if not isinstance(v, dict)]
        for a, sub in t.items():
            if isinstance(sub, dict):
                lines += ["", f"[{_toml_key(k)}.{_toml_key(a)}]"]
                lines += [f"{_toml_key(b)} = {_toml_value(v)}" for b, v in sub.items()]
    return "\n".join(lines) + "\n"


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path of nested dicts (tables, and the values in them)."""
    out = []
    if isinstance(data, dict):
        for k, v in data.items():
            out.append(prefix + (k,))
            out += _paths(v, prefix + (k,))
    return out


def _get(data: dict, path: tuple) -> Any:
    for k in path:
        data = data[k]
    return data


def mutate_cluster(rng: random.Random, data: dict) -> str:
    """One mutation of cluster ``data`` in place; returns its name."""
    import copy

    kind = rng.choice(("remove", "remove", "junk", "junk", "junk", "unknown", "measured", "collectives",
                       "table_value", "peak_dtype", "efficiency"))
    paths = _paths(data)
    if kind == "remove":
        # The required ones most often: name, [device] name, [device.peak_flops], whole tables.
        required = [p for p in (("name",), ("device", "name"), ("device", "peak_flops"), ("device",),
                                ("intra_node",), ("inter_node",), ("nodes",), ("gpus_per_node",),
                                ("device", "memory")) if p in paths]
        path = rng.choice(required) if required and rng.random() < 0.6 else rng.choice(paths)
        del _get(data, path[:-1])[path[-1]]
    elif kind == "junk":
        path = rng.choice(paths)
        _get(data, path[:-1])[path[-1]] = copy.deepcopy(rng.choice(CLUSTER_JUNK))
    elif kind == "unknown":
        tables = [()] + [p for p in paths if isinstance(_get(data, p), dict)]
        t = _get(data, rng.choice(tables))
        t[rng.choice(("nmae", "speed", "bandwidht", "x", "gpus", "peak"))] = rng.choice(("1", 1, [1], {"a": 1}))
    elif kind in ("measured", "collectives"):
        link = data.setdefault(rng.choice(("intra_node", "inter_node")), {})
        if not isinstance(link, dict):
            return kind
        table = link.setdefault(kind, {})
        if not isinstance(table, dict):
            return kind
        op = rng.choice(("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv",
                         "allreduce", "send"))
        if kind == "measured":
            entry: Any = {"ranks": 4, "bytes": [4, 65536], "seconds": [5e-4, 6e-3]}
            field_ = rng.choice(("ranks", "bytes", "seconds", "bytes[]", "seconds[]", "entry", "drop"))
        else:
            entry = {"latency": "100 us", "bandwidth": "1 GB/s"}
            field_ = rng.choice(("latency", "bandwidth", "entry", "drop"))
        j = copy.deepcopy(rng.choice(CLUSTER_JUNK))
        if field_ == "entry":
            entry = j
        elif field_ == "drop":
            entry.pop(rng.choice(sorted(entry)))
        elif field_.endswith("[]"):
            entry[field_[:-2]][rng.randrange(2)] = j
        else:
            entry[field_] = j
        table[op] = entry
    elif kind == "table_value":
        key = rng.choice(("device", "intra_node", "inter_node", "efficiency"))
        data[key] = copy.deepcopy(rng.choice(CLUSTER_JUNK))
        if isinstance(data[key], dict):
            data[key] = {}
    elif kind == "peak_dtype":
        peak = data.get("device", {}).get("peak_flops") if isinstance(data.get("device"), dict) else None
        if isinstance(peak, dict):
            peak[rng.choice(("bf16", "f32", "fp8", "int4", "f64", ""))] = copy.deepcopy(rng.choice(CLUSTER_JUNK))
    else:
        eff = data.setdefault("efficiency", {})
        if isinstance(eff, dict):
            eff[rng.choice(("gemm", "gemm_knee", "attention", "memory", "op_overhead", "network"))] = \
                copy.deepcopy(rng.choice(CLUSTER_JUNK + (1e308, 1e308, 5e-324)))
    return kind


def cluster_file_bytes(rng: random.Random, seeds: Sequence[dict]) -> tuple[bytes, str]:
    """A mutated cluster file and what was done to it."""
    import copy

    data = copy.deepcopy(rng.choice(seeds))
    done = []
    for _ in range(rng.choice((0, 1, 1, 1, 2, 2, 3))):
        done.append(mutate_cluster(rng, data))
    text = to_toml(data).encode("utf-8", "surrogatepass")
    r = rng.random()
    if r < 0.04:
        text, done = b"", ["empty"]
    elif r < 0.08:
        i = rng.randrange(len(text) + 1)
        text = text[:i] + rng.choice((b"\xff\xfe", b"\x80", b"\xc3", b"\xed\xa0\x80")) + text[i:]
        done.append("non-utf8")
    elif r < 0.11:
        text = b"x = " + b"[" * 5000 + b"]" * 5000 + b"\n" + text
        done.append("deep-array")
    elif r < 0.14:
        text = text[:rng.randrange(len(text) + 1)]
        done.append("truncated")
    elif r < 0.17:
        lines = text.split(b"\n")
        i = rng.randrange(len(lines))
        lines.insert(i, lines[rng.randrange(len(lines))])
        text = b"\n".join(lines)
        done.append("duplicate-line")
    return text, "+".join(done)


# Fixed first cases (an [efficiency] table added to the first shipped file), so that a bounded
# run always meets them: the subnormal 5e-324 is a fraction in (0, 1], and so is 1.
CLUSTER_ANCHORS = ("gemm = 5e-324", "network = 5e-324", "attention = 5e-324", "memory = 1e-300",
                   "gemm_knee = 1e308", "gemm = 1\nnetwork = 1\nmemory = 1\nattention = 1")


def _cluster_programs() -> list[tuple[str, Any]]:
    step = _tiny_gpt_step()
    return [("parallelize(step, 'dp=2', 'dp')", partita.parallelize(step, "dp=2", "dp")),
            ("parallelize(step, 'pp=2', 'pp', microbatches=2)",
             partita.parallelize(step, "pp=2", "pp", microbatches=2)),
            ("parallelize(step, 'dp=2,tp=2', 'dp+megatron', allow_replication=True)",
             partita.parallelize(step, "dp=2,tp=2", "dp+megatron", allow_replication=True))]


def check_simulation(counts: Counts, cluster: Any, prog: Any, repro: dict, places: Sequence[str],
                     timeout: float) -> None:
    """Simulate ``prog`` on an accepted ``cluster``: a finite positive step time, or a clean error."""
    from partita.cluster import simulate

    def run():
        with memory_limit(CASE_MEMORY_BYTES):
            cluster.summary()
            return simulate(prog, cluster, trace=False)

    status, res = attempt(counts, run, repro, places, timeout, hang_where=True)
    if status != "ok":
        return
    st = res.step_time
    if not (isinstance(st, float) and math.isfinite(st) and st > 0):
        _silently_wrong(counts, "simulate|step_time", f"simulate gave the step time {st!r}", repro)
        return
    for name in ("mfu", "hfu", "tokens_per_second"):
        x = getattr(res, name)
        if x is not None and not math.isfinite(x):
            _silently_wrong(counts, f"simulate|{name}", f"simulate gave {name} = {x!r}", repro)
            return
    counts.note("simulated")


def target_cluster(seed: int = 0, cases: int | None = 200, seconds: float | None = None,
                   timeout: float = 10.0) -> Counts:
    """Mutated cluster files read by ``load_cluster`` (or ``parse_cluster``), bad paths,
    ``Cluster.with_nodes`` and ``parse_quantity`` with junk; every accepted cluster then
    simulates a small parallel program."""
    from partita.cluster import load_cluster, parse_cluster, parse_quantity

    counts = Counts("cluster")
    start = time.monotonic()
    seeds = cluster_seeds()
    programs = _cluster_programs()
    shipped = load_cluster(CLUSTER_SHIPPED[0])
    with tempfile.TemporaryDirectory() as d, contextlib.chdir(d):
        for i in _case_numbers(cases, seconds, start):
            rng = random.Random(f"{seed}:cluster:{i}")
            counts.cases += 1
            what = rng.random() if i >= len(CLUSTER_ANCHORS) else 1.0
            if what < 0.07:
                path = rng.choice(CLUSTER_PATH_JUNK)
                repro = {"call": f"load_cluster({path!r})"}
                status, cl = attempt(counts, lambda: load_cluster(path), repro, (path, "cluster"), timeout)
            elif what < 0.12:
                j = rng.choice(CLUSTER_JUNK + (2, 3.0, "2", None))
                repro = {"call": f"load_cluster({CLUSTER_SHIPPED[0].stem!r}).with_nodes({j!r})"}
                status, cl = attempt(counts, lambda: shipped.with_nodes(j), repro, ("node", "with_nodes"), timeout)
                if status == "ok" and (isinstance(j, bool) or not isinstance(j, int)):
                    counts.violate("with_nodes|non-int", "accepted-bad-value",
                                   f"with_nodes accepted {j!r} (nodes is now {cl.nodes!r})", repro)
                    continue
            elif what < 0.17:
                j = rng.choice(CLUSTER_JUNK + (None, b"5 us", 3 + 0j))
                kind = rng.choice(("bytes", "bandwidth", "flops", "time", "count", "fraction", "nope"))
                repro = {"call": f"parse_quantity({j!r}, {kind!r})"}

                def pq():
                    try:
                        return parse_quantity(j, kind)
                    except ValueError as e:  # its documented error (parse_cluster names the field)
                        if type(e) is ValueError or isinstance(e, PartitaError):
                            return None
                        raise

                status, cl = attempt(counts, pq, repro, ("parse_quantity",), timeout)
                if status == "ok":
                    counts.accepted += 1
                continue
            else:
                if i < len(CLUSTER_ANCHORS):
                    data = CLUSTER_SHIPPED[0].read_bytes() + f"\n[efficiency]\n{CLUSTER_ANCHORS[i]}\n".encode()
                    done = "anchor"
                else:
                    data, done = cluster_file_bytes(rng, seeds)
                via_text = rng.random() < 0.3
                repro = {"mutation": done}
                try:
                    repro["text"] = data.decode("utf-8")
                except UnicodeDecodeError:
                    repro["text (base64)"] = base64.b64encode(data).decode()
                if via_text and "text" in repro:
                    repro["call"] = "parse_cluster(text, 'c.toml')"
                    status, cl = attempt(counts, lambda: parse_cluster(repro["text"], "c.toml"), repro,
                                         ("c.toml",), timeout)
                else:
                    Path("c.toml").write_bytes(data)
                    repro["call"] = "load_cluster('c.toml')"
                    status, cl = attempt(counts, lambda: load_cluster("c.toml"), repro, ("c.toml",), timeout)
            if status != "ok":
                continue
            counts.accepted += 1
            pname, prog = programs[i % len(programs)]
            repro = dict(repro, simulate=f"simulate({pname}, cluster)")
            names = ("c.toml", "simulate", getattr(getattr(cl, "device", None), "name", "") or "", "peak",
                     "cluster")
            check_simulation(counts, cl, prog, repro, names, timeout)
    counts.seconds = time.monotonic() - start
    return counts


# --- target: simulate, cluster and calibrate command lines ----------------------------------

SIM_GPT = ("2,32,2,8,64,4", "2,32,2,8,64,4", "2,64,5,32,128,8", "0,32,2,8,64,4", "2,0,2,8,64,4",
           "2,32,0,8,64,4", "2,32,2,0,64,4", "2,32,2,8,0,4", "2,32,2,8,64,0", "-1,32,2,8,64,4", "2,-32,2,8,64,4",
           "2,32,2,8,64", "2,32,2,8,64,4,1", "a,b,c,d,e,f", "", "2,32,2,8,64,99999999999999999999",
           "2,99999999999999999999,2,8,64,4", "99999999999999999999,32,2,8,64,4", "2,32,64,8,64,4",
           "2,32,2,8,64,1e3", "2, 32, 2, 8, 64, 4", "1,8,8,1,1,1")
SIM_MESH = ("dp=1", "dp=2", "pp=2", "pp=4", "pp=3", "pp=2,dp=2", "dp=2,tp=2", "pp=99999999999999999999",
            "dp=99999999999999999999", "xx=2", "dp=0", "dp=-1", "", "dp=2,dp=2", "tp=2")
SIM_STRATEGY = ("dp", "pp", "pp+dp", "megatron", "dp+megatron", "pp+dp+megatron", "zero3", "nope", "", "pp+pp")
SIM_TRACE = ("t.json", "", "/dev/full", ".", "sub", "missing/dir/t.json")
SIM_PIR = {
    "fwd.pir": b"graph @mlp(%x: f32[4,8], %w: f32[8,4] param) -> (f32[4,4]) {\n"
               b"  %0 = matmul(%x, %w) : f32[4,4]\n  %1 = relu(%0) : f32[4,4]\n  return %1\n}\n",
    "noout.pir": b"graph @g(%x: f32[2]) -> () {\n  return\n}\n",
    "scalar.pir": b"graph @g(%x: f32[4,8], %w: f32[8,4] param) -> (f32[]) {\n  %0 = matmul(%x, %w) : f32[4,4]\n"
                  b"  %1 = sum(%0) {axes=[0, 1]} : f32[]\n  return %1\n}\n",
    "noparam.pir": b"graph @g(%x: f32[4]) -> (f32[4]) {\n  %0 = neg(%x) : f32[4]\n  return %0\n}\n",
    "bad.pir": b"graph @g(%x: f32[4]) -> (f32[4]) {\n  %0 = neg(%q) : f32[4]\n  return %0\n}\n",
    "latin1.pir": b"graph @g(%x: f32[4]) -> (f32[4]) {\n  %0 = neg(%x) : f32[4] # \xe9\n  return %0\n}\n",
}
CAL_NPROC = ("4", "2", "1", "0", "-1", "x", "1000000", "99999999999999999999", "100000")
CAL_OUTPUT = ("ok.toml", "", ".", "missing/dir/c.toml", "/dev/full", "/proc/c.toml", "sub")
CAL_MUST_REJECT_NPROC = 10 ** 4


class WouldMeasure(BaseException):
    """calibrate reached its measurement (the campaign never measures)."""


@contextlib.contextmanager
def _no_measuring():
    import partita.cluster.calibrate as cal

    def refuse(*args, **kwargs):
        raise WouldMeasure()

    saved = cal.measure
    cal.measure = refuse
    try:
        yield
    finally:
        cal.measure = saved


def run_cli_capture(argv: Sequence[str], timeout: float) -> tuple[int | None, str, str, bool]:
    """``partita.cli.main(argv)`` in process: (exit code or None on a hang, stdout, stderr,
    whether calibrate reached its measurement)."""
    from partita.cli import main

    err, out = io.StringIO(), io.StringIO()
    measured = False
    try:
        with time_limit(timeout), memory_limit(CASE_MEMORY_BYTES), contextlib.redirect_stderr(err), \
                contextlib.redirect_stdout(out):
            rc = main(list(argv))
    except CaseTimeout as e:  # the function the command was stuck under, for the signature
        return None, out.getvalue(), f"CaseTimeout@{_entry_where(e)}", False
    except WouldMeasure:
        rc, measured = 0, True
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 2
    except BaseException:  # noqa: BLE001  (an exception escaping main is itself the finding)
        return -1, out.getvalue(), err.getvalue() + traceback.format_exc(), False
    return rc, out.getvalue(), err.getvalue(), measured


# Fixed first cases, so that a bounded run always meets them (argv, files, must-reject flags).
SIMULATE_ANCHORS: tuple[tuple[list[str], tuple[str, ...], list[str]], ...] = (
    (["simulate", "--gpt", "2,64,5,32,128,8"], (), []),
    (["simulate", "--gpt", "2,32,2,8,64,4", "--trace", "/dev/full"], (), ["--trace"]),
    (["simulate", "--gpt", "2,32,2,8,64,4", "--trace", ""], (), ["--trace"]),
    (["simulate", "noout.pir"], ("noout.pir",), []),
    (["simulate", "--gpt", "2,32,2,8,64,4", "--mesh", "dp=2"], (), []),
    (["simulate", "--gpt", "2,32,2,8,64,4", "--mesh", "pp=2", "--strategy", "pp", "--microbatches", "10000000"],
     (), []),
    (["simulate", "--gpt", "2,32,2,8,64,4", "--mesh", "pp=99999999999999999999", "--strategy", "pp"], (), []),
    (["simulate", "--gpt", "99999999999999999999,32,2,8,64,4"], (), []),
    (["calibrate", "-o", "missing/dir/c.toml"], (), ["-o"]),
    (["calibrate", "--nproc", "99999999999999999999", "--quick"], (), ["--nproc"]),
    (["calibrate", "--threads", "1000000", "--quick"], (), ["--threads"]),
    (["cluster", "c\x00.toml"], (), []),
)


def simulate_case(rng: random.Random, cluster_seeds_: Sequence[dict]) -> tuple[list[str], dict[str, bytes], list[str]]:
    """An argv, the files it reads, and the flags a correct partita must refuse before any work."""
    files: dict[str, bytes] = {}
    must_reject: list[str] = []
    cmd = rng.choices(("simulate", "cluster", "calibrate"), (7, 1.5, 1.5))[0]
    if cmd == "cluster":
        r = rng.random()
        if r < 0.5:
            files["c.toml"], _ = cluster_file_bytes(rng, cluster_seeds_)
            argv = ["cluster", "c.toml"]
        else:
            argv = ["cluster"] + ([rng.choice(CLUSTER_PATH_JUNK)] if r < 0.9 else [])
        return argv, files, must_reject
    if cmd == "calibrate":
        argv = ["calibrate"]
        if rng.random() < 0.7:
            n = rng.choice(CAL_NPROC)
            argv += ["--nproc", n]
            if n.lstrip("-").isdigit() and int(n) >= CAL_MUST_REJECT_NPROC:
                must_reject.append("--nproc")
        if rng.random() < 0.5:
            n = rng.choice(CAL_NPROC)
            argv += ["--threads", n]
            if n.lstrip("-").isdigit() and int(n) >= CAL_MUST_REJECT_NPROC:
                must_reject.append("--threads")
        if rng.random() < 0.7:
            o = rng.choice(CAL_OUTPUT)
            argv += ["-o", o]
            if o in ("", ".", "missing/dir/c.toml", "sub"):  # /proc and /dev/full fail only when written
                must_reject.append("-o")
        if rng.random() < 0.5:
            argv.append("--quick")
        return argv, files, must_reject
    argv = ["simulate"]
    r = rng.random()
    if r < 0.7:
        argv += ["--gpt", rng.choice(SIM_GPT)]
    elif r < 0.95:
        name = rng.choice(sorted(SIM_PIR))
        files[name] = SIM_PIR[name]
        argv.append(name)
    else:
        argv += ["fwd.pir", "--gpt", SIM_GPT[0]] if rng.random() < 0.5 else []
        files["fwd.pir"] = SIM_PIR["fwd.pir"]
    if rng.random() < 0.8:
        argv += ["--mesh", rng.choice(SIM_MESH)]
    if rng.random() < 0.6:
        argv += ["--strategy", rng.choice(SIM_STRATEGY)]
    for flag, values, p in (("--microbatches", ("2", "4", "0", "-1", "10000000", "99999999999999999999", "x"), 0.3),
                            ("--virtual-stages", ("2", "1000000", "0"), 0.15),
                            ("--schedule", ("gpipe", "1f1b", "interleaved", "zero-bubble", "nope", ""), 0.3),
                            ("--trace", SIM_TRACE, 0.25),
                            ("--nodes", ("1", "2", "0", "99999999999999999999"), 0.1),
                            ("--dtype", ("bf16", "f32", "f16", "i4", "nope", ""), 0.15),
                            ("--recompute", ("none", "full", "nope"), 0.1),
                            ("--train", ("sgd", "adamw", "nope"), 0.1)):
        if rng.random() < p:
            argv += [flag, rng.choice(values)]
    if "--trace" in argv and argv[argv.index("--trace") + 1] != "t.json":
        must_reject.append("--trace")  # "", /dev/full, a folder, a missing folder: no trace can be written
    if rng.random() < 0.2:
        files["c.toml"], _ = cluster_file_bytes(rng, cluster_seeds_)
        argv += ["--cluster", "c.toml"]
    elif rng.random() < 0.1:
        argv += ["--cluster", rng.choice(CLUSTER_PATH_JUNK)]
    for flag in ("--every-rank", "--check-memory", "--master-weights"):
        if rng.random() < 0.1:
            argv.append(flag)
    return argv, files, must_reject


_NONFINITE = re.compile(r"(?<![\w.])(?:[-+]?inf(?:inity)?|nan)(?![\w])", re.IGNORECASE)


def _cli_places(argv: Sequence[str]) -> list[str]:
    """What an error message of ``argv`` may name: its file names, flags and values."""
    out = []
    for a in argv:
        if a:
            out.append(a + ": ")  # "error: .: Is a directory" names the path "."
        if a.startswith("-") and len(a) >= 2 and a != "--":
            out.append(a)  # "-o/--output: give a file name"
        if len(a) >= 3 and not re.fullmatch(r"[-+0-9.,=]*", a):
            out.append(a)
            if a.startswith("--"):
                out += [a[2:], a[2:].replace("-", "_")]
    return out


def check_cli_surface(counts: Counts, argv: Sequence[str], files: dict[str, bytes], cwd: Path,
                      must_reject: Sequence[str], timeout: float) -> None:
    """One command line in process: exit 0/1/2, no traceback, no hang, a placed message on
    exit 1, finite numbers on success, and calibrate's bad flags refused before measuring."""
    counts.cases += 1
    for name, data in files.items():
        (cwd / name).write_bytes(data)
    (cwd / "sub").mkdir(exist_ok=True)
    rc, out, err, measured = run_cli_capture(argv, timeout)
    repro = {"argv": "partita " + shlex.join(argv)}
    for name, data in files.items():
        try:
            repro[name] = data.decode("utf-8")
        except UnicodeDecodeError:
            repro[name + " (base64)"] = base64.b64encode(data).decode()
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if rc is None:
        counts.violate(f"{argv[0]}|{err}", "hang", f"no exit within {timeout} s (stopped in {err})", repro)
    elif "Traceback" in err:
        counts.violate(f"{argv[0]}|{_traceback_sig(err)}", "traceback", f"exit {rc}, traceback: {last}", repro)
    elif rc not in (0, 1, 2):
        # The first line names the exception ("internal error: ValueError: gpt: ..."), digits dropped.
        first = re.sub(r"[0-9]+", "#", err.strip().splitlines()[0] if err.strip() else "")
        counts.violate(f"{argv[0]}|{rc}|{first[:80]}", "exit-code", f"exit {rc}: {err.strip()[:600]}", repro)
    elif measured and must_reject:
        for flag in sorted(set(must_reject)):  # each flag checked too late is its own defect
            counts.violate(f"{argv[0]}|late|{flag}", "late-rejection",
                           f"calibrate started measuring with {flag} {argv[argv.index(flag) + 1]!r}, which it must "
                           "refuse before any work", repro)
    elif measured:
        counts.note("calibrate reached measure")
        counts.accepted += 1
    elif rc == 1 and "error" not in err:
        counts.violate(f"{argv[0]}|silent", "empty-message", f"exit 1 without an error message: {err[:300]}", repro)
    elif rc == 1 and not names_place(err, _cli_places(argv)):
        counts.violate(f"{argv[0]}|unplaced|{re.sub(r'[0-9]+', '#', last)[:60]}", "unplaced-message",
                       f"exit 1 naming no file, flag or value: {err.strip()[:300]}", repro)
    elif rc == 0 and must_reject:
        counts.violate(f"{argv[0]}|accepted|{','.join(sorted(set(must_reject)))}", "accepted-bad-value",
                       f"exit 0 with {', '.join(f'{f} {argv[argv.index(f) + 1]!r}' for f in must_reject)}", repro)
    elif rc == 0 and argv[0] == "simulate" and "--strategy" not in argv and re.search(
            r"^parallelize for mesh\((?!(\w+=1(, )?)*\))[^\n]*\) with none:", out, re.MULTILINE):
        # --help: "default: from the mesh axes"; none on a mesh of several devices is every
        # rank computing the whole step.
        counts.violate("simulate|default-strategy", "silently-wrong",
                       f"without --strategy the step was not parallelized: {out.strip().splitlines()[:2]}", repro)
    elif rc == 0:
        bad = _NONFINITE.search(out)
        if bad:
            counts.violate(f"{argv[0]}|nonfinite", "silently-wrong", f"success printing {bad.group(0)!r}: "
                           f"{out[max(0, bad.start() - 200):bad.end() + 100]}", repro)
        else:
            counts.accepted += 1
    else:
        counts.clean += 1


def target_simulate(seed: int = 0, cases: int | None = 60, seconds: float | None = None,
                    timeout: float = 10.0) -> Counts:
    counts = Counts("simulate")
    seeds = cluster_seeds()
    start = time.monotonic()
    with tempfile.TemporaryDirectory() as d, contextlib.chdir(d), _no_measuring():
        cwd = Path(d)
        for i in _case_numbers(cases, seconds, start):
            rng = random.Random(f"{seed}:simulate:{i}")
            if i < len(SIMULATE_ANCHORS):
                argv, names, must_reject = SIMULATE_ANCHORS[i]
                argv, files, must_reject = list(argv), {n: SIM_PIR[n] for n in names}, list(must_reject)
            else:
                argv, files, must_reject = simulate_case(rng, seeds)
            check_cli_surface(counts, argv, files, cwd, must_reject, timeout)
            for f in list(cwd.iterdir()):
                if f.is_file():
                    f.unlink()
    counts.seconds = time.monotonic() - start
    return counts


# --- target: torch.compile(backend="partita") -----------------------------------------------

COMPILE_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "float32", "float64", "bfloat16", "float16")
_COMPILE_TOL = {"float32": "f32", "float64": "f64", "bfloat16": "bf16", "float16": "f16"}
# (name, arity, int ok, float ok, text with a and b)
COMPILE_OPS = (
    ("add", 2, True, True, "{a} + {b}"), ("sub", 2, True, True, "{a} - {b}"), ("mul", 2, True, True, "{a} * {b}"),
    ("floordiv", 2, True, True, "{a} // {b}"),
    ("div_trunc", 2, True, True, "torch.div({a}, {b}, rounding_mode='trunc')"),
    ("div_floor", 2, True, True, "torch.div({a}, {b}, rounding_mode='floor')"),
    ("truediv", 2, False, True, "{a} / {b}"), ("remainder", 2, True, True, "torch.remainder({a}, {b})"),
    ("fmod", 2, True, True, "torch.fmod({a}, {b})"), ("abs", 1, True, True, "torch.abs({a})"),
    ("neg", 1, True, True, "-{a}"), ("minimum", 2, True, True, "torch.minimum({a}, {b})"),
    ("maximum", 2, True, True, "torch.maximum({a}, {b})"), ("lt", 2, True, True, "({a} < {b})"),
    ("eq", 2, True, True, "({a} == {b})"), ("ge", 2, True, True, "({a} >= {b})"),
    ("where", 2, True, True, "torch.where({a} > {b}, {a}, {b})"), ("sum", 1, True, True, "{a}.sum()"),
    ("sum_dim", 1, True, True, "{a}.sum(dim=-1)"), ("mul_add", 2, True, True, "{a} * {b} + {a}"),
)


def _edge_values(dtype: Any) -> list[Any]:
    import torch

    if dtype.is_floating_point:
        fi = torch.finfo(dtype)
        return [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 3.0, 7.0, float("nan"), float("inf"), float("-inf"), fi.max,
                -fi.max, fi.tiny, fi.eps, 1e30 if dtype != torch.float16 else 6e4]
    ii = torch.iinfo(dtype)
    vals = [0, 1, -1, 2, -2, 3, 7, -7, ii.min, ii.max, ii.min + 1, ii.max - 1]
    if dtype == torch.int64:
        vals += [2 ** 53 + 1, -(2 ** 53) - 3, 2 ** 60 + 7, 2 ** 62 - 1, 9007199254740993]
    return [v for v in vals if ii.min <= v <= ii.max]


def compile_case(rng: random.Random, dname: str) -> tuple[str, Any, list[Any], str, list[str]]:
    """(the function's source, the function, its inputs of dtype ``dname``, the dtype name,
    the ops' names)."""
    import torch

    dtype = getattr(torch, dname)
    ops = [o for o in COMPILE_OPS if (o[2] if not dtype.is_floating_point else o[3])]
    n = rng.choice((3, 4, 6))
    edges = _edge_values(dtype)

    def tensor():
        vals = [rng.choice(edges) if rng.random() < 0.6 else
                (rng.uniform(-10, 10) if dtype.is_floating_point else rng.randint(-9, 9)) for _ in range(n)]
        if not dtype.is_floating_point:
            ii = torch.iinfo(dtype)
            vals = [min(max(v, ii.min), ii.max) for v in vals]
        return torch.tensor(vals, dtype=dtype).reshape(2, n // 2) if n % 2 == 0 and rng.random() < 0.5 \
            else torch.tensor(vals, dtype=dtype)

    a, b = tensor(), tensor()
    if b.shape != a.shape:
        b = b.reshape(a.shape) if b.numel() == a.numel() else b
    first = rng.choice(ops)
    expr, names = first[4].format(a="a", b="b"), [first[0]]
    if rng.random() < 0.4 and first[0] not in ("lt", "eq", "ge", "sum", "sum_dim"):
        # A second op on the first's result (of the same dtype).
        second = rng.choice([o for o in ops if o[0] not in ("sum",)])
        expr = second[4].format(a=f"({expr})", b="b")
        names.append(second[0])
    src = f"def fn(a, b):\n    return {expr}\n"
    scope: dict[str, Any] = {"torch": torch}
    exec(compile(src, "<compile-case>", "exec"), scope)  # noqa: S102  (a generated test program)
    return src, scope["fn"], [a, b], dname, names


# Fixed first cases, so that a bounded run always meets them: int64 floor division of values
# above 2^53 (where a float intermediate rounds), and integer division by zero (which eager
# refuses).
COMPILE_ANCHORS = (
    ("def fn(a, b):\n    return a // b\n", "int64", [2 ** 53 + 1, 2 ** 62 - 1, -(2 ** 60) - 7], [1, 3, 7], ["floordiv"]),
    ("def fn(a, b):\n    return torch.div(a, b, rounding_mode='floor')\n", "int64",
     [9007199254740993, -9007199254740995, 2 ** 63 - 1], [1, 1, 2], ["div_floor"]),
    ("def fn(a, b):\n    return a // b\n", "int32", [7, -7, 0], [2, 0, 1], ["floordiv"]),
    # The same two inside one fused kernel (two ops or more).
    ("def fn(a, b):\n    return (a + b) // b\n", "int64", [2 ** 53 + 1, 2 ** 62 - 1, -(2 ** 60) - 7], [1, 3, 7],
     ["add", "floordiv"]),
    ("def fn(a, b):\n    return (a * b + a) // b\n", "uint8", [2, 2, 0], [0, 0, 0], ["mul_add", "floordiv"]),
)
# torch.compile options: (options, whether partita must refuse them).
COMPILE_OPTIONS = (({"passes": "nosuchpass"}, True), ({"passes": "dce{x=1}"}, True), ({"fallback": "nope"}, True),
                   ({"min_ops": -1}, True), ({"min_ops": "x"}, True), ({"passes": 3}, True), ({"nope": 1}, True),
                   ({"passes": ""}, False), ({"passes": "dce"}, False), ({"min_ops": 1}, False))


def _anchor_case(k: int) -> tuple[str, Any, list[Any], str, list[str]]:
    import torch

    src, dname, a, b, names = COMPILE_ANCHORS[k]
    scope: dict[str, Any] = {"torch": torch}
    exec(compile(src, "<compile-case>", "exec"), scope)  # noqa: S102  (a generated test program)
    dtype = getattr(torch, dname)
    return src, scope["fn"], [torch.tensor(a, dtype=dtype), torch.tensor(b, dtype=dtype)], dname, names


def _tensor_repr(t: Any) -> str:
    return f"torch.tensor({t.tolist()!r}, dtype=torch.{str(t.dtype).split('.')[-1]})"


def target_compile(seed: int = 0, cases: int | None = 60, seconds: float | None = None,
                   timeout: float = 20.0) -> Counts:
    """Small integer and float programs under ``torch.compile(backend="partita")``, compared
    with eager dtype by dtype."""
    import warnings

    import torch
    import torch._dynamo

    import partita.codegen.dynamo  # noqa: F401  (registers the backend)

    counts = Counts("compile")
    start = time.monotonic()
    for i in _case_numbers(cases, seconds, start):
        rng = random.Random(f"{seed}:compile:{i}")
        counts.cases += 1
        if i < len(COMPILE_ANCHORS):
            src, fn, inputs, dname, names = _anchor_case(i)
        else:
            src, fn, inputs, dname, names = compile_case(rng, COMPILE_DTYPES[i % len(COMPILE_DTYPES)])
        family = "float" if dname.startswith(("float", "bfloat")) else "int"
        options, must_refuse = rng.choice(COMPILE_OPTIONS) if rng.random() < 0.15 else (None, False)
        repro = {"program": src, "inputs": ", ".join(_tensor_repr(t) for t in inputs), "dtype": dname}
        if options is not None:
            repro["options"] = options
        try:
            want: Any = fn(*[t.clone() for t in inputs])
            eager_error = None
        except Exception as e:  # noqa: BLE001  (the user's program raising is a fact to compare)
            want, eager_error = None, e
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="partita", dynamic=False,
                                 **({"options": options} if options is not None else {}))

        def run():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return compiled(*[t.clone() for t in inputs])

        try:
            with time_limit(timeout):
                got = run()
        except CaseTimeout:
            counts.violate(f"hang|{family}|{','.join(names)}", "hang", f"no answer within {timeout} s", repro)
            continue
        except Exception as e:  # noqa: BLE001
            if eager_error is not None or must_refuse:
                counts.clean += 1
            else:
                counts.violate(f"{type(e).__name__}@{_where(e, False)}|{family}", "crash",
                               f"eager gave a value, compiled raised {type(e).__name__}: {str(e)[:400]}", repro)
            continue
        if must_refuse:
            counts.violate(f"options|{','.join(sorted(options))}", "accepted-bad-value",
                           f"torch.compile(backend='partita', options={options!r}) ran without an error", repro)
            continue
        if eager_error is not None:
            counts.violate(f"value-where-eager-raised|{family}|{type(eager_error).__name__}:"
                           f"{re.sub(r'[0-9]+', '#', str(eager_error))[:40]}",
                           "silently-wrong", f"eager raised {type(eager_error).__name__}: {str(eager_error)[:200]}; "
                           f"compiled returned {got!r}"[:600], repro)
            continue
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            counts.violate(f"dtype-shape|{dname}|{','.join(names)}", "mismatch",
                           f"compiled {got.dtype} {tuple(got.shape)} vs eager {want.dtype} {tuple(want.shape)}", repro)
            continue
        tol = _COMPILE_TOL.get(str(want.dtype).split(".")[-1], _COMPILE_TOL.get(dname, "f32"))
        d = compare(got, want, tol if want.dtype.is_floating_point else "i64")
        if d:
            counts.violate(f"{family}|{','.join(names)}", "mismatch", f"compiled vs eager: {d}", repro)
        else:
            counts.accepted += 1
    torch._dynamo.reset()
    counts.seconds = time.monotonic() - start
    return counts


# --- target: pipeline options of parallelize ------------------------------------------------

# Meshes and strategies that fit the 2-layer step, then ones that do not.
PIPELINE_PLANS = (("pp=2", "pp"), ("pp=2,dp=2", "pp+dp"), ("pp=2,tp=2", "pp+megatron"), ("pp=2,dp=2", "pp+zero3"),
                  ("pp=2,dp=2,tp=2", "pp+dp+megatron"))
PIPELINE_BAD_PLANS = (("pp=4", "pp"), ("pp=3", "pp"), ("pp=99999999999999999999", "pp"), ("pp=0", "pp"),
                      ("pp=2,zz=2", "pp+dp"), ("dp=2", "dp"), ("pp=2", None), ("pp=2", "nope"), ("pp=2", "pp+pp"),
                      ("pp=2", "dp"))
PIPELINE_OPTIONS: dict[str, tuple[Any, ...]] = {
    "microbatches": (1, 2, 4, 0, -1, 10 ** 8, 10 ** 20, 2.5, "2", True, None, [2]),
    "schedule": ("1f1b", "gpipe", "interleaved", "zero-bubble", "nope", "", 3, None, "1F1B"),
    "virtual_stages": (1, 2, 10 ** 6, 0, -1, "2", True, 2.0, 10 ** 20),
    "unroll": (True, False, "no", "yes", 0, 1, None, [], "False"),
    "stages": (None, [1], [1, 1], [2, 0], ["h.1"], {"a": 1}, [-1, 3], ["nope"], [10 ** 20], "h.1", [[1]], [],
               [1, 1, 1, 1, 1], ("h.1",), [True]),
    "recompute": ("full", "selective", "cheap", "none", True, False, "nope", 3),
}


def target_pipeline(seed: int = 0, cases: int | None = 100, seconds: float | None = None,
                    timeout: float = 5.0) -> Counts:
    """``partita.parallelize`` of a small GPT training step over pipeline meshes with bad and
    huge pipeline options."""
    counts = Counts("pipeline")
    start = time.monotonic()
    step = _tiny_gpt_step()
    for i in _case_numbers(cases, seconds, start):
        rng = random.Random(f"{seed}:pipeline:{i}")
        counts.cases += 1
        mesh, strategy = rng.choice(PIPELINE_PLANS if rng.random() < 0.8 else PIPELINE_BAD_PLANS)
        opts = {k: rng.choice(PIPELINE_OPTIONS[k])
                for k in rng.sample(sorted(PIPELINE_OPTIONS), rng.choice((1, 1, 2, 3)))}
        call = f"parallelize(step, {mesh!r}, {strategy!r}" + "".join(f", {k}={v!r}" for k, v in opts.items()) + ")"
        repro = {"call": call, "step": "training_step(gpt(2, 32, 2, 8, 64, batch=4), loss='cross_entropy', "
                                        "optimizer='sgd')"}

        def run():
            with memory_limit(CASE_MEMORY_BYTES):
                return partita.parallelize(step, mesh, strategy, **opts)

        # A message may name the place by quoting the bad value itself (a cut point, a schedule).
        quoted = [x for v in opts.values() for x in (v if isinstance(v, (list, tuple)) else [v])
                  if isinstance(x, str) and x.strip()]
        places = ["parallelize", mesh, *opts, *quoted] + ([strategy] if strategy else [])
        status, _ = attempt(counts, run, repro, places, timeout, hang_where=True)
        if status != "ok":
            continue
        u = opts.get("unroll", True)
        if not isinstance(u, bool):
            counts.violate("parallelize|unroll", "accepted-bad-value", f"parallelize accepted unroll={u!r}", repro)
            continue
        bad = [k for k in ("microbatches", "virtual_stages") if k in opts and opts[k] is not None
               and (isinstance(opts[k], bool) or not isinstance(opts[k], int) or opts[k] < 1)]
        if bad:
            counts.violate(f"parallelize|{','.join(bad)}", "accepted-bad-value",
                           f"parallelize accepted {', '.join(f'{k}={opts[k]!r}' for k in bad)}", repro)
            continue
        counts.accepted += 1
    counts.seconds = time.monotonic() - start
    return counts


# --- the whole campaign ---------------------------------------------------------------------

TARGET_FUNCS: dict[str, Callable[..., Counts]] = {
    "pir": target_pir, "onnx": target_onnx, "api": target_api, "graphs": target_graphs, "cli": target_cli,
    "cluster": target_cluster, "simulate": target_simulate, "compile": target_compile, "pipeline": target_pipeline,
}


def table(results: dict[str, Counts]) -> str:
    rows = [("target", "cases", "accepted", "clean errors", "violations", "distinct", "seconds")]
    for t, c in results.items():
        rows.append((t, str(c.cases), str(c.accepted), str(c.clean), str(c.n_violations), str(len(c.violations)),
                     f"{c.seconds:.1f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(r, widths)))
                     for r in rows)
