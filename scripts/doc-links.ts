// The check that every relative link of the project's Markdown pages resolves: the file exists
// and, for a link to a heading (`page.md#heading`), the page has that heading, by the anchors
// GitHub gives headings. Run by `npm run docs:testing` (scripts/testing-matrix.ts), so by .ci/run.
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';

/** The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces to hyphens. */
export function anchors(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const line of markdown.replace(FENCED, '').split('\n')) {
    const heading = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(line)?.[1];
    if (heading === undefined) continue;
    const slug = heading
      .replace(/\[([^\]]*)\]\([^)]*\)/g, '$1')
      .toLowerCase()
      .replace(/[^\p{L}\p{N}\s_-]/gu, '')
      .replace(/ /g, '-');
    const n = seen.get(slug) ?? 0;
    seen.set(slug, n + 1);
    out.add(n ? `${slug}-${n}` : slug);
  }
  return out;
}

const FENCED = /^```[^\n]*\n[\s\S]*?^```/gm;

/** Markdown with its fenced code blocks and inline code blanked, so code is not read as links. */
function withoutCode(markdown: string): string {
  return markdown.replace(FENCED, '').replace(/`[^`\n]*`/g, '``');
}

/** The targets of a page's links, code left out: `path`, `path#heading`, `#heading`, or a URL. */
export function linksOf(markdown: string): string[] {
  return [...withoutCode(markdown).matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)].map((m) => m[1] ?? '');
}

/** Every relative link of the Markdown pages under root that names no file, or no heading of its page. */
export function brokenLinks(root: string): string[] {
  const broken: string[] = [];
  for (const page of markdownFiles(root)) {
    for (const link of linksOf(readFileSync(page, 'utf8'))) {
      if (/^[a-z][a-z0-9+.-]*:/i.test(link)) continue;
      const [path, anchor] = link.split('#', 2);
      const target = path ? join(dirname(page), decodeURIComponent(path)) : page;
      const where = `${relative(root, page)}: ${link}`;
      if (!existsSync(target)) broken.push(`${where} (no such file)`);
      else if (anchor && target.endsWith('.md') && statSync(target).isFile()
        && !anchors(readFileSync(target, 'utf8')).has(anchor)) broken.push(`${where} (no such heading)`);
    }
  }
  return broken;
}

/** what is not the project's own: dependencies, local services' data, build output */
const NOT_PAGES = new Set(['node_modules', '.cache', '.git', 'dist', '.serverless', '.build', 'reports', '.stryker-tmp']);

export function markdownFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return NOT_PAGES.has(e.name) ? [] : markdownFiles(path);
    return e.name.endsWith('.md') ? [path] : [];
  });
}

