// The Inspector's view as one ES module with its CSS (KaTeX and fonts inlined), bundled
// by scripts/build-test-bundle.mjs for the browser tests (tests/browser/test_renderer.py),
// which drive it without JupyterLab. Not shipped: in JupyterLab and Notebook 7 the
// labextension provides the view (index.ts) and JupyterLab loads the CSS.
import css from 'symgrad-inline-css';
import { renderInspector, IRenderContext } from './inspector';

function injectCss(doc: Document): void {
  if (doc.getElementById('symgrad-inspector-css')) {
    return;
  }
  const style = doc.createElement('style');
  style.id = 'symgrad-inspector-css';
  style.textContent = css;
  doc.head.appendChild(style);
}

function render(ctx: IRenderContext): () => void {
  injectCss(ctx.el.ownerDocument);
  return renderInspector(ctx);
}

export default { render };
