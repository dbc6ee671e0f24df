// The one drawing module: a symgrad graph payload (symgrad.graph/1) drawn as an
// interactive SVG (dagre layered layout, pan and zoom, hover, selection with a node panel,
// chain collapsing for big graphs) plus the agreement table. Used by the JupyterLab MIME
// renderer (index.ts) and, bundled by esbuild, by the Inspector's anywidget front end
// (widget.ts). Plain DOM only: no framework, and every string from the payload is
// inserted with textContent or as an attribute value, never parsed as HTML.
import { graphlib, layout } from '@dagrejs/dagre';
import katex from 'katex';
import {
  CheckStatus,
  IAgreement,
  IAgreementRow,
  IGraphEdge,
  IGraphNode,
  IGraphPayload,
  ILeaf,
  Shape
} from './types';
import { validateGraph, validateReport } from './validate';

export type { IGraphPayload } from './types';
export { validateGraph, validateReport } from './validate';

const SVG_NS = 'http://www.w3.org/2000/svg';
/** Above this many nodes, linear runs of ops are collapsed into one box by default. */
export const AUTO_COLLAPSE_NODES = 150;
/** Shortest run of ops that is collapsed. */
export const MIN_RUN = 6;
/** Graphs with more visible nodes than this draw shared leaves once per consumer. */
const PROXY_MIN_NODES = 60;
const PROXY_MIN_FANIN = 3;
/** Above this many visible nodes the fast layout replaces dagre. */
export const FAST_LAYOUT_NODES = 300;
const MAX_LABEL = 32;
const CHAR_W = 7.2;
const NODE_H = 40;
const NONE_H = 26;

export interface IViewOptions {
  /** Node id to select initially. */
  selected?: string | null;
  /** Called when the user selects a node (null: selection cleared). */
  onSelect?: (id: string | null) => void;
  /** 'auto' collapses long chains in graphs above AUTO_COLLAPSE_NODES nodes. */
  collapse?: 'auto' | 'on' | 'off';
  /** Tallest the drawing area grows, in px. */
  maxHeight?: number;
}

export interface IGraphView {
  readonly element: HTMLElement;
  /** Select a node by id (null clears); does not call onSelect. */
  select(id: string | null): void;
  /** Replace the payload (re-validates and re-draws). */
  update(data: unknown): void;
  dispose(): void;
}

// ---------------------------------------------------------------------------- DOM helpers

function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  cls?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const e = document.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  if (text !== undefined) {
    e.textContent = text;
  }
  return e;
}

function s<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number> = {}
): SVGElementTagNameMap[K] {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    e.setAttribute(k, String(v));
  }
  return e;
}

let uid = 0;

export function formatShape(shape: Shape | undefined): string {
  if (shape === null || shape === undefined) {
    return '?';
  }
  return '[' + shape.join(', ') + ']';
}

function formatNumber(x: number | null | undefined): string {
  if (x === null || x === undefined) {
    return '–';
  }
  if (x === 0) {
    return '0';
  }
  const a = Math.abs(x);
  return a < 1e-3 || a >= 1e5 ? x.toExponential(2) : x.toPrecision(3);
}

function clip(text: string, n: number = MAX_LABEL): string {
  return text.length > n ? text.slice(0, n - 1) + '…' : text;
}

const STATUS_GLYPH: Record<CheckStatus, string> = {
  pass: '✓',
  fail: '✗',
  error: '!',
  skipped: '–',
  none: ''
};

const STATUS_TEXT: Record<CheckStatus, string> = {
  pass: 'pass',
  fail: 'FAIL',
  error: 'error',
  skipped: 'skipped',
  none: 'not checked'
};

/** A pass/fail badge as an HTML element. */
export function badge(status: CheckStatus, text?: string): HTMLSpanElement {
  const b = h('span', `sg-badge sg-badge-${status}`);
  b.dataset.status = status;
  const glyph = STATUS_GLYPH[status];
  b.textContent = (glyph ? glyph + ' ' : '') + (text ?? STATUS_TEXT[status]);
  return b;
}

/** Typeset LaTeX with KaTeX (trust off: no links, no raw HTML); plain text on failure. */
export function tex(latex: string, display = false): HTMLElement {
  const span = h(display ? 'div' : 'span', 'sg-tex');
  try {
    katex.render(latex, span, {
      displayMode: display,
      throwOnError: false,
      trust: false,
      strict: 'ignore',
      output: 'htmlAndMathml'
    });
  } catch {
    span.textContent = latex;
  }
  span.title = latex;
  return span;
}

/** The readable error shown instead of a drawing when a payload is bad. */
export function errorBox(title: string, lines: string[]): HTMLElement {
  const box = h('div', 'sg-error');
  box.dataset.symgrad = 'error';
  box.setAttribute('role', 'alert');
  box.appendChild(h('div', 'sg-error-title', title));
  const ul = h('ul');
  for (const line of lines) {
    ul.appendChild(h('li', undefined, line));
  }
  box.appendChild(ul);
  return box;
}

// ----------------------------------------------------------------- collapsing long chains

interface IGroup {
  id: string;
  members: IGraphNode[];
  label: string;
  sub: string;
  status: CheckStatus;
}

interface IVisibleNode {
  id: string;
  node?: IGraphNode;
  group?: IGroup;
  label: string;
  sub: string;
  width: number;
  height: number;
  x: number;
  y: number;
  /** A copy of a shared leaf drawn next to one of its consumers. */
  proxy?: boolean;
}

interface IVisibleEdge {
  from: string;
  to: string;
  inputs: number[];
  points: { x: number; y: number }[];
}

const STATUS_RANK: Record<CheckStatus, number> = {
  fail: 4,
  error: 3,
  pass: 2,
  skipped: 1,
  none: 0
};

function summarizeRun(members: IGraphNode[]): string {
  const names = members.map(m => m.label);
  for (let p = 1; p <= Math.min(4, Math.floor(names.length / 2)); p++) {
    if (names.every((n, i) => n === names[i % p])) {
      const reps = Math.floor(names.length / p);
      const rest = names.length - reps * p;
      const unit =
        p === 1 ? names[0] : '(' + names.slice(0, p).join(' → ') + ')';
      return `${unit} × ${reps}` + (rest ? ` + ${rest}` : '');
    }
  }
  return `${names[0]} → … → ${names[names.length - 1]}`;
}

/**
 * Find maximal runs of op nodes a → b → c … where each node's only op input is the next
 * one and each is consumed only by the previous one (other inputs, leaves and None, may
 * hang off any member). Such runs come from loops (`x = x * w + b`) and are what makes a
 * 500-node graph unreadable; collapsed, they become one box with their leaves around it.
 */
export function findChains(g: IGraphPayload, keep: Set<string>): IGroup[] {
  const byId = new Map(g.nodes.map(n => [n.id, n] as const));
  const opChildren = new Map<string, Set<string>>();
  const parents = new Map<string, Set<string>>();
  for (const e of g.edges) {
    if (!parents.has(e.to)) {
      parents.set(e.to, new Set());
    }
    parents.get(e.to)!.add(e.from);
    if (byId.get(e.to)?.kind === 'op') {
      if (!opChildren.has(e.from)) {
        opChildren.set(e.from, new Set());
      }
      opChildren.get(e.from)!.add(e.to);
    }
  }
  const roots = new Set(g.roots);
  const breaker = (n: IGraphNode): boolean =>
    n.kind !== 'op' ||
    keep.has(n.id) ||
    roots.has(n.id) || // the root stays in sight
    n.first_bad === true ||
    n.check.status === 'fail' ||
    n.check.status === 'error';
  // next(a) = b when the link a → b may be inside a run.
  const next = new Map<string, string>();
  const hasPrev = new Set<string>();
  for (const n of g.nodes) {
    if (breaker(n)) {
      continue;
    }
    const kids = opChildren.get(n.id);
    if (!kids || kids.size !== 1) {
      continue;
    }
    const b = kids.values().next().value as string;
    const bn = byId.get(b);
    const ps = parents.get(b);
    if (bn && !breaker(bn) && !roots.has(b) && ps && ps.size === 1) {
      next.set(n.id, b);
      hasPrev.add(b);
    }
  }
  const groups: IGroup[] = [];
  for (const n of g.nodes) {
    if (!next.has(n.id) || hasPrev.has(n.id)) {
      continue;
    }
    const members: IGraphNode[] = [n];
    let cur = n.id;
    const seen = new Set([cur]);
    while (next.has(cur)) {
      cur = next.get(cur)!;
      if (seen.has(cur)) {
        break;
      }
      seen.add(cur);
      members.push(byId.get(cur)!);
    }
    if (members.length >= MIN_RUN) {
      let status: CheckStatus = 'none';
      for (const m of members) {
        if (STATUS_RANK[m.check.status] > STATUS_RANK[status]) {
          status = m.check.status;
        }
      }
      groups.push({
        id: 'chain:' + n.id,
        members,
        label: summarizeRun(members),
        sub: `${members.length} nodes · click to expand`,
        status
      });
    }
  }
  return groups;
}

function nodeSize(label: string, sub: string, kind: string): [number, number] {
  const chars = Math.max(label.length, sub.length);
  const w = Math.min(
    Math.max(chars * CHAR_W + 26, kind === 'none' ? 48 : 72),
    300
  );
  return [w, kind === 'none' ? NONE_H : NODE_H];
}

function nodeSub(n: IGraphNode): string {
  if (n.kind === 'none') {
    return '';
  }
  if (n.kind === 'accumulate') {
    return 'AccumulateGrad ' + formatShape(n.shape);
  }
  return formatShape(n.shape);
}

// ----------------------------------------------------------------------------- layouts

const RANKSEP = 34;
const NODESEP = 22;
const MARGIN = 12;

/** dagre's layered layout (network simplex ranks, crossing reduction, Brandes–Köpf). */
function dagreLayout(
  visible: Map<string, IVisibleNode>,
  edges: IVisibleEdge[]
): { width: number; height: number } {
  const dg = new graphlib.Graph({ multigraph: false });
  dg.setGraph({
    rankdir: 'TB',
    nodesep: NODESEP,
    ranksep: RANKSEP,
    edgesep: 8,
    marginx: MARGIN,
    marginy: MARGIN
  });
  dg.setDefaultEdgeLabel(() => ({}));
  for (const v of visible.values()) {
    dg.setNode(v.id, { width: v.width, height: v.height });
  }
  for (const e of edges) {
    dg.setEdge(e.from, e.to, {});
  }
  // Keep each node's inputs left to right in next_functions order.
  const byFrom = new Map<string, IVisibleEdge[]>();
  for (const e of edges) {
    (byFrom.get(e.from) ?? byFrom.set(e.from, []).get(e.from)!).push(e);
  }
  const constraints: { left: string; right: string }[] = [];
  for (const list of byFrom.values()) {
    list.sort((a, b) => Math.min(...a.inputs) - Math.min(...b.inputs));
    for (let i = 1; i < list.length; i++) {
      constraints.push({ left: list[i - 1].to, right: list[i].to });
    }
  }
  try {
    layout(dg, { constraints });
  } catch {
    layout(dg);
  }
  for (const v of visible.values()) {
    const p = dg.node(v.id) as { x: number; y: number };
    v.x = p.x;
    v.y = p.y;
  }
  for (const e of edges) {
    const lab = dg.edge(e.from, e.to) as {
      points?: { x: number; y: number }[];
    };
    e.points = lab?.points ?? [];
  }
  const gl = dg.graph() as { width?: number; height?: number };
  return { width: gl.width ?? 1, height: gl.height ?? 1 };
}

/**
 * A linear-time layered layout for big graphs, where dagre's crossing reduction and
 * coordinate assignment grow too slow for a browser (seconds at ~1000 nodes): ranks by
 * longest path from the roots, order by depth-first discovery (inputs in order), each
 * node placed under the mean of its consumers and pushed right past its left neighbour.
 */
function fastLayout(
  visible: Map<string, IVisibleNode>,
  edges: IVisibleEdge[],
  roots: string[]
): { width: number; height: number } {
  const out = new Map<string, IVisibleEdge[]>();
  const indeg = new Map<string, number>();
  for (const id of visible.keys()) {
    out.set(id, []);
    indeg.set(id, 0);
  }
  for (const e of edges) {
    out.get(e.from)!.push(e);
    indeg.set(e.to, indeg.get(e.to)! + 1);
  }
  for (const list of out.values()) {
    list.sort((a, b) => Math.min(...a.inputs) - Math.min(...b.inputs));
  }
  // Depth-first discovery order, from the roots first (iterative: graphs can be deep).
  const order = new Map<string, number>();
  const starts = [...roots, ...visible.keys()].filter(id => visible.has(id));
  for (const s of starts) {
    if (order.has(s)) {
      continue;
    }
    const stack = [s];
    while (stack.length) {
      const id = stack.pop()!;
      if (order.has(id)) {
        continue;
      }
      order.set(id, order.size);
      const kids = out.get(id)!;
      for (let i = kids.length - 1; i >= 0; i--) {
        if (!order.has(kids[i].to)) {
          stack.push(kids[i].to);
        }
      }
    }
  }
  // Longest-path ranks in topological order (Kahn).
  const rank = new Map<string, number>();
  const left = new Map(indeg);
  const queue = [...visible.keys()].filter(id => indeg.get(id) === 0);
  for (const id of queue) {
    rank.set(id, 0);
  }
  for (let qi = 0; qi < queue.length; qi++) {
    const id = queue[qi];
    for (const e of out.get(id)!) {
      rank.set(e.to, Math.max(rank.get(e.to) ?? 0, rank.get(id)! + 1));
      left.set(e.to, left.get(e.to)! - 1);
      if (left.get(e.to) === 0) {
        queue.push(e.to);
      }
    }
  }
  const layers: IVisibleNode[][] = [];
  for (const v of visible.values()) {
    const r = rank.get(v.id) ?? 0; // (a cycle cannot occur in an autograd graph)
    (layers[r] = layers[r] ?? []).push(v);
  }
  const parents = new Map<string, string[]>();
  for (const e of edges) {
    (parents.get(e.to) ?? parents.set(e.to, []).get(e.to)!).push(e.from);
  }
  let y = MARGIN;
  let minX = Infinity;
  let maxX = -Infinity;
  for (const layer of layers) {
    if (!layer) {
      continue;
    }
    const want = new Map<string, number>();
    for (const v of layer) {
      const ps = parents.get(v.id) ?? [];
      want.set(
        v.id,
        ps.length
          ? ps.reduce((a, p) => a + visible.get(p)!.x, 0) / ps.length
          : 0
      );
    }
    layer.sort(
      (a, b) =>
        want.get(a.id)! - want.get(b.id)! || order.get(a.id)! - order.get(b.id)!
    );
    let edge = -Infinity;
    const hmax = Math.max(...layer.map(v => v.height));
    for (const v of layer) {
      v.x = Math.max(want.get(v.id)!, edge + NODESEP + v.width / 2);
      edge = v.x + v.width / 2;
      v.y = y + hmax / 2;
      minX = Math.min(minX, v.x - v.width / 2);
      maxX = Math.max(maxX, v.x + v.width / 2);
    }
    y += hmax + RANKSEP;
  }
  const shift = MARGIN - minX;
  for (const v of visible.values()) {
    v.x += shift;
  }
  for (const e of edges) {
    const a = visible.get(e.from)!;
    const b = visible.get(e.to)!;
    e.points = [
      { x: a.x, y: a.y + a.height / 2 },
      { x: b.x, y: b.y - b.height / 2 }
    ];
  }
  return { width: maxX - minX + 2 * MARGIN, height: y - RANKSEP + MARGIN };
}

// ------------------------------------------------------------------------------ the view

class GraphView implements IGraphView {
  readonly element: HTMLElement;
  private opts: IViewOptions;
  private graph: IGraphPayload | null = null;
  private byId = new Map<string, IGraphNode>();
  private leafById = new Map<string, ILeaf>();
  private rowByNode = new Map<string, IAgreementRow>();
  private groups: IGroup[] = [];
  private groupOf = new Map<string, IGroup>();
  private expanded = new Set<string>();
  private collapsed = false;
  private selected: string | null = null;
  private visible = new Map<string, IVisibleNode>();
  private nodeEls = new Map<string, SVGGElement>();
  private bounds = { width: 1, height: 1 };
  private t = { k: 1, x: 0, y: 0 };
  private userMoved = false;
  private active = false;
  private resizeObserver: ResizeObserver | null = null;
  private cleanup: (() => void)[] = [];
  private markerId = `sg-arrow-${++uid}`;

  // DOM parts
  private header!: HTMLElement;
  private toolbar!: HTMLElement;
  private canvas!: HTMLElement;
  private svg!: SVGSVGElement;
  private viewport!: SVGGElement;
  private tooltip!: HTMLElement;
  private panel!: HTMLElement;
  private agreementBox!: HTMLElement;
  private collapseButton!: HTMLButtonElement;

  constructor(host: HTMLElement, data: unknown, opts: IViewOptions) {
    this.opts = opts;
    this.element = h('div', 'sg-view');
    this.element.dataset.symgrad = 'graph';
    host.appendChild(this.element);
    this.selected = opts.selected ?? null;
    this.update(data);
  }

  update(data: unknown): void {
    const t0 = performance.now();
    this.teardown();
    this.element.textContent = '';
    const result = validateGraph(data);
    if (!result.ok) {
      this.graph = null;
      this.element.dataset.state = 'error';
      this.element.appendChild(
        errorBox('symgrad: this graph output cannot be drawn', [
          'The payload does not match the symgrad.graph/1 schema:',
          ...result.errors
        ])
      );
      return;
    }
    const g = result.value;
    this.graph = g;
    this.byId = new Map(g.nodes.map(n => [n.id, n] as const));
    this.leafById = new Map(g.leaves.map(l => [l.id, l] as const));
    this.rowByNode = new Map();
    for (const row of g.agreement?.rows ?? []) {
      if (row.node) {
        this.rowByNode.set(row.node, row);
      }
    }
    if (this.selected && !this.byId.has(this.selected)) {
      this.selected = null;
    }
    const mode = this.opts.collapse ?? 'auto';
    this.collapsed =
      mode === 'on' ||
      (mode === 'auto' && g.nodes.length > AUTO_COLLAPSE_NODES);
    this.expanded = new Set();
    this.buildChrome(g);
    this.computeGroups();
    const t1 = performance.now();
    this.draw();
    this.renderPanel();
    this.element.dataset.state = 'ready';
    this.element.dataset.nodeCount = String(g.nodes.length);
    this.element.dataset.renderMs = (performance.now() - t0).toFixed(1);
    this.element.dataset.validateMs = (t1 - t0).toFixed(1);
  }

  select(id: string | null): void {
    if (id !== null && !this.byId.has(id)) {
      id = null;
    }
    this.selected = id;
    if (
      id &&
      this.groupOf.has(id) &&
      !this.expanded.has(this.groupOf.get(id)!.id)
    ) {
      this.expanded.add(this.groupOf.get(id)!.id);
      this.draw();
    }
    this.markSelection();
    this.renderPanel();
  }

  dispose(): void {
    this.teardown();
    this.element.remove();
  }

  private teardown(): void {
    for (const f of this.cleanup) {
      f();
    }
    this.cleanup = [];
    this.resizeObserver?.disconnect();
    this.resizeObserver = null;
  }

  private listen<K extends keyof HTMLElementEventMap>(
    target: HTMLElement | SVGElement | Window,
    type: K,
    fn: (e: HTMLElementEventMap[K]) => void,
    options?: AddEventListenerOptions
  ): void {
    const f = fn as EventListener;
    target.addEventListener(type, f, options);
    this.cleanup.push(() => target.removeEventListener(type, f, options));
  }

  private userSelect(id: string | null): void {
    this.select(id);
    this.opts.onSelect?.(this.selected);
  }

  // ------------------------------------------------------------------ static structure

  private buildChrome(g: IGraphPayload): void {
    const ops = g.nodes.filter(n => n.kind === 'op').length;
    const leaves = g.nodes.filter(
      n => n.kind === 'accumulate' || n.kind === 'leaf'
    ).length;
    this.header = h('div', 'sg-header');
    const title = h('span', 'sg-title');
    const rootNames = (g.root_names ?? []).filter(n => n);
    title.textContent =
      (rootNames.length
        ? `Graph of ${rootNames.join(', ')}`
        : 'Autograd graph') + (g.source === 'torch' ? ' (PyTorch)' : '');
    this.header.appendChild(title);
    const counts = h('span', 'sg-counts');
    counts.dataset.symgrad = 'counts';
    counts.textContent = `${ops} op${ops === 1 ? '' : 's'} · ${leaves} lea${
      leaves === 1 ? 'f' : 'ves'
    }`;
    this.header.appendChild(counts);
    const ag = g.agreement;
    if (ag) {
      const status: CheckStatus =
        ag.ok === true ? 'pass' : ag.ok === false ? 'fail' : 'none';
      const text =
        ag.ok === true
          ? 'gradients agree'
          : ag.ok === false
            ? 'gradients disagree'
            : 'unverified';
      const b = badge(status, text);
      b.dataset.symgrad = 'overall';
      this.header.appendChild(b);
    }
    this.element.appendChild(this.header);

    this.toolbar = h('div', 'sg-toolbar');
    const button = (
      label: string,
      title: string,
      fn: () => void
    ): HTMLButtonElement => {
      const b = h('button', 'sg-button', label);
      b.type = 'button';
      b.title = title;
      this.listen(b, 'click', e => {
        e.stopPropagation();
        fn();
      });
      this.toolbar.appendChild(b);
      return b;
    };
    button('Fit', 'Fit the whole graph', () => {
      this.userMoved = false;
      this.fit(true);
    });
    button('+', 'Zoom in', () => this.zoomBy(1.25));
    button('−', 'Zoom out', () => this.zoomBy(0.8));
    this.collapseButton = button('', '', () => {
      this.collapsed = !this.collapsed;
      this.expanded.clear();
      this.draw();
    });
    this.collapseButton.dataset.symgrad = 'collapse';
    const hint = h(
      'span',
      'sg-hint',
      'drag to pan · Ctrl+wheel to zoom · click a node'
    );
    this.toolbar.appendChild(hint);
    this.element.appendChild(this.toolbar);

    if (g.truncated) {
      this.element.appendChild(
        h(
          'div',
          'sg-notice',
          `${g.truncated} more node${g.truncated === 1 ? '' : 's'} not shown (graph too large).`
        )
      );
    }

    const body = h('div', 'sg-body');
    this.canvas = h('div', 'sg-canvas');
    this.canvas.tabIndex = 0;
    this.svg = s('svg', {
      class: 'sg-svg',
      role: 'img',
      'aria-label': 'autograd graph'
    });
    this.svg.dataset.symgrad = 'graph-svg';
    const defs = s('defs');
    const marker = s('marker', {
      id: this.markerId,
      viewBox: '0 0 10 10',
      refX: 9,
      refY: 5,
      markerWidth: 7,
      markerHeight: 7,
      orient: 'auto-start-reverse'
    });
    marker.appendChild(
      s('path', { d: 'M0,0 L10,5 L0,10 z', class: 'sg-arrowhead' })
    );
    defs.appendChild(marker);
    this.svg.appendChild(defs);
    this.viewport = s('g', { class: 'sg-viewport' });
    this.svg.appendChild(this.viewport);
    this.canvas.appendChild(this.svg);
    this.tooltip = h('div', 'sg-tooltip');
    this.tooltip.dataset.symgrad = 'tooltip';
    this.tooltip.hidden = true;
    this.canvas.appendChild(this.tooltip);
    body.appendChild(this.canvas);
    this.panel = h('div', 'sg-panel');
    this.panel.dataset.symgrad = 'node-panel';
    body.appendChild(this.panel);
    this.element.appendChild(body);

    this.agreementBox = h('div', 'sg-agreement-box');
    if (g.agreement) {
      this.agreementBox.appendChild(this.agreementTable(g.agreement));
    }
    this.element.appendChild(this.agreementBox);
    this.installPanZoom();
  }

  private computeGroups(): void {
    const g = this.graph!;
    const keep = new Set<string>(this.selected ? [this.selected] : []);
    this.groups = findChains(g, keep);
    this.groupOf = new Map();
    for (const grp of this.groups) {
      for (const m of grp.members) {
        this.groupOf.set(m.id, grp);
      }
    }
  }

  // ------------------------------------------------------------------- layout + drawing

  private visibleId(id: string): string {
    if (!this.collapsed) {
      return id;
    }
    const grp = this.groupOf.get(id);
    return grp && !this.expanded.has(grp.id) ? grp.id : id;
  }

  private draw(): void {
    const g = this.graph!;
    const hidden = this.groups
      .filter(grp => this.collapsed && !this.expanded.has(grp.id))
      .reduce((a, grp) => a + grp.members.length - 1, 0);
    if (this.groups.length === 0) {
      this.collapseButton.hidden = true;
    } else {
      this.collapseButton.hidden = false;
      this.collapseButton.textContent = this.collapsed
        ? `Expand chains (${hidden} hidden)`
        : 'Collapse chains';
      this.collapseButton.title = this.collapsed
        ? 'Show every node'
        : `Collapse ${this.groups.length} repeated chain${this.groups.length === 1 ? '' : 's'}`;
    }

    // Visible nodes and edges.
    const visible = new Map<string, IVisibleNode>();
    for (const n of g.nodes) {
      const vid = this.visibleId(n.id);
      if (visible.has(vid)) {
        continue;
      }
      if (vid !== n.id) {
        const grp = this.groupOf.get(n.id)!;
        const [w, hgt] = nodeSize(grp.label, grp.sub, 'op');
        visible.set(vid, {
          id: vid,
          group: grp,
          label: clip(grp.label, 40),
          sub: grp.sub,
          width: w,
          height: hgt,
          x: 0,
          y: 0
        });
      } else {
        const label = clip(n.label);
        const sub = nodeSub(n);
        const [w, hgt] = nodeSize(label, sub, n.kind);
        visible.set(n.id, {
          id: n.id,
          node: n,
          label,
          sub,
          width: w,
          height: hgt,
          x: 0,
          y: 0
        });
      }
    }
    const edges = new Map<string, IVisibleEdge>();
    for (const e of g.edges) {
      const a = this.visibleId(e.from);
      const b = this.visibleId(e.to);
      if (a === b) {
        continue;
      }
      const key = a + '\u0000' + b;
      const ve = edges.get(key);
      if (ve) {
        ve.inputs.push(e.input);
      } else {
        edges.set(key, { from: a, to: b, inputs: [e.input], points: [] });
      }
    }

    // A leaf used by many ops of a big graph is drawn once beside each consumer: its
    // long edges would otherwise cross the whole drawing and make the layout quadratic.
    if (visible.size > PROXY_MIN_NODES) {
      const consumers = new Map<string, IVisibleEdge[]>();
      for (const e of edges.values()) {
        const list = consumers.get(e.to) ?? [];
        list.push(e);
        consumers.set(e.to, list);
      }
      for (const [id, list] of consumers) {
        const v = visible.get(id)!;
        if (!v.node || v.node.kind === 'op' || list.length < PROXY_MIN_FANIN) {
          continue;
        }
        visible.delete(id);
        for (const e of list) {
          const pid = `proxy:${id}:${e.from}`;
          visible.set(pid, { ...v, id: pid, proxy: true });
          edges.delete(e.from + '\u0000' + id);
          edges.set(e.from + '\u0000' + pid, { ...e, to: pid });
        }
      }
    }

    // Layered layout: roots on top, gradient flows down to the leaves.
    const tl = performance.now();
    const big = visible.size > FAST_LAYOUT_NODES;
    this.bounds = big
      ? fastLayout(
          visible,
          [...edges.values()],
          this.graph!.roots.map(r => this.visibleId(r))
        )
      : dagreLayout(visible, [...edges.values()]);
    this.element.dataset.layout = big ? 'fast' : 'dagre';
    this.element.dataset.layoutMs = (performance.now() - tl).toFixed(1);
    this.visible = visible;

    // SVG.
    this.viewport.textContent = '';
    const edgeLayer = s('g', { class: 'sg-edges' });
    for (const e of edges.values()) {
      if (e.points.length < 2) {
        continue;
      }
      let d = `M${e.points[0].x.toFixed(1)},${e.points[0].y.toFixed(1)}`;
      for (const p of e.points.slice(1)) {
        d += ` L${p.x.toFixed(1)},${p.y.toFixed(1)}`;
      }
      const path = s('path', {
        class: 'sg-edge',
        d,
        'marker-end': `url(#${this.markerId})`
      });
      path.dataset.from = e.from;
      path.dataset.to = e.to;
      const title = s('title');
      const src = visible.get(e.from)!;
      title.textContent = `${src.label}.next_functions[${e.inputs.join(', ')}]`;
      path.appendChild(title);
      edgeLayer.appendChild(path);
    }
    const nodeLayer = s('g', { class: 'sg-nodes' });
    this.nodeEls = new Map();
    for (const v of visible.values()) {
      const el = this.drawNode(v);
      this.nodeEls.set(v.id, el);
      nodeLayer.appendChild(el);
    }
    this.viewport.appendChild(edgeLayer);
    this.viewport.appendChild(nodeLayer);
    this.element.dataset.visibleNodes = String(visible.size);
    this.markSelection();
    this.fit(false);
  }

  private drawNode(v: IVisibleNode): SVGGElement {
    const n = v.node;
    const kind = n ? n.kind : 'group';
    const status: CheckStatus = n ? n.check.status : v.group!.status;
    const el = s('g', {
      class: `sg-node sg-kind-${kind} sg-status-${status}`,
      transform: `translate(${(v.x - v.width / 2).toFixed(1)},${(v.y - v.height / 2).toFixed(1)})`,
      tabindex: 0,
      role: 'button'
    });
    el.dataset.nodeId = v.id;
    el.dataset.ref = n ? n.id : v.id;
    el.dataset.kind = kind;
    if (v.proxy) {
      el.classList.add('sg-proxy');
    }
    el.dataset.status = status;
    if (n?.first_bad) {
      el.classList.add('sg-first-bad');
    }
    el.setAttribute('aria-label', v.label + (v.sub ? ', ' + v.sub : ''));
    const title = s('title');
    title.textContent = this.tooltipLines(v).join('\n');
    el.appendChild(title);
    const rx =
      kind === 'none' ? 13 : kind === 'op' || kind === 'group' ? 6 : 14;
    el.appendChild(
      s('rect', {
        class: 'sg-box',
        width: v.width,
        height: v.height,
        rx,
        ry: rx
      })
    );
    if (kind === 'group') {
      el.appendChild(
        s('rect', {
          class: 'sg-box-stack',
          x: 4,
          y: -4,
          width: v.width,
          height: v.height,
          rx,
          ry: rx
        })
      );
      el.insertBefore(el.lastChild!, el.childNodes[1]);
    }
    const label = s('text', {
      class: 'sg-node-label',
      x: v.width / 2,
      y: v.sub ? 17 : v.height / 2 + 4,
      'text-anchor': 'middle'
    });
    label.textContent = v.label;
    el.appendChild(label);
    if (v.sub) {
      const sub = s('text', {
        class: 'sg-node-sub',
        x: v.width / 2,
        y: 32,
        'text-anchor': 'middle'
      });
      sub.textContent = v.sub;
      el.appendChild(sub);
    }
    if (status !== 'none' && kind !== 'none') {
      const bg = s('g', {
        class: 'sg-node-badge',
        transform: `translate(${v.width - 2},2)`
      });
      bg.appendChild(s('circle', { r: 7 }));
      const t = s('text', { 'text-anchor': 'middle', y: 3.5 });
      t.textContent = STATUS_GLYPH[status];
      bg.appendChild(t);
      el.appendChild(bg);
    }
    // Node listeners go with the node's element (redrawn on expand/collapse), so they
    // are not in the view's cleanup list.
    el.addEventListener('click', e => {
      e.stopPropagation();
      if (v.group) {
        this.expanded.add(v.group.id);
        this.draw();
      } else {
        this.userSelect(n ? n.id : v.id);
      }
    });
    el.addEventListener('keydown', e => {
      if (e.key === 'Enter' || e.key === ' ') {
        // Not JupyterLab's: Enter would otherwise put the cell into edit mode.
        e.preventDefault();
        e.stopPropagation();
        el.dispatchEvent(new MouseEvent('click', { bubbles: true }));
      }
    });
    el.addEventListener('mouseenter', () => this.showTooltip(v));
    el.addEventListener('mousemove', e => this.moveTooltip(e));
    el.addEventListener('mouseleave', () => {
      this.tooltip.hidden = true;
    });
    return el;
  }

  private tooltipLines(v: IVisibleNode): string[] {
    if (v.group) {
      return [v.group.label, v.group.sub];
    }
    const n = v.node!;
    if (n.kind === 'none') {
      return ['None', 'an input that needs no gradient'];
    }
    const lines = [n.kind === 'op' ? n.name : `${n.label} (${n.name})`];
    lines.push(`shape ${formatShape(n.shape)} · ${n.dtype ?? 'dtype ?'}`);
    if (n.check.status !== 'none') {
      lines.push(`local check: ${STATUS_TEXT[n.check.status]}`);
    }
    return lines;
  }

  private showTooltip(v: IVisibleNode): void {
    this.tooltip.textContent = '';
    this.tooltipLines(v).forEach((line, i) => {
      this.tooltip.appendChild(
        h('div', i === 0 ? 'sg-tooltip-title' : undefined, line)
      );
    });
    this.tooltip.hidden = false;
  }

  private moveTooltip(e: MouseEvent): void {
    const r = this.canvas.getBoundingClientRect();
    const x = Math.min(e.clientX - r.left + 14, Math.max(r.width - 200, 0));
    this.tooltip.style.left = `${x}px`;
    this.tooltip.style.top = `${e.clientY - r.top + 14}px`;
  }

  private markSelection(): void {
    for (const el of this.nodeEls.values()) {
      el.classList.remove('sg-selected');
    }
    if (this.selected) {
      const target = this.visibleId(this.selected);
      for (const el of this.nodeEls.values()) {
        if (el.dataset.nodeId === target || el.dataset.ref === target) {
          el.classList.add('sg-selected');
        }
      }
    }
  }

  // ----------------------------------------------------------------------- pan and zoom

  private applyTransform(): void {
    const { k, x, y } = this.t;
    this.viewport.setAttribute(
      'transform',
      `translate(${x.toFixed(1)},${y.toFixed(1)}) scale(${k})`
    );
    this.element.dataset.zoom = k.toFixed(3);
  }

  private canvasWidth(): number {
    return this.canvas.clientWidth || this.element.clientWidth || 720;
  }

  /** Fit the graph to the width (not below a readable scale); the root stays in view. */
  private fit(force: boolean): void {
    if (this.userMoved && !force) {
      this.applyTransform();
      return;
    }
    const maxH = this.opts.maxHeight ?? 520;
    const cw = this.canvasWidth();
    const { width, height } = this.bounds;
    let k = Math.min(cw / width, maxH / height, 1.25);
    k = Math.max(k, 0.35);
    const ch = Math.max(Math.min(height * k, maxH), 90);
    this.canvas.style.height = `${Math.ceil(ch)}px`;
    const x = width * k <= cw ? (cw - width * k) / 2 : 0;
    this.t = { k, x, y: height * k <= ch ? (ch - height * k) / 2 : 0 };
    if (width * k > cw && this.graph) {
      // Too wide to fit: centre the first root.
      const root = this.visible.get(this.visibleId(this.graph.roots[0] ?? ''));
      if (root) {
        this.t.x = cw / 2 - root.x * k;
      }
    }
    this.applyTransform();
  }

  private zoomBy(f: number, cx?: number, cy?: number): void {
    const k = Math.min(Math.max(this.t.k * f, 0.05), 4);
    const px = cx ?? this.canvasWidth() / 2;
    const py = cy ?? this.canvas.clientHeight / 2;
    this.t = {
      k,
      x: px - ((px - this.t.x) * k) / this.t.k,
      y: py - ((py - this.t.y) * k) / this.t.k
    };
    this.userMoved = true;
    this.applyTransform();
  }

  private installPanZoom(): void {
    let drag: {
      x: number;
      y: number;
      tx: number;
      ty: number;
      id: number;
    } | null = null;
    this.listen(
      this.canvas,
      'wheel',
      e => {
        if (!(e.ctrlKey || e.metaKey || this.active)) {
          return;
        }
        e.preventDefault();
        const r = this.canvas.getBoundingClientRect();
        this.zoomBy(
          Math.exp(-e.deltaY * 0.0015),
          e.clientX - r.left,
          e.clientY - r.top
        );
      },
      { passive: false }
    );
    this.listen(this.canvas, 'pointerdown', e => {
      this.active = true;
      if ((e.target as Element).closest?.('.sg-node') || e.button !== 0) {
        return;
      }
      drag = {
        x: e.clientX,
        y: e.clientY,
        tx: this.t.x,
        ty: this.t.y,
        id: e.pointerId
      };
      this.canvas.classList.add('sg-dragging');
    });
    this.listen(this.canvas, 'pointermove', e => {
      if (!drag || e.pointerId !== drag.id) {
        return;
      }
      const dx = e.clientX - drag.x;
      const dy = e.clientY - drag.y;
      if (Math.abs(dx) + Math.abs(dy) > 2) {
        if (!this.canvas.hasPointerCapture(e.pointerId)) {
          this.canvas.setPointerCapture(e.pointerId);
        }
        this.userMoved = true;
        this.t.x = drag.tx + dx;
        this.t.y = drag.ty + dy;
        this.applyTransform();
      }
    });
    const end = (e: PointerEvent): void => {
      if (drag && e.pointerId === drag.id) {
        drag = null;
        this.canvas.classList.remove('sg-dragging');
      }
    };
    this.listen(this.canvas, 'pointerup', end);
    this.listen(this.canvas, 'pointercancel', end);
    this.listen(this.canvas, 'blur', () => {
      this.active = false;
    });
    this.listen(this.canvas, 'keydown', e => {
      if (e.key === '+' || e.key === '=') {
        this.zoomBy(1.25);
      } else if (e.key === '-') {
        this.zoomBy(0.8);
      } else if (e.key === 'Escape') {
        this.userSelect(null);
      } else {
        return;
      }
      e.preventDefault();
      e.stopPropagation(); // keep notebook shortcuts out of the drawing's keys
    });
    if (typeof ResizeObserver !== 'undefined') {
      let lastWidth = 0;
      this.resizeObserver = new ResizeObserver(() => {
        const w = this.canvas.clientWidth;
        if (w && Math.abs(w - lastWidth) > 8) {
          lastWidth = w;
          this.fit(false);
        }
      });
      this.resizeObserver.observe(this.canvas);
    }
  }

  // --------------------------------------------------------------------- the node panel

  private renderPanel(): void {
    const p = this.panel;
    p.textContent = '';
    const n = this.selected ? this.byId.get(this.selected) : undefined;
    if (!n) {
      p.dataset.selected = '';
      p.appendChild(
        h(
          'div',
          'sg-panel-empty',
          'Click a node to see what it saved, its formula and its check.'
        )
      );
      return;
    }
    p.dataset.selected = n.id;
    const head = h('div', 'sg-panel-head');
    head.appendChild(
      h('span', 'sg-panel-name', n.kind === 'op' ? n.name : n.label)
    );
    if (n.kind !== 'op') {
      head.appendChild(h('span', 'sg-panel-kind', n.name));
    }
    if (n.check.status !== 'none') {
      head.appendChild(badge(n.check.status));
    }
    p.appendChild(head);
    if (n.first_bad) {
      p.appendChild(
        h('div', 'sg-first-bad-note', 'First node whose backward disagrees.')
      );
    }

    const facts = h('dl', 'sg-facts');
    const fact = (k: string, v: string | HTMLElement): void => {
      facts.appendChild(h('dt', undefined, k));
      const dd = h('dd');
      if (typeof v === 'string') {
        dd.textContent = v;
      } else {
        dd.appendChild(v);
      }
      facts.appendChild(dd);
    };
    if (n.kind !== 'none') {
      fact('shape', formatShape(n.shape));
      fact('dtype', n.dtype ?? '?');
    }
    if (n.variable && n.kind !== 'op') {
      fact('variable', n.variable);
    }
    const leaf = this.leafById.get(n.id);
    if (leaf?.preview) {
      fact('value', h('pre', 'sg-pre', leaf.preview));
    }
    if (leaf?.grad_preview) {
      fact('.grad', h('pre', 'sg-pre', leaf.grad_preview));
    }
    if (n.formula) {
      fact('formula', tex(n.formula));
    }
    if (n.derivative) {
      fact('backward', tex(n.derivative));
    }
    if (n.check.status !== 'none') {
      const c = n.check;
      const parts = [STATUS_TEXT[c.status]];
      if (c.max_abs_err !== undefined && c.max_abs_err !== null) {
        parts.push(`max abs err ${formatNumber(c.max_abs_err)}`);
      }
      if (c.max_rel_err !== undefined && c.max_rel_err !== null) {
        parts.push(`max rel err ${formatNumber(c.max_rel_err)}`);
      }
      if (c.sampled) {
        parts.push(`${c.sampled} sampled elements`);
      }
      fact('local check', parts.join(' · '));
      if (c.message) {
        fact('', c.message);
      }
    }
    p.appendChild(facts);

    // next_functions, in input order.
    const out = (this.graph?.edges ?? [])
      .filter((e: IGraphEdge) => e.from === n.id)
      .sort((a, b) => a.input - b.input);
    if (out.length) {
      p.appendChild(h('div', 'sg-section', 'next_functions'));
      const ul = h('ul', 'sg-next');
      for (const e of out) {
        const t = this.byId.get(e.to);
        const li = h('li');
        const a = h('button', 'sg-link', `[${e.input}] ${t ? t.label : e.to}`);
        a.type = 'button';
        a.dataset.target = e.to;
        this.listen(a, 'click', ev => {
          ev.stopPropagation();
          this.userSelect(e.to);
        });
        li.appendChild(a);
        ul.appendChild(li);
      }
      p.appendChild(ul);
    }

    if (n.kind === 'op') {
      p.appendChild(h('div', 'sg-section', 'saved operands'));
      if (!n.saved.length) {
        p.appendChild(h('div', 'sg-muted', 'nothing saved'));
      } else {
        const table = h('table', 'sg-table sg-saved');
        table.dataset.symgrad = 'saved-operands';
        const hr = h('tr');
        for (const c of ['attribute', 'kind', 'shape', 'dtype', 'value', '']) {
          hr.appendChild(h('th', undefined, c));
        }
        table.appendChild(h('thead')).appendChild(hr);
        const tb = h('tbody');
        for (const sv of n.saved) {
          const tr = h('tr');
          tr.dataset.savedName = sv.name;
          tr.appendChild(h('td', 'sg-code', sv.attr ?? `_saved_${sv.name}`));
          tr.appendChild(h('td', undefined, sv.kind));
          tr.appendChild(
            h(
              'td',
              'sg-code',
              sv.shape !== undefined && sv.shape !== null
                ? formatShape(sv.shape)
                : ''
            )
          );
          tr.appendChild(h('td', undefined, sv.dtype ?? ''));
          const val = h('td');
          if (sv.preview !== undefined) {
            val.appendChild(h('pre', 'sg-pre', sv.preview));
          }
          tr.appendChild(val);
          const note = h('td', 'sg-note');
          if (sv.same_object_as) {
            note.appendChild(document.createTextNode('same object as '));
            note.appendChild(h('code', undefined, sv.same_object_as));
          } else if (sv.is_output) {
            note.textContent = 'this node’s output';
          }
          tr.appendChild(note);
          tb.appendChild(tr);
        }
        table.appendChild(tb);
        p.appendChild(table);
      }
    }
    const row = this.rowByNode.get(n.id);
    if (row) {
      p.appendChild(h('div', 'sg-section', 'gradient check'));
      p.appendChild(this.agreementTable({ ok: null, rows: [row] }, true));
    }
  }

  // ------------------------------------------------------------------ agreement table

  private agreementTable(ag: IAgreement, compact = false): HTMLElement {
    const box = h('div', 'sg-agreement');
    if (!compact) {
      box.dataset.symgrad = 'agreement';
      const head = h('div', 'sg-agreement-head');
      const bits: string[] = [];
      if (ag.mode) {
        bits.push(`${ag.mode} mode`);
      }
      if (ag.rtol !== undefined && ag.rtol !== null) {
        bits.push(`rtol ${formatNumber(ag.rtol)}`);
      }
      if (ag.atol !== undefined && ag.atol !== null) {
        bits.push(`atol ${formatNumber(ag.atol)}`);
      }
      head.appendChild(h('span', 'sg-section', 'Gradient agreement'));
      if (bits.length) {
        head.appendChild(h('span', 'sg-muted', ' (' + bits.join(', ') + ')'));
      }
      box.appendChild(head);
      if (ag.first_bad_node) {
        const fb = this.byId.get(ag.first_bad_node);
        const line = h('div', 'sg-first-bad-note');
        line.appendChild(document.createTextNode('First disagreeing node: '));
        const a = h(
          'button',
          'sg-link',
          fb ? `${fb.label} (${fb.id})` : ag.first_bad_node
        );
        a.type = 'button';
        const target = ag.first_bad_node;
        this.listen(a, 'click', () => this.userSelect(target));
        line.appendChild(a);
        box.appendChild(line);
      }
      if (ag.message) {
        box.appendChild(h('div', 'sg-muted', ag.message));
      }
    }
    const table = h('table', 'sg-table');
    const hr = h('tr');
    const cols = [
      'leaf',
      'status',
      'engine',
      'symbolic',
      'finite diff',
      'max abs err',
      'max rel err'
    ];
    for (const c of cols) {
      hr.appendChild(h('th', undefined, c));
    }
    table.appendChild(h('thead')).appendChild(hr);
    const tb = h('tbody');
    for (const r of ag.rows) {
      const tr = h('tr');
      tr.dataset.leaf = r.leaf;
      tr.dataset.status = r.status;
      const leafCell = h('td', 'sg-code');
      if (r.node && !compact) {
        const a = h('button', 'sg-link', r.leaf);
        a.type = 'button';
        const target = r.node;
        this.listen(a, 'click', () => this.userSelect(target));
        leafCell.appendChild(a);
      } else {
        leafCell.textContent = r.leaf;
      }
      tr.appendChild(leafCell);
      tr.appendChild(h('td')).appendChild(badge(r.status));
      tr.appendChild(h('td')).appendChild(h('pre', 'sg-pre', r.engine ?? '–'));
      const sym = h('td');
      if (r.symbolic_latex) {
        sym.appendChild(tex(r.symbolic_latex));
      }
      if (r.symbolic) {
        sym.appendChild(h('pre', 'sg-pre', r.symbolic));
      }
      if (!r.symbolic && !r.symbolic_latex) {
        sym.textContent = '–';
      }
      tr.appendChild(sym);
      const fd = h('td');
      fd.appendChild(h('pre', 'sg-pre', r.finite_diff ?? '–'));
      if (r.fd_max_abs_err !== undefined && r.fd_max_abs_err !== null) {
        fd.appendChild(
          h('div', 'sg-muted', `err ${formatNumber(r.fd_max_abs_err)}`)
        );
      }
      tr.appendChild(fd);
      tr.appendChild(h('td', 'sg-num', formatNumber(r.max_abs_err)));
      tr.appendChild(h('td', 'sg-num', formatNumber(r.max_rel_err)));
      tb.appendChild(tr);
    }
    table.appendChild(tb);
    box.appendChild(table);
    return box;
  }
}

/** Draw a graph payload into `host`; a bad payload shows a readable error instead. */
export function renderGraphView(
  host: HTMLElement,
  data: unknown,
  opts: IViewOptions = {}
): IGraphView {
  return new GraphView(host, data, opts);
}

// ------------------------------------------------------------------------------ reports

type Num = number | string | null | undefined;

interface IReportLeaf {
  name: string;
  latex: string;
  shape: number[];
  dtype: string;
  status: string;
  max_abs_err: Num;
  max_rel_err: Num;
  worst_index: number[] | null;
  engine_value: Num;
  symbolic_value: Num;
  fd_value: Num;
  fd_max_abs_err: Num;
  checked: number;
  sampled: boolean;
}

interface IReportNode {
  id: number;
  name: string;
  status: string;
  formula: string;
  max_abs_err: Num;
  max_rel_err: Num;
  sampled: boolean;
  detail: string;
}

/** symgrad.report/1 (symgrad/symbolic/report.schema.json), the verifier's Report. */
interface IReport {
  schema: string;
  ok: boolean;
  mode: string;
  requested_mode: string;
  backend: string;
  order: number;
  graph_kind: string;
  tolerances: Record<string, { rtol: number; atol: number }>;
  seconds: number;
  timed_out: boolean;
  cost: number;
  budget: number;
  ran: string[];
  skipped: string[];
  notes: string[];
  first_bad_node: number | null;
  leaves: IReportLeaf[];
  nodes: IReportNode[];
  hvp: { name: string; status: string; max_abs_err: Num }[];
}

/** Map the report's status words onto the badge states. */
export function reportStatus(s: string): CheckStatus {
  switch (s) {
    case 'ok':
      return 'pass';
    case 'mismatch':
      return 'fail';
    case 'error':
    case 'timeout':
      return 'error';
    case 'skipped':
    case 'unsupported':
      return 'skipped';
    default:
      return 'none'; // 'not checked', 'not run'
  }
}

function num(x: Num): string {
  return typeof x === 'string' ? x : formatNumber(x);
}

function table(
  what: string,
  cols: string[],
  rows: { status: CheckStatus; key: string; cells: (string | HTMLElement)[] }[]
): HTMLTableElement {
  const tbl = h('table', 'sg-table');
  tbl.dataset.symgrad = what;
  const hr = h('tr');
  for (const c of cols) {
    hr.appendChild(h('th', undefined, c));
  }
  tbl.appendChild(h('thead')).appendChild(hr);
  const tb = h('tbody');
  for (const r of rows) {
    const tr = h('tr');
    tr.dataset.status = r.status;
    tr.dataset.key = r.key;
    for (const c of r.cells) {
      const td = h('td');
      if (typeof c === 'string') {
        td.textContent = c;
      } else {
        td.appendChild(c);
      }
      tr.appendChild(td);
    }
    tb.appendChild(tr);
  }
  tbl.appendChild(tb);
  return tbl;
}

/** Draw a verifier report (application/vnd.symgrad.report+json, symgrad.report/1). */
export function renderReportView(
  host: HTMLElement,
  data: unknown
): HTMLElement {
  const root = h('div', 'sg-view sg-report');
  root.dataset.symgrad = 'report';
  host.appendChild(root);
  const result = validateReport(data);
  if (!result.ok) {
    root.dataset.state = 'error';
    root.appendChild(
      errorBox('symgrad: this report output cannot be drawn', [
        'The payload does not match the symgrad.report/1 schema:',
        ...result.errors
      ])
    );
    return root;
  }
  const r = result.value as unknown as IReport;
  const head = h('div', 'sg-header');
  head.appendChild(h('span', 'sg-title', 'Gradient check'));
  const overall = badge(
    r.ok ? 'pass' : 'fail',
    r.ok ? 'gradients agree' : 'gradients disagree'
  );
  overall.dataset.symgrad = 'overall';
  head.appendChild(overall);
  const bits = [
    `${r.mode} mode` +
      (r.requested_mode !== r.mode ? ` (asked: ${r.requested_mode})` : ''),
    r.backend,
    r.order === 2 ? 'second order' : 'first order',
    `${r.seconds.toFixed(2)} s`
  ];
  if (r.graph_kind === 'torch') {
    bits.push('PyTorch graph');
  }
  head.appendChild(h('span', 'sg-muted', bits.join(' · ')));
  root.appendChild(head);
  const tols = Object.entries(r.tolerances ?? {}).map(
    ([dt, v]) =>
      `${dt}: rtol ${formatNumber(v.rtol)}, atol ${formatNumber(v.atol)}`
  );
  if (tols.length) {
    root.appendChild(h('div', 'sg-muted', 'tolerances ' + tols.join('; ')));
  }
  if (r.timed_out) {
    root.appendChild(
      h('div', 'sg-notice', 'The verification stopped at its time limit.')
    );
  }
  if (r.first_bad_node !== null && r.first_bad_node !== undefined) {
    const node = r.nodes.find(n => n.id === r.first_bad_node);
    root.appendChild(
      h(
        'div',
        'sg-first-bad-note',
        `First disagreeing node: ${node ? node.name : ''} (#${r.first_bad_node})`
      )
    );
  }
  if (r.ran.length) {
    root.appendChild(h('div', 'sg-muted', `ran: ${r.ran.join(', ')}`));
  }
  for (const [label, items] of [
    ['skipped', r.skipped],
    ['note', r.notes]
  ] as const) {
    for (const item of items) {
      root.appendChild(h('div', 'sg-muted', `${label}: ${item}`));
    }
  }

  root.appendChild(h('div', 'sg-section', 'Leaves'));
  root.appendChild(
    table(
      'report-leaves',
      [
        'leaf',
        'status',
        'shape',
        'engine',
        'symbolic',
        'finite diff',
        'max abs err',
        'max rel err',
        'worst'
      ],
      r.leaves.map(l => {
        const st = reportStatus(l.status);
        return {
          status: st,
          key: l.name,
          cells: [
            h('span', 'sg-code', l.name),
            badge(st, l.status),
            formatShape(l.shape) + ' ' + l.dtype,
            num(l.engine_value),
            num(l.symbolic_value),
            num(l.fd_value) +
              (l.fd_max_abs_err !== null
                ? ` (err ${num(l.fd_max_abs_err)})`
                : ''),
            num(l.max_abs_err),
            num(l.max_rel_err),
            (l.worst_index && l.worst_index.length
              ? '[' + l.worst_index.join(', ') + ']'
              : '–') + (l.sampled ? ` · ${l.checked} sampled` : '')
          ]
        };
      })
    )
  );
  if (r.nodes.some(n => n.status !== 'not run')) {
    root.appendChild(h('div', 'sg-section', 'Nodes (local checks)'));
    root.appendChild(
      table(
        'report-nodes',
        [
          '#',
          'grad_fn',
          'status',
          'formula',
          'max abs err',
          'max rel err',
          'detail'
        ],
        r.nodes.map(n => {
          const st = reportStatus(n.status);
          return {
            status: st,
            key: String(n.id),
            cells: [
              String(n.id),
              h('span', 'sg-code', n.name),
              badge(st, n.status),
              h('span', 'sg-code', n.formula),
              num(n.max_abs_err),
              num(n.max_rel_err),
              n.detail + (n.sampled ? ' (sampled)' : '')
            ]
          };
        })
      )
    );
  }
  if (r.hvp.length) {
    root.appendChild(h('div', 'sg-section', 'Hessian-vector products'));
    root.appendChild(
      table(
        'report-hvp',
        ['leaf', 'status', 'max abs err'],
        r.hvp.map(x => {
          const st = reportStatus(x.status);
          return {
            status: st,
            key: x.name,
            cells: [
              h('span', 'sg-code', x.name),
              badge(st, x.status),
              num(x.max_abs_err)
            ]
          };
        })
      )
    );
  }
  root.dataset.state = 'ready';
  return root;
}
