// Per-notebook state: the kernel it runs on (gpumem-kernel or not), the records by notebook
// process, and the live figures of the cell running now. Numbers come only from messages the
// kernel already sends: the record after each cell, the live line's figures while a cell runs,
// `%gpumem restart`'s note, and the `gpumem` object of the kernel_info reply JupyterLab asks for
// on every (re)connection (the notebook process's pid and the newest record of a cell that ran
// in it); and, on open, the records in the notebook's saved outputs. No comm, no request of its
// own.
//
// Sessions: every record names the notebook process it came from (`child_pid`). The live
// process's records are the session the panel shows as "this process"; a record of another
// process (a restart: JupyterLab's, `%gpumem restart`, a crash) starts a new session, and the
// earlier ones are "previous process", never keyed into the new session's cell numbers. Saved
// records count as the live process's only when the live kernel says that process is its own.

import { NotebookPanel } from '@jupyterlab/notebook';
import type { ICodeCellModel } from '@jupyterlab/cells';
import type { KernelMessage, Kernel } from '@jupyterlab/services';
import { ISignal, Signal } from '@lumino/signaling';
import {
  CellRecord,
  KernelGpumem,
  LiveFigures,
  kernelGpumemOf,
  liveOf,
  num,
  recordOf,
  sameRecord,
  sessionNoteOf
} from './records';

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
  /** The session (notebook process) it belongs to: the model's numbering. */
  session: number;
  /** Where it came from: the live kernel's messages, or the notebook's saved outputs. */
  origin: 'kernel' | 'saved';
}

/** What the panel knows of the live notebook process. */
export interface LiveProcess {
  /** The live kernel said which process is current (kernel_info's `gpumem`, a record it sent,
   * `%gpumem restart`'s note, or JupyterLab restarted the kernel): saved records of other
   * processes are "previous process". False: nothing vouches for the saved outputs. */
  known: boolean;
  /** Its pid, once known. */
  pid: number | null;
  /** Why the session started, for the panel (`kernel restarted`, `%gpumem restart`, …). */
  why: string | null;
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

  /** The live notebook process, as far as the kernel said. */
  get process(): LiveProcess {
    return { known: this._known, pid: this._pid, why: this._why };
  }

  /** The live figures of the running cell, or null when none runs (or it has not shown any). */
  get live(): LiveFigures | null {
    return this._live;
  }

  /** How many live readings arrived (the panel marks them, for a test to see them move). */
  get liveUpdates(): number {
    return this._liveUpdates;
  }

  /** The live process's records, in cell order (none until the kernel said which is live). */
  get entries(): Entry[] {
    if (!this._known) {
      return [];
    }
    return this._entries.filter(e => e.session === this._session).sort((a, b) => a.record.cell - b.record.cell);
  }

  /** Records of other processes (or, while no live kernel vouched for any, every saved
   * record): in the order the processes ran, then by cell. */
  get previous(): Entry[] {
    const others = this._known ? this._entries.filter(e => e.session !== this._session) : [...this._entries];
    // A process this page saw replaced comes after those only the saved outputs hold (older).
    const rank = (e: Entry) => this._retired.get(e.session) ?? 0;
    return others.sort((a, b) => rank(a) - rank(b) || a.session - b.session || a.record.cell - b.record.cell || a.seq - b.seq);
  }

  /** How many processes the previous entries come from. */
  get previousProcesses(): number {
    return new Set(this.previous.map(e => e.session)).size;
  }

  /** The newest record of the live process. */
  get last(): Entry | null {
    return newest(this.entries);
  }

  /** The newest saved record, when no live kernel vouched for any (shown as saved). */
  get lastSaved(): Entry | null {
    return this._known ? null : newest(this._entries);
  }

  /** The notebook cell of an entry: where it arrived, else the cell whose outputs hold it now. */
  cellIndexOf(entry: Entry): number {
    const widgets = this.panel.content.widgets;
    if (entry.cellId) {
      const i = widgets.findIndex(w => w.model.id === entry.cellId);
      if (i >= 0) {
        return i;
      }
    }
    this.scanOutputs();
    return entry.cellId ? widgets.findIndex(w => w.model.id === entry.cellId) : -1;
  }

  /** The entry a bar stands for (its key). */
  entryOf(key: string): Entry | null {
    return this._entries.find(e => keyOf(e) === key) ?? null;
  }

  /** Reads the records the notebook's outputs hold: the history of a reopened notebook, and
   * the cell each known record is under. A record already known keeps its place; a new one is
   * of the process it names (the live one only when the live kernel said so). */
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
        const known = this._find(rec);
        if (known) {
          known.cellId = cell.id;
        } else {
          this._add({ record: rec, cellId: cell.id, seq: ++this._seq, session: this._sessionOfPid(num(rec.child_pid)), origin: 'saved' });
        }
      }
    }
  }

  dispose(): void {
    this._watchKernel(null);
    Signal.clearData(this);
  }

  private _emit(): void {
    this._changed.emit();
  }

  private _find(rec: CellRecord): Entry | null {
    const e = this._byId.get(recordId(rec));
    return e && sameRecord(e.record, rec) ? e : null;
  }

  private _add(e: Entry): void {
    this._entries.push(e);
    this._byId.set(recordId(e.record), e);
  }

  /** The session of a pid seen in saved outputs (a new one for a pid not seen yet). */
  private _sessionOfPid(pid: number | null): number {
    if (pid === null) {
      return ++this._sessions;
    }
    let s = this._pidSession.get(pid);
    if (s === undefined) {
      s = ++this._sessions;
      this._pidSession.set(pid, s);
    }
    return s;
  }

  /** The live process is `pid`'s (null: a fresh one whose pid is not known yet). Records of
   * that pid already known (saved outputs) join it. */
  private _setProcess(pid: number | null, why: string | null): void {
    this._known = true;
    if (pid !== null && pid === this._pid) {
      return;
    }
    if (pid !== null && this._pid === null && !this._entries.some(e => e.session === this._session)) {
      // The fresh session learns its pid: saved records of that pid (none, unless the kernel
      // reconnected) join it.
      const s = this._pidSession.get(pid);
      this._pid = pid;
      this._pidSession.set(pid, this._session);
      if (s !== undefined && s !== this._session) {
        for (const e of this._entries) {
          if (e.session === s) {
            e.session = this._session;
          }
        }
      }
      if (why) {
        this._why = why;
      }
      return;
    }
    const s = pid !== null ? this._pidSession.get(pid) : undefined;
    if (this._entries.some(e => e.session === this._session)) {
      this._retired.set(this._session, ++this._retiredCount);
    }
    this._session = s ?? ++this._sessions;
    this._pid = pid;
    this._why = why;
    if (pid !== null) {
      this._pidSession.set(pid, this._session);
    }
  }

  /** The kernel_info reply's `gpumem`: which process is live, and its newest record. */
  private _applyKernelInfo(g: KernelGpumem): void {
    const pid = g.child_pid ?? null;
    if (pid === null) {
      // The kernel has not started its notebook process yet: a fresh one.
      if (this._pid !== null || !this._known) {
        this._setProcess(null, this._why);
      }
      this._known = true;
    } else {
      this._setProcess(pid, this._why);
    }
    const rec = g.record ?? null;
    if (rec && (num(rec.child_pid) === pid || pid === null)) {
      const known = this._find(rec);
      if (known) {
        // The kernel's newest: the newest reading, wherever the saved outputs had it.
        known.session = this._session;
        known.seq = ++this._seq;
      } else {
        this._add({ record: rec, cellId: null, seq: ++this._seq, session: this._session, origin: 'kernel' });
        this.scanOutputs();
      }
    }
    this._emit();
  }

  private _onIopub(_: unknown, msg: KernelMessage.IMessage): void {
    const type = msg.header.msg_type;
    if (type === 'display_data' || type === 'update_display_data') {
      const data = (msg.content as { data?: unknown }).data;
      const rec = recordOf(data);
      if (rec) {
        this._onRecord(rec);
        return;
      }
      const live = liveOf(data);
      if (live) {
        this._live = live;
        this._liveUpdates++;
        this._emit();
        return;
      }
      const note = sessionNoteOf(data);
      if (note) {
        this._setProcess(num(note.child_pid), note.reason || '%gpumem restart');
        this._emit();
      }
    }
  }

  /** A record the kernel just sent: of the live process; a process other than the one the
   * session is of starts a new session. */
  private _onRecord(rec: CellRecord): void {
    const pid = num(rec.child_pid);
    const current = this._entries.some(e => e.session === this._session);
    if (pid !== null && pid !== this._pid) {
      if (this._pid === null && !(rec.restarted && current)) {
        this._setProcess(pid, this._why);
      } else {
        this._setProcess(pid, rec.restarted ? rec.restart_reason || 'the notebook process was replaced' : 'another notebook process');
      }
    } else if (pid === null && rec.restarted && current) {
      this._setProcess(null, rec.restart_reason || 'the notebook process was replaced');
    }
    this._known = true;
    const known = this._find(rec);
    if (known) {
      known.session = this._session;
      known.origin = 'kernel';
      known.seq = ++this._seq;
    } else {
      this._add({ record: rec, cellId: null, seq: ++this._seq, session: this._session, origin: 'kernel' });
    }
    if (this._live && this._live.cell <= rec.cell) {
      this._live = null;
    }
    // The output area took the message before this signal: the record is in the model now.
    this.scanOutputs();
    if (!this._find(rec)?.cellId) {
      setTimeout(() => {
        this.scanOutputs();
        this._emit();
      }, 100);
    }
    this._emit();
  }

  private _onStatus(_: unknown, status: Kernel.Status): void {
    if (status === 'idle' && this._live) {
      // A cell's record comes before its reply; an idle kernel runs no cell.
      this._live = null;
      this._emit();
    } else if (status === 'restarting' || status === 'autorestarting') {
      // A new kernel process, so a new notebook process: nothing of the old one is live. Its
      // pid comes with the new kernel's kernel_info reply.
      this._live = null;
      this._setProcess(null, status === 'restarting' ? 'the kernel restarted' : 'the kernel died and restarted');
      this._emit();
    } else if (status === 'dead') {
      this._live = null;
      this._emit();
    }
  }

  private _onKernelChanged(): void {
    this._live = null;
    this._checkKernel();
  }

  /** Follows the kernel's kernel_info replies: JupyterLab asks on every (re)connection, a
   * restart included, and its `kernel.info` keeps the first one only. */
  private _watchKernel(kernel: Kernel.IKernelConnection | null): void {
    if (this._watched === kernel) {
      return;
    }
    this._watched?.anyMessage.disconnect(this._onAnyMessage, this);
    this._watched = kernel;
    this._infoSeen = false;
    kernel?.anyMessage.connect(this._onAnyMessage, this);
  }

  private _onAnyMessage(_: unknown, a: Kernel.IAnyMessageArgs): void {
    if (a.direction !== 'recv' || a.msg.header.msg_type !== 'kernel_info_reply') {
      return;
    }
    this._infoSeen = true;
    const g = kernelGpumemOf(a.msg.content);
    if (g && this._kernel.kind !== 'other') {
      this._applyKernelInfo(g);
    }
  }

  private _checkKernel(): void {
    const ctx = this.panel.sessionContext;
    const kernel = ctx.session?.kernel ?? null;
    const id = ++this._check;
    this._watchKernel(kernel);
    if (!kernel) {
      this._kernel = { kind: ctx.isReady || ctx.hasNoKernel ? 'none' : 'pending', name: ctx.kernelDisplayName };
      this._known = false;
      this._emit();
      return;
    }
    if (this._kernelId !== kernel.id) {
      // Another kernel: until it says which process is live, no record is its.
      if (this._kernelId !== null) {
        this._setProcess(null, 'another kernel');
      }
      this._known = false;
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
        // The first reply of this connection; a later one (a restart) came through anyMessage.
        const g = impl === GPUMEM_IMPLEMENTATION ? kernelGpumemOf(info) : null;
        if (g && !this._infoSeen) {
          this._applyKernelInfo(g);
        }
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
  private _watched: Kernel.IKernelConnection | null = null;
  private _infoSeen = false;
  private _check = 0;
  private _entries: Entry[] = [];
  /** The entries by record (its process, cell and run). */
  private _byId = new Map<string, Entry>();
  /** The live process's session, its pid, why it started, whether the kernel said so. */
  private _session = 1;
  private _sessions = 1;
  private _pid: number | null = null;
  private _why: string | null = null;
  private _known = false;
  private _pidSession = new Map<number, number>();
  /** Sessions this page saw replaced, in the order they were. */
  private _retired = new Map<number, number>();
  private _retiredCount = 0;
  private _seq = 0;
  private _live: LiveFigures | null = null;
  private _liveUpdates = 0;
}

/** What tells one record from another: its process, its cell and its run. */
function recordId(r: CellRecord): string {
  return `${r.child_pid ?? ''}:${r.cell}:${r.source_hash ?? ''}:${r.wall_ms ?? ''}`;
}

/** A bar's key: the session and the cell. */
export function keyOf(e: Entry): string {
  return `${e.session}:${e.record.cell}`;
}

function newest(entries: Entry[]): Entry | null {
  let best: Entry | null = null;
  for (const e of entries) {
    if (!best || e.seq > best.seq) {
      best = e;
    }
  }
  return best;
}
