// Amazon MSK IAM access control (KAFKA_AUTH=iam): the relay logs in with SASL/OAUTHBEARER, its
// bearer token a SigV4-presigned `kafka-cluster:Connect` request made by AWS's signer,
// aws-msk-iam-sasl-signer-js, with the AWS SDK's default credentials (on Lambda: the function's
// role) for the cluster's region. Signing is local: no call to AWS.
//
// A token is valid for 15 minutes (less when the credentials expire sooner: the signer says when,
// expiryTime). Both clients ask for one at every authentication: a new connection, and a
// re-authentication when the broker's session is about to end (MSK ends it when the token
// expires). The token is cached until shortly before its expiry, so a warm Lambda container's
// invocations reuse it, and a connection authenticating near its end gets a new one. When the
// broker refuses a token anyway (a clock off, a policy changed), the Publisher asks once more with
// `invalidate()` first (producer-publisher.ts), which signs a new one.
//
// The signer (and the AWS SDK credential providers it pulls in) is imported on the first token:
// only a relay configured with KAFKA_AUTH=iam loads it (scripts/build.mjs puts it in a chunk).
import type { MskIamLogin } from '../domain.ts';
import { describe, MskIamError } from '../errors.ts';

/** What the signer returns: the token, and when it expires (ms since the epoch). */
export interface SignedToken {
  token: string;
  expiryTime: number;
}

export type TokenSigner = (region: string) => Promise<SignedToken>;

/** A token is replaced this long before it expires, or a quarter of its lifetime before if that is shorter. */
export const REFRESH_BEFORE_EXPIRY_MS = 60_000;

const WHAT_TO_CHECK =
  "KAFKA_AUTH=iam signs with the AWS SDK's default credentials: on Lambda the function's role; elsewhere AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), and AWS_REGION the cluster's region";

/** AWS's signer, imported on first use. */
export const awsSigner: TokenSigner = async (region) => {
  const signer = await import('aws-msk-iam-sasl-signer-js');
  return signer.generateAuthToken({ region });
};

/** The relay's MSK IAM tokens: one at a time, replaced before it expires. */
export class MskIamTokens {
  /** tokens signed so far */
  signed = 0;
  private current: { token: string; refreshAt: number } | undefined;
  private signing: Promise<string> | undefined;

  constructor(
    readonly region: string,
    private readonly signer: TokenSigner = awsSigner,
    private readonly now: () => number = Date.now,
  ) {}

  /** The cached token while it is fresh, else a new one; rejects with an MskIamError when none can be signed. */
  async token(): Promise<string> {
    const current = this.current;
    if (current && this.now() < current.refreshAt) return current.token;
    // connections authenticating at the same time share one signing
    this.signing ??= this.sign().finally(() => {
      this.signing = undefined;
    });
    return this.signing;
  }

  /**
   * The login of a new producer. A token is signed (or the cached one taken) now, so that missing
   * credentials fail as such (MskIamError) before the client connects; `refresh`: the broker
   * refused the cached one, sign another.
   */
  async login(refresh: boolean): Promise<MskIamLogin> {
    if (refresh) this.invalidate();
    await this.token();
    return { mechanism: 'aws-msk-iam', token: () => this.token() };
  }

  /** Forget the cached token (the broker refused it): the next token() signs a new one. */
  invalidate(): void {
    this.current = undefined;
  }

  private async sign(): Promise<string> {
    const signedAt = this.now();
    let signed: SignedToken;
    try {
      signed = await this.signer(this.region);
    } catch (err) {
      throw new MskIamError(`no AWS credentials for MSK IAM: could not sign a token for region ${this.region}: ${describe(err)}; ${WHAT_TO_CHECK}`, { cause: err });
    }
    const lifetime = signed.expiryTime - signedAt;
    this.current = { token: signed.token, refreshAt: signed.expiryTime - Math.min(REFRESH_BEFORE_EXPIRY_MS, lifetime / 4) };
    this.signed++;
    return signed.token;
  }
}
