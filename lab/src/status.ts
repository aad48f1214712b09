// The status bar's `GPU 3.2 / 80 GiB` for the active notebook's kernel: what its process holds
// on the device (NVML's bytes of the process, else every tracked allocation, else the
// allocator's reserved bytes) over the device's total, from the same readings as the panel.

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
    const figs = s.live && !s.live.building ? liveFiguresOf(s.live, last) : last ? recordFigures(last) : [];
    const h = held(figs);
    this.node.textContent = figs.length ? statusText(h.bytes, h.total) : 'GPU –';
    this.node.dataset.bytes = h.bytes === null ? '' : String(h.bytes);
    this.node.dataset.total = h.total === null ? '' : String(h.total);
    this.node.title = figs.length
      ? `GPU memory of ${s.panel.context.path}'s kernel: ${iec(h.bytes)} ${h.what}, of ${iec(h.total)} on the device`
      : 'gpumem-kernel: no cell has reported yet';
  }

  private _state: NotebookGpu | null = null;
  private _wasShown = false;
  private _shownChanged = new Signal<this, void>(this);
}
