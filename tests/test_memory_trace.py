"""Memory you can watch: a bias-free MLP's bytes after construction, forward+loss, backward
and ``del``, asserted byte-exact against a formula over the layer sizes and the batch.

The formula follows what PyTorch's graph keeps alive: ``mm`` saves its input activation
(the weight's transpose is a view, no new bytes), ``relu`` saves its result (the same
storage the next ``mm`` saved), ``mse_loss`` saves the network's output and the target.
So after the forward the live bytes are the parameters, the inputs, every hidden ReLU
output, the output and the 0-dim loss. A test checks that torch's graph saves exactly
that set, so the formula is torch's, not symgrad's.
"""

from __future__ import annotations

import gc
import os

import pytest

import symgrad as sg
import symgrad.nn as nn
import symgrad.nn.functional as F

BIG = [16, 32, 1024, 65536, 1024, 32, 16]
SMALL = [16, 32, 64, 32, 16]
BATCH = 4
F32 = 4


def _cases():
    cases = [pytest.param("cpu", BIG, id="cpu-big"), pytest.param("cpu", SMALL, id="cpu-small")]
    if sg.cuda.is_available() and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
        # a real GPU; the simulator run (tests/cuda) calls check_memory_trace itself
        cases.append(pytest.param("cuda", SMALL, id="cuda-small"))
    return cases


def _mlp(lib, sizes, device=None):
    layers = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(lib.nn.Linear(a, b, bias=False, device=device))
        if i < len(sizes) - 2:
            layers.append(lib.nn.ReLU())
    return lib.nn.Sequential(*layers)


def expected_bytes(sizes, batch, itemsize=F32):
    params = sum(a * b for a, b in zip(sizes[:-1], sizes[1:], strict=True)) * itemsize
    inputs = batch * (sizes[0] + sizes[-1]) * itemsize  # x and target
    hidden = sum(batch * n for n in sizes[1:-1]) * itemsize  # ReLU results (saved)
    output = batch * sizes[-1] * itemsize  # saved by MseLossBackward0 as self
    loss = itemsize  # the 0-dim loss the user holds
    return {
        "model": params,
        "forward": params + inputs + hidden + output + loss,
        "backward": 2 * params + inputs + loss,  # graph freed; .grad for every parameter
    }


@pytest.mark.parametrize("device,sizes", _cases())
def test_memory_trace_is_byte_exact(device, sizes, no_gc):
    check_memory_trace(device, sizes)


def check_memory_trace(device, sizes):
    """The trace on ``device`` (call with the cycle collector disabled)."""
    exp = expected_bytes(sizes, BATCH)
    base = sg.memory_allocated(device)

    model = _mlp(sg, sizes, device=device)
    assert sg.memory_allocated(device) - base == exp["model"]

    x = sg.randn(BATCH, sizes[0]).to(device)
    target = sg.randn(BATCH, sizes[-1]).to(device)
    loss = F.mse_loss(model(x), target)
    assert sg.memory_allocated(device) - base == exp["forward"]

    loss.backward()
    assert sg.memory_allocated(device) - base == exp["backward"]
    assert all(p.grad is not None and p.grad.shape == p.shape for p in model.parameters())

    del model, x, target, loss
    assert sg.memory_allocated(device) == base
    assert _cyclic_symgrad_objects() == []  # nothing of ours was waiting for the collector


def _cyclic_symgrad_objects():
    """symgrad objects the cycle collector would free (numba's compiler makes its own cycles)."""
    from symgrad.autograd.node import Node
    from symgrad.memory import Storage

    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        ours = (sg.Tensor, Node, Storage, nn.Module, sg.optim.Optimizer)
        # type(o), not isinstance(o, ...): a dead weakref.proxy left in the garbage by an
        # earlier test (widgets, IPython) raises ReferenceError on isinstance
        return [type(o).__name__ for o in gc.garbage if issubclass(type(o), ours)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def _saved_storages_symgrad(loss, exclude):
    seen, stack, total = set(), [loss.grad_fn], 0
    storages = set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for attr in dir(node):
            if attr.startswith("_saved_"):
                v = getattr(node, attr)
                if isinstance(v, sg.Tensor) and id(v._storage) not in exclude \
                        and id(v._storage) not in storages:
                    storages.add(id(v._storage))
                    total += v._storage.nbytes
        stack.extend(n for n, _ in node.next_functions)
    return total


def _saved_storages_torch(torch, loss, exclude):
    seen, stack, ptrs, total = set(), [loss.grad_fn], set(), 0
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for attr in dir(node):
            if attr.startswith("_saved_"):
                v = getattr(node, attr)
                if isinstance(v, torch.Tensor):
                    ptr = v.untyped_storage().data_ptr()
                    if ptr not in exclude and ptr not in ptrs:
                        ptrs.add(ptr)
                        total += v.untyped_storage().nbytes()
        stack.extend(n for n, _ in node.next_functions)
    return total


def test_both_graphs_save_exactly_the_activations_the_formula_counts(torch):
    """Hidden ReLU outputs + the network output: the same bytes in torch's graph and ours."""
    sizes = SMALL
    want = sum(BATCH * n for n in sizes[1:]) * F32
    model = _mlp(sg, sizes)
    x, target = sg.randn(BATCH, sizes[0]), sg.randn(BATCH, sizes[-1])
    loss = F.mse_loss(model(x), target)
    exclude = {id(t._storage) for t in [x, target, *model.parameters()]}
    assert _saved_storages_symgrad(loss, exclude) == want

    tmodel = _mlp(torch, sizes)
    tx, tt = torch.randn(BATCH, sizes[0]), torch.randn(BATCH, sizes[-1])
    tloss = torch.nn.functional.mse_loss(tmodel(tx), tt)
    texclude = {t.untyped_storage().data_ptr() for t in [tx, tt, *tmodel.parameters()]}
    assert _saved_storages_torch(torch, tloss, texclude) == want


def test_the_formula_is_the_sum_of_its_parts():
    exp = expected_bytes(BIG, BATCH)
    weights = 2 * (16 * 32 + 32 * 1024 + 1024 * 65536)
    assert exp["model"] == weights * 4 == 537_137_152
    acts = BATCH * (32 + 1024 + 65536 + 1024 + 32) + BATCH * 16
    assert exp["forward"] - exp["model"] == (acts + BATCH * 32 + 1) * 4
