-- The rehearsal's independent auditor: plain SQL over the tables, written apart from llmgw's code.
--
-- It shares nothing with placement/commit.py or facility/power.py: the use of a domain is summed here
-- from the shards themselves (not from NodeBooking, which it checks), with the rule written out:
--   use = other_watts + Σ over member nodes (node_watts + max(Σ shard draws, fresh measured peak))
--   limit = cap_watts × (1 − margin)
--
-- Two parts. SETUP (before the rehearsal starts): a log table and a deferred trigger that, at the
-- commit of every transaction that wrote a shard, logs each budgeted domain of the shard's node with
-- its use and limit as that transaction leaves them. CHECKS (after): one SELECT, one row per violation.
-- audit_settings holds the figures the rehearsal ran with (the margin and node watts are read from
-- the facility settings row; fresh_seconds is the measured-draw freshness it configured).

-- @@ SETUP
CREATE TABLE IF NOT EXISTS audit_settings (fresh_seconds double precision NOT NULL);
CREATE TABLE IF NOT EXISTS audit_commit (
    id bigserial PRIMARY KEY,
    txid bigint NOT NULL,
    at timestamptz NOT NULL,
    domain text NOT NULL,
    use_watts double precision NOT NULL,
    limit_watts double precision NOT NULL
);

CREATE OR REPLACE FUNCTION audit_shard_commit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    margin double precision;
    node_watts double precision;
    fresh double precision;
BEGIN
    SELECT COALESCE(fs.margin, 0), COALESCE(fs.node_watts, 0) INTO margin, node_watts
        FROM facility_facilitysettings fs LIMIT 1;
    margin := COALESCE(margin, 0);
    node_watts := COALESCE(node_watts, 0);
    SELECT s.fresh_seconds INTO fresh FROM audit_settings s LIMIT 1;
    INSERT INTO audit_commit (txid, at, domain, use_watts, limit_watts)
    SELECT txid_current(), clock_timestamp(), b.domain,
        b.other_watts + COALESCE((
            SELECT SUM(node_watts + GREATEST(
                COALESCE((SELECT SUM(COALESCE(sh.draw_watts, 0)) FROM placement_shard sh WHERE sh.node_id = n.id), 0),
                CASE WHEN n.sensors_at >= clock_timestamp() - make_interval(secs => COALESCE(fresh, 0))
                     THEN COALESCE(n.measured_peak_watts, 0) ELSE 0 END))
            FROM agents_nodedomain m JOIN agents_node n ON n.id = m.node_id
            WHERE m.domain = b.domain), 0),
        b.cap_watts * (1 - margin)
    FROM agents_nodedomain d JOIN facility_budget b ON b.domain = d.domain
    WHERE d.node_id = NEW.node_id;
    RETURN NULL;
END $$;

DROP TRIGGER IF EXISTS audit_shard_commit ON placement_shard;
CREATE CONSTRAINT TRIGGER audit_shard_commit AFTER INSERT ON placement_shard
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION audit_shard_commit();

-- @@ CHECKS
-- 1. No GPU booked twice: by the shards' own card lists, and by the booking rows.
SELECT 'gpu booked twice' AS violation,
       format('node %s card %s: %s shards', s.node_id, card, COUNT(*)) AS detail
FROM placement_shard s, jsonb_array_elements_text(s.gpu_indices) AS card
GROUP BY s.node_id, card HAVING COUNT(*) > 1
UNION ALL
SELECT 'gpu booked twice', format('node %s card %s: %s booking rows', node_id, index, COUNT(*))
FROM placement_gpubooking GROUP BY node_id, index HAVING COUNT(*) > 1
UNION ALL
SELECT 'card without booking', format('shard %s node %s card %s', s.id, s.node_id, card)
FROM placement_shard s, jsonb_array_elements_text(s.gpu_indices) AS card
WHERE NOT EXISTS (SELECT 1 FROM placement_gpubooking g
                  WHERE g.shard_id = s.id AND g.node_id = s.node_id AND g.index = card::int)
UNION ALL
-- 2. No domain past its limit at any commit that placed into it.
SELECT 'domain past its limit at a commit',
       format('%s: %s W > limit %s W (transaction %s at %s)', domain, round(use_watts::numeric, 1),
              round(limit_watts::numeric, 1), txid, at)
FROM audit_commit WHERE use_watts > limit_watts + 1e-6
UNION ALL
-- 3. Reserved figures equal the sums of the shards (watts, cores, memory).
SELECT 'reserved watts differ from the shards',
       format('node %s: booked %s W, %s cores, %s GiB; shards %s W, %s cores, %s GiB', n.id,
              COALESCE(b.placed_watts, 0), COALESCE(b.cpu_cores, 0), COALESCE(b.memory_gib, 0),
              COALESCE(s.watts, 0), COALESCE(s.cores, 0), COALESCE(s.mem, 0))
FROM agents_node n
LEFT JOIN placement_nodebooking b ON b.node_id = n.id
LEFT JOIN (SELECT node_id, SUM(COALESCE(draw_watts, 0)) AS watts, SUM(cpu_cores) AS cores,
                  SUM(memory_gib) AS mem FROM placement_shard GROUP BY node_id) s ON s.node_id = n.id
WHERE abs(COALESCE(b.placed_watts, 0) - COALESCE(s.watts, 0)) > 1e-6
   OR COALESCE(b.cpu_cores, 0) <> COALESCE(s.cores, 0)
   OR abs(COALESCE(b.memory_gib, 0) - COALESCE(s.mem, 0)) > 1e-6
UNION ALL
-- 4. A replica's shards on distinct nodes, and within one domain of its model's keep_within level.
SELECT 'two shards of a replica on one node', format('replica %s node %s', replica_id, node_id)
FROM placement_shard GROUP BY replica_id, node_id HAVING COUNT(*) > 1
UNION ALL
SELECT 'replica spans its keep_within domain',
       format('replica %s of %s: %s in %s', s.replica_id, m.name, m.keep_within,
              string_agg(DISTINCT COALESCE(n.labels ->> ('llmgw.io/' || m.keep_within), '(none)'), ', '))
FROM placement_shard s JOIN placement_replica r ON r.id = s.replica_id
JOIN placement_model m ON m.id = r.model_id JOIN agents_node n ON n.id = s.node_id
WHERE m.keep_within <> ''
GROUP BY s.replica_id, m.name, m.keep_within
HAVING COUNT(DISTINCT COALESCE(n.labels ->> ('llmgw.io/' || m.keep_within), '(none)')) > 1
    OR bool_or(n.labels ->> ('llmgw.io/' || m.keep_within) IS NULL);
