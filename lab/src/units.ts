// Sizes as people read them: binary units (KiB, MiB, GiB, TiB), three significant digits, as
// the kernel's report line writes them (units::iec3).

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** The unit a size reads in, and its power of 1024. */
export function unitOf(bytes: number): [string, number] {
  let i = 0;
  while (i < UNITS.length - 1 && Math.abs(bytes) >= 1024 ** (i + 1)) {
    i++;
  }
  return [UNITS[i], i];
}

/** `160 MiB`, `64.0 MiB`, `8.00 GiB`, `512 B`; `n/a` for no number. */
export function iec(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined) {
    return 'n/a';
  }
  const [unit, p] = unitOf(bytes);
  if (p === 0) {
    return `${bytes} B`;
  }
  return `${digits3(bytes / 1024 ** p)}\u00a0${unit}`;
}

function digits3(v: number): string {
  const a = Math.abs(v);
  return v.toFixed(a >= 99.95 ? 0 : a >= 9.995 ? 1 : 2);
}

/** A short number in a given power of 1024, for `GPU 3.2 / 80 GiB`: one decimal below 10,
 * none from 10 (a whole number loses its `.0`). */
export function short(bytes: number, p: number): string {
  const v = bytes / 1024 ** p;
  const s = v < 10 ? v.toFixed(1) : v.toFixed(0);
  return s.endsWith('.0') ? s.slice(0, -2) : s;
}

/** `GPU 3.2 / 80 GiB`: what the process holds over the device's total, in the total's unit
 * (the held figure in its own unit when it is too small to read in it: `GPU 40 MiB / 8 GiB`). */
export function statusText(held: number | null, total: number | null): string {
  if (held === null && total === null) {
    return 'GPU n/a';
  }
  if (total === null) {
    return `GPU ${iec(held)}`;
  }
  const [unit, p] = unitOf(total);
  if (held === null) {
    return `GPU n/a / ${short(total, p)} ${unit}`;
  }
  if (held > 0 && held < 0.05 * 1024 ** p && p > 0) {
    const [hu, hp] = unitOf(held);
    return `GPU ${short(held, hp)} ${hu} / ${short(total, p)} ${unit}`;
  }
  return `GPU ${short(held, p)} / ${short(total, p)} ${unit}`;
}
