// Whether the test hooks exist (OUTBOX_TEST_PAUSE_AFTER_PUBLISH_MS, the crash window of G2, and
// the constants tests shorten: src/config/settings.ts lists them). A build-time constant: every
// build of scripts/build.mjs (the Lambda zip, dist/) defines
// __OUTBOX_TEST_HOOKS__ as false, so the hooks' code is dead there and esbuild drops it, and no
// setting of a deployed function can turn one on. The sources, run through tsx (the tests, `npm
// run relay`), do not define it: hooks on. Guard each hook's code with `if (TEST_HOOKS …) { … }` or
// `TEST_HOOKS ? … : …`, which esbuild drops (not an early `if (!TEST_HOOKS) return;`, which it
// keeps), and log its work as `test hook: …`: the build fails if either is left in the bundle.
declare const __OUTBOX_TEST_HOOKS__: boolean | undefined;

export const TEST_HOOKS: boolean = typeof __OUTBOX_TEST_HOOKS__ === 'undefined' || __OUTBOX_TEST_HOOKS__;
