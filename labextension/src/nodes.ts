// Drawing the laid-out graph as SVG: one group per box (label, shape, check badge,
// hover title) and one path per edge. Every payload string goes in as text.
import { clip, formatShape, s, STATUS_GLYPH, STATUS_TEXT } from './format';
import { IVisibleEdge, IVisibleNode } from './layout';
import { HEADER_H, ICluster, moduleTitle, VERDICT_TEXT } from './modules';
import { CheckStatus, ModuleVerdict } from './types';

/** What a node does when clicked or hovered, given by the view. */
export interface INodeActions {
  select(id: string): void;
  expand(groupId: string): void;
  /** Collapse or expand a module (its path). */
  toggleModule(path: string): void;
  /** Fold or unfold a fold (its id). */
  toggleFold(id: string): void;
  /** Draw one module alone. */
  focus(path: string): void;
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
  if (v.module || v.fold) {
    return drawModuleBox(v, actions);
  }
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
  if (v.module) {
    return moduleLines(moduleTitle(v.module), v.sub, v.module.verdict, true);
  }
  if (v.fold) {
    return moduleLines(v.fold.label, v.sub, v.fold.verdict, false);
  }
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

const VERDICT_TITLE: Record<ModuleVerdict, string> = {
  ok: 'every node inside agrees',
  bad: 'a node inside disagrees',
  unchecked: 'not checked'
};

function moduleLines(
  title: string,
  sub: string,
  verdict: ModuleVerdict,
  canFocus: boolean
): string[] {
  return [
    title,
    sub,
    `verdict: ${VERDICT_TITLE[verdict]}`,
    'click to expand' + (canFocus ? ' · “focus” to draw it alone' : '')
  ];
}

/** The verdict badge of a module box or frame: ✓, ✗ or 'not checked'. */
function verdictBadge(
  verdict: ModuleVerdict,
  right: number,
  top = -7
): SVGGElement {
  const text = VERDICT_TEXT[verdict];
  const w = verdict === 'unchecked' ? 74 : 18;
  const g = s('g', {
    class: `sg-verdict sg-verdict-${verdict}`,
    transform: `translate(${(right - w).toFixed(1)},${top})`
  });
  g.dataset.verdict = verdict;
  const title = s('title');
  title.textContent = VERDICT_TITLE[verdict];
  g.appendChild(title);
  g.appendChild(s('rect', { width: w, height: 14, rx: 7, ry: 7 }));
  const t = s('text', { x: w / 2, y: 10.5, 'text-anchor': 'middle' });
  t.textContent = text;
  g.appendChild(t);
  return g;
}

/** A small text button in SVG (the focus action), activated by click, Enter or Space. */
function svgButton(
  label: string,
  x: number,
  y: number,
  fn: () => void
): SVGGElement {
  const b = s('g', {
    class: 'sg-svg-button',
    transform: `translate(${x.toFixed(1)},${y.toFixed(1)})`,
    tabindex: 0,
    role: 'button'
  });
  b.setAttribute('aria-label', label);
  const w = label.length * 6.2 + 10;
  b.appendChild(s('rect', { x: -w, y: -11, width: w, height: 15, rx: 3 }));
  const t = s('text', { x: -w / 2, y: 0, 'text-anchor': 'middle' });
  t.textContent = label;
  b.appendChild(t);
  b.addEventListener('click', e => {
    e.stopPropagation();
    fn();
  });
  b.addEventListener('keydown', e => {
    if (e.key === 'Enter' || e.key === ' ') {
      e.preventDefault();
      e.stopPropagation();
      fn();
    }
  });
  return b;
}

function pressable(el: SVGElement, fn: () => void): void {
  el.addEventListener('click', e => {
    e.stopPropagation();
    fn();
  });
  el.addEventListener('keydown', e => {
    if (
      (e as KeyboardEvent).key === 'Enter' ||
      (e as KeyboardEvent).key === ' '
    ) {
      e.preventDefault();
      e.stopPropagation();
      fn();
    }
  });
}

/** A collapsed module or a folded run of modules: one box, click to open. */
function drawModuleBox(v: IVisibleNode, actions: INodeActions): SVGGElement {
  const kind = v.module ? 'module' : 'fold';
  const verdict = v.module ? v.module.verdict : v.fold!.verdict;
  const el = s('g', {
    class: `sg-node sg-kind-${kind} sg-verdict-${verdict}`,
    transform: `translate(${(v.x - v.width / 2).toFixed(1)},${(v.y - v.height / 2).toFixed(1)})`,
    tabindex: 0,
    role: 'button'
  });
  el.dataset.nodeId = v.id;
  el.dataset.ref = v.id;
  el.dataset.kind = kind;
  el.dataset.verdict = verdict;
  el.dataset.count = String(v.module ? v.module.count : v.fold!.count);
  if (v.module) {
    el.dataset.module = v.module.path;
  } else {
    el.dataset.fold = v.fold!.id;
    el.dataset.members = v.fold!.members.join(' ');
  }
  el.setAttribute('aria-label', `${v.label}, ${v.sub}, collapsed`);
  const title = s('title');
  title.textContent = tooltipLines(v).join('\n');
  el.appendChild(title);
  if (v.fold) {
    for (const d of [8, 4]) {
      el.appendChild(
        s('rect', {
          class: 'sg-box-stack',
          x: d,
          y: -d,
          width: v.width,
          height: v.height,
          rx: 6,
          ry: 6
        })
      );
    }
  }
  el.appendChild(
    s('rect', {
      class: 'sg-box',
      width: v.width,
      height: v.height,
      rx: 6,
      ry: 6
    })
  );
  const label = s('text', { class: 'sg-node-label', x: 10, y: 17 });
  label.textContent = '▸ ' + v.label;
  el.appendChild(label);
  const sub = s('text', { class: 'sg-node-sub', x: 22, y: 33 });
  // (a box placed by the payload's layout is sized for a shorter line: the rest is in
  // its title)
  sub.textContent = clip(v.sub, Math.max(Math.floor((v.width - 76) / 6.1), 8));
  el.appendChild(sub);
  el.appendChild(verdictBadge(verdict, v.width - 6, -10));
  if (v.module) {
    const path = v.module.path;
    const fb = svgButton('focus', v.width - 6, 34, () => actions.focus(path));
    fb.dataset.symgrad = 'focus';
    el.appendChild(fb);
  }
  pressable(el, () =>
    v.module
      ? actions.toggleModule(v.module.path)
      : actions.toggleFold(v.fold!.id)
  );
  el.addEventListener('mouseenter', () => actions.hover(v));
  el.addEventListener('mousemove', e => actions.move(e));
  el.addEventListener('mouseleave', () => actions.hover(null));
  return el;
}

/** The frame of an expanded module or fold (drawn under the edges) and its header
 * 'path: Type' with the verdict and the focus button (drawn over them). */
export function drawCluster(
  c: ICluster,
  actions: INodeActions
): { frame: SVGGElement; header: SVGGElement } {
  const at = `translate(${c.x.toFixed(1)},${c.y.toFixed(1)})`;
  const frame = s('g', {
    class: `sg-cluster sg-cluster-${c.kind} sg-verdict-${c.verdict}`,
    transform: at
  });
  const el = s('g', {
    class: `sg-cluster-head sg-cluster-${c.kind} sg-verdict-${c.verdict}`,
    transform: at
  });
  for (const g of [frame, el]) {
    g.dataset.cluster = c.id;
    g.dataset.kind = c.kind;
    g.dataset.verdict = c.verdict;
    if (c.module) {
      g.dataset.module = c.module.path;
      g.dataset.count = String(c.module.count);
    } else {
      g.dataset.fold = c.fold!.id;
      g.dataset.members = c.fold!.members.join(' ');
    }
    if (c.focused) {
      g.classList.add('sg-focused');
    }
  }
  frame.appendChild(
    s('rect', {
      class: 'sg-cluster-frame',
      width: c.width,
      height: c.height,
      rx: 8,
      ry: 8
    })
  );
  const head = s('g', {
    class: 'sg-cluster-header',
    tabindex: 0,
    role: 'button'
  });
  head.dataset.symgrad = 'module-header';
  head.setAttribute(
    'aria-label',
    c.focused ? `${c.label} (focused)` : `${c.label}, expanded: collapse`
  );
  const title = s('title');
  title.textContent = c.focused
    ? `${c.label}: drawn alone`
    : `${c.label}: click to collapse`;
  head.appendChild(title);
  head.appendChild(
    s('rect', {
      class: 'sg-cluster-header-bg',
      width: c.width,
      height: HEADER_H,
      rx: 8,
      ry: 8
    })
  );
  const label = s('text', { class: 'sg-cluster-label', x: 10, y: 16 });
  label.textContent = (c.focused ? '' : '▾ ') + c.label;
  head.appendChild(label);
  const right = c.module && !c.focused ? c.width - 52 : c.width - 6;
  head.appendChild(verdictBadge(c.verdict, right, 5));
  if (!c.focused) {
    pressable(head, () =>
      c.module
        ? actions.toggleModule(c.module.path)
        : actions.toggleFold(c.fold!.id)
    );
  }
  el.appendChild(head);
  if (c.module && !c.focused) {
    const path = c.module.path;
    const fb = svgButton('focus', c.width - 6, 16, () => actions.focus(path));
    fb.dataset.symgrad = 'focus';
    el.appendChild(fb);
  }
  return { frame, header: el };
}
