// The labextension's application plugin (index.ts is its MIME renderer): notebooks are
// saved without symgrad's live-only outputs. `%%symgrad` shows the Inspector widget as an
// output marked `{"symgrad": {"live": true}}` beside the static graph output. The
// widget's model lives in the kernel; JupyterLab does not save widget state by default,
// so a saved Inspector output would reopen as "Error displaying widget: model not found".
// The file keeps the static graph (with its verdicts), which JupyterLab, Notebook 7,
// VS Code, nbviewer and GitHub all show. The live notebook keeps the Inspector.
import {
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import type * as nbformat from '@jupyterlab/nbformat';
import { INotebookTracker, NotebookPanel } from '@jupyterlab/notebook';

/** Whether an output exists only while its kernel does (symgrad's Inspector). */
export function isLiveOnly(output: nbformat.IOutput): boolean {
  const md = output.metadata as { symgrad?: { live?: unknown } } | undefined;
  return md?.symgrad?.live === true;
}

/** `nb` less its live-only outputs (a new object; `nb` is left as it is). */
export function withoutLiveOutputs(
  nb: nbformat.INotebookContent
): nbformat.INotebookContent {
  if (!nb.cells.some(c => c.cell_type === 'code' && hasLive(c))) {
    return nb;
  }
  return {
    ...nb,
    cells: nb.cells.map(c =>
      c.cell_type === 'code' && hasLive(c)
        ? {
            ...c,
            outputs: (c as nbformat.ICodeCell).outputs.filter(
              o => !isLiveOnly(o)
            )
          }
        : c
    )
  };
}

function hasLive(cell: nbformat.ICell): boolean {
  return ((cell as nbformat.ICodeCell).outputs ?? []).some(isLiveOnly);
}

const PATCHED = Symbol.for('symgrad.saveStatic');

/** What the notebook's document context saves (model.toJSON) leaves live outputs out. */
function patchModel(panel: NotebookPanel): void {
  const model = panel.context.model as unknown as {
    toJSON(): nbformat.INotebookContent;
    [PATCHED]?: boolean;
  };
  if (!model || model[PATCHED]) {
    return;
  }
  const toJSON = model.toJSON.bind(model);
  model.toJSON = () => withoutLiveOutputs(toJSON());
  model[PATCHED] = true;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'symgrad:save-static',
  description:
    'Saves notebooks with the static symgrad graph, without the live-only Inspector.',
  autoStart: true,
  // Optional: Notebook 7 loads the extension on pages with no notebook too.
  optional: [INotebookTracker],
  activate: (_app: JupyterFrontEnd, tracker: INotebookTracker | null) => {
    if (!tracker) {
      return;
    }
    tracker.forEach(patchModel);
    tracker.widgetAdded.connect((_, panel) => patchModel(panel));
  }
};

export default plugin;
