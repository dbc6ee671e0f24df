// The verifier's report (application/vnd.symgrad.report+json, symgrad.report/1) as
// tables: leaves, node checks, Hessian-vector products.
import {
  badge,
  errorBox,
  formatNumber,
  formatRelErr,
  formatShape,
  h
} from './format';
import { CheckStatus } from './types';
import { validateReport } from './validate';

type Num = number | string | null | undefined;

interface IReportLeaf {
  name: string;
  latex: string;
  shape: number[];
  dtype: string;
  status: string;
  max_abs_err: Num;
  max_rel_err: Num;
  exact_zeros?: number;
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
  status?: string; // ok, mismatch, non-finite, changed in place ... (older reports lack it)
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
  /** A compiled step's verify(): its fused kernels and generated gradients (optional). */
  compiled?: ICompiledRow[];
  bad_kernel?: string | null;
}

interface ICompiledRow {
  kind: string;
  name: string;
  status: string; // ok | wrong | not proved | mismatch
  how?: string | null;
  detail?: string | null;
  derivation?: string | null;
}

/** A compiled row's status as a badge state: proved ok, wrong or disagreeing, or not
 * proved (neither). */
function compiledStatus(s: string): CheckStatus {
  return s === 'ok'
    ? 'pass'
    : s === 'wrong' || s === 'mismatch'
      ? 'fail'
      : 'none';
}

/** The derivation of a compiled row, folded away (a kernel's loop source is long). */
function derivationCell(text: string | null | undefined): HTMLElement | string {
  if (!text) {
    return '–';
  }
  const d = h('details', 'sg-derivation');
  d.appendChild(h('summary', undefined, 'derivation'));
  d.appendChild(h('pre', 'sg-code', text));
  return d;
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
    case 'changed in place': // written in place since recorded: nothing was checked
    case 'backward raised': // a node's backward raised: nothing could be compared
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
  // neither agreement nor disagreement (non-finite, changed in place ...): its word
  const other =
    !r.ok && !!r.status && r.status !== 'mismatch' && r.status !== 'ok';
  // checked at the values kept when recorded (leaves written in place since): said so
  const recorded = (r.notes ?? []).some(n =>
    n.includes('checked at the values recorded then')
  )
    ? ' at the values recorded before the in-place change'
    : '';
  const overall = badge(
    r.ok ? 'pass' : other ? 'error' : 'fail',
    r.ok
      ? 'gradients agree' + recorded
      : other
        ? String(r.status)
        : 'gradients disagree' + recorded
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
            formatRelErr(l),
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
  const compiled = r.compiled ?? [];
  if (compiled.length) {
    root.appendChild(
      h(
        'div',
        'sg-section',
        'Compiled step' +
          (r.bad_kernel ? `: ${r.bad_kernel} disagrees` : ': kernels proved')
      )
    );
    const tbl = table(
      'report-compiled',
      ['kernel', 'kind', 'status', 'how / detail', 'derivation'],
      compiled.map(c => {
        const st = compiledStatus(c.status);
        return {
          status: st,
          key: c.name,
          cells: [
            h('span', 'sg-code', c.name),
            c.kind,
            badge(st, c.status),
            (c.status === 'ok' ? c.how || c.detail : c.detail || c.how) || '–',
            derivationCell(c.derivation)
          ]
        };
      })
    );
    tbl.querySelectorAll('tbody tr').forEach((tr, i) => {
      if (compiled[i].name === r.bad_kernel) {
        (tr as HTMLElement).dataset.bad = 'true';
      }
    });
    root.appendChild(tbl);
  }
  root.dataset.state = 'ready';
  return root;
}
