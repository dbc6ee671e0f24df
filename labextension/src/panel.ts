// The node panel (what the selected node saved, its formula, its check, its
// next_functions) and the agreement table, drawn beside and under the graph.
import {
  badge,
  formatNumber,
  formatRelErr,
  formatShape,
  h,
  STATUS_TEXT,
  tex
} from './format';
import { Listen } from './panzoom';
import {
  IAgreement,
  IAgreementRow,
  IGraphEdge,
  IGraphNode,
  IGraphPayload,
  ILeaf
} from './types';

/** What the panel reads from the view, and how it selects a node. */
export interface IPanelContext {
  graph: IGraphPayload;
  byId: Map<string, IGraphNode>;
  leafById: Map<string, ILeaf>;
  rowByNode: Map<string, IAgreementRow>;
  listen: Listen;
  /** Select as the user does (tells onSelect). */
  select(id: string | null): void;
  /** The module that produced a node (module-aware payloads). */
  moduleOf?(id: string): { path: string; type: string } | null;
  /** Draw one module alone. */
  focus?(path: string): void;
}

export function renderNodePanel(
  p: HTMLElement,
  ctx: IPanelContext,
  selected: string | null
): void {
  p.textContent = '';
  const n = selected ? ctx.byId.get(selected) : undefined;
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
  const mod = ctx.moduleOf?.(n.id);
  if (mod) {
    const dd = h('span', 'sg-module-fact');
    dd.dataset.symgrad = 'node-module';
    dd.dataset.module = mod.path;
    dd.appendChild(
      h('code', undefined, mod.path ? `${mod.path}: ${mod.type}` : mod.type)
    );
    if (ctx.focus) {
      const focus = ctx.focus;
      const b = h('button', 'sg-link', 'focus');
      b.type = 'button';
      b.title = `Draw ${mod.path || mod.type} alone`;
      ctx.listen(b, 'click', ev => {
        ev.stopPropagation();
        focus(mod.path);
      });
      dd.appendChild(document.createTextNode(' '));
      dd.appendChild(b);
    }
    fact('module', dd);
  }
  if (n.variable && n.kind !== 'op') {
    fact('variable', n.variable);
  }
  const leaf = ctx.leafById.get(n.id);
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
  const out = ctx.graph.edges
    .filter((e: IGraphEdge) => e.from === n.id)
    .sort((a, b) => a.input - b.input);
  if (out.length) {
    p.appendChild(h('div', 'sg-section', 'next_functions'));
    const ul = h('ul', 'sg-next');
    for (const e of out) {
      const t = ctx.byId.get(e.to);
      const li = h('li');
      const a = h('button', 'sg-link', `[${e.input}] ${t ? t.label : e.to}`);
      a.type = 'button';
      a.dataset.target = e.to;
      ctx.listen(a, 'click', ev => {
        ev.stopPropagation();
        ctx.select(e.to);
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
      p.appendChild(h('div', 'sg-table-scroll')).appendChild(table);
    }
  }
  const row = ctx.rowByNode.get(n.id);
  if (row) {
    p.appendChild(h('div', 'sg-section', 'gradient check'));
    p.appendChild(agreementTable(ctx, { ok: null, rows: [row] }, true));
  }
}

// ------------------------------------------------------------------ agreement table

export function agreementTable(
  ctx: IPanelContext,
  ag: IAgreement,
  compact = false
): HTMLElement {
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
      const fb = ctx.byId.get(ag.first_bad_node);
      const line = h('div', 'sg-first-bad-note');
      line.appendChild(document.createTextNode('First disagreeing node: '));
      const a = h(
        'button',
        'sg-link',
        fb ? `${fb.label} (${fb.id})` : ag.first_bad_node
      );
      a.type = 'button';
      const target = ag.first_bad_node;
      ctx.listen(a, 'click', () => ctx.select(target));
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
      ctx.listen(a, 'click', () => ctx.select(target));
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
    tr.appendChild(h('td', 'sg-num', formatRelErr(r)));
    tb.appendChild(tr);
  }
  table.appendChild(tb);
  box.appendChild(table);
  return box;
}
