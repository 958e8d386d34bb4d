"""`llmgw ctl token create|list|rotate|revoke` (API tokens for people and tools) and `llmgw ctl user
create|list|set-password|remove|unlock` (console users, their passwords, a login lockout lifted)."""

from __future__ import annotations

import sys

from llmgw.errors import InvalidInput
from llmgw.output import print_json, print_table
from llmgw.remote import path_part, read, write

# llmgw.permissions.ROLES, named here too: importing it would load Django for every remote command.
ROLES = ("viewer", "operator")
PASSWORD_STDIN_HELP = "read the password from the first line of standard input instead of asking for it"
EXPIRES_HELP = ("the token's lifetime: e.g. 90d, 12h, 30m, or never (default: LLMGW_TOKEN_LIFETIME, 90d); "
                "past it the token is refused")


def token_create(*, username: str, role: str, expires: str | None = None) -> str:
    """llmgw.users.token_create, named here too for the scripts that import it from this module (bench/)."""
    from llmgw.users import token_create as create

    return create(username=username, role=role, expires=expires)


def register(commands) -> None:
    p = commands.add_parser("token", help="API tokens: llmgw ctl token create USERNAME --role operator, list, rotate, revoke")
    sub = p.add_subparsers(dest="token_command", metavar="COMMAND", required=True)
    c = sub.add_parser(
        "create",
        help="print a new API token for a user (made if missing) with a role",
        description="Send it as 'Authorization: Token <key>'. viewer reads; operator also changes labels, holds, "
        "models and budgets. A user has one token: a new one replaces the old, which is refused from then on. "
        "In remote mode only an admin's token (a staff user) may make one.",
    )
    c.add_argument("username")
    c.add_argument("--role", choices=ROLES, default="viewer")
    c.add_argument("--expires", metavar="LIFETIME", help=EXPIRES_HELP)
    c.set_defaults(handler=token_command)
    ls = sub.add_parser(
        "list", help="the API tokens: user, role, key prefix, created, last used, expires",
        description="An admin (or the database, without --server) sees every user's token; another user their own.",
    )
    ls.add_argument("-o", "--output", choices=("table", "json"), default="table")
    ls.set_defaults(handler=token_list_command)
    r = sub.add_parser(
        "rotate", help="print a new key for a user's token; the old key is refused at once",
        description="Your own token, or (an admin) anyone's. The new key gets a fresh lifetime.",
    )
    r.add_argument("username")
    r.add_argument("--expires", metavar="LIFETIME", help=EXPIRES_HELP)
    r.set_defaults(handler=token_rotate_command)
    v = sub.add_parser(
        "revoke", help="remove a user's token: refused at once (the user and their role stay)",
        description="Your own token, or (an admin) anyone's.",
    )
    v.add_argument("username")
    v.set_defaults(handler=token_revoke_command)

    u = commands.add_parser(
        "user", help="console users: llmgw ctl user create USERNAME --role viewer, list, set-password, remove, unlock",
    )
    usub = u.add_subparsers(dest="user_command", metavar="COMMAND", required=True)
    c = usub.add_parser(
        "create", help="a console user who logs in with a password, with a role",
        description="Asks for the password twice (or reads one line from standard input with --password-stdin); "
        "at least 8 characters. viewer reads; operator also changes labels, holds, models and budgets. An admin "
        "(who gives out tokens and makes users) is made with `llmgw createsuperuser`. In remote mode an admin's token.",
    )
    c.add_argument("username")
    c.add_argument("--role", choices=ROLES, required=True)
    c.add_argument("--password-stdin", action="store_true", help=PASSWORD_STDIN_HELP)
    c.set_defaults(handler=user_create_command)
    ls = usub.add_parser(
        "list", help="the users: role, password or not, API token or not, last login",
        description="In remote mode an admin's token.",
    )
    ls.add_argument("-o", "--output", choices=("table", "json"), default="table")
    ls.set_defaults(handler=user_list_command)
    pw = usub.add_parser(
        "set-password", help="a new console password for a user; the old one is refused at once",
        description="Asks for it twice (or reads one line from standard input with --password-stdin). Anyone's "
        "where the database is; in remote mode your own, or (an admin's token) anyone's.",
    )
    pw.add_argument("username")
    pw.add_argument("--password-stdin", action="store_true", help=PASSWORD_STDIN_HELP)
    pw.set_defaults(handler=user_password_command)
    rm = usub.add_parser(
        "remove", help="remove a user and their API token (holds they made keep their name)",
        description="In remote mode an admin's token; an admin's account only a superuser's.",
    )
    rm.add_argument("username")
    rm.set_defaults(handler=user_remove_command)
    k = usub.add_parser(
        "unlock", help="lift a user's login lockout (after too many failed logins)",
        description="Forgets the failed logins recorded under the username, so they may log in again at once. "
        "A lockout of an address is lifted by `llmgw axes_reset_ip ADDRESS`. In remote mode an admin's token.",
    )
    k.add_argument("username")
    k.set_defaults(handler=user_unlock_command)


def token_command(args) -> int:
    def local() -> dict:
        from llmgw.users import token_list

        key = token_create(username=args.username, role=args.role, expires=args.expires)
        return {"token": key, "expires": token_list(username=args.username)[0].expires}

    body = {"username": args.username, "role": args.role}
    if args.expires is not None:
        body["expires"] = args.expires
    data = write(args, "POST", "tokens", body, local)
    print(data["token"])
    return 0


def as_json(rows) -> list[dict]:
    """Rows (dataclasses) as the API answers them: times in ISO form."""
    from dataclasses import asdict

    return [{k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in asdict(row).items()} for row in rows]


def _when(value) -> str:
    if value is None:
        return "-"
    text = value if isinstance(value, str) else value.isoformat()
    return text.replace("T", " ")[:16]


def token_list_command(args) -> int:
    def local() -> list[dict]:
        from llmgw.users import token_list

        return as_json(token_list())

    rows = read(args, "tokens", local)
    if args.output == "json":
        print_json(rows)
        return 0
    print_table(
        ["USER", "ROLE", "KEY", "CREATED", "LAST USED", "EXPIRES"],
        [[r["username"], r["role"], r["prefix"] + "…", _when(r["created"]), _when(r["last_used"]),
          ("expired " if r["expired"] else "") + (_when(r["expires"]) if r["expires"] else "never")] for r in rows],
    )
    return 0


def token_rotate_command(args) -> int:
    def local() -> dict:
        from llmgw.users import token_rotate

        return {"token": token_rotate(username=args.username, expires=args.expires)}

    body = {} if args.expires is None else {"expires": args.expires}
    data = write(args, "POST", f"tokens/{path_part(args.username, 'username')}/rotate", body, local)
    print(data["token"])
    return 0


def token_revoke_command(args) -> int:
    def local() -> None:
        from llmgw.users import token_revoke

        token_revoke(username=args.username)

    write(args, "DELETE", f"tokens/{path_part(args.username, 'username')}", None, local)
    print(f"token of {args.username} revoked")
    return 0


def user_unlock_command(args) -> int:
    def local() -> dict:
        from llmgw.users import user_unlock

        return {"removed": user_unlock(username=args.username)}

    data = write(args, "POST", f"users/{path_part(args.username, 'username')}/unlock", {}, local)
    removed = data["removed"]
    print(f"{args.username} unlocked: their failed logins are forgotten" if removed
          else f"{args.username} had no failed logins recorded")
    return 0


def password_read(args) -> str:
    """The password: one line of standard input (--password-stdin), else asked for twice without echo. Never an
    argument: a command line is seen by every user of the machine (ps)."""
    if args.password_stdin:
        line = sys.stdin.readline(10_000)
        return line.rstrip("\r\n")
    if not sys.stdin.isatty():
        raise InvalidInput("password: standard input is not a terminal; give --password-stdin to read it from there",
                           field="password")
    from getpass import getpass

    password = getpass(f"password for {args.username}: ")
    if getpass("again: ") != password:
        raise InvalidInput("password: the two did not match; nothing was changed", field="password")
    return password


def user_create_command(args) -> int:
    password = password_read(args)

    def local() -> dict:
        from llmgw.users import user_create

        user_create(username=args.username, role=args.role, password=password)
        return {}

    write(args, "POST", "users", {"username": args.username, "role": args.role, "password": password}, local)
    print(f"user {args.username} made ({args.role}): they log in to the console with that password")
    return 0


def user_list_command(args) -> int:
    def local() -> list[dict]:
        from llmgw.users import user_list

        return as_json(user_list())

    rows = read(args, "users", local)
    if args.output == "json":
        print_json(rows)
        return 0
    print_table(
        ["USER", "ROLE", "PASSWORD", "TOKEN", "LAST LOGIN"],
        [[r["username"], r["role"], "yes" if r["has_password"] else "no", "yes" if r["has_token"] else "no",
          _when(r["last_login"])] for r in rows],
    )
    return 0


def user_password_command(args) -> int:
    password = password_read(args)

    def local() -> None:
        from llmgw.users import user_password_set

        user_password_set(username=args.username, password=password)

    write(args, "POST", f"users/{path_part(args.username, 'username')}/password", {"password": password}, local)
    print(f"password of {args.username} set: the old one is refused from now")
    return 0


def user_remove_command(args) -> int:
    def local() -> None:
        from llmgw.users import user_remove

        user_remove(username=args.username)

    write(args, "DELETE", f"users/{path_part(args.username, 'username')}", None, local)
    print(f"user {args.username} removed, with their API token")
    return 0
