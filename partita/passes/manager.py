"""The pass manager: the registry of passes, pipeline strings, and instrumentation.

A pipeline is a string such as ``"canonicalize,cse,fold-constants{max-elements=1024},dce"``.
``PassManager.parse`` turns it into pass instances (typed options checked up front) and
``PassManager.run`` runs them in order on a graph: it times each pass, can print the IR
before or after any pass, verifies the graph after each pass, and when a pass fails writes a
reproducer file holding the IR as it was before the failing pass.

Grammar (whitespace around tokens is ignored)::

    pipeline := entry ("," entry)*
    entry    := NAME ("{" [option ("," option)*] "}")?
    option   := NAME "=" value
    value    := an int, a float, true/false, a bare word, or a quoted string

An item inside braces that has no ``=`` continues the previous string option's value, so
``propagate{mesh=dp:2,tp:2}`` reads ``mesh`` as ``"dp:2,tp:2"``.
"""

from __future__ import annotations

import dataclasses
import io
import re
import shlex
import sys
import time
import typing
from pathlib import Path
from typing import Any, ClassVar, TextIO

from ..ir.diagnostics import PartitaError, PassError, VerifyError, suggest
from ..ir.graph import Graph, bulk_build
from ..ir.printer import print_graph
from ..ir.verifier import verify


@dataclasses.dataclass
class _NoOptions:
    """A pass without options."""


class Pass:
    """Base class of every pass: a named ``Graph -> Graph`` transformation with typed options.

    Subclasses set ``name`` (kebab-case, unique), may define a nested ``@dataclass`` named
    ``Options`` whose fields (all with defaults) are the pass's options, and implement
    ``run``. ``run`` may edit the graph in place; it returns the resulting graph, which must
    be valid IR whenever its input was.
    """

    name: ClassVar[str] = ""
    Options: ClassVar[type] = _NoOptions

    def __init__(self, options: Any = None) -> None:
        self.options = options if options is not None else type(self).Options()
        # Where a pass writes optional diagnostics (a rewrite trace); the manager sets it.
        self.out: TextIO = sys.stderr

    def run(self, graph: Graph) -> Graph:
        """Transform ``graph`` and return the result."""
        raise NotImplementedError(f"pass '{self.name}' does not implement run()")

    def text(self) -> str:
        """This pass as pipeline text: its name and the options that differ from defaults."""
        return _entry_text(type(self), self.options)

    def __repr__(self) -> str:
        return f"<Pass {self.text()}>"


PASSES: dict[str, type[Pass]] = {}

_KEBAB = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*\Z")


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator: add a pass to ``PASSES`` under its ``name`` after checking it."""
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not _KEBAB.match(name):
        raise ValueError(f"pass class {cls.__name__}: name must be kebab-case like 'fold-constants', got {name!r}")
    if name in PASSES and PASSES[name] is not cls:
        raise ValueError(f"pass '{name}' registered twice ({PASSES[name].__module__} and {cls.__module__})")
    opts = cls.Options
    if not dataclasses.is_dataclass(opts):
        raise ValueError(f"pass '{name}': Options must be a dataclass")
    for f in dataclasses.fields(opts):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ValueError(f"pass '{name}': option '{f.name}' needs a default")
        _option_kind(cls, f)  # fails early on an option type pipelines cannot spell
    PASSES[name] = cls
    return cls


# Every pass partita ships, by name, and the module that defines (and registers) it: a
# pipeline finds a pass by its name whatever happens to have been imported before (the
# module is imported on first use). A new pass adds its line here; a test checks that each
# module registers exactly the names listed for it, and that every registered pass is listed.
PASS_MODULES: dict[str, str] = {
    # graph cleanups (partita/passes/)
    "canonicalize": "partita.passes.canonicalize",
    "cse": "partita.passes.cse",
    "dce": "partita.passes.dce",
    "fold-constants": "partita.passes.fold",
    "fuse-activations": "partita.passes.fuse",
    "split-projections": "partita.passes.split_projections",
    "quantize": "partita.passes.quantize",
    # training (partita/autodiff/)
    "grad": "partita.autodiff.grad",
    "sgd": "partita.autodiff.optim",
    "adamw": "partita.autodiff.optim",
    "recompute": "partita.autodiff.recompute",
    # parallelism (partita/parallel/)
    "propagate": "partita.parallel.propagate",
    "partition": "partita.parallel.partition",
    "bucket-gradients": "partita.parallel.bucket",
    "bucket-gathers": "partita.parallel.bucket",
    "order-collectives": "partita.parallel.bucket",
    # code generation (partita/codegen/)
    "fold-batch-norm": "partita.codegen.inference",
    "fold-params": "partita.codegen.inference",
    "assign-layout": "partita.codegen.layout",
    "fuse-kernels": "partita.codegen.fusion",
    "fuse-library": "partita.codegen.library",
    "scale-fold": "partita.codegen.scale_fold",
    "merge-linears": "partita.codegen.merge_linear",
}


def pass_names() -> list[str]:
    """The names of every pass (the shipped ones and any registered since), sorted."""
    return sorted(set(PASS_MODULES) | set(PASSES))


def find_pass(name: str) -> type[Pass] | None:
    """The pass class named ``name``, importing its module on first use; None if none is."""
    cls = PASSES.get(name)
    if cls is None and isinstance(name, str) and name in PASS_MODULES:
        import importlib

        importlib.import_module(PASS_MODULES[name])
        cls = PASSES.get(name)
    return cls


def get_pass(name: str) -> type[Pass]:
    """The pass class named ``name``; PassError with the closest name otherwise."""
    cls = find_pass(name)
    if cls is None:
        raise PassError(f"unknown pass '{name}'{suggest(name, pass_names())}; "
                        f"available passes: {', '.join(pass_names())}")
    return cls


# --- options ---------------------------------------------------------------------------

def _kebab(field_name: str) -> str:
    return field_name.replace("_", "-")


def _option_kind(cls: type[Pass], f: dataclasses.Field) -> Any:
    """The Python type of an option: int, float, bool, str, or a tuple of allowed strings."""
    hints = typing.get_type_hints(cls.Options)
    t = hints.get(f.name, f.type)
    if typing.get_origin(t) is typing.Literal:
        choices = typing.get_args(t)
        if not all(isinstance(c, str) for c in choices):
            raise ValueError(f"pass '{cls.name}': option '{f.name}' may only list strings in Literal[...]")
        return tuple(choices)
    if t in (int, float, bool, str):
        return t
    raise ValueError(f"pass '{cls.name}': option '{f.name}' has type {t!r}; "
                     "options are int, float, bool, str or Literal[...] of strings")


def _describe_kind(kind: Any) -> str:
    if isinstance(kind, tuple):
        return "one of " + ", ".join(kind)
    return {int: "an integer", float: "a number", bool: "true or false", str: "a word"}[kind]


def _convert(kind: Any, raw: str) -> Any:
    """Convert option text to ``kind``; ValueError when it does not fit."""
    if kind is bool:
        if raw in ("true", "false"):
            return raw == "true"
        raise ValueError
    if kind is int:
        if re.fullmatch(r"[-+]?(?:0[xX][0-9a-fA-F_]+|[0-9][0-9_]*)", raw):
            return int(raw, 0) if raw.lstrip("+-")[:2].lower() == "0x" else int(raw.replace("_", ""))
        raise ValueError
    if kind is float:
        if raw.lower() in ("nan", "+nan", "-nan") or not re.fullmatch(r"[-+]?[0-9._eE+-]+|[-+]?inf", raw):
            raise ValueError
        return float(raw)
    if isinstance(kind, tuple):
        if raw in kind:
            return raw
        raise ValueError
    return raw


def _format_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    s = str(v)
    if s == "" or re.search(r"[\s{}=,\"']", s):
        return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return s


def _entry_text(cls: type[Pass], options: Any) -> str:
    parts = []
    for f in dataclasses.fields(options):
        v = getattr(options, f.name)
        if f.default is not dataclasses.MISSING:
            default = f.default
        else:
            factory = f.default_factory
            assert factory is not dataclasses.MISSING, f"option {f.name} of pass {cls.name} has no default"
            default = factory()
        if type(v) is not type(default) or v != default:
            parts.append(f"{_kebab(f.name)}={_format_value(v)}")
    return cls.name + ("{" + ",".join(parts) + "}" if parts else "")


# --- pipeline parsing --------------------------------------------------------------------

_PIPE_TOKEN = re.compile(r"""\s*(?:(?P<punct>[{},=])|(?P<string>"(?:[^"\\]|\\.)*"|'[^']*')|(?P<word>[^\s{},="']+))""")


class _PipelineParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            m = _PIPE_TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                if text[pos:].strip() == "":
                    break
                col = pos + len(text[pos:]) - len(text[pos:].lstrip())
                ch = text[col]
                what = "an unterminated quoted string" if ch in "\"'" else f"unexpected character {ch!r}"
                raise self.error(col, what)
            kind = m.lastgroup or ""
            start = m.start(kind)
            val = m.group(kind)
            if kind == "string":
                val = val[1:-1] if val[0] == "'" else re.sub(r"\\(.)", r"\1", val[1:-1])
            self.tokens.append((kind, val, start))
            pos = m.end()
        self.i = 0

    def error(self, col: int, msg: str) -> PassError:
        """A PassError that names the 1-based column and draws a caret under it."""
        return PassError(f"pipeline column {col + 1}: {msg}\n  {self.text}\n  {' ' * col}^")

    def peek(self) -> tuple[str, str, int]:
        if self.i < len(self.tokens):
            return self.tokens[self.i]
        return ("eof", "", len(self.text))

    def advance(self) -> tuple[str, str, int]:
        t = self.peek()
        self.i += 1
        return t

    @staticmethod
    def describe(tok: tuple[str, str, int]) -> str:
        return "the end of the pipeline" if tok[0] == "eof" else repr(tok[1])

    def parse(self) -> list[Pass]:
        if not self.tokens:
            raise PassError("empty pipeline: give pass names separated by commas, e.g. 'canonicalize,cse,dce'; "
                            f"available passes: {', '.join(pass_names())}")
        passes = []
        while True:
            passes.append(self.parse_entry())
            tok = self.advance()
            if tok[0] == "eof":
                return passes
            if tok[1] != ",":
                raise self.error(tok[2], f"expected ',' between passes, found {self.describe(tok)}")

    def parse_entry(self) -> Pass:
        kind, name, col = self.advance()
        if kind != "word":
            raise self.error(col, f"expected a pass name, found {self.describe((kind, name, col))}")
        cls = find_pass(name)
        if cls is None:
            raise self.error(col, f"unknown pass '{name}'{suggest(name, pass_names())}; "
                                  f"available passes: {', '.join(pass_names())}")
        fields = {_kebab(f.name): f for f in dataclasses.fields(cls.Options)}
        values: dict[str, Any] = {}
        if self.peek()[1] == "{" and self.peek()[0] == "punct":
            self.advance()
            last: str | None = None
            while not (self.peek()[0] == "punct" and self.peek()[1] == "}"):
                if self.peek()[0] == "eof":
                    raise self.error(len(self.text), f"expected '}}' to close the options of '{name}'")
                okind, oname, ocol = self.advance()
                if okind not in ("word", "string"):
                    raise self.error(ocol, f"expected an option name of '{name}', found {self.describe((okind, oname, ocol))}")
                if not (self.peek()[0] == "punct" and self.peek()[1] == "="):
                    if last is not None and _option_kind(cls, fields[last]) is str:
                        values[last] = (values[last][0] + "," + oname, values[last][1])
                        self._after_option(name)
                        continue
                    raise self.error(ocol, f"expected 'option=value' in the options of '{name}', found {oname!r}"
                                           + self._options_hint(cls, fields))
                if oname not in fields:
                    raise self.error(ocol, f"pass '{name}' has no option '{oname}'{suggest(oname, fields)}"
                                           + self._options_hint(cls, fields))
                if oname in values:
                    raise self.error(ocol, f"option '{oname}' of '{name}' is given twice")
                self.advance()  # '='
                vkind, vtext, vcol = self.advance()
                if vkind not in ("word", "string"):
                    raise self.error(vcol, f"expected a value for option '{oname}' of '{name}', "
                                           f"found {self.describe((vkind, vtext, vcol))}")
                values[oname] = (vtext, vcol)
                last = oname
                self._after_option(name)
            self.advance()  # '}'
        kwargs = {}
        for oname, (raw, vcol) in values.items():
            f = fields[oname]
            kind = _option_kind(cls, f)
            try:
                kwargs[f.name] = _convert(kind, raw)
            except ValueError:
                raise self.error(vcol, f"option '{oname}' of '{name}' must be {_describe_kind(kind)}, "
                                       f"got {raw!r}") from None
        try:
            options = cls.Options(**kwargs)
        except (TypeError, ValueError) as e:
            raise PassError(f"pass '{name}': invalid options: {e}") from None
        return cls(options)

    def _after_option(self, name: str) -> None:
        t = self.peek()
        if t[0] == "punct" and t[1] == ",":
            self.advance()
        elif not (t[0] == "punct" and t[1] == "}"):
            raise self.error(t[2], f"expected ',' or '}}' after an option of '{name}', found {self.describe(t)}")

    @staticmethod
    def _options_hint(cls: type[Pass], fields: dict) -> str:
        if not fields:
            return f"; '{cls.name}' takes no options"
        return "; its options are: " + ", ".join(
            f"{k} ({_describe_kind(_option_kind(cls, f))})" for k, f in fields.items())


# --- the manager -------------------------------------------------------------------------

class PassManager:
    """Runs a list of passes with timing, IR printing, verification and reproducers."""

    def __init__(self, passes: list[Pass], *, verify_each: bool = True, timing: bool = False,
                 print_ir_before: typing.Iterable[str] = (), print_ir_after: typing.Iterable[str] = (),
                 out: TextIO | None = None, reproducer_dir: str | Path | None = ".",
                 snapshot: bool = True) -> None:
        self.passes = list(passes)
        self.verify_each = verify_each
        self.timing = timing
        self.print_ir_before = _check_print_names(print_ir_before, "print_ir_before")
        self.print_ir_after = _check_print_names(print_ir_after, "print_ir_after")
        self.out: TextIO = out if out is not None else sys.stderr
        self.reproducer_dir = reproducer_dir
        self.snapshot = snapshot
        # (pass text, seconds, nodes before, nodes after), one entry per pass run.
        self.timings: list[tuple[str, float, int, int]] = []

    @classmethod
    def parse(cls, pipeline: str, *, verify_each: bool = True, timing: bool = False,
              print_ir_before: typing.Iterable[str] = (), print_ir_after: typing.Iterable[str] = (),
              out: TextIO | None = None, reproducer_dir: str | Path | None = ".",
              snapshot: bool = True) -> "PassManager":
        """Build a manager from pipeline text; PassError (with column and choices) if malformed."""
        if not isinstance(pipeline, str):
            raise PassError(f"a pipeline is a string like 'canonicalize,cse,dce', got {type(pipeline).__name__}")
        for flag, value in (("verify_each", verify_each), ("timing", timing), ("snapshot", snapshot)):
            if not isinstance(value, bool):
                raise PassError(f"pass manager option {flag} must be True or False, got {type(value).__name__}")
        passes = _PipelineParser(pipeline).parse()
        return cls(passes, verify_each=verify_each, timing=timing, print_ir_before=print_ir_before,
                   print_ir_after=print_ir_after, out=out, reproducer_dir=reproducer_dir, snapshot=snapshot)

    def pipeline_text(self) -> str:
        """The pipeline as text; ``PassManager.parse`` of it builds the same passes."""
        return ",".join(p.text() for p in self.passes)

    def run(self, graph: Graph) -> Graph:
        """Run every pass in order on ``graph``; returns the final graph.

        Raises PassError when a pass raises or (with ``verify_each``) leaves invalid IR,
        after writing a reproducer with the IR from before that pass.
        """
        self.timings = []
        # Passes make and drop many IR objects; pausing the cycle collector keeps it from
        # rescanning the whole graph again and again (it runs once afterwards).
        with bulk_build():
            return self._run_passes(graph)

    def _run_passes(self, graph: Graph) -> Graph:
        if self.verify_each:
            try:
                verify(graph)
            except VerifyError as e:
                raise PassError(f"the input of pipeline '{self.pipeline_text()}' is invalid IR "
                                f"(no pass has run yet): {e}") from None
        # One copy of the input, not one per pass: on a failure the passes before the failing
        # one are replayed on it (passes are deterministic) to recover the IR it was given.
        start = graph.clone() if self.snapshot and self.reproducer_dir is not None else None
        for k, p in enumerate(self.passes):
            name = p.text()
            if p.name in self.print_ir_before or "all" in self.print_ir_before:
                self._print_ir(f"before {name}", graph)
            snap = _Replay(start, self.passes[:k])
            before = len(graph)
            p.out = self.out
            t0 = time.perf_counter()
            try:
                result = p.run(graph)
                if not isinstance(result, Graph):
                    raise TypeError(f"run() returned {type(result).__name__}, not a Graph")
            except PartitaError as e:
                if isinstance(e, PassError):
                    path = self._write_reproducer(p, snap, graph)
                    raise PassError(f"pass '{name}' failed: {e}{_reproducer_note(path)}") from e
                # The pass refused its input with a message of its own (a non-scalar loss for
                # grad, ...): the user's graph is the reproducer, so none is written.
                raise PassError(f"pass '{name}' failed: {type(e).__name__}: {e}") from e
            except Exception as e:  # any other failure of a pass is a bug: reported with a reproducer
                path = self._write_reproducer(p, snap, graph)
                raise PassError(f"pass '{name}' failed: {type(e).__name__}: {e}{_reproducer_note(path)}") from e
            seconds = time.perf_counter() - t0
            if self.verify_each:
                try:
                    verify(result)
                except VerifyError as e:
                    path = self._write_reproducer(p, snap, graph)
                    raise PassError(f"pass {name} produced invalid IR: {e}{_reproducer_note(path)}") from e
            self.timings.append((name, seconds, before, len(result)))
            graph = result
            if p.name in self.print_ir_after or "all" in self.print_ir_after:
                self._print_ir(f"after {name}", graph)
        if self.timing:
            self.out.write(self.timing_table())
        return graph

    def timing_table(self) -> str:
        """Per-pass wall time, node counts and share of the total, as an aligned text table."""
        total = sum(t[1] for t in self.timings)
        rows = [("pass", "ms", "nodes", "%")]
        for name, sec, nb, na in self.timings:
            share = 100.0 * sec / total if total > 0 else 0.0
            rows.append((name, f"{sec * 1e3:.3f}", f"{nb} -> {na}", f"{share:.1f}"))
        first = self.timings[0][2] if self.timings else 0
        last = self.timings[-1][3] if self.timings else 0
        rows.append(("total", f"{total * 1e3:.3f}", f"{first} -> {last}", "100.0" if self.timings else "0.0"))
        w = [max(len(r[i]) for r in rows) for i in range(4)]
        lines = []
        for i, r in enumerate(rows):
            if i == len(rows) - 1:
                lines.append("-" * (sum(w) + 6))
            lines.append(f"{r[0]:<{w[0]}}  {r[1]:>{w[1]}}  {r[2]:>{w[2]}}  {r[3]:>{w[3]}}")
        return "\n".join(lines) + "\n"

    # --- internals -------------------------------------------------------------------
    def _print_ir(self, when: str, graph: Graph) -> None:
        self.out.write(f"// ----- IR {when} -----\n")
        self.out.write(print_graph(graph))

    def _write_reproducer(self, p: Pass, replay: "_Replay", current: Graph) -> Path | None:
        """Write the reproducer file; None when disabled or when the file cannot be written."""
        if self.reproducer_dir is None:
            return None
        path = Path(self.reproducer_dir) / f"partita-reproducer-{p.name}.pir"
        entry = p.text()
        head = [f"// pipeline: {self.pipeline_text()}",
                f"// failing pass: {entry}",
                f"// reproduce: partita opt {shlex.quote(str(path))} --passes={shlex.quote(entry)}"]
        snap = replay.graph()
        if snap is not None:
            body = print_graph(snap)
        else:
            head.append("// note: snapshots were off (or replaying the earlier passes failed), so this is "
                        "the IR left by the failing pass, which may be partly rewritten")
            try:
                body = print_graph(current)
            except Exception as e:  # a broken graph may not print; the reproducer still names the pass
                body = f"// (the IR could not be printed: {type(e).__name__}: {e})\n"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(head) + "\n" + body)
        except OSError:
            return None
        return path


def _reproducer_note(path: Path | None) -> str:
    return f"\nreproducer written to {path}" if path is not None else ""


def _check_print_names(names: typing.Iterable[str], what: str) -> frozenset[str]:
    if isinstance(names, str):
        names = [n for n in names.split(",") if n]
    try:
        out = frozenset(names)
    except TypeError:
        raise PassError(f"{what}: give pass names (a comma-separated string or a list of names) or 'all', "
                        f"not a {type(names).__name__}") from None
    for n in out:
        if not isinstance(n, str):
            raise PassError(f"{what}: pass names are strings, got {type(n).__name__} {n!r:.40}")
        if n != "all" and n not in pass_names():
            raise PassError(f"{what}: unknown pass '{n}'{suggest(n, pass_names())}; "
                            f"give pass names or 'all' (passes: {', '.join(pass_names())})")
    return out


class _Replay:
    """The IR a failing pass was given, rebuilt on demand from the pipeline's input copy."""

    def __init__(self, start: Graph | None, earlier: list[Pass]) -> None:
        self.start, self.earlier = start, earlier

    def graph(self) -> Graph | None:
        if self.start is None:
            return None
        g = self.start.clone()
        try:
            for p in self.earlier:
                q = type(p)(p.options)
                q.out = io.StringIO()  # a replay must not print a second trace
                g = q.run(g)
        except Exception:  # the reproducer falls back to the IR the failing pass left
            return None
        return g
