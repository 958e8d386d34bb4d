# A GPU booking's (shard, node) held to its shard's (id, node) once a statement instead of once a row.
#
# The foreign key of 0004 checked each booking at commit, one lookup and one row lock apiece, and a
# batch of placements books a card a row (its cost: bench/RESULTS.md). The same rule as statement
# triggers over the statement's rows, set-wise:
#
# - bookings inserted or updated: their shards locked KEY SHARE, as the key's check locks them (a shard
#   being deleted meanwhile is waited for, and then not found), and every booking must find its shard,
#   as locked, with its node;
# - shards deleted (or the table truncated): no booking may still name one (bookings go first, as the
#   key's NO ACTION asked);
# - a shard's id or node changed while bookings name it: refused (row trigger, only when they change);
#   the row is locked as a key's update, so a booking being written is waited for, then seen.
#
# Checked at the end of each statement rather than at commit: every writer puts a booking in the
# statement that makes its shard (placement.commit.writes) and deletes bookings before their shards
# (placement.services, Django's cascade). The error is the key's: SQLSTATE 23503 with the constraint's
# name, so an IntegrityError as before. A shard is deleted or moved under READ COMMITTED only (the
# project's level): the check reads the bookings committed by then, where a snapshot kept for the
# transaction would miss one committed since, and the key's check looked past it. The checks' plans
# take no sequential scan: kept from a statement on a near-empty table, one would read the whole table
# for each row later. PostgreSQL only, as 0004 was.

from django.db import migrations

BOOKINGS, SHARDS = "placement_gpubooking", "placement_shard"

VIOLATION = (
    "USING ERRCODE = 'foreign_key_violation', CONSTRAINT = 'booking_shard_node', "
    f"TABLE = '{BOOKINGS}'"
)
# The key's own words when a shard still named by bookings would go or move.
STILL_NAMED = (
    f'RAISE EXCEPTION \'update or delete on table "{SHARDS}" violates foreign key constraint "booking_shard_node" '
    f'on table "{BOOKINGS}"\'\n            {VIOLATION},\n'
    f"            DETAIL = format('Key (%s)=(%s) is still referenced from table \"{BOOKINGS}\".', {{columns}}, {{values}});"
)


def _still_named(columns: str, values: str) -> str:
    """STILL_NAMED for the key's ``columns`` (their names, as the message shows them) and ``values``."""
    return STILL_NAMED.format(columns=f"'{columns}'", values=values)


CREATE = [
    f'ALTER TABLE "{BOOKINGS}" DROP CONSTRAINT IF EXISTS "booking_shard_node"',
    f"""
CREATE OR REPLACE FUNCTION placement_bookings_name_their_shards() RETURNS trigger LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    orphan record;
BEGIN
    -- The named shards found through their key (an array, so an index scan whatever the statement's
    -- size) and locked once each; the bookings looked up in them as a hashed set (a join here would keep
    -- the plan made for one statement's size, and grow with the square of a large one's).
    WITH held AS MATERIALIZED (SELECT s.id, s.node_id FROM {SHARDS} s
                               WHERE s.id = ANY(ARRAY(SELECT shard_id FROM new_rows)) ORDER BY s.id FOR KEY SHARE OF s)
    SELECT b.shard_id, b.node_id INTO orphan FROM new_rows b
        WHERE (b.shard_id, b.node_id) NOT IN (SELECT id, node_id FROM held) LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'insert or update on table "{BOOKINGS}" violates foreign key constraint "booking_shard_node"'
            {VIOLATION},
            DETAIL = format('Key (shard_id, node_id)=(%s, %s) is not present in table "{SHARDS}".',
                            orphan.shard_id, orphan.node_id);
    END IF;
    RETURN NULL;
END $$
""",
    f"""
CREATE OR REPLACE FUNCTION placement_shards_read_committed() RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    -- A shard's deletion or move reads its bookings as committed now: under a snapshot kept for the
    -- transaction, a booking committed since would not be seen (the key's check read past it).
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'shards are deleted or moved under READ COMMITTED only (now: %)',
            current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported', TABLE = '{SHARDS}';
    END IF;
END $$
""",
    f"""
CREATE OR REPLACE FUNCTION placement_shards_gone_unbooked() RETURNS trigger LANGUAGE plpgsql SET enable_seqscan = off AS $$
DECLARE
    named bigint;
BEGIN
    PERFORM placement_shards_read_committed();
    -- An index probe a deleted shard.
    SELECT o.id INTO named FROM old_rows o
        WHERE (SELECT b.shard_id FROM {BOOKINGS} b WHERE b.shard_id = o.id LIMIT 1) IS NOT NULL LIMIT 1;
    IF FOUND THEN
        {_still_named("id", "named")}
    END IF;
    RETURN NULL;
END $$
""",
    f"""
CREATE OR REPLACE FUNCTION placement_shard_key_kept() RETURNS trigger LANGUAGE plpgsql SET enable_seqscan = off AS $$
BEGIN
    PERFORM placement_shards_read_committed();
    -- Locked as a key's update is, whatever the indexes make of this update: a booking being written
    -- holds the row KEY SHARE, and is waited for, then seen.
    PERFORM 1 FROM {SHARDS} s WHERE s.id = OLD.id FOR UPDATE;
    IF EXISTS (SELECT 1 FROM {BOOKINGS} b WHERE b.shard_id = OLD.id AND b.node_id = OLD.node_id) THEN
        {_still_named("id, node_id", "concat_ws(', ', OLD.id, OLD.node_id)")}
    END IF;
    RETURN NEW;
END $$
""",
    f"""
CREATE OR REPLACE FUNCTION placement_shards_truncated_unbooked() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- After the truncation, so a TRUNCATE of both tables (Django's flush) passes.
    IF EXISTS (SELECT 1 FROM {BOOKINGS}) THEN
        RAISE EXCEPTION 'cannot truncate table "{SHARDS}" while table "{BOOKINGS}" names its rows'
            {VIOLATION};
    END IF;
    RETURN NULL;
END $$
""",
    f"""
CREATE TRIGGER booking_shard_node_insert AFTER INSERT ON {BOOKINGS} REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION placement_bookings_name_their_shards()
""",
    # On any update of bookings (none is made: a transition table takes no column list), as on an insert.
    f"""
CREATE TRIGGER booking_shard_node_update AFTER UPDATE ON {BOOKINGS} REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION placement_bookings_name_their_shards()
""",
    f"""
CREATE TRIGGER booking_shard_node_delete AFTER DELETE ON {SHARDS} REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION placement_shards_gone_unbooked()
""",
    f"""
CREATE TRIGGER booking_shard_node_truncate AFTER TRUNCATE ON {SHARDS}
    FOR EACH STATEMENT EXECUTE FUNCTION placement_shards_truncated_unbooked()
""",
    f"""
CREATE TRIGGER booking_shard_node_key BEFORE UPDATE OF id, node_id ON {SHARDS} FOR EACH ROW
    WHEN (OLD.id IS DISTINCT FROM NEW.id OR OLD.node_id IS DISTINCT FROM NEW.node_id)
    EXECUTE FUNCTION placement_shard_key_kept()
""",
]

DROP = [
    f"DROP TRIGGER IF EXISTS booking_shard_node_key ON {SHARDS}",
    f"DROP TRIGGER IF EXISTS booking_shard_node_truncate ON {SHARDS}",
    f"DROP TRIGGER IF EXISTS booking_shard_node_delete ON {SHARDS}",
    f"DROP TRIGGER IF EXISTS booking_shard_node_update ON {BOOKINGS}",
    f"DROP TRIGGER IF EXISTS booking_shard_node_insert ON {BOOKINGS}",
    "DROP FUNCTION IF EXISTS placement_shard_key_kept()",
    "DROP FUNCTION IF EXISTS placement_shards_truncated_unbooked()",
    "DROP FUNCTION IF EXISTS placement_shards_gone_unbooked()",
    "DROP FUNCTION IF EXISTS placement_shards_read_committed()",
    "DROP FUNCTION IF EXISTS placement_bookings_name_their_shards()",
    f'ALTER TABLE "{BOOKINGS}" ADD CONSTRAINT "booking_shard_node" FOREIGN KEY ("shard_id", "node_id") '
    f'REFERENCES "{SHARDS}" ("id", "node_id") DEFERRABLE INITIALLY DEFERRED',
]


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in CREATE:
            schema_editor.execute(statement, None)  # no parameters: its % are the functions' own


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for statement in DROP:
            schema_editor.execute(statement, None)


class Migration(migrations.Migration):

    dependencies = [
        ("placement", "0006_model_topology"),
    ]

    operations = [
        migrations.RunPython(create, drop),
        # It was there for the key to refer to; the triggers find a shard by its id.
        migrations.RemoveConstraint(model_name="shard", name="shard_id_node"),
    ]
