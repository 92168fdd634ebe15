// An RDS IAM auth token checked as RDS checks it, for the test proxy (pg-proxy.ts): the token is a
// SigV4-presigned GET of `https://<host>:<port>/?Action=connect&DBUser=<user>&X-Amz-...` for the
// service rds-db, without its scheme. Its signature is recomputed here from the credentials it
// must have been signed with (the AWS emulator's), with node:crypto only, independently of the
// signer the relay uses; then its host and port, action, user, expiry and signing date are checked.
import { createHash, createHmac } from 'node:crypto';

export interface TokenExpectation {
  /** the endpoint the token must be for, as the client was told it (host:port) */
  host: string;
  port: number;
  /** the user the connection logs in as */
  user: string;
  accessKeyId: string;
  secretAccessKey: string;
  region: string;
  /** the verifier's clock, ms */
  now: number;
}

/** A token's fields, once it is known to be well formed. */
export interface TokenFacts {
  /** X-Amz-Date as ms since the epoch */
  signedAt: number;
  expiresAt: number;
  user: string;
}

/** RFC 3986 percent-encoding, as SigV4's canonical query string wants it. */
function encode(s: string): string {
  return encodeURIComponent(s).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

const hmac = (key: Buffer | string, data: string): Buffer => createHmac('sha256', key).update(data, 'utf8').digest();
const sha256 = (data: string): string => createHash('sha256').update(data, 'utf8').digest('hex');

/** The token's facts, or why it is refused (what an operator would need to know). */
export function verifyRdsAuthToken(token: string, want: TokenExpectation): { ok: true; facts: TokenFacts } | { ok: false; reason: string } {
  const refuse = (reason: string) => ({ ok: false as const, reason });
  const slash = token.indexOf('/?');
  if (slash <= 0) return refuse('the password is not an RDS IAM auth token (host:port/?Action=connect&...)');
  const endpoint = token.slice(0, slash);
  const query = new Map<string, string>();
  for (const pair of token.slice(slash + 2).split('&')) {
    const eq = pair.indexOf('=');
    if (eq <= 0) return refuse('the token has a malformed query string');
    query.set(decodeURIComponent(pair.slice(0, eq)), decodeURIComponent(pair.slice(eq + 1)));
  }
  const get = (k: string) => query.get(k) ?? '';
  if (endpoint !== `${want.host}:${want.port}`) return refuse(`the token is for ${endpoint}, not ${want.host}:${want.port}`);
  if (get('Action') !== 'connect') return refuse(`the token's action is ${JSON.stringify(get('Action'))}, not connect`);
  if (get('DBUser') !== want.user) return refuse(`the token is for DBUser ${JSON.stringify(get('DBUser'))}, not ${JSON.stringify(want.user)}`);
  if (get('X-Amz-Algorithm') !== 'AWS4-HMAC-SHA256') return refuse('the token is not signed with AWS4-HMAC-SHA256');
  if (get('X-Amz-SignedHeaders') !== 'host') return refuse('the token must sign the host header alone');
  const date = /^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$/.exec(get('X-Amz-Date'));
  if (!date) return refuse('the token has no valid X-Amz-Date');
  const signedAt = Date.UTC(+date[1]!, +date[2]! - 1, +date[3]!, +date[4]!, +date[5]!, +date[6]!);
  const expires = Number(get('X-Amz-Expires'));
  if (!Number.isInteger(expires) || expires <= 0 || expires > 900) return refuse('the token has no X-Amz-Expires between 1 and 900 seconds');
  const day = get('X-Amz-Date').slice(0, 8);
  const scope = `${day}/${want.region}/rds-db/aws4_request`;
  const [keyId, ...rest] = get('X-Amz-Credential').split('/');
  if (keyId !== want.accessKeyId) return refuse(`the token is signed by access key ${JSON.stringify(keyId)}, which this database does not know`);
  if (rest.join('/') !== scope) return refuse(`the token's credential scope is ${JSON.stringify(rest.join('/'))}, not ${scope} (wrong region or service?)`);

  const canonicalQuery = [...query]
    .filter(([k]) => k !== 'X-Amz-Signature')
    .map(([k, v]) => [encode(k), encode(v)])
    .sort(([a], [b]) => (a! < b! ? -1 : a! > b! ? 1 : 0))
    .map(([k, v]) => `${k}=${v}`)
    .join('&');
  // the payload of a presigned GET: the hash of nothing
  const canonicalRequest = ['GET', '/', canonicalQuery, `host:${endpoint}`, '', 'host', sha256('')].join('\n');
  const stringToSign = ['AWS4-HMAC-SHA256', get('X-Amz-Date'), scope, sha256(canonicalRequest)].join('\n');
  const key = hmac(hmac(hmac(hmac(`AWS4${want.secretAccessKey}`, day), want.region), 'rds-db'), 'aws4_request');
  if (hmac(key, stringToSign).toString('hex') !== get('X-Amz-Signature')) return refuse("the token's signature does not match (signed with another secret key, or altered)");

  const expiresAt = signedAt + expires * 1_000;
  if (want.now > expiresAt) return refuse(`the token expired at ${new Date(expiresAt).toISOString()} (signed ${new Date(signedAt).toISOString()}, valid ${expires} s)`);
  // a token dated in the future: the signer's clock is ahead (RDS allows a few minutes of skew)
  if (signedAt > want.now + 5 * 60_000) return refuse(`the token is signed at ${new Date(signedAt).toISOString()}, in the future`);
  return { ok: true, facts: { signedAt, expiresAt, user: get('DBUser') } };
}
