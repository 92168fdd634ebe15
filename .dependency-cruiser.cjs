// The layer rule (docs/development.md#source-layout), checked by `npm run lint` on resolved paths,
// type-only imports included: the two sides implement the loop's ports and never import each other.
/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: 'outbox-not-kafka',
      comment: 'outbox/ and kafka/ import nothing from each other: what both need belongs in domain.ts',
      severity: 'error',
      from: { path: '^src/outbox/' },
      to: { path: '^src/kafka/' },
    },
    {
      name: 'kafka-not-outbox',
      comment: 'outbox/ and kafka/ import nothing from each other: what both need belongs in domain.ts',
      severity: 'error',
      from: { path: '^src/kafka/' },
      to: { path: '^src/outbox/' },
    },
    {
      name: 'loop-neither-side',
      comment: 'the loop (relay.ts, loop/) uses the sides through loop/ports.ts; runtime.ts builds them',
      severity: 'error',
      from: { path: '^src/(loop/|relay\\.ts$)' },
      to: { path: '^src/(outbox|kafka)/' },
    },
    {
      name: 'config-not-loop',
      comment: 'config.ts and config/ import no part of the loop: what both need belongs in domain.ts',
      severity: 'error',
      from: { path: '^src/config(\\.ts$|/)' },
      to: { path: '^src/(loop/|relay\\.ts$)' },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
