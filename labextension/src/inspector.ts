// The live view of symgrad.jupyter.Inspector (an anywidget). Every saved Inspector holds
// only a small loader (symgrad/jupyter/inspector_stub.js); it finds this view on the page
// under Symbol.for(INSPECTOR_API), where the labextension puts it when JupyterLab or
// Notebook 7 loads it (index.ts), so the drawing code is loaded once per page.
//
// The model's synced traits: selected (a node id; clicks write it), rtol, atol (the inputs
// write them; the kernel verifies again), status, progress, message. The graph and the
// report come as custom messages, {type: 'graph', graph, report}, in answer to
// {type: 'request'} and again whenever they change; they are not traits, so no saved
// widget state holds them. The buttons send {type: 'verify'} and {type: 'stop'}.
import { badge, IGraphView, renderGraphView, renderReportView } from './draw';
import { hideTwin } from './twins';

export const INSPECTOR_API = 'symgrad.inspector.v1';
/** How long to wait for the kernel's graph before saying that none answered. */
export const KERNEL_WAIT_MS = 5000;

/** The parts of an anywidget model the view uses. */
export interface IInspectorModel {
  get(name: string): unknown;
  set(name: string, value: unknown): void;
  save_changes(): void;
  send(content: unknown): void;
  on(event: string, cb: (...args: any[]) => void): void;
  off(event: string, cb: (...args: any[]) => void): void;
}

export interface IRenderContext {
  model: IInspectorModel;
  el: HTMLElement;
}

interface IGraphMessage {
  type: 'graph';
  graph: unknown;
  report: unknown;
  /** The widget's model id: the `%%symgrad` graph output of this id is hidden. */
  model_id?: string;
}

function isGraphMessage(m: unknown): m is IGraphMessage {
  return (
    typeof m === 'object' &&
    m !== null &&
    (m as { type?: unknown }).type === 'graph'
  );
}

function el<K extends keyof HTMLElementTagNameMap>(
  doc: Document,
  tag: K,
  cls?: string,
  text?: string
): HTMLElementTagNameMap[K] {
  const e = doc.createElement(tag);
  if (cls) {
    e.className = cls;
  }
  if (text !== undefined) {
    e.textContent = text;
  }
  return e;
}

/** The verdict shown: agree/disagree, why neither, or [agree?, at which values]. */
type Verdict = boolean | string | [boolean, string] | null | undefined;

/** The controls: tolerances, Verify, Stop, progress and the verdict. */
class ControlBar {
  readonly node: HTMLElement;
  private inputs: Record<'rtol' | 'atol', HTMLInputElement>;
  private verifyButton: HTMLButtonElement;
  private stopButton: HTMLButtonElement;
  private progress: HTMLProgressElement;
  private status: HTMLElement;

  constructor(
    doc: Document,
    private model: IInspectorModel,
    // true/false: agree/disagree; a string: neither, and why (agreement.verdict)
    // [ok, line]: agree/disagree, where and how it holds
    private verdict: () => Verdict
  ) {
    this.node = el(doc, 'div', 'sg-view sg-inspector-bar');
    this.node.dataset.symgrad = 'controls';
    const input = (name: 'rtol' | 'atol'): HTMLInputElement => {
      const label = el(doc, 'label', 'sg-inspector-field', name + ' ');
      const i = el(doc, 'input', 'sg-inspector-input');
      i.type = 'number';
      i.step = 'any';
      i.min = '0';
      i.dataset.trait = name;
      i.addEventListener('change', () => {
        const v = parseFloat(i.value);
        if (Number.isFinite(v) && v >= 0) {
          model.set(name, v);
          model.save_changes();
        } else {
          this.update(); // back to the model's value
        }
      });
      // Digits and 'e' are for the input, not for notebook shortcuts.
      i.addEventListener('keydown', e => e.stopPropagation());
      label.appendChild(i);
      this.node.appendChild(label);
      return i;
    };
    this.inputs = { rtol: input('rtol'), atol: input('atol') };
    const button = (text: string, type: string): HTMLButtonElement => {
      const b = el(doc, 'button', 'sg-button', text);
      b.type = 'button';
      b.dataset.action = type;
      b.addEventListener('click', () => model.send({ type }));
      this.node.appendChild(b);
      return b;
    };
    this.verifyButton = button('Verify', 'verify');
    this.stopButton = button('Stop', 'stop');
    this.progress = el(doc, 'progress', 'sg-inspector-progress');
    this.progress.max = 1;
    this.node.appendChild(this.progress);
    this.status = el(doc, 'span', 'sg-inspector-status');
    this.status.dataset.symgrad = 'status';
    this.node.appendChild(this.status);
    this.update();
  }

  update(): void {
    const m = this.model;
    for (const name of ['rtol', 'atol'] as const) {
      const v = m.get(name);
      const i = this.inputs[name];
      if (i.ownerDocument.activeElement !== i) {
        i.value = typeof v === 'number' ? String(v) : '';
      }
    }
    const status = String(m.get('status') ?? '');
    const busy = status === 'verifying';
    this.verifyButton.disabled = busy;
    this.stopButton.disabled = !busy;
    this.progress.hidden = !busy;
    this.progress.value = Number(m.get('progress') ?? 0);
    this.status.dataset.status = status;
    this.status.textContent = '';
    if (status === 'done') {
      const ok = this.verdict();
      this.status.appendChild(
        Array.isArray(ok) // agree/disagree at the values recorded, said so
          ? badge(ok[0] ? 'pass' : 'fail', ok[1])
          : typeof ok === 'string'
            ? badge('error', ok)
            : ok === true
              ? badge('pass', 'gradients agree')
              : ok === false
                ? badge('fail', 'gradients disagree')
                : badge('none', 'no verdict')
      );
    } else {
      const text: Record<string, string> = {
        'not verified': 'not verified',
        verifying: 'verifying…',
        interrupted: 'verification interrupted',
        error: 'verification failed'
      };
      const msg = String(m.get('message') ?? '');
      this.status.textContent =
        (text[status] ?? status) +
        (status === 'error' && msg ? ': ' + msg : '');
    }
  }
}

/** Draw an Inspector into `el`; returns the clean-up anywidget calls on removal. */
export function renderInspector({
  model,
  el: host
}: IRenderContext): () => void {
  const doc = host.ownerDocument;
  host.classList.add('sg-widget', 'symgrad-inspector');
  host.textContent = '';
  let view: IGraphView | null = null;
  let ok: Verdict;
  const bar = new ControlBar(doc, model, () => ok);
  const graphHost = el(doc, 'div', 'sg-inspector-graph');
  const reportHost = el(doc, 'div', 'sg-inspector-report');
  host.append(bar.node, graphHost, reportHost);
  const wait = el(doc, 'div', 'sg-placeholder', 'Waiting for the kernel…');
  graphHost.appendChild(wait);
  const timer = window.setTimeout(() => {
    // A kernel still running the cell (a long verification) answers when it is done.
    wait.textContent =
      'No answer from the kernel yet (it may still be running the cell; if not, run ' +
      'the cell to use the Inspector). The graph output above is the saved graph.';
  }, KERNEL_WAIT_MS);

  const selectedId = (): string | null => {
    const v = model.get('selected');
    return typeof v === 'string' && v ? v : null;
  };
  const drawReport = (report: unknown): void => {
    reportHost.textContent = '';
    if (report === null || report === undefined) {
      return;
    }
    // The agreement table under the graph shows the verdict per leaf: the full report
    // (mode, what ran, node checks) folds away.
    const details = el(doc, 'details', 'sg-report-details');
    details.appendChild(el(doc, 'summary', undefined, 'Verifier report'));
    reportHost.appendChild(details);
    renderReportView(details, report);
  };
  let releaseTwin: (() => void) | null = null;
  const onMessage = (msg: unknown): void => {
    if (!isGraphMessage(msg)) {
      return;
    }
    window.clearTimeout(timer);
    if (!releaseTwin && typeof msg.model_id === 'string' && msg.model_id) {
      // Drawn live from here on: the static twin would be a second picture.
      releaseTwin = hideTwin(doc, msg.model_id);
      host.dataset.sgLive = msg.model_id;
    }
    const graph = msg.graph as {
      agreement?: { ok?: boolean | null; verdict?: string | null } | null;
    };
    const ag = graph?.agreement;
    ok =
      ag?.verdict && typeof ag.ok === 'boolean'
        ? [ag.ok, ag.verdict]
        : (ag?.verdict ?? ag?.ok);
    if (view) {
      view.update(graph);
      view.select(selectedId());
    } else {
      graphHost.textContent = '';
      view = renderGraphView(graphHost, graph, {
        selected: selectedId(),
        onSelect: id => {
          model.set('selected', id ?? '');
          model.save_changes();
        }
      });
    }
    drawReport(msg.report);
    bar.update();
  };
  const onSelected = (): void => view?.select(selectedId());
  const onState = (): void => bar.update();
  const stateEvents = ['status', 'progress', 'message', 'rtol', 'atol'].map(
    n => `change:${n}`
  );
  model.on('msg:custom', onMessage);
  model.on('change:selected', onSelected);
  for (const e of stateEvents) {
    model.on(e, onState);
  }
  model.send({ type: 'request' });
  return () => {
    window.clearTimeout(timer);
    releaseTwin?.();
    releaseTwin = null;
    model.off('msg:custom', onMessage);
    model.off('change:selected', onSelected);
    for (const e of stateEvents) {
      model.off(e, onState);
    }
    view?.dispose();
    view = null;
  };
}

/** Put the view where the Inspector's loader finds it (once per page). */
export function registerInspector(
  scope: Record<symbol, unknown> = globalThis as unknown as Record<
    symbol,
    unknown
  >
): void {
  scope[Symbol.for(INSPECTOR_API)] = { render: renderInspector };
}
