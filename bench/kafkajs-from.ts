// `--import ./bench/kafkajs-from.ts` with BENCH_KAFKAJS_DIR=<a kafkajs package directory>: the
// process imports and requires `kafkajs` from there instead of node_modules (bench/kafkajs-patch.ts
// runs the relay on the unpatched copy it makes). kafkajs' own requires are relative, so every
// module of it comes from that copy.
import { registerHooks } from 'node:module';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const dir = process.env.BENCH_KAFKAJS_DIR;
if (!dir) throw new Error('bench/kafkajs-from.ts: set BENCH_KAFKAJS_DIR to the kafkajs directory to load');
const entry = pathToFileURL(join(dir, 'index.js')).href;

registerHooks({
  resolve(specifier, context, nextResolve) {
    return nextResolve(specifier === 'kafkajs' ? entry : specifier, context);
  },
});
