"""`containerbench` command line: what the workflow's rules call, and what a
person runs to inspect a plan, re-parse a log or build an image by hand.

Each command imports what it needs when it runs: `plan` and `launch` start
without loading pandas or matplotlib. Each group of commands is a module here
that adds its own: sweep, results, history, fleet, image."""

from __future__ import annotations

import argparse
import os
import sys

from containerbench import config as cb_config
from containerbench.cli import fleet, history, image, results, sweep

COMMAND_GROUPS = (sweep, results, history, fleet, image)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="containerbench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.add_commands(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "config", "unset") is None:
        args.config = ["config/config.yaml"]
    try:
        return args.func(args)
    except cb_config.ConfigError as error:
        print(error, file=sys.stderr)
        return 2
    except BrokenPipeError:  # `containerbench plan | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 0

