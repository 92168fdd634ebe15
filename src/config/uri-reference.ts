// RFC 3986's URI-reference (a URI, or a relative reference such as /orders-service), as
// CloudEvents 1.0 requires its `source` to be: what a value breaks, in words, or undefined.

const UNRESERVED_SUB_DELIMS = "A-Za-z0-9\\-._~!$&'()*+,;=";
const PCT = '%[0-9A-Fa-f]{2}';
/** path segments: pchar (unreserved, pct-encoded, sub-delims, ":" and "@") and "/" */
const PATH = new RegExp(`^(?:[${UNRESERVED_SUB_DELIMS}:@/]|${PCT})*$`);
/** query and fragment: pchar, "/" and "?" */
const QUERY = new RegExp(`^(?:[${UNRESERVED_SUB_DELIMS}:@/?]|${PCT})*$`);
const USERINFO = new RegExp(`^(?:[${UNRESERVED_SUB_DELIMS}:]|${PCT})*$`);
const REG_NAME = new RegExp(`^(?:[${UNRESERVED_SUB_DELIMS}]|${PCT})*$`);
const IP_LITERAL = new RegExp(`^\\[(?:[0-9A-Fa-f:.]+|v[0-9A-Fa-f]+\\.[${UNRESERVED_SUB_DELIMS}:]+)\\]$`);
const SCHEME = /^[A-Za-z][A-Za-z0-9+.-]*$/;
/** every character RFC 3986 allows anywhere in a URI reference */
const URI_CHARACTER = new RegExp(`[${UNRESERVED_SUB_DELIMS}:@/?#%[\\]]`);

/** Why `value` is not an RFC 3986 URI-reference; undefined when it is one (the empty one excepted: a source names something). */
export function uriReferenceProblem(value: string): string | undefined {
  if (value === '') return 'it is empty';
  const bad = [...value].find((c) => !URI_CHARACTER.test(c));
  if (bad !== undefined) {
    const encoded = [...Buffer.from(bad)].map((b) => `%${b.toString(16).toUpperCase().padStart(2, '0')}`).join('');
    return `it holds ${JSON.stringify(bad)}, which a URI may not hold as it is: percent-encode it (${encoded})`;
  }
  const percent = /%(?![0-9A-Fa-f]{2})/.exec(value);
  if (percent) return `${JSON.stringify(value.slice(percent.index, percent.index + 3))} is not a percent-encoding (% and two hexadecimal digits); a % itself is %25`;
  // RFC 3986 appendix B: scheme, authority, path, query, fragment
  const [, , scheme, , authority, path = '', , query, , fragment] = /^(([^:/?#]+):)?(\/\/([^/?#]*))?([^?#]*)(\?([^#]*))?(#(.*))?$/.exec(value)!;
  if (scheme !== undefined && !SCHEME.test(scheme)) {
    return `${JSON.stringify(`${scheme}:`)} is neither a scheme (a letter, then letters, digits, +, - or .) nor a relative path's first segment (which holds no ":"; write ./${scheme}:... for one)`;
  }
  if (authority !== undefined) {
    const at = authority.lastIndexOf('@');
    const userinfo = at >= 0 ? authority.slice(0, at) : '';
    const hostPort = authority.slice(at + 1);
    const port = /:(\d*)$/.exec(hostPort);
    const host = port && !/^\[[^\]]*$/.test(hostPort.slice(0, port.index)) ? hostPort.slice(0, port.index) : hostPort;
    if (!USERINFO.test(userinfo)) return `the authority's user information ${JSON.stringify(userinfo)} holds a character it may not`;
    if (!(IP_LITERAL.test(host) || REG_NAME.test(host))) return `the authority's host ${JSON.stringify(host)} is neither a name nor an address in [brackets] (its port, after a ":", is digits only)`;
  }
  if (!PATH.test(path)) return `the path ${JSON.stringify(path)} holds a character only a host in [brackets] may (percent-encode it)`;
  if (query !== undefined && !QUERY.test(query)) return `the query ${JSON.stringify(query)} holds a character it may not (percent-encode it)`;
  if (fragment !== undefined && !QUERY.test(fragment)) return `the fragment ${JSON.stringify(fragment)} holds a character it may not (a second "#", or brackets: percent-encode it)`;
  return undefined;
}
