// The session's per-cell history as an inline SVG: one bar per recorded cell, its bytes after
// the cell stacked by component, its peak as the taller outlined bar behind, the budget as a
// dashed line; a failed cell (error, panic, out of memory, lost context) outlined in the error
// colour with a ✗ above it; an earlier notebook process's bars apart, on the left, faded and
// labelled. Colours are CSS classes (style/base.css) over JupyterLab's theme variables.

import { Bar, BarGroup, Site } from './records';
import { iec, unitOf } from './units';

const SVG = 'http://www.w3.org/2000/svg';

/** How a component is named on screen (`other` reads `untagged`, as on the report line). */
export function partLabel(name: string): string {
  switch (name) {
    case 'other':
      return 'untagged';
    case 'cached':
      return 'cached (allocator, free)';
    case 'optimizer_state':
      return 'optimizer state';
    default:
      return name;
  }
}

/** The CSS class of a component's colour. */
export function partClass(name: string): string {
  return `gpumem-c-${name.replace(/[^a-z_]/gi, '_')}`;
}

export interface ChartOptions {
  width: number;
  /** The running cell's reading so far, drawn after the records (dashed, not clickable). */
  live?: { cell: number; now: number; peak: number } | null;
  height: number;
  /** The key of the bar whose cell is the notebook's active cell, drawn selected. */
  selected: string | null;
  /** How many processes the previous bars come from (their label). */
  previousProcesses?: number;
  onClick: (bar: Bar) => void;
  onHover: (bar: Bar | null) => void;
}

function el<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number>,
  parent?: Element
): SVGElementTagNameMap[K] {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) {
    e.setAttribute(k, String(v));
  }
  if (parent) {
    parent.appendChild(e);
  }
  return e;
}

/** A tick step: a power of two in the unit of the largest value, at most five ticks. */
function ticks(max: number): number[] {
  if (max <= 0) {
    return [0];
  }
  const [, p] = unitOf(max);
  let step = 1024 ** p;
  while (max / step > 5) {
    step *= 2;
  }
  while (max / step < 2 && step >= 2) {
    step /= 2;
  }
  const out: number[] = [];
  for (let v = 0; v <= max + 1e-9; v += step) {
    out.push(v);
  }
  return out;
}

/** A site as one line: `64.0 MiB  function (cell 3, line 4)`. */
export function siteText(s: Site): string {
  const where = s.cell !== null && s.cell !== undefined ? ` (cell ${s.cell}${s.line ? `, line ${s.line}` : ''})` : '';
  return `${iec(s.bytes ?? null)}  ${s.function || s.owner || 'unknown'}${where}`;
}

/** What the bar measures, in one line: `all allocations: peak 320 MiB, after 320 MiB`; a record
 * without the allocator's numbers (gpumem-nb not loaded yet) says so, without a number. */
export function quantityText(b: Bar): string {
  if (b.quantity === 'no reading') {
    return 'no memory figures: gpumem-nb was not loaded';
  }
  return `${b.quantity}: peak ${iec(b.peak)}, after ${iec(b.after)}${b.budget !== null ? `, budget ${iec(b.budget)}` : ''}`;
}

/** The words a group of bars is labelled with. */
export function groupLabel(g: BarGroup, processes = 1): string {
  switch (g) {
    case 'previous':
      return processes > 1 ? 'previous processes' : 'previous process';
    case 'saved':
      return 'saved outputs';
    default:
      return 'this process';
  }
}

/** The bar's tooltip: the cell, its failure, peak and after, its parts and its top sites. */
export function barTitle(b: Bar): string {
  const lines = [`[${b.cell}] ${b.firstLine}`.trim()];
  if (b.failure) {
    lines.push(`✗ ${b.failure}`);
  }
  if (b.group !== 'current') {
    lines.push(`(${groupLabel(b.group)})`);
  }
  lines.push(quantityText(b));
  for (const p of b.parts) {
    lines.push(`  ${partLabel(p.name)} ${iec(p.bytes)}`);
  }
  if (b.top.length) {
    lines.push('top sites:');
    for (const s of b.top.slice(0, 3)) {
      lines.push(`  ${siteText(s)}`);
    }
  } else {
    lines.push('no sites (tracking off, or nothing live)');
  }
  if (b.status !== 'ok') {
    lines.push(`status: ${b.status}`);
  }
  return lines.join('\n');
}

/** Draws the chart. */
export function drawChart(bars: Bar[], o: ChartOptions): SVGSVGElement {
  const W = Math.max(160, o.width);
  const H = o.height;
  const left = 58;
  const right = 8;
  // Room for the groups' labels when bars of another process are shown.
  const grouped = bars.some(b => b.group !== 'current');
  const top = grouped ? 24 : 14;
  const bottom = 22;
  const svg = el('svg', { class: 'gpumem-history', width: W, height: H, viewBox: `0 0 ${W} ${H}`, role: 'img' });
  el('rect', { class: 'gpumem-chart-bg', x: 0, y: 0, width: W, height: H }, svg);
  const live = o.live ?? null;
  const max = Math.max(1, ...bars.map(b => Math.max(b.peak, b.after, b.budget ?? 0)), live ? Math.max(live.now, live.peak) : 0);
  const ts = ticks(max * 1.08);
  const top_v = ts[ts.length - 1] > max ? ts[ts.length - 1] : max * 1.08;
  const plotH = H - top - bottom;
  const y = (v: number) => top + plotH - (v / top_v) * plotH;
  for (const t of ts) {
    el('line', { class: 'gpumem-grid', x1: left, x2: W - right, y1: y(t), y2: y(t) }, svg);
    const label = el('text', { class: 'gpumem-axis', x: left - 5, y: y(t) + 4, 'text-anchor': 'end' }, svg);
    label.textContent = t === 0 ? '0' : iec(t).replace(/\.0+\u00a0/, '\u00a0');
  }
  el('line', { class: 'gpumem-axis-line', x1: left, x2: left, y1: top, y2: top + plotH }, svg);
  const n = Math.max(bars.length + (live ? 1 : 0), 1);
  const slot = (W - left - right) / n;
  const bw = Math.max(3, Math.min(30, slot * 0.78));
  const every = Math.max(1, Math.ceil(26 / slot));
  // Each run of bars of one group: a label over it, a line between runs.
  let r = 0;
  while (r < bars.length) {
    let e = r;
    while (e + 1 < bars.length && bars[e + 1].group === bars[r].group) {
      e++;
    }
    if (grouped) {
      const x1 = left + slot * r;
      const x2 = left + slot * (e + 1);
      const t = el(
        'text',
        { class: `gpumem-group-label gpumem-group-${bars[r].group}`, x: (x1 + x2) / 2, y: 10, 'text-anchor': 'middle', 'data-group': bars[r].group },
        svg
      );
      t.textContent = groupLabel(bars[r].group, o.previousProcesses ?? 1);
      if (r > 0) {
        el('line', { class: 'gpumem-group-sep', x1, x2: x1, y1: 2, y2: top + plotH }, svg);
      }
    }
    r = e + 1;
  }
  // Two earlier processes side by side: a fainter line between them.
  for (let i = 1; i < bars.length; i++) {
    if (bars[i].group === bars[i - 1].group && bars[i].process !== bars[i - 1].process) {
      const x = left + slot * i;
      el('line', { class: 'gpumem-process-sep', x1: x, x2: x, y1: top, y2: top + plotH }, svg);
    }
  }
  bars.forEach((b, i) => {
    const cx = left + slot * (i + 0.5);
    const cls = ['gpumem-bar'];
    if (o.selected === b.key) {
      cls.push('gpumem-bar-selected');
    }
    if (b.group !== 'current') {
      cls.push('gpumem-bar-previous');
    }
    if (b.failure) {
      cls.push('gpumem-bar-failed', `gpumem-bar-status-${b.status.replace(/[^a-z]/gi, '_')}`);
    }
    const g = el(
      'g',
      {
        class: cls.join(' '),
        'data-cell': b.cell,
        'data-key': b.key,
        'data-group': b.group,
        'data-status': b.status,
        'data-after': b.after,
        'data-peak': b.peak,
        tabindex: 0
      },
      svg
    );
    el('title', {}, g).textContent = barTitle(b);
    el('rect', { class: 'gpumem-bar-hit', x: cx - slot / 2, y: top, width: slot, height: plotH + bottom }, g);
    if (b.peak > 0) {
      el('rect', { class: 'gpumem-peak', x: cx - bw / 2, y: y(b.peak), width: bw, height: y(0) - y(b.peak) }, g);
    }
    let acc = 0;
    const pw = Math.max(2, bw * 0.64);
    for (const p of b.parts) {
      el(
        'rect',
        {
          class: `gpumem-part ${partClass(p.name)}`,
          x: cx - pw / 2,
          y: y(acc + p.bytes),
          width: pw,
          height: Math.max(0, y(acc) - y(acc + p.bytes)),
          'data-part': p.name,
          'data-bytes': p.bytes
        },
        g
      );
      acc += p.bytes;
    }
    if (b.failure) {
      // Outlined in the error colour, at least a few pixels tall (an OOM may leave nothing),
      // with a ✗ above.
      const h = Math.max(6, y(0) - y(Math.max(b.peak, b.after)));
      el('rect', { class: 'gpumem-fail-outline', x: cx - bw / 2 - 1.5, y: y(0) - h - 1.5, width: bw + 3, height: h + 1.5 }, g);
      const m = el('text', { class: 'gpumem-fail-mark', x: cx, y: Math.max(top - 2, y(0) - h - 4), 'text-anchor': 'middle' }, g);
      m.textContent = '✗';
    }
    if (i % every === 0) {
      const t = el('text', { class: 'gpumem-axis gpumem-cell-label', x: cx, y: H - 7, 'text-anchor': 'middle' }, g);
      t.textContent = String(b.cell);
    }
    g.addEventListener('click', () => o.onClick(b));
    g.addEventListener('keydown', ev => {
      if ((ev as KeyboardEvent).key === 'Enter') {
        o.onClick(b);
      }
    });
    g.addEventListener('mouseenter', () => o.onHover(b));
    g.addEventListener('mouseleave', () => o.onHover(null));
  });
  if (live) {
    const cx = left + slot * (bars.length + 0.5);
    const g = el('g', { class: 'gpumem-livebar', 'data-cell': live.cell, 'data-now': live.now, 'data-peak': live.peak }, svg);
    el('title', {}, g).textContent = `[${live.cell}] running: ${iec(live.now)} now, peak so far ${iec(live.peak)}`;
    if (live.peak > 0) {
      el('rect', { class: 'gpumem-livebar-peak', x: cx - bw / 2, y: y(live.peak), width: bw, height: y(0) - y(live.peak) }, g);
    }
    const pw = Math.max(2, bw * 0.64);
    el('rect', { class: 'gpumem-livebar-now', x: cx - pw / 2, y: y(live.now), width: pw, height: y(0) - y(live.now) }, g);
    const t = el('text', { class: 'gpumem-axis gpumem-cell-label gpumem-livebar-label', x: cx, y: H - 7, 'text-anchor': 'middle' }, g);
    t.textContent = String(live.cell);
  }
  // The budget: a dashed line over each run of cells that had the same one.
  let i = 0;
  while (i < bars.length) {
    const budget = bars[i].budget;
    let j = i;
    while (j + 1 < bars.length && bars[j + 1].budget === budget && bars[j + 1].group === bars[i].group) {
      j++;
    }
    if (budget !== null) {
      const x1 = left + slot * i;
      const x2 = left + slot * (j + 1);
      el('line', { class: 'gpumem-budget', x1, x2, y1: y(budget), y2: y(budget), 'data-bytes': budget }, svg);
      const t = el('text', { class: 'gpumem-budget-label', x: x2 - 2, y: y(budget) - 3, 'text-anchor': 'end' }, svg);
      t.textContent = `budget ${iec(budget)}`;
    }
    i = j + 1;
  }
  return svg;
}
