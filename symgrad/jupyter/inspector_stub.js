// The Inspector's anywidget front end, saved with every Inspector: see widget.py. It uses
// the view the symgrad labextension registers on the page, else asks the kernel for
// inspector_static.js.
export default {
  async render(ctx) {
    let view = globalThis[Symbol.for('symgrad.inspector.v1')];
    if (!view) {
      ctx.el.textContent = 'symgrad Inspector: waiting for the kernel\u2026';
      const code = await new Promise(resolve => {
        const on = m => {
          if (m && m.type === 'static-module') {
            ctx.model.off('msg:custom', on);
            resolve(m.code);
          }
        };
        ctx.model.on('msg:custom', on);
        ctx.model.send({ type: 'request-static-module' });
      });
      const url = URL.createObjectURL(new Blob([code], { type: 'text/javascript' }));
      try {
        view = (await import(url)).default;
      } finally {
        URL.revokeObjectURL(url);
      }
    }
    return view.render(ctx);
  }
};
