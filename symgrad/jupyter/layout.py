"""The one layout of a graph payload, in pure Python (Sugiyama-style; no graphviz binary).

Both views draw from it: the static SVG (svg.py) and the JupyterLab extension, which reads
the boxes and edge routes that :func:`payload_layout` ships in the graph JSON (``layout``,
see graph.schema.json) and runs its own layout only for a payload without one or for a view
the shipped layout does not cover (a chain the user expanded). So the layout covers what
both views show first: :func:`visible_graph` (runs of ops collapsed into chain boxes in big
graphs, as the extension does) with boxes sized by :func:`box_size` to fit the labels of
both views.

Roots go on top and gradients flow down to the leaves, as in torchviz drawings.
Steps: longest-path layering from the roots; dummy nodes split edges that span several
layers (so they bend around boxes instead of crossing them), within a budget linear in
the node count (the longest edges past it, e.g. to a leaf shared by a whole loop, are
drawn straight); a few sweeps of barycentric
ordering reduce crossings; x positions are pulled toward the mean of their neighbours
and then pushed apart so boxes never overlap. Linear-ish in the graph size: a 2000-node
graph lays out in well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Layout", "layout", "box_size", "find_chains", "visible_graph", "payload_layout",
           "module_boxes", "module_clusters",
           "layout_matches", "layout_boxes", "layout_bends", "edge_points",
           "AUTO_COLLAPSE_NODES", "MIN_RUN"]

# Box metrics, shared with the labextension's text (labextension/src/format.ts): 12px
# monospace is 7.2px a character; labels are clipped as the extension clips them.
CHAR_W = 7.2
PAD_X = 13.0
BOX_H = 40.0  # an op, leaf or chain box; also the height of a layer
NONE_H = 26.0
MIN_W = 72.0
MIN_W_NONE = 48.0
MAX_W = 300.0
MAX_LABEL = 32
MAX_CHAIN_LABEL = 40
GAP_X = 22.0
GAP_Y = 40.0
MARGIN = 10.0
SWEEPS = 6


@dataclass
class Layout:
    """Boxes by node id (x, y = top-left), edge polylines, and the drawing size."""

    boxes: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    edges: list[tuple[str, str, list[tuple[float, float]]]] = field(default_factory=list)
    layers: list[list[str]] = field(default_factory=list)
    width: float = 0.0
    height: float = 0.0


def clip(text: str, n: int = MAX_LABEL) -> str:
    """``text`` cut to ``n`` characters with an ellipsis (the extension's ``clip``)."""
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def box_width(label: str, sublabel: str = "") -> float:
    return min(max(MIN_W, CHAR_W * max(len(label), len(sublabel)) + 2 * PAD_X), MAX_W)


def _shape(shape, empty: str) -> str:
    if shape is None:
        return ""
    return empty if shape == [] else "[" + ", ".join(str(d) for d in shape) + "]"


def static_texts(n: dict) -> tuple[str, str]:
    """Label and sublabel of a box in the static SVG."""
    label = clip(n["label"], MAX_CHAIN_LABEL if n["kind"] == "chain" else MAX_LABEL)
    shape_txt = _shape(n.get("shape"), "()")
    if n["kind"] == "accumulate":
        sub = ("AccumulateGrad " + shape_txt).strip()
    elif n["kind"] == "chain":
        sub = f"{len(n['members'])} ops"
    elif n["kind"] == "module":
        sub = _module_sub(n)
    elif n["kind"] == "none":
        sub = n.get("variable") or ""
    elif n["kind"] == "op" and n.get("variable"):
        sub = f"{n['variable']} {shape_txt}".strip()
    else:
        sub = shape_txt
    return label, clip(sub, int((MAX_W - 2 * PAD_X) / CHAR_W))


def _module_sub(n: dict) -> str:
    """A collapsed module's sublabel: node count and verdict (``61 nodes · ✗``)."""
    return f"{len(n['members'])} nodes \u00b7 {VERDICT_MARK.get(n.get('verdict'), '')}"


def _lab_sub(n: dict) -> str:
    """The sublabel the labextension draws (format.ts ``nodeSub``, the chain's ``sub``)."""
    if n["kind"] == "module":
        return _module_sub(n)
    if n["kind"] == "chain":
        return f"{len(n['members'])} nodes \u00b7 click to expand"
    if n["kind"] == "none":
        return ""
    shape = "?" if n.get("shape") is None else _shape(n["shape"], "[]")
    return "AccumulateGrad " + shape if n["kind"] == "accumulate" else shape


def box_size(n: dict) -> tuple[float, float]:
    """Width and height of a node's box: wide enough for the static SVG's texts and the
    labextension's (clipped labels, 7.2px a character), within ``MAX_W``."""
    label, sub = static_texts(n)
    chars = max(len(label), len(sub), len(_lab_sub(n)))
    if n["kind"] == "none":  # as tall as the others when the SVG names the constant
        return min(max(MIN_W_NONE, CHAR_W * chars + 2 * PAD_X), MAX_W), BOX_H if sub else NONE_H
    return min(max(MIN_W, CHAR_W * chars + 2 * PAD_X), MAX_W), BOX_H


# -- what is drawn: runs of ops collapsed in big graphs ------------------------------------

#: Above this many nodes, runs of ops are drawn as one box (as the labextension does).
AUTO_COLLAPSE_NODES = 150
#: Shortest run of ops that is collapsed.
MIN_RUN = 6
_STATUS_RANK = {"fail": 4, "error": 3, "pass": 2, "skipped": 1, "none": 0}


def _summarize_run(labels: list[str]) -> str:
    for p in range(1, min(4, len(labels) // 2) + 1):
        if all(lb == labels[i % p] for i, lb in enumerate(labels)):
            reps, rest = divmod(len(labels), p)
            unit = labels[0] if p == 1 else "(" + " \u2192 ".join(labels[:p]) + ")"
            return f"{unit} \u00d7 {reps}" + (f" + {rest}" if rest else "")
    return f"{labels[0]} \u2192 \u2026 \u2192 {labels[-1]}"


def find_chains(payload: dict, keep: set[str] | frozenset[str] = frozenset()) -> list[dict]:
    """Maximal runs of op nodes ``a -> b -> c`` where each consumes only the next op and
    is consumed only by the previous one, and each is a simple node: one input of its
    own. An input of its own is any op, and any leaf that no other op consumes (a
    layer's weight); leaves shared by several ops (the ``w`` of ``x = x * w + b``) and
    None do not count. So a loop folds into one box, while a conv net's body does not: a
    convolution, with its own weight and bias, has several inputs and stays in sight.

    Loops (``x = x * w + b``) build such runs; they are what makes a 500-op graph
    unreadable and slow to draw. Roots, ``keep`` (the selection) and failing nodes break
    runs, like the labextension's ``findChains``. Each group: ``id``, ``members`` (ids),
    ``label``, ``status`` (the worst member check).
    """
    by_id = {n["id"]: n for n in payload["nodes"]}
    op_children: dict[str, set[str]] = {}
    parents: dict[str, set[str]] = {}
    inputs: dict[str, set[str]] = {}
    for e in payload["edges"]:
        parents.setdefault(e["to"], set()).add(e["from"])
        inputs.setdefault(e["from"], set()).add(e["to"])
        if by_id.get(e["to"], {}).get("kind") == "op":
            op_children.setdefault(e["from"], set()).add(e["to"])
    roots = set(payload.get("roots") or [])

    def own_inputs(nid: str) -> int:
        count = 0
        for i in inputs.get(nid, ()):
            kind = by_id.get(i, {}).get("kind")
            if kind == "op" or (kind in ("leaf", "accumulate") and len(parents.get(i, ())) < 2):
                count += 1
        return count

    def breaker(n: dict) -> bool:
        return (n["kind"] != "op" or n["id"] in keep or n["id"] in roots
                or n.get("first_bad") is True or n["check"]["status"] in ("fail", "error")
                or own_inputs(n["id"]) > 1)

    nxt: dict[str, str] = {}
    has_prev: set[str] = set()
    for n in payload["nodes"]:
        kids = op_children.get(n["id"])
        if breaker(n) or not kids or len(kids) != 1:
            continue
        b = next(iter(kids))
        if not breaker(by_id[b]) and len(parents.get(b, ())) == 1:
            nxt[n["id"]] = b
            has_prev.add(b)
    groups = []
    for n in payload["nodes"]:
        if n["id"] not in nxt or n["id"] in has_prev:
            continue
        members = [n["id"]]
        seen = {n["id"]}
        cur = n["id"]
        while cur in nxt and nxt[cur] not in seen:
            cur = nxt[cur]
            seen.add(cur)
            members.append(cur)
        if len(members) >= MIN_RUN:
            status = max((by_id[m]["check"]["status"] for m in members),
                         key=lambda st: _STATUS_RANK.get(st, 0))
            groups.append({"id": "chain:" + n["id"], "members": members, "status": status,
                           "label": _summarize_run([by_id[m]["label"] for m in members])})
    return groups


VERDICT_STATUS = {"bad": "fail", "ok": "pass", "unchecked": "none"}
VERDICT_MARK = {"bad": "\u2717", "ok": "\u2713", "unchecked": "not checked"}
_VERDICT_RANK = {"bad": 2, "unchecked": 1, "ok": 0}


def _merge_edges(edges: list[dict], owner: dict[str, str]) -> list[dict]:
    """Edges between drawn boxes: members' edges renamed to their box, merged, no loops."""
    out: dict[tuple[str, str], dict] = {}
    for e in edges:
        a, b = owner.get(e["from"], e["from"]), owner.get(e["to"], e["to"])
        if a != b and (a, b) not in out:
            out[(a, b)] = {"from": a, "to": b, "input": e["input"] if a == e["from"] else ""}
    return list(out.values())


def module_boxes(payload: dict) -> tuple[list[dict], dict[str, str]]:
    """The boxes that stand for collapsed modules, and ``node id -> box id``.

    A node goes into the box of its outermost collapsed module (``payload['collapsed']``):
    id ``module:<path>``, label ``path: Type``. Members of a fold that are all collapsed
    share one box ``Block × N`` (id ``fold:<first member>``). Each box carries the
    module's ``verdict`` (a fold: the worst of its members') and ``members``.
    """
    mods = {m["path"]: m for m in payload.get("modules") or []}
    collapsed = [p for p in payload.get("collapsed") or [] if p in mods]
    if not collapsed:
        return [], {}
    shut = set(collapsed)

    def outermost(path: str) -> str | None:
        parts = path.split(".") if path else []
        for k in range(1, len(parts) + 1):
            prefix = ".".join(parts[:k])
            if prefix in shut:
                return prefix
        return None

    box_of: dict[str, str] = {}  # collapsed module path -> box id
    boxes: dict[str, dict] = {}
    for f in payload.get("folds") or []:
        members = f["members"]
        if all(m in shut and outermost(m) == m for m in members):
            bid = "fold:" + members[0]
            verdict = max((mods[m]["verdict"] for m in members),
                          key=lambda v: _VERDICT_RANK.get(v, 0))
            boxes[bid] = {"id": bid, "kind": "module", "label": f["label"], "name": f["label"],
                          "paths": list(members), "verdict": verdict, "members": [],
                          "check": {"status": VERDICT_STATUS.get(verdict, "none")}}
            for m in members:
                box_of[m] = bid
    for p in collapsed:
        if outermost(p) != p or p in box_of:
            continue
        m = mods[p]
        bid = "module:" + p
        box_of[p] = bid
        boxes[bid] = {"id": bid, "kind": "module", "label": f"{p}: {m['type']}",
                      "name": m["type"], "paths": [p], "verdict": m["verdict"], "members": [],
                      "check": {"status": VERDICT_STATUS.get(m["verdict"], "none")}}
    owner: dict[str, str] = {}
    for n in payload["nodes"]:
        top = outermost(n.get("module") or "")
        if top is not None:
            owner[n["id"]] = box_of[top]
            boxes[box_of[top]]["members"].append(n["id"])
    return [b for b in boxes.values() if b["members"]], owner


def _expanded(payload: dict) -> list[dict]:
    """The modules drawn as frames: listed, neither collapsed nor inside a collapsed one."""
    shut = set(payload.get("collapsed") or [])
    return [m for m in payload.get("modules") or []
            if not any(".".join(m["path"].split(".")[:k]) in shut
                       for k in range(1, m["path"].count(".") + 2))]


def frame_pads(payload: dict) -> dict[str, float]:
    """Padding of each expanded module's frame around its nodes: more for a module with
    more levels of frames inside, so nested frames never touch."""
    mods = _expanded(payload)
    levels: dict[str, int] = {m["path"]: 0 for m in mods}
    for m in sorted(mods, key=lambda m: -m["depth"]):  # children first
        if m["parent"] in levels:
            levels[m["parent"]] = max(levels[m["parent"]], levels[m["path"]] + 1)
    return {p: 5.0 * (k + 1) for p, k in levels.items()}


#: Height of a frame's label above its first layer's boxes (and pad).
FRAME_LABEL_H = 12.0


def frame_reach(pads: dict[str, float]) -> float:
    """How far above its boxes a frame reaches at most (pad and label): where every frame
    steps from one layer's width to the next's, so nested frames stay nested and
    siblings never meet."""
    return max(pads.values(), default=0.0) + FRAME_LABEL_H


def frame_groups(payload: dict, nodes: list[dict]) -> dict[str, tuple[str, ...]]:
    """Drawn node id -> the expanded modules (frames) it sits in, outermost first: a
    node's own module and its ancestors; a collapsed module's box sits in its parent's
    frames; a chain box in the frames all its members share."""
    framed = {m["path"] for m in _expanded(payload)}

    def frames_of(path: str) -> tuple[str, ...]:
        parts = path.split(".") if path else []
        return tuple(p for p in (".".join(parts[:k]) for k in range(1, len(parts) + 1))
                     if p in framed)

    module_of = {n["id"]: n.get("module") or "" for n in payload["nodes"]}
    out: dict[str, tuple[str, ...]] = {}
    for n in nodes:
        if n["kind"] == "module":  # collapsed, so not a frame: in its ancestors' frames
            got = frames_of(n["paths"][0])
        elif n["kind"] == "chain":
            got = frames_of(module_of.get(n["members"][0], ""))
            for m in n["members"][1:]:
                got = _common_prefix(got, frames_of(module_of.get(m, "")))
        else:
            got = frames_of(n.get("module") or "")
        if got:
            out[n["id"]] = got
    return out


def module_clusters(payload: dict, nodes: list[dict],
                    boxes: dict[str, list[float]]) -> list[dict]:
    """Frames for the expanded modules around the drawn boxes of their nodes, outermost
    first: ``path``, ``type``, ``verdict``, ``depth``, ``rect`` ``[x, y, w, h]`` (the
    bounding box) and ``outline``: one polygon (``[(x, y), ...]``) per run of consecutive
    layers holding the module's nodes, each layer as wide as its members padded by
    :func:`frame_pads` (a frame's members sit side by side in every layer, see
    :func:`frame_groups`, so sibling frames do not overlap), with room for the label on
    top of the first."""
    drawn_of: dict[str, str] = {}
    for n in nodes:
        for m in n.get("members") or [n["id"]]:
            drawn_of[m] = n["id"]
    pads = frame_pads(payload)
    reach = frame_reach(pads)
    centres = sorted({round(b[1] + b[3] / 2, 1) for b in boxes.values()})
    step = min((b - a for a, b in zip(centres, centres[1:])), default=BOX_H + GAP_Y)
    out = []
    for m in _expanded(payload):
        ids = {drawn_of[i] for i in m["nodes"] if i in drawn_of}
        rects = [boxes[i] for i in ids if i in boxes]
        if not rects:
            continue
        pad = pads[m["path"]]
        spans: dict[float, list[float]] = {}  # layer centre -> [left, right]
        for x, y, w, h in rects:
            cy = round(y + h / 2, 1)
            got = spans.setdefault(cy, [x, x + w])
            got[0], got[1] = min(got[0], x), max(got[1], x + w)
        runs: list[list[tuple[float, float, float]]] = []
        for cy in sorted(spans):
            a, b = spans[cy]
            if runs and cy - runs[-1][-1][0] > step * 1.5:
                runs.append([])
            elif not runs:
                runs.append([])
            runs[-1].append((cy, a - pad, b + pad))
        outline = []
        for k, run in enumerate(runs):
            top = run[0][0] - BOX_H / 2 - pad - (FRAME_LABEL_H if k == 0 else 0.0)
            bottom = run[-1][0] + BOX_H / 2 + pad
            right = [(run[0][2], top)]
            left = [(run[0][1], top)]
            for (_c0, a0, b0), (c1, a1, b1) in zip(run, run[1:]):
                turn = c1 - BOX_H / 2 - reach  # the same height for every frame
                right += [(b0, turn), (b1, turn)]
                left += [(a0, turn), (a1, turn)]
            right.append((run[-1][2], bottom))
            left.append((run[-1][1], bottom))
            outline.append(right + left[::-1])
        xs = [px for poly in outline for px, _ in poly]
        ys = [py for poly in outline for _, py in poly]
        out.append({"path": m["path"], "type": m["type"], "verdict": m["verdict"],
                    "depth": m["depth"], "outline": outline,
                    "rect": [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)]})
    return sorted(out, key=lambda c: c["depth"])


def visible_graph(payload: dict, selected: str | None = None) -> tuple[list[dict], list[dict]]:
    """Nodes and edges to draw: collapsed modules (``payload['collapsed']``) as one box
    each (:func:`module_boxes`), then runs collapsed into chain boxes in big graphs, with
    the edges of their members merged (so a leaf shared by a whole loop gets one edge)."""
    nodes, edges = payload["nodes"], payload["edges"]
    mboxes, owner = module_boxes(payload)
    if mboxes:
        first = {b["members"][0]: b for b in mboxes}
        nodes = [first[n["id"]] if n["id"] in first else n for n in nodes
                 if n["id"] in first or n["id"] not in owner]
        edges = _merge_edges(edges, owner)
        roots = [owner.get(r, r) for r in payload.get("roots") or []]
        payload = dict(payload, nodes=nodes, edges=edges, roots=roots)
    if len(nodes) <= AUTO_COLLAPSE_NODES:
        return nodes, edges
    groups = find_chains(payload, {selected} if selected else set())
    if not groups:
        return nodes, edges
    owner = {m: g["id"] for g in groups for m in g["members"]}
    first = {g["members"][0]: g for g in groups}
    vis_nodes = []
    for n in nodes:
        g = first.get(n["id"])
        if g is not None:
            vis_nodes.append({"id": g["id"], "kind": "chain", "label": g["label"],
                              "name": g["label"], "members": g["members"],
                              "check": {"status": g["status"]}})
        elif n["id"] not in owner:
            vis_nodes.append(n)
    vis_edges: dict[tuple[str, str], dict] = {}
    for e in edges:
        a, b = owner.get(e["from"], e["from"]), owner.get(e["to"], e["to"])
        if a != b and (a, b) not in vis_edges:
            vis_edges[(a, b)] = {"from": a, "to": b,
                                 "input": e["input"] if a == e["from"] else ""}
    return vis_nodes, list(vis_edges.values())


def payload_layout(payload: dict, selected: str | None = None) -> dict:
    """The layout of what is first drawn of ``payload`` (``selected`` kept out of chains),
    as compact JSON for the payload's ``layout``: ``nodes`` maps each drawn node id (a
    chain box: ``chain:<first member>``) to ``"x y w h"`` (its box, top-left, whole
    pixels); ``edges`` lists ``[from, to, "x1 y1 x2 y2 ..."]``, the bend points of the
    edges that have some (an edge runs from the bottom centre of ``from`` to the top
    centre of ``to`` through them); ``width`` and ``height`` bound the drawing. Numbers
    go in strings because a saved notebook writes a JSON list one item a line."""
    nodes, edges = visible_graph(payload, selected)
    sizes = {n["id"]: box_size(n) for n in nodes}
    pads = frame_pads(payload)
    lay = layout([n["id"] for n in nodes], [(e["from"], e["to"]) for e in edges],
                 {k: v[0] for k, v in sizes.items()}, heights={k: v[1] for k, v in sizes.items()},
                 groups=frame_groups(payload, nodes), group_pad=pads,
                 gap_y=max(GAP_Y, frame_reach(pads) + max(pads.values(), default=0.0) + 8.0))
    out: dict = {"width": round(lay.width), "height": round(lay.height),
                 "nodes": {k: " ".join(str(round(v)) for v in box)
                           for k, box in lay.boxes.items()}}
    bent: list[list] = []
    seen: set[tuple[str, str]] = set()
    for a, b, pts in lay.edges:
        if len(pts) > 2 and (a, b) not in seen:
            seen.add((a, b))
            bent.append([a, b, " ".join(str(round(v)) for p in pts[1:-1] for v in p)])
    if bent:
        out["edges"] = bent
    return out


def _numbers(text: object) -> list[float]:
    return [float(v) for v in text.split()] if isinstance(text, str) else []


def layout_boxes(lay: dict) -> dict[str, list[float]]:
    """A payload layout's boxes as ``id -> [x, y, w, h]``."""
    return {k: _numbers(v) for k, v in lay["nodes"].items()}


def layout_matches(lay: object, nodes: list[dict]) -> bool:
    """Whether a payload's ``layout`` covers exactly the nodes to draw."""
    return (isinstance(lay, dict) and isinstance(lay.get("nodes"), dict)
            and len(lay["nodes"]) == len(nodes)
            and all(len(_numbers(lay["nodes"].get(n["id"]))) == 4 for n in nodes))


def layout_bends(lay: dict) -> dict[tuple[str, str], list[float]]:
    """A payload layout's bend points as ``(from, to) -> [x1, y1, x2, y2, ...]``."""
    return {(e[0], e[1]): _numbers(e[2]) for e in lay.get("edges", []) if len(e) == 3}


def edge_points(boxes: dict, a: str, b: str,
                bends: dict | None = None) -> list[tuple[float, float]]:
    """The polyline of edge ``a -> b``: from the bottom centre of ``a`` through its bend
    points to the top centre of ``b``."""
    ax, ay, aw, ah = boxes[a]
    bx, by, bw, _bh = boxes[b]
    mid = (bends or {}).get((a, b), [])
    pts = [(ax + aw / 2, ay + ah)]
    pts.extend((mid[i], mid[i + 1]) for i in range(0, len(mid) - 1, 2))
    pts.append((bx + bw / 2, by))
    return pts


def _common_prefix(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    return a[:k]


def _framed_order(items: list[tuple[float, str]], groups: dict[str, tuple[str, ...]],
                  level: int) -> list[str]:
    """``items`` (barycentre, node) ordered with each frame's members side by side: the
    frames at ``level`` and the loose nodes sorted by (mean) barycentre, recursively."""
    buckets: dict[str, list[tuple[float, str]]] = {}
    units: list[tuple[float, int, list[str]]] = []
    for bc, n in items:
        g = groups.get(n, ())
        if len(g) > level:
            buckets.setdefault(g[level], []).append((bc, n))
        else:
            units.append((bc, len(units), [n]))
    for members in buckets.values():
        mean = sum(bc for bc, _ in members) / len(members)
        units.append((mean, len(units), _framed_order(members, groups, level + 1)))
    units.sort(key=lambda u: (u[0], u[1]))
    return [n for _, _, ns in units for n in ns]


def layout(node_ids: list[str], edges: list[tuple[str, str]],
           widths: dict[str, float] | None = None, max_dummies: int | None = None,
           heights: dict[str, float] | None = None,
           groups: dict[str, tuple[str, ...]] | None = None,
           group_pad: dict[str, float] | None = None, gap_y: float = GAP_Y) -> Layout:
    """Lay out the DAG ``edges`` (``(from, to)``, from = consumer, drawn above ``to``).

    Boxes are ``widths`` wide (default ``MIN_W``) and ``heights`` high (at most ``BOX_H``,
    the default; a lower box is centred in its layer). ``max_dummies`` bounds the bend
    points of long edges (default ``4 n + 64``); edges
    past it are drawn straight, so time and output stay linear in the graph size.
    ``groups`` puts nodes in nested frames (node -> its frames' keys, outermost first):
    the members of a frame sit side by side in every layer, and neighbours in different
    frames are kept apart by the ``group_pad`` of each frame between them. ``gap_y``: the
    space between layers (room for the frames' pads and labels).
    """
    widths = widths or {}
    heights = heights or {}
    groups = dict(groups or {})
    group_pad = group_pad or {}
    ids = list(dict.fromkeys(node_ids))
    index = {n: i for i, n in enumerate(ids)}
    edge_list = [(a, b) for a, b in edges if a in index and b in index and a != b]
    children: dict[str, list[str]] = {n: [] for n in ids}
    parents: dict[str, list[str]] = {n: [] for n in ids}
    for a, b in edge_list:
        children[a].append(b)
        parents[b].append(a)

    # 1. longest-path layering (Kahn order; a cycle, impossible in autograd, is broken)
    indeg = {n: len(parents[n]) for n in ids}
    rank = dict.fromkeys(ids, 0)
    queue = [n for n in ids if indeg[n] == 0]
    head = 0
    done: set[str] = set()
    while head < len(queue) or len(done) < len(ids):
        if head == len(queue):
            queue.append(next(n for n in ids if n not in done))
        n = queue[head]
        head += 1
        if n in done:
            continue
        done.add(n)
        for c in children[n]:
            rank[c] = max(rank[c], rank[n] + 1)
            indeg[c] -= 1
            if indeg[c] == 0:
                queue.append(c)

    # 2. dummy nodes for long edges, within a budget linear in the graph size: a leaf
    # shared by every op of a 500-op loop would otherwise need ~n^2/2 of them, so the
    # longest edges beyond the budget are drawn straight (they still pull the ordering)
    if max_dummies is None:
        max_dummies = 4 * len(ids) + 64
    spans = sorted(max(rank[b] - rank[a] - 1, 0) for a, b in edge_list)
    span_cap = len(ids) + 1
    total = 0
    for s in spans:
        if total + s > max_dummies:
            span_cap = s
            break
        total += s
    chains: list[tuple[str, str, list[str]]] = []
    down: dict[str, list[str]] = {n: [] for n in ids}  # adjacency between adjacent layers
    up: dict[str, list[str]] = {n: [] for n in ids}
    rank_all = dict(rank)
    dummy_count = 0
    for a, b in edge_list:
        span = rank[b] - rank[a]
        path = [a]
        if span <= 0:  # only possible for a broken cycle: draw straight
            chains.append((a, b, [a, b]))
            continue
        if span - 1 >= span_cap:  # over the budget: straight
            down[a].append(b)
            up[b].append(a)
            chains.append((a, b, [a, b]))
            continue
        ra = rank[a]
        common = _common_prefix(groups.get(a, ()), groups.get(b, ())) if groups else ()
        for k in range(1, span):
            d = f"\x00d{dummy_count}"
            dummy_count += 1
            rank_all[d] = ra + k
            if common:
                groups[d] = common
            down[d] = []
            up[d] = []
            path.append(d)
        path.append(b)
        for u, v in zip(path, path[1:]):
            down[u].append(v)
            up[v].append(u)
        chains.append((a, b, path))

    n_layers = max(rank_all.values(), default=-1) + 1
    layers: list[list[str]] = [[] for _ in range(n_layers)]
    # initial order: DFS from the roots so subtrees start out together
    seen: set[str] = set()
    for r in [n for n in ids if not up[n]] + ids:
        stack = [r]
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            layers[rank_all[n]].append(n)
            stack.extend(reversed(down[n]))
    for d in rank_all:
        if d not in seen:
            layers[rank_all[d]].append(d)
            seen.add(d)

    # 3. barycentric sweeps
    pos = {n: float(i) for layer in layers for i, n in enumerate(layer)}

    def sweep(layer_range, neighbours) -> None:
        for li in layer_range:
            layer = layers[li]
            keyed = []
            for i, n in enumerate(layer):
                nb = neighbours[n]
                bc = sum(map(pos.__getitem__, nb)) / len(nb) if nb else pos[n]
                keyed.append((bc, i, n))
            keyed.sort()
            layers[li] = [n for _, _, n in keyed] if not groups else \
                _framed_order([(bc, n) for bc, _, n in keyed], groups, 0)
            for i, n in enumerate(layers[li]):
                pos[n] = float(i)

    if groups:  # frames side by side from the start
        for li, layer in enumerate(layers):
            layers[li] = _framed_order([(pos[n], n) for n in layer], groups, 0)
            for i, n in enumerate(layers[li]):
                pos[n] = float(i)
    for k in range(SWEEPS):
        if k % 2 == 0:
            sweep(range(1, n_layers), up)
        else:
            sweep(range(n_layers - 2, -1, -1), down)

    def gap(a: str, b: str) -> float:
        """Room between neighbours: the frames that end between them need their pads."""
        if not groups:
            return GAP_X
        ga, gb = groups.get(a, ()), groups.get(b, ())
        k = len(_common_prefix(ga, gb))
        return GAP_X + sum(group_pad.get(g, 0.0) for g in ga[k:] + gb[k:])

    # 4. x coordinates: packed, then pulled toward neighbours, then de-overlapped
    wd = {n: 8.0 if n.startswith("\x00") else widths.get(n, MIN_W) for n in rank_all}
    w_of = wd.__getitem__

    x: dict[str, float] = {}
    for layer in layers:
        cur = 0.0
        for i, n in enumerate(layer):
            x[n] = cur + w_of(n) / 2
            cur += w_of(n) + (gap(n, layer[i + 1]) if i + 1 < len(layer) else GAP_X)

    def pack(layer: list[str]) -> None:
        # keep order, enforce minimum gaps, keep the layer's mean where it wanted to be
        if not layer:
            return
        want = [x[n] for n in layer]
        placed = []
        for i, n in enumerate(layer):
            v = want[i]
            if placed:
                prev = layer[i - 1]
                v = max(v, placed[-1] + (w_of(prev) + w_of(n)) / 2 + gap(prev, n))
            placed.append(v)
        shift = (sum(want) - sum(placed)) / len(placed)
        # shifting keeps gaps; the left-to-right push only ever moved boxes right
        for n, v in zip(layer, placed):
            x[n] = v + shift

    for k in range(4):
        order = range(1, n_layers) if k % 2 == 0 else range(n_layers - 2, -1, -1)
        nbrs = up if k % 2 == 0 else down
        for li in order:
            for n in layers[li]:
                nb = nbrs[n]
                if nb:
                    x[n] = (x[n] + sum(map(x.__getitem__, nb)) / len(nb)) / 2
            pack(layers[li])

    min_x = min((x[n] - w_of(n) / 2 for n in x), default=0.0)
    margin = MARGIN + max((sum(group_pad.get(g, 0.0) for g in groups.get(n, ()))
                           for n in ids), default=0.0)  # room for the outer frames
    out = Layout(layers=[[n for n in layer if not n.startswith("\x00")] for layer in layers])

    def top(n: str) -> float:  # of the box (a lower box sits centred in its layer)
        return margin + rank_all[n] * (BOX_H + gap_y) + (BOX_H - h_of(n)) / 2

    def h_of(n: str) -> float:
        return BOX_H if n.startswith("\x00") else min(heights.get(n, BOX_H), BOX_H)

    max_x = 0.0
    for layer in layers:
        for n in layer:
            x[n] = x[n] - min_x + margin
            if not n.startswith("\x00"):
                w = w_of(n)
                out.boxes[n] = (x[n] - w / 2, top(n), w, h_of(n))
                max_x = max(max_x, x[n] + w / 2)
    for a, b, path in chains:
        pts = []
        for k, n in enumerate(path):
            if k == 0:
                pts.append((x[n], top(n) + h_of(n)))
            elif k == len(path) - 1:
                pts.append((x[n], top(n)))
            else:
                pts.append((x[n], top(n)))
                pts.append((x[n], top(n) + BOX_H))
        out.edges.append((a, b, pts))
    out.width = max_x + margin
    out.height = margin * 2 + max(n_layers, 1) * (BOX_H + gap_y) - gap_y
    return out
