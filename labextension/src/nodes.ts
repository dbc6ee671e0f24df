// Drawing the laid-out graph as SVG: one group per box (label, shape, check badge,
// hover title) and one path per edge. Every payload string goes in as text.
import { formatShape, s, STATUS_GLYPH, STATUS_TEXT } from './format';
import { IVisibleEdge, IVisibleNode } from './layout';
import { CheckStatus } from './types';

/** What a node does when clicked or hovered, given by the view. */
export interface INodeActions {
  select(id: string): void;
  expand(groupId: string): void;
  hover(v: IVisibleNode | null): void;
  move(e: MouseEvent): void;
}

/** The edges as paths (`data-from`, `data-to`, a title naming the input). */
export function drawEdges(
  edges: IVisibleEdge[],
  visible: Map<string, IVisibleNode>,
  markerId: string
): SVGGElement {
  const edgeLayer = s('g', { class: 'sg-edges' });
  for (const e of edges) {
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
      'marker-end': `url(#${markerId})`
    });
    path.dataset.from = e.from;
    path.dataset.to = e.to;
    const title = s('title');
    const src = visible.get(e.from)!;
    title.textContent = `${src.label}.next_functions[${e.inputs.join(', ')}]`;
    path.appendChild(title);
    edgeLayer.appendChild(path);
  }
  return edgeLayer;
}

export function drawNode(v: IVisibleNode, actions: INodeActions): SVGGElement {
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
  title.textContent = tooltipLines(v).join('\n');
  el.appendChild(title);
  const rx = kind === 'none' ? 13 : kind === 'op' || kind === 'group' ? 6 : 14;
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
      actions.expand(v.group.id);
    } else {
      actions.select(n ? n.id : v.id);
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
  el.addEventListener('mouseenter', () => actions.hover(v));
  el.addEventListener('mousemove', e => actions.move(e));
  el.addEventListener('mouseleave', () => actions.hover(null));
  return el;
}

export function tooltipLines(v: IVisibleNode): string[] {
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
