// The interactive graph view: header and toolbar, the drawing (scene.ts lays it out, or
// modules.ts when the payload names the nn.Module calls; nodes.ts draws it, panzoom.ts
// moves it), selection, chain and module collapsing, focus on one module, the node panel
// and the agreement table (panel.ts). Plain DOM only: no framework, and every string from
// the payload is inserted with textContent or as an attribute value, never parsed as HTML.
import { AUTO_COLLAPSE_NODES, findChains, IGroup } from './chains';
import { badge, errorBox, h, s } from './format';
import { IBounds, IVisibleNode } from './layout';
import {
  buildModuleScene,
  ICluster,
  IModuleState,
  ModuleTree,
  moduleTitle
} from './modules';
import {
  drawCluster,
  drawEdges,
  drawNode,
  INodeActions,
  tooltipLines
} from './nodes';
import { agreementTable, IPanelContext, renderNodePanel } from './panel';
import { Listen, MIN_LABEL_PX, PanZoom } from './panzoom';
import { buildScene, IScene } from './scene';
import {
  CheckStatus,
  IAgreementRow,
  IGraphNode,
  IGraphPayload,
  ILeaf
} from './types';
import { validateGraph } from './validate';

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

let uid = 0;

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
  private bounds: IBounds = { width: 1, height: 1 };
  private panZoom: PanZoom | null = null;
  private cleanup: (() => void)[] = [];
  private markerId = `sg-arrow-${++uid}`;
  // Modules (null: the payload has none, drawn as before).
  private tree: ModuleTree | null = null;
  private mstate: IModuleState = {
    collapsed: new Set(),
    unfolded: new Set(),
    focus: null
  };
  /** Modules and folds the user opened or closed (kept when a parent opens). */
  private touched = new Set<string>();
  /** A big model (the payload collapses some modules): open one level at a time. */
  private big = false;
  /** The module the payload itself was cut to (the focus bar's way back ends there). */
  private baseFocus: string | null = null;
  /** What the user just opened (a frame or box id): panned into view after drawing. */
  private showAfterDraw: string | null = null;
  /** Graph node id -> drawn id, in the module view (null: not drawn with modules). */
  private repOf: Map<string, string> | null = null;

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
  private focusBar!: HTMLElement;

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
    const prevTree = this.tree;
    const tree = new ModuleTree(g);
    this.tree = tree.active ? tree : null;
    this.repOf = null;
    if (this.tree && !(prevTree && prevTree.sameShape(this.tree))) {
      // A new model: its default view. The same model verified again keeps the view.
      this.mstate = this.tree.initialState(g);
      this.touched = new Set();
    }
    // A payload cut to one module (symgrad.graph(root, focus=...)) shows it alone.
    this.baseFocus =
      this.tree && g.focus !== undefined && this.tree.modules.has(g.focus)
        ? g.focus
        : null;
    if (this.tree && this.mstate.focus === null) {
      this.mstate.focus = this.baseFocus;
    }
    this.big = (g.collapsed?.length ?? 0) > 0;
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
    let redraw = false;
    if (
      id &&
      this.groupOf.has(id) &&
      !this.expanded.has(this.groupOf.get(id)!.id)
    ) {
      this.expanded.add(this.groupOf.get(id)!.id);
      redraw = true;
    }
    if (id && this.tree && this.repOf && this.repOf.get(id) !== id) {
      // Hidden in a collapsed module or fold, or outside the focused module: open the way.
      this.tree.reveal(this.mstate, this.tree.owner.get(id));
      this.showAfterDraw = id;
      redraw = true;
    }
    if (redraw) {
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
    this.panZoom?.dispose();
    this.panZoom = null;
  }

  private listen: Listen = (target, type, fn, options) => {
    const f = fn as EventListener;
    target.addEventListener(type, f, options);
    this.cleanup.push(() => target.removeEventListener(type, f, options));
  };

  private userSelect(id: string | null): void {
    this.select(id);
    this.opts.onSelect?.(this.selected);
  }

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
    if (this.tree) {
      const nm = this.tree.modules.size;
      counts.textContent += ` · ${nm} module${nm === 1 ? '' : 's'}`;
    }
    this.header.appendChild(counts);
    const ag = g.agreement;
    if (ag) {
      const status: CheckStatus =
        ag.ok === true ? 'pass' : ag.ok === false ? 'fail' : 'none';
      // verdict: why neither (ok null), or at which values it holds (ok a bool)
      const text =
        ag.verdict ||
        (ag.ok === true
          ? 'gradients agree'
          : ag.ok === false
            ? 'gradients disagree'
            : 'unverified');
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
      this.panZoom!.userMoved = false;
      this.panZoom!.fit(true);
    });
    button('+', 'Zoom in', () => this.panZoom!.zoomBy(1.25));
    button('−', 'Zoom out', () => this.panZoom!.zoomBy(0.8));
    this.collapseButton = button('', '', () => {
      this.collapsed = !this.collapsed;
      this.expanded.clear();
      this.draw();
    });
    this.collapseButton.dataset.symgrad = 'collapse';
    if (this.tree) {
      const tree = this.tree;
      button(
        'Collapse modules',
        'Draw the top-level modules as one box each',
        () => {
          this.mstate.collapsed = new Set(tree.modules.keys());
          this.mstate.unfolded.clear();
          this.touched.clear();
          this.draw();
        }
      ).dataset.symgrad = 'modules-collapse';
      button('Expand modules', 'Open every module and fold', () => {
        this.mstate.collapsed.clear();
        this.mstate.unfolded = new Set(tree.folds.map(f => f.id));
        this.draw();
      }).dataset.symgrad = 'modules-expand';
    }
    const hint = h(
      'span',
      'sg-hint',
      'drag to pan · Ctrl+wheel to zoom · click a node' +
        (this.tree ? ' · click a module to open or close it' : '')
    );
    this.toolbar.appendChild(hint);
    this.element.appendChild(this.toolbar);
    this.focusBar = h('div', 'sg-focus-bar');
    this.focusBar.dataset.symgrad = 'focus-bar';
    this.focusBar.hidden = true;
    this.element.appendChild(this.focusBar);

    if (g.truncated) {
      this.element.appendChild(
        h(
          'div',
          'sg-notice',
          `${g.truncated} more node${g.truncated === 1 ? '' : 's'} not shown (graph too large).`
        )
      );
    }
    if (g.formulas_omitted) {
      this.element.appendChild(
        h(
          'div',
          'sg-notice',
          `${g.formulas_omitted} node${g.formulas_omitted === 1 ? '' : 's'} shown without ` +
            'a formula (graph too large to derive them all).'
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
      this.agreementBox.appendChild(
        agreementTable(this.panelContext(), g.agreement)
      );
    }
    this.element.appendChild(this.agreementBox);
    this.panZoom = new PanZoom({
      element: this.element,
      canvas: this.canvas,
      viewport: this.viewport,
      maxHeight: this.opts.maxHeight ?? 520,
      listen: this.listen,
      bounds: () => this.bounds,
      minScale: () => MIN_LABEL_PX / this.labelFontPx(),
      anchorX: () => {
        const root = this.graph?.roots[0];
        return root === undefined
          ? null
          : (this.visible.get(this.visibleId(root))?.x ?? null);
      },
      onEscape: () => this.userSelect(null)
    });
  }

  /** The font size of node labels as the page's CSS sets it (12px by default). */
  private labelFontPx(): number {
    const label = this.viewport.querySelector('.sg-node-label');
    const px = label ? parseFloat(getComputedStyle(label).fontSize) : NaN;
    return Number.isFinite(px) && px > 0 ? px : 12;
  }

  private computeGroups(): void {
    const g = this.graph!;
    const keep = new Set<string>(this.selected ? [this.selected] : []);
    this.groups = findChains(g, keep);
    const tree = this.tree;
    if (tree) {
      // A chain never crosses a module's edge: it is drawn inside one frame.
      this.groups = this.groups.filter(grp => {
        const p = tree.owner.get(grp.members[0].id);
        return grp.members.every(m => tree.owner.get(m.id) === p);
      });
    }
    this.groupOf = new Map();
    for (const grp of this.groups) {
      for (const m of grp.members) {
        this.groupOf.set(m.id, grp);
      }
    }
  }

  // ------------------------------------------------------------------- layout + drawing

  /** The id drawn for a node (a module or fold box, its chain's, or its own). */
  private visibleId(id: string): string {
    if (this.repOf) {
      return this.repOf.get(id) ?? id;
    }
    return this.chainId(id);
  }

  /** The id drawn for a node, modules aside: its collapsed chain's, or its own. */
  private chainId(id: string): string {
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

    // Visible nodes and edges, placed by the payload's layout when it covers them.
    const tl = performance.now();
    let scene: IScene;
    let clusters: ICluster[] = [];
    if (this.tree) {
      const ms = buildModuleScene(
        g,
        this.tree,
        this.mstate,
        id => this.chainId(id),
        this.groupOf
      );
      scene = {
        visible: ms.visible,
        edges: ms.edges,
        bounds: ms.bounds,
        layout: ms.layout
      };
      clusters = ms.clusters;
      this.repOf = ms.repOf;
    } else {
      scene = buildScene(g, id => this.visibleId(id), this.groupOf);
    }
    this.bounds = scene.bounds;
    this.visible = scene.visible;
    this.element.dataset.layout = scene.layout;
    this.element.dataset.layoutMs = (performance.now() - tl).toFixed(1);

    // SVG.
    this.viewport.textContent = '';
    const edgeLayer = drawEdges(scene.edges, scene.visible, this.markerId);
    const nodeLayer = s('g', { class: 'sg-nodes' });
    this.nodeEls = new Map();
    const actions: INodeActions = {
      select: id => this.userSelect(id),
      expand: id => {
        this.expanded.add(id);
        this.draw();
      },
      hover: v => {
        if (v) {
          this.showTooltip(v);
        } else {
          this.tooltip.hidden = true;
        }
      },
      move: e => this.moveTooltip(e),
      toggleModule: path => this.toggleModule(path),
      toggleFold: id => this.toggleFold(id),
      focus: path => this.focusOn(path)
    };
    const frameLayer = s('g', { class: 'sg-clusters' });
    const headLayer = s('g', { class: 'sg-cluster-heads' });
    for (const c of clusters) {
      const { frame, header } = drawCluster(c, actions);
      frameLayer.appendChild(frame);
      headLayer.appendChild(header);
    }
    for (const v of scene.visible.values()) {
      const el = drawNode(v, actions);
      this.nodeEls.set(v.id, el);
      nodeLayer.appendChild(el);
    }
    this.viewport.appendChild(frameLayer);
    this.viewport.appendChild(edgeLayer);
    this.viewport.appendChild(headLayer);
    this.viewport.appendChild(nodeLayer);
    this.element.dataset.visibleNodes = String(scene.visible.size);
    this.element.dataset.focus = this.mstate.focus ?? '';
    this.renderFocusBar();
    this.markSelection();
    this.panZoom!.fit(false);
    const target = this.showAfterDraw;
    this.showAfterDraw = null;
    if (target !== null) {
      const c = clusters.find(x => x.id === target);
      const v = scene.visible.get(target);
      if (c) {
        this.panZoom!.show(c);
      } else if (v) {
        this.panZoom!.show({
          x: v.x - v.width / 2,
          y: v.y - v.height / 2,
          width: v.width,
          height: v.height
        });
      }
    }
  }

  // ------------------------------------------------------------------------- modules

  /** Open a module; in a big model its submodules stay closed until opened in turn. */
  private openModule(path: string): void {
    const m = this.tree!.modules.get(path)!;
    this.mstate.collapsed.delete(path);
    if (this.big) {
      for (const c of m.children) {
        if (!this.touched.has(c)) {
          this.mstate.collapsed.add(c);
        }
      }
    }
  }

  private toggleModule(path: string): void {
    this.touched.add(path);
    if (this.mstate.collapsed.has(path)) {
      this.openModule(path);
    } else {
      this.mstate.collapsed.add(path);
    }
    this.showAfterDraw = 'module:' + path; // its frame, or its box
    this.draw();
  }

  private toggleFold(id: string): void {
    const fold = this.tree!.foldById.get(id)!;
    this.touched.add(id);
    this.showAfterDraw = id;
    if (this.mstate.unfolded.has(id)) {
      this.mstate.unfolded.delete(id);
    } else {
      this.mstate.unfolded.add(id);
      if (this.big) {
        for (const p of fold.members) {
          if (!this.touched.has(p)) {
            this.mstate.collapsed.add(p);
          }
        }
      }
    }
    this.draw();
  }

  /** Draw one module alone (null: the whole graph again). */
  private focusOn(path: string | null): void {
    if (path !== null && this.mstate.collapsed.has(path)) {
      this.touched.add(path);
      this.openModule(path);
    }
    this.mstate.focus = path;
    if (this.panZoom) {
      this.panZoom.userMoved = false;
    }
    this.draw();
  }

  /** 'Focused on' with the way back: the whole graph, or any enclosing module. */
  private renderFocusBar(): void {
    const bar = this.focusBar;
    bar.textContent = '';
    const focus = this.mstate.focus;
    if (!this.tree || focus === null) {
      bar.hidden = true;
      return;
    }
    bar.hidden = false;
    const link = (text: string, title: string, to: string | null): void => {
      const b = h('button', 'sg-link', text);
      b.type = 'button';
      b.title = title;
      b.dataset.focusTo = to ?? '';
      this.listen(b, 'click', e => {
        e.stopPropagation();
        this.focusOn(to);
      });
      bar.appendChild(b);
    };
    const base = this.baseFocus;
    const m = this.tree.modules.get(focus)!;
    if (focus === base) {
      // The payload itself holds only this module: there is nothing to go back to.
      bar.appendChild(h('span', 'sg-muted', 'The graph was cut to '));
    } else {
      link(
        base === null ? '← whole graph' : `← ${base}`,
        base === null ? 'Draw the whole graph again' : `Draw ${base} again`,
        base
      );
      bar.lastElementChild!.setAttribute('data-symgrad', 'unfocus');
      for (const p of this.tree.chain(focus).slice(0, -1)) {
        if (
          p === base ||
          (base !== null && !this.tree.chain(p).includes(base))
        ) {
          continue; // the way back, or outside the payload's cut
        }
        bar.appendChild(h('span', 'sg-crumb-sep', ' › '));
        link(p, `Focus on ${p}`, p);
      }
      bar.appendChild(h('span', 'sg-crumb-sep', ' › '));
    }
    const cur = h('span', 'sg-crumb-current', moduleTitle(m));
    cur.dataset.symgrad = 'focused-module';
    bar.appendChild(cur);
  }

  private showTooltip(v: IVisibleNode): void {
    this.tooltip.textContent = '';
    tooltipLines(v).forEach((line, i) => {
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

  private panelContext(): IPanelContext {
    return {
      graph: this.graph!,
      byId: this.byId,
      leafById: this.leafById,
      rowByNode: this.rowByNode,
      listen: this.listen,
      select: id => this.userSelect(id),
      moduleOf: id => {
        const p = this.tree?.owner.get(id);
        return p === undefined ? null : this.tree!.modules.get(p)!;
      },
      focus: path => this.focusOn(path)
    };
  }

  private renderPanel(): void {
    renderNodePanel(this.panel, this.panelContext(), this.selected);
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
