"""`llmgw ctl`: the operators' command line. Each app adds its commands (`<app>/cli.py: register`).

It works where the control plane's database is (DATABASE_URL, or the embedded SQLite under
LLMGW_DATA_DIR) and calls the same services as the API and the console; with LLMGW_URL or --server it
is a client of the API instead (llmgw.remote), with the same commands and output, and imports no Django.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from pathlib import Path

from llmgw import remote as remote_mode
from llmgw import whereabouts
from llmgw.errors import InvalidInput, LlmgwError
from llmgw.output import WIDTH, printable, printable_output

COMMAND_MODULES = ("agents.cli", "facility.cli", "placement.cli", "llmgw.users_cli")
# `ctl login --token-file`: a token is a word of some tens of characters; a file of more holds none.
MAX_TOKEN_FILE_CHARS = 10_000

EPILOG = """\
examples:
  llmgw ctl nodes --domain rack:r12-07
  llmgw ctl label gpu01 llmgw.io/rack=r12-07 llmgw.io/pdu=r12-07-a,r12-07-b
  llmgw ctl label gpu01 llmgw.io/rack-            # back to the agent's value
  llmgw ctl facility apply -f server.yaml
  llmgw ctl facility hold rack:r12-07 --reason "PDU swap" --drain
  llmgw ctl facility -o json
  llmgw ctl token create alice --role operator | llmgw ctl login --server https://llmgw.example.org
  llmgw ctl --server https://llmgw.example.org nodes     # or LLMGW_URL (and LLMGW_TOKEN)
"""


def output_option(parser: argparse.ArgumentParser) -> None:
    """A listing's -o: a table for people (table, at most llmgw.output.WIDTH columns; wide: every column,
    nothing cut), json for tools."""
    parser.add_argument(
        "-o", "--output", choices=("table", "wide", "json"), default="table",
        help=f"table for people (default: at most {WIDTH} columns), wide (every column, nothing cut), json for tools",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="llmgw ctl",
        description="Operate llmgw: nodes and their location labels, the facility's budgets and holds, models.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--server", metavar="URL",
        help="work through this control plane's API (default: LLMGW_URL; without either, on the database here)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    login = commands.add_parser(
        "login",
        help="keep an API token for remote mode",
        description=(
            f"Check a token against --server and keep it in {remote_mode.token_path()} (mode 0600). The token "
            "comes from `llmgw ctl token create USER --role operator`, run where the database is (an admin "
            "makes it); login reads it from --token-file, else from standard input, else asks for it."
        ),
        epilog=(
            "examples:\n"
            "  llmgw ctl login --server https://llmgw.example.org                 # asks for the token\n"
            "  llmgw ctl token create alice --role operator | llmgw ctl login --server http://127.0.0.1:8000\n"
            "  llmgw ctl login --server https://llmgw.example.org --token-file alice.token"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    login.add_argument(
        "--token-file", help="a file holding the token (- reads standard input; not given: standard input, or asked)"
    )
    login.set_defaults(handler=login_command)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(commands)
    return parser


def login_command(args) -> int:
    if args.remote is None:
        raise LlmgwError("login: give --server URL (or LLMGW_URL)")
    from llmgw.yamldoc import read_input

    token_file = args.token_file
    if token_file is None and sys.stdin.isatty():
        import getpass

        print("An API token: `llmgw ctl token create USER --role operator` where the database is makes one.",
              file=sys.stderr)
        text, source = getpass.getpass("token: ")[:MAX_TOKEN_FILE_CHARS], "the prompt"
    else:
        token_file = token_file or "-"
        source = "standard input" if token_file == "-" else token_file
        try:
            # Within a bound: a token is one word, and --token-file /dev/zero must not be read until memory runs out.
            text = read_input(token_file, max_chars=MAX_TOKEN_FILE_CHARS)
        except InvalidInput as exc:
            raise InvalidInput(exc.message, field="token_file") from None
    if not text.strip():
        raise InvalidInput(
            f"{source}: holds no token (`llmgw ctl token create USER --role operator` where the database is makes one)",
            field="token_file",
        )
    if len(text.split()) > 1:  # a token is one word: two lines would go out as a broken header
        raise InvalidInput(f"{source}: holds more than one word; a token file holds the token alone", field="token_file")
    args.remote.token, args.remote.token_from = text.strip(), source
    args.remote.call("GET", "facility/events", params={"limit": 1})  # any authenticated read: is the token good?
    print(f"token kept in {remote_mode.token_save(args.remote.token)}; use --server {args.remote.url} or LLMGW_URL")
    return 0


def server_first(argv: list[str]) -> list[str]:
    """`--server URL` may come anywhere, kubectl-style (`llmgw ctl login --server URL …`): moved first."""
    rest, front = [], []
    i = 0
    while i < len(argv):
        if argv[i] == "--server" and i + 1 < len(argv):
            front, i = ["--server", argv[i + 1]], i + 2
            continue
        if argv[i].startswith("--server="):
            front = [argv[i]]
        else:
            rest.append(argv[i])
        i += 1
    return front + rest


def django_started() -> bool:
    """Django's settings are read already (tests, `llmgw shell`): the database is the one they name."""
    from django.conf import settings

    return settings.configured


def django_setup(*, read_only: bool) -> None:
    """Start Django for local mode with ctl's apps, not the web server's: a listing (llmgw.remote.listing)
    with those it reads (settings.CTL_READ_APPS), any other command with those it writes
    (settings.CTL_WRITE_APPS); unless Django has started already (tests, `llmgw shell`)."""
    import django
    from django.apps import apps
    from django.conf import settings

    if not apps.ready:
        # One command, one connection: a pool would only wait its 30 s before saying it cannot connect.
        os.environ.setdefault("LLMGW_DB_POOL", "false")
        ctl_apps = getattr(settings, "CTL_READ_APPS" if read_only else "CTL_WRITE_APPS", None)
        if ctl_apps is not None:
            settings.INSTALLED_APPS = ctl_apps
    django.setup()


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args``, but an option the command does not take is refused by the command's own
    parser, with its usage (`llmgw ctl nodes: error: unrecognized arguments: --bogus`), not the top's.

    An action that can judge its words only as a whole (agents.cli.NodeWords) leaves its refusal in
    ``usage_error`` (its parser, the words): said here, after every word is read, so a ``--help`` after
    them still shows the help."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = parser
        for word in argv:
            below = next(
                (a.choices.get(word) for a in command._actions if isinstance(a, argparse._SubParsersAction)), None
            )
            if below is not None:
                command = below
        command.error(f"unrecognized arguments: {' '.join(extra)}")
    late = getattr(args, "usage_error", None)
    if late is not None:
        command, message = late
        command.error(message)
    return args


def main(argv: list[str], *, own_process: bool = False) -> int:
    """Run one ctl command. `own_process`: it is all this process does, and it exits after (`llmgw ctl`).

    Then Python's cyclic garbage collector is off while the command starts and what starting made is
    frozen (gc.freeze): Django's and the apps' modules and classes live until exit anyway, and walking
    them again and again as they load, and once more as the interpreter ends, is work for nothing in a
    short command (bench/ctl_start.py). The command itself runs with the collector on, over its own
    objects only. Frozen at the end, what is left is not collected at exit either: the interpreter's
    teardown frees it, and what only a collection would finalize (a cycle holding a socket) the
    operating system closes as the process ends.
    """
    if own_process:
        gc.disable()
    try:
        return run(argv, own_process=own_process)
    finally:
        if own_process:
            gc.freeze()


def run(argv: list[str], *, own_process: bool) -> int:
    parser = build_parser()
    args = parse(parser, server_first(list(argv)))
    try:
        args.remote = remote_mode.remote_from(args.server)
        if args.remote is None:
            if not django_started():
                whereabouts.local_data_find()
                if not os.environ.get("DATABASE_URL"):
                    note = whereabouts.demo_stopped_note(Path(os.environ["LLMGW_DATA_DIR"]))
                    if note:
                        print(printable(note), file=sys.stderr)
            django_setup(read_only=getattr(args.handler, "read_only", False))
            sqlite_file_check()
        if own_process:
            gc.freeze()
            gc.enable()
        # Inside the command only: what started before (Django's logging) keeps the streams as they are.
        with printable_output():
            return args.handler(args) or 0
    except whereabouts.ServerNotFound as exc:
        print(printable(f"error: {exc}"), file=sys.stderr)
        return 2
    except LlmgwError as exc:
        print(printable(f"error: {exc.message}"), file=sys.stderr)
        return 1
    except BrokenPipeError:  # `llmgw ctl nodes | head`: the reader has what it wanted
        sys.stderr.close()
        return 0
    except Exception as exc:
        remote = getattr(args, "remote", None)
        shape = remote.wrong_shape(exc) if remote is not None else None
        if shape is not None:
            print(printable(f"error: {shape.message}"), file=sys.stderr)
            return 1
        # Only in local mode (remote_from may have failed before args.remote was set: not a database's).
        trouble = database_trouble(exc) if getattr(args, "remote", True) is None else None
        if trouble is None:
            raise
        print(f"error: {trouble}", file=sys.stderr)
        return 1


def sqlite_file_check() -> None:
    """A SQLite database named (DATABASE_URL) that is not there: refused before anything opens it, as
    SQLite would make an empty file there (ctl never creates a database)."""
    from django.db import connection

    name = str(connection.settings_dict.get("NAME") or "")
    if connection.vendor != "sqlite" or not name or name == ":memory:" or name.startswith("file:"):
        return
    if not os.path.exists(name):
        raise LlmgwError(
            f"no database at {name} ({_database_named()}): start a server on it first (llmgw migrate), or point ctl elsewhere"
        )


def database_trouble(exc: BaseException) -> str | None:
    """What to say when local mode cannot use its database: it cannot be reached, or it has no llmgw
    tables yet (a new DATABASE_URL or data directory, `llmgw migrate` not run); None for any other
    failure, which goes on as it was."""
    from django.db import DatabaseError, OperationalError, connection

    if not isinstance(exc, DatabaseError):
        return None
    text = str(exc).strip()
    said = text.splitlines()[0] if text else type(exc).__name__
    settings = connection.settings_dict
    where = settings.get("NAME")
    if connection.vendor == "postgresql":
        where = f"{settings.get('HOST') or 'localhost'}:{settings.get('PORT') or 5432}/{where}"
    if "no such table" in said or type(exc.__cause__).__name__ == "UndefinedTable":
        return f"the database {where} has no llmgw tables yet ({said}): run `llmgw migrate` first"
    if isinstance(exc, OperationalError) and connection.connection is None:
        return f"cannot open the database {where} ({_database_named()}): {said}"
    return None


def _database_named() -> str:
    """What named the database local mode opened: DATABASE_URL, else the data directory (LLMGW_DATA_DIR,
    ./var or the last demo's, which ctl found and set)."""
    return "DATABASE_URL" if os.environ.get("DATABASE_URL") else "LLMGW_DATA_DIR"
