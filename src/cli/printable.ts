// Text that came from the database (a row's error, key, type, topic; an operator's reason),
// printed for a human on a terminal. Any producer with INSERT on the outbox chooses some of it,
// and a broker's error message is copied into last_error: printed raw, a newline could forge a
// line of `parked list`, a carriage return overwrite one, and an ESC sequence drive the operator's
// terminal (move the cursor, rewrite the title, hide text). So every character that is not plainly
// visible is escaped, in a form that says which one it was. JSON output goes to terminals too, and
// JSON.stringify escapes only C0 controls: jsonText escapes the rest a terminal acts on.

/**
 * Escaped: the backslash itself (so an escape in the output always means one in the text), the
 * control characters (C0, DEL, C1: \p{Cc}), the invisible format characters (\p{Cf}: bidi
 * overrides that reorder what is shown, zero-width characters, the BOM, tag characters), the line
 * and paragraph separators (U+2028, U+2029), lone surrogates (\p{Cs}) and unassigned code points
 * (\p{Cn}, including non-characters such as U+FFFE).
 */
const UNPRINTABLE = /[\\\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}\p{Cn}]/gu;

const NAMED: Record<string, string> = { '\\': '\\\\', '\n': '\\n', '\r': '\\r', '\t': '\\t' };

/** The text with every character that is not plainly visible escaped: `\n`, `\x1b`, `\u2028`, `\u{e0001}`. */
export function printable(text: string): string {
  return text.replace(UNPRINTABLE, (c) => NAMED[c] ?? escapeCode(c.codePointAt(0)!));
}

/** The text between double quotes, escaped as `printable` does, and its quotes too: for user input echoed in a message. */
export function quoted(text: string): string {
  return `"${printable(text).replaceAll('"', '\\"')}"`;
}

function escapeCode(cp: number): string {
  if (cp <= 0xff) return `\\x${cp.toString(16).padStart(2, '0')}`;
  if (cp <= 0xffff) return `\\u${cp.toString(16).padStart(4, '0')}`;
  return `\\u{${cp.toString(16)}}`;
}

/**
 * Left raw by JSON.stringify and acted on by terminals: DEL and the C1 controls (U+009B is a
 * single-byte CSI on many), the bidi marks, embeddings, overrides and isolates (they reorder what
 * is shown), and the line and paragraph separators.
 */
const JSON_UNSAFE = /[\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]/g;

/**
 * The value as JSON text, those characters written as \uXXXX escapes: the same JSON to a parser
 * (they can only occur inside strings, where the escape means the character), nothing for a terminal.
 */
export function jsonText(value: unknown): string {
  return JSON.stringify(value).replace(JSON_UNSAFE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`);
}
