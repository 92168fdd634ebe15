// CPU seconds spent by each party of a measurement, read from /proc (Linux only; elsewhere the
// bench simply prints no CPU columns). On a small machine the three processes — Node, Postgres and
// the broker — share the cores, so where the CPU goes explains a ratio better than wall time.
import { readFileSync, readdirSync } from 'node:fs';

export interface CpuSample {
  node: number;
  postgres: number;
  broker: number;
}

const TICKS = 100; // USER_HZ on Linux

function stat(pid: number): string[] | undefined {
  try {
    const s = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // the command name may contain spaces; fields start after its closing parenthesis
    return s.slice(s.lastIndexOf(')') + 2).split(' ');
  } catch {
    return undefined;
  }
}

/** utime+stime (+ reaped children's, for the postmaster whose backends come and go), seconds */
function cpuOf(pid: number, children: boolean): number {
  const f = stat(pid);
  if (!f) return 0;
  // after the name: state(0) ppid(1) … utime(11) stime(12) cutime(13) cstime(14)
  const own = Number(f[11]) + Number(f[12]);
  return (children ? own + Number(f[13]) + Number(f[14]) : own) / TICKS;
}

function readPid(file: string): number | undefined {
  try {
    const pid = Number(readFileSync(file, 'utf8').trim());
    return Number.isInteger(pid) && pid > 0 ? pid : undefined;
  } catch {
    return undefined;
  }
}

/** CPU seconds (utime+stime) one process has used so far; 0 once it is gone */
export function processCpu(pid: number): number {
  return cpuOf(pid, false);
}

/** the parent of a process: for a Postgres backend (pg_backend_pid()), its postmaster */
export function parentPid(pid: number): number | undefined {
  const f = stat(pid);
  return f ? Number(f[1]) : undefined;
}

export class CpuMeter {
  private readonly postmaster?: number;
  private readonly broker?: number;
  readonly available: boolean;

  /**
   * runDir holds the pids services.sh recorded. `postmaster` overrides postgres.pid: the bench
   * passes the parent of its own backend, so DATABASE_URL pointing at another local server is
   * measured right. BENCH_BROKER_PID overrides kafka.pid likewise, for a broker this checkout did
   * not start.
   */
  constructor(runDir: string, opts: { postmaster?: number } = {}) {
    this.postmaster = opts.postmaster ?? readPid(`${runDir}/postgres.pid`);
    this.broker = Number(process.env.BENCH_BROKER_PID) || readPid(`${runDir}/kafka.pid`);
    this.available = process.platform === 'linux' && this.postmaster !== undefined && this.broker !== undefined;
  }

  /** the postmaster's pid (to find its walsenders), when known */
  get postmasterPid(): number | undefined {
    return this.postmaster;
  }

  sample(): CpuSample {
    const u = process.cpuUsage();
    let pg = 0;
    if (this.postmaster !== undefined) {
      pg = cpuOf(this.postmaster, true);
      for (const e of readdirSync('/proc')) {
        const pid = Number(e);
        if (!Number.isInteger(pid) || pid === this.postmaster) continue;
        const f = stat(pid);
        if (f && Number(f[1]) === this.postmaster) pg += (Number(f[11]) + Number(f[12])) / TICKS;
      }
    }
    return { node: (u.user + u.system) / 1e6, postgres: pg, broker: this.broker === undefined ? 0 : cpuOf(this.broker, false) };
  }

  static diff(a: CpuSample, b: CpuSample): CpuSample {
    return { node: b.node - a.node, postgres: b.postgres - a.postgres, broker: b.broker - a.broker };
  }
}

/**
 * CPU seconds per thread name of one process (/proc/PID/task), numbered siblings folded into one
 * ("GC Thread#0", "GC Thread#1" → "GC Thread#"): where a JVM's CPU goes, without a profiler.
 */
export function threadCpu(pid: number): Map<string, number> {
  const out = new Map<string, number>();
  let tids: string[];
  try {
    tids = readdirSync(`/proc/${pid}/task`);
  } catch {
    return out;
  }
  for (const tid of tids) {
    try {
      const s = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8');
      const name = s.slice(s.indexOf('(') + 1, s.lastIndexOf(')')).replace(/\d+$/, '');
      const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
      out.set(name, (out.get(name) ?? 0) + (Number(f[11]) + Number(f[12])) / TICKS);
    } catch {
      // the thread ended between the listing and the read
    }
  }
  return out;
}
