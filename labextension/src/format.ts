// Formatting and DOM helpers shared by the graph view, its panel and the report view:
// element builders that insert payload strings only as text or attribute values, number
// and shape formatting, badges, KaTeX and the readable error box.
import katex from 'katex';
import { CheckStatus, IGraphNode, Shape } from './types';

export const SVG_NS = 'http://www.w3.org/2000/svg';
/** Longest label drawn in a box (layout.py MAX_LABEL sizes boxes for it). */
export const MAX_LABEL = 32;

export function h<K extends keyof HTMLElementTagNameMap>(
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

export function s<K extends keyof SVGElementTagNameMap>(
  tag: K,
  attrs: Record<string, string | number> = {}
): SVGElementTagNameMap[K] {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    e.setAttribute(k, String(v));
  }
  return e;
}

export function formatShape(shape: Shape | undefined): string {
  if (shape === null || shape === undefined) {
    return '?';
  }
  return '[' + shape.join(', ') + ']';
}

export function formatNumber(x: number | null | undefined): string {
  if (x === null || x === undefined) {
    return '–';
  }
  if (x === 0) {
    return '0';
  }
  const a = Math.abs(x);
  return a < 1e-3 || a >= 1e5 ? x.toExponential(2) : x.toPrecision(3);
}

/** A leaf's relative error as a reader should take it: against an exact gradient of 0
 * there is none ("exact 0": the absolute error is the measure); a row with such elements
 * beside others says how many its relative error leaves out (report.py rel_err_text). */
export function formatRelErr(row: {
  max_rel_err?: number | string | null;
  max_abs_err?: number | string | null;
  exact_zeros?: number | null;
}): string {
  const zeros = row.exact_zeros ?? 0;
  const rel = row.max_rel_err;
  const num = (x: number | string | null | undefined): string =>
    typeof x === 'string' ? x : formatNumber(x);
  if (zeros > 0 && (rel === null || rel === undefined)) {
    return row.max_abs_err === null || row.max_abs_err === undefined
      ? '–'
      : 'exact 0';
  }
  return zeros > 0 ? `${num(rel)} (+${zeros} exact 0)` : num(rel);
}

export function clip(text: string, n: number = MAX_LABEL): string {
  return text.length > n ? text.slice(0, n - 1) + '…' : text;
}

export const STATUS_GLYPH: Record<CheckStatus, string> = {
  pass: '✓',
  fail: '✗',
  error: '!',
  skipped: '–',
  none: ''
};

export const STATUS_TEXT: Record<CheckStatus, string> = {
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

/** The second line of a box in the labextension (layout.py `_lab_sub`). */
export function nodeSub(n: IGraphNode): string {
  if (n.kind === 'none') {
    return '';
  }
  if (n.kind === 'accumulate') {
    return 'AccumulateGrad ' + formatShape(n.shape);
  }
  return formatShape(n.shape);
}
