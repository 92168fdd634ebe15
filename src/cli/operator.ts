// Who runs an operator command (`parked retry|skip`), recorded with each row beside the database
// role: an operator using the relay's own secret would otherwise be recorded as the relay. Given
// (--operator), the AWS caller identity when AWS credentials are set (STS GetCallerIdentity: the
// IAM user or the assumed role and its session), else the OS user and host.
import { hostname, userInfo } from 'node:os';
import { GetCallerIdentityCommand, STSClient } from '@aws-sdk/client-sts';

/** How long the STS lookup may take: an operator's command should not hang on it. */
export const CALLER_IDENTITY_TIMEOUT_MS = 5_000;

/** The credentials are set but their identity could not be read: the command does not run unattributed. */
export class OperatorIdentityError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'OperatorIdentityError';
  }
}

/** `given`: --operator; `awsCredentials`: Config.awsCredentials (the environment names some). */
export async function operatorIdentity(given: string | undefined, awsCredentials: boolean): Promise<string> {
  if (given) return given;
  return awsCredentials ? awsCallerIdentity() : osUser();
}

async function awsCallerIdentity(): Promise<string> {
  // region and endpoint (AWS_REGION, AWS_ENDPOINT_URL) as the SDK reads them for every client
  const sts = new STSClient({});
  try {
    const { Arn } = await sts.send(new GetCallerIdentityCommand({}), { abortSignal: AbortSignal.timeout(CALLER_IDENTITY_TIMEOUT_MS) });
    if (!Arn) throw new Error('the answer had no Arn');
    return Arn;
  } catch (err) {
    throw new OperatorIdentityError(
      `AWS credentials are set, but who they belong to could not be read (STS GetCallerIdentity: ${(err as Error).message}): fix the credentials, or name the operator with --operator NAME`,
      { cause: err },
    );
  } finally {
    sts.destroy();
  }
}

function osUser(): string {
  let user: string;
  try {
    user = userInfo().username;
  } catch {
    // no passwd entry for the uid (a container's arbitrary user)
    user = `uid ${process.getuid?.() ?? '?'}`;
  }
  return `${user}@${hostname()}`;
}
