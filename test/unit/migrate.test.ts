// render() for a partitioned table (src/outbox/migrate.ts, docs/schema.md "Partitioned outboxes"):
// the migrations as written, but for the one statement a partitioned table refuses.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { parseTableName } from '../../src/outbox/identifier.ts';
import { loadMigrations, loadPartitionedSql, render } from '../../src/outbox/migrate.ts';

const table = parseTableName('app.events');

describe('render() for partitioned tables', () => {
  it('a plain table is rendered exactly as before: no shape and a shape of plain tables give the same text', () => {
    for (const m of loadMigrations()) {
      assert.equal(render(m.sql, table, { outboxPartitioned: false, sentPartitioned: false }), render(m.sql, table), m.name);
    }
  });

  it('the only statements that differ are the ALTER TABLE ... SET of each partitioned table, set on each of its partitions instead', () => {
    const baseline = loadMigrations()[0]!.sql;
    const plain = render(baseline, table);
    const storage = /^ALTER TABLE (\S+) SET \(([^;]*)\);$/gm;
    const onPartitions = /^DO \$storage\$[\s\S]*?^\$storage\$;$/gm;
    for (const [shape, rewritten] of [
      [{ outboxPartitioned: true }, ['"app"."events"']],
      [{ sentPartitioned: true }, ['"app"."events_sent"']],
      [{ outboxPartitioned: true, sentPartitioned: true }, ['"app"."events"', '"app"."events_sent"']],
    ] as const) {
      const parted = render(baseline, table, shape);
      // each rewritten statement cut out of both texts at the same place leaves the same text
      const kept = [...plain.matchAll(storage)].filter((m) => !rewritten.includes(m[1] as never));
      let cutPlain = plain;
      for (const m of [...plain.matchAll(storage)]) if (rewritten.includes(m[1] as never)) cutPlain = cutPlain.replace(m[0], '<storage>');
      const blocks = [...parted.matchAll(onPartitions)].map((m) => m[0]);
      assert.equal(blocks.length, rewritten.length, JSON.stringify(shape));
      let cutParted = parted;
      for (const b of blocks) cutParted = cutParted.replace(b, '<storage>');
      assert.equal(cutParted, cutPlain, JSON.stringify(shape));
      assert.equal(kept.length, 2 - rewritten.length);
      // the same options, on every leaf of that table's partition tree
      [...plain.matchAll(storage)].filter((m) => rewritten.includes(m[1] as never)).forEach((m, i) => {
        const options = m[2]!.trim().replace(/\s+/g, ' ');
        assert.ok(blocks[i]!.includes(`ALTER TABLE %s SET (${options})`), blocks[i]);
        assert.ok(blocks[i]!.includes(`pg_partition_tree('${m[1]}'::regclass) WHERE isleaf`), blocks[i]);
      });
    }
  });

  it('partitioned.sql renders with the width and the maintenance function in the table\'s schema', () => {
    const text = render(loadPartitionedSql(), table, { partitionWidthS: 86_400 });
    assert.match(text, /width\s+constant double precision := 86400;/);
    assert.match(text, /CREATE OR REPLACE FUNCTION "app"\."events_partitions"\(retain_sent_ms bigint\)/);
    assert.match(text, /REVOKE EXECUTE ON FUNCTION "app"\."events_partitions"\(bigint\) FROM PUBLIC/);
    assert.match(text, /PARTITION BY RANGE \(created_at\)/);
    assert.match(text, /PARTITION BY RANGE \(sent_at\)/);
    assert.throws(() => render(loadPartitionedSql(), table), /unknown migration placeholder \{\{partition_width_s\}\}/, 'no width, no function');
  });
});
