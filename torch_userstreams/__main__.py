"""Command line: ``python -m torch_userstreams <command>`` (also the ``torch-userstreams`` script).

Each subcommand is one entry in ``_COMMANDS``: a help line and a function taking the parsed
arguments and returning the exit status, so adding a command touches one place.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence


def _doctor(args: argparse.Namespace) -> int:
    from . import doctor  # imported lazily: importing it pulls in torch

    return doctor.run(sys.stdout)


_COMMANDS: dict[str, tuple[str, Callable[[argparse.Namespace], int]]] = {
    "doctor": (
        "check this torch: version, accelerator, every patch point (patches nothing)",
        _doctor,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The parser with one subparser per command."""
    parser = argparse.ArgumentParser(
        prog="torch-userstreams", description="torch_userstreams utilities."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (help_text, func) in _COMMANDS.items():
        sub.add_parser(name, help=help_text, description=help_text).set_defaults(func=func)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default ``sys.argv[1:]``), run the command, return its exit status."""
    args = build_parser().parse_args(argv)
    func: Callable[[argparse.Namespace], int] = args.func
    return func(args)


if __name__ == "__main__":
    sys.exit(main())
