// The right sidebar's "GPU memory" panel: the active notebook's kernel's figures now (live while
// a cell runs, else the last record's after-values), then the session's per-cell history chart.
// Every number on it is a number of a record or of a live reading, carried in `data-bytes`.

import { Widget } from '@lumino/widgets';
import { Message } from '@lumino/messaging';
import { NotebookGpu } from './model';
import { Bar, Figure, barOf, liveFiguresOf, num, recordFigures } from './records';
import { barTitle, drawChart, partClass, partLabel, quantityText, siteText } from './chart';
import { iec } from './units';

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
    if (k.kind === 'none') {
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
    const live = s.live;
    const last = s.last;
    let figs: Figure[];
    let status: string;
    if (live && !live.building) {
      figs = liveFiguresOf(live, last?.record ?? null);
      now.dataset.mode = 'live';
      now.dataset.cell = String(live.cell);
      status = `[${live.cell}] running · ${((live.elapsed_ms ?? 0) / 1000).toFixed(1)} s · ${live.device ?? ''}`;
    } else if (last) {
      figs = recordFigures(last.record);
      now.dataset.mode = 'record';
      now.dataset.cell = String(last.record.cell);
      const r = last.record;
      const running = live && live.building ? ` · [${live.cell}] compiling dependencies, ${((live.elapsed_ms ?? 0) / 1000).toFixed(0)} s` : '';
      status = `after [${r.cell}] · ${((r.wall_ms ?? 0) / 1000).toFixed(2)} s · ${r.device ?? ''}${running}`;
    } else {
      now.dataset.mode = 'none';
      now.dataset.cell = '';
      const running = live && live.building ? ` [${live.cell}] is compiling dependencies.` : '';
      div('gpumem-now-status', now, `No cell has reported yet: run a cell.${running}`);
      return;
    }
    now.dataset.updates = String(s.liveUpdates);
    div(`gpumem-now-status${live && !live.building ? ' gpumem-now-live' : ''}`, now, status);
    const list = div('gpumem-figures', now);
    for (const f of figs) {
      const row = div('gpumem-fig', list);
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
    const warnings = !live && last ? last.record.warnings ?? [] : [];
    for (const w of warnings) {
      div('gpumem-now-warning', now, `⚠ ${w}`);
    }
  }

  private _renderHistory(s: NotebookGpu): void {
    const entries = s.entries;
    const bars = entries.map(e => barOf(e.record));
    const active = s.panel.content.activeCell;
    const selected = active ? entries.filter(e => e.cellId === active.model.id).pop()?.record.cell ?? null : null;
    const width = Math.max(200, this._chart.clientWidth || this.node.clientWidth - 24);
    // The running cell, as it stands: every allocation where tracked, else reserved.
    const l = s.live && !s.live.building ? s.live : null;
    const lnow = l ? num(l.all_allocations) ?? num(l.reserved) : null;
    const live =
      l && lnow !== null
        ? { cell: l.cell, now: lnow, peak: Math.max(lnow, (num(l.all_allocations) !== null ? num(l.all_allocations_peak) : num(l.peak_reserved)) ?? lnow) }
        : null;
    const key = `${entries.map(e => `${e.record.cell}:${e.seq}`).join(',')}|${selected}|${width}|${live ? `${live.cell}:${live.now}:${live.peak}` : ''}`;
    if (key === this._chartKey) {
      return;
    }
    this._chartKey = key;
    this._history.dataset.bars = String(bars.length);
    this._chart.textContent = '';
    this._legend.textContent = '';
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
    if (live) {
      item('gpumem-swatch-live', `[${live.cell}] running`);
    }
    const svg = drawChart(bars, {
      width,
      height: 200,
      selected,
      live,
      onClick: b => this._select(b),
      onHover: b => this._showHover(b)
    });
    this._chart.appendChild(svg);
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
    const lines = barTitle(b).split('\n');
    div('gpumem-hover-head', h, lines[0]);
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
    const idx = s.cellIndexOf(b.cell);
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
  private _hover: HTMLDivElement;
  private _chartKey = '';
  private _frame = 0;
}
