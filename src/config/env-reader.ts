// Typed reads of environment variables: each bad value becomes a problem that names the variable
// and the form it expects, and its default stands in, so that loadConfig reports every problem at once.

import { DECLARED } from './settings.ts';

export type Env = Record<string, string | undefined>;

/** Reads typed values from the environment and collects every problem, so all are reported at once. */
export class EnvReader {
  readonly problems: string[] = [];
  constructor(private readonly env: Env) {}

  /** A name missing from SETTINGS is a programming error: the docs and serverless.yml are checked against that list. */
  str(name: string): string | undefined {
    if (!DECLARED.has(name)) throw new Error(`${name} is read but not declared in src/config/settings.ts (SETTINGS)`);
    return this.given(name);
  }

  /** Whether a name outside SETTINGS is set anyway: for the removed settings, which are refused. */
  given(name: string): string | undefined {
    const v = this.env[name]?.trim();
    return v === '' ? undefined : v;
  }

  int(name: string, def: number, min: number, max: number): number {
    const raw = this.str(name);
    if (raw === undefined) return def;
    if (!/^\d+$/.test(raw)) {
      this.problems.push(`${name}=${JSON.stringify(raw)} is not a whole number; ${this.range(min, max, def)}`);
      return def;
    }
    const n = Number(raw);
    if (n < min || n > max) this.problems.push(`${name}=${raw} is out of range; ${this.range(min, max, def)}`);
    return n;
  }

  private range(min: number, max: number, def: number): string {
    return `expected an integer between ${min} and ${max} (default ${def})`;
  }

  bool(name: string, def: boolean): boolean {
    const raw = this.str(name)?.toLowerCase();
    if (raw === undefined) return def;
    if (['true', '1', 'yes', 'on'].includes(raw)) return true;
    if (['false', '0', 'no', 'off'].includes(raw)) return false;
    this.problems.push(`${name}=${JSON.stringify(raw)} is not a boolean; expected true or false (default ${def})`);
    return def;
  }

  /** `defaultText`: how the default is described when it is not one fixed value */
  oneOf<T extends string>(name: string, allowed: readonly T[], def: T, defaultText: string = def): T {
    const raw = this.str(name)?.toLowerCase();
    if (raw === undefined) return def;
    if ((allowed as readonly string[]).includes(raw)) return raw as T;
    this.problems.push(`${name}=${JSON.stringify(raw)} is not one of ${allowed.join(', ')} (default ${defaultText})`);
    return def;
  }
}
