# placement_lost_race(): raises SQLSTATE LL001. A batch statement sent strict (placement.commit) calls
# it when it finds a lost race, so that its transaction is aborted and a COMMIT sent behind it without
# waiting rolls back. PostgreSQL only: SQLite places one replica at a time and never sends one.

from django.db import migrations

CREATE = """
CREATE OR REPLACE FUNCTION placement_lost_race() RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    RAISE EXCEPTION 'a placement batch lost a race: it is rolled back and placed again'
        USING ERRCODE = 'LL001';
END
$$
"""
DROP = "DROP FUNCTION IF EXISTS placement_lost_race()"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):

    dependencies = [
        ("placement", "0004_booking_refers_to_its_shard_and_node"),
    ]

    operations = [migrations.RunPython(create, drop)]
