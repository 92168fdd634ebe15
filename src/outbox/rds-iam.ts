// RDS IAM database authentication (DATABASE_AUTH=iam): instead of a password, every new
// connection logs in with an auth token, a SigV4-presigned `rds-db:connect` request for the
// database's host, port and user, valid for 15 minutes from its signing, made by
// @aws-sdk/rds-signer with the AWS SDK's default credentials and region (on Lambda: the
// function's role and AWS_REGION). Signing is local: no call to AWS, so it costs no round trip.
//
// The token is signed when the server asks a connection for its password (postgres.js calls the
// password function then), never cached: a connection opened long after the client was built, or
// after the credentials were rotated, gets a token as new as itself.
import { Signer } from '@aws-sdk/rds-signer';
import { DatabaseError } from '../errors.ts';

/** Whom a token is for: the endpoint the relay connects to (an RDS instance, cluster or proxy) and the database user. */
export interface IamLogin {
  host: string;
  port: number;
  user: string;
}

const WHAT_TO_CHECK =
  "the relay signs with the AWS SDK's default credentials and region: on Lambda the function's role and AWS_REGION; elsewhere AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) and AWS_REGION";

/** The auth tokens of one login, one per connection. */
export class RdsAuthTokens {
  /** tokens signed so far */
  signed = 0;
  /** why the last token could not be signed, kept for the refusal that follows */
  private failure: Error | undefined;
  private readonly signer: Signer;

  constructor(readonly login: IamLogin) {
    this.signer = new Signer({ hostname: login.host, port: login.port, username: login.user });
  }

  /** A new token; rejects with a DatabaseError saying what to check when none can be signed (no credentials, no region). */
  async sign(): Promise<string> {
    try {
      const token = await this.signer.getAuthToken();
      this.signed++;
      this.failure = undefined;
      return token;
    } catch (err) {
      const l = this.login;
      throw new DatabaseError(`could not sign an RDS IAM auth token for user ${JSON.stringify(l.user)} at ${l.host}:${l.port} (DATABASE_AUTH=iam): ${(err as Error).message}; ${WHAT_TO_CHECK}`, { cause: err });
    }
  }

  /**
   * postgres.js' password: a token signed now. Never rejects: postgres.js 3.4.9 does not await its
   * authentication handlers, so a rejection would be unhandled and end the process. A token that
   * could not be signed is sent empty, the server refuses it, and refused() says why.
   */
  readonly password = async (): Promise<string> => {
    try {
      return await this.sign();
    } catch (err) {
      this.failure = err as Error;
      return '';
    }
  };

  /** The invocation's error for a login the database refused (`err`: the driver's 28P01/28000). */
  refused(err: unknown): DatabaseError {
    const l = this.login;
    const e = err as { code?: string; message?: string };
    const why = this.failure ? `no token could be signed: ${this.failure.message}` : `${e.code ?? 'refused'}: ${e.message ?? String(err)}`;
    return new DatabaseError(
      `the database refused the IAM auth token of user ${JSON.stringify(l.user)} at ${l.host}:${l.port} (${why}). ` +
        'DATABASE_AUTH=iam signs a token for every new connection: check that the relay has the AWS credentials you expect ' +
        "(on Lambda the function's role; elsewhere AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) and that AWS_REGION is the database's region; " +
        `that they may rds-db:connect on dbuser:<the database's resource id>/${l.user} (serverless.yml: databaseIamResourceId, databaseIamUser); ` +
        `that the database user has the rds_iam role (GRANT rds_iam TO ${l.user}); and that this machine's clock is right (a token is valid for 15 minutes from its signing)`,
      { cause: err, retriable: false },
    );
  }
}
