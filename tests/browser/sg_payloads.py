"""Hand-built graph payloads (symgrad.graph/1) for the renderer's browser tests.

They are validated against the package's schema in the tests, so they stay honest about
the format the Python side produces.
"""

from __future__ import annotations

from typing import Any

XSS = "<img src=x onerror=alert(1)>"


def _node(nid: str, kind: str, label: str, *, name: str | None = None, shape=None,
          dtype: str | None = "float32", saved=None, status: str = "none", **extra: Any
          ) -> dict[str, Any]:
    node = {
        "id": nid, "kind": kind, "label": label, "name": name or label,
        "shape": shape, "dtype": dtype, "saved": saved or [], "check": {"status": status},
    }
    node.update(extra)
    return node


def tutorial(leaf_name: str = "c", bad: bool = False) -> dict[str, Any]:
    """e = (a + b) * c as drawn for the autograd tutorial: 2 ops, 3 leaves."""
    mul_status = "fail" if bad else "pass"
    nodes = [
        _node("n0", "op", "MulBackward0", shape=[], status=mul_status, first_bad=bad,
              formula=r"d \cdot c", derivative=r"\bar{e} \cdot c,\; \bar{e} \cdot d",
              saved=[
                  {"name": "other", "attr": "_saved_other", "kind": "tensor", "shape": [],
                   "dtype": "float32", "preview": "tensor(4.)", "same_object_as": leaf_name},
                  {"name": "self", "attr": "_saved_self", "kind": "tensor", "shape": [],
                   "dtype": "float32", "preview": "tensor(3.)", "same_object_as": "d"},
              ]),
        _node("n1", "op", "AddBackward0", shape=[], status="pass", formula="a + b",
              saved=[{"name": "alpha", "attr": "_saved_alpha", "kind": "scalar",
                      "preview": "1"}]),
        _node("n2", "accumulate", "a", name="AccumulateGrad", shape=[], variable="a"),
        _node("n3", "accumulate", "b", name="AccumulateGrad", shape=[], variable="b"),
        _node("n4", "accumulate", leaf_name, name="AccumulateGrad", shape=[],
              variable=leaf_name),
    ]
    edges = [
        {"from": "n0", "to": "n1", "input": 0, "output_nr": 0},
        {"from": "n0", "to": "n4", "input": 1, "output_nr": 0},
        {"from": "n1", "to": "n2", "input": 0, "output_nr": 0},
        {"from": "n1", "to": "n3", "input": 1, "output_nr": 0},
    ]
    leaves = [
        {"id": "n2", "name": "a", "shape": [], "dtype": "float32", "preview": "tensor(1.)",
         "grad_preview": "tensor(4.)"},
        {"id": "n3", "name": "b", "shape": [], "dtype": "float32", "preview": "tensor(2.)"},
        {"id": "n4", "name": leaf_name, "shape": [], "dtype": "float32",
         "preview": "tensor(4.)"},
    ]
    rows = [
        {"leaf": "a", "node": "n2", "engine": "4.0", "symbolic": "4", "symbolic_latex": "c",
         "finite_diff": "4.0000", "max_abs_err": 0.0, "max_rel_err": 0.0, "status": "pass"},
        {"leaf": "b", "node": "n3", "engine": "4.0", "symbolic": "4", "finite_diff": "4.0000",
         "max_abs_err": 0.0, "max_rel_err": 0.0, "status": "pass"},
        {"leaf": leaf_name, "node": "n4", "engine": "7.0" if bad else "3.0",
         "symbolic": "3", "finite_diff": "3.0000", "max_abs_err": 4.0 if bad else 0.0,
         "max_rel_err": 1.33 if bad else 0.0, "status": "fail" if bad else "pass"},
    ]
    return {
        "schema": "symgrad.graph/1", "source": "symgrad", "nodes": nodes, "edges": edges,
        "roots": ["n0"], "root_names": ["e"], "leaves": leaves,
        "agreement": {"ok": not bad, "mode": "exact", "rtol": 1e-5, "atol": 1e-8,
                      "first_bad_node": "n0" if bad else None, "message": None,
                      "rows": rows},
        "truncated": 0,
    }


def loop_chain(steps: int) -> dict[str, Any]:
    """x = x * w + b repeated `steps` times: 2*steps op nodes, leaves x0, w, b."""
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    leaf_ids = {"w": "w", "b": "b", "x0": "x0"}
    for i in range(steps):
        add, mul = f"a{i}", f"m{i}"
        nodes.append(_node(add, "op", "AddBackward0", shape=[4], status="pass",
                           saved=[{"name": "alpha", "kind": "scalar", "preview": "1"}]))
        nodes.append(_node(mul, "op", "MulBackward0", shape=[4], status="pass", saved=[
            {"name": "other", "kind": "tensor", "shape": [4], "dtype": "float32",
             "preview": "tensor([...])", "same_object_as": "w"}]))
        nxt = f"a{i + 1}" if i + 1 < steps else "x0"
        edges += [
            {"from": add, "to": mul, "input": 0},
            {"from": add, "to": "b", "input": 1},
            {"from": mul, "to": nxt, "input": 0},
            {"from": mul, "to": "w", "input": 1},
        ]
    for name, nid in leaf_ids.items():
        nodes.append(_node(nid, "accumulate", name, name="AccumulateGrad", shape=[4],
                           variable=name))
    leaves = [{"id": nid, "name": name, "shape": [4], "dtype": "float32"}
              for name, nid in leaf_ids.items()]
    return {"schema": "symgrad.graph/1", "nodes": nodes, "edges": edges, "roots": ["a0"],
            "root_names": ["x"], "leaves": leaves, "agreement": None, "truncated": 0}


def wide_graph(n_ops: int) -> dict[str, Any]:
    """A sum of n_ops/2 products of distinct leaves: nothing to collapse."""
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    leaves: list[dict[str, Any]] = []
    prev = None
    k = n_ops // 2
    for i in range(k):
        mul, add, leaf = f"m{i}", f"s{i}", f"p{i}"
        nodes.append(_node(mul, "op", "MulBackward0", shape=[2]))
        nodes.append(_node(leaf, "accumulate", f"p{i}", name="AccumulateGrad", shape=[2]))
        leaves.append({"id": leaf, "name": f"p{i}", "shape": [2], "dtype": "float32"})
        edges.append({"from": mul, "to": leaf, "input": 0})
        edges.append({"from": mul, "to": leaf, "input": 1})
        nodes.append(_node(add, "op", "AddBackward0", shape=[2]))
        edges.append({"from": add, "to": mul, "input": 0})
        if prev is not None:
            edges.append({"from": add, "to": prev, "input": 1})
        prev = add
    return {"schema": "symgrad.graph/1", "nodes": nodes, "edges": edges,
            "roots": [prev], "root_names": ["total"], "leaves": leaves, "truncated": 0}



def gpt_like(blocks: int = 2, *, bad_block: int | None = None, mlp_depth: int = 1,
             collapsed: bool = False, shared_mlp_weight: bool = False) -> dict[str, Any]:
    """A GPT-shaped graph with modules, as the module-aware payload describes them:
    wte (Embedding) -> h.0 ... h.{blocks-1} (Block: attn, mlp, residual add) -> head
    (Linear) -> the loss (outside any module). A block computes x + mlp(attn(x)): attn is
    one mm with its weight, mlp is `mlp_depth` (mm, relu) pairs with one weight each.
    Weights carry module '' and are in no module's list (only their layer uses them).
    `bad_block`: that block's attn mm fails its check (the first bad node). `collapsed`:
    the payload collapses the top-level modules, as it does for a big model.
    `shared_mlp_weight`: the mlp's mm's all use one weight (a deep mlp then has a few
    leaves, as real models do, and its (mm, relu) run folds into a chain box)."""
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    leaves: list[dict[str, Any]] = []
    members: dict[str, list[str]] = {}
    bad_node = f"b{bad_block}_attn" if bad_block is not None else None

    def op(nid: str, label: str, module: str) -> str:
        status = "fail" if nid == bad_node else "pass"
        nodes.append(_node(nid, "op", label, shape=[4, 8], dtype="float64", status=status,
                           first_bad=nid == bad_node, module=module))
        for p in module_prefixes(module):
            members.setdefault(p, []).append(nid)
        return nid

    def leaf(nid: str, name: str) -> str:
        nodes.append(_node(nid, "accumulate", name, name="AccumulateGrad", shape=[8, 8],
                           dtype="float64", variable=name, module=""))
        leaves.append({"id": nid, "name": name, "shape": [8, 8], "dtype": "float64"})
        return nid

    def edge(a: str, b: str, i: int) -> None:
        edges.append({"from": a, "to": b, "input": i})

    x = op("emb", "EmbeddingBackward0", "wte")
    edge(x, leaf("w_wte", "wte.weight"), 0)
    for i in range(blocks):
        blk = f"h.{i}"
        attn = op(f"b{i}_attn", "MmBackward0", f"{blk}.attn")
        edge(attn, x, 0)
        edge(attn, leaf(f"w{i}_attn", f"{blk}.attn.weight"), 1)
        y = attn
        for d in range(mlp_depth):
            mm = op(f"b{i}_mlp_mm{d}", "MmBackward0", f"{blk}.mlp")
            edge(mm, y, 0)
            if d == 0 or not shared_mlp_weight:
                w = leaf(f"w{i}_mlp{d}", f"{blk}.mlp.w{d}")
            edge(mm, w, 1)
            relu = op(f"b{i}_mlp_relu{d}", "ReluBackward0", f"{blk}.mlp")
            edge(relu, mm, 0)
            y = relu
        add = op(f"b{i}_add", "AddBackward0", blk)
        edge(add, x, 0)
        edge(add, y, 1)
        x = add
    head = op("head_mm", "MmBackward0", "head")
    edge(head, x, 0)
    edge(head, leaf("w_head", "head.weight"), 1)
    loss = op("loss", "NllLossBackward0", "")
    edge(loss, head, 0)

    modules = [{"path": "wte", "type": "Embedding", "parent": None, "depth": 1},
               {"path": "h", "type": "ModuleList", "parent": None, "depth": 1}]
    for i in range(blocks):
        modules += [{"path": f"h.{i}", "type": "Block", "parent": "h", "depth": 2},
                    {"path": f"h.{i}.attn", "type": "Attention", "parent": f"h.{i}",
                     "depth": 3},
                    {"path": f"h.{i}.mlp", "type": "MLP", "parent": f"h.{i}", "depth": 3}]
    modules.append({"path": "head", "type": "Linear", "parent": None, "depth": 1})
    bad_paths = set(module_prefixes(f"h.{bad_block}.attn")) if bad_node else set()
    for m in modules:
        m["nodes"] = members.get(m["path"], [])
        m["verdict"] = "bad" if m["path"] in bad_paths else "ok"
        m["first_bad"] = bad_node if m["path"] in bad_paths else None
        m["signature"] = m["type"] + (f"/{mlp_depth}" if m["type"] == "Block" else "")
    rows = [{"leaf": lf["name"], "node": lf["id"], "status": "pass"} for lf in leaves]
    return {
        "schema": "symgrad.graph/1", "source": "symgrad", "nodes": nodes, "edges": edges,
        "roots": [loss], "root_names": ["loss"], "leaves": leaves,
        "agreement": {"ok": bad_node is None, "mode": "local", "rows": rows,
                      "first_bad_node": bad_node},
        "truncated": 0, "modules": modules,
        "folds": [{"label": f"Block × {blocks}", "parent": "h",
                   "members": [f"h.{i}" for i in range(blocks)]}] if blocks > 1 else [],
        "collapsed": ["wte", "h", "head"] if collapsed else [],
    }


def module_prefixes(path: str) -> list[str]:
    """The module paths enclosing a node of `path`, outermost first: 'h.0.attn' ->
    ['h', 'h.0', 'h.0.attn'] (every prefix is a module in these payloads); '' -> []."""
    parts = path.split(".") if path else []
    return [".".join(parts[:i + 1]) for i in range(len(parts))]
