"""A layered DAG layout in pure Python (Sugiyama-style; no graphviz binary needed).

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

__all__ = ["Layout", "layout"]

CHAR_W = 7.0  # px per character of a 12px monospace-ish label
BOX_H = 34.0
PAD_X = 14.0
GAP_X = 22.0
GAP_Y = 58.0
MIN_W = 56.0
SWEEPS = 6


@dataclass
class Layout:
    """Boxes by node id (x, y = top-left), edge polylines, and the drawing size."""

    boxes: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    edges: list[tuple[str, str, list[tuple[float, float]]]] = field(default_factory=list)
    layers: list[list[str]] = field(default_factory=list)
    width: float = 0.0
    height: float = 0.0


def box_width(label: str, sublabel: str = "") -> float:
    return max(MIN_W, CHAR_W * max(len(label), len(sublabel)) + 2 * PAD_X)


def layout(node_ids: list[str], edges: list[tuple[str, str]],
           widths: dict[str, float] | None = None, max_dummies: int | None = None) -> Layout:
    """Lay out the DAG ``edges`` (``(from, to)``, from = consumer, drawn above ``to``).

    ``max_dummies`` bounds the bend points of long edges (default ``4 n + 64``); edges
    past it are drawn straight, so time and output stay linear in the graph size.
    """
    widths = widths or {}
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
        for k in range(1, span):
            d = f"\x00d{dummy_count}"
            dummy_count += 1
            rank_all[d] = rank[a] + k
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
                bc = sum(pos[m] for m in nb) / len(nb) if nb else pos[n]
                keyed.append((bc, i, n))
            keyed.sort()
            layers[li] = [n for _, _, n in keyed]
            for i, n in enumerate(layers[li]):
                pos[n] = float(i)

    for k in range(SWEEPS):
        if k % 2 == 0:
            sweep(range(1, n_layers), up)
        else:
            sweep(range(n_layers - 2, -1, -1), down)

    # 4. x coordinates: packed, then pulled toward neighbours, then de-overlapped
    def w_of(n: str) -> float:
        return 8.0 if n.startswith("\x00") else widths.get(n, MIN_W)

    x: dict[str, float] = {}
    for layer in layers:
        cur = 0.0
        for n in layer:
            x[n] = cur + w_of(n) / 2
            cur += w_of(n) + GAP_X

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
                v = max(v, placed[-1] + (w_of(prev) + w_of(n)) / 2 + GAP_X)
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
                    x[n] = (x[n] + sum(x[m] for m in nb) / len(nb)) / 2
            pack(layers[li])

    min_x = min((x[n] - w_of(n) / 2 for n in x), default=0.0)
    margin = 10.0
    out = Layout(layers=[[n for n in layer if not n.startswith("\x00")] for layer in layers])
    max_x = 0.0
    for li, layer in enumerate(layers):
        y = margin + li * (BOX_H + GAP_Y)
        for n in layer:
            x[n] = x[n] - min_x + margin
            if not n.startswith("\x00"):
                w = w_of(n)
                out.boxes[n] = (x[n] - w / 2, y, w, BOX_H)
                max_x = max(max_x, x[n] + w / 2)
    for a, b, path in chains:
        pts = []
        for k, n in enumerate(path):
            y = margin + rank_all[n] * (BOX_H + GAP_Y)
            if k == 0:
                pts.append((x[n], y + BOX_H))
            elif k == len(path) - 1:
                pts.append((x[n], y))
            else:
                pts.append((x[n], y))
                pts.append((x[n], y + BOX_H))
        out.edges.append((a, b, pts))
    out.width = max_x + margin
    out.height = margin * 2 + max(n_layers, 1) * (BOX_H + GAP_Y) - GAP_Y
    return out
