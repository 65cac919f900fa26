"""``partita cluster [NAME|PATH]``: what a cluster file describes, or the shipped clusters."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("cluster", parents=[common], help="show a cluster file, or list the shipped ones",
                       description="Print the summary of a cluster: a shipped name (e.g. selene) or the path of a "
                                   ".toml cluster file. Without one, list the clusters partita ships.")
    s.add_argument("cluster", metavar="NAME|PATH", nargs="?", help="a shipped cluster or a .toml file")
    s.set_defaults(handler=cmd_cluster)


def cmd_cluster(args: argparse.Namespace) -> int:
    from ..cluster import load_cluster, list_clusters
    from ..cluster.hardware import format_quantity

    if args.cluster is not None:
        print(load_cluster(args.cluster).summary())
        return 0
    for name in list_clusters():
        c = load_cluster(name)
        d = c.device
        # bf16 is what the shipped GPU files are priced in; a file without it shows its fastest dtype.
        dtype = "bf16" if "bf16" in d.peak_flops else max(d.peak_flops, key=lambda k: d.peak_flops[k])
        print(f"{name:<16} {c.nodes} x {c.gpus_per_node} {d.name}: {format_quantity(d.flops(dtype), 'FLOP/s')} {dtype}, "
              f"{format_quantity(d.memory, 'B')}, {format_quantity(d.memory_bandwidth, 'B/s')}")
    print("\n'partita cluster NAME' shows one; 'partita calibrate' measures this machine as a cluster file")
    return 0
