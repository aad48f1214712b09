// What gpumem-kernel sends: the per-cell record (application/vnd.gpumem.cell+json, schema in
// src/notebook/report/record.rs, `CellRecord`) and the live line's figures
// (application/vnd.gpumem.live+json, kernel/src/cell/live.rs, `figures`). Every field may be
// missing or null: the panel shows "n/a" for a number the kernel did not send, never one of its own.

export const CELL_MIME = 'application/vnd.gpumem.cell+json';
export const LIVE_MIME = 'application/vnd.gpumem.live+json';

/** Bytes, or nothing where the kernel had no reading. */
export type Bytes = number | null | undefined;

export interface Span {
  before?: Bytes;
  after?: Bytes;
}

/** One entry of a record's `top`: who holds the bytes, and the notebook line that made them. */
export interface Site {
  owner?: string | null;
  bytes?: number | null;
  function?: string | null;
  cell?: number | null;
  line?: number | null;
  component?: string | null;
}

export interface ComponentDelta {
  component: string;
  before?: Bytes;
  after?: Bytes;
  peak?: Bytes;
}

export interface AllAllocations {
  tracking?: string;
  device?: number | null;
  before?: Bytes;
  after?: Bytes;
  peak?: Bytes;
  by_component?: ComponentDelta[];
  top?: Site[];
}

export interface AllocatorPart {
  device?: number;
  backend?: string;
  allocated?: Span;
  reserved?: Span;
  peak_allocated?: Bytes;
  peak_reserved?: Bytes;
}

export interface PoolPart {
  used?: Span;
  reserved?: Span;
  used_high?: Bytes;
  reserved_high?: Bytes;
}

export interface NvmlPart {
  uuid?: string | null;
  name?: string | null;
  process?: Span;
  others_after?: Bytes;
  device_free?: Bytes;
  device_total?: Bytes;
  unavailable?: string | null;
}

export interface Sources {
  allocator?: string;
  pool?: string;
  process?: string;
  device?: string;
}

export interface CellRecord {
  cell: number;
  label?: string;
  first_line?: string;
  status?: string;
  device?: string;
  sources?: Sources;
  allocator?: AllocatorPart | null;
  all_allocations?: AllAllocations | null;
  pool?: PoolPart | null;
  nvml?: NvmlPart;
  crate_device_free?: Bytes;
  crate_device_total?: Bytes;
  wall_ms?: number;
  hook_us?: number;
  budget?: Bytes;
  warnings?: string[];
  source_hash?: string;
  restarted?: boolean;
}

export interface LiveFigures {
  cell: number;
  elapsed_ms?: number;
  building?: boolean;
  device?: string;
  allocated?: Bytes;
  reserved?: Bytes;
  peak_allocated?: Bytes;
  peak_reserved?: Bytes;
  all_allocations?: Bytes;
  all_allocations_peak?: Bytes;
  process?: Bytes;
  device_free?: Bytes;
  device_total?: Bytes;
}

/** A record found in an output bundle (a display_data's or update_display_data's `data`). */
export function recordOf(data: unknown): CellRecord | null {
  const r = bundleItem(data, CELL_MIME);
  return r && typeof r.cell === 'number' ? (r as unknown as CellRecord) : null;
}

/** Live figures found in an output bundle. */
export function liveOf(data: unknown): LiveFigures | null {
  const r = bundleItem(data, LIVE_MIME);
  return r && typeof r.cell === 'number' ? (r as unknown as LiveFigures) : null;
}

function bundleItem(data: unknown, mime: string): Record<string, unknown> | null {
  if (!data || typeof data !== 'object') {
    return null;
  }
  const v = (data as Record<string, unknown>)[mime];
  return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
}

/** A number the kernel sent, or null (missing, null, not a number). */
export function num(v: unknown): number | null {
  return typeof v === 'number' && isFinite(v) ? v : null;
}

/** The figures the panel's top block shows, by key. */
export type FigureKey = 'allocated' | 'reserved' | 'pool' | 'all_allocations' | 'process' | 'device_free' | 'device_total';

export interface Figure {
  key: FigureKey;
  label: string;
  bytes: number | null;
  /** The cell's peak (so far, while live). */
  peak: number | null;
  /** Where the number comes from, as the record names it. */
  source: string;
}

/** Device free and total after the cell: NVML first, else the crate (`device_free_total`). */
export function deviceFreeTotal(r: CellRecord): [number | null, number | null] {
  const nf = num(r.nvml?.device_free);
  const nt = num(r.nvml?.device_total);
  if (nf !== null && nt !== null) {
    return [nf, nt];
  }
  return [num(r.crate_device_free), num(r.crate_device_total)];
}

function trackingSource(tracking: string | undefined): string {
  if (!tracking) {
    return 'tracking: not reported';
  }
  return `every allocation of the process (tracking: ${tracking})`;
}

/** The after-values of a record, each with its source. */
export function recordFigures(r: CellRecord): Figure[] {
  const s = r.sources ?? {};
  const a = r.allocator ?? null;
  const all = r.all_allocations ?? null;
  const [free, total] = deviceFreeTotal(r);
  const allocSource = s.allocator || 'gpumem-nb allocator';
  const out: Figure[] = [
    { key: 'allocated', label: 'allocated', bytes: num(a?.allocated?.after), peak: num(a?.peak_allocated), source: allocSource },
    { key: 'reserved', label: 'reserved', bytes: num(a?.reserved?.after), peak: num(a?.peak_reserved), source: allocSource },
    {
      key: 'all_allocations',
      label: 'all allocations',
      bytes: num(all?.after),
      peak: num(all?.peak),
      source: all ? trackingSource(all.tracking) : 'tracking: gpumem-nb not loaded'
    }
  ];
  if (r.pool) {
    out.push({
      key: 'pool',
      label: 'CUDA pool',
      bytes: num(r.pool.used?.after),
      peak: num(r.pool.used_high),
      source: s.pool || 'CUDA stream-ordered pool'
    });
  }
  out.push(
    { key: 'process', label: 'process (NVML)', bytes: num(r.nvml?.process?.after), peak: null, source: s.process || r.nvml?.unavailable || 'NVML' },
    { key: 'device_free', label: 'device free', bytes: free, peak: null, source: s.device || 'device' },
    { key: 'device_total', label: 'device total', bytes: total, peak: null, source: s.device || 'device' }
  );
  return out;
}

/** The live figures, the sources named as the last record named them (the same readings). */
export function liveFiguresOf(l: LiveFigures, last: CellRecord | null): Figure[] {
  const s = last?.sources ?? {};
  const tracking = last?.all_allocations?.tracking;
  const allocSource = s.allocator || 'gpumem-nb allocator';
  const out: Figure[] = [
    { key: 'allocated', label: 'allocated', bytes: num(l.allocated), peak: num(l.peak_allocated), source: allocSource },
    { key: 'reserved', label: 'reserved', bytes: num(l.reserved), peak: num(l.peak_reserved), source: allocSource },
    {
      key: 'all_allocations',
      label: 'all allocations',
      bytes: num(l.all_allocations),
      peak: num(l.all_allocations_peak),
      source: trackingSource(tracking)
    }
  ];
  if (last?.pool) {
    out.push({ key: 'pool', label: 'CUDA pool', bytes: null, peak: null, source: 'not read while a cell runs; after the cell' });
  }
  out.push(
    { key: 'process', label: 'process (NVML)', bytes: num(l.process), peak: null, source: s.process || 'NVML per-process' },
    { key: 'device_free', label: 'device free', bytes: num(l.device_free), peak: null, source: s.device || 'device' },
    { key: 'device_total', label: 'device total', bytes: num(l.device_total), peak: null, source: s.device || 'device' }
  );
  return out;
}

/** What the process holds on its device, for the status bar: NVML's bytes of the process where
 * NVML sees it (more than zero), else every tracked allocation, else the allocator's reserved
 * bytes (the kernel's own choice, `live::held`); and the device's total. */
export function held(figs: Figure[]): { bytes: number | null; total: number | null; what: string } {
  const get = (k: FigureKey) => figs.find(f => f.key === k) ?? null;
  const process = get('process');
  const all = get('all_allocations');
  const reserved = get('reserved');
  const total = get('device_total')?.bytes ?? null;
  if (process && process.bytes !== null && process.bytes > 0) {
    return { bytes: process.bytes, total, what: `process (${process.source})` };
  }
  if (all && all.bytes !== null) {
    return { bytes: all.bytes, total, what: `all allocations (${all.source})` };
  }
  if (reserved && reserved.bytes !== null) {
    return { bytes: reserved.bytes, total, what: `reserved (${reserved.source})` };
  }
  return { bytes: null, total, what: 'no reading' };
}

/** One bar of the history chart. */
export interface Part {
  name: string;
  bytes: number;
}

export interface Bar {
  cell: number;
  /** What the bar measures: `all allocations` (tracking) or `reserved` (the allocator). */
  quantity: string;
  after: number;
  peak: number;
  parts: Part[];
  budget: number | null;
  top: Site[];
  firstLine: string;
  status: string;
}

/** A record as a bar: every tracked allocation by component where tracking is on, else the
 * allocator's reserved bytes as allocated and cached. */
export function barOf(r: CellRecord): Bar {
  const all = r.all_allocations ?? null;
  const a = r.allocator ?? null;
  const base = {
    cell: r.cell,
    budget: num(r.budget),
    top: all?.top ?? [],
    firstLine: r.first_line ?? '',
    status: r.status ?? 'ok'
  };
  const allAfter = num(all?.after);
  if (all && allAfter !== null) {
    const parts: Part[] = [];
    for (const c of all.by_component ?? []) {
      const b = num(c.after);
      if (b !== null && b > 0) {
        parts.push({ name: c.component, bytes: b });
      }
    }
    const listed = parts.reduce((s, p) => s + p.bytes, 0);
    if (listed < allAfter) {
      parts.push({ name: parts.length ? 'unclassified' : 'all allocations', bytes: allAfter - listed });
    }
    return { ...base, quantity: 'all allocations', after: allAfter, peak: Math.max(num(all.peak) ?? allAfter, allAfter), parts };
  }
  const reserved = num(a?.reserved?.after);
  const allocated = num(a?.allocated?.after);
  if (reserved !== null) {
    const parts: Part[] = [];
    if (allocated !== null && allocated > 0) {
      parts.push({ name: 'allocated', bytes: allocated });
    }
    if (reserved - (allocated ?? 0) > 0) {
      parts.push({ name: 'cached', bytes: reserved - (allocated ?? 0) });
    }
    return { ...base, quantity: 'reserved', after: reserved, peak: Math.max(num(a?.peak_reserved) ?? reserved, reserved), parts };
  }
  return { ...base, quantity: 'no reading', after: 0, peak: 0, parts: [] };
}
