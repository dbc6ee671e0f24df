"""Issue 21 tensor functions and normalisation on the CUDA backend (numba's simulator in CI)
against symgrad's cpu backend: values, gradients and grad_fn names of every case of
tests/test_tensor_functions.py, and the nn functionals of tests/test_norm_layers.py."""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close, magnitude
from test_norm_layers import F_CASES
from test_split import CASES as SPLIT_CASES
from test_split import USED as SPLIT_USED
from test_tensor_functions import CASES, _input

import symgrad as sg


def _on(device, fn, arrays):
    leaves = [sg.tensor(a, device=device, requires_grad=True) for a in arrays]
    out = fn(*leaves)
    w = sg.tensor(np.random.default_rng(1).uniform(-1, 1, tuple(out.shape)), dtype=out.dtype,
                  device=device)
    grads = sg.autograd.grad((out * out * w).sum(), leaves, allow_unused=True)
    return out, grads


class _OnDevice:
    """``sg`` whose index tensors are made on ``device`` (the cases call ``L.tensor``)."""

    def __init__(self, device):
        self._device = device

    def __getattr__(self, name):
        return getattr(sg, name)

    def tensor(self, data, **kwargs):
        kwargs.setdefault("device", self._device)
        return sg.tensor(data, **kwargs)


@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_matches_cpu(name):
    shape, fn = CASES[name]
    data = _input(shape, np.float64)
    results = [_on(dev, lambda x, dev=dev: fn(_OnDevice(dev), x), [data])
               for dev in ("cpu", "cuda")]
    (out, (g,)), (c_out, (c_g,)) = results
    assert c_out.grad_fn.name() == out.grad_fn.name()
    assert c_out.device.type == "cuda"
    assert_close(c_out.cpu(), out, terms=data.size, scale=magnitude(out, data, 1.0) ** 2 + 1)
    assert_close(c_g.cpu(), g, terms=data.size ** 2, scale=magnitude(g, data, 1.0) ** 3 + 1)


@pytest.mark.parametrize("name", sorted(F_CASES))
def test_cuda_norm_functionals_match_cpu(name):
    xs, ws, bs, fn = F_CASES[name]
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s) for s in (xs, ws, bs)]
    results = [_on(dev, lambda *t, dev=dev: fn(_OnDevice(dev), *t), arrays)
               for dev in ("cpu", "cuda")]
    (out, grads), (c_out, c_grads) = results
    assert c_out.grad_fn.name() == out.grad_fn.name()
    n = int(np.prod(xs))
    assert_close(c_out.cpu(), out, terms=n, scale=magnitude(out, *arrays))
    for g, cg in zip(grads, c_grads):
        assert (g is None) == (cg is None)
        if g is not None:
            assert_close(cg.cpu(), g, terms=4 * n, scale=magnitude(g, *arrays) ** 3 + 1)


def test_cuda_embedding_and_dropout():
    w = np.random.default_rng(9).standard_normal((6, 3))
    outs = []
    for dev in ("cpu", "cuda"):
        weight = sg.tensor(w, device=dev, requires_grad=True)
        y = sg.nn.functional.embedding(sg.tensor([[1, 2, 1], [0, 5, 1]], device=dev), weight,
                                       padding_idx=2)
        (y * y).sum().backward()
        outs.append((y.cpu(), weight.grad.cpu()))
    assert_close(outs[1][0], outs[0][0], terms=1, scale=1)
    assert_close(outs[1][1], outs[0][1], terms=4, scale=magnitude(w))
    sg.manual_seed(0)
    x = sg.ones(50, 40, device="cuda", requires_grad=True)
    y = sg.nn.functional.dropout(x, 0.25)
    y.sum().backward()
    kept = (y != 0).float().mean().item()
    assert abs(kept - 0.75) < 5 * np.sqrt(0.75 * 0.25 / 2000)
    assert np.array_equal(x.grad.cpu().numpy(), y.detach().cpu().numpy())


# -- scans and sorts run on the device: bit for bit the cpu backend's, no host transfer ------

def _scan_sort_data(shape, dtype, seed=0):
    """Values with ties, -0.0 beside 0.0 and (floats) NaNs, so order and stability show."""
    rng = np.random.default_rng(seed)
    if dtype == np.bool_:
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind == "i":
        return rng.integers(-3, 4, shape).astype(dtype)
    x = np.round(rng.standard_normal(shape), 1).astype(dtype)  # rounding makes ties
    flat = x.reshape(-1)
    flat[::7] = 0.0
    flat[3::11] = -0.0
    flat[5::13] = np.nan
    return x


def _run_all(t, dim):
    out = {"cumsum": t.cumsum(dim), "cumprod": t.cumprod(dim)} if t.dtype != sg.bool else {}
    for desc in (False, True):
        s = t.sort(dim, descending=desc, stable=True)
        out[f"sort{desc}"], out[f"sort_idx{desc}"] = s.values, s.indices
        out[f"argsort{desc}"] = t.argsort(dim, descending=desc)
        k = (t.shape[dim] + 1) // 2
        top = t.topk(k, dim, largest=not desc)
        out[f"topk{desc}"], out[f"topk_idx{desc}"] = top.values, top.indices
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64, np.bool_])
@pytest.mark.parametrize(("shape", "dim"), [((4, 9), 1), ((4, 9), 0), ((2, 3, 5), 1),
                                            ((1, 33), -1), ((6, 1), 1), ((3, 0), 1)])
def test_cuda_scans_and_sorts_are_the_cpu_backends_bit_for_bit_without_host_copies(
        dtype, shape, dim):
    """Each row is scanned in order, one IEEE add or multiply at a time, as NumPy's
    accumulate does (no reassociation, no fused multiply-add: the same operations round
    the same way), and sorted stably with NaN largest: so values and indices equal the cpu
    backend's exactly, ties included. Nothing goes through the host."""
    from tests.cuda._count import Counter

    data = _scan_sort_data(shape, dtype)
    want = _run_all(sg.tensor(data), dim)
    x = sg.tensor(data, device="cuda")
    with Counter() as c:
        got = _run_all(x, dim)
    assert c.transfers == 0, c.names
    if data.size:
        assert any(n.startswith("sort_rows") for n in c.names), c.names
        if dtype != np.bool_:
            assert {"cumsum_rows_" + np.dtype(dtype).name,
                    "cumprod_rows_" + np.dtype(dtype).name} <= set(c.names), c.names
    for key, w in want.items():
        g = got[key]
        assert g.device.type == "cuda" and g.dtype == w.dtype and g.shape == w.shape, key
        np.testing.assert_array_equal(g.cpu().numpy(), w.numpy(), err_msg=key)


def test_cuda_sort_of_strided_views_and_long_rows():
    """A transposed and a broadcast view sort without a copy; a row of SORT_MAX (1024)
    elements sorts in one block's shared memory, longer rows (padded to a power of two) in
    global memory, one launch per stage: all on the device, all equal to the cpu backend."""
    from symgrad.backends.cuda import kernels as K
    from tests.cuda._count import Counter

    data = _scan_sort_data((5, 6), np.float64, seed=1)
    x = sg.tensor(data, device="cuda")
    for view, ref in ((x.t(), sg.tensor(data).t()),
                      (x[:, :1].expand(5, 4), sg.tensor(data)[:, :1].expand(5, 4))):
        with Counter() as c:
            got = view.sort(0, descending=True)
            scan = view.cumsum(0)
        assert c.transfers == 0
        want = ref.sort(0, descending=True)
        np.testing.assert_array_equal(got.values.cpu().numpy(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.cpu().numpy(), want.indices.numpy())
        np.testing.assert_array_equal(scan.cpu().numpy(), ref.cumsum(0).numpy())
    for shape, kernel in (((1, K.SORT_MAX), "sort_rows_float64"),
                          ((2, K.SORT_MAX + 1), "sort_step_float64"),
                          ((1, 1500), "sort_step_float64_desc")):
        data = np.round(np.random.default_rng(shape[1]).standard_normal(shape), 2)  # ties
        data[0, ::97] = np.nan
        desc = kernel.endswith("_desc")
        x = sg.tensor(data, device="cuda")
        with Counter() as c:
            got = x.sort(1, descending=desc, stable=True)
        assert c.transfers == 0 and kernel in c.names, (shape, c.transfers, set(c.names))
        want = sg.tensor(data).sort(1, descending=desc, stable=True)
        np.testing.assert_array_equal(got.values.cpu().numpy(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.cpu().numpy(), want.indices.numpy())


def test_cuda_sort_and_cumsum_match_torch_on_ties_and_nan(torch):
    """torch 2.13 (stable=True) is the oracle for the order of ties and NaN."""
    data = np.array([[2.0, np.nan, 1.0, 2.0, -0.0, 0.0, np.nan, 1.0]])
    x = sg.tensor(data, device="cuda")
    for desc in (False, True):
        got = x.sort(1, descending=desc, stable=True)
        want = torch.tensor(data).sort(dim=1, descending=desc, stable=True)
        np.testing.assert_array_equal(got.values.cpu().numpy(), want.values.numpy())
        np.testing.assert_array_equal(got.indices.cpu().numpy(), want.indices.numpy())
    ints = np.array([[3, -1, 4, 1, -5, 9, 2, 6]])
    np.testing.assert_array_equal(sg.tensor(ints, device="cuda").cumprod(1).cpu().numpy(),
                                  torch.tensor(ints).cumprod(1).numpy())
# -- split / chunk / unbind / tensor_split (tests/test_split.py) ------------------------------
@pytest.mark.parametrize("name", sorted(SPLIT_CASES))
def test_cuda_split_matches_cpu(name):
    """Pieces (views on the device), their shared node and the joined gradient."""
    data = _input(SPLIT_CASES[name][0], np.float64)
    results = []
    for dev in ("cpu", "cuda"):
        x = sg.tensor(data, device=dev, requires_grad=True)
        pieces = SPLIT_CASES[name][1](_OnDevice(dev), x)
        used = SPLIT_USED.get(name, range(len(pieces)))
        loss = None
        for k, p in enumerate(pieces):
            if k in used:
                term = (p * p).sum() * (k + 1)
                loss = term if loss is None else loss + term
        (g,) = sg.autograd.grad(loss, x) if loss is not None else (sg.zeros_like(x),)
        results.append((pieces, g))
    (pieces, g), (c_pieces, c_g) = results
    assert [p.grad_fn.name() for p in c_pieces] == [p.grad_fn.name() for p in pieces]
    assert [p._output_nr for p in c_pieces] == [p._output_nr for p in pieces]
    for p, cp in zip(pieces, c_pieces):
        assert cp.device.type == "cuda"
        assert_close(cp.cpu(), p, terms=1)
    assert_close(c_g.cpu(), g, terms=2, scale=magnitude(g) + 1)
