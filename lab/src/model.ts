// Per-notebook state: the kernel it runs on (gpumem-kernel or not), the session's cell records
// and the live figures of the cell running now. Numbers come only from messages the kernel
// already sends (the record after each cell, the live line's figures while a cell runs), and,
// on open, from the records in the notebook's saved outputs. No comm, no request to the kernel
// beyond the kernel_info Jupyter already asks for.

import { NotebookPanel } from '@jupyterlab/notebook';
import type { ICodeCellModel } from '@jupyterlab/cells';
import type { KernelMessage, Kernel } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';
import { CellRecord, LiveFigures, liveOf, recordOf } from './records';

export type KernelKind = 'none' | 'pending' | 'gpumem' | 'other';

export interface KernelState {
  kind: KernelKind;
  /** The kernel's display name. */
  name: string;
  /** What its kernel_info reply says it is (`implementation`), once known. */
  implementation?: string;
}

export interface Entry {
  record: CellRecord;
  /** The model id of the notebook cell whose outputs hold the record, when found. */
  cellId: string | null;
  /** Arrival order: the last entry is the newest reading. */
  seq: number;
}

export const GPUMEM_IMPLEMENTATION = 'gpumem-kernel';

export class NotebookGpu {
  constructor(readonly panel: NotebookPanel) {
    const ctx = panel.sessionContext;
    ctx.iopubMessage.connect(this._onIopub, this);
    ctx.kernelChanged.connect(this._onKernelChanged, this);
    ctx.statusChanged.connect(this._onStatus, this);
    void ctx.ready.then(() => this._checkKernel());
    void panel.context.ready.then(() => {
      this.scanOutputs();
      this._emit();
    });
    this._checkKernel();
  }

  get changed(): ISignal<this, void> {
    return this._changed;
  }

  get kernel(): KernelState {
    return this._kernel;
  }

  /** The live figures of the running cell, or null when none runs (or it has not shown any). */
  get live(): LiveFigures | null {
    return this._live;
  }

  /** How many live readings arrived (the panel marks them, for a test to see them move). */
  get liveUpdates(): number {
    return this._liveUpdates;
  }

  /** The records, in cell order. */
  get entries(): Entry[] {
    return [...this._records.values()].sort((a, b) => a.record.cell - b.record.cell);
  }

  /** The newest record. */
  get last(): Entry | null {
    let best: Entry | null = null;
    for (const e of this._records.values()) {
      if (!best || e.seq > best.seq) {
        best = e;
      }
    }
    return best;
  }

  /** The notebook cell of a record: where it arrived, else the cell whose outputs hold it now. */
  cellIndexOf(cell: number): number {
    const e = this._records.get(cell);
    const widgets = this.panel.content.widgets;
    if (e && e.cellId) {
      const i = widgets.findIndex(w => w.model.id === e.cellId);
      if (i >= 0) {
        return i;
      }
    }
    this.scanOutputs();
    const again = this._records.get(cell);
    return again && again.cellId ? widgets.findIndex(w => w.model.id === again.cellId) : -1;
  }

  /** Reads the records the notebook's outputs hold: the history of a reopened notebook, and
   * the cell each record of this session is under. A record already known keeps its place in
   * the history; one the outputs hold with another source (an older session's) is only added
   * when the cell number is new. */
  scanOutputs(): void {
    const model = this.panel.content.model;
    if (!model) {
      return;
    }
    for (let i = 0; i < model.cells.length; i++) {
      const cell = model.cells.get(i);
      if (cell.type !== 'code') {
        continue;
      }
      const outputs = (cell as ICodeCellModel).outputs;
      for (let j = 0; j < outputs.length; j++) {
        const rec = recordOf(outputs.get(j).data);
        if (!rec) {
          continue;
        }
        const known = this._records.get(rec.cell);
        if (!known) {
          this._records.set(rec.cell, { record: rec, cellId: cell.id, seq: ++this._seq });
        } else if (sameRecord(known.record, rec)) {
          known.cellId = cell.id;
        }
      }
    }
  }

  dispose(): void {
    Signal.clearData(this);
  }

  private _emit(): void {
    this._changed.emit();
  }

  private _onIopub(_: unknown, msg: KernelMessage.IMessage): void {
    const type = msg.header.msg_type;
    if (type === 'display_data' || type === 'update_display_data') {
      const data = (msg.content as { data?: unknown }).data;
      const rec = recordOf(data);
      if (rec) {
        this._records.set(rec.cell, { record: rec, cellId: null, seq: ++this._seq });
        if (this._live && this._live.cell <= rec.cell) {
          this._live = null;
        }
        // The output area took the message before this signal: the record is in the model now.
        this.scanOutputs();
        if (!this._records.get(rec.cell)?.cellId) {
          setTimeout(() => {
            this.scanOutputs();
            this._emit();
          }, 100);
        }
        this._emit();
        return;
      }
      const live = liveOf(data);
      if (live) {
        this._live = live;
        this._liveUpdates++;
        this._emit();
      }
    }
  }

  private _onStatus(_: unknown, status: Kernel.Status): void {
    if (status === 'idle' && this._live) {
      // A cell's record comes before its reply; an idle kernel runs no cell.
      this._live = null;
      this._emit();
    } else if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this._live = null;
      this._emit();
    }
  }

  private _onKernelChanged(): void {
    this._live = null;
    this._checkKernel();
  }

  private _checkKernel(): void {
    const ctx = this.panel.sessionContext;
    const kernel = ctx.session?.kernel ?? null;
    const id = ++this._check;
    if (!kernel) {
      this._kernel = { kind: ctx.isReady || ctx.hasNoKernel ? 'none' : 'pending', name: ctx.kernelDisplayName };
      this._emit();
      return;
    }
    if (this._kernelId !== kernel.id) {
      // A new kernel (a restart keeps the id): its records start afresh; the saved ones stay.
      this._kernelId = kernel.id;
    }
    this._kernel = { kind: 'pending', name: ctx.kernelDisplayName };
    this._emit();
    kernel.info
      .then(info => {
        if (id !== this._check) {
          return;
        }
        const impl = info.implementation;
        this._kernel =
          impl === GPUMEM_IMPLEMENTATION
            ? { kind: 'gpumem', name: ctx.kernelDisplayName, implementation: impl }
            : { kind: 'other', name: ctx.kernelDisplayName, implementation: impl || 'not named' };
        this._emit();
      })
      .catch(() => {
        if (id === this._check) {
          this._kernel = { kind: 'other', name: ctx.kernelDisplayName, implementation: 'no kernel_info reply' };
          this._emit();
        }
      });
  }

  private _changed = new Signal<this, void>(this);
  private _kernel: KernelState = { kind: 'pending', name: '' };
  private _kernelId: string | null = null;
  private _check = 0;
  private _records = new Map<number, Entry>();
  private _seq = 0;
  private _live: LiveFigures | null = null;
  private _liveUpdates = 0;
}

function sameRecord(a: CellRecord, b: CellRecord): boolean {
  return a.cell === b.cell && a.source_hash === b.source_hash && a.wall_ms === b.wall_ms;
}
