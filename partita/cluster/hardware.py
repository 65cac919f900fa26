"""Hardware as data: devices, nodes and the network between them, read from small TOML files.

A cluster file says what one device can do (peak dense FLOP/s per dtype, memory bandwidth and
capacity), how many devices a node holds and how fast they talk inside it (NVLink/NVSwitch),
and how fast nodes talk to each other (the network bandwidth per device and its latency).
The files partita ships live in ``partita/cluster/clusters/`` (``list_clusters()``); a user
copies one and edits it to describe their own machines (``load_cluster("my-cluster.toml")``).

Quantities are numbers in base units (bytes, bytes/s, FLOP/s, seconds) or strings with a unit:
``"80 GiB"``, ``"2039 GB/s"``, ``"200 Gb/s"`` (bits), ``"312 TFLOP/s"``, ``"5 us"``. Bandwidths
are per device and per direction. Every error names the file, the line and the field, and
says what was wrong with it.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

from ..ir.diagnostics import PartitaError, suggest
from ..ir.diagnostics import given as _given

CLUSTER_DIR = Path(__file__).resolve().parent / "clusters"


class ClusterError(PartitaError):
    """A cluster file that does not parse or describes an impossible machine."""


class QuantityError(ClusterError, ValueError):
    """A quantity that is not a number with a unit of the kind asked for (also a ValueError,
    as ``parse_quantity`` has always raised)."""


@dataclass(frozen=True)
class Device:
    """One accelerator (or CPU): what it computes and stores."""

    name: str
    peak_flops: Mapping[str, float]      # dtype name (bf16, f16, tf32, f32, f64, f8, i8) -> dense FLOP/s
    memory: float                        # bytes
    memory_bandwidth: float              # bytes/s
    # A CPU's last-level cache: a memory-bound op whose operands and results fit in ``cache``
    # bytes moves them at ``cache_bandwidth`` instead (None: no such cache is modelled).
    cache: float | None = None
    cache_bandwidth: float | None = None

    def flops(self, dtype: str) -> float:
        """Peak dense FLOP/s for ``dtype``; a dtype the device file does not list is an error."""
        if dtype not in self.peak_flops:
            raise ClusterError(f"device '{self.name}' lists no peak FLOP/s for {dtype}; it lists "
                               f"{', '.join(sorted(self.peak_flops))}")
        return self.peak_flops[dtype]


@dataclass(frozen=True)
class Link:
    """A communication path: bandwidth per device and direction (bytes/s), and latency (s)."""

    bandwidth: float
    latency: float
    # Measured figures of particular collectives over this link (partita calibrate: gloo's
    # all_reduce, all_gather, ... each fitted to its own alpha-beta model), as (op, latency,
    # bandwidth); an op listed here is priced with its own figures, the others with the link's.
    collectives: tuple[tuple[str, float, float], ...] = ()
    # Measured times of particular collectives (partita calibrate), as (op, ranks, ((bytes,
    # seconds), ...)) in increasing bytes: an op listed here is priced by interpolating them
    # (log-log), for another group size scaled by its alpha-beta model's ratio. Gloo's times
    # do not follow one alpha-beta line (an all_reduce of 64 KiB costs ten 4 B ones).
    measured: tuple[tuple[str, int, tuple[tuple[float, float], ...]], ...] = ()

    def time(self, nbytes: float) -> float:
        """Seconds to move ``nbytes`` over the link once (the alpha-beta model)."""
        return self.latency + nbytes / self.bandwidth

    def measured_for(self, op: str) -> "tuple[int, tuple[tuple[float, float], ...]] | None":
        """(ranks, points) measured for collective ``op`` (send_recv for send and recv), or None."""
        key = "send_recv" if op in ("send", "recv") else op
        for name, n, pts in self.measured:
            if name == key:
                return n, pts
        return None

    def for_op(self, op: str) -> "tuple[float, float] | None":
        """(latency, bandwidth) measured for collective ``op`` (send_recv for send and recv),
        or None."""
        key = "send_recv" if op in ("send", "recv") else op
        for name, a, b in self.collectives:
            if name == key:
                return a, b
        return None


@dataclass(frozen=True)
class Efficiency:
    """What fraction of the data sheet's peaks real kernels and collectives reach: parameters
    of the cost model (partita/cluster/cost.py), fitted once per machine (``partita calibrate``
    measures them here; the shipped GPU files hold the values fitted to published runs) and
    written in the cluster file's ``[efficiency]`` table. Not tuned per model or per plan.

    - ``gemm``: fraction of peak FLOP/s a large matmul reaches;
    - ``gemm_knee``: a matmul dim of this size halves it (the efficiency of an (m, k) x (k, n)
      product is ``gemm`` times ``d / (d + gemm_knee)`` for each of m, n, k);
    - ``attention``: fraction of peak FLOP/s of fused (flash) attention, forward and backward;
    - ``memory``: fraction of the memory bandwidth a memory-bound op (elementwise, norms,
      reductions, copies) reaches;
    - ``stream``: fraction of the memory bandwidth the streaming ops reach (the optimizer's
      updates, concat, split: ``STREAM_OPS`` in partita/cluster/cost.py); None (the file gives
      none): ``memory``. On a CPU thread the two differ by 4x: a norm or a GELU is bound by its
      arithmetic, an AdamW step by its bytes;
    - ``op_overhead``: seconds each op costs beyond its work (a kernel launch);
    - ``network``: fraction of a link's bandwidth a collective's transfers reach.
    """

    gemm: float = 0.8
    gemm_knee: float = 64.0
    attention: float = 0.6
    memory: float = 0.8
    op_overhead: float = 5e-6
    network: float = 0.8
    stream: float | None = None


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``gpus_per_node`` identical devices."""

    name: str
    device: Device
    nodes: int
    gpus_per_node: int
    intra_node: Link
    inter_node: Link
    description: str = ""
    source: str = ""                     # the file it came from
    sources: tuple[str, ...] = field(default_factory=tuple)
    efficiency: Efficiency = field(default_factory=Efficiency)
    # CPU ranks that share their node's cores (this machine: 4 gloo ranks on 2 cores): at most
    # this many of a node's ranks compute at full speed at once; k > cores_per_node computing
    # together each run at cores_per_node / k of their speed. None: devices share nothing.
    cores_per_node: int | None = None
    # Whether the runtime on this cluster runs the code generator's fused elementwise groups
    # (simulate's fuse_groups default): True for an accelerator cluster priced as a compiled
    # step; False in a file partita calibrate wrote, whose ranks ran each op as its own ATen
    # call (TorchProgram), as the runs it was measured on did.
    fused_groups: bool = True

    @property
    def devices(self) -> int:
        """Devices in the whole cluster."""
        return self.nodes * self.gpus_per_node

    def node_of(self, rank: int) -> int:
        """The node holding global rank ``rank`` (ranks fill a node before the next)."""
        if not 0 <= rank < self.devices:
            raise ClusterError(f"rank {rank} is outside the cluster '{self.name}' of {self.devices} devices")
        return rank // self.gpus_per_node

    def link(self, ranks: list[int] | tuple[int, ...]) -> Link:
        """The slowest path a group of ranks communicates over: NVLink inside one node, the
        network once the group spans nodes.

        A group with m > 1 members in every node it spans crosses the network on m of the
        node's links at once: NCCL splits a collective over several rings (channels), each
        leaving the node through a different NIC ("AllReduce ... will form multiple rings so
        that it can utilize all the available NICs", NVIDIA/nccl-tests#277; a DGX A100's 8 x
        200 Gb/s give a measured 192 GB/s all-reduce bus bandwidth, NVIDIA/nccl#812), so a
        rank's share of the traffic moves at ``min(m x network, NVLink)`` (the rings still pass
        every byte through NVLink inside the node). FSDP's and plain data parallelism's groups
        hold all of a node's devices (m = gpus_per_node); a tensor-parallel-inner layout's dp
        groups hold one device a node and keep the network's bandwidth. A link with measured
        figures (``collectives``, ``measured``) is kept as measured.
        """
        per_node: dict[int, int] = {}
        for r in ranks:
            node = self.node_of(r)
            per_node[node] = per_node.get(node, 0) + 1
        if len(per_node) <= 1:
            return self.intra_node
        rails = min(per_node.values())
        net = self.inter_node
        if rails <= 1 or net.collectives or net.measured:
            return net
        return replace(net, bandwidth=min(rails * net.bandwidth, self.intra_node.bandwidth))

    def with_nodes(self, nodes: int) -> "Cluster":
        """The same machines, ``nodes`` of them."""
        from dataclasses import replace

        if isinstance(nodes, bool) or not isinstance(nodes, int):
            raise ClusterError(f"Cluster.with_nodes: nodes must be a whole number, got {_given(nodes)}")
        if not 1 <= nodes <= min(MAX_NODES, MAX_DEVICES // self.gpus_per_node):
            raise ClusterError(f"Cluster.with_nodes: cluster '{self.name}' takes 1 to "
                               f"{min(MAX_NODES, MAX_DEVICES // self.gpus_per_node):,} nodes of {self.gpus_per_node} "
                               f"devices, got {nodes:,}")
        return replace(self, nodes=nodes)

    def summary(self) -> str:
        d = self.device
        flops = ", ".join(f"{k} {format_quantity(v, 'FLOP/s')}" for k, v in sorted(d.peak_flops.items()))
        return "\n".join([
            f"cluster {self.name}: {self.nodes} node(s) x {self.gpus_per_node} {d.name} = {self.devices} devices",
            f"  device: {format_quantity(d.memory, 'B')} at {format_quantity(d.memory_bandwidth, 'B/s')}; peak {flops}",
            f"  inside a node: {format_quantity(self.intra_node.bandwidth, 'B/s')} per device, "
            f"{format_quantity(self.intra_node.latency, 's')} latency",
            f"  between nodes: {format_quantity(self.inter_node.bandwidth, 'B/s')} per device, "
            f"{format_quantity(self.inter_node.latency, 's')} latency",
            "  efficiency: " + ", ".join(
                f"{k} {format_quantity(v, 's') if k == 'op_overhead' else f'{v:g}'}"
                for k, v in vars(self.efficiency).items() if v is not None),
        ])


# --- quantities ----------------------------------------------------------------------------------

_DECIMAL = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
_BINARY = {"Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50}
_TIME = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")
# What each kind of field takes, and the unit it is stored in.
KINDS = {"bytes": "B", "bandwidth": "B/s", "flops": "FLOP/s", "time": "s", "count": "", "fraction": ""}


def parse_quantity(value: Any, kind: str) -> float:
    """A number, or a string with a unit, in base units of ``kind`` (see KINDS). Raises
    QuantityError (a ClusterError and a ValueError) saying what was expected; the result is
    finite, but its range is the caller's to check (``check_range``)."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise QuantityError(f"parse_quantity: kind must be one of {', '.join(KINDS)}; got {_given(kind)}")
    if isinstance(value, bool):
        raise QuantityError(f"expected a {kind} quantity, got the boolean {str(value).lower()}")
    if isinstance(value, int):
        if abs(value) > 10 ** 300:
            raise QuantityError(f"expected a {kind} quantity, got an integer of {len(str(abs(value)))} digits, "
                                "beyond any sane value")
        return float(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"expected a finite {kind} quantity, got {value}")
        return value
    if not isinstance(value, str):
        raise QuantityError(f"expected a number or a string with a unit such as {_example(kind)}, got "
                            f"{_given(value)}")
    m = _QUANTITY.match(value)
    if not m:
        raise QuantityError(f"'{value:.60}' is not a number with a unit, such as {_example(kind)}")
    number, unit = float(m.group(1)), m.group(2)
    scale = _unit_scale(unit, kind)
    if scale is None:
        raise QuantityError(f"'{value}': the unit '{unit}' is not a {kind} unit (write it as {_example(kind)})")
    x = number * scale
    if not math.isfinite(x):
        raise QuantityError(f"'{value}' is beyond any finite {kind} quantity")
    return x



def _example(kind: str) -> str:
    return {"bytes": "'80 GiB' or '40 GB'", "bandwidth": "'2039 GB/s' or '200 Gb/s'",
            "flops": "'312 TFLOP/s'", "time": "'5 us' or '1.5 ms'", "count": "8", "fraction": "0.75"}[kind]


def _unit_scale(unit: str, kind: str) -> float | None:
    if kind == "time":
        return _TIME.get(unit)
    if kind in ("count", "fraction"):
        return 1.0 if unit == "" else None
    suffix = {"bytes": ("B",), "bandwidth": ("B/s", "b/s"), "flops": ("FLOP/s", "FLOPS", "flop/s")}[kind]
    for s in suffix:
        if unit.endswith(s):
            prefix = unit[: -len(s)]
            bits = 1 / 8 if s == "b/s" else 1.0
            if prefix in _BINARY:
                return _BINARY[prefix] * bits
            if prefix in _DECIMAL:
                return _DECIMAL[prefix] * bits
    return None


def format_quantity(x: float, unit: str) -> str:
    """``x`` base units as a short human string: 3.35e12 B/s -> '3.35 TB/s', 5e-06 s -> '5 us'."""
    if unit == "s":
        for name, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
            if abs(x) >= scale or name == "ns":
                return f"{x / scale:.3g} {name}"
    if unit == "B" and x >= 2 ** 30 and abs(x / 2 ** 30 - round(x / 2 ** 30)) < 1e-9:
        return f"{x / 2 ** 30:.4g} GiB"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.4g} {prefix}{unit}"
    return f"{x:.4g} {unit}"


# --- files ---------------------------------------------------------------------------------------

# section -> field -> (kind, required)
_SCHEMA: dict[str, dict[str, tuple[str, bool]]] = {
    "": {"name": ("text", True), "description": ("text", False), "nodes": ("count", True),
         "gpus_per_node": ("count", True), "cores_per_node": ("count", False), "sources": ("texts", False),
         "fused_groups": ("flag", False)},
    "device": {"name": ("text", True), "memory": ("bytes", True), "memory_bandwidth": ("bandwidth", True),
               "peak_flops": ("table", True), "cache": ("bytes", False), "cache_bandwidth": ("bandwidth", False)},
    "intra_node": {"bandwidth": ("bandwidth", True), "latency": ("time", True), "collectives": ("table", False),
                   "measured": ("table", False)},
    "inter_node": {"bandwidth": ("bandwidth", True), "latency": ("time", True), "collectives": ("table", False),
                   "measured": ("table", False)},
    "efficiency": {"gemm": ("fraction", False), "gemm_knee": ("count", False), "attention": ("fraction", False),
                   "memory": ("fraction", False), "op_overhead": ("time", False), "network": ("fraction", False),
                   "stream": ("fraction", False)},
}
_OPTIONAL_TABLES = ("efficiency",)

# What partita accepts, per kind and where a field needs its own bounds, in base units: wide
# enough for any real machine (a CPU core to an exascale GPU, loopback to NVLink), narrow
# enough that the simulator's arithmetic stays finite and meaningful (a device of 5e-324
# FLOP/s or a knee of 1e308 divided by zero; an op overhead of 1e308 s gave an infinite step).
MAX_NODES = 1_000_000
MAX_DEVICES = 100_000_000
RANGES: dict[Any, tuple[float, float]] = {
    "bytes": (1.0, 2.0 ** 60),                 # 1 B .. 1 EiB
    "bandwidth": (1e3, 1e16),                  # 1 kB/s .. 10 PB/s
    "flops": (1e6, 1e19),                      # 1 MFLOP/s .. 10 EFLOP/s
    "time": (0.0, 10.0),                       # latencies: 0 .. 10 s
    "count": (1.0, float(MAX_NODES)),
    "fraction": (1e-3, 1.0),                   # an efficiency below 0.1% is no machine
    ("", "gpus_per_node"): (1.0, 4096.0),
    ("", "cores_per_node"): (1.0, 65536.0),
    ("efficiency", "gemm_knee"): (1e-3, 1e6),  # a matmul dim in elements
    ("efficiency", "op_overhead"): (0.0, 1.0),
}
# [*.measured]: bytes and seconds of one collective, and its group size.
MEASURED_RANGES = {"bytes": (1.0, 2.0 ** 50), "seconds": (1e-9, 1e4), "ranks": (2, MAX_DEVICES)}
DTYPES = ("f64", "f32", "tf32", "bf16", "f16", "f8", "i8")


class _Located:
    """Line numbers of a TOML file's tables and keys, for error messages (tomllib gives none)."""

    def __init__(self, text: str, where: str) -> None:
        self.where = where
        self.lines: dict[tuple[str, str], int] = {}
        self.tables: dict[str, int] = {}
        table = ""
        for i, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            m = re.match(r"^\[\s*([A-Za-z0-9_.\-\s]+?)\s*\]$", line)
            if m:
                table = re.sub(r"\s+", "", m.group(1))
                self.tables.setdefault(table, i)
                continue
            m = re.match(r"^([A-Za-z0-9_\-]+)\s*=", line)
            if m:
                self.lines.setdefault((table, m.group(1)), i)

    def at(self, table: str, key: str | None = None) -> str:
        line = self.lines.get((table, key)) if key is not None else None
        line = line or self.tables.get(table)
        return f"{self.where}:{line}" if line else self.where

    def field_name(self, table: str, key: str) -> str:
        return f"[{table}] {key}" if table else key


def list_clusters() -> list[str]:
    """The names of the cluster files partita ships (``load_cluster(name)`` reads one)."""
    return sorted(p.stem for p in CLUSTER_DIR.glob("*.toml"))


def load_cluster(spec: "str | os.PathLike[str] | Cluster") -> Cluster:
    """A Cluster from a shipped name (``"selene"``), a path to a ``.toml`` file, or a Cluster."""
    if isinstance(spec, Cluster):
        return spec
    if not isinstance(spec, (str, os.PathLike)):
        raise ClusterError(f"load_cluster: give a shipped cluster's name (one of {', '.join(list_clusters())}), the "
                           f"path of a .toml file or a Cluster; got {_given(spec)}")
    text_spec = os.fspath(spec)
    if not isinstance(text_spec, str):
        text_spec = os.fsdecode(text_spec)
    if not text_spec or "\0" in text_spec:
        raise ClusterError(f"load_cluster: {text_spec!r:.80} is not a cluster name or a file path"
                           + (" (it holds a NUL byte)" if "\0" in text_spec else "")
                           + f"; the shipped clusters are {', '.join(list_clusters())}")
    path = Path(text_spec)
    if not path.suffix and not path.exists():
        shipped = CLUSTER_DIR / f"{text_spec}.toml"
        if not shipped.exists():
            raise ClusterError(f"no cluster named '{text_spec}'{suggest(text_spec, list_clusters())}; the shipped ones "
                               f"are {', '.join(list_clusters())}, or give the path of a .toml file")
        path = shipped
    try:
        if path.is_dir():
            raise ClusterError(f"{path}: is a directory, not a cluster file; give a .toml file inside it")
        data = path.read_bytes()
    except OSError as e:
        raise ClusterError(f"{path}: cannot read the cluster file: {e.strerror or e}") from None
    return parse_cluster(_decode(data, str(path)), str(path))


MAX_FILE_BYTES = 16 * 2 ** 20


def _decode(data: bytes, where: str) -> str:
    """A cluster file's bytes as text: UTF-8 (TOML's encoding), or an error at the first bad byte."""
    if len(data) > MAX_FILE_BYTES:
        raise ClusterError(f"{where}: {len(data):,} bytes is not a cluster file (at most "
                           f"{MAX_FILE_BYTES // 2 ** 20} MiB); is it the right file?")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ClusterError(f"{where}:{line}: the cluster file is not UTF-8 text (byte {e.start} is "
                           f"0x{data[e.start]:02x}); TOML files are UTF-8: save it as such") from None


def parse_cluster(text: str, where: str = "<cluster>") -> Cluster:
    """The Cluster a TOML text describes; every problem is a ClusterError naming the field."""
    import tomllib

    if not isinstance(where, str):
        where = "<cluster>"
    if isinstance(text, (bytes, bytearray)):
        text = _decode(bytes(text), where)
    if not isinstance(text, str):
        raise ClusterError(f"parse_cluster: text must be the TOML text of a cluster file (str); got {_given(text)}; "
                           "for a file use load_cluster(path)")
    if len(text) > MAX_FILE_BYTES:
        raise ClusterError(f"{where}: {len(text):,} characters is not a cluster file (at most "
                           f"{MAX_FILE_BYTES // 2 ** 20} Mi)")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ClusterError(f"{where}: not valid TOML: {e}") from None
    except RecursionError:
        raise ClusterError(f"{where}: arrays or tables nested too deeply to read; a cluster file nests at most "
                           "three levels") from None
    loc = _Located(text, where)
    values: dict[str, dict[str, Any]] = {}
    for table, fields in _SCHEMA.items():
        raw = data if not table else data.get(table)
        if table in _OPTIONAL_TABLES and raw is None:
            raw = {}
        if table and raw is None:
            raise ClusterError(f"{where}: the table [{table}] is missing; it holds "
                               f"{', '.join(k for k, (_, req) in fields.items() if req)}")
        if table and not isinstance(raw, dict):
            raise ClusterError(f"{loc.at('', table)}: '{table}' must be a table ([{table}]), not a value")
        assert isinstance(raw, dict)
        known = set(fields) | (set(_SCHEMA) - {""} if not table else set())
        for key in raw:
            if key not in known:
                raise ClusterError(f"{loc.at(table, key)}: unknown field {loc.field_name(table, key)}"
                                   f"{suggest(key, known)}; [{table or 'top level'}] takes {', '.join(sorted(fields))}")
        out: dict[str, Any] = {}
        for key, (kind, required) in fields.items():
            if key not in raw:
                if required:
                    raise ClusterError(f"{loc.at(table)}: the field {loc.field_name(table, key)} is missing "
                                       f"({_describe(kind)})")
                continue
            out[key] = _value(raw[key], kind, table, key, loc)
        values[table] = out
    top, dev = values[""], values["device"]
    peak: dict[str, float] = {}
    for dtype, v in dev["peak_flops"].items():
        if dtype not in DTYPES:
            raise ClusterError(f"{loc.at('device.peak_flops', dtype)}: unknown dtype '{dtype}' in "
                               f"[device.peak_flops]{suggest(dtype, DTYPES)}; dtypes: {', '.join(DTYPES)}")
        peak[dtype] = _value(v, "flops", "device.peak_flops", dtype, loc)
    if not peak:
        raise ClusterError(f"{loc.at('device.peak_flops')}: [device.peak_flops] lists no dtype; give at least one, "
                           "e.g. bf16 = \"312 TFLOP/s\"")
    for key in ("nodes", "gpus_per_node", "cores_per_node"):
        if key in top and top[key] != int(top[key]):
            raise ClusterError(f"{loc.at('', key)}: {key} must be a whole number, got {top[key]}")
    if top["nodes"] * top["gpus_per_node"] > MAX_DEVICES:
        raise ClusterError(f"{loc.at('', 'nodes')}: {int(top['nodes']):,} nodes x {int(top['gpus_per_node']):,} devices "
                           f"is more than the {MAX_DEVICES:,} devices partita simulates")
    if ("cache" in dev) != ("cache_bandwidth" in dev):
        have, miss = ("cache", "cache_bandwidth") if "cache" in dev else ("cache_bandwidth", "cache")
        raise ClusterError(f"{loc.at('device', have)}: [device] gives {have} without {miss}; give both (the "
                           "last-level cache's bytes and its bandwidth) or neither")
    device = Device(dev["name"], peak, dev["memory"], dev["memory_bandwidth"], dev.get("cache"),
                    dev.get("cache_bandwidth"))
    links = {t: Link(values[t]["bandwidth"], values[t]["latency"], _collectives(values[t], t, loc),
                     _measured(values[t], t, loc))
             for t in ("intra_node", "inter_node")}
    return Cluster(top["name"], device, int(top["nodes"]), int(top["gpus_per_node"]),
                   links["intra_node"], links["inter_node"],
                   top.get("description", ""), where, tuple(top.get("sources", ())),
                   Efficiency(**values["efficiency"]),
                   int(top["cores_per_node"]) if "cores_per_node" in top else None,
                   top.get("fused_groups", True))


def _describe(kind: str) -> str:
    fixed = {"text": "a string", "texts": "a list of strings", "table": "a table of dtype = FLOP/s", "flag": "true or false",
             "count": "a positive whole number", "fraction": "a fraction in (0, 1] such as 0.75"}
    return fixed[kind] if kind in fixed else f"a {kind} quantity such as {_example(kind)}"


COLLECTIVE_NAMES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


def _collective_entries(link: Mapping[str, Any], key: str, table: str, loc: _Located
                        ) -> "list[tuple[str, Any, str]]":
    """(op, entry, table name) of ``[<table>.<key>]``, each op checked to be a collective."""
    where = f"{table}.{key}"
    out = []
    for op, entry in (link.get(key) or {}).items():
        if op not in COLLECTIVE_NAMES:
            raise ClusterError(f"{loc.at(where, op)}: unknown collective '{op}' in [{where}]"
                               f"{suggest(op, COLLECTIVE_NAMES)}; collectives: {', '.join(COLLECTIVE_NAMES)}")
        out.append((op, entry, where))
    return out


def _collectives(link: Mapping[str, Any], table: str, loc: _Located) -> tuple[tuple[str, float, float], ...]:
    """``[<table>.collectives]``: ``all_reduce = { latency = "119 us", bandwidth = "899 MB/s" }``."""
    out = []
    for op, entry, where in _collective_entries(link, "collectives", table, loc):
        if not isinstance(entry, dict) or set(entry) != {"latency", "bandwidth"}:
            raise ClusterError(f"{loc.at(where, op)}: {op} in [{where}] must be a table of latency and bandwidth, "
                               f'e.g. {op} = {{ latency = "100 us", bandwidth = "1 GB/s" }}; got {entry!r:.80}')
        out.append((op, _value(entry["latency"], "time", where, op, loc),
                    _value(entry["bandwidth"], "bandwidth", where, op, loc)))
    return tuple(out)


def _measured(link: Mapping[str, Any], table: str, loc: _Located
              ) -> tuple[tuple[str, int, tuple[tuple[float, float], ...]], ...]:
    """``[<table>.measured]``: ``all_reduce = { ranks = 4, bytes = [4, 65536], seconds = [5e-4, 6e-3] }``."""
    out = []
    for op, entry, where in _collective_entries(link, "measured", table, loc):
        def bad(why: str) -> ClusterError:
            return ClusterError(f"{loc.at(where, op)}: {op} in [{where}]: {why}; it must be a table of ranks (2 or "
                                "more), bytes (increasing, positive) and seconds (positive, as many), e.g. "
                                f"{op} = {{ ranks = 4, bytes = [4, 65536], seconds = [5e-4, 6e-3] }}")
        if not isinstance(entry, dict) or set(entry) != {"ranks", "bytes", "seconds"}:
            raise bad(f"got {entry!r:.80}")
        lo, hi = MEASURED_RANGES["ranks"]
        ranks = entry["ranks"]
        if isinstance(ranks, bool) or not isinstance(ranks, int) or not lo <= ranks <= hi:
            raise bad(f"ranks = {ranks!r:.40} is not a whole number from {lo} to {hi:,}")
        cols = {}
        for k in ("bytes", "seconds"):
            col = entry[k]
            if not isinstance(col, list) or not col:
                raise bad(f"{k} = {col!r:.40} is not a non-empty list of numbers")
            lo_k, hi_k = MEASURED_RANGES[k]
            for i, x in enumerate(col):
                if isinstance(x, bool) or not isinstance(x, (int, float)) or \
                        not (isinstance(x, float) or abs(x) <= 10 ** 300) or not lo_k <= float(x) <= hi_k:
                    raise bad(f"{k}[{i}] = {x!r:.40} is not a number from {lo_k:g} to {hi_k:g}")
            cols[k] = [float(x) for x in col]
        xs, ts = cols["bytes"], cols["seconds"]
        if len(xs) != len(ts):
            raise bad(f"{len(xs)} bytes but {len(ts)} seconds")
        if not all(a < b for a, b in zip(xs, xs[1:])):
            raise bad("the bytes do not increase")
        out.append((op, ranks, tuple(zip(xs, ts))))
    return tuple(out)


def _value(v: Any, kind: str, table: str, key: str, loc: _Located) -> Any:
    name = loc.field_name(table, key)
    if kind == "text":
        if not isinstance(v, str) or not v.strip():
            raise ClusterError(f"{loc.at(table, key)}: {name} must be a non-empty string, got {v!r}")
        return v
    if kind == "texts":
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ClusterError(f"{loc.at(table, key)}: {name} must be a list of strings")
        return v
    if kind == "flag":
        if not isinstance(v, bool):
            raise ClusterError(f"{loc.at(table, key)}: {name} must be true or false, got {v!r:.60}")
        return v
    if kind == "table":
        if not isinstance(v, dict):
            raise ClusterError(f"{loc.at(table, key)}: {name} must be a table ([{table}.{key}])")
        return v
    try:
        x = parse_quantity(v, kind)
    except ValueError as e:
        raise ClusterError(f"{loc.at(table, key)}: {name}: {e}") from None
    if kind == "fraction" and not 0 < x <= 1:
        raise ClusterError(f"{loc.at(table, key)}: {name} must be a fraction in (0, 1], got {v!r:.60}")
    if x <= 0 and not (kind == "time" and x == 0):
        what = "zero or more" if kind == "time" else "positive"
        raise ClusterError(f"{loc.at(table, key)}: {name} must be {what}, got {v!r:.60}")
    lo, hi = RANGES.get((table, key)) or RANGES[kind]
    if not lo <= x <= hi:
        unit = KINDS[kind]
        raise ClusterError(f"{loc.at(table, key)}: {name} = {v!r:.60} is outside the range partita accepts for it, "
                           f"{_bound(lo, unit)} to {_bound(hi, unit)}; a real machine's value lies within it")
    return x


def _bound(x: float, unit: str) -> str:
    return f"{x:,.0f}" if not unit and x == int(x) else format_quantity(x, unit) if unit else f"{x:g}"
