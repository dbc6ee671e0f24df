// Layouts of the drawn graph (roots on top, gradients flowing down to the leaves). The
// first is the one the payload ships (`layout`, computed once by symgrad/jupyter/layout.py
// and drawn by the static SVG too); dagre's and a linear-time one are the fallbacks for a
// payload without a layout and for views it does not cover (an expanded chain).
import { graphlib, layout } from '@dagrejs/dagre';
import { IGroup } from './chains';
import type { IFoldInfo, IModuleInfo } from './modules';
import { IGraphLayout, IGraphNode } from './types';

/** Above this many visible nodes the fast layout replaces dagre. */
export const FAST_LAYOUT_NODES = 300;
const CHAR_W = 7.2;
const NODE_H = 40;
const NONE_H = 26;

export interface IVisibleNode {
  id: string;
  node?: IGraphNode;
  group?: IGroup;
  /** A collapsed module, drawn as one box. */
  module?: IModuleInfo;
  /** A fold of modules ('Block × N'), drawn as one box. */
  fold?: IFoldInfo;
  label: string;
  sub: string;
  width: number;
  height: number;
  /** Centre of the box. */
  x: number;
  y: number;
  /** A copy of a shared leaf drawn next to one of its consumers. */
  proxy?: boolean;
}

export interface IVisibleEdge {
  from: string;
  to: string;
  inputs: number[];
  points: { x: number; y: number }[];
}

export interface IBounds {
  width: number;
  height: number;
}

/** Box size for the fallback layouts (layout.py box_size is the shipped one). */
export function nodeSize(
  label: string,
  sub: string,
  kind: string
): [number, number] {
  const chars = Math.max(label.length, sub.length);
  const w = Math.min(
    Math.max(chars * CHAR_W + 26, kind === 'none' ? 48 : 72),
    300
  );
  return [w, kind === 'none' ? NONE_H : NODE_H];
}

/** 'x y w h' as numbers; [] when any is not a number. */
function numbers(text: string | undefined): number[] {
  const out = (text ?? '').split(' ').map(Number);
  return out.every(Number.isFinite) ? out : [];
}

/**
 * Place the visible nodes where the payload's layout says, when it has a box for each of
 * them and for nothing else (else null: the caller lays out on its own). Edges run from
 * the bottom centre of their source to the top centre of their target, through the bend
 * points the layout lists.
 */
export function shippedLayout(
  visible: Map<string, IVisibleNode>,
  edges: IVisibleEdge[],
  shipped: IGraphLayout | undefined
): IBounds | null {
  if (!shipped) {
    return null;
  }
  const boxes = new Map<string, number[]>();
  for (const [id, text] of Object.entries(shipped.nodes)) {
    boxes.set(id, numbers(text));
  }
  if (boxes.size !== visible.size) {
    return null;
  }
  for (const id of visible.keys()) {
    if (boxes.get(id)?.length !== 4) {
      return null;
    }
  }
  for (const v of visible.values()) {
    const [x, y, w, hgt] = boxes.get(v.id)!;
    v.width = w;
    v.height = hgt;
    v.x = x + w / 2;
    v.y = y + hgt / 2;
  }
  const bends = new Map<string, number[]>();
  for (const e of shipped.edges ?? []) {
    bends.set(e[0] + '\u0000' + e[1], numbers(e[2]));
  }
  for (const e of edges) {
    const a = visible.get(e.from)!;
    const b = visible.get(e.to)!;
    const mid = bends.get(e.from + '\u0000' + e.to) ?? [];
    e.points = [{ x: a.x, y: a.y + a.height / 2 }];
    for (let i = 0; i + 1 < mid.length; i += 2) {
      e.points.push({ x: mid[i], y: mid[i + 1] });
    }
    e.points.push({ x: b.x, y: b.y - b.height / 2 });
  }
  return { width: shipped.width, height: shipped.height };
}

const RANKSEP = 34;
const NODESEP = 22;
const MARGIN = 12;

/** dagre's layered layout (network simplex ranks, crossing reduction, Brandes–Köpf). */
export function dagreLayout(
  visible: Map<string, IVisibleNode>,
  edges: IVisibleEdge[]
): IBounds {
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
export function fastLayout(
  visible: Map<string, IVisibleNode>,
  edges: IVisibleEdge[],
  roots: string[]
): IBounds {
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
