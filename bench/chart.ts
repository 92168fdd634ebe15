// A small SVG line chart for the latency bench (bench/latency.ts): panels stacked on one time axis,
// each with a log-scaled y axis (exit mode's seconds and linger mode's milliseconds share a panel),
// one line per series. Written by hand: a plotting library would be the bench's only reason to
// carry one.

export interface Series {
  label: string;
  color: string;
  dash?: string;
  /** [seconds since the start, value]; values at or below the panel's floor are drawn on it */
  points: Array<[number, number]>;
}

export interface Panel {
  title: string;
  unit: string;
  /** log axis bounds */
  min: number;
  max: number;
  /** tick values and their labels */
  ticks: Array<[number, string]>;
  series: Series[];
}

const W = 960;
const PANEL_H = 260;
const LEFT = 70;
const RIGHT = 190;
const TOP = 50;
const GAP = 60;

const esc = (s: string) => s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;');

export function lineChart(title: string, subtitle: string[], xMaxS: number, panels: Panel[]): string {
  const top0 = TOP + 16 * (subtitle.length - 1);
  const height = top0 + panels.length * (PANEL_H + GAP) + 10;
  const plotW = W - LEFT - RIGHT;
  const x = (s: number) => LEFT + (Math.min(s, xMaxS) / xMaxS) * plotW;
  const out: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${height}" viewBox="0 0 ${W} ${height}" font-family="system-ui, -apple-system, Segoe UI, sans-serif" font-size="12">`,
    `<rect width="${W}" height="${height}" fill="#fff"/>`,
    `<text x="${LEFT}" y="22" font-size="16" font-weight="600">${esc(title)}</text>`,
    ...subtitle.map((line, i) => `<text x="${LEFT}" y="${40 + 16 * i}" fill="#555">${esc(line)}</text>`),
  ];
  panels.forEach((p, i) => {
    const top = top0 + 20 + i * (PANEL_H + GAP);
    const lo = Math.log10(p.min);
    const hi = Math.log10(p.max);
    const y = (v: number) => top + PANEL_H - ((Math.log10(Math.min(p.max, Math.max(p.min, v))) - lo) / (hi - lo)) * PANEL_H;
    out.push(`<text x="${LEFT}" y="${top - 8}" font-weight="600">${esc(p.title)} <tspan fill="#555" font-weight="400">(${esc(p.unit)}, log scale)</tspan></text>`);
    out.push(`<rect x="${LEFT}" y="${top}" width="${plotW}" height="${PANEL_H}" fill="none" stroke="#999"/>`);
    for (const [v, label] of p.ticks) {
      out.push(`<line x1="${LEFT}" x2="${LEFT + plotW}" y1="${y(v).toFixed(1)}" y2="${y(v).toFixed(1)}" stroke="#eee"/>`);
      out.push(`<text x="${LEFT - 6}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end" fill="#555">${esc(label)}</text>`);
    }
    const step = xMaxS > 120 ? 30 : 10;
    for (let s = 0; s <= xMaxS; s += step) {
      out.push(`<line x1="${x(s).toFixed(1)}" x2="${x(s).toFixed(1)}" y1="${top + PANEL_H}" y2="${top + PANEL_H + 4}" stroke="#999"/>`);
      out.push(`<text x="${x(s).toFixed(1)}" y="${top + PANEL_H + 16}" text-anchor="middle" fill="#555">${s} s</text>`);
    }
    p.series.forEach((s, k) => {
      if (s.points.length > 0) {
        const d = s.points.map(([t, v], j) => `${j === 0 ? 'M' : 'L'}${x(t).toFixed(1)},${y(v).toFixed(1)}`).join('');
        out.push(`<path d="${d}" fill="none" stroke="${s.color}" stroke-width="1.6"${s.dash ? ` stroke-dasharray="${s.dash}"` : ''}/>`);
      }
      const ly = top + 14 + k * 18;
      out.push(`<line x1="${W - RIGHT + 14}" x2="${W - RIGHT + 40}" y1="${ly - 4}" y2="${ly - 4}" stroke="${s.color}" stroke-width="2"${s.dash ? ` stroke-dasharray="${s.dash}"` : ''}/>`);
      out.push(`<text x="${W - RIGHT + 46}" y="${ly}">${esc(s.label)}</text>`);
    });
  });
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}
