"""`llmgw ctl`: the operators' command line. Each app adds its commands (`<app>/cli.py: register`).

It works where the control plane's database is (DATABASE_URL, or the embedded SQLite under
LLMGW_DATA_DIR) and calls the same services as the API and the console.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from llmgw.errors import LlmgwError

COMMAND_MODULES = ("agents.cli", "facility.cli", "placement.cli", "llmgw.users_cli")

EPILOG = """\
examples:
  llmgw ctl nodes --domain rack:r12-07
  llmgw ctl label gpu01 llmgw.io/rack=r12-07 llmgw.io/pdu=r12-07-a,r12-07-b
  llmgw ctl label gpu01 llmgw.io/rack-            # back to the agent's value
  llmgw ctl facility apply -f server.yaml
  llmgw ctl facility hold rack:r12-07 --reason "PDU swap" --drain
  llmgw ctl facility -o json
"""


def output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="table for people (default), json for tools"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw ctl",
        description="Operate llmgw: nodes and their location labels, the facility's budgets and holds, models.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(commands)
    return parser


def main(argv: list[str]) -> int:
    import django

    django.setup()
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args) or 0
    except LlmgwError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `llmgw ctl nodes | head`: the reader has what it wanted
        sys.stderr.close()
        return 0
