WITH blocked AS MATERIALIZED (
  SELECT aggregateid, min(seq) AS first_blocked
  FROM "outbox"
  WHERE sent_at IS NULL AND skipped_at IS NULL AND attempts > 0
    AND (parked_at IS NOT NULL OR next_attempt_at > now())
  GROUP BY aggregateid
),
cand AS MATERIALIZED (SELECT tableoid AS rel, ctid AS tid, seq, id, aggregatetype, aggregateid, type, payload, payload_bytes, headers_bytes, topic, headers, attempts FROM "outbox" r
  WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND NOT waiting
    AND (aggregateid NOT IN (SELECT aggregateid FROM blocked) OR seq < (SELECT b.first_blocked FROM blocked b WHERE b.aggregateid = r.aggregateid))
    AND next_attempt_at <= now()
    AND CASE WHEN next_attempt_at <= now() THEN pg_try_advisory_xact_lock(hashtextextended(aggregateid, hashtext($2))) END
  ORDER BY seq, next_attempt_at
  LIMIT $1
  FOR UPDATE OF r SKIP LOCKED),
cut AS MATERIALIZED (SELECT coalesce(max(seq) FILTER (WHERE running <= $4::bigint), min(seq)) AS last_seq
  FROM (SELECT seq, sum(coalesce(payload_bytes, 0) + coalesce(headers_bytes, 0)) OVER (ORDER BY seq) AS running FROM cand) s),
taken AS NOT MATERIALIZED (SELECT * FROM cand WHERE seq <= (SELECT last_seq FROM cut)),
aggs AS (SELECT aggregateid, max(seq) AS max_seq, array_agg(seq) AS seqs FROM taken GROUP BY aggregateid),
gap AS MATERIALIZED (SELECT a.aggregateid, (SELECT seq FROM "outbox"
      WHERE aggregateid = a.aggregateid AND sent_at IS NULL AND skipped_at IS NULL AND seq < a.max_seq
        AND seq <> ALL (a.seqs)
      ORDER BY seq LIMIT 1) AS first_gap
    FROM aggs a WHERE (SELECT true FROM "outbox" WHERE sent_at IS NULL AND skipped_at IS NULL AND parked_at IS NULL AND NOT waiting
      AND seq < (SELECT max(seq) FROM taken) AND seq NOT IN (SELECT seq FROM taken) AND seq NOT IN (SELECT unnest($3::bigint[]))
      AND (next_attempt_at <= now() OR attempts = 0)
    ORDER BY seq, next_attempt_at LIMIT 1) IS NOT NULL OR CASE WHEN (SELECT true FROM "outbox" WHERE waiting AND sent_at IS NULL AND skipped_at IS NULL ORDER BY aggregateid, seq LIMIT 1)
    THEN EXISTS (SELECT FROM aggs a, LATERAL (SELECT FROM "outbox"
      WHERE aggregateid = a.aggregateid AND waiting AND sent_at IS NULL AND skipped_at IS NULL AND seq < a.max_seq LIMIT 1) w) END)
SELECT seq, id, aggregatetype, aggregateid, type, CASE WHEN payload_bytes <= $5 THEN payload::text END AS payload, payload_bytes,
  topic, headers, attempts, rel, tid, first_gap, (first_gap IS NULL OR seq < first_gap) AS publishable
FROM taken LEFT JOIN gap USING (aggregateid)
