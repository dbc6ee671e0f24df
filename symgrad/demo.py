"""The main job (``make demo``): build a small model's loss, show its graph, backprop.

Later work grows this into executing the showcase notebook; for now it prints the
grad_fn chain with every node's saved operands, runs backward and prints the gradients.
"""

from __future__ import annotations

import symgrad as sg


def describe_graph(root) -> list[str]:
    """One line per node, depth-first from ``root.grad_fn``, with its saved operands."""
    lines: list[str] = []
    seen: set[int] = set()
    stack = [(root.grad_fn, 0)]
    while stack:
        node, depth = stack.pop()
        pad = "  " * depth
        if node is None:
            lines.append(f"{pad}None")
            continue
        if id(node) in seen:
            lines.append(f"{pad}{node.name()} (shared, see above)")
            continue
        seen.add(id(node))
        if node.name() == "AccumulateGrad":
            v = node.variable
            lines.append(f"{pad}AccumulateGrad -> {v.name or 'leaf'} {list(v.shape)}")
            continue
        saved = []
        for attr in sorted(a for a in dir(node) if a.startswith("_saved_")):
            value = getattr(node, attr)
            if isinstance(value, sg.Tensor):
                who = f" (is {value.name})" if value.name else ""
                saved.append(f"{attr[7:]}=Tensor{list(value.shape)}{who}")
            else:
                saved.append(f"{attr[7:]}={value!r}")
        lines.append(f"{pad}{node.name()}  saved: {', '.join(saved) or '-'}")
        for nxt, _ in reversed(node.next_functions):
            stack.append((nxt, depth + 1))
    return lines


def main() -> int:
    sg.manual_seed(0)
    x = sg.randn(4, 3)
    w = sg.randn(3, 1, requires_grad=True)
    b = sg.zeros(1, requires_grad=True)
    y = sg.tensor([[0.0], [1.0], [1.0], [0.0]])
    x.name, w.name, b.name, y.name = "x", "w", "b", "y"
    loss = ((x @ w + b).sigmoid() - y).pow(2).mean()
    print(f"loss = ((x @ w + b).sigmoid() - y).pow(2).mean() = {loss}\n")
    print("grad_fn chain (saved operands):")
    for line in describe_graph(loss):
        print("  " + line)
    loss.backward()
    print("\ngradients:")
    print(f"  w.grad = {w.grad}")
    print(f"  b.grad = {b.grad}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
