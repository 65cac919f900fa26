"""The ``partita`` command: ``import``, ``opt``, ``verify``, ``run``, ``train``, ``demo``, ``ops``, ``simulate``,
``plan``, ``cluster``, ``calibrate`` and ``view``.

One module per command, each with ``add_parser`` and its ``cmd_*`` handler; ``common`` holds
what they share (exit codes, error handling, weights, random inputs, tables). The package
sits on top of every layer and no module outside it imports from it.

Exit codes: 0 success, 1 an error the user can fix (a ``PartitaError``, a missing file, an
interrupt), 2 a usage error (bad flags), 3 an internal error (a bug in partita). Errors
print as one ``error: ...`` message without a traceback; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import calibrate, cluster, demo, import_, ops, opt, plan, run, simulate, train, verify, view
from .common import EXIT_USAGE, run_command

__all__ = ["main", "build_parser"]

# In the order of 'partita --help'.
COMMANDS = (import_, opt, verify, run, demo, ops, train, simulate, plan, cluster, calibrate, view)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``partita`` command with ``argv`` (default: ``sys.argv[1:]``); return the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits on --help (0) and on usage errors (2)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if getattr(args, "handler", None) is None:
        parser.print_usage(sys.stderr)
        print("partita: error: a command is required (import, opt, verify, run, train, demo, ops, simulate, plan, cluster, calibrate, view); "
              "see 'partita --help'", file=sys.stderr)
        return EXIT_USAGE
    args.process_exits = argv is None  # the process's own command line: it ends after the command
    return run_command(args.handler, args, bool(args.debug))


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``partita`` command (exposed for tests and docs)."""
    from .. import __version__

    # --debug is accepted before or after the subcommand; SUPPRESS keeps a subparser from
    # resetting a value the main parser already set.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show Python tracebacks for errors")

    p = argparse.ArgumentParser(
        prog="partita",
        description="partita: a deep-learning compiler. Optimize, verify and run .pir graphs.",
        epilog="Run 'partita demo' for a tour, or 'partita COMMAND --help' for one command.",
    )
    p.add_argument("--version", action="version", version=f"partita {__version__}")
    p.add_argument("--debug", action="store_true", default=False, help="show Python tracebacks for errors")
    sub = p.add_subparsers(title="commands", metavar="COMMAND")
    for command in COMMANDS:
        command.add_parser(sub, common)
    return p
