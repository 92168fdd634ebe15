WITH blocked AS MATERIALIZED (
  SELECT aggregateid, min(seq) AS first_blocked
  FROM "outbox"
  WHERE sent_at IS NULL AND skipped_at IS NULL AND attempts > 0
    AND (parked_at IS NOT NULL OR next_attempt_at > now())
  GROUP BY aggregateid
),
held AS MATERIALIZED (SELECT aggregateid, min(seq) AS first_held FROM "outbox"
  WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL
    AND coalesce(nullif(topic, ''), replace(replace($7::text, '{aggregatetype}', aggregatetype), '{type}', type)) = ANY ($8::text[])
  GROUP BY aggregateid),
cand AS MATERIALIZED (SELECT r.seq, r.id, r.aggregatetype, r.aggregateid, r.type, r.payload, r.payload_bytes, r.topic, r.headers, r.attempts
  FROM "outbox" r
  WHERE r.sent_at IS NULL AND r.skipped_at IS NULL AND r.parked_at IS NULL AND NOT r.waiting
    AND (r.aggregateid NOT IN (SELECT aggregateid FROM blocked) OR r.seq < (SELECT b.first_blocked FROM blocked b WHERE b.aggregateid = r.aggregateid))
    AND NOT EXISTS (SELECT 1 FROM held h WHERE h.aggregateid = r.aggregateid AND h.first_held <= r.seq)
    AND r.aggregateid <> ALL ($6::text[])
    AND r.next_attempt_at <= now()
    AND CASE WHEN r.next_attempt_at <= now() THEN pg_try_advisory_xact_lock(hashtextextended(r.aggregateid, hashtext($2))) ELSE false END
  ORDER BY r.seq, r.next_attempt_at
  LIMIT $1
  FOR UPDATE OF r SKIP LOCKED),
cut AS MATERIALIZED (SELECT coalesce(max(seq) FILTER (WHERE running <= $4::bigint), min(seq)) AS last_seq
  FROM (SELECT seq, sum(coalesce(payload_bytes, 0)) OVER (ORDER BY seq ROWS UNBOUNDED PRECEDING) AS running FROM cand) s),
taken AS NOT MATERIALIZED (SELECT * FROM cand WHERE seq <= (SELECT last_seq FROM cut)),
aggs AS (SELECT aggregateid, max(seq) AS max_seq, array_agg(seq) AS seqs FROM taken GROUP BY aggregateid),
quick AS MATERIALIZED (SELECT (SELECT true FROM "outbox" o
    WHERE o.sent_at IS NULL AND o.skipped_at IS NULL AND o.parked_at IS NULL AND NOT o.waiting
      AND o.seq < (SELECT max(seq) FROM taken) AND o.seq NOT IN (SELECT seq FROM taken) AND o.seq NOT IN (SELECT unnest($3::bigint[]))
      AND (o.next_attempt_at <= now() OR o.attempts = 0)
    ORDER BY o.seq, o.next_attempt_at LIMIT 1) IS NOT NULL OR CASE WHEN (SELECT true FROM "outbox" w WHERE w.waiting AND w.sent_at IS NULL AND w.skipped_at IS NULL ORDER BY w.aggregateid, w.seq LIMIT 1)
    THEN EXISTS (SELECT 1 FROM aggs a CROSS JOIN LATERAL (SELECT 1 FROM "outbox" w
      WHERE w.aggregateid = a.aggregateid AND w.waiting AND w.sent_at IS NULL AND w.skipped_at IS NULL AND w.seq < a.max_seq LIMIT 1) probe)
    ELSE false END AS maybe),
gap AS MATERIALIZED (SELECT aggregateid, first_gap FROM (
    SELECT a.aggregateid, (SELECT o.seq FROM "outbox" o
      WHERE o.aggregateid = a.aggregateid AND o.sent_at IS NULL AND o.skipped_at IS NULL AND o.seq < a.max_seq
        AND o.seq <> ALL (a.seqs)
      ORDER BY o.seq LIMIT 1) AS first_gap
    FROM aggs a WHERE (SELECT maybe FROM quick) OFFSET 0) probed
  WHERE first_gap IS NOT NULL)
SELECT c.seq, c.id, c.aggregatetype, c.aggregateid, c.type, CASE WHEN c.payload_bytes <= $5 THEN c.payload::text END AS payload, c.payload_bytes,
  c.topic, c.headers, c.attempts, g.first_gap, (g.first_gap IS NULL OR c.seq < g.first_gap) AS publishable
FROM taken c LEFT JOIN gap g ON g.aggregateid = c.aggregateid
