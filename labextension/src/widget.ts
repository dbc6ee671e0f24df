// anywidget front end of symgrad.jupyter.Inspector, bundled by esbuild as one ES module
// (scripts/build-widget.mjs). It binds the drawing module to the widget's traitlets:
//   graph    : the graph payload (symgrad.graph/1), as a dict or a JSON string
//   selected : the selected node id ('' or null for none); clicks write it back
//   report   : optional report payload, drawn under the graph when not empty
// The CSS (with KaTeX and its fonts) is inlined and injected once per document.
import { IGraphView, renderGraphView, renderReportView } from './draw';
import css from 'symgrad-inline-css';

export const TRAITS = {
  graph: 'graph',
  selected: 'selected',
  report: 'report'
} as const;

interface IModel {
  get(name: string): unknown;
  set(name: string, value: unknown): void;
  save_changes(): void;
  on(event: string, cb: () => void): void;
  off(event: string, cb: () => void): void;
}

function parse(v: unknown): unknown {
  if (typeof v === 'string') {
    if (!v.trim()) {
      return null;
    }
    try {
      return JSON.parse(v);
    } catch {
      return v;
    }
  }
  return v;
}

function isEmpty(v: unknown): boolean {
  return (
    v === null ||
    v === undefined ||
    (typeof v === 'object' &&
      !Array.isArray(v) &&
      !Object.keys(v as object).length)
  );
}

function placeholder(doc: Document, text: string): HTMLElement {
  const div = doc.createElement('div');
  div.className = 'sg-placeholder';
  div.textContent = text;
  return div;
}

function injectCss(doc: Document): void {
  if (doc.getElementById('symgrad-inspector-css')) {
    return;
  }
  const style = doc.createElement('style');
  style.id = 'symgrad-inspector-css';
  style.textContent = css;
  doc.head.appendChild(style);
}

function render({ model, el }: { model: IModel; el: HTMLElement }): () => void {
  injectCss(el.ownerDocument);
  el.classList.add('sg-widget');
  const graphHost = el.ownerDocument.createElement('div');
  const reportHost = el.ownerDocument.createElement('div');
  el.appendChild(graphHost);
  el.appendChild(reportHost);
  let view: IGraphView | null = null;
  const selectedId = (): string | null => {
    const v = model.get(TRAITS.selected);
    return typeof v === 'string' && v ? v : null;
  };
  const drawGraph = (): void => {
    const data = parse(model.get(TRAITS.graph));
    if (isEmpty(data)) {
      // Not set yet (a traitlet default): nothing to draw, and nothing wrong.
      view?.dispose();
      view = null;
      graphHost.textContent = '';
      graphHost.appendChild(placeholder(el.ownerDocument, 'No graph yet.'));
      return;
    }
    if (view) {
      view.update(data);
      view.select(selectedId());
      return;
    }
    graphHost.textContent = '';
    view = renderGraphView(graphHost, data, {
      selected: selectedId(),
      onSelect: id => {
        model.set(TRAITS.selected, id ?? '');
        model.save_changes();
      }
    });
  };
  const drawReport = (): void => {
    reportHost.textContent = '';
    const data = parse(model.get(TRAITS.report));
    if (isEmpty(data)) {
      return;
    }
    // The graph's agreement table already shows the per-leaf verdict: the full report
    // (mode, what ran, node checks) folds away unless the graph has no agreement.
    const graph = parse(model.get(TRAITS.graph)) as {
      agreement?: unknown;
    } | null;
    const details = el.ownerDocument.createElement('details');
    details.className = 'sg-report-details';
    details.open = !graph || !graph.agreement;
    const summary = el.ownerDocument.createElement('summary');
    summary.textContent = 'Verifier report';
    details.appendChild(summary);
    reportHost.appendChild(details);
    renderReportView(details, data);
  };
  const onSelected = (): void => view?.select(selectedId());
  drawGraph();
  drawReport();
  model.on(`change:${TRAITS.graph}`, drawGraph);
  model.on(`change:${TRAITS.selected}`, onSelected);
  model.on(`change:${TRAITS.report}`, drawReport);
  return () => {
    model.off(`change:${TRAITS.graph}`, drawGraph);
    model.off(`change:${TRAITS.selected}`, onSelected);
    model.off(`change:${TRAITS.report}`, drawReport);
    view?.dispose();
  };
}

export default { render };
