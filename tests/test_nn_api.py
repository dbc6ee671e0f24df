"""symgrad.nn's Module API against torch.nn, side by side: containers (ModuleList,
ModuleDict, ParameterList, ParameterDict, Sequential's list methods), module hooks (forward,
forward pre, full backward, full backward pre; return values replacing inputs, outputs and
gradients; handles), state_dict / load_state_dict (strict, assign, torch's messages) and
nn.utils (clip_grad_norm_, clip_grad_value_, parameters_to_vector).

Each scenario is one function of the library, run once on symgrad and once on torch; what
it returns (strings, exception texts, numbers) must agree after the library's name is
replaced by ``LIB``."""

from __future__ import annotations

import math
import warnings
from collections import OrderedDict

import numpy as np
import pytest
from _tolerance import assert_close, magnitude

import symgrad as sg


def _norm(x):
    """A result with the library's name neutralised, for comparing printed output (torch's
    classes live in ``nn.modules.container``/``linear``..., symgrad's in ``nn.modules``)."""
    if isinstance(x, str):
        for sub in (".container.", ".linear.", ".activation."):
            x = x.replace("nn.modules" + sub, "nn.modules.")
        return x.replace("torch", "LIB").replace("symgrad", "LIB")
    if isinstance(x, (list, tuple)):
        return type(x)(_norm(v) for v in x)
    if isinstance(x, dict):
        return {k: _norm(v) for k, v in x.items()}
    return x


def _raises(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (the type and text are what is compared)
        return f"{type(e).__name__}: {e}"
    return "no error"


def _both(torch, scenario):
    ours, theirs = scenario(sg), scenario(torch)
    assert _norm(ours) == _norm(theirs)
    return ours


# -- containers --------------------------------------------------------------------------------
def _containers(lib):
    nn = lib.nn
    out = []
    ml = nn.ModuleList([nn.Linear(2, 2) for _ in range(3)] + [nn.ReLU(), nn.Linear(2, 3)])
    out += [repr(ml), repr(ml[1:3]), type(ml[1:3]).__name__, repr(nn.ModuleList()),
            repr(ml[-1]), len(ml)]
    md = nn.ModuleDict({"b": nn.ReLU(), "a": nn.Linear(1, 1)})
    out += [repr(md), list(md), list(md.keys()), "a" in md, len(md)]
    md.update([("c", nn.Tanh())])
    out += [list(md), type(md.pop("b")).__name__, list(md)]
    pl = nn.ParameterList([nn.Parameter(lib.ones(2, 3)), lib.zeros(3, dtype=lib.float64)])
    out += [repr(pl), type(pl[1]).__name__, pl[1].requires_grad, repr(pl[0:1])]
    pl.append(3)
    out += [repr(pl), len(pl)]
    pd = nn.ParameterDict({"w": nn.Parameter(lib.ones(2)), "b": lib.zeros(1)})
    out += [repr(pd), list(pd.keys()), list(pd.state_dict()), "w" in pd, pd.get("zz"),
            type(pd["b"]).__name__]
    pd2 = nn.ParameterDict(OrderedDict([("z", lib.ones(1)), ("y", lib.ones(2))]))
    out += [list(pd2.keys()), list((pd | pd2).keys()), pd2.popitem()[0], list(pd2.keys())]
    out += [list(pl.state_dict()), [n for n, _ in pl.named_parameters()]]
    m = nn.Module()
    m.layers = ml
    m.heads = md
    m.ps = pl
    m.pd = pd
    out += [repr(m), [n for n, _ in m.named_parameters()], list(m.state_dict()),
            [n for n, _ in m.named_children()], [n for n, _ in m.named_modules()]]
    del ml[1]
    out += [list(ml._modules), len(ml)]
    ml.insert(1, nn.Tanh())
    out += [repr(ml), type(ml.pop(0)).__name__, len(ml), len(list(ml.parameters()))]
    out += [repr(ml + nn.ModuleList([nn.ReLU()])), [k for k in dir(ml) if k.isdigit()]]
    ml += [nn.Sigmoid()]
    out.append(len(ml))
    for bad in (lambda: ml[7], lambda: md["zz"], lambda: nn.ModuleList([1]),
                lambda: ml.extend(3), lambda: pl(1), lambda: pd(1), lambda: pd[1],
                lambda: pl.extend(lib.ones(2)), lambda: md.update(3),
                lambda: md.update([("a",)])):
        out.append(_raises(bad))
    return out


def test_containers_match_torch(torch):
    _both(torch, _containers)


def _sequential(lib):
    nn = lib.nn
    s = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Tanh())
    out = []
    del s[1]
    out.append(repr(s))
    s.insert(0, nn.Sigmoid())
    out += [repr(s), repr(s + s), repr(s * 2), repr(s[::2])]
    s[0] = nn.ReLU()
    out += [repr(s), type(s.pop(-1)).__name__, repr(s.extend([nn.Tanh()]))]
    s += nn.Sequential(nn.Sigmoid())
    out.append(repr(s))
    out += [_raises(lambda: s[9]), _raises(lambda: s + [1]), _raises(lambda: s * 0),
            _raises(lambda: s.insert(9, nn.ReLU()))]
    return out


def test_sequential_list_methods_match_torch(torch):
    _both(torch, _sequential)


def test_containers_register_for_optimizers_and_devices():
    net = sg.nn.Module()
    net.blocks = sg.nn.ModuleList([sg.nn.Linear(2, 2) for _ in range(2)])
    net.extra = sg.nn.ParameterDict({"s": sg.ones(1)})
    assert len(list(net.parameters())) == 5
    net.double()
    assert all(p.dtype is sg.float64 for p in net.parameters())
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())
    assert net.get_submodule("blocks.1") is net.blocks[1]
    assert net.get_parameter("blocks.0.bias") is net.blocks[0].bias


# -- hooks ---------------------------------------------------------------------------------
_W = np.array([[0.5, -1.0, 2.0], [1.5, 0.25, -0.5]])


def _linear(lib):
    lin = lib.nn.Linear(3, 2)
    with lib.no_grad():
        lin.weight.copy_(lib.tensor(_W, dtype=lib.float32))
        lin.bias.fill_(0.5)
    return lin


def _grads(*ts):
    return [None if t is None else t.tolist() for t in ts]


def _hooks(lib):
    """Every hook kind, chained, replacing inputs, outputs and gradients; then removed.

    The values are dyadic (small powers of two), so every result is exact in float32."""
    lin = _linear(lib)
    log = []
    out = []
    h1 = lin.register_forward_pre_hook(lambda m, a: log.append(("pre", type(m).__name__,
                                                                len(a))))
    h2 = lin.register_forward_hook(lambda m, a, o: o * 2)
    h3 = lin.register_forward_pre_hook(lambda m, a: a[0] + 1, prepend=True)
    x = lib.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    y = lin(x)
    out += [y.tolist(), y.grad_fn.name(), list(log)]
    h4 = lin.register_full_backward_hook(
        lambda m, gi, go: log.append(("bw", _grads(*gi), _grads(*go))))
    h5 = lin.register_full_backward_hook(lambda m, gi, go: tuple(g * 10 for g in gi))
    h6 = lin.register_full_backward_pre_hook(lambda m, go: (go[0] * 3,))
    y = lin(x)
    out += [y.grad_fn.name(), y.grad_fn.next_functions[0][0].name()]
    y.sum().backward()
    out += [x.grad.tolist(), lin.weight.grad.tolist(), list(log)]
    for h in (h1, h2, h3, h4, h5, h6):
        h.remove()
    h6.remove()  # twice is harmless
    x.grad = None
    lin.zero_grad()
    log.clear()
    y = lin(x)
    y.sum().backward()
    out += [y.grad_fn.name(), x.grad.tolist(), log]
    return out


def test_hooks_replace_inputs_outputs_and_gradients_as_torch(torch):
    _both(torch, _hooks)


def _kwarg_hooks(lib):
    nn = lib.nn

    class M(nn.Module):
        def forward(self, a, scale=1.0):
            return a * scale

    out = []
    m = M()
    m.register_forward_pre_hook(lambda mod, args, kw: (args, {"scale": 5.0}), with_kwargs=True)
    m.register_forward_hook(lambda mod, args, kw, o: o + kw["scale"], with_kwargs=True)
    out.append(m(lib.ones(2)).tolist())
    log = []
    m2 = M()
    m2.register_forward_hook(lambda mod, a, o: log.append(("always", o)), always_call=True)
    m2.register_forward_hook(lambda mod, a, o: log.append("not always"))
    out += [_raises(lambda: m2(lib.ones(2), scale="x")).split(":")[0], log]
    m3 = M()
    m3.register_forward_pre_hook(lambda mod, a, k: 5, with_kwargs=True)
    out.append(_raises(lambda: m3(lib.ones(2))))
    with m3.register_forward_hook(lambda *a: None) as h:
        out += [type(h).__name__, len(m3._forward_hooks)]
    out.append(len(m3._forward_hooks))
    return out


def test_hooks_with_kwargs_always_call_and_handles_as_torch(torch):
    _both(torch, _kwarg_hooks)


def _backward_hook_edges(lib):
    """grad_input has one entry per positional argument: None for non-tensors, zeros for
    tensors that need no grad; a hook with no input requiring grad warns and gets Nones."""
    nn = lib.nn
    log = []

    class Two(nn.Module):
        def forward(self, a, k, b):
            return a * b * k

    t = Two()
    t.register_full_backward_hook(lambda m, gi, go: log.append(_grads(*gi)))
    a = lib.ones(2, requires_grad=True)
    t(a, 3.0, lib.ones(2)).sum().backward()
    t2 = Two()
    t2.register_full_backward_hook(lambda m, gi, go: (gi[0],))
    wrong = _raises(lambda: t2(a, 3.0, lib.ones(2)).sum().backward())
    lin = _linear(lib)
    lin.register_full_backward_hook(lambda m, gi, go: log.append(("nograd", gi)))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        lin(lib.ones(1, 3)).sum().backward()
    lin2 = _linear(lib)
    lin2.register_full_backward_hook(lambda m, gi, go: (lib.ones(1, 3),))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bad_return = _raises(lambda: lin2(lib.ones(1, 3)).sum().backward())
    return [log, wrong, [str(x.message)[:60] for x in w], bad_return]


def test_full_backward_hook_edge_cases_match_torch(torch):
    _both(torch, _backward_hook_edges)


def test_backward_hook_sees_the_gradient_of_a_float_mlp_as_torch(torch, rng):
    """A hook on the middle layer of an MLP receives torch's grad_input/grad_output."""
    x = rng.standard_normal((4, 3))
    seen = {}
    for lib in (sg, torch):
        lib.manual_seed(0)
        net = lib.nn.Sequential(lib.nn.Linear(3, 5), lib.nn.Tanh(), lib.nn.Linear(5, 2))
        if lib is torch:
            for p, q in zip(net.parameters(), seen[sg]["params"], strict=True):
                with torch.no_grad():
                    p.copy_(torch.tensor(q))
        got = {"params": [p.detach().numpy().copy() for p in net.parameters()]}
        net[1].register_full_backward_hook(
            lambda m, gi, go, got=got: got.update(gi=gi[0].numpy().copy(),
                                                  go=go[0].numpy().copy()))
        net(lib.tensor(x, dtype=lib.float32, requires_grad=True)).sum().backward()
        seen[lib] = got
    # go = W2^T summed over 2 outputs; gi = go * (1 - tanh^2): a handful of roundings each
    assert_close(seen[sg]["go"], seen[torch]["go"], terms=2, scale=magnitude(seen[torch]["go"]))
    assert_close(seen[sg]["gi"], seen[torch]["gi"], terms=3 + 2 * 3,
                 scale=magnitude(seen[torch]["go"]))


def test_register_backward_hook_is_refused_with_a_pointer():
    with pytest.raises(NotImplementedError, match="register_full_backward_hook"):
        sg.nn.Linear(1, 1).register_backward_hook(lambda *a: None)


def test_hooked_module_pickles_and_deepcopies_without_hooks_lost():
    import copy

    lin = sg.nn.Linear(2, 2)
    seen = []
    lin.register_forward_hook(lambda m, a, o: seen.append(1))
    clone = copy.deepcopy(lin)
    clone(sg.ones(1, 2))
    assert seen == [1]


# -- state dicts -----------------------------------------------------------------------------
def _state_dicts(lib):
    nn = lib.nn
    lin = nn.Linear(2, 3)
    out = []
    for sd, strict in [({"weight": lib.ones(3, 3), "foo": lib.ones(1)}, True),
                       ({"weight": lib.ones(3, 3), "bias": lib.ones(3), "foo": lib.ones(1)},
                        False),
                       ({"weight": lib.ones(3, 2)}, True),
                       ({"weight": 3, "bias": lib.ones(3)}, True),
                       ({"weight": lib.ones(3, 2), "bias": lib.ones(3), "a": 1, "b": 2}, True),
                       ({}, True)]:
        out.append(_raises(lambda sd=sd, strict=strict: lin.load_state_dict(sd, strict)))
    out.append(repr(lin.load_state_dict({"weight": lib.ones(3, 2)}, strict=False)))
    out.append(repr(lin.load_state_dict({"weight": lib.ones(3, 2), "bias": lib.ones(3)})))
    out.append(_raises(lambda: lin.load_state_dict([1])))
    seq = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Sequential(nn.Linear(2, 1)))
    bad = {"0.foo": lib.ones(1), "bar": lib.ones(1), "2.0.weight": lib.ones(1, 2),
           "2.0.bias": lib.ones(1)}
    out += [_raises(lambda: seq.load_state_dict(bad)),
            repr(seq.load_state_dict(bad, strict=False)),
            list(seq.state_dict()), type(seq.state_dict()).__name__]
    res = seq.load_state_dict({"0.weight": lib.ones(2, 2)}, strict=False)
    out += [res.missing_keys, res.unexpected_keys, list(res), seq[0].weight.tolist()]
    # a 0-d parameter accepts a 1-element checkpoint (torch's compatibility rule)
    m = nn.Module()
    m.s = nn.Parameter(lib.tensor(1.0))
    out += [repr(m.load_state_dict({"s": lib.tensor([4.0])})), m.s.item()]
    return out


def test_state_dict_errors_and_incompatible_keys_match_torch(torch):
    _both(torch, _state_dicts)


def test_load_state_dict_assign_adopts_the_tensors(torch):
    for lib in (sg, torch):
        lin = lib.nn.Linear(2, 2)
        w = lib.ones(2, 2, dtype=lib.float64)
        lin.load_state_dict({"weight": w, "bias": lib.zeros(2)}, assign=True)
        assert isinstance(lin.weight, lib.nn.Parameter) and lin.weight.requires_grad
        assert lin.weight.dtype == lib.float64  # adopted, not copied into float32
        assert [n for n, _ in lin.named_parameters()] == ["weight", "bias"]


def test_buffers_and_non_persistent_buffers_in_state_dicts(torch):
    def run(lib):
        m = lib.nn.Module()
        m.register_buffer("keep", lib.ones(2))
        m.register_buffer("drop", lib.ones(2), persistent=False)
        m.lin = lib.nn.Linear(1, 1)
        keys = list(m.state_dict())
        err = _raises(lambda: m.load_state_dict({"keep": lib.zeros(3)}, strict=False))
        m.load_state_dict({"keep": lib.zeros(2)}, strict=False)
        return [keys, err, m.keep.tolist()]

    _both(torch, run)


# -- gradient clipping -------------------------------------------------------------------------
def _grad_params(lib, seed, dtype):
    r = np.random.default_rng(seed)
    ps = [lib.tensor(r.standard_normal(s), dtype=dtype, requires_grad=True)
          for s in [(3, 4), (4,), (2, 2)]]
    for p in ps:
        p.grad = lib.tensor(r.standard_normal(tuple(p.shape)) * 3, dtype=dtype)
    return ps


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("norm_type", [2.0, 1, 3, math.inf, -math.inf, 0, 0.5])
@pytest.mark.parametrize("max_norm", [1.5, 1e4])
def test_clip_grad_norm_matches_torch(torch, dtype, norm_type, max_norm):
    res = {}
    for lib in (sg, torch):
        ps = _grad_params(lib, 0, getattr(lib, dtype))
        total = lib.nn.utils.clip_grad_norm_(ps, max_norm, norm_type=norm_type, foreach=True)
        assert isinstance(total, lib.Tensor) and total.ndim == 0 and not total.requires_grad
        assert total.dtype == getattr(lib, dtype)
        res[lib] = total, [p.grad for p in ps]
    (t, gs), (tt, tgs) = res[sg], res[torch]
    n = sum(g.numel() for g in gs)
    # a p-norm sums n |g|^p terms, then a root: p-power/root roundings scale with p
    terms = n + 8 * (1 + abs(norm_type) if math.isfinite(norm_type) else 1)
    assert_close(t, tt, terms=terms)
    for g, tg in zip(gs, tgs, strict=True):
        # each gradient is scaled once by max_norm / (total + 1e-6), itself off by `terms`
        assert_close(g, tg, terms=terms + 3, scale=magnitude(tg))


def test_clip_grad_norm_special_cases_match_torch(torch):
    def run(lib):
        out = []
        out.append(repr(lib.nn.utils.clip_grad_norm_([], 1.0)))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out.append(repr(lib.nn.utils.clip_grad_norm_((p for p in []), 1.0)))
        out.append([str(x.message) for x in w])
        p = lib.tensor([1.0], requires_grad=True)
        out.append(repr(lib.nn.utils.clip_grad_norm_(p, 1.0)))  # no grad: tensor(0.)
        p.grad = lib.tensor([float("inf")])
        out.append(_raises(lambda: lib.nn.utils.clip_grad_norm_(p, 1.0,
                                                                error_if_nonfinite=True)))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            out.append(repr(lib.nn.utils.clip_grad_norm_(p, 1.0)))
        out.append(repr(p.grad))
        q = lib.tensor([3.0, -4.0], requires_grad=True)
        q.grad = lib.tensor([3.0, -4.0])
        out.append(repr(lib.nn.utils.clip_grad_norm_([q], 10.0)))
        out.append(q.grad.tolist())  # 10 / (5 + 1e-6) > 1: clamped to 1, unchanged
        return out

    _both(torch, run)


def test_clip_grad_value_matches_torch(torch):
    res = {}
    for lib in (sg, torch):
        ps = _grad_params(lib, 1, lib.float32)
        v = ps[0].grad._version
        assert lib.nn.utils.clip_grad_value_(ps, 0.5) is None
        assert ps[0].grad._version > v
        res[lib] = [p.grad.numpy() for p in ps]
    for a, b in zip(res[sg], res[torch], strict=True):
        np.testing.assert_array_equal(a, b)  # clamping is exact


def test_parameters_to_vector_round_trip(torch):
    def run(lib):
        lin = lib.nn.Linear(2, 2)
        v = lib.nn.utils.parameters_to_vector(lin.parameters())
        lib.nn.utils.vector_to_parameters(lib.arange(6, dtype=lib.float32), lin.parameters())
        return [list(v.shape), v.grad_fn.name(), lin.weight.tolist(), lin.bias.tolist(),
                _raises(lambda: lib.nn.utils.vector_to_parameters([1], lin.parameters()))]

    _both(torch, run)
