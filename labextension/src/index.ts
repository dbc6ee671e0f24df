// JupyterLab MIME renderer for symgrad outputs. Registered as safe: it never runs code
// from the payload and inserts every string as text, so saved (untrusted) notebooks show
// their graphs with no kernel running. Loading this module also puts the Inspector
// widget's view on the page (inspector.ts).
import { IRenderMime } from '@jupyterlab/rendermime-interfaces';
import { Widget } from '@lumino/widgets';
import { IGraphView, renderGraphView, renderReportView } from './draw';
import { registerInspector } from './inspector';
import { TWIN_ATTR, twinOf } from './twins';

export const GRAPH_MIME = 'application/vnd.symgrad.graph+json';
export const REPORT_MIME = 'application/vnd.symgrad.report+json';

/** A Lumino widget that draws one symgrad output. */
export class SymgradRenderer extends Widget implements IRenderMime.IRenderer {
  private mimeType: string;
  private view: IGraphView | null = null;

  constructor(options: IRenderMime.IRendererOptions) {
    super();
    this.mimeType = options.mimeType;
    this.addClass('sg-mime');
  }

  renderModel(model: IRenderMime.IMimeModel): Promise<void> {
    const data = model.data[this.mimeType];
    this.view?.dispose();
    this.view = null;
    this.node.textContent = '';
    // A `%%symgrad` graph beside its Inspector: hidden while that Inspector is live.
    const twin = twinOf(model.metadata);
    if (twin) {
      this.node.setAttribute(TWIN_ATTR, twin);
    } else {
      this.node.removeAttribute(TWIN_ATTR);
    }
    if (this.mimeType === GRAPH_MIME) {
      this.view = renderGraphView(this.node, data);
    } else {
      renderReportView(this.node, data);
    }
    return Promise.resolve();
  }

  dispose(): void {
    this.view?.dispose();
    this.view = null;
    super.dispose();
  }
}

export const rendererFactory: IRenderMime.IRendererFactory = {
  safe: true,
  mimeTypes: [GRAPH_MIME, REPORT_MIME],
  createRenderer: options => new SymgradRenderer(options)
};

const extension: IRenderMime.IExtension = {
  id: 'symgrad:mime-renderer',
  rendererFactory,
  rank: 0,
  dataType: 'json',
  documentWidgetFactoryOptions: []
};

// The Inspector widget's view, for the loader every saved Inspector holds (inspector.ts).
registerInspector();

export default extension;
