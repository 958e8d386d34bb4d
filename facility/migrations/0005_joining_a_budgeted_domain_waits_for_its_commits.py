# A node joining a budgeted domain waits for the placements committing into it.
#
# A guarded commit locks the budgets of the domains it touches, then every member of them, then sums the
# members' draws (placement.commit.locks). A node outside those domains (in another rack) that joined one
# of them (a relabel to the rack's PDU) after that read and before the commit was in neither the sum nor
# the locks: both committed, and the PDU could go past its cap by the node's draw. Writing a node's
# membership of a domain now takes a share lock on the domain's budget, which a commit holding it for
# update makes wait: the node joins after the commit (whose sum it then adds to, as any node's use does,
# and which the next commit counts) or before the commit's lock (and is locked and counted by it).
#
# Share, not update: nodes joining the same domain do not wait for each other. The services that relabel
# lock the budgets a node joins before its row (agents.services, the signal domains_joining), in the
# commit's order (budgets, then nodes); this trigger holds for every writer, those included.
#
# A domain with no budget yet has no row to lock: a budget made for it while a node joined (neither
# committed) would be locked by a commit that did not see the node, and sum without it. So joining also
# takes the domain's advisory lock, shared, and making a budget takes it exclusive: the budget waits
# for the nodes joining, and a commit that locks it then counts them. (Two-key advisory locks, their
# own space: the reconcile's single-key lock is apart; the domain's hash may collide with another's,
# which only makes one wait for the other.)
# PostgreSQL only (SQLite serialises its writers).

from django.db import migrations

# The first key of the domains' advisory locks (two-key form): "llmg".
DOMAIN_LOCKS = 0x6C6C6D67

CREATE = [
    f"""
CREATE OR REPLACE FUNCTION facility_domains_joined_wait_for_budgets() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Sorted, as a commit locks budgets: two writers never wait on each other in a circle here.
    PERFORM pg_advisory_xact_lock_shared({DOMAIN_LOCKS}, hashtext(d))
        FROM (SELECT DISTINCT domain AS d FROM new_rows ORDER BY 1) joined;
    PERFORM 1 FROM facility_budget
        WHERE domain = ANY(ARRAY(SELECT DISTINCT domain FROM new_rows)) ORDER BY domain FOR SHARE;
    RETURN NULL;
END $$
""",
    f"""
CREATE OR REPLACE FUNCTION facility_budget_made_waits_for_joins() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock({DOMAIN_LOCKS}, hashtext(NEW.domain));
    RETURN NEW;
END $$
""",
    """
CREATE TRIGGER facility_budget_made BEFORE INSERT ON facility_budget
    FOR EACH ROW EXECUTE FUNCTION facility_budget_made_waits_for_joins()
""",
    """
CREATE TRIGGER facility_domains_joined_insert AFTER INSERT ON agents_nodedomain
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION facility_domains_joined_wait_for_budgets()
""",
    """
CREATE TRIGGER facility_domains_joined_update AFTER UPDATE ON agents_nodedomain
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT
    EXECUTE FUNCTION facility_domains_joined_wait_for_budgets()
""",
]

DROP = [
    "DROP TRIGGER IF EXISTS facility_budget_made ON facility_budget",
    "DROP FUNCTION IF EXISTS facility_budget_made_waits_for_joins()",
    "DROP TRIGGER IF EXISTS facility_domains_joined_update ON agents_nodedomain",
    "DROP TRIGGER IF EXISTS facility_domains_joined_insert ON agents_nodedomain",
    "DROP FUNCTION IF EXISTS facility_domains_joined_wait_for_budgets()",
]


def _run(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor != "postgresql":
            return
        for sql in statements:
            schema_editor.execute(sql)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("facility", "0004_domainsample_inlet_celsius"),
        ("agents", "0003_node_gpu_topology"),
    ]

    operations = [migrations.RunPython(_run(CREATE), _run(DROP))]
