// The right sidebar's "GPU memory" panel: what the active notebook's live process holds now (live
// while a cell runs, else its last record's after-values, who holds the memory first), then the
// per-cell history chart: this process's bars, an earlier process's apart, failed cells marked
// and listed. Every number on it is a number of a record or of a live reading, carried in
// `data-bytes`.

import { Widget } from '@lumino/widgets';
import { Message } from '@lumino/messaging';
import { Entry, NotebookGpu, keyOf } from './model';
import { Bar, BarGroup, Figure, barOf, failureText, liveFiguresOf, num, recordFigures } from './records';
import { barTitle, drawChart, groupLabel, partClass, partLabel, quantityText, siteText } from './chart';
import { iec } from './units';

/** At most this many bars of earlier processes (the newest). */
const MAX_PREVIOUS = 24;

/** The live process, in words. */
function processText(pid: number | null): string {
  return pid === null ? 'Live process: a new one' : `Live process: pid ${pid}`;
}

export interface PanelOptions {
  /** Brings the notebook to the front once one of its cells is selected from the chart. */
  activate: (state: NotebookGpu) => void;
}

function div(cls: string, parent: HTMLElement, text?: string): HTMLDivElement {
  const d = document.createElement('div');
  d.className = cls;
  if (text !== undefined) {
    d.textContent = text;
  }
  parent.appendChild(d);
  return d;
}

export class GpuPanel extends Widget {
  constructor(private readonly options: PanelOptions) {
    super();
    this.addClass('gpumem-panel');
    this.node.tabIndex = -1;
    const head = div('gpumem-panel-head', this.node);
    div('gpumem-panel-title', head, 'GPU memory');
    this._where = div('gpumem-panel-where', head);
    this._message = div('gpumem-panel-message', this.node);
    this._now = div('gpumem-panel-now', this.node);
    this._history = div('gpumem-panel-history', this.node);
    const h = div('gpumem-panel-subtitle', this._history, 'Per-cell history');
    h.title = 'One bar per cell: the bytes after it by component, its peak outlined behind, the budget dashed';
    this._legend = div('gpumem-legend', this._history);
    this._chart = div('gpumem-chart-box', this._history);
    this._failed = div('gpumem-failed', this._history);
    this._hover = div('gpumem-hover', this._history);
    this._render();
  }

  /** The notebook the panel shows (the active one), or null. */
  setNotebook(state: NotebookGpu | null): void {
    if (state === this._state) {
      return;
    }
    if (this._state) {
      this._state.changed.disconnect(this._schedule, this);
      this._state.panel.content.activeCellChanged.disconnect(this._schedule, this);
    }
    this._state = state;
    this._chartKey = '';
    if (state) {
      state.changed.connect(this._schedule, this);
      state.panel.content.activeCellChanged.connect(this._schedule, this);
    }
    this._render();
  }

  protected onAfterShow(_: Message): void {
    this._chartKey = '';
    this._render();
  }

  protected onResize(_: Message): void {
    this._schedule();
  }

  private _schedule(): void {
    // Hidden, nothing is drawn: showing the panel draws it afresh (onAfterShow).
    if (this._frame || !this.isVisible) {
      return;
    }
    // A timer rather than an animation frame: frames pause in a hidden tab, readings do not.
    this._frame = window.setTimeout(() => {
      this._frame = 0;
      this._render();
    }, 20);
  }

  private _render(): void {
    const s = this._state;
    const node = this.node;
    const show = (what: 'message' | 'figures') => {
      this._message.style.display = what === 'message' ? '' : 'none';
      this._now.style.display = what === 'figures' ? '' : 'none';
      this._history.style.display = what === 'figures' ? '' : 'none';
    };
    if (!s) {
      node.dataset.state = 'no-notebook';
      this._where.textContent = '';
      this._message.textContent = 'Open a notebook to see the GPU memory of its kernel.';
      show('message');
      return;
    }
    const k = s.kernel;
    node.dataset.state = k.kind;
    node.dataset.notebook = s.panel.context.path;
    node.dataset.kernelId = s.panel.sessionContext.session?.kernel?.id ?? '';
    this._where.textContent = s.panel.context.path.split('/').pop() ?? '';
    this._where.title = s.panel.context.path;
    if (k.kind === 'other') {
      this._message.textContent = `This notebook's kernel is ${k.name}, not gpumem-kernel${k.implementation ? ` (it is ${k.implementation})` : ''}: no GPU memory figures.`;
      show('message');
      return;
    }
    if (k.kind === 'none' && !s.previous.length) {
      this._message.textContent = 'This notebook has no kernel.';
      show('message');
      return;
    }
    if (k.kind === 'pending') {
      this._message.textContent = `Waiting for the kernel${k.name ? ` (${k.name})` : ''}…`;
      show('message');
      return;
    }
    show('figures');
    this._renderNow(s);
    this._renderHistory(s);
  }

  private _renderNow(s: NotebookGpu): void {
    const now = this._now;
    now.textContent = '';
    const live = s.kernel.kind === 'gpumem' ? s.live : null;
    const proc = s.process;
    const last = s.last;
    const saved = s.lastSaved;
    let figs: Figure[];
    let status: string;
    let failure: string | null = null;
    // Whose figures these are: the live notebook process, or saved outputs nothing vouched for.
    const procLine = (text: string, cls = '') => {
      const d = div(`gpumem-now-process${cls}`, now, text);
      d.title = text;
    };
    now.dataset.pid = proc.pid === null ? '' : String(proc.pid);
    now.dataset.held = '';
    if (s.kernel.kind !== 'gpumem') {
      now.dataset.source = 'saved';
    } else {
      now.dataset.source = proc.known ? 'kernel' : 'saved';
    }
    if (live && !live.building) {
      figs = liveFiguresOf(live, last?.record ?? null);
      now.dataset.mode = 'live';
      now.dataset.cell = String(live.cell);
      status = `[${live.cell}] running · ${((live.elapsed_ms ?? 0) / 1000).toFixed(1)} s · ${live.device ?? ''}`;
      procLine(processText(proc.pid));
    } else if (last) {
      figs = recordFigures(last.record);
      now.dataset.mode = 'record';
      now.dataset.cell = String(last.record.cell);
      const r = last.record;
      const running = live && live.building ? ` · [${live.cell}] compiling dependencies, ${((live.elapsed_ms ?? 0) / 1000).toFixed(0)} s` : '';
      status = `after [${r.cell}] · ${((r.wall_ms ?? 0) / 1000).toFixed(2)} s · ${r.device ?? ''}${running}`;
      failure = failureText(r);
      procLine(processText(proc.pid ?? num(r.child_pid)));
    } else if (saved && !(s.kernel.kind === 'gpumem' && proc.known)) {
      // No live gpumem kernel said which process is its own: the saved outputs, as saved.
      figs = recordFigures(saved.record);
      now.dataset.mode = 'saved';
      now.dataset.cell = String(saved.record.cell);
      const r = saved.record;
      status = `saved [${r.cell}] · ${r.device ?? ''}`;
      failure = failureText(r);
      procLine(
        s.kernel.kind === 'gpumem'
          ? 'Saved outputs: the kernel has not said which notebook process is live; not its figures now.'
          : 'Saved outputs of an earlier kernel (no live kernel): not figures of now.',
        ' gpumem-now-saved'
      );
    } else {
      now.dataset.mode = 'none';
      now.dataset.cell = '';
      const running = live && live.building ? ` [${live.cell}] is compiling dependencies.` : '';
      if (proc.known) {
        // A fresh notebook process has run no cell: it holds no device memory (the kernel's
        // tracking opens no device and makes no CUDA context before a cell does).
        now.dataset.held = '0';
        procLine(processText(proc.pid));
        if (proc.why) {
          div('gpumem-now-note', now, `New: ${proc.why}.`);
        }
        div('gpumem-now-status gpumem-now-nothing', now, `Nothing held: this process has run no cell yet.${running}`);
        if (s.previous.length) {
          div('gpumem-now-note', now, `The chart keeps the bars of the ${groupLabel('previous', s.previousProcesses)} apart: not figures of now.`);
        }
      } else {
        div('gpumem-now-status', now, `No cell has reported yet: run a cell.${running}`);
      }
      return;
    }
    now.dataset.updates = String(s.liveUpdates);
    const st = div(`gpumem-now-status${live && !live.building ? ' gpumem-now-live' : ''}`, now, status);
    if (failure) {
      const f = document.createElement('span');
      f.className = 'gpumem-now-failed';
      f.textContent = ` · ✗ ${failure}`;
      st.appendChild(f);
    }
    const list = div('gpumem-figures', now);
    let heldBytes: number | null = null;
    for (const f of figs) {
      if (f.key === 'all_allocations') {
        heldBytes = f.bytes;
      }
      if (f.hidden) {
        continue;
      }
      const row = div(`gpumem-fig${f.key.startsWith('owner:') ? ' gpumem-fig-owner' : ''}`, list);
      row.dataset.key = f.key;
      row.dataset.bytes = f.bytes === null ? '' : String(f.bytes);
      row.dataset.peak = f.peak === null ? '' : String(f.peak);
      div('gpumem-fig-label', row, f.label);
      const value = div('gpumem-fig-value', row, iec(f.bytes));
      if (f.peak !== null && f.bytes !== null && f.peak > f.bytes) {
        const p = document.createElement('span');
        p.className = 'gpumem-fig-peak';
        p.textContent = ` peak ${iec(f.peak)}`;
        value.appendChild(p);
      }
      const src = div('gpumem-fig-source', row, f.source);
      src.title = f.source;
    }
    now.dataset.held = heldBytes === null ? '' : String(heldBytes);
    if (heldBytes === 0) {
      div('gpumem-now-note', now, 'Nothing held: no device allocation of the process is live.');
    }
    const shownRecord = live && !live.building ? null : (last ?? saved);
    const warnings = shownRecord ? shownRecord.record.warnings ?? [] : [];
    for (const w of warnings) {
      div('gpumem-now-warning', now, `⚠ ${w}`);
    }
  }

  /** The bars: an earlier process's (or saved outputs') first, then the live process's. */
  private _bars(s: NotebookGpu): { bars: Bar[]; entries: Entry[] } {
    const prevGroup: BarGroup = s.process.known && s.kernel.kind === 'gpumem' ? 'previous' : 'saved';
    const previous = s.previous.slice(-MAX_PREVIOUS);
    const current = s.kernel.kind === 'gpumem' ? s.entries : [];
    const entries = [...previous, ...current];
    const bars = entries.map((e, i) => ({ ...barOf(e.record, i < previous.length ? prevGroup : 'current', keyOf(e)), process: e.session }));
    return { bars, entries };
  }

  private _renderHistory(s: NotebookGpu): void {
    const { bars, entries } = this._bars(s);
    const active = s.panel.content.activeCell;
    const selectedEntry = active ? entries.filter(e => e.cellId === active.model.id).pop() ?? null : null;
    const selected = selectedEntry ? keyOf(selectedEntry) : null;
    const width = Math.max(200, this._chart.clientWidth || this.node.clientWidth - 24);
    // The running cell, as it stands: every allocation where tracked, else reserved.
    const l = s.kernel.kind === 'gpumem' && s.live && !s.live.building ? s.live : null;
    const lnow = l ? num(l.all_allocations) ?? num(l.reserved) : null;
    const live =
      l && lnow !== null
        ? { cell: l.cell, now: lnow, peak: Math.max(lnow, (num(l.all_allocations) !== null ? num(l.all_allocations_peak) : num(l.peak_reserved)) ?? lnow) }
        : null;
    const key = `${bars.map(b => `${b.key}:${b.group}`).join(',')}|${entries.map(e => e.seq).join(',')}|${selected}|${width}|${live ? `${live.cell}:${live.now}:${live.peak}` : ''}`;
    if (key === this._chartKey) {
      return;
    }
    this._chartKey = key;
    this._history.dataset.bars = String(bars.filter(b => b.group === 'current').length);
    this._history.dataset.previous = String(bars.filter(b => b.group !== 'current').length);
    this._chart.textContent = '';
    this._legend.textContent = '';
    this._failed.textContent = '';
    if (!bars.length && !live) {
      div('gpumem-hover-hint', this._chart, 'No cell records yet.');
      this._hover.textContent = '';
      return;
    }
    const names: string[] = [];
    for (const b of bars) {
      for (const p of b.parts) {
        if (!names.includes(p.name)) {
          names.push(p.name);
        }
      }
    }
    const item = (cls: string, label: string) => {
      const it = div('gpumem-legend-item', this._legend);
      const sw = document.createElement('span');
      sw.className = `gpumem-swatch ${cls}`;
      it.appendChild(sw);
      it.appendChild(document.createTextNode(label));
    };
    for (const n of names) {
      item(partClass(n), partLabel(n));
    }
    item('gpumem-swatch-peak', 'peak');
    if (bars.some(b => b.budget !== null)) {
      item('gpumem-swatch-budget', 'budget');
    }
    if (bars.some(b => b.failure)) {
      item('gpumem-swatch-failed', 'failed');
    }
    if (live) {
      item('gpumem-swatch-live', `[${live.cell}] running`);
    }
    const svg = drawChart(bars, {
      width,
      height: 200,
      selected,
      live,
      previousProcesses: s.previousProcesses,
      onClick: b => this._select(b),
      onHover: b => this._showHover(b)
    });
    this._chart.appendChild(svg);
    // The failed cells, as a list under the chart (newest process last).
    const failed = bars.filter(b => b.failure);
    if (failed.length) {
      div('gpumem-failed-title', this._failed, 'Failed cells');
      for (const b of failed) {
        const it = div(`gpumem-failed-item${b.group !== 'current' ? ' gpumem-failed-previous' : ''}`, this._failed);
        it.dataset.cell = String(b.cell);
        it.dataset.key = b.key;
        it.dataset.status = b.status;
        it.textContent = `✗ [${b.cell}] ${b.failure}${b.group !== 'current' ? ` (${groupLabel(b.group)})` : ''}`;
        it.title = barTitle(b);
        it.addEventListener('click', () => this._select(b));
      }
    }
    this._showHover(null);
  }

  private _showHover(b: Bar | null): void {
    const h = this._hover;
    h.textContent = '';
    if (!b) {
      h.dataset.cell = '';
      div('gpumem-hover-hint', h, 'Hover a bar for its cell and top sites; click it to go to the cell.');
      return;
    }
    h.dataset.cell = String(b.cell);
    h.dataset.key = b.key;
    const lines = barTitle(b).split('\n');
    div('gpumem-hover-head', h, lines[0]);
    if (b.failure) {
      div('gpumem-hover-line gpumem-hover-failed', h, `✗ ${b.failure}`);
    }
    if (b.group !== 'current') {
      div('gpumem-hover-line', h, `(${groupLabel(b.group)})`);
    }
    div('gpumem-hover-line', h, quantityText(b));
    if (b.quantity === 'no reading') {
      return;
    }
    if (b.top.length) {
      div('gpumem-hover-line gpumem-hover-sites-title', h, 'top sites:');
      for (const site of b.top.slice(0, 3)) {
        div('gpumem-hover-site', h, siteText(site));
      }
    } else {
      div('gpumem-hover-line', h, 'no sites (tracking off, or nothing live)');
    }
  }

  private _select(b: Bar): void {
    const s = this._state;
    if (!s) {
      return;
    }
    const entry = s.entryOf(b.key);
    const idx = entry ? s.cellIndexOf(entry) : -1;
    if (idx < 0) {
      this._hover.textContent = '';
      div('gpumem-hover-line', this._hover, `[${b.cell}]'s output is no longer in the notebook.`);
      return;
    }
    const nb = s.panel.content;
    nb.deselectAll();
    nb.activeCellIndex = idx;
    this.options.activate(s);
    void nb.scrollToItem(idx, 'center');
  }

  private _state: NotebookGpu | null = null;
  private _where: HTMLDivElement;
  private _message: HTMLDivElement;
  private _now: HTMLDivElement;
  private _history: HTMLDivElement;
  private _legend: HTMLDivElement;
  private _chart: HTMLDivElement;
  private _failed: HTMLDivElement;
  private _hover: HTMLDivElement;
  private _chartKey = '';
  private _frame = 0;
}
