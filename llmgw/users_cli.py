"""`llmgw ctl token create USERNAME --role viewer|operator`: an API token for a person or a tool."""

from __future__ import annotations

from llmgw.errors import InvalidInput
from llmgw.remote import local_only

# llmgw.permissions.ROLES, named here too: importing it would load Django for every remote command.
ROLES = ("viewer", "operator")


def token_create(*, username: str, role: str) -> str:
    """The user's API token (made, with the user, if missing), after giving them the role."""
    from django.db import transaction

    with transaction.atomic():
        return _token_create(username=username, role=role)


def _token_create(*, username: str, role: str) -> str:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from rest_framework.authtoken.models import Token

    if role not in ROLES:
        raise InvalidInput(f"role: {role!r} is not a role; roles are {', '.join(ROLES)}", field="role")
    if not username or len(username) > 150:
        raise InvalidInput("username: give a name of at most 150 characters", field="username")
    user, _ = get_user_model().objects.get_or_create(username=username)
    for name in ROLES:
        Group.objects.get_or_create(name=name)
    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    user.groups.add(Group.objects.get(name=role))
    token, _ = Token.objects.get_or_create(user=user)
    return token.key


def register(commands) -> None:
    p = commands.add_parser("token", help="API tokens: llmgw ctl token create USERNAME --role operator")
    sub = p.add_subparsers(dest="token_command", metavar="COMMAND", required=True)
    c = sub.add_parser(
        "create",
        help="print an API token for a user (made if missing) with a role",
        description="Send it as 'Authorization: Token <key>'. viewer reads; operator also changes labels, holds, "
        "models and budgets.",
    )
    c.add_argument("username")
    c.add_argument("--role", choices=ROLES, default="viewer")
    c.set_defaults(handler=token_command)


def token_command(args) -> int:
    local_only(args, "token create")
    print(token_create(username=args.username, role=args.role))
    return 0
