-- Exactly-once delivery (OUTBOX_DELIVERY=exactly-once; docs/DESIGN.md, "Exactly-once delivery (opt-in)"): one row per lane, a
-- lane being a Kafka transactional id that one invocation at a time leases. Rows are made on first
-- use (the relay inserts the lanes it may lease), so the table stays empty in the default mode.
-- `in_flight`: the rows of the lane's batch whose Kafka transaction may have committed while their
-- marks did not, written and committed before that transaction's commit; a claim never takes them,
-- and the lane's next holder marks them sent or frees them, as Kafka says.
CREATE TABLE IF NOT EXISTS {{lanes_table}} (
  lane        integer     NOT NULL,
  -- the lane's Kafka transactional id, and its consumer group's: unique to this table wherever
  -- its Kafka cluster is shared (the relay makes it, with a random part, when it makes the lane)
  transactional_id text   NOT NULL,
  -- who leases it (an invocation's own id), until when
  holder      text,
  lease_until timestamptz NOT NULL DEFAULT '-infinity',
  -- the last batch recorded in flight: the lane's Kafka transactions commit it as their offset
  batch_no    bigint      NOT NULL DEFAULT 0,
  in_flight   bigint[],
  CONSTRAINT {{lanes_pkey}} PRIMARY KEY (lane)
);
