// Human output of the operator commands (src/cli/printable.ts, src/cli/output.ts): what a row
// carries (its error, key, type, topic) cannot forge a line or send the terminal an escape
// sequence, because every character that is not plainly visible is printed escaped; the JSON
// output stays plain JSON, with what JSON.stringify leaves raw and a terminal acts on escaped.
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';
import fc from 'fast-check';
import { parkedListText, statusText } from '../../src/cli/output.ts';
import { jsonText, printable, quoted } from '../../src/cli/printable.ts';
import type { ParkedRow, Status } from '../../src/outbox/admin.ts';

/** printable's escapes read back, left to right (the test's own reader: the CLI never needs one) */
function unescape(out: string): string {
  const named: Record<string, string> = { '\\': '\\', n: '\n', r: '\r', t: '\t' };
  return out.replace(/\\(?:([\\nrt])|x([0-9a-f]{2})|u\{([0-9a-f]+)\}|u([0-9a-f]{4}))/g, (_, c: string, x: string, big: string, u: string) =>
    c ? named[c]! : String.fromCodePoint(parseInt(x ?? big ?? u, 16)),
  );
}

/** what a terminal could act on, or that a reader could not see */
const INVISIBLE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}\p{Cn}]/u;

describe('printable', () => {
  it('escapes control characters, line separators, bidi and zero-width characters, lone surrogates, unassigned code points; and the backslash', () => {
    const cases: Array<[string, string]> = [
      ['a\nb', 'a\\nb'],
      ['a\r\nb\tc', 'a\\r\\nb\\tc'],
      ['\x1b[2J\x1b]0;title\x07', '\\x1b[2J\\x1b]0;title\\x07'],
      ['\x00\x7f', '\\x00\\x7f'],
      // C1: a single-byte CSI some terminals obey
      ['\x9b31m', '\\x9b31m'],
      ['one\u2028two\u2029three', 'one\\u2028two\\u2029three'],
      // a right-to-left override (reorders what follows on screen), zero-width space, BOM
      ['abc\u202Efed', 'abc\\u202efed'],
      ['a\u200Bb\uFEFF', 'a\\u200bb\\ufeff'],
      // a tag character (astral, invisible), a lone surrogate, a non-character
      ['x\u{E0041}', 'x\\u{e0041}'],
      ['\uD800!', '\\ud800!'],
      ['\uFFFE', '\\ufffe'],
      // an escape in the output always means one in the text
      ['C:\\n', 'C:\\\\n'],
    ];
    for (const [text, expected] of cases) assert.equal(printable(text), expected, JSON.stringify(text));
  });

  it('leaves visible text alone: accents, other scripts, emoji, quotes, spaces', () => {
    for (const text of ['Ünïcödé', '注文が支払われました', 'événement 😀 ✓', 'say "hi" it\'s', 'a b\u00a0c', '']) assert.equal(printable(text), text);
  });

  it('whatever the text, the result holds nothing invisible and no line break', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary' }), (text) => {
        const out = printable(text);
        assert.ok(!INVISIBLE.test(out), JSON.stringify(out));
      }),
      { numRuns: 2_000 },
    );
  });

  it('nothing is lost: the escapes read back to the text (so different texts never print the same)', () => {
    fc.assert(
      fc.property(fc.string({ unit: 'binary' }), (text) => {
        assert.equal(unescape(printable(text)), text);
      }),
      { numRuns: 2_000 },
    );
    // the pairs most likely to collide
    assert.notEqual(printable('\n'), printable('\\n'));
    assert.notEqual(printable('\x1b'), printable('\\x1b'));
  });

  it('quoted: between double quotes, its quotes escaped too', () => {
    assert.equal(quoted('a"b\n'), '"a\\"b\\n"');
  });
});

/** what JSON.stringify leaves raw that a terminal acts on: DEL, C1, bidi marks and controls, U+2028/9 */
const TERMINAL_ACTS_ON = /[\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]/u;

/** any character, the ones a terminal acts on often */
const someUnsafe = fc.oneof(fc.constantFrom('\x7f', '\x85', '\x9b', '\u061c', '\u200f', '\u202e', '\u2066', '\u2069', '\u2028'), fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }));

describe('jsonText', () => {
  it('writes C1 controls (U+009B, a CSI) and bidi overrides and isolates as \\u escapes; the JSON parses back to the same value', () => {
    const row = { last_error: 'x\x9b2J\x85y', aggregateid: 'a\u202Efed\u2066b\u2069', type: '\u2028\x7f', 'k\u202e': ['\u200f'] };
    const out = jsonText(row);
    assert.equal(out, '{"last_error":"x\\u009b2J\\u0085y","aggregateid":"a\\u202efed\\u2066b\\u2069","type":"\\u2028\\u007f","k\\u202e":["\\u200f"]}');
    assert.deepEqual(JSON.parse(out), row);
  });

  it('whatever the strings, the output parses back to the value and holds no character a terminal acts on; other text as JSON.stringify writes it', () => {
    fc.assert(
      fc.property(fc.jsonValue({ maxDepth: 2 }), fc.string({ unit: someUnsafe }), (value, text) => {
        for (const v of [value, { [text]: text }]) {
          const out = jsonText(v);
          assert.ok(!TERMINAL_ACTS_ON.test(out), JSON.stringify(out));
          assert.deepEqual(JSON.parse(out), JSON.parse(JSON.stringify(v)));
        }
      }),
      { numRuns: 1_000 },
    );
    assert.equal(jsonText({ a: 'Ünïcödé 注文 😀 "q"\n' }), JSON.stringify({ a: 'Ünïcödé 注文 😀 "q"\n' }));
  });
});

function parked(over: Partial<ParkedRow> = {}): ParkedRow {
  return {
    id: '0b4f8a52-3f7e-4c61-9d55-2f8f1b0c9e11',
    seq: '7',
    aggregatetype: 'order',
    aggregateid: 'O-1',
    type: 'OrderPaid',
    topic: null,
    attempts: 10,
    last_error: 'topic "x!" is not a legal Kafka topic name',
    parked_at: new Date('2026-12-01T10:00:00Z'),
    created_at: new Date('2026-12-01T09:00:00Z'),
    retried_at: null,
    retried_by: null,
    retried_reason: null,
    retried_operator: null,
    ...over,
  };
}

describe('parked list and status as text', () => {
  it('a row whose error, key and type carry line breaks and escape sequences still prints as its two lines, escaped', () => {
    const forged = parked({
      aggregateid: 'O-1\r\x1b[1A',
      type: 'Paid\u2028',
      last_error: 'boom\n7d3c2b1a-0f9e-4d8c-b7a6-5e4d3c2b1a09  seq 1  order/ok OrderPaid  attempts 1  parked 2026-12-01T10:00:00.000Z\n\x1b]0;pwned\x07',
    });
    const text = parkedListText([forged, parked({ id: '7d3c2b1a-0f9e-4d8c-b7a6-5e4d3c2b1a09', seq: '9' })]);
    const lines = text.split('\n');
    assert.equal(lines.length, 5, 'two lines per row, and the final newline');
    assert.equal(lines[0], '0b4f8a52-3f7e-4c61-9d55-2f8f1b0c9e11  seq 7  order/O-1\\r\\x1b[1A Paid\\u2028  attempts 10  parked 2026-12-01T10:00:00.000Z');
    assert.equal(lines[1], '    boom\\n7d3c2b1a-0f9e-4d8c-b7a6-5e4d3c2b1a09  seq 1  order/ok OrderPaid  attempts 1  parked 2026-12-01T10:00:00.000Z\\n\\x1b]0;pwned\\x07');
    assert.ok(!INVISIBLE.test(text.replaceAll('\n', '')), text);
  });

  it('a row put back before shows who did it, when and why (escaped too)', () => {
    const text = parkedListText([parked({ retried_at: new Date('2026-12-01T09:30:00Z'), retried_by: 'relay', retried_operator: 'alice\x1b[2J', retried_reason: 'ACL fixed\n(OPS-1)' })]);
    assert.deepEqual(text.split('\n').slice(2), ['    retried before: 2026-12-01T09:30:00.000Z by relay (operator alice\\x1b[2J): ACL fixed\\n(OPS-1)', '']);
    assert.equal(parkedListText([]), 'no parked rows\n');
  });

  it('status: one line per topic, whatever a topic name (a row\'s own topic column) carries', () => {
    const s: Status = {
      table: '"outbox"',
      pending: 2,
      retrying: 1,
      parked: 1,
      oldestPendingMs: 1_500,
      oldestPendingAgeMs: 1_500,
      pendingRows: 2,
      pendingRowsCapped: false,
      parkedRows: 1,
      parkedRowsCapped: false,
      topics: [
        { topic: 'orders\n  fake.topic                               pending 0', pending: 1, retrying: 1, parked: 0, oldestPendingMs: 1_500 },
        { topic: 'x\x1b[31m\u2029', pending: 1, retrying: 0, parked: 1, oldestPendingMs: null },
      ],
    };
    const lines = statusText(s).split('\n');
    assert.equal(lines.length, 4, 'the totals, two topics, the final newline');
    assert.match(lines[0]!, /^table "outbox": 2 pending \(1 retrying\), 1 parked, oldest pending 1\.5s$/);
    assert.ok(lines[1]!.startsWith('  orders\\n  fake.topic '), lines[1]);
    assert.ok(lines[2]!.startsWith('  x\\x1b[31m\\u2029 '), lines[2]);
    assert.match(lines[2]!, /parked {6}1 {2}oldest -$/);
  });
});
