// The drawing API of the labextension, used by the JupyterLab MIME renderer (index.ts) and
// by the Inspector's view (inspector.ts): a symgrad graph payload (symgrad.graph/1) drawn
// as an interactive SVG, and the verifier's report. The parts:
//   format.ts   DOM builders, number/shape formatting, badges, KaTeX, error box
//   chains.ts   collapsing long runs of ops (the rule of symgrad/jupyter/layout.py)
//   layout.ts   the payload's shipped layout; dagre and a fast layout as fallbacks
//   scene.ts    what is drawn (visible nodes and edges) and which layout places it
//   modules.ts  the same with nn.Module boxes: frames, collapsed boxes, folds, focus
//   nodes.ts    SVG of boxes and edges
//   panzoom.ts  pan, zoom and fit
//   panel.ts    the node panel and the agreement table
//   view.ts     the view: toolbar, selection, collapsing (chains, modules), wiring
//   report.ts   the report view (symgrad.report/1)
export type { IGraphPayload } from './types';
export { validateGraph, validateReport } from './validate';
export { AUTO_COLLAPSE_NODES, findChains, MIN_RUN } from './chains';
export { badge, errorBox, formatShape, tex } from './format';
export { FAST_LAYOUT_NODES } from './layout';
export { renderReportView, reportStatus } from './report';
export { renderGraphView } from './view';
export type { IGraphView, IViewOptions } from './view';
