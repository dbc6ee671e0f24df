// Module-aware drawing: the nn.Module calls that produced the nodes (the payload's
// `modules`, `folds`, `collapsed` and each node's `module`) drawn as boxes. An expanded
// module is a frame (a cluster) around what it produced, with a header "path: Type" and
// its verdict; a collapsed one is a single box with its node count, edges re-routed to it;
// a fold (consecutive sibling modules of one structure) is one box "Block × N" until
// expanded; a focused module is drawn alone. Only what is visible is laid out, one level
// of nesting at a time (each frame's contents on their own, then the frame as one box in
// its parent's level), so a 10,000-node model collapsed to its top-level modules lays out
// a handful of boxes.
import { IGroup } from './chains';
import { clip, nodeSub } from './format';
import {
  dagreLayout,
  FAST_LAYOUT_NODES,
  fastLayout,
  IBounds,
  IVisibleEdge,
  IVisibleNode,
  nodeSize,
  shippedLayout
} from './layout';
import { IGraphNode, IGraphPayload, ModuleVerdict } from './types';

/** Height of a frame's header strip. */
export const HEADER_H = 24;
const CHAR_W = 7.2;
/** Room in a header or box for the verdict badge and the focus button. */
const HEADER_EXTRA = 130;
const BOX_H = 42;

export interface IModuleInfo {
  path: string;
  type: string;
  /** Parent module path (null: a top-level module, or its parent is not drawn). */
  parent: string | null;
  depth: number;
  verdict: ModuleVerdict;
  firstBad: string | null;
  children: string[];
  /** The fold this module is a member of. */
  fold: IFoldInfo | null;
  /** Nodes drawn inside it (its submodules' included). */
  count: number;
}

export interface IFoldInfo {
  /** 'fold:' + the first member's path. */
  id: string;
  label: string;
  parent: string | null;
  members: string[];
  verdict: ModuleVerdict;
  count: number;
}

/** What the user has opened and closed. */
export interface IModuleState {
  /** Module paths drawn as one box. */
  collapsed: Set<string>;
  /** Fold ids drawn as their members. */
  unfolded: Set<string>;
  /** The module drawn alone, or null. */
  focus: string | null;
}

/** 'path: Type' (a root module with an empty path: its type). */
export function moduleTitle(m: { path: string; type: string }): string {
  return m.path ? `${m.path}: ${m.type}` : m.type;
}

/** Verdict of several modules: bad if any is, ok if all are, else not checked. */
function combine(verdicts: ModuleVerdict[]): ModuleVerdict {
  if (verdicts.includes('bad')) {
    return 'bad';
  }
  return verdicts.length && verdicts.every(v => v === 'ok')
    ? 'ok'
    : 'unchecked';
}

export const VERDICT_TEXT: Record<ModuleVerdict, string> = {
  ok: '✓',
  bad: '✗',
  unchecked: 'not checked'
};

/**
 * The module tree of a payload and which module each node belongs to: the node's own
 * `module` (its innermost call), else the deepest module listing it. A leaf or None input
 * that no module call produced belongs to the innermost module enclosing every op that
 * uses it (a layer's weight goes in the layer's box; an input shared by two blocks stays
 * outside them both).
 */
export class ModuleTree {
  readonly modules = new Map<string, IModuleInfo>();
  readonly folds: IFoldInfo[] = [];
  readonly foldById = new Map<string, IFoldInfo>();
  /** Node id -> innermost module path. */
  readonly owner = new Map<string, string>();
  /** Top-level module paths, in payload order. */
  readonly top: string[] = [];
  private chains = new Map<string, string[]>();

  constructor(g: IGraphPayload) {
    for (const m of g.modules ?? []) {
      if (this.modules.has(m.path)) {
        continue;
      }
      this.modules.set(m.path, {
        path: m.path,
        type: m.type,
        parent: m.parent,
        depth: 0,
        verdict: m.verdict,
        firstBad: m.first_bad ?? null,
        children: [],
        fold: null,
        count: 0
      });
    }
    for (const m of this.modules.values()) {
      if (m.parent !== null && !this.modules.has(m.parent)) {
        m.parent = null;
      }
    }
    for (const m of this.modules.values()) {
      // A parent cycle (a bad payload) is cut: the module is drawn at the top.
      const seen = new Set([m.path]);
      for (let p = m.parent; p !== null; p = this.modules.get(p)!.parent) {
        if (seen.has(p)) {
          m.parent = null;
          break;
        }
        seen.add(p);
      }
    }
    for (const m of this.modules.values()) {
      const chain = this.chain(m.path);
      m.depth = chain.length - 1;
      if (m.parent === null) {
        this.top.push(m.path);
      } else {
        this.modules.get(m.parent)!.children.push(m.path);
      }
    }

    // Owners: the node's own module, else the deepest module listing it.
    const byId = new Map(g.nodes.map(n => [n.id, n] as const));
    for (const n of g.nodes) {
      const p = this.known(n.module);
      if (p !== null) {
        this.owner.set(n.id, p);
      }
    }
    const listed = new Map<string, string>();
    for (const m of g.modules ?? []) {
      const info = this.modules.get(m.path)!;
      for (const id of m.nodes) {
        const cur = listed.get(id);
        if (cur === undefined || this.modules.get(cur)!.depth < info.depth) {
          listed.set(id, m.path);
        }
      }
    }
    for (const [id, p] of listed) {
      if (!this.owner.has(id) && byId.has(id)) {
        this.owner.set(id, p);
      }
    }
    // Leaves and None inputs go with the ops that use them.
    const users = new Map<string, string[]>();
    for (const e of g.edges) {
      (users.get(e.to) ?? users.set(e.to, []).get(e.to)!).push(e.from);
    }
    for (const n of g.nodes) {
      if (n.kind === 'op' || this.owner.has(n.id)) {
        continue;
      }
      const us = users.get(n.id) ?? [];
      let common: string[] | null = null;
      for (const u of us) {
        const p = this.owner.get(u);
        if (p === undefined) {
          common = null;
          break;
        }
        const chain = this.chain(p);
        if (common === null) {
          common = chain;
        } else {
          let i = 0;
          while (i < common.length && common[i] === chain[i]) {
            i++;
          }
          common = common.slice(0, i);
        }
        if (!common.length) {
          break;
        }
      }
      if (common && common.length) {
        this.owner.set(n.id, common[common.length - 1]);
      }
    }

    for (const p of this.owner.values()) {
      for (const a of this.chain(p)) {
        this.modules.get(a)!.count++;
      }
    }

    for (const f of g.folds ?? []) {
      const members = f.members.filter(
        p => this.modules.has(p) && !this.modules.get(p)!.fold
      );
      if (members.length < 2) {
        continue;
      }
      const parent = this.modules.get(members[0])!.parent;
      if (members.some(p => this.modules.get(p)!.parent !== parent)) {
        continue; // not siblings: not drawn as one
      }
      const fold: IFoldInfo = {
        id: 'fold:' + members[0],
        label: f.label,
        parent,
        members,
        verdict: combine(members.map(p => this.modules.get(p)!.verdict)),
        count: members.reduce((a, p) => a + this.modules.get(p)!.count, 0)
      };
      for (const p of members) {
        this.modules.get(p)!.fold = fold;
      }
      this.folds.push(fold);
      this.foldById.set(fold.id, fold);
    }
  }

  /** Whether the payload has modules to draw. */
  get active(): boolean {
    return this.modules.size > 0;
  }

  /** The known module a path names: itself, else its nearest known prefix. */
  known(path: string | undefined | null): string | null {
    if (path === undefined || path === null) {
      return null;
    }
    let p = path;
    for (;;) {
      if (this.modules.has(p)) {
        return p;
      }
      const dot = p.lastIndexOf('.');
      if (dot < 0) {
        return null;
      }
      p = p.slice(0, dot);
    }
  }

  /** The module's ancestors and itself, outermost first. */
  chain(path: string): string[] {
    const cached = this.chains.get(path);
    if (cached) {
      return cached;
    }
    const out: string[] = [];
    const seen = new Set<string>();
    let p: string | null = path;
    while (p !== null && this.modules.has(p) && !seen.has(p)) {
      seen.add(p);
      out.push(p);
      p = this.modules.get(p)!.parent;
    }
    out.reverse();
    this.chains.set(path, out);
    return out;
  }

  /** Open every module and fold between the top and `path` (and leave focus if outside). */
  reveal(state: IModuleState, path: string | undefined): void {
    if (path === undefined) {
      if (state.focus !== null) {
        state.focus = null;
      }
      return;
    }
    const chain = this.chain(path);
    if (state.focus !== null && !chain.includes(state.focus)) {
      state.focus = null;
    }
    for (const p of chain) {
      state.collapsed.delete(p);
      const f = this.modules.get(p)!.fold;
      if (f) {
        state.unfolded.add(f.id);
      }
    }
  }

  /** The default state: the payload's collapsed modules, every fold folded. */
  initialState(g: IGraphPayload): IModuleState {
    return {
      collapsed: new Set((g.collapsed ?? []).filter(p => this.modules.has(p))),
      unfolded: new Set(),
      focus: null
    };
  }

  /** Same modules and folds (a re-verified graph of the same model keeps its view). */
  sameShape(other: ModuleTree): boolean {
    if (other.modules.size !== this.modules.size) {
      return false;
    }
    for (const p of this.modules.keys()) {
      if (!other.modules.has(p)) {
        return false;
      }
    }
    return (
      other.folds.length === this.folds.length &&
      this.folds.every(f => other.foldById.has(f.id))
    );
  }
}

/** A frame drawn around an expanded module or fold. */
export interface ICluster {
  id: string;
  kind: 'module' | 'fold';
  module?: IModuleInfo;
  fold?: IFoldInfo;
  label: string;
  verdict: ModuleVerdict;
  /** The frame it is drawn in (null: the top level). */
  parent: string | null;
  /** Frames around it, outermost first. */
  ancestors: string[];
  items: string[];
  children: string[];
  /** Top-left corner and size, in drawing coordinates. */
  x: number;
  y: number;
  width: number;
  height: number;
  /** Where its contents were laid out (their origin and size). */
  inner: IBounds;
  /** The focused module (drawn alone). */
  focused: boolean;
}

export interface IModuleScene {
  visible: Map<string, IVisibleNode>;
  edges: IVisibleEdge[];
  bounds: IBounds;
  clusters: ICluster[];
  /** Graph node id -> the id drawn for it (absent: hidden by the focus). */
  repOf: Map<string, string>;
  /** 'payload': the payload's layout placed it (no frame drawn: the first view of a
   * collapsed model, as the static SVG draws it); 'modules': laid out here. */
  layout: 'payload' | 'modules';
}

interface IPlacement {
  /** The module or fold box standing for the node, or null: the node is drawn. */
  box: string | null;
  containers: string[];
}

function boxSize(label: string, sub: string): [number, number] {
  const chars = Math.max(label.length, sub.length + 12);
  return [Math.min(Math.max(chars * CHAR_W + 40, 120), 360), BOX_H];
}

/**
 * What is drawn of `g` with modules: `nodeRep` maps a node to its drawn id outside module
 * boxes (its collapsed chain's, or its own), `groupOf` gives a chain's members.
 */
export function buildModuleScene(
  g: IGraphPayload,
  tree: ModuleTree,
  state: IModuleState,
  nodeRep: (id: string) => string,
  groupOf: Map<string, IGroup>
): IModuleScene {
  const placements = new Map<string, IPlacement | null>();
  const place = (owner: string | undefined): IPlacement | null => {
    const key = owner ?? '\u0000';
    if (placements.has(key)) {
      return placements.get(key)!;
    }
    let out: IPlacement | null = null;
    if (owner === undefined) {
      out = state.focus === null ? { box: null, containers: [] } : null;
    } else {
      let chain = tree.chain(owner);
      const start = state.focus === null ? 0 : chain.indexOf(state.focus);
      if (start >= 0) {
        chain = chain.slice(start);
        const containers: string[] = [];
        out = { box: null, containers };
        for (const p of chain) {
          const m = tree.modules.get(p)!;
          const isFocus = p === state.focus;
          if (m.fold && !isFocus) {
            if (!state.unfolded.has(m.fold.id)) {
              out.box = m.fold.id;
              break;
            }
            containers.push(m.fold.id);
          }
          if (state.collapsed.has(p) && !isFocus) {
            out.box = 'module:' + p;
            break;
          }
          containers.push('module:' + p);
        }
      }
    }
    placements.set(key, out);
    return out;
  };

  const byId = new Map(g.nodes.map(n => [n.id, n] as const));
  const labelOf = (id: string): string => byId.get(id)?.label ?? id;
  const visible = new Map<string, IVisibleNode>();
  const ancestorsOf = new Map<string, string[]>();
  const clusters = new Map<string, ICluster>();
  const repOf = new Map<string, string>();
  const root: { items: string[]; children: string[] } = {
    items: [],
    children: []
  };
  const addCluster = (containers: string[]): void => {
    for (let i = 0; i < containers.length; i++) {
      const id = containers[i];
      if (clusters.has(id)) {
        continue;
      }
      const parent = i ? containers[i - 1] : null;
      const isFold = id.startsWith('fold:');
      const fold = isFold ? tree.foldById.get(id)! : undefined;
      const module = isFold
        ? undefined
        : tree.modules.get(id.slice('module:'.length))!;
      clusters.set(id, {
        id,
        kind: isFold ? 'fold' : 'module',
        module,
        fold,
        label: fold
          ? `${fold.label} (${fold.members[0]} … ${fold.members[fold.members.length - 1]})`
          : moduleTitle(module!),
        verdict: fold ? fold.verdict : module!.verdict,
        parent,
        ancestors: containers.slice(0, i),
        items: [],
        children: [],
        x: 0,
        y: 0,
        width: 0,
        height: 0,
        inner: { width: 0, height: 0 },
        focused: module !== undefined && module.path === state.focus
      });
      (parent === null ? root : clusters.get(parent)!).children.push(id);
    }
  };

  for (const n of g.nodes) {
    const pl = place(tree.owner.get(n.id));
    if (pl === null) {
      continue;
    }
    const vid = pl.box ?? nodeRep(n.id);
    repOf.set(n.id, vid);
    if (visible.has(vid)) {
      continue;
    }
    addCluster(pl.containers);
    const parent = pl.containers.length
      ? pl.containers[pl.containers.length - 1]
      : null;
    (parent === null ? root : clusters.get(parent)!).items.push(vid);
    ancestorsOf.set(vid, pl.containers);
    visible.set(vid, makeItem(vid, n, tree, groupOf, labelOf));
  }

  // Edges between drawn items (merged, none inside one box).
  const edges = new Map<string, IVisibleEdge>();
  for (const e of g.edges) {
    const a = repOf.get(e.from);
    const b = repOf.get(e.to);
    if (a === undefined || b === undefined || a === b) {
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

  // Nothing expanded (a big model's first view): the boxes the static SVG draws, where
  // the payload's layout puts them, when it covers exactly what is drawn.
  if (!clusters.size && state.focus === null) {
    const list = [...edges.values()];
    const bounds = shippedLayout(visible, list, g.layout);
    if (bounds) {
      return {
        visible,
        edges: list,
        bounds,
        clusters: [],
        repOf,
        layout: 'payload'
      };
    }
  }

  // Each level (the top, each frame) laid out on its own, deepest frames first.
  const level = new Map<string | null, Map<string, IVisibleEdge>>();
  const direct = new Set<IVisibleEdge>();
  for (const e of edges.values()) {
    const au = ancestorsOf.get(e.from)!;
    const av = ancestorsOf.get(e.to)!;
    let d = 0;
    while (d < au.length && d < av.length && au[d] === av[d]) {
      d++;
    }
    const at = d ? au[d - 1] : null;
    const u = au[d] ?? e.from;
    const v = av[d] ?? e.to;
    if (u === e.from && v === e.to) {
      direct.add(e);
    }
    const lev = level.get(at) ?? level.set(at, new Map()).get(at)!;
    const key = u + '\u0000' + v;
    const le = lev.get(key);
    if (le) {
      le.inputs.push(...e.inputs);
    } else {
      lev.set(key, { from: u, to: v, inputs: [...e.inputs], points: [] });
    }
  }
  const frameBox = new Map<string, IVisibleNode>();
  const layoutLevel = (
    id: string | null,
    items: string[],
    children: string[]
  ): { bounds: IBounds; nodes: Map<string, IVisibleNode> } => {
    const nodes = new Map<string, IVisibleNode>();
    for (const it of items) {
      nodes.set(it, visible.get(it)!);
    }
    for (const c of children) {
      nodes.set(c, frameBox.get(c)!);
    }
    const list = [...(level.get(id)?.values() ?? [])];
    const bounds =
      nodes.size > FAST_LAYOUT_NODES
        ? fastLayout(nodes, list, [])
        : dagreLayout(nodes, list);
    return { bounds, nodes };
  };
  const ordered = [...clusters.values()].sort(
    (a, b) => b.ancestors.length - a.ancestors.length
  );
  const levelNodes = new Map<string | null, Map<string, IVisibleNode>>();
  for (const c of ordered) {
    const { bounds, nodes } = layoutLevel(c.id, c.items, c.children);
    levelNodes.set(c.id, nodes);
    c.inner = bounds;
    c.width = Math.max(bounds.width, c.label.length * CHAR_W + HEADER_EXTRA);
    c.height = bounds.height + HEADER_H;
    frameBox.set(c.id, {
      id: c.id,
      label: c.label,
      sub: '',
      width: c.width,
      height: c.height,
      x: 0,
      y: 0
    });
  }
  const top = layoutLevel(null, root.items, root.children);
  levelNodes.set(null, top.nodes);

  // Relative to absolute, outermost first: a frame's contents are centred under its header.
  const toDrawing = (id: string | null, ox: number, oy: number): void => {
    for (const v of levelNodes.get(id)!.values()) {
      v.x += ox;
      v.y += oy;
      const c = clusters.get(v.id);
      if (c) {
        c.x = v.x - c.width / 2;
        c.y = v.y - c.height / 2;
        toDrawing(c.id, c.x + (c.width - c.inner.width) / 2, c.y + HEADER_H);
      }
    }
  };
  toDrawing(null, 0, 0);
  for (const [id, lev] of level) {
    const c = id === null ? null : clusters.get(id)!;
    const ox = c ? c.x + (c.width - c.inner.width) / 2 : 0;
    const oy = c ? c.y + HEADER_H : 0;
    for (const le of lev.values()) {
      for (const p of le.points) {
        p.x += ox;
        p.y += oy;
      }
    }
  }
  for (const e of edges.values()) {
    const a = visible.get(e.from)!;
    const b = visible.get(e.to)!;
    const au = ancestorsOf.get(e.from)!;
    const lev = level.get(au.length ? au[au.length - 1] : null);
    const le = direct.has(e) ? lev?.get(e.from + '\u0000' + e.to) : undefined;
    e.points =
      le && le.points.length >= 2
        ? le.points
        : [
            { x: a.x, y: a.y + a.height / 2 },
            { x: b.x, y: b.y - b.height / 2 }
          ];
  }
  return {
    visible,
    edges: [...edges.values()],
    bounds: top.bounds,
    clusters: [...clusters.values()].sort(
      (a, b) => a.ancestors.length - b.ancestors.length
    ),
    repOf,
    layout: 'modules'
  };
}

function makeItem(
  vid: string,
  n: IGraphNode,
  tree: ModuleTree,
  groupOf: Map<string, IGroup>,
  labelOf: (id: string) => string
): IVisibleNode {
  if (vid.startsWith('module:')) {
    const m = tree.modules.get(vid.slice('module:'.length))!;
    const label = clip(moduleTitle(m), 44);
    // A bad box names the node to look for inside.
    const sub =
      `${m.count} node${m.count === 1 ? '' : 's'}` +
      (m.verdict === 'bad' && m.firstBad
        ? ` · first bad: ${clip(labelOf(m.firstBad), 24)}`
        : '');
    const [w, hgt] = boxSize(label, sub);
    return {
      id: vid,
      module: m,
      label,
      sub,
      width: w,
      height: hgt,
      x: 0,
      y: 0
    };
  }
  if (vid.startsWith('fold:')) {
    const f = tree.foldById.get(vid)!;
    const label = clip(f.label, 44);
    const sub = `${f.members[0]} … ${f.members[f.members.length - 1]} · ${f.count} nodes`;
    const [w, hgt] = boxSize(label, sub);
    return { id: vid, fold: f, label, sub, width: w, height: hgt, x: 0, y: 0 };
  }
  if (vid !== n.id) {
    const grp = groupOf.get(n.id)!;
    const [w, hgt] = nodeSize(grp.label, grp.sub, 'op');
    return {
      id: vid,
      group: grp,
      label: clip(grp.label, 40),
      sub: grp.sub,
      width: w,
      height: hgt,
      x: 0,
      y: 0
    };
  }
  const label = clip(n.label);
  const sub = nodeSub(n);
  const [w, hgt] = nodeSize(label, sub, n.kind);
  return { id: n.id, node: n, label, sub, width: w, height: hgt, x: 0, y: 0 };
}
