// The Inspector's view where the symgrad labextension is absent (VS Code, a Jupyter server
// without symgrad): the kernel renders the HTML (Inspector.static_html: static SVG, node
// panel, agreement table, controls) and sends it again on every change; this module shows
// it and turns clicks and edits into selection, tolerance and Verify/Stop messages. The
// kernel sends this file on request (inspector_stub.js), so no saved notebook holds it.
function render({ model, el }) {
  el.textContent = 'symgrad Inspector: waiting for the kernel\u2026';
  const onMsg = m => {
    if (m && m.type === 'static') {
      el.innerHTML = m.html;
    }
  };
  const onClick = e => {
    const t = e.target.closest && e.target.closest('[data-sg-action],.sg-node[data-id]');
    if (!t || !el.contains(t)) {
      return;
    }
    const action = t.getAttribute('data-sg-action');
    if (action) {
      model.send({ type: action });
    } else {
      model.set('selected', t.getAttribute('data-id'));
      model.save_changes();
    }
  };
  const onChange = e => {
    const name = e.target.getAttribute && e.target.getAttribute('data-sg-trait');
    const value = parseFloat(e.target.value);
    if (name && value >= 0) {
      model.set(name, value);
      model.save_changes();
    }
  };
  model.on('msg:custom', onMsg);
  el.addEventListener('click', onClick);
  el.addEventListener('change', onChange);
  model.send({ type: 'request-static' });
  return () => {
    model.off('msg:custom', onMsg);
    el.removeEventListener('click', onClick);
    el.removeEventListener('change', onChange);
  };
}

export default { render };
