// One picture per cell. `%%symgrad` shows two outputs: the static graph (which the saved
// notebook keeps, for every front end) and the live Inspector. The graph output's
// metadata names its Inspector (`{"symgrad": {"inspector": <model id>}}`; the renderer
// copies it to `data-sg-twin`); while an Inspector view draws its graph, one style rule
// per live model id hides that twin, so the live notebook shows one graph per cell. The
// rule outlives a re-render of the twin (a display update redraws it) and goes when the
// last view of that Inspector goes (the static graph is back when the widget is).

const STYLE_ID = 'symgrad-live-twins';
/** Attribute of a graph output drawn live by an Inspector elsewhere on the page. */
export const TWIN_ATTR = 'data-sg-twin';

const holders = new Map<string, number>();

function cssString(s: string): string {
  return (
    '"' +
    s.replace(/["\\\n\r]/g, c => '\\' + c.charCodeAt(0).toString(16) + ' ') +
    '"'
  );
}

function sync(doc: Document): void {
  let style = doc.getElementById(STYLE_ID) as HTMLStyleElement | null;
  if (!holders.size) {
    style?.remove();
    return;
  }
  if (!style) {
    style = doc.createElement('style');
    style.id = STYLE_ID;
    doc.head.appendChild(style);
  }
  const rules: string[] = [];
  for (const id of holders.keys()) {
    const twin = `.sg-mime[${TWIN_ATTR}=${cssString(id)}]`;
    rules.push(`.jp-OutputArea-child:has(${twin})`, twin);
  }
  style.textContent = `${rules.join(',\n')} {\n  display: none !important;\n}\n`;
}

/** Hide the graph output twin of Inspector `modelId`; the result releases the hold. */
export function hideTwin(doc: Document, modelId: string): () => void {
  holders.set(modelId, (holders.get(modelId) ?? 0) + 1);
  sync(doc);
  let held = true;
  return () => {
    if (!held) {
      return;
    }
    held = false;
    const n = (holders.get(modelId) ?? 1) - 1;
    if (n > 0) {
      holders.set(modelId, n);
    } else {
      holders.delete(modelId);
    }
    sync(doc);
  };
}

/** The Inspector model id a graph output's metadata names, if any. */
export function twinOf(metadata: unknown): string | null {
  const sg = (metadata as { symgrad?: { inspector?: unknown } } | null)
    ?.symgrad;
  const id = sg?.inspector;
  return typeof id === 'string' && id ? id : null;
}
