// Types of scripts/third-party-notices.mjs (plain JavaScript, run by scripts/build.mjs with no
// TypeScript loader), for the tests that import it.
export interface Metafile {
  outputs: Record<string, { inputs: Record<string, unknown> }>;
}

export interface PackageNotice {
  name: string;
  version: string;
  license: string;
  repository: string | undefined;
  author: string | undefined;
  /** the package's directory, relative to the build's root */
  dir: string;
  /** its LICENSE/LICENCE/COPYING/NOTICE files, sorted by name */
  files: Array<{ name: string; text: string }>;
  /** the License section of its README, when it ships no such file */
  readme: { file: string; text: string } | undefined;
}

export function packageDirOf(input: string): string | undefined;
export function bundledPackageDirs(metafile: Metafile): string[];
export function packageNotice(root: string, dir: string): PackageNotice;
export function thirdPartyNotices(metafile: Metafile, root: string, product?: string): { text: string; packages: PackageNotice[] };
