// What a Lambda container keeps between invocations: the configuration, its logger and metrics,
// and the runtime (the database client, the producer). The one module-level state of the
// function's edge. Built on first use, not at import, so a configuration error fails the
// invocation with its message; built again after closeRuntime (the CLI, tests).
import { loadConfig } from '../config/load.ts';
import type { Config } from '../config/types.ts';
import { createLogger, type RelayLogger } from '../log.ts';
import { createMetrics, type RelayMetrics } from './metrics.ts';
import { Runtime } from './runtime.ts';

export interface Container {
  readonly config: Config;
  readonly logger: RelayLogger;
  readonly metrics: RelayMetrics;
  readonly runtime: Runtime;
}

let container: Container | undefined;

/** `kafka: false`: a CLI command that uses only the database (loadConfig). */
export function getContainer(options: { kafka?: boolean } = {}): Container {
  if (!container) {
    const config = loadConfig(process.env, options);
    const t = config.telemetry;
    const logger = createLogger(config.logLevel, { stage: t.stage }, undefined, { serviceName: t.serviceName });
    container = { config, logger, metrics: createMetrics(t, logger.powertools), runtime: new Runtime(config, logger) };
  }
  return container;
}

export function getRuntime(options: { kafka?: boolean } = {}): Runtime {
  return getContainer(options).runtime;
}

/** For the CLI and tests: close connections so the process can exit. */
export async function closeRuntime(): Promise<void> {
  const closing = container;
  container = undefined;
  await closing?.runtime.close();
}
