// What every published figure names: the commit it measured (and whether the checkout had
// uncommitted changes to tracked files).
import { execFileSync } from 'node:child_process';

export function measuredCommit(): string {
  try {
    const rev = execFileSync('git', ['rev-parse', '--short', 'HEAD'], { encoding: 'utf8' }).trim();
    const dirty = execFileSync('git', ['status', '--porcelain', '--untracked-files=no'], { encoding: 'utf8' }).trim() !== '';
    return dirty ? `${rev} (with uncommitted changes)` : rev;
  } catch {
    return 'unknown (not a git checkout)';
  }
}
