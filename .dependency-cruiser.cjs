// The layers (docs/development.md#source-layout), checked by `npm run lint` on resolved paths,
// type-only imports included. From the bottom: the shared vocabulary (src/*.ts), config/, loop/,
// the two sides outbox/ and kafka/ (which implement loop/ports.ts and never import each other),
// lambda/ (the function's edge and the wiring), cli/. A folder imports only from below itself.
const LAYERS = ['config', 'loop', 'outbox|kafka', 'lambda', 'cli'];

const upward = LAYERS.slice(0, -1).map((layer, i) => ({
  name: `${layer.replace('|', '-')}-not-upward`,
  comment: `${layer} imports nothing above it: ${LAYERS.slice(i + 1).join(', ')}`,
  severity: 'error',
  from: { path: `^src/(${layer})/` },
  to: { path: `^src/(${LAYERS.slice(i + 1).join('|')})/` },
}));

/** @type {import('dependency-cruiser').IConfiguration} */
module.exports = {
  forbidden: [
    {
      name: 'no-circular',
      comment: 'no import cycle: a cycle hides which module is the lower one',
      severity: 'error',
      from: { path: '^src/' },
      to: { circular: true },
    },
    {
      name: 'vocabulary-not-upward',
      comment: 'the shared vocabulary (src/*.ts) imports no folder; index.ts, the package entry, may',
      severity: 'error',
      from: { path: '^src/[^/]+\\.ts$', pathNot: '^src/index\\.ts$' },
      to: { path: '^src/[^/]+/' },
    },
    ...upward,
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
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
  },
};
