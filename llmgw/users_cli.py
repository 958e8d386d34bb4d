"""`llmgw ctl token create USERNAME --role viewer|operator`: an API token for a person or a tool."""

from __future__ import annotations

from llmgw.remote import write

# llmgw.permissions.ROLES, named here too: importing it would load Django for every remote command.
ROLES = ("viewer", "operator")


def token_create(*, username: str, role: str) -> str:
    """llmgw.users.token_create, named here too for the scripts that import it from this module (bench/)."""
    from llmgw.users import token_create as create

    return create(username=username, role=role)


def register(commands) -> None:
    p = commands.add_parser("token", help="API tokens: llmgw ctl token create USERNAME --role operator")
    sub = p.add_subparsers(dest="token_command", metavar="COMMAND", required=True)
    c = sub.add_parser(
        "create",
        help="print an API token for a user (made if missing) with a role",
        description="Send it as 'Authorization: Token <key>'. viewer reads; operator also changes labels, holds, "
        "models and budgets. In remote mode only an admin's token (a staff user) may make one.",
    )
    c.add_argument("username")
    c.add_argument("--role", choices=ROLES, default="viewer")
    c.set_defaults(handler=token_command)


def token_command(args) -> int:
    def local() -> dict:
        return {"username": args.username, "role": args.role,
                "token": token_create(username=args.username, role=args.role)}

    data = write(args, "POST", "tokens", {"username": args.username, "role": args.role}, local)
    print(data["token"])
    return 0
