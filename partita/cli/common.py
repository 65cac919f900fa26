"""What the commands of ``partita`` share: exit codes, the error handling that turns an
exception into one message and an exit code, the weights beside a ``.pir`` file, random
inputs, and text tables.

Exit codes: 0 success, 1 an error the user can fix (a ``PartitaError``, a missing file, an
interrupt), 2 a usage error (bad flags), 3 an internal error (a bug in partita). Errors
print as one ``error: ...`` message without a traceback; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ..ir.attrs import memory_limit
from ..ir.diagnostics import PartitaError, WeightsError
from ..ir.graph import Graph, Value, input_name
from ..ir.types import TensorType

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3

DEFAULT_PIPELINE = "canonicalize,cse,fold-constants,dce"
EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
DEMO_MODEL = EXAMPLES_DIR / "block.pir"


class CLIError(PartitaError):
    """A problem with what was asked of the command line (not with the IR itself)."""

# --- errors and exit codes ------------------------------------------------------------------

def run_command(handler: Callable[[argparse.Namespace], int | None], args: argparse.Namespace,
                debug: bool) -> int:
    """Run one command's handler and turn what it raises into a message and an exit code."""
    try:
        return handler(args) or EXIT_OK
    except BrokenPipeError:
        # The reader of our stdout went away (e.g. `partita ops | head`): not an error of ours.
        silence_stdout()
        return EXIT_ERROR
    except KeyboardInterrupt:
        report(debug, "error: interrupted")
        return EXIT_ERROR
    except PartitaError as e:
        report(debug, user_message(e))
        return EXIT_ERROR
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        report(debug, f"error: {where}{e.strerror or e}")
        return EXIT_ERROR
    except Exception as e:
        report(debug, f"internal error: {type(e).__name__}: {e}\n"
                      "This is a bug in partita, not in your input. "
                      "Run the same command with --debug to see the traceback.")
        return EXIT_INTERNAL


def user_message(e: PartitaError) -> str:
    msg = str(e) or type(e).__name__
    # Parse and verifier errors already read "file:line:col: error: ...", the usual
    # compiler form; prefixing another "error:" would only add noise.
    first = msg.split("\n", 1)[0]
    return msg if ": error: " in first or first.startswith("error: ") else f"error: {msg}"


def report(debug: bool, message: str) -> None:
    if debug:
        traceback.print_exc(file=sys.stderr)
    print(message, file=sys.stderr)


def silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass  # stdout is not a real file (e.g. captured in tests): nothing to silence


# --- helpers shared by the commands ---------------------------------------------------------

def pass_manager(pipeline: str, **options: Any):
    from ..passes.manager import PassManager

    return PassManager.parse(pipeline, **options)


def name_list(values: list[str]) -> tuple[str, ...]:
    """Flags given several times or as 'a,b' both become ('a', 'b')."""
    out: list[str] = []
    for v in values:
        out.extend(x.strip() for x in v.split(",") if x.strip())
    return tuple(out)


def weights_path(pir_path: str | os.PathLike) -> Path:
    """Where the weights of a ``.pir`` file live: the ``.safetensors`` file beside it."""
    return Path(pir_path).with_suffix(".safetensors")


def weight_problems(graph: Graph) -> list[str]:
    """Each param or state input that has no weight, or a weight of another type."""
    from ..ir.dtypes import from_numpy

    problems = []
    for v in graph.inputs:
        if v.role == "input":
            continue
        name = input_name(v)
        if name not in graph.weights:
            problems.append(f"no weight for %{name} ({v.role}, {v.type})")
            continue
        a = graph.weights[name]
        got = f"{from_numpy(a.dtype).name}[{','.join(map(str, a.shape))}]"
        if got != str(v.type):
            problems.append(f"%{v.name} ({v.role}) is {v.type} in the graph but {got} in the weights file")
    return problems


def require_weights(graph: Graph, pir_path: str | os.PathLike) -> None:
    """Raise a WeightsError naming the weights file and each param/state it fails to supply."""
    needed = [v for v in graph.inputs if v.role != "input"]
    if not needed:
        return
    wpath = weights_path(pir_path)
    if not wpath.exists():
        names = ", ".join(f"%{v.name}" for v in needed)
        raise WeightsError(f"{pir_path} needs weights for {len(needed)} param/state input(s) ({names}), "
                           f"but {wpath} does not exist; put the weights there (partita.save writes "
                           "both files)")
    problems = weight_problems(graph)
    if problems:
        raise WeightsError(f"{wpath} does not match {pir_path}: " + "; ".join(problems))


def random_inputs(graph: Graph, seed: int) -> dict[str, np.ndarray]:
    """Random arrays for the ``input``-role values of ``graph``, reproducible from ``seed``.

    Floats are standard normal, integers uniform in [0, 8) (small enough to be valid
    indices into most dimensions), bools fair coin flips.
    """
    rng = np.random.default_rng(seed)
    out = {}
    for v in graph.inputs:
        if v.role != "input":
            continue
        t = v.type
        if t.dtype.is_float:
            a = random_array(v, lambda: rng.standard_normal(t.shape).astype(t.dtype.np))
        elif t.dtype.is_int:
            a = random_array(v, lambda: rng.integers(0, 8, size=t.shape).astype(t.dtype.np))
        else:
            a = random_array(v, lambda: rng.random(t.shape) < 0.5)
        out[input_name(v)] = np.asarray(a)
    return out


def random_array(v: Value, make: Callable[[], np.ndarray]) -> np.ndarray:
    """``make()``, the random value of graph input ``v``; a CLIError naming ``v`` when its type
    is more than NumPy can hold (over 64 dims) or than this machine's memory can (the random
    numbers are drawn in 64 bits before they are cast)."""
    t = v.type
    too_big = too_big_for_memory(t, 8)
    if too_big:
        raise CLIError(f"input %{input_name(v)} is {t}: {too_big}; give it a smaller shape")
    try:
        return make()
    except (ValueError, MemoryError) as e:
        raise CLIError(f"input %{input_name(v)} is {t}: NumPy cannot make random values of that shape "
                       f"({type(e).__name__}: {e or 'out of memory'}); give it a smaller shape, of at most "
                       "64 dims") from None


def too_big_for_memory(t: TensorType, drawn_itemsize: int) -> str | None:
    """Why random values of type ``t``, drawn ``drawn_itemsize`` bytes each before their cast,
    are more than this machine's memory holds (ir.attrs.memory_limit); None when they fit."""
    need = t.numel * max(drawn_itemsize, t.dtype.itemsize)
    memory = memory_limit()
    if need > memory:
        return f"{_bytes(need)} of random values, more than this machine's {_bytes(memory)} of memory"
    return None


def _bytes(n: int) -> str:
    x: float = n
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if x < 1024 or unit == "EiB":
            return f"{n} {unit}" if unit == "bytes" else f"{x:.3g} {unit}"
        x /= 1024
    return f"{x:.3g} EiB"


# --- argument types: a value out of range is a usage error (exit 2) --------------------------

SEED_MAX = 2 ** 32 - 1


def seed_arg(text: str) -> int:
    """A ``--seed``: an integer 0..2**32-1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; seeds are 0..2**32-1") from None
    if not 0 <= n <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"{n} is out of range; seeds are 0..2**32-1 (0..{SEED_MAX})")
    return n


def int_arg(low: int, high: int | None = None, why: str = "") -> Callable[[str], int]:
    """An integer flag of at least ``low`` and, given ``high``, at most ``high`` (``why``
    says where that bound comes from)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not an integer") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {n}")
        if high is not None and n > high:
            raise argparse.ArgumentTypeError(f"must be at most {high}{' (' + why + ')' if why else ''}, got "
                                             f"{n if n < 10 ** 30 else f'an integer of {len(str(n))} digits'}")
        return n
    return parse


def check_output_path(path: Any, flag: str) -> Path:
    """``path`` given to ``flag`` as a file partita can write, checked before any work: not
    empty, no NUL byte, not a folder, its folder existing and writable. Raises CLIError naming
    the flag and the path."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else None
    if not isinstance(text, str) or not text.strip():
        raise CLIError(f"{flag}: give a file name to write, got {path!r:.60}")
    if "\0" in text:
        raise CLIError(f"{flag} {text!r:.80}: a file name cannot hold a NUL byte")
    p = Path(text)
    if p.is_dir():
        raise CLIError(f"{flag} {text}: is a folder; give a file name (e.g. {p / 'out'}{p.suffix})")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise CLIError(f"{flag} {text}: the folder {parent} does not exist; create it or write elsewhere")
    if p.exists() and not os.access(p, os.W_OK) or not p.exists() and not os.access(parent, os.W_OK):
        raise CLIError(f"{flag} {text}: not writable here (permission denied); write elsewhere")
    return p


def float_arg(low: float, above: bool = False) -> Callable[[str], float]:
    """A finite number of at least ``low`` (``above``: more than ``low``)."""
    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not math.isfinite(x):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if x < low or (above and x == low):
            raise argparse.ArgumentTypeError(f"must be {'more than' if above else 'at least'} {low:g}, got {text}")
        return x
    return parse


def summary_fields(a: np.ndarray, first: int = 4) -> list[str]:
    """min, max, mean, std and the first few values of an array, as display strings.

    Statistics are over the finite values (computed in f64); NaN and infinity are counted
    separately so they cannot hide.
    """
    flat = np.asarray(a).reshape(-1)
    if flat.size == 0:
        return ["-", "-", "-", "-", "(empty)"]
    head = ", ".join(fmt_value(x) for x in flat[:first].tolist())
    if flat.size > first:
        head += ", ..."
    head = f"[{head}]"
    if flat.dtype == np.bool_:
        n = int(flat.sum())
        return ["false" if n < flat.size else "true", "true" if n else "false",
                f"{n / flat.size:.3g}", "-", f"{head} ({n}/{flat.size} true)"]
    x = flat.astype(np.float64)
    finite = np.isfinite(x)
    bad = flat.size - int(finite.sum())
    if bad:
        n_nan = int(np.isnan(x).sum())
        head += f" ({n_nan} nan, {bad - n_nan} inf)"
        x = x[finite]
        if x.size == 0:
            return ["-", "-", "-", "-", head]
    return [fmt_value(x.min()), fmt_value(x.max()), f"{x.mean():.4g}", f"{x.std():.4g}", head]


def fmt_value(x: Any) -> str:
    if isinstance(x, (bool, np.bool_)):
        return "true" if x else "false"
    if isinstance(x, (int, np.integer)):
        return str(int(x))
    return f"{float(x):.4g}"


def compare(xs: list[np.ndarray], ys: list[np.ndarray], rtol: float, atol: float) -> tuple[float, bool]:
    """The largest |x - y| over pairs of arrays, and whether all agree within tolerances.

    NaN in the same place on both sides counts as agreement (same as ``equal_nan``).
    """
    worst = 0.0
    ok = len(xs) == len(ys)
    for x, y in zip(xs, ys):
        if x.shape != y.shape:
            return float("inf"), False
        a, b = x.astype(np.float64), y.astype(np.float64)
        with np.errstate(invalid="ignore"):
            d = np.abs(a - b)
        same_special = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
        d = np.where(same_special, 0.0, d)
        d = np.where(np.isnan(d), np.inf, d)  # NaN against a number: as different as can be
        if d.size:
            worst = max(worst, float(d.max()))
        ok &= bool(np.all(d <= atol + rtol * np.where(np.isfinite(b), np.abs(b), 0.0)))
    return worst, ok


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """Left-aligned text columns, two spaces apart, with a rule under the header."""
    cols = len(header)
    widths = [len(h) for h in header]
    for r in rows:
        for i in range(cols):
            widths[i] = max(widths[i], len(r[i]))

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def display_name(v: Value, i: int) -> str:
    return v.name if v.name is not None else f"out{i}"


def short(path: str | os.PathLike) -> str:
    """A path relative to the current directory when that is shorter."""
    p = Path(path)
    try:
        rel = os.path.relpath(p)
    except ValueError:
        return str(p)
    return rel if len(rel) < len(str(p)) else str(p)


class Section:
    """Prints section titles, separated by a blank line."""

    def __init__(self) -> None:
        self.first = True

    def title(self, text: str) -> None:
        if not self.first:
            print()
        self.first = False
        print(f"== {text} ==")
