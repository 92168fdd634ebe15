// Secrets Manager: fetched once per container and cached (a warm invocation makes no call),
// fetched again only when the credentials were refused (rotation). Values are never logged and
// never appear in error messages: errors name the secret id and what is wrong with its shape.
import { GetSecretValueCommand, SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import type { Deadline } from '../budget.ts';
import type { KafkaCredentials } from '../domain.ts';
import type { DatabaseTarget } from '../outbox/client.ts';
import { DeadlineExceededError, SecretError } from '../errors.ts';

export interface SecretSource {
  /** `deadline`: the invocation's; a Secrets Manager that does not answer before it fails the call (the request itself has timeouts of its own) */
  get(secretId: string, refresh?: boolean, deadline?: Deadline): Promise<string>;
}

// Every wait has an end: a function in a VPC with no route to Secrets Manager (no endpoint, no
// NAT) would otherwise hang until Lambda kills it, with no cause in the log.
// (without throwOnRequestTimeout the SDK only logs a warning when requestTimeout passes, and waits on)
const SECRETS_CLIENT_TIMEOUTS = { connectionTimeout: 3_000, requestTimeout: 5_000, throwOnRequestTimeout: true };

export class SecretsManagerSource implements SecretSource {
  private readonly cache = new Map<string, Promise<string>>();
  fetches = 0;

  // region, credentials and AWS_ENDPOINT_URL (LocalStack, moto) are resolved by the SDK itself
  constructor(private readonly client = new SecretsManagerClient({ maxAttempts: 3, requestHandler: SECRETS_CLIENT_TIMEOUTS })) {}

  async get(secretId: string, refresh = false, deadline?: Deadline): Promise<string> {
    let p = this.cache.get(secretId);
    if (!p || refresh) {
      p = this.fetch(secretId);
      this.cache.set(secretId, p);
      const fetched = p;
      fetched.catch(() => {
        if (this.cache.get(secretId) === fetched) this.cache.delete(secretId);
      });
    }
    if (!deadline) return p;
    try {
      return await deadline.race(`reading secret ${secretId}`, p);
    } catch (err) {
      if (!(err instanceof DeadlineExceededError)) throw err;
      throw new SecretError(secretId, "Secrets Manager did not answer before the invocation's deadline: check the network path to it (in a VPC: a Secrets Manager interface endpoint or a NAT gateway) and AWS_ENDPOINT_URL", { cause: err, retriable: true });
    }
  }

  private async fetch(secretId: string): Promise<string> {
    this.fetches++;
    let out;
    try {
      out = await this.client.send(new GetSecretValueCommand({ SecretId: secretId }));
    } catch (err) {
      const name = (err as { name?: string }).name ?? 'Error';
      const hint =
        name === 'ResourceNotFoundException'
          ? 'no such secret: check the id/ARN and the region'
          : name === 'AccessDeniedException'
            ? 'access denied: the function role needs secretsmanager:GetSecretValue on this secret (and kms:Decrypt on its key)'
            : `could not be read (${name}: ${(err as Error).message})`;
      throw new SecretError(secretId, hint, { cause: err, retriable: name !== 'ResourceNotFoundException' && name !== 'AccessDeniedException' });
    }
    if (typeof out.SecretString !== 'string' || out.SecretString === '') {
      throw new SecretError(secretId, 'has no SecretString (binary secrets are not supported): store the value as a string');
    }
    return out.SecretString;
  }
}

/**
 * A database secret is either a postgres:// URL or the JSON RDS writes on rotation:
 * {"username","password","host","port","dbname"} (engine and others ignored). The JSON's fields
 * become connection options as they are, never parts of a URL (DatabaseTarget).
 */
export function databaseTargetFromSecret(secretId: string, raw: string, auth: 'password' | 'iam' = 'password'): DatabaseTarget {
  const text = raw.trim();
  if (/^postgres(ql)?:\/\//.test(text)) return { url: text };
  const obj = parseJsonObject(secretId, text, 'a postgres:// URL or RDS-style JSON {"username","password","host","port","dbname"}');
  // DATABASE_AUTH=iam logs in with a token: a password in the secret (an RDS-managed one has it) is not used
  const required = auth === 'iam' ? ['username', 'host'] : ['username', 'password', 'host'];
  const missing = required.filter((k) => typeof obj[k] !== 'string' || obj[k] === '');
  if (missing.length) throw new SecretError(secretId, `is missing ${missing.join(', ')}; expected RDS-style JSON {"username",${auth === 'iam' ? '' : '"password",'}"host","port","dbname"}`);
  const port = obj.port === undefined ? 5432 : Number(obj.port);
  if (!Number.isInteger(port) || port <= 0 || port > 65535) throw new SecretError(secretId, 'has a port that is not a number between 1 and 65535');
  const database = typeof obj.dbname === 'string' && obj.dbname ? obj.dbname : typeof obj.dbName === 'string' && obj.dbName ? obj.dbName : 'postgres';
  const fields = { host: obj.host as string, user: obj.username as string, database };
  // the startup message ends each value at a NUL byte: one inside would start a parameter of its own
  const withNul = Object.entries({ host: fields.host, username: fields.user, dbname: database }).filter(([, v]) => v.includes('\0'));
  if (withNul.length) throw new SecretError(secretId, `has a NUL character in ${withNul.map(([k]) => k).join(', ')}`);
  return { ...fields, port, password: auth === 'iam' ? undefined : (obj.password as string) };
}

/** Kafka SASL credentials: {"username","password","mechanism"} with mechanism plain | scram-sha-256 | scram-sha-512. */
export function kafkaCredentialsFromSecret(secretId: string, raw: string): KafkaCredentials {
  const obj = parseJsonObject(secretId, raw.trim(), 'JSON {"username","password","mechanism"}');
  const missing = ['username', 'password'].filter((k) => typeof obj[k] !== 'string' || obj[k] === '');
  if (missing.length) throw new SecretError(secretId, `is missing ${missing.join(', ')}; expected JSON {"username","password","mechanism"}`);
  const mechanism = (typeof obj.mechanism === 'string' ? obj.mechanism : 'scram-sha-512').toLowerCase();
  if (mechanism !== 'plain' && mechanism !== 'scram-sha-256' && mechanism !== 'scram-sha-512') {
    throw new SecretError(secretId, `has mechanism ${JSON.stringify(mechanism)}; expected plain, scram-sha-256 or scram-sha-512`);
  }
  return { username: obj.username as string, password: obj.password as string, mechanism };
}

function parseJsonObject(secretId: string, text: string, expected: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new SecretError(secretId, `is not valid JSON; expected ${expected}`);
  }
  if (!value || typeof value !== 'object' || Array.isArray(value)) throw new SecretError(secretId, `is not a JSON object; expected ${expected}`);
  return value as Record<string, unknown>;
}
