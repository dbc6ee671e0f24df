"""A ``%%symgrad`` cell on a real 2-block GPT (tests/_nanogpt.py) in JupyterLab 4, read
from the rendered page (issue 30, scope 1: a big model is first drawn collapsed to its
top-level modules). Live, in the Inspector: every top-level module is drawn as a box (or
inside the fold box of repeated ones) whose rect is not empty and lies inside the visible
drawing area, its header ("▸ path: Type", "Block × N") and verdict badge inside the box;
with the drawing scrolled into the browser's viewport, a screenshot's pixels show each box
filled and its header text drawn (a blank region there fails). Saved with Ctrl+S and
reopened with no kernel: the saved graph draws the same boxes, the same way.

(A screenshot of a whole cell taller than the window shows JupyterLab's unpainted
off-screen part as a grey area: the pixel check scrolls the drawing into view first.)
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path

from test_issue29_acceptance import _cell_done, _Front29, _run_all, _write
from test_one_picture import _open, _problems

REPO = Path(__file__).resolve().parents[2]
GRAPH_MIME = "application/vnd.symgrad.graph+json"

CELLS = [
    "%load_ext symgrad\nimport sys\nimport symgrad as sg\n"
    f"sys.path.insert(0, {str(REPO / 'tests')!r})\nfrom _nanogpt import gpt",
    "%%symgrad\n"
    "sg.manual_seed(0)\n"
    "model = gpt(sg, vocab=8, block_size=4).double()\n"
    "idx = sg.randint(0, 8, (1, 4))\n"
    "targets = sg.randint(0, 8, (1, 4))\n"
    "loss = model(idx, targets)\n"
    "loss.backward()",
]

# The module and fold boxes of the visible graph view under `root`, with the rects (left,
# top, right, bottom) of the box, its header text, sub line and badge, and of the canvas
# (the visible drawing area) of the same view.
BOXES_JS = """root => {
  const rect = el => { if (!el) { return null; } const b = el.getBoundingClientRect();
                       return [b.left, b.top, b.right, b.bottom]; };
  const views = [...root.querySelectorAll('.sg-view[data-symgrad=graph]')]
    .filter(v => v.getBoundingClientRect().width > 0);
  return views.map(v => ({
    canvas: rect(v.querySelector('.sg-canvas')),
    boxes: [...v.querySelectorAll('.sg-node[data-kind=module], .sg-node[data-kind=fold]')]
      .map(e => ({id: e.dataset.nodeId, module: e.dataset.module || null,
                  members: e.dataset.members ? e.dataset.members.split(' ') : null,
                  verdict: e.dataset.verdict,
                  label: e.querySelector('.sg-node-label').textContent,
                  badge: e.querySelector('.sg-verdict > text').textContent,
                  box: rect(e.querySelector('rect.sg-box')),
                  head: rect(e.querySelector('.sg-node-label')),
                  sub: rect(e.querySelector('.sg-node-sub')),
                  mark: rect(e.querySelector('.sg-verdict'))}))}));
}"""


def _inside(inner, outer, slack: float = 0.5) -> bool:
    return (inner[0] >= outer[0] - slack and inner[1] >= outer[1] - slack
            and inner[2] <= outer[2] + slack and inner[3] <= outer[3] + slack)


def _check_boxes(view: dict, top_level: set[str], where: str) -> dict:
    """Every top-level module drawn as a visible box (or in a fold's box), text inside."""
    canvas = view["canvas"]
    assert canvas[2] - canvas[0] > 100 and canvas[3] - canvas[1] > 100, (where, canvas)
    drawn: set[str] = set()
    for b in view["boxes"]:
        what = f"{where}: {b['id']} {b['label']!r}"
        box = b["box"]
        assert box[2] - box[0] > 20 and box[3] - box[1] > 10, (what, box)
        assert _inside(box, canvas), (what, box, canvas)
        for part in ("head", "sub"):
            r = b[part]
            assert r[2] > r[0] and r[3] > r[1], (what, part, r)
            assert _inside(r, box), (what, part, r, box)  # the text stays in its box
        assert _inside(b["mark"], canvas), (what, b["mark"], canvas)
        assert b["badge"] == {"ok": "✓", "bad": "✗", "unchecked": "not checked"}[b["verdict"]]
        drawn |= set(b["members"] or [b["module"]])
    assert drawn == top_level, where
    return {b["id"]: (b["label"], b["verdict"]) for b in view["boxes"]}


# Pixels of a screenshot (PNG, base64) inside each rect: how many differ from the canvas
# background, and how many are dark (text). Decoded by the browser: what was painted.
PIXELS_JS = """async ([png, rects, bg]) => {
  const img = new Image();
  img.src = 'data:image/png;base64,' + png;
  await img.decode();
  const c = new OffscreenCanvas(img.width, img.height);
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  const scale = img.width / window.innerWidth;
  const [br, bgr, bb] = bg.match(/[\\d.]+/g).map(Number);
  return rects.map(([l, t, r, b]) => {
    const x = Math.round(l * scale), y = Math.round(t * scale);
    const w = Math.max(1, Math.round((r - l) * scale));
    const h = Math.max(1, Math.round((b - t) * scale));
    const d = g.getImageData(x, y, w, h).data;
    let ink = 0, dark = 0;
    for (let i = 0; i < d.length; i += 4) {
      if (Math.abs(d[i] - br) + Math.abs(d[i + 1] - bgr) + Math.abs(d[i + 2] - bb) > 30) { ink++; }
      if (0.2126 * d[i] + 0.7152 * d[i + 1] + 0.0722 * d[i + 2] < 128) { dark++; }
    }
    return {share: ink / (w * h), dark};
  });
}"""


def _check_painted(page, cell, where: str) -> None:
    """The canvas in the browser's viewport, and each box painted there: its box filled
    (not the canvas background) and its header text drawn in dark pixels."""
    cell.locator(".sg-view[data-symgrad=graph] .sg-canvas").last.scroll_into_view_if_needed()
    page.wait_for_timeout(200)
    view = cell.element_handle().evaluate(BOXES_JS)[0]
    size = page.viewport_size
    canvas = view["canvas"]
    assert _inside(canvas, [0, 0, size["width"], size["height"]]), (where, canvas, size)
    bg = cell.locator(".sg-view[data-symgrad=graph] .sg-canvas").last.evaluate(
        "c => getComputedStyle(c).backgroundColor")
    png = base64.b64encode(page.screenshot()).decode()
    boxes = view["boxes"]
    inner = [[b["box"][0] + 3, b["box"][1] + 3, b["box"][2] - 3, b["box"][3] - 3] for b in boxes]
    heads = [b["head"] for b in boxes]
    px = page.evaluate(PIXELS_JS, [png, inner + heads, bg])
    for b, box_px, head_px in zip(boxes, px[:len(boxes)], px[len(boxes):]):
        assert box_px["share"] > 0.5, (where, b["id"], box_px)  # filled, not blank
        assert head_px["dark"] >= 20, (where, b["id"], head_px)  # its header is drawn


def _wait_saved(path: Path, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        try:
            nb = json.loads(path.read_text())
            graphs = [o["data"][GRAPH_MIME] for o in nb["cells"][1].get("outputs", [])
                      if GRAPH_MIME in o.get("data", {})]
            if graphs and graphs[0].get("agreement"):
                return graphs[0]
        except (json.JSONDecodeError, IndexError):  # caught mid-write
            pass
        assert time.monotonic() < deadline, "not saved with the verified graph"
        time.sleep(0.25)


def test_gpt_cell_draws_its_top_level_modules_live_and_saved(browser, lab_server, artifacts):
    front = _Front29("lab", lab_server)
    path = _write(lab_server.root, "gpt_modules.ipynb", CELLS)
    page = _run_all(browser, front, path, len(CELLS))
    cell = _cell_done(page, 1)
    page.wait_for_timeout(300)  # a resize refit, if any, lands
    cell.screenshot(path=str(artifacts / "gpt-cell-live.png"))
    views = cell.element_handle().evaluate(BOXES_JS)
    assert len(views) == 1  # one picture: the Inspector's (its twin is hidden)
    page.keyboard.press("Control+s")
    payload = _wait_saved(path)
    top = {m["path"] for m in payload["modules"] if m["parent"] is None}
    assert top == {"wte", "wpe", "h", "ln_f", "lm_head"}
    assert sorted(payload["collapsed"]) == sorted(top)  # a big model: collapsed at first
    live = _check_boxes(views[0], top, "live")
    _check_painted(page, cell, "live")
    assert _problems(page) == []
    page.close()

    front.stop_kernels()
    page = _open(browser, front.url(path.name))
    cell = page.locator(".jp-Notebook .jp-Cell").nth(1)
    cell.locator(".sg-view[data-symgrad=graph] .sg-node").first.wait_for(
        state="visible", timeout=60_000)
    cell.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    cell.screenshot(path=str(artifacts / "gpt-cell-reopened.png"))
    views = cell.element_handle().evaluate(BOXES_JS)
    assert len(views) == 1
    assert _check_boxes(views[0], top, "reopened") == live
    _check_painted(page, cell, "reopened")
    assert _problems(page) == []
    page.close()
