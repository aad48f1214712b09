// The status bar's `GPU 3.2 / 80 GiB` for the active notebook's kernel: what its live notebook
// process holds on the device (NVML's bytes of the process, else every tracked allocation, else
// the allocator's reserved bytes) over the device's total, from the same readings as the panel:
// the live process's own (a fresh process that has run no cell: `GPU: nothing held`), never the
// saved outputs of another.

import { Widget } from '@lumino/widgets';
import { ISignal, Signal } from '@lumino/signaling';
import { NotebookGpu } from './model';
import { held, liveFiguresOf, recordFigures } from './records';
import { iec, statusText } from './units';

export class GpuStatus extends Widget {
  constructor() {
    super();
    this.addClass('gpumem-status');
    this.addClass('jp-StatusBar-TextItem');
    this.node.title = 'GPU memory of the notebook\'s kernel (gpumem-kernel)';
  }

  /** Whether the item shows: the active notebook's kernel is gpumem-kernel. */
  get shown(): boolean {
    return !!this._state && this._state.kernel.kind === 'gpumem';
  }

  get shownChanged(): ISignal<this, void> {
    return this._shownChanged;
  }

  setNotebook(state: NotebookGpu | null): void {
    if (state !== this._state) {
      this._state?.changed.disconnect(this._update, this);
      this._state = state;
      state?.changed.connect(this._update, this);
    }
    this._update();
  }

  private _update(): void {
    const shown = this.shown;
    if (shown !== this._wasShown) {
      this._wasShown = shown;
      this._shownChanged.emit();
    }
    const s = this._state;
    if (!s || !shown) {
      this.node.textContent = '';
      this.node.dataset.bytes = '';
      this.node.dataset.total = '';
      return;
    }
    const last = s.last?.record ?? null;
    const proc = s.process;
    const figs = s.live && !s.live.building ? liveFiguresOf(s.live, last) : last ? recordFigures(last) : [];
    const h = held(figs);
    const pid = proc.pid === null ? 'its new notebook process' : `its notebook process (pid ${proc.pid})`;
    if (figs.length) {
      this.node.textContent = statusText(h.bytes, h.total);
      this.node.dataset.bytes = h.bytes === null ? '' : String(h.bytes);
      this.node.dataset.total = h.total === null ? '' : String(h.total);
      this.node.title = `GPU memory of ${s.panel.context.path}'s kernel, ${pid}: ${iec(h.bytes)} ${h.what}, of ${iec(h.total)} on the device`;
    } else if (proc.known) {
      // The live process has run no cell: it holds no device memory.
      this.node.textContent = 'GPU: nothing held';
      this.node.dataset.bytes = '0';
      this.node.dataset.total = '';
      this.node.title = `GPU memory of ${s.panel.context.path}'s kernel: ${pid} has run no cell, and holds no device memory`;
    } else {
      this.node.textContent = 'GPU –';
      this.node.dataset.bytes = '';
      this.node.dataset.total = '';
      this.node.title = 'gpumem-kernel: no reading of the live notebook process yet';
    }
  }

  private _state: NotebookGpu | null = null;
  private _wasShown = false;
  private _shownChanged = new Signal<this, void>(this);
}
