// What gpumem-kernel sends: the per-cell record (application/vnd.gpumem.cell+json, schema in
// src/notebook/report/record.rs, `CellRecord`), the live line's figures
// (application/vnd.gpumem.live+json, kernel/src/cell/live.rs, `figures`), the note of a fresh
// notebook process (application/vnd.gpumem.session+json, `%gpumem restart`) and the `gpumem`
// object of its kernel_info reply (kernel/src/jupyter/kernel.rs: the notebook process's pid and
// the newest record of a cell that ran in it). Every field may be missing or null: the panel
// shows "n/a" for a number the kernel did not send, never one of its own.

export const CELL_MIME = 'application/vnd.gpumem.cell+json';
export const LIVE_MIME = 'application/vnd.gpumem.live+json';
export const SESSION_MIME = 'application/vnd.gpumem.session+json';

/** Bytes, or nothing where the kernel had no reading. */
export type Bytes = number | null | undefined;

export interface Span<T = Bytes> {
  before?: T;
  after?: T;
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

/** One owner's bytes over a cell (`all_allocations.by_owner`): who holds the device memory, by
 * the framework's word (`candle`, `burn/cubecl`, `cudarc`, `cuBLAS`, `gpumem-nb`, …). */
export interface OwnerDelta {
  owner: string;
  before?: Bytes;
  after?: Bytes;
  peak?: Bytes;
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
  /** Largest first after the cell; the `after`s add up to `after`. */
  by_owner?: OwnerDelta[];
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

/** A cell's first out-of-memory failure (`oom`, on `status: oom` cells). */
export interface OomEvent {
  device?: number;
  count?: number;
  requested?: number;
  device_free?: Bytes;
  device_total?: Bytes;
  why?: string;
  /** The driver entry point that refused (a framework's out-of-memory), else null. */
  api?: string | null;
  /** Who asked, in the framework's word. */
  owner?: string | null;
  /** Where it was asked for. */
  site?: Site | null;
}

/** How a cell ended. */
export type CellStatus = 'ok' | 'error' | 'panicked' | 'oom' | 'lost' | 'refused';

export interface CellRecord {
  cell: number;
  label?: string;
  first_line?: string;
  status?: CellStatus | string;
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
  oom?: OomEvent | null;
  /** The notebook process the record came from (its pid after the cell). */
  child_pid?: number | null;
  child_pid_before?: number | null;
  /** The notebook process was replaced during the cell (crash, interrupt, restart). */
  restarted?: boolean;
  restart_reason?: string | null;
  crate_loaded?: Span<boolean>;
  crate_declared?: boolean;
}

/** `%gpumem restart`'s note: the notebook process is a fresh one. */
export interface SessionNote {
  child_pid?: number | null;
  reason?: string | null;
}

/** The `gpumem` object of gpumem-kernel's kernel_info reply: the live notebook process. */
export interface KernelGpumem {
  /** The notebook process's pid now (null before it started). */
  child_pid?: number | null;
  /** The newest record of a cell that ran in that process, or null: it has run none. */
  record?: CellRecord | null;
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

/** `%gpumem restart`'s note found in an output bundle. */
export function sessionNoteOf(data: unknown): SessionNote | null {
  const r = bundleItem(data, SESSION_MIME);
  return r ? (r as unknown as SessionNote) : null;
}

/** The `gpumem` object of a kernel_info reply's content, or null (another kernel, or a
 * gpumem-kernel from before it said which process is live). */
export function kernelGpumemOf(content: unknown): KernelGpumem | null {
  if (!content || typeof content !== 'object') {
    return null;
  }
  const g = (content as Record<string, unknown>).gpumem;
  if (!g || typeof g !== 'object' || Array.isArray(g)) {
    return null;
  }
  const o = g as Record<string, unknown>;
  const rec = o.record && typeof o.record === 'object' && typeof (o.record as Record<string, unknown>).cell === 'number'
    ? (o.record as CellRecord)
    : null;
  return { child_pid: num(o.child_pid), record: rec };
}

/** Whether two records are one (the same cell of the same process, the same run). */
export function sameRecord(a: CellRecord, b: CellRecord): boolean {
  return (
    a.cell === b.cell &&
    a.source_hash === b.source_hash &&
    a.wall_ms === b.wall_ms &&
    (a.child_pid ?? null) === (b.child_pid ?? null)
  );
}

/** PyTorch's `format_size` (the out-of-memory error's unit, as the report line writes it):
 * `200.00 GiB`, `512.00 MiB`. */
export function formatSize(size: number): string {
  const KIB = 1024;
  if (size <= KIB) {
    return `${size} bytes`;
  }
  if (size <= KIB ** 2) {
    return `${(size / KIB).toFixed(2)} KiB`;
  }
  if (size <= KIB ** 3) {
    return `${(size / KIB ** 2).toFixed(2)} MiB`;
  }
  return `${(size / KIB ** 3).toFixed(2)} GiB`;
}

/** A failed cell's mark, in words: `out of memory: asked for 200.00 GiB`, `panicked`, …; null
 * for a cell that ran to its end. */
export function failureText(r: CellRecord): string | null {
  const status = r.status ?? 'ok';
  switch (status) {
    case 'ok':
      return null;
    case 'oom': {
      const o = r.oom ?? null;
      const asked = num(o?.requested);
      let t = asked !== null ? `out of memory: asked for ${formatSize(asked)}` : 'out of memory';
      const count = num(o?.count);
      if (count !== null && count > 1) {
        t += ` (${count} failures)`;
      }
      if (o?.owner) {
        t += ` by ${o.owner}`;
      }
      return t;
    }
    case 'panicked':
      return 'panicked';
    case 'lost':
      return 'the CUDA context was lost';
    case 'refused':
      return 'refused: the CUDA context was lost before';
    case 'error':
      return 'error';
    default:
      return String(status);
  }
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

/** The figures the panel's top block shows, by key (an owner's: `owner:<word>`). */
export type FigureKey =
  | 'allocated'
  | 'reserved'
  | 'pool'
  | 'all_allocations'
  | 'process'
  | 'device_free'
  | 'device_total'
  | `owner:${string}`;

export interface Figure {
  key: FigureKey;
  label: string;
  bytes: number | null;
  /** The cell's peak (so far, while live). */
  peak: number | null;
  /** Where the number comes from, as the record names it. */
  source: string;
  /** Kept for the status bar's choice, not shown (gpumem-nb's allocator holding nothing). */
  hidden?: boolean;
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

/** Who holds the device memory after the cell, largest first: the owners with bytes. */
export function ownersOf(r: CellRecord): OwnerDelta[] {
  const out: OwnerDelta[] = [];
  for (const o of r.all_allocations?.by_owner ?? []) {
    const b = num(o.after);
    if (o && typeof o.owner === 'string' && b !== null && b > 0) {
      out.push(o);
    }
  }
  return out.sort((a, b) => (num(b.after) ?? 0) - (num(a.after) ?? 0));
}

/** The after-values of a record, each with its source: who holds the memory first (the
 * owners of every tracked allocation, then their total), gpumem-nb's allocator where it holds
 * memory, the CUDA pool, NVML's figure of the process, the device. */
export function recordFigures(r: CellRecord): Figure[] {
  const s = r.sources ?? {};
  const a = r.allocator ?? null;
  const all = r.all_allocations ?? null;
  const [free, total] = deviceFreeTotal(r);
  const allocSource = s.allocator || 'gpumem-nb allocator';
  const tracking = all ? trackingSource(all.tracking) : 'tracking: not reported';
  const out: Figure[] = [];
  for (const o of ownersOf(r)) {
    out.push({ key: `owner:${o.owner}`, label: o.owner, bytes: num(o.after), peak: num(o.peak), source: `held by ${o.owner}: ${tracking}` });
  }
  out.push({ key: 'all_allocations', label: 'all allocations', bytes: num(all?.after), peak: num(all?.peak), source: tracking });
  // gpumem-nb's allocator: only where it holds memory (a notebook that never used it has
  // `allocator: null`, or nothing reserved).
  const reserved = num(a?.reserved?.after);
  const unused = !a || !reserved;
  out.push(
    { key: 'allocated', label: 'gpumem-nb allocated', bytes: num(a?.allocated?.after), peak: num(a?.peak_allocated), source: allocSource, hidden: unused },
    { key: 'reserved', label: 'gpumem-nb reserved', bytes: reserved, peak: num(a?.peak_reserved), source: allocSource, hidden: unused }
  );
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

/** The live figures, the sources named as the last record named them (the same readings). The
 * live line has no owners: every allocation leads. */
export function liveFiguresOf(l: LiveFigures, last: CellRecord | null): Figure[] {
  const s = last?.sources ?? {};
  const tracking = last?.all_allocations?.tracking;
  const allocSource = s.allocator || 'gpumem-nb allocator';
  const unused = !num(l.reserved);
  const out: Figure[] = [
    {
      key: 'all_allocations',
      label: 'all allocations',
      bytes: num(l.all_allocations),
      peak: num(l.all_allocations_peak),
      source: trackingSource(tracking)
    },
    { key: 'allocated', label: 'gpumem-nb allocated', bytes: num(l.allocated), peak: num(l.peak_allocated), source: allocSource, hidden: unused },
    { key: 'reserved', label: 'gpumem-nb reserved', bytes: num(l.reserved), peak: num(l.peak_reserved), source: allocSource, hidden: unused }
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
  /** The failed cell's mark in words (`out of memory: asked for 200.00 GiB`), null when ok. */
  failure: string | null;
  /** Which process the bar is of: the live one, an earlier one, or saved outputs unconfirmed. */
  group: BarGroup;
  /** A key unique over every bar shown (the cell number repeats across processes). */
  key: string;
  /** Which process (the panel's numbering): bars of two processes are drawn apart. */
  process?: number;
}

/** The live notebook process's bars, an earlier process's, or saved outputs no live kernel
 * vouched for. */
export type BarGroup = 'current' | 'previous' | 'saved';

/** A record as a bar: every tracked allocation by component where tracking is on, else the
 * allocator's reserved bytes as allocated and cached. */
export function barOf(r: CellRecord, group: BarGroup = 'current', key: string = String(r.cell)): Bar {
  const all = r.all_allocations ?? null;
  const a = r.allocator ?? null;
  const base = {
    cell: r.cell,
    budget: num(r.budget),
    top: all?.top ?? [],
    firstLine: r.first_line ?? '',
    status: r.status ?? 'ok',
    failure: failureText(r),
    group,
    key
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
