import django.db.models.deletion
from django.db import migrations, models

# A GPU booking's shard and node as one key to the shard's (id, node): one check a booking at commit
# where the two keys Django makes were two, and the booking's node held to its shard's. PostgreSQL only:
# SQLite cannot add a constraint to a table, and its writers are one at a time anyway.
ADD = (
    'ALTER TABLE "placement_gpubooking" ADD CONSTRAINT "booking_shard_node" FOREIGN KEY ("shard_id", "node_id") '
    'REFERENCES "placement_shard" ("id", "node_id") DEFERRABLE INITIALLY DEFERRED'
)
DROP = 'ALTER TABLE "placement_gpubooking" DROP CONSTRAINT IF EXISTS "booking_shard_node"'


def add_pair_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(ADD)


def drop_pair_key(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(DROP)


class Migration(migrations.Migration):

    dependencies = [
        ('agents', '0001_initial'),
        ('placement', '0003_replica_one_replacement_again'),
    ]

    operations = [
        migrations.AlterField(
            model_name='gpubooking',
            name='node',
            field=models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='agents.node'),
        ),
        migrations.AlterField(
            model_name='gpubooking',
            name='shard',
            field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='gpu_bookings', to='placement.shard'),
        ),
        migrations.AddConstraint(
            model_name='shard',
            constraint=models.UniqueConstraint(fields=('id', 'node'), name='shard_id_node'),
        ),
        migrations.RunPython(add_pair_key, drop_pair_key),
    ]
