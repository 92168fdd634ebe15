// Rows that wait behind failed rows, for the claim's measurement next to a clean table (issue:
// a parked aggregate with 100,000 rows behind it must not make every claim read them):
//   parked   one aggregate whose first row is parked (hold policy), WAITING_ROWS rows behind it
//   backoff  1,000 aggregates whose first row backs off for an hour, WAITING_ROWS rows behind them
// Inserted before the bench's clean rows, so they are older: a claim that scanned rows in seq
// order would meet every one of them before the first row it may take.
import type { Sql } from 'postgres';

export type WaitingKind = 'parked' | 'backoff';
export const WAITING_ROWS = 100_000;

/** `rows`: WAITING_ROWS, or fewer for a smoke run (a multiple of 10,000) */
export async function addWaitingRows(sql: Sql, t: string, kind: WaitingKind, pad: string, rows = WAITING_ROWS): Promise<void> {
  const blockers = kind === 'parked' ? 1 : 1_000;
  await sql.unsafe(
    `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload, attempts, next_attempt_at, parked_at, last_error)
     SELECT 'bench', 'stuck-' || g, 'Failed', '{}', 3,
            now() + interval '1 hour', CASE WHEN $2 = 'parked' THEN now() END, 'the bench says so'
     FROM generate_series(1, $1::int) g`,
    [blockers, kind],
  );
  for (let i = 0; i < rows; i += 10_000) {
    await sql.unsafe(
      `INSERT INTO ${t} (aggregatetype, aggregateid, type, payload)
       SELECT 'bench', 'stuck-' || (g % $2::int + 1), 'Waiting', jsonb_build_object('n', g, 'pad', $3::text)
       FROM generate_series($1::int, $1::int + 9999) g ORDER BY g`,
      [i, blockers, pad],
    );
  }
}
