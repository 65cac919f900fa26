"""Parse the ``.pir`` text form into a Graph (grammar: docs/ir.md).

The parser is a recursive-descent parser over a regex lexer. Because node lines dominate
real files, each line is first tried against one regex of the printer's own layout (the
fast path); a line that does not match, or that has any problem, is parsed by the general
path, which is the definition of the language and produces every error message.
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

import numpy as np

from .attrs import DenseAttr, check_size
from .diagnostics import AttributeError_, DenseTooLargeError, GraphEditError, ParseError, PartitaError
from .dtypes import DTYPES
from .graph import ROLES, Graph, Node, Value, bulk_build
from .mesh import Mesh, MeshError
from .placement import Placement, PlacementError
from .types import Location, TensorType

# A number as the lexer reads it (its "number" token, but for -inf); the runs of values in
# dense literals (below) read their values with the same text, so both agree on every value.
_INT_TEXT = r"-?[0-9]+"
_FLOAT_TEXT = r"-?(?:[0-9]+\.[0-9]*(?:[eE][-+]?[0-9]+)?|[0-9]+[eE][-+]?[0-9]+|\.[0-9]+(?:[eE][-+]?[0-9]+)?|[0-9]+)"

_TOKEN = re.compile(
    r"""
     (?P<ws>(?:[ \t\r\n]+|//[^\n]*)+)
    |(?P<value>%[A-Za-z0-9_.]+)
    |(?P<gname>@[A-Za-z0-9_.]+)
    |(?P<number>""" + _FLOAT_TEXT + r"""|-inf\b)
    |(?P<ident>[A-Za-z_][A-Za-z0-9_.]*)
    |(?P<string>"(?:[^"\\\n]|\\.)*")
    |(?P<arrow>->)
    |(?P<punct>[()\[\]{},:=<>])
    """,
    re.VERBOSE,
)

_FAST_DIMS = r"\[(?:[0-9]+(?:,[0-9]+)*)?\]"
# The regex is kept simple for speed (re.ASCII: \w is [A-Za-z0-9_]); what it lets through
# loosely is checked exactly where it is used: attribute text is re-lexed, result types are
# matched against _FAST_TYPES before they are cached.
_FAST_NODE = re.compile(
    r"[ \t]*(%[\w.]+(?:, %[\w.]+)*) = ([A-Za-z_][\w.]*)"
    r"\(((?:%[\w.]+(?:, %[\w.]+)*)?)\)"
    r"(?: \{([^{}\n/]*)\})?"  # no braces inside (strings with them take the general path); no '/': a comment would hide the '}'
    r" : ([\w\[\],]+(?:, [\w\[\],]+)*)"
    r"(?: loc\(\"([^\"\\\n]*)\":([0-9]+)(?::([0-9]+))?(?: in \"([^\"\\\n]*)\")?\))?"
    r"[ \t]*(?:\n|\Z)",
    re.ASCII,
)
_FAST_TYPES = re.compile(r"[a-z0-9]+" + _FAST_DIMS + r"(?:, [a-z0-9]+" + _FAST_DIMS + r")*\Z")
_FAST_TYPE = re.compile(r"([a-z0-9]+)\[([0-9,]*)\]")
# A node line without loc(...) may go on in the next line (more result types, a partial(...)
# of the last type, a loc): then only the general path knows where the node ends.
_CONTINUED = re.compile(r"(?:[ \t\r\n]+|//[^\n]*)*(?:,|loc\b|partial\b)")
# Placed types (``f32[32@dp] partial(tp)``) never match _FAST_NODE: '@' is outside its type
# characters and nothing may follow the types but a loc. Such lines take the general path,
# which alone knows the graph's mesh and reports placement errors.
_AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# The deepest nesting of lists in an attribute value or a dense literal (NumPy's limit on
# dimensions): deeper text is an error, so nothing that reads values recurses without bound.
MAX_DEPTH = 64
# Runs of ", value" inside a dense literal, read in one match (the values of large constants
# dominate the text): integers, or finite float numbers; each must end where a token ends.
# Anything else (inf, nan, a comment, a bad value) ends the run and takes the token path.
_END_OF_VALUE = r"(?=[ \t\r\n,\]])"
_INT_RUN = re.compile(r"(?:[ \t\r\n]*,[ \t\r\n]*" + _INT_TEXT + _END_OF_VALUE + ")+")
_FLOAT_RUN = re.compile(r"(?:[ \t\r\n]*,[ \t\r\n]*" + _FLOAT_TEXT + _END_OF_VALUE + ")+")
# The values of a matched run (its boundaries are already checked; the alternatives are
# tried in the lexer's order, so each value is read as the lexer reads it).
_INT_RUN_ITEM = re.compile(_INT_TEXT)
_FLOAT_RUN_ITEM = re.compile(_FLOAT_TEXT)


class Token:
    __slots__ = ("kind", "text", "start", "end")

    def __init__(self, kind: str, text: str, start: int, end: int) -> None:
        self.kind, self.text, self.start, self.end = kind, text, start, end

    def describe(self) -> str:
        if self.kind == "eof":
            return "end of input"
        return repr(self.text)


def parse(text: str, filename: str = "<string>") -> Graph:
    """Parse one ``graph`` from ``.pir`` text; raises ParseError with file:line:col."""
    with bulk_build():
        return _Parser(text, filename).parse_file()


def parse_type(text: str, filename: str = "<type>") -> TensorType:
    """Parse one tensor type such as ``f32[8,128]`` (the ``.pir`` type syntax); raises ParseError."""
    p = _Parser(text, filename)
    t = p.parse_type("a type given on its own")
    if p.tok.kind != "eof":
        raise p.error(f"unexpected {p.tok.describe()} after the type {t}")
    return t


def parse_file(path) -> Graph:
    """Parse a ``.pir`` file and load the weights file beside it when there is one."""
    from pathlib import Path

    from .weights import Weights

    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise PartitaError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise PartitaError(f"{path}: not a text file ({e})") from None
    except OSError as e:
        raise PartitaError(f"{path}: cannot read the file ({e.strerror or e})") from None
    g = parse(text, str(path))
    wpath = path.with_suffix(".safetensors")
    if wpath.exists():
        g.weights = Weights.load(wpath)
    return g


class _Parser:
    def __init__(self, text: str, filename: str) -> None:
        self.text = text
        self.file = filename
        self.pos = 0
        self.values: dict[str, Value] = {}
        self.def_line: dict[str, int] = {}
        self.defining: list[Token] = []  # result names of the node being parsed
        self.type_cache: dict[str, tuple[TensorType, ...]] = {}
        self.attr_cache: dict[str | tuple[str, str], dict] = {}
        self._line_starts: list[int] | None = None
        self.mesh: Mesh | None = None
        # Placements read before the mesh (graph inputs, output types): checked once it is known.
        self.pending: list[tuple[TensorType, Placement, dict, str]] = []
        self.tok: Token = self._lex()  # last: lexing the first token can already fail

    # --- lexing -------------------------------------------------------------------------
    def _lex(self) -> Token:
        text, pos = self.text, self.pos
        m = _TOKEN.match(text, pos)
        if m is not None and m.lastgroup == "ws":
            pos = m.end()
            m = _TOKEN.match(text, pos)
        if pos >= len(text):
            # End of input is reported where the text stops, not after trailing blank lines.
            at = len(text.rstrip())
            self.pos = pos
            return Token("eof", "", at, at)
        if m is None:
            ch = text[pos]
            what = ("unterminated string: add the closing '\"' before the end of the line" if ch == '"'
                    else f"unexpected character {ch!r}")
            raise self.error_at(pos, what)
        self.pos = m.end()
        return Token(m.lastgroup or "", m.group(), m.start(), m.end())

    def advance(self) -> Token:
        t = self.tok
        self.tok = self._lex()
        return t

    def at(self, text: str) -> bool:
        return self.tok.text == text and self.tok.kind != "string"

    def expect(self, text: str, what: str | None = None) -> Token:
        if not self.at(text):
            raise self.error(f"expected {what or repr(text)}, found {self.tok.describe()}")
        return self.advance()

    def expect_kind(self, kind: str, what: str) -> Token:
        if self.tok.kind != kind:
            raise self.error(f"expected {what}, found {self.tok.describe()}")
        return self.advance()

    # --- locations and errors ---------------------------------------------------------
    def line_col(self, pos: int) -> tuple[int, int, str]:
        if self._line_starts is None:
            starts = [0]
            find = self.text.find
            i = find("\n")
            while i >= 0:
                starts.append(i + 1)
                i = find("\n", i + 1)
            self._line_starts = starts
        import bisect

        ln = bisect.bisect_right(self._line_starts, pos) - 1
        start = self._line_starts[ln]
        end = self.text.find("\n", start)
        line = self.text[start:] if end < 0 else self.text[start:end]
        return ln + 1, pos - start + 1, line

    def loc_at(self, pos: int) -> Location:
        ln, col, _ = self.line_col(pos)
        return Location(self.file, ln, col)

    def error_at(self, pos: int, msg: str) -> ParseError:
        ln, col, line = self.line_col(pos)
        return ParseError(msg, Location(self.file, ln, col), line)

    def error(self, msg: str, tok: Token | None = None) -> ParseError:
        return self.error_at((tok or self.tok).start, msg)

    # --- grammar ------------------------------------------------------------------------
    def parse_file(self) -> Graph:
        if self.tok.kind == "eof":
            raise self.error("expected 'graph', found end of input (the file is empty)")
        g = self.parse_graph()
        if self.tok.kind != "eof":
            raise self.error(f"expected end of input after the graph's closing '}}', found {self.tok.describe()}")
        return g

    def parse_graph(self) -> Graph:
        start = self.tok.start
        self.expect("graph", "'graph'")
        name = self.expect_kind("gname", "a graph name like @main").text[1:]
        g = Graph(name)
        g.loc = self.loc_at(start)
        self.expect("(")
        if not self.at(")"):
            while True:
                self.parse_arg(g)
                if self.at(","):
                    self.advance()
                    continue
                break
        self.expect(")", "',' or ')' after a graph input")
        self.expect("->", "'->' and the output types")
        self.expect("(", "'(' before the output types")
        out_types: list[tuple[TensorType, Placement | None, Token]] = []
        aliases: list[Value | None] = []
        if not self.at(")"):
            while True:
                t0 = self.tok
                t, p, spans = self.parse_placed_type()
                if p is not None:
                    self.pending.append((t, p, spans, f"output {len(out_types)}"))
                out_types.append((t, p, t0))
                aliases.append(self.parse_alias(g, t))
                if self.at(","):
                    self.advance()
                    continue
                break
        self.expect(")", "',' or ')' after an output type")
        if self.tok.kind == "ident" and self.tok.text == "mesh":
            g.mesh = self.mesh = self.parse_mesh()
        for t, p, spans, what in self.pending:
            self.check_placement(t, p, spans, what)
        self.expect("{", "'{' to open the graph body")
        self.parse_body(g)
        ret = self.tok
        self.defining = []
        self.expect("return", "a node or 'return'")
        outs: list[Value] = []
        if self.tok.kind == "value":
            while True:
                outs.append(self.use(self.advance()))
                if self.at(","):
                    self.advance()
                    continue
                break
        if len(outs) != len(out_types):
            raise self.error(f"return has {len(outs)} value(s) but the graph signature declares "
                             f"{len(out_types)} output type(s)", ret)
        for v, (t, p, tok) in zip(outs, out_types):
            if v.type != t:
                raise self.error(f"output %{v.name} has type {v.type} but the graph signature declares {t}", tok)
            if v.placement != p:
                raise self.error(f"output %{v.name} has placement {v.placement or 'none'} but the graph "
                                 f"signature declares {p or 'none'}", tok)
        try:
            g.set_outputs(outs, aliases)
        except GraphEditError as e:
            raise self.error(str(e), ret) from None
        self.expect("}", "'}' to close the graph body")
        return g

    def parse_alias(self, g: Graph, t: TensorType) -> Value | None:
        """An optional ``aliases(%input)`` after an output type."""
        if not (self.tok.kind == "ident" and self.tok.text == "aliases"):
            if self.tok.kind == "ident":
                raise self.error(f"unexpected {self.tok.describe()} after an output type; "
                                 f"expected ',', ')' or aliases(%input)")
            return None
        self.advance()
        self.expect("(", "'(' after aliases")
        tok = self.expect_kind("value", "the aliased graph input, like %w")
        self.expect(")", "')' after the aliased input")
        v = self.values.get(tok.text[1:])
        if v is None or not v.is_input:
            raise self.error(f"aliases({tok.text}): an output may only alias a graph input; "
                             f"{tok.text} is not one", tok)
        if v.type != t:
            raise self.error(f"aliases({tok.text}): the output type {t} differs from the input's {v.type}", tok)
        return v

    def parse_arg(self, g: Graph) -> None:
        tok = self.expect_kind("value", "a graph input like %x: f32[4]")
        name = tok.text[1:]
        self.expect(":", f"':' and a type after {tok.text}")
        t, p, spans = self.parse_placed_type()
        if p is not None:
            self.pending.append((t, p, spans, tok.text))
        role = "input"
        if self.tok.kind == "ident" and self.tok.text in ROLES:
            role = self.advance().text
        elif self.tok.kind == "ident":
            raise self.error(f"unknown input role {self.tok.text!r}; expected one of {', '.join(ROLES)}")
        v = g.add_input(name, t, role)
        v.placement = p
        self.define(name, tok, v)

    def define(self, name: str, tok: Token, v: Value) -> None:
        old = self.values.get(name)
        if old is not None:
            p = old.producer
            first = p.text_loc.line if p is not None and p.text_loc is not None else self.def_line.get(name, "?")
            raise self.error(f"%{name} is defined twice (first at line {first}); SSA values are defined once", tok)
        self.values[name] = v
        if v.producer is None:
            self.def_line[name] = self.line_col(tok.start)[0]
        v.name = name

    def use(self, tok: Token) -> Value:
        name = tok.text[1:]
        v = self.values.get(name)
        if v is None:
            if any(t.text == tok.text for t in self.defining):
                raise self.error(f"%{name} is used in its own definition; a value cannot depend on itself", tok)
            raise self.error(self.undefined_message(name), tok)
        return v

    def undefined_message(self, name: str) -> str:
        m = re.search(r"^[ \t]*(?:%[A-Za-z0-9_.]+, )*%" + re.escape(name) + r"(?:, %[A-Za-z0-9_.]+)* =",
                      self.text[self.pos:], re.M)
        if m is None:
            from .diagnostics import suggest

            return f"use of undefined value %{name}{suggest(name, self.values)}"
        line = self.line_col(self.pos + m.start())[0]
        cyc = _find_cycle(self.text, name)
        if cyc:
            return (f"%{name} is used before its definition at line {line}, and cannot be moved up: "
                    f"the values form a cycle ({' -> '.join('%' + c for c in cyc)})")
        return (f"%{name} is used before its definition at line {line}; "
                f"nodes must be listed in topological order")

    def parse_type(self, context: str = "the type of a dense attribute") -> TensorType:
        """A plain tensor type (a constant's, not a value's): no placement allowed."""
        return self.parse_placed_type(placed=False, context=context)[0]

    def parse_placed_type(self, placed: bool = True, context: str = "") -> tuple[TensorType, Placement | None, dict]:
        """A type with an optional placement: ``f32[32@dp,256] partial(tp)``.

        Returns the type, the placement (None when the text gives none) and where each part
        of the placement is in the text, for errors: ``first`` (the first '@' or 'partial'),
        ``("dim", d)`` (a dim size), ``("axis", d, name)`` (an '@axis'), ``("partial", name)``.
        """
        tok = self.tok
        if tok.kind != "ident" or tok.text not in DTYPES:
            from .diagnostics import suggest

            hint = suggest(tok.text, DTYPES) if tok.kind == "ident" else ""
            raise self.error(f"expected a tensor type like f32[4,8], found {tok.describe()}{hint}")
        self.advance()
        self.expect("[", f"'[' and the shape after {tok.text}")
        dims = []
        splits: list[tuple[str, ...]] | None = None
        spans: dict = {}
        if not self.at("]"):
            while True:
                d = self.tok
                if d.kind != "number" or not d.text.isdigit():
                    raise self.error(f"expected a dimension size (a non-negative integer), found {d.describe()}")
                dims.append(int(self.advance().text))
                if self.tok.kind == "gname":
                    if not placed:
                        raise self.error(f"{context} cannot carry a placement (only the types of values "
                                         f"can); remove the '@axis'")
                    if splits is None:
                        splits = [()] * (len(dims) - 1)
                        spans["first"] = self.tok.start
                    spans[("dim", len(dims) - 1)] = d.start
                    axes = []
                    while self.tok.kind == "gname":
                        at = self.advance()
                        if not _AXIS_NAME.match(at.text[1:]):
                            raise self.error(f"expected a mesh axis name after '@' (like @dp), found {at.text!r}", at)
                        axes.append(at.text[1:])
                        spans[("axis", len(dims) - 1, at.text[1:])] = at.start
                    splits.append(tuple(axes))
                elif splits is not None:
                    splits.append(())
                if self.at(","):
                    self.advance()
                    continue
                break
        self.expect("]", "',' or ']' in the shape")
        t = TensorType(tuple(dims), DTYPES[tok.text])
        partial: list[str] = []
        if placed and self.tok.kind == "ident" and self.tok.text == "partial":
            spans.setdefault("first", self.tok.start)
            self.advance()
            self.expect("(", "'(' and the mesh axes of the partial sum, like partial(tp)")
            while True:
                a = self.tok
                if a.kind != "ident" or not _AXIS_NAME.match(a.text):
                    raise self.error(f"expected a mesh axis name in partial(...), like partial(tp), "
                                     f"found {a.describe()}")
                partial.append(self.advance().text)
                spans[("partial", a.text)] = a.start
                if self.at(","):
                    self.advance()
                    continue
                break
            self.expect(")", "',' or ')' in partial(...)")
        if splits is None and not partial:
            return t, None, spans
        return t, Placement(tuple(splits) if splits is not None else ((),) * len(dims), tuple(partial)), spans

    def check_placement(self, t: TensorType, p: Placement, spans: dict, what: str) -> None:
        """Check a placement read from the text against the graph's mesh; errors point at the
        offending part (the axis, the dim size, the partial entry)."""
        mesh = self.mesh
        if mesh is None:
            raise self.error_at(spans["first"], f"{what} has a placement, but the graph has no mesh; declare "
                                                f"one after the output types, like -> (...) mesh(dp=2) {{")
        try:
            p.validate(t.shape, mesh, what)
        except PlacementError as e:
            if e.in_partial:
                key: Any = ("partial", e.axis)
            elif e.kind == "indivisible":
                key = ("dim", e.dim)
            else:
                key = ("axis", e.dim, e.axis)
            raise self.error_at(spans.get(key, spans["first"]), str(e)) from None

    def parse_mesh(self) -> Mesh:
        """``mesh(dp=2, tp=2)`` at the end of the graph signature."""
        self.advance()
        self.expect("(", "'(' after mesh, like mesh(dp=2, tp=2)")
        axes: list[tuple[str, int]] = []
        while True:
            ntok = self.tok
            if ntok.kind != "ident" or not _AXIS_NAME.match(ntok.text):
                raise self.error(f"expected a mesh axis like dp=2, found {ntok.describe()}")
            name = self.advance().text
            if any(name == n for n, _ in axes):
                raise self.error(f"mesh axis '{name}' appears twice in the mesh", ntok)
            self.expect("=", f"'=' and the size of mesh axis '{name}'")
            stok = self.tok
            if stok.kind != "number" or not stok.text.isdigit() or int(stok.text) < 1:
                raise self.error(f"expected the size of mesh axis '{name}' (a positive integer), "
                                 f"found {stok.describe()}")
            axes.append((name, int(self.advance().text)))
            if self.at(","):
                self.advance()
                continue
            break
        end = self.tok
        self.expect(")", "',' or ')' in mesh(...)")
        try:
            return Mesh(tuple(axes))
        except MeshError as e:
            raise self.error(str(e), end) from None

    def parse_body(self, g: Graph) -> None:
        text = self.text
        while True:
            tok = self.tok
            if tok.kind == "value" or tok.kind == "ident" and tok.text != "return":
                # The lexer has consumed the token; the fast path restarts at its line.
                line_start = text.rfind("\n", 0, tok.start) + 1
                if text[line_start:tok.start].strip() == "":
                    end = self.fast_nodes(g, line_start)
                    if end != line_start:
                        self.pos = end
                        self.tok = self._lex()
                        continue
                self.parse_node(g)
            else:
                return

    def fast_nodes(self, g: Graph, pos: int) -> int:
        """Parse consecutive node lines in the printer's layout from ``pos``.

        Returns where the first line that is not a plain node line starts (``pos`` if none
        was). A line is left to the general path on any doubt, with nothing changed, so the
        general path alone decides what is an error and how it reads.
        """
        from ..ops.registry import OPS

        text, match, values = self.text, _FAST_NODE.match, self.values
        startswith, continued = text.startswith, _CONTINUED.match
        type_cache, attr_cache, file = self.type_cache, self.attr_cache, self.file
        append, build = g._append_unchecked, Node._build
        loc_cache: dict[tuple, Location] = {}
        ln = 0
        while True:
            m = match(text, pos)
            if m is None:
                return pos
            results_s, op, operands_s, attrs_s, types_s, lfile, lline, lcol, lscope = m.groups()
            end = m.end()
            if lfile is None and not startswith("  %", end) and continued(text, end):
                return pos
            opdef = OPS.get(op)
            if opdef is None:
                return pos
            operands = []
            if operands_s:
                for o in operands_s.split(", "):
                    v = values.get(o[1:])
                    if v is None:
                        return pos
                    operands.append(v)
            if ", " in results_s:
                names = [r[1:] for r in results_s.split(", ")]
                if any(n in values for n in names) or len(set(names)) != len(names):
                    return pos
            else:
                names = [results_s[1:]]
                if names[0] in values:
                    return pos
            types = type_cache.get(types_s)
            if types is None:
                if _FAST_TYPES.match(types_s) is None:
                    return pos
                try:
                    types = tuple(TensorType(tuple(map(int, dims.split(","))) if dims else (), DTYPES[dt])
                                  for dt, dims in _FAST_TYPE.findall(types_s))
                except KeyError:
                    return pos
                type_cache[types_s] = types
            if len(types) != len(names):
                return pos
            key = op if attrs_s is None else (op, attrs_s)
            attrs = attr_cache.get(key)
            if attrs is None:
                try:
                    raw = self.parse_attr_text(attrs_s, m.start(4)) if attrs_s else {}
                    attrs = opdef.normalize_attrs(raw)
                except (ParseError, AttributeError_):
                    return pos
                attr_cache[key] = attrs
            if lfile is None:
                loc = None
            else:
                # Frontends give many nodes the same source line: share one Location.
                lkey = (lfile, lline, lcol, lscope)
                loc = loc_cache.get(lkey)
                if loc is None:
                    loc = loc_cache[lkey] = Location(lfile, int(lline), int(lcol) if lcol else 0, lscope or "")
            if not ln:
                ln = self.line_col(pos)[0]
            node = build(op, operands, attrs.copy(), types, loc, names, (file, ln, m.start(2) - pos + 1))
            append(node)
            res = node.results
            if len(res) == 1:
                values[names[0]] = res[0]
            else:
                for n, r in zip(names, res):
                    values[n] = r
            pos = end
            ln += 1

    def parse_attr_text(self, s: str, offset: int) -> dict:
        """Parse the inside of an attribute dict found by the fast path."""
        sub = _Parser.__new__(_Parser)
        sub.text, sub.file, sub.pos, sub._line_starts = self.text, self.file, offset, self._line_starts
        sub.tok = sub._lex()
        sub.values = {}
        out = {}
        end = offset + len(s)
        while True:
            name, value, _ = sub.parse_attr_entry()
            if name in out:
                raise sub.error(f"attribute '{name}' given twice")
            out[name] = value
            if sub.tok.start >= end:
                return out
            sub.expect(",")

    def parse_node(self, g: Graph) -> None:
        from ..ops.registry import get_op

        result_toks: list[Token] = []
        if self.tok.kind == "value":
            while True:
                result_toks.append(self.advance())
                if self.at(","):
                    self.advance()
                    if self.tok.kind != "value":
                        raise self.error(f"expected another result name, found {self.tok.describe()}")
                    continue
                break
            self.expect("=", "'=' after the result name(s)")
        self.defining = result_toks
        op_tok = self.tok
        if op_tok.kind != "ident":
            raise self.error(f"expected an op name, found {op_tok.describe()}")
        self.advance()
        try:
            opdef = get_op(op_tok.text)
        except PartitaError as e:
            raise self.error(str(e), op_tok) from None
        self.expect("(", f"'(' and the operands of {op_tok.text}")
        operands: list[Value] = []
        if not self.at(")"):
            while True:
                if self.tok.kind != "value":
                    raise self.error(f"expected an operand like %x, found {self.tok.describe()}")
                operands.append(self.use(self.advance()))
                if self.at(","):
                    self.advance()
                    continue
                break
        self.expect(")", "',' or ')' after an operand")
        raw_attrs: dict[str, Any] = {}
        attr_toks: dict[str, Token] = {}
        if self.at("{"):
            self.advance()
            if not self.at("}"):
                while True:
                    name, value, ntok = self.parse_attr_entry()
                    if name in raw_attrs:
                        raise self.error(f"attribute '{name}' given twice", ntok)
                    raw_attrs[name] = value
                    attr_toks[name] = ntok
                    if self.at(","):
                        self.advance()
                        continue
                    break
            self.expect("}", "',' or '}' in the attribute dict")
        try:
            attrs = opdef.normalize_attrs(raw_attrs)
        except AttributeError_ as e:
            bad = next((t for k, t in attr_toks.items() if f"'{k}'" in str(e)), op_tok)
            raise self.error(str(e), bad) from None
        types: list[TensorType] = []
        placements: list[Placement | None] = []
        if result_toks:
            self.expect(":", f"':' and the result type(s) of {op_tok.text}")
            while True:
                ty, p, spans = self.parse_placed_type()
                if p is not None:
                    i = len(types)
                    self.check_placement(ty, p, spans, result_toks[i].text if i < len(result_toks) else
                                         f"result {i} of {op_tok.text}")
                types.append(ty)
                placements.append(p)
                if self.at(","):
                    self.advance()
                    continue
                break
            if len(types) != len(result_toks):
                raise self.error(f"{op_tok.text} names {len(result_toks)} result(s) but gives "
                                 f"{len(types)} type(s)", result_toks[0])
        loc = None
        if self.at("loc"):
            loc = self.parse_loc()
        node = Node(op_tok.text, operands, attrs, types, loc)
        node.text_loc = self.loc_at(op_tok.start)
        g._append_unchecked(node)
        for t, r, p in zip(result_toks, node.results, placements):
            r.placement = p
            self.define(t.text[1:], t, r)

    def parse_attr_entry(self) -> tuple[str, Any, Token]:
        ntok = self.tok
        if ntok.kind != "ident":
            raise self.error(f"expected an attribute name, found {ntok.describe()}")
        self.advance()
        self.expect("=", f"'=' after attribute name '{ntok.text}'")
        return ntok.text, self.parse_attr_value(), ntok

    def parse_attr_value(self, depth: int = 0) -> Any:
        """One attribute value; ``depth`` is the number of lists around it (at most MAX_DEPTH)."""
        tok = self.tok
        k = tok.kind
        if k == "number":
            self.advance()
            return _number(tok.text)
        if k == "string":
            self.advance()
            return self.string_value(tok)
        if k == "ident":
            t = tok.text
            if t == "dense":
                return self.parse_dense()
            self.advance()
            if t == "true":
                return True
            if t == "false":
                return False
            if t == "none":
                return None
            if t == "inf":
                return float("inf")
            if t == "nan":
                return float("nan")
            if t in DTYPES:
                return DTYPES[t]
            raise self.error(f"expected an attribute value (number, true/false, \"string\", dtype, [list] or "
                             f"dense<...>), found {tok.describe()}", tok)
        if self.at("["):
            if depth >= MAX_DEPTH:
                raise self.error(f"attribute value nested deeper than {MAX_DEPTH} lists (the maximum depth); "
                                 f"flatten the value")
            self.advance()
            items = []
            if not self.at("]"):
                while True:
                    items.append(self.parse_attr_value(depth + 1))
                    if self.at(","):
                        self.advance()
                        continue
                    break
            self.expect("]", "',' or ']' in the list")
            return tuple(items)
        raise self.error(f"expected an attribute value, found {tok.describe()}")

    def string_value(self, tok: Token) -> str:
        try:
            return json.loads(tok.text, strict=False)
        except json.JSONDecodeError as e:
            raise self.error_at(tok.start + e.pos, f"invalid escape in string ({e.msg}); "
                                                   "use JSON escapes such as \\n, \\\" or \\u00e9") from None

    def parse_dense(self) -> DenseAttr:
        self.advance()
        self.expect("<", "'<' after dense")
        t_tok = self.tok
        t = self.parse_type()
        if t.rank > MAX_DEPTH:
            raise self.error(f"dense<{t}> has {t.rank} dimensions; a tensor has at most {MAX_DEPTH}", t_tok)
        self.expect(",", "',' between the type and the values of dense<...>")
        v_tok = self.tok
        texts, shape = self.parse_dense_literal(t)
        self.expect(">", "'>' to close dense<...>")
        splat = shape is None
        if shape is not None and shape != t.shape and not (t.numel == 0 and not texts):
            raise self.error(f"dense values have shape {list(shape)} but the type says {t}", v_tok)
        values = self.dense_values(t, texts, v_tok)
        if splat or t.numel == 0:
            # Kept as one value: an empty tensor is one too (its value is never read), so no
            # array is built for f32[99999999999999999999999,0] either, which NumPy refuses.
            return DenseAttr.splat(values[0] if splat else 0, t.shape, t.dtype)
        try:
            check_size(t, f"dense<{t}>")
        except DenseTooLargeError as e:
            raise self.error(str(e), v_tok) from None
        return DenseAttr(values.reshape(t.shape))

    def parse_dense_literal(self, t: TensorType) -> tuple[list[str], tuple[int, ...] | None]:
        """The values of ``dense<t, ...>``: their texts in row-major order and the shape of
        the nesting (None for a splat, a single value). Without recursion; at most
        MAX_DEPTH lists deep. Each value is checked to be of the kind the dtype takes;
        ``dense_values`` checks the ranges."""
        start = self.tok
        if not self.at("["):
            self.dense_leaf(t)
            return [self.advance().text], None
        dt = t.dtype
        run = None if dt.is_bool else _INT_RUN.match if dt.is_int else _FLOAT_RUN.match
        find = _INT_RUN_ITEM.findall if dt.is_int else _FLOAT_RUN_ITEM.findall
        text = self.text
        texts: list[str] = []
        dims: list[int | None] = []  # dims[d]: the length of every list d+1 deep
        counts: list[int] = []       # items so far in each open list, outermost first
        leaf_depth = 0               # how many lists hold the values (0: none seen yet)

        def ragged() -> ParseError:
            return self.error(f"dense values are a ragged nested list; the type says {t}", start)

        while True:
            if self.at("["):
                if len(counts) >= MAX_DEPTH:
                    raise self.error(f"dense values nested deeper than {MAX_DEPTH} lists (the maximum "
                                     f"depth: a tensor has at most {MAX_DEPTH} dimensions)")
                if counts:
                    counts[-1] += 1
                counts.append(0)
                self.advance()
                if not self.at("]"):
                    continue
            else:
                self.dense_leaf(t)
                if leaf_depth == 0:
                    leaf_depth = len(counts)
                elif leaf_depth != len(counts):
                    raise ragged()
                texts.append(self.tok.text)
                n = 1
                # The values that follow in the printer's layout (", 1.5, -2.0") in one match.
                m = run(text, self.pos) if run is not None else None
                if m is not None:
                    more = find(m.group())
                    texts.extend(more)
                    n += len(more)
                    self.pos = m.end()
                counts[-1] += n
                self.advance()
            # After a value or a '[': close lists, then a ',' starts the next item.
            while True:
                if self.at("]"):
                    n = counts.pop()
                    d = len(counts)
                    while len(dims) <= d:
                        dims.append(None)
                    if dims[d] is None:
                        dims[d] = n
                    elif dims[d] != n:
                        raise ragged()
                    self.advance()
                    if not counts:
                        if texts and leaf_depth != len(dims):
                            raise ragged()
                        return texts, tuple(dims)  # type: ignore[arg-type]
                elif self.at(","):
                    self.advance()
                    break
                else:
                    raise self.error(f"expected ',' or ']' in the values of dense<{t}>, found {self.tok.describe()}")

    def dense_leaf(self, t: TensorType) -> None:
        """Check that the current token is a value ``dense<t, ...>`` may hold (not its range)."""
        tok, dt = self.tok, t.dtype
        k, text = tok.kind, tok.text
        if dt.is_bool:
            ok = k == "ident" and text in ("true", "false")
        elif dt.is_int:
            ok = k == "number" and text.lstrip("-").isdigit()
        else:
            ok = k == "number" or k == "ident" and text in ("inf", "nan")
        if not ok:
            want = "true or false" if dt.is_bool else "integers" if dt.is_int else "numbers"
            found = "end of input" if k == "eof" else text if k in ("number", "ident", "string") else repr(text)
            raise self.error(f"dense<{t}> takes {want}, found {found}")

    def leaf_error(self, v_tok: Token, i: int, msg: str) -> ParseError:
        """An error at value ``i`` of the dense literal that starts at ``v_tok`` (found again by
        lexing the literal: values keep only their text while they are read)."""
        sub = _Parser.__new__(_Parser)
        sub.text, sub.file, sub.pos, sub._line_starts = self.text, self.file, v_tok.start, self._line_starts
        seen = -1
        while True:
            tok = sub._lex()
            if tok.kind != "punct" or tok.text not in "[],":
                seen += 1
                if seen == i or tok.kind == "eof":
                    return self.error_at(tok.start, msg)

    def dense_values(self, t: TensorType, texts: list[str], v_tok: Token) -> np.ndarray:
        """The values (checked by dense_leaf) as a flat array of ``t``'s dtype; a value the
        dtype cannot hold is an error at that value."""
        dt = t.dtype
        if dt.is_bool:
            return np.array([x == "true" for x in texts], dtype=np.bool_)
        if dt.is_int:
            ints = list(map(int, texts))
            lo, hi = (0, (1 << dt.bits) - 1) if dt.kind == "uint" else (-(1 << (dt.bits - 1)), (1 << (dt.bits - 1)) - 1)
            if ints and (min(ints) < lo or max(ints) > hi):
                i = next(i for i, x in enumerate(ints) if not lo <= x <= hi)
                raise self.leaf_error(v_tok, i, f"dense value {ints[i]} is out of range for {dt} ({lo}..{hi})")
            return np.array(ints, dtype=dt.np)
        vals = np.array(list(map(float, texts)), dtype=np.float64)
        with np.errstate(all="ignore"):
            inf = np.isinf(vals)
            if inf.any():  # a finite literal beyond f64 (1e400) reads as inf: out of range
                for i in np.flatnonzero(inf).tolist():
                    if texts[i] not in ("inf", "-inf"):
                        raise self.leaf_error(v_tok, i, f"dense value {texts[i]} is out of range for {dt} "
                                                        f"({_float_range(dt)})")
            if dt.bits == 64:
                return vals
            arr = vals.astype(dt.np)
            back = arr.astype(np.float64)
            finite = np.isfinite(vals)
            bad = finite & ~np.isfinite(back)
            limit = _saturating_limit(dt)
            if limit is not None:
                bad |= finite & (np.abs(vals) >= limit)
            no_inf = inf & ~np.isinf(back)
            no_nan = np.isnan(vals) & ~np.isnan(back)
        for mask, which in ((bad, ""), (no_inf, ", which has no infinity"), (no_nan, ", which has no NaN")):
            if mask.any():
                i = int(np.argmax(mask))
                raise self.leaf_error(v_tok, i, f"dense value {texts[i]} is out of range for {dt}{which} "
                                                f"({_float_range(dt)})")
        return arr

    def parse_loc(self) -> Location:
        self.advance()
        self.expect("(", "'(' after loc")
        f = self.expect_kind("string", 'a quoted file name in loc("file":line)')
        self.expect(":", "':' and a line number")
        ln = self.expect_count("a line number")
        col = 0
        if self.at(":"):
            self.advance()
            col = self.expect_count("a column number")
        scope = ""
        if self.tok.kind == "ident" and self.tok.text == "in":
            self.advance()
            scope = self.string_value(self.expect_kind("string", 'a quoted module path after "in", as in '
                                                                  'loc("file":line in "h.3.attn")'))
        recompute = ""
        if self.tok.kind == "ident" and self.tok.text == "recompute":
            self.advance()
            recompute = self.string_value(self.expect_kind("string", 'the quoted recomputation policy after '
                                                                      '"recompute", as in loc("file":line recompute '
                                                                      '"full")'))
        self.expect(")", "')' to close loc(...)")
        return Location(self.string_value(f), ln, col, scope, recompute)

    def expect_count(self, what: str) -> int:
        tok = self.tok
        if tok.kind != "number" or not tok.text.isdigit():
            raise self.error(f"expected {what} (a non-negative integer), found {tok.describe()}")
        self.advance()
        return int(tok.text)


def _number(s: str) -> int | float:
    if s == "-inf":
        return float("-inf")
    if any(c in s for c in ".eE"):
        return float(s)
    return int(s)


def _float_range(dt) -> str:
    """The finite values of float dtype ``dt``, for messages: ``-448.0..448.0``."""
    if dt.name == "f8e8m0":
        return "powers of two 2**-127..2**127"
    import ml_dtypes  # imported on first use: planning never parses such a literal

    mx = float(ml_dtypes.finfo(dt.np).max)
    # As the printer writes values: the shortest f32 text below 64 bits (3.4028235e+38).
    s = repr(mx) if dt.bits == 64 else str(np.float32(mx))
    return f"finite values -{s}..{s}"


@functools.cache
def _saturating_limit(dt) -> float | None:
    """For a float dtype whose NumPy conversion saturates (f4e2m1: 1e6 becomes 6.0), the
    magnitude from which a value rounds (to nearest even) beyond the largest finite value;
    None when the conversion itself overflows to inf or NaN. Cached: one per dtype, while
    dense literals ask for it once each."""
    with np.errstate(all="ignore"):
        if not np.isfinite(np.array(np.inf).astype(dt.np).astype(np.float64)):
            return None
    import ml_dtypes

    fi = ml_dtypes.finfo(dt.np)
    mx = float(fi.max)
    return mx + 2.0 ** (math.floor(math.log2(mx)) - fi.nmant) / 2


_DEF_USE = re.compile(r"^[ \t]*((?:%[A-Za-z0-9_.]+)(?:, %[A-Za-z0-9_.]+)*) = [A-Za-z_][A-Za-z0-9_.]*\(([^)]*)\)", re.M)


def _find_cycle(text: str, start: str) -> list[str] | None:
    """A def-use cycle through %start in roughly parsed text, for error messages only."""
    deps: dict[str, list[str]] = {}
    for m in _DEF_USE.finditer(text):
        uses = [u.strip()[1:] for u in m.group(2).split(",") if u.strip().startswith("%")]
        for r in m.group(1).split(", "):
            deps[r[1:]] = uses
    # Iterative DFS along uses, looking for a way back to %start.
    stack: list[tuple[str, int]] = [(start, 0)]
    seen: set[str] = {start}
    while stack:
        n, i = stack[-1]
        uses = deps.get(n, [])
        if i >= len(uses):
            stack.pop()
            continue
        stack[-1] = (n, i + 1)
        d = uses[i]
        if d == start:
            return list(reversed([s for s, _ in stack] + [start]))
        if d not in seen:
            seen.add(d)
            stack.append((d, 0))
    return None
