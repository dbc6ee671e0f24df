"""The graph view on a conv net, read from the rendered page (issue 29, scope 8): labels
readable at "Fit", the node panel's saved-operands table readable and whole, and
"Collapse chains" folding loops but never a net's layers.

The view is the labextension's, bundled for the browser (test_renderer.py's harness,
no JupyterLab); the graphs are the kernel's own payloads of a small CNN.
"""

from __future__ import annotations

import jsonschema
import pytest
import sg_payloads as payloads
from test_renderer import _page, bundle, mount  # noqa: F401 - bundle is a fixture

from symgrad.jupyter.graph import graph_json, load_schema

MIN_LABEL_PX = 10  # labextension/src/panzoom.ts


@pytest.fixture(scope="module")
def page(browser, bundle):  # noqa: F811 - the fixture imported above
    pg = _page(browser, bundle)
    yield pg
    assert pg.errors == []
    pg.close()


@pytest.fixture(scope="module")
def cnn() -> dict:
    """A three-block CNN's loss: conv/relu/pool bodies, a flatten, two Linear layers."""
    import symgrad as sg
    from symgrad import nn

    sg.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(8 * 2 * 2, 16), nn.ReLU(), nn.Linear(16, 10))
    x = sg.randn(2, 1, 16, 16)
    loss = nn.functional.cross_entropy(net(x), sg.tensor([1, 3]))
    payload = graph_json(loss, {"x": x, "loss": loss})
    jsonschema.validate(payload, load_schema())
    return payload


def _rendered_label_px(page) -> list[float]:
    """Each drawn label's font size on screen: its CSS size times the drawing's scale."""
    return page.evaluate("""() => [...document.querySelectorAll('.sg-node .sg-node-label')]
        .map(t => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a)""")


def test_labels_readable_at_fit_and_the_rest_is_panned(page, cnn, artifacts):
    mount(page, cnn)
    view = page.locator("[data-symgrad=graph]")
    assert view.get_attribute("data-state") == "ready"
    page.locator(".sg-toolbar .sg-button", has_text="Fit").click()
    sizes = _rendered_label_px(page)
    assert len(sizes) == len(cnn["nodes"])
    assert min(sizes) >= MIN_LABEL_PX - 1e-3, sorted(sizes)[:3]
    page.screenshot(path=str(artifacts / "ui-cnn-fit.png"))
    # A graph too big for the canvas at that scale is panned: a drag moves the drawing.
    canvas = page.locator(".sg-canvas")
    box = canvas.bounding_box()
    svg_h = page.evaluate("document.querySelector('.sg-viewport').getBoundingClientRect()"
                          ".height")
    assert svg_h > box["height"]  # this CNN is taller than the canvas at a readable scale
    before = page.locator(".sg-viewport").get_attribute("transform")
    page.mouse.move(box["x"] + 5, box["y"] + box["height"] - 5)
    page.mouse.down()
    page.mouse.move(box["x"] + 5, box["y"] + 20, steps=5)
    page.mouse.up()
    assert page.locator(".sg-viewport").get_attribute("transform") != before


def _visual_lines(page, locator) -> int:
    """How many lines the element's text takes on screen (wrapped lines count)."""
    return locator.evaluate("""el => {
        const r = document.createRange();
        r.selectNodeContents(el);
        return new Set([...r.getClientRects()].filter(q => q.width > 0)
                       .map(q => Math.round(q.top))).size;
    }""")


def test_saved_operands_values_keep_their_lines_and_the_table_is_whole(page, cnn,
                                                                        artifacts):
    conv = next(n["id"] for n in cnn["nodes"] if n["label"] == "ConvolutionBackward0")
    mount(page, cnn, selected=conv)
    panel = page.locator("[data-symgrad=node-panel]")
    assert panel.get_attribute("data-selected") == conv
    table = panel.locator("[data-symgrad=saved-operands]")
    rows = table.locator("tbody tr")
    assert rows.count() >= 4  # input, weight, stride, padding, ...
    char_w = page.evaluate("""() => {
        const pre = document.querySelector('[data-symgrad=saved-operands] td pre');
        const c = document.createElement('span');
        c.textContent = '0'.repeat(10);
        c.style.whiteSpace = 'nowrap';
        c.style.display = 'inline-block';
        pre.appendChild(c);
        const w = c.getBoundingClientRect().width / 10;
        c.remove();
        return w;
    }""")
    values = table.locator("td pre")
    assert values.count() >= 2
    for i in range(values.count()):
        pre = values.nth(i)
        text = pre.text_content()
        assert text.strip()
        # wrapped between numbers at most, never a character or two per line
        width = pre.evaluate("el => el.clientWidth")
        assert width >= 16 * char_w, (text, width / char_w)
        per_line = max(len(ln) for ln in text.splitlines()) / _visual_lines(page, pre)
        assert per_line >= min(8, len(text)), (text, per_line)
    # Nothing cut off: the table fits its box or that box scrolls sideways to all of it.
    whole = table.evaluate("""t => {
        const box = t.parentElement;
        const overflow = getComputedStyle(box).overflowX;
        const fits = t.getBoundingClientRect().right <= box.getBoundingClientRect().right + 0.5;
        return fits || ((overflow === 'auto' || overflow === 'scroll') &&
                        box.scrollWidth >= t.getBoundingClientRect().width - 0.5);
    }""")
    assert whole
    headers = table.locator("thead th").all_text_contents()
    assert "value" in headers and "shape" in headers
    panel.screenshot(path=str(artifacts / "ui-cnn-saved-operands.png"))


def test_collapse_chains_folds_loops_never_layers(page, cnn, artifacts):
    convs = sum(1 for n in cnn["nodes"] if n["label"] == "ConvolutionBackward0")
    assert convs == 3
    mount(page, cnn)
    collapse = page.locator("[data-symgrad=collapse]")
    if collapse.is_visible() and collapse.text_content() == "Collapse chains":
        collapse.click()
    # every layer is still its own box: no chain box, each convolution drawn
    labels = page.locator(".sg-node .sg-node-label").all_text_contents()
    assert labels.count("ConvolutionBackward0") == convs, labels
    assert not [lb for lb in labels if "→" in lb or "×" in lb], labels
    assert page.locator(".sg-node").count() == len(cnn["nodes"])
    page.screenshot(path=str(artifacts / "ui-cnn-collapse.png"))

    # a loop of simple ops (x = x * w + b, w and b shared) still folds into one box
    loop = payloads.loop_chain(10)
    mount(page, loop)
    collapse.click()
    assert page.locator(".sg-node[data-kind=op]").count() < 20
    chain = page.locator(".sg-node .sg-node-label", has_text="×")
    assert chain.count() == 1
    assert "(MulBackward0 → AddBackward0) ×" in chain.text_content() or \
        "(AddBackward0 → MulBackward0) ×" in chain.text_content()
