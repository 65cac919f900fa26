"""Layout assignment: regions of library convolutions computed on channels-last tensors.

The ``assign-layout`` pass (docs/codegen.md, "Layout assignment") finds regions of
``conv2d_pointwise`` nodes and the ops between them, and rewrites the region so that the ops
that do not care about the layout compute on NHWC tensors ``[N, H, W, C]``:

    %1 = conv2d_pointwise(%x, %w1, %b1) : f32[8,32,64,64]
    %2 = transpose(%1) {perm=[0, 2, 3, 1]} : f32[8,64,64,32]        // a view
    %3 = fused(%2) {body=...} : f32[8,64,64,32]                       // ReLU6 on NHWC
    %4 = transpose(%3) {perm=[0, 3, 1, 2]} : f32[8,32,64,64]        // a view
    %5 = conv2d_pointwise(%4, %w2, %b2) {groups=32} : f32[8,32,64,64]

The IR stays explicit and uses the existing ops: a value of the region is NHWC where an
elementwise op, a fused kernel or a reduction computes it, and the ops that have a
channels-last kernel (``CHANNELS_LAST``: the library convolution, max/avg pooling, inference
batch_norm) keep their NCHW types and read it through ``transpose{perm=[0, 3, 1, 2]}``.

How the torch executor holds these values. Every value the region computes is channels-last
memory: a library convolution returns channels-last results (its packed kernel converts its
input to channels-last; docs "Packed weights"), the pools and batch_norm keep the memory format
of their input, and an NHWC value is a plain contiguous tensor of shape [N, H, W, C] (a
generated kernel writes it so; an ATen elementwise op on contiguous operands too). A transpose
is a permuted view in ATen, so between an NHWC value and the NCHW view a convolution reads
(``x.permute(0, 3, 1, 2)`` of a contiguous NHWC tensor is channels-last-contiguous, which
oneDNN takes without a copy) nothing moves: those transposes are *views*. Data moves only at
the region's boundary, which the pass counts as *layout changes*:

- an entry: an NHWC op reads a value from outside the region (NCHW memory), through
  ``transpose{perm=[0, 2, 3, 1]}``; its reader (a kernel that needs contiguous operands) makes
  the pass over the tensor. An operand of lower rank is padded to rank 4 first (a reshape);
- an exit: a value an NHWC op computed is read outside the region or returned, through
  ``transpose{perm=[0, 3, 1, 2]}`` (channels-last memory, which a reader that wants NCHW
  copies).

Where the dims above 1 keep their order (the channels are 1, or H and W both are: a
per-channel bias ``[C, 1, 1]``, a mean's ``[N, 1, 1, C]``), the change is a ``reshape``,
which moves nothing and is not counted; a one-element operand is used as it is.

The cost rule, per region (a connected set of member nodes that holds at least one
convolution): a library convolution that reads a value in NCHW memory converts it to
channels-last on every call (oneDNN would otherwise do it inside the call). In the region, the
values the convolutions read are channels-last. The pass counts as *saved* one conversion, a pass
over the tensor, for each convolution operand (the input, and the residual ``other``) that an
NHWC op computes, directly or through a pool or batch_norm. Without the pass, such a value is
the NCHW result of an elementwise op, which ``fuse-kernels`` turns into a generated kernel that
writes NCHW memory. A value another convolution returned is channels-last already, and a value from
outside is converted either way, so neither counts. The *cost* is one pass over the tensor per
layout change placed (entries and exits; views and reshapes cost nothing). The region is
rewritten only when the saved elements exceed the cost's elements; otherwise it is left as it
was. So a chain of convolutions with nothing between them (they hand channels-last results to
each other already) is left alone, and so is a lone convolution with an elementwise op after it.

Members (``plan_layout``): a ``conv2d_pointwise`` of f32 starts a region; an op joins the
region of a value it reads when it is one of

- an elementwise op (``OpDef.elementwise``) with a 4-d result, whose other operands broadcast
  to it (they are padded to rank 4 and permuted; one-element operands are kept);
- a ``fused`` node whose body holds only elementwise ops, one-element constants, and
  reductions of 4-d values with ``keepdim``, all of whose results are 4-d; the body is
  rewritten on NHWC types;
- a reduction (``REDUCTIONS``: sum, mean, max, min, prod) of a 4-d value, with its axes remapped
  to NHWC (N, C, H, W are axes 0, 3, 1, 2). Its result is NHWC with ``keepdim``. Without it,
  it joins only when the dims left keep their order (a mean over H and W leaves [N, C]), and
  its result is then the same value as before, read outside with no change;
- a ``CHANNELS_LAST`` op (its NCHW form, as above).

Anything else reading a region value (a reshape, a transpose, a softmax over the channels, a
``conv3d``, a plain ``conv2d``) is outside the region and reads NCHW. A graph without
``conv2d_pointwise`` nodes, or whose regions do not pay, is left unchanged.

``assign_layout(graph)`` runs the pass in place and returns the number of layout changes it
placed; ``count_layout_changes(graph)`` counts them in any graph by the rule above (a transpose
to NHWC of a value no channels-last op produced; a transpose to NCHW read by anything but a
channels-last op).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..ir.diagnostics import PartitaError
from ..ir.dtypes import f32
from ..ir.graph import Graph, Node, Value
from ..ir.types import TensorType
from ..ops.reduce import reduce_axes
from ..ops.registry import OPS
from ..passes.manager import Pass, register_pass

__all__ = ["AssignLayout", "Region", "CHANNELS_LAST", "REDUCTIONS", "NHWC_RULES", "TO_NHWC", "TO_NCHW",
           "plan_layout", "assign_layout", "count_layout_changes", "nhwc_type", "nhwc_body"]

TO_NHWC = (0, 2, 3, 1)   # transpose{perm} of an NCHW tensor: [N, H, W, C]
TO_NCHW = (0, 3, 1, 2)   # and back
# Where NCHW axis i is in NHWC.
_AXIS_TO_NHWC = (0, 3, 1, 2)


def nhwc_type(t: TensorType) -> TensorType:
    """The NHWC form of a type that broadcasts to a 4-d NCHW tensor: padded with leading 1s
    to rank 4, then permuted by ``TO_NHWC``."""
    shape = (1,) * (4 - t.rank) + tuple(t.shape)
    return t.with_shape(tuple(shape[p] for p in TO_NHWC))


def _ones(t: TensorType) -> bool:
    """A one-element type of rank at most 4: it broadcasts alike in either layout."""
    return t.rank <= 4 and all(d == 1 for d in t.shape)


def _moves_data(t: TensorType) -> bool:
    """Whether NCHW <-> NHWC reorders the elements of ``t`` (NCHW side, padded to rank 4): the
    channels and a spatial dim are above 1. Otherwise the dims above 1 keep their order and a
    reshape relabels the same elements."""
    shape = (1,) * (4 - t.rank) + tuple(t.shape)
    return shape[1] != 1 and (shape[2] != 1 or shape[3] != 1)


# --- the member rules ---------------------------------------------------------------------------

@dataclass(frozen=True)
class ChannelsLast:
    """An op that keeps its NCHW meaning and has a channels-last kernel: it reads the region's
    values through the NCHW view and its results are channels-last. ``operands(node)``: the
    indices of its activation operands; ``when(node)``: whether this node qualifies;
    ``conv``: a library convolution, whose operands' conversions are what a region saves."""

    operands: Callable[[Node], tuple[int, ...]]
    when: Callable[[Node], bool]
    conv: bool = False


def _conv_operands(n: Node) -> tuple[int, ...]:
    return (0, len(n.operands) - 1) if n.attrs["binary"] != "none" else (0,)


def _f32_conv(n: Node) -> bool:
    return len(n.results) == 1 and all(v.type.dtype is f32 for v in (*n.operands, n.results[0])) and \
        n.operands[0].type.rank == 4


def _first(n: Node) -> tuple[int, ...]:
    return (0,)


def _one_4d_result(n: Node) -> bool:
    return len(n.results) == 1 and n.results[0].type.rank == 4 and n.operands[0].type.rank == 4


CHANNELS_LAST: dict[str, ChannelsLast] = {
    "conv2d_pointwise": ChannelsLast(_conv_operands, _f32_conv, conv=True),
    "max_pool2d": ChannelsLast(_first, _one_4d_result),
    "avg_pool2d": ChannelsLast(_first, _one_4d_result),
    "batch_norm": ChannelsLast(_first, lambda n: not n.attrs["training"] and _one_4d_result(n)),
}

# Reductions with ``axes`` and ``keepdim``: on NHWC, their axes are remapped.
REDUCTIONS = frozenset({"sum", "mean", "max", "min", "prod"})


@dataclass
class _Nhwc:
    """How an NHWC member is rewritten: the new op and attributes, per operand whether it is
    read in NHWC form (``True``) or as it is (a one-element operand), per result whether it is
    NHWC (else it is the same value as before: a reduction that leaves [N, C])."""

    op: str
    attrs: dict
    layout: tuple[bool, ...]
    nhwc_results: tuple[bool, ...]


def _operand_layout(n: Node) -> tuple[bool, ...]:
    return tuple(not (_ones(v.type) and v.type.rank < 4) for v in n.operands)


def _checked(n: Node, op: str, attrs: dict, layout: tuple[bool, ...], nhwc: tuple[bool, ...]) -> _Nhwc | None:
    """The rewrite, when ``op{attrs}`` on the NHWC operand types infers the expected types."""
    types = [nhwc_type(v.type) if lay else v.type for v, lay in zip(n.operands, layout)]
    try:
        got = OPS[op].infer_types(types, attrs)
    except PartitaError:
        return None
    want = tuple(nhwc_type(r.type) if k else r.type for r, k in zip(n.results, nhwc))
    return _Nhwc(op, attrs, layout, nhwc) if tuple(got) == want else None


def _elementwise_rule(n: Node) -> _Nhwc | None:
    if len(n.results) != 1 or n.results[0].type.rank != 4 or any(v.type.rank > 4 for v in n.operands):
        return None
    return _checked(n, n.op, dict(n.attrs), _operand_layout(n), (True,))


def _remap_axes(axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted(_AXIS_TO_NHWC[a] for a in axes))


def _reduction_rule(n: Node) -> _Nhwc | None:
    x = n.operands[0]
    if x.type.rank != 4 or len(n.results) != 1:
        return None
    try:
        axes = reduce_axes(n.attrs["axes"], 4, n.op)
    except PartitaError:
        return None
    r = n.results[0]
    if r.type.rank != 4:
        left = [a for a in range(4) if a not in axes]
        if [_AXIS_TO_NHWC[a] for a in left] != sorted(_AXIS_TO_NHWC[a] for a in left):
            return None  # the dims left would come out in another order
    attrs = OPS[n.op].normalize_attrs({**n.attrs, "axes": _remap_axes(axes)})
    return _checked(n, n.op, attrs, (True,), (r.type.rank == 4,))


def nhwc_body(text: str, layout: tuple[bool, ...]) -> str | None:
    """A ``fused`` body rewritten on NHWC types (inputs with ``layout`` padded and permuted),
    or None when it holds something other than elementwise ops, one-element constants and
    ``keepdim`` reductions of 4-d values, or a result that is not 4-d."""
    from ..ir.printer import print_graph
    from .fused_body import body_graph

    body = body_graph(text)
    if any(v.type.rank != 4 for v in body.outputs) or len(layout) != len(body.inputs):
        return None
    g = Graph(body.name)
    env: dict[Value, Value] = {}
    for v, lay in zip(body.inputs, layout):
        env[v] = g.add_input(v.name or f"x{len(env)}", nhwc_type(v.type) if lay else v.type)

    def want(t: TensorType) -> TensorType:
        return t if _ones(t) and t.rank < 4 else nhwc_type(t)

    for n in body.nodes:
        opdef = OPS.get(n.op)
        if opdef is None:
            return None
        attrs = dict(n.attrs)
        if opdef.elementwise:
            if any(r.type.rank > 4 for r in n.results):
                return None
        elif n.op in REDUCTIONS and n.operands[0].type.rank == 4 and n.results[0].type.rank == 4:
            try:
                attrs["axes"] = _remap_axes(reduce_axes(attrs["axes"], 4, n.op))
            except PartitaError:
                return None
        elif not n.operands and all(_ones(r.type) and r.type.rank < 4 for r in n.results):
            pass
        else:
            return None
        ops = [env[v] for v in n.operands]
        try:
            types = opdef.infer_types([v.type for v in ops], attrs)
        except PartitaError:
            return None
        if tuple(types) != tuple(want(r.type) for r in n.results):
            return None
        new = Node(n.op, ops, attrs, list(types))
        g.append(new)
        env.update(zip(n.results, new.results))
    g.set_outputs([env[v] for v in body.outputs])
    return print_graph(g)


def _fused_rule(n: Node) -> _Nhwc | None:
    if any(r.type.rank != 4 for r in n.results) or any(v.type.rank > 4 for v in n.operands):
        return None
    layout = _operand_layout(n)
    body = nhwc_body(n.attrs["body"], layout)
    if body is None:
        return None
    return _checked(n, "fused", {"body": body}, layout, (True,) * len(n.results))


# The ops other than elementwise ones (``OpDef.elementwise``) that compute on NHWC, and how.
NHWC_RULES: dict[str, Callable[[Node], "_Nhwc | None"]] = {
    "fused": _fused_rule,
    **{r: _reduction_rule for r in sorted(REDUCTIONS)},
}


def _nhwc_rule(n: Node) -> _Nhwc | None:
    opdef = OPS.get(n.op)
    if opdef is None or opdef.effects_of(n.attrs):
        return None
    rule = _elementwise_rule if opdef.elementwise else NHWC_RULES.get(n.op)
    return None if rule is None else rule(n)


# --- the plan -----------------------------------------------------------------------------------

@dataclass
class Region:
    """A connected set of member nodes and what rewriting it would cost and save (in elements:
    each is one pass over a tensor of that many elements)."""

    nodes: list[Node] = field(default_factory=list)     # in graph order
    convs: int = 0
    saved: int = 0               # elements of the conversions the convolutions no longer make
    cost: int = 0                # elements of the layout changes placed
    changes: int = 0             # layout changes placed (entries and exits)
    views: int = 0               # changes of form inside the region: views of channels-last memory
    reshapes: int = 0            # entries and exits that are reshapes (nothing moves)
    rewrite: dict = field(default_factory=dict, repr=False)   # NHWC member -> _Nhwc

    @property
    def apply(self) -> bool:
        """The cost rule: at least one convolution, and more saved than the layout changes cost."""
        return self.convs > 0 and self.saved > self.cost

    def where(self) -> str:
        n = next((m for m in self.nodes if m.op in CHANNELS_LAST and CHANNELS_LAST[m.op].conv), self.nodes[0])
        loc = n.text_loc or n.loc
        return f" at {loc}" if loc else ""


def plan_layout(graph: Graph) -> list[Region]:
    """The regions of ``graph`` in the order of their first node, with their costs (nothing is
    changed)."""
    parent: dict[Node, Node] = {}

    def find(n: Node) -> Node:
        while parent[n] is not n:
            parent[n] = parent[parent[n]]
            n = parent[n]
        return n

    home: dict[Value, Node] = {}         # a 4-d value the region computes -> its producer
    rewrite: dict[Node, _Nhwc] = {}
    members: list[Node] = []
    for n in graph.nodes:
        cl = CHANNELS_LAST.get(n.op)
        reads: list[Node] = []
        if cl is not None and cl.when(n):
            reads = [home[n.operands[i]] for i in cl.operands(n) if n.operands[i] in home]
            if not cl.conv and not reads:
                continue
        else:
            if cl is not None or not any(v in home for v in n.operands):
                continue
            rule = _nhwc_rule(n)
            if rule is None:
                continue
            reads = [home[v] for v, lay in zip(n.operands, rule.layout) if lay and v in home]
            if not reads:
                continue
            rewrite[n] = rule
        parent[n] = n
        for p in reads:
            a, b = find(p), find(n)
            if a is not b:
                parent[a] = b
        members.append(n)
        for i, r in enumerate(n.results):
            if r.type.rank == 4 and (n not in rewrite or rewrite[n].nhwc_results[i]):
                home[r] = n

    regions: dict[Node, Region] = {}
    for n in members:
        reg = regions.setdefault(find(n), Region())
        reg.nodes.append(n)
        if n in rewrite:
            reg.rewrite[n] = rewrite[n]
    out = list(regions.values())
    for reg in out:
        _cost(reg, home)
    return out


def _cost(reg: Region, home: dict[Value, Node]) -> None:
    """Fill in the region's counts by the cost rule (module doc)."""
    in_region = set(reg.nodes)
    nhwc_made: dict[Node, bool] = {}

    def channels_last_by_the_pass(v: Value) -> bool:
        p = home.get(v)
        if p is None or p not in in_region:
            return False
        if p in reg.rewrite:
            return True
        if CHANNELS_LAST[p.op].conv:
            return False
        if p not in nhwc_made:
            nhwc_made[p] = channels_last_by_the_pass(p.operands[CHANNELS_LAST[p.op].operands(p)[0]])
        return nhwc_made[p]

    entries: set[Value] = set()
    views_in: set[Value] = set()      # NCHW results read in NHWC form
    views_out: set[Value] = set()     # NHWC results read by channels-last ops
    for n in reg.nodes:
        cl = CHANNELS_LAST.get(n.op)
        if cl is not None:
            reg.convs += cl.conv
            for i in cl.operands(n):
                v = n.operands[i]
                if cl.conv and channels_last_by_the_pass(v):
                    reg.saved += v.type.numel
                if home.get(v) in reg.rewrite:
                    views_out.add(v)
            continue
        rule = reg.rewrite[n]
        for v, lay in zip(n.operands, rule.layout):
            if not lay:
                continue
            p = home.get(v)
            if p is None:
                if v not in entries:
                    entries.add(v)
                    if _moves_data(v.type):
                        reg.changes += 1
                        reg.cost += v.type.numel
                    elif nhwc_type(v.type) != v.type:
                        reg.reshapes += 1
            elif p not in reg.rewrite:
                views_in.add(v)
    for n in reg.rewrite:
        for r, nh in zip(n.results, reg.rewrite[n].nhwc_results):
            if nh and (r.is_output or any(u not in in_region for u in r.users)):
                views_out.discard(r)
                if _moves_data(r.type):
                    reg.changes += 1
                    reg.cost += r.type.numel
                else:
                    reg.reshapes += 1
    reg.views = len(views_in) + len(views_out)


# --- the rewrite --------------------------------------------------------------------------------

def _transpose(v: Value, perm: tuple[int, ...], loc) -> Node:
    t = v.type
    return Node("transpose", [v], OPS["transpose"].normalize_attrs({"perm": perm}),
                [t.with_shape(tuple(t.shape[p] for p in perm))], loc)


def _reshape(v: Value, shape: tuple[int, ...], loc) -> Node:
    return Node("reshape", [v], OPS["reshape"].normalize_attrs({"shape": shape}), [v.type.with_shape(shape)], loc)


def _relayout(v: Value, perm: tuple[int, ...], loc) -> list[Node]:
    """The nodes that give ``v`` in the other layout: a transpose by ``perm``, or a reshape when
    the dims above 1 keep their order (none when the shape stays too)."""
    t = v.type
    shape = tuple(t.shape[p] for p in perm)
    if _moves_data(t if perm == TO_NHWC else t.with_shape(shape)):
        return [_transpose(v, perm, loc)]
    return [] if shape == t.shape else [_reshape(v, shape, loc)]


def _rewrite(graph: Graph, reg: Region) -> None:
    in_region = set(reg.nodes)
    nhwc_of: dict[Value, Value] = {}     # a value -> its NHWC form
    nchw_of: dict[Value, Value] = {}     # an NHWC member's old result -> the NCHW view of its new one
    old: list[Node] = []

    def nchw_form(v: Value) -> Value:
        """The NCHW form of a result of an NHWC member (a view placed after its producer)."""
        if v not in nchw_of:
            new = nhwc_of[v]
            assert new.producer is not None
            nodes = _relayout(new, TO_NCHW, new.producer.loc)
            for node in reversed(nodes):
                graph.insert_after(new.producer, node)
            nchw_of[v] = nodes[-1].results[0] if nodes else new
        return nchw_of[v]

    def nhwc_form(v: Value, reader: Node) -> Value:
        if v in nhwc_of:
            return nhwc_of[v]
        p = v.producer
        if p is not None and p in in_region and p not in reg.rewrite:
            # A channels-last op's result: the NHWC view, after its producer.
            nodes = _relayout(v, TO_NHWC, p.loc)
            for node in reversed(nodes):
                graph.insert_after(p, node)
            nhwc_of[v] = nodes[-1].results[0] if nodes else v
            return nhwc_of[v]
        # From outside the region: an entry, placed before its first reader (an operand of
        # lower rank is first padded to rank 4).
        nodes = []
        cur = v
        if v.type.rank < 4:
            if not _moves_data(v.type):
                nodes = [_reshape(v, nhwc_type(v.type).shape, reader.loc)]
            else:
                nodes = [_reshape(v, (1,) * (4 - v.type.rank) + tuple(v.type.shape), reader.loc)]
                nodes.append(_transpose(nodes[0].results[0], TO_NHWC, reader.loc))
        else:
            nodes = _relayout(v, TO_NHWC, reader.loc)
        for node in nodes:
            graph.insert_before(reader, node)
        nhwc_of[v] = nodes[-1].results[0] if nodes else cur
        return nhwc_of[v]

    for n in reg.nodes:
        cl = CHANNELS_LAST.get(n.op)
        if cl is not None:
            for i in cl.operands(n):
                v = n.operands[i]
                if v in nhwc_of and v.producer in reg.rewrite:
                    graph.set_operand(n, i, nchw_form(v))
            continue
        rule = reg.rewrite[n]
        ops = [nhwc_form(v, n) if lay else v for v, lay in zip(n.operands, rule.layout)]
        types = [nhwc_type(r.type) if k else r.type for r, k in zip(n.results, rule.nhwc_results)]
        new = Node(rule.op, ops, rule.attrs, types, n.loc)
        graph.insert_before(n, new)
        for r, nr, k in zip(n.results, new.results, rule.nhwc_results):
            if k:
                nhwc_of[r] = nr
            else:
                nchw_of[r] = nr      # the same value as before
        old.append(n)
    for n in old:
        for r, k in zip(n.results, reg.rewrite[n].nhwc_results):
            if not k:
                graph.replace_all_uses(r, nchw_of[r])
            elif r.is_output or any(u not in in_region for u in r.users):
                graph.replace_all_uses(r, nchw_form(r))
    for n in reversed(old):
        for r in n.results:
            for u in list(r.users):
                assert u in reg.rewrite, f"assign-layout: {u.op} still reads a rewritten value"
        graph.erase(n)


# --- the pass -----------------------------------------------------------------------------------

def _line(reg: Region) -> str:
    head = (f"// assign-layout: region of {len(reg.nodes)} node(s){reg.where()} ({reg.convs} convolution(s)): "
            f"saves {reg.saved} element(s) of conversions, layout changes cost {reg.cost}")
    if reg.apply:
        return (head + f": NHWC, {reg.changes} layout change(s) placed, {reg.views} view(s)"
                + (f", {reg.reshapes} reshape(s)" if reg.reshapes else "") + "\n")
    return head + ": kept NCHW\n"


@register_pass
class AssignLayout(Pass):
    """Regions of library convolutions (conv2d_pointwise) and the ops between them compute on
    channels-last tensors: elementwise ops, fused kernels and reductions on NHWC values, the
    convolutions, pools and batch_norm on their channels-last views. A region is rewritten only
    when the conversions its convolutions no longer make (one pass over each input an NHWC op
    computed) exceed the layout changes placed at its boundary (one pass over each tensor);
    ``trace=true`` writes each region's decision. docs/codegen.md, "Layout assignment"."""

    name = "assign-layout"

    @dataclass
    class Options:
        trace: bool = False

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.changes = 0                 # layout changes placed by the last run
        self.regions: list[Region] = []
        self.report = ""                 # the trace text of the last run

    def run(self, graph: Graph) -> Graph:
        from . import cnn_blocks

        if cnn_blocks.POOL_AS_CONV:  # NCHW average pools as depthwise convolutions first (cnn_blocks.py)
            cnn_blocks.pools_as_depthwise(graph)
        self.regions = plan_layout(graph)
        self.changes = 0
        lines = []
        for reg in self.regions:
            lines.append(_line(reg))
            if reg.apply:
                _rewrite(graph, reg)
                self.changes += reg.changes
        done = sum(r.apply for r in self.regions)
        lines.append(f"// assign-layout: {self.changes} layout change(s) placed; {done} of {len(self.regions)} "
                     f"region(s) in NHWC\n")
        self.report = "".join(lines)
        if self.options.trace:
            self.out.write(self.report)
        return graph


def assign_layout(graph: Graph) -> int:
    """Run ``assign-layout`` on ``graph`` in place; the number of layout changes it placed."""
    p = AssignLayout()
    p.run(graph)
    return p.changes


def count_layout_changes(graph: Graph) -> int:
    """The layout changes in ``graph``: transposes to NHWC of a value that no channels-last op
    (``CHANNELS_LAST``) produced, and transposes to NCHW read by anything but one."""
    n = 0
    for node in graph.nodes:
        if node.op != "transpose" or node.operands[0].type.rank != 4:
            continue
        perm = tuple(node.attrs["perm"] or ())
        if perm == TO_NHWC:
            p = node.operands[0].producer
            n += p is None or p.op not in CHANNELS_LAST
        elif perm == TO_NCHW:
            r = node.results[0]
            n += r.is_output or any(u.op not in CHANNELS_LAST for u in r.users)
    return n
