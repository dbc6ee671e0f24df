// What the view draws of a payload: the visible nodes (chains collapsed unless expanded,
// shared leaves drawn once per consumer in big graphs when laying out here) and their
// merged edges, placed by the payload's shipped layout when it covers them, else by
// dagre or, for big graphs, the fast layout.
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
import { IGraphPayload } from './types';

/** Graphs with more visible nodes than this draw shared leaves once per consumer. */
const PROXY_MIN_NODES = 60;
const PROXY_MIN_FANIN = 3;

export interface IScene {
  visible: Map<string, IVisibleNode>;
  edges: IVisibleEdge[];
  bounds: IBounds;
  /** Which layout placed it: 'payload' (shipped), 'dagre' or 'fast'; 'modules': one
   * level of module frames at a time (modules.ts). */
  layout: 'payload' | 'dagre' | 'fast' | 'modules';
}

/**
 * Lay out `g` as drawn: `visibleId` maps a node id to the id drawn for it (its chain's,
 * when collapsed), `groupOf` gives a member's chain.
 */
export function buildScene(
  g: IGraphPayload,
  visibleId: (id: string) => string,
  groupOf: Map<string, IGroup>
): IScene {
  const visible = new Map<string, IVisibleNode>();
  for (const n of g.nodes) {
    const vid = visibleId(n.id);
    if (visible.has(vid)) {
      continue;
    }
    if (vid !== n.id) {
      const grp = groupOf.get(n.id)!;
      const [w, hgt] = nodeSize(grp.label, grp.sub, 'op');
      const label = clip(grp.label, 40);
      visible.set(vid, {
        id: vid,
        group: grp,
        label,
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
    const a = visibleId(e.from);
    const b = visibleId(e.to);
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

  const shipped = shippedLayout(visible, [...edges.values()], g.layout);
  if (shipped) {
    return {
      visible,
      edges: [...edges.values()],
      bounds: shipped,
      layout: 'payload'
    };
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

  const list = [...edges.values()];
  if (visible.size > FAST_LAYOUT_NODES) {
    const roots = g.roots.map(r => visibleId(r));
    return {
      visible,
      edges: list,
      bounds: fastLayout(visible, list, roots),
      layout: 'fast'
    };
  }
  return {
    visible,
    edges: list,
    bounds: dagreLayout(visible, list),
    layout: 'dagre'
  };
}
