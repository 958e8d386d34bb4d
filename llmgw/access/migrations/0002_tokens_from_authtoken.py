"""The API tokens made before tokens expired (DRF's authtoken table) become ApiTokens, kept as hashes, with the
default lifetime from now; the old table's keys are then removed, so no key is read from two places."""

import hashlib
from datetime import timedelta

from django.db import migrations
from django.utils import timezone

# What LLMGW_TOKEN_LIFETIME defaults to: a token made before lifetimes existed expires 90 days after the upgrade.
CARRIED_LIFETIME = timedelta(days=90)


def carry(apps, schema_editor):
    Token = apps.get_model("authtoken", "Token")
    ApiToken = apps.get_model("access", "ApiToken")
    now = timezone.now()
    for token in Token.objects.all().iterator():
        ApiToken.objects.update_or_create(
            user_id=token.user_id,
            defaults={"key_hash": hashlib.sha256(token.key.encode()).hexdigest(), "prefix": token.key[:8],
                      "created": token.created, "expires": now + CARRIED_LIFETIME},
        )
    Token.objects.all().delete()


class Migration(migrations.Migration):
    dependencies = [
        ("access", "0001_api_tokens"),
        ("authtoken", "0004_alter_tokenproxy_options"),
    ]

    operations = [migrations.RunPython(carry, migrations.RunPython.noop)]
