"""``partita calibrate``: measure this machine and write it as a cluster file.

The device is one CPU rank running torch on ``--threads`` threads, the cluster ``--nproc``
gloo ranks on loopback (one node): peak FLOP/s per dtype, the memory bandwidth, the
``[efficiency]`` table and gloo's latency and bandwidth, each printed with its fit error
(partita/cluster/calibrate.py says how each is measured). ``partita simulate --cluster
this-machine.toml`` then prices programs on this machine.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..cluster.calibrate import MAX_NPROC, MAX_THREADS
from .common import check_output_path, format_table, int_arg, short


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    s = sub.add_parser("calibrate", parents=[common], help="measure this machine and write its cluster file",
                       description="Measure this machine's compute rates (matmul peak per dtype, memory bandwidth, "
                                   "the [efficiency] table) and gloo's latency and bandwidth on loopback, and write "
                                   "them as a cluster file for 'partita simulate --cluster'.")
    s.add_argument("--nproc", type=int_arg(2, MAX_NPROC, "gloo ranks on one machine's loopback"), default=4,
                   help=f"gloo ranks on loopback (default 4, at most {MAX_NPROC})")
    s.add_argument("--threads", type=int_arg(1, MAX_THREADS, "torch threads per rank"), default=1,
                   help=f"torch threads per rank (default 1, at most {MAX_THREADS})")
    s.add_argument("--quick", action="store_true", help="fewer sizes and repeats (about 20 s)")
    s.add_argument("-o", "--output", default="this-machine.toml", metavar="FILE.toml",
                   help="where to write the cluster file (default this-machine.toml)")
    s.set_defaults(handler=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..cluster.calibrate import measure, summary_rows, write_cluster

    check_output_path(args.output, "-o/--output")        # before minutes of measuring
    cal = measure(nproc=args.nproc, threads=args.threads, quick=args.quick, progress=print)
    print()
    print(format_table(["figure", "value", "error"], summary_rows(cal)))
    print("error: a fit's RMS relative error, or the relative spread (median absolute deviation) of repeated "
          "timings")
    path = write_cluster(cal.cluster, args.output)
    print(f"\nmeasured in {cal.seconds:.1f} s; wrote {short(path)} "
          f"(partita simulate --cluster {short(path)} ...; partita cluster {short(path)})")
    return 0
