// gpumem-lab: a right-sidebar "GPU memory" panel and a status-bar item for notebooks on
// gpumem-kernel. The figures are the kernel's own: the per-cell record it sends after every cell
// and the live line's figures while a cell runs (see records.ts); the cell outputs stay as they are.

import { ILabShell, JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { NotebookGpu } from './model';
import { GpuPanel } from './panel';
import { GpuStatus } from './status';

export { NotebookGpu } from './model';

const ICON = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
<g class="jp-icon3" fill="#616161">
<path d="M7 5h10a2 2 0 0 1 2 2v10a2 2 0 0 1-2 2H7a2 2 0 0 1-2-2V7a2 2 0 0 1 2-2zm0 2v10h10V7H7z"/>
<rect x="9" y="12" width="2" height="3"/><rect x="12" y="10" width="2" height="5"/><rect x="15" y="9" width="1" height="6"/>
<rect x="8" y="2" width="1.6" height="3"/><rect x="11.2" y="2" width="1.6" height="3"/><rect x="14.4" y="2" width="1.6" height="3"/>
<rect x="8" y="19" width="1.6" height="3"/><rect x="11.2" y="19" width="1.6" height="3"/><rect x="14.4" y="19" width="1.6" height="3"/>
<rect x="2" y="8" width="3" height="1.6"/><rect x="2" y="11.2" width="3" height="1.6"/><rect x="2" y="14.4" width="3" height="1.6"/>
<rect x="19" y="8" width="3" height="1.6"/><rect x="19" y="11.2" width="3" height="1.6"/><rect x="19" y="14.4" width="3" height="1.6"/>
</g></svg>`;

export const gpuIcon = new LabIcon({ name: 'gpumem-lab:gpu', svgstr: ICON });

/** The id of the sidebar panel (`app.shell.activateById`). */
export const PANEL_ID = 'gpumem-lab-panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'gpumem-lab:plugin',
  description: 'GPU memory of the active notebook on gpumem-kernel: a sidebar panel and a status-bar item',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ILabShell, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    tracker: INotebookTracker,
    labShell: ILabShell | null,
    statusBar: IStatusBar | null
  ) => {
    const states = new Map<NotebookPanel, NotebookGpu>();
    const stateOf = (p: NotebookPanel): NotebookGpu => {
      let s = states.get(p);
      if (!s) {
        s = new NotebookGpu(p);
        states.set(p, s);
        p.disposed.connect(() => {
          states.get(p)?.dispose();
          states.delete(p);
        });
      }
      return s;
    };
    tracker.forEach(p => stateOf(p));
    tracker.widgetAdded.connect((_, p) => stateOf(p));

    const panel = new GpuPanel({ activate: s => app.shell.activateById(s.panel.id) });
    panel.id = PANEL_ID;
    panel.title.icon = gpuIcon;
    panel.title.caption = 'GPU memory';
    app.shell.add(panel, 'right', { rank: 650 });

    const status = new GpuStatus();
    if (statusBar) {
      statusBar.registerStatusItem('gpumem-lab:status', {
        item: status,
        align: 'left',
        rank: 4,
        isActive: () => status.shown,
        activeStateChanged: status.shownChanged
      });
    }

    // The panel follows the notebook last active; the status item the main area's widget.
    const follow = () => {
      const p = tracker.currentWidget;
      panel.setNotebook(p ? stateOf(p) : null);
      const current = labShell ? labShell.currentWidget : p;
      status.setNotebook(p && current === p ? stateOf(p) : null);
    };
    tracker.currentChanged.connect(follow);
    labShell?.currentChanged.connect(follow);
    follow();

    app.commands.addCommand('gpumem-lab:show-panel', {
      label: 'Show the GPU memory panel',
      execute: () => app.shell.activateById(PANEL_ID)
    });
    // For tests and other extensions: each notebook's state.
    (app as unknown as { gpumemLab?: unknown }).gpumemLab = { states, panel, status };
  }
};

export default plugin;
