# The partial unique index replica_one_replacement (one replacement at a time for a replica being
# drained) was made by 0001 and then dropped on PostgreSQL by 0002: taking replaces' plain index away
# (db_index=False), the schema editor drops every non-unique-constraint index on that column, and the
# partial unique one is an index. The state never lost it, so this puts back only the index. On SQLite
# 0002 remade the table with it, and IF NOT EXISTS leaves it as it is.

from django.db import migrations

CREATE = (
    'CREATE UNIQUE INDEX IF NOT EXISTS "replica_one_replacement" ON "placement_replica" ("replaces_id") '
    'WHERE "replaces_id" IS NOT NULL'
)


class Migration(migrations.Migration):

    dependencies = [
        ("placement", "0002_drop_indexes_the_unique_constraints_lead_with"),
    ]

    operations = [migrations.RunSQL(CREATE, reverse_sql=migrations.RunSQL.noop)]
