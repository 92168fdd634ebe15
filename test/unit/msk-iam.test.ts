// The MSK IAM token cache (src/kafka/msk-iam.ts) with a signer and a clock of the test's: reused
// while fresh, replaced before it expires and after invalidate(), one signing for concurrent
// callers, and a signing failure as an MskIamError that says what to check. The real signer and a
// broker that verifies its tokens: test/integration/msk-iam.test.ts.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import { MskIamError } from '../../src/errors.ts';
import { classifySendError } from '../../src/kafka/classify.ts';
import { MskIamTokens, REFRESH_BEFORE_EXPIRY_MS, type SignedToken } from '../../src/kafka/msk-iam.ts';

/** A signer whose tokens live `lifetimeMs` from the clock's now; counts its calls. */
function fakeSigner(clock: { now: number }, lifetimeMs = 900_000) {
  const calls: string[] = [];
  const sign = (region: string): Promise<SignedToken> => {
    calls.push(region);
    return Promise.resolve({ token: `token-${calls.length}`, expiryTime: clock.now + lifetimeMs });
  };
  return { sign, calls };
}

describe('MskIamTokens', () => {
  it('signs once and reuses the token while it is fresh (a warm container), for the configured region', async () => {
    const clock = { now: 1_000_000 };
    const signer = fakeSigner(clock);
    const tokens = new MskIamTokens('eu-west-1', signer.sign, () => clock.now);
    assert.equal(await tokens.token(), 'token-1');
    clock.now += 900_000 - REFRESH_BEFORE_EXPIRY_MS - 1;
    assert.equal(await tokens.token(), 'token-1');
    assert.deepEqual(signer.calls, ['eu-west-1']);
    assert.equal(tokens.signed, 1);
  });

  it('replaces the token shortly before it expires, and once expired', async () => {
    const clock = { now: 1_000_000 };
    const signer = fakeSigner(clock);
    const tokens = new MskIamTokens('eu-west-1', signer.sign, () => clock.now);
    await tokens.token();
    clock.now += 900_000 - REFRESH_BEFORE_EXPIRY_MS;
    assert.equal(await tokens.token(), 'token-2', `${REFRESH_BEFORE_EXPIRY_MS} ms before its expiry`);
    clock.now += 2 * 900_000;
    assert.equal(await tokens.token(), 'token-3', 'long expired (a container thawed after a pause)');
  });

  it('a short-lived token (credentials about to expire) is replaced a quarter of its lifetime before its end', async () => {
    const clock = { now: 1_000_000 };
    const signer = fakeSigner(clock, 40_000);
    const tokens = new MskIamTokens('eu-west-1', signer.sign, () => clock.now);
    await tokens.token();
    clock.now += 29_999;
    assert.equal(await tokens.token(), 'token-1');
    clock.now += 1;
    assert.equal(await tokens.token(), 'token-2');
  });

  it('invalidate(): the next token is a new one (the broker refused the cached one)', async () => {
    const clock = { now: 1_000_000 };
    const tokens = new MskIamTokens('eu-west-1', fakeSigner(clock).sign, () => clock.now);
    await tokens.token();
    tokens.invalidate();
    assert.equal(await tokens.token(), 'token-2');
  });

  it('connections authenticating at once share one signing', async () => {
    const clock = { now: 1_000_000 };
    const signer = fakeSigner(clock);
    const tokens = new MskIamTokens('eu-west-1', signer.sign, () => clock.now);
    assert.deepEqual(await Promise.all([tokens.token(), tokens.token(), tokens.token()]), ['token-1', 'token-1', 'token-1']);
    assert.equal(signer.calls.length, 1);
  });

  it('G8: a failure to sign is an MskIamError saying what to check, classified as refused credentials; the next call tries again', async () => {
    let fail = true;
    const sign = (): Promise<SignedToken> => (fail ? Promise.reject(new Error('Could not load credentials from any providers')) : Promise.resolve({ token: 'ok', expiryTime: Date.now() + 900_000 }));
    const tokens = new MskIamTokens('eu-west-1', sign);
    const err = await tokens.token().then(() => assert.fail('expected a rejection'), (e: unknown) => e);
    assert.ok(err instanceof MskIamError);
    assert.match(err.message, /^no AWS credentials for MSK IAM: could not sign a token for region eu-west-1: Could not load credentials from any providers; .*AWS_ACCESS_KEY_ID.*AWS_REGION/);
    // wrapped as a client wraps a provider's rejection (platformatic: AuthenticationError, cause)
    const wrapped = Object.assign(new Error('The SASL/OAUTHBEARER token provider threw an error.'), { code: 'PLT_KFK_AUTHENTICATION', cause: err });
    const failure = classifySendError(wrapped, 'outbox.event.order', 'iam');
    assert.equal(failure.scope, 'auth');
    assert.equal(failure.error, err, 'the MskIamError itself, not a generic refusal');
    fail = false;
    assert.equal(await tokens.token(), 'ok');
  });

  it("G8: a token the broker refused is said as such, with what to check for IAM (not the secret's)", () => {
    const refused = Object.assign(new Error('SASL authentication failed.'), { code: 'PLT_KFK_AUTHENTICATION' });
    const failure = classifySendError(refused, 'outbox.event.order', 'iam');
    assert.equal(failure.scope, 'auth');
    assert.match(failure.error.message, /^Kafka refused the relay's MSK IAM token \(PLT_KFK_AUTHENTICATION\): check that the relay's AWS credentials .* may kafka-cluster:Connect/);
    assert.doesNotMatch(failure.error.message, /KAFKA_SECRET_ID/);
  });
});
