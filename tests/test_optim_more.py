"""symgrad.optim against torch.optim for Adadelta, Adamax, NAdam, RAdam, ASGD, Rprop,
Adafactor and LBFGS.

The first-order optimizers: 20 steps from identical weights and data give the same
parameters *and* optimizer state in float64 and float32 (within the rounding bound of 20
steps), per-group hyperparameters and frozen parameters included; defaults, reprs, state
dict layout, resuming from a checkpoint and argument errors are torch's.

LBFGS: on an extended Rosenbrock function, with and without the strong-Wolfe line search,
each ``.step(closure)`` returns torch's loss and leaves torch's parameters, with the same
number of closure evaluations and iterations and the same state layout.
"""

from __future__ import annotations

import numpy as np
import pytest
from _tolerance import assert_close

import symgrad as sg

SIZES = [4, 6, 3]
BATCH = 8
# Roundings one step can put into a first-layer weight or a state buffer: the forward (mm
# over fan_in, bias, tanh), the loss gradient, the backward (mm over fan_out, tanh'), the
# weight's mm over the batch, and the longest update (NAdam with L2 decay: decay (2), lerp
# (3), square average (3), bias correction, sqrt, eps, two addcdivs (3 each): 16).
STEP_TERMS = sum(SIZES[:-1]) + 4 * (len(SIZES) - 1) + 2 + sum(SIZES[2:]) + 3 + BATCH + 16
# Adafactor also takes two 2-norms over the largest parameter (its RMS and the update's),
# sums of squares along a row and a column, and the mean of the row factors
EXTRA_TERMS = {"Adafactor": 2 * SIZES[0] * SIZES[1] + 2 * max(SIZES) + max(SIZES)}
STEPS = 20
DTYPES = ["float64", "float32"]


def _model(lib, dtype):
    dt = getattr(lib, dtype)
    return lib.nn.Sequential(lib.nn.Linear(SIZES[0], SIZES[1], dtype=dt), lib.nn.Tanh(),
                             lib.nn.Linear(SIZES[1], SIZES[2], dtype=dt))


def _twins(torch, dtype):
    sg.manual_seed(5)
    ours, theirs = _model(sg, dtype), _model(torch, dtype)
    with torch.no_grad():
        for p, tp in zip(ours.parameters(), theirs.parameters(), strict=True):
            tp.copy_(torch.from_numpy(p.detach().numpy().copy()))
    return ours, theirs


def _data(lib, dtype):
    r = np.random.default_rng(21)
    dt = getattr(lib, dtype)
    return lib.tensor(r.standard_normal((BATCH, SIZES[0])), dtype=dt), \
        lib.tensor(r.standard_normal((BATCH, SIZES[-1])), dtype=dt)


def _groups(model, split):
    ps = list(model.parameters())
    if split is None:
        return ps
    return [{"params": ps[:2]}, {"params": ps[2:], **split}]


def _train(lib, model, opt, dtype, steps=STEPS, freeze_last=False):
    x, y = _data(lib, dtype)
    for _ in range(steps):
        opt.zero_grad()
        loss = lib.nn.functional.mse_loss(model(x), y)
        loss.backward()
        if freeze_last:  # a parameter without a gradient is skipped, its state untouched
            list(model.parameters())[-1].grad = None
        opt.step()


def _step_terms(opt) -> int:
    return STEP_TERMS + EXTRA_TERMS.get(type(opt).__name__, 0)


def _compare(ours, theirs, opt, topt, steps=STEPS):
    terms = steps * _step_terms(opt)
    for p, tp in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert p.dtype.name == str(tp.dtype).removeprefix("torch.")
        assert_close(p, tp, terms=terms)
    sd, tsd = opt.state_dict(), topt.state_dict()
    assert sorted(sd["state"]) == sorted(tsd["state"])
    for i, tst in tsd["state"].items():
        st = sd["state"][i]
        assert list(st) == list(tst), i  # the same buffers, in torch's order
        for k, tv in tst.items():
            v = st[k]
            if tv.ndim == 0:  # step, and NAdam's mu_product, ASGD's eta and mu: float32
                # (float64 after loading into float64 parameters, as torch casts them)
                assert v.ndim == 0 and v.dtype.name == str(tv.dtype).removeprefix("torch."), k
                # computed by the same scalar operations from the same inputs: exact
                assert float(v) == float(tv), (k, float(v), float(tv))
            else:
                assert_close(v, tv, terms=terms, msg=f"state[{i}][{k!r}]")
    strip = ("params",)
    assert [{k: v for k, v in g.items() if k not in strip} for g in sd["param_groups"]] == \
        [{k: v for k, v in g.items() if k not in strip} for g in tsd["param_groups"]]
    assert [g["params"] for g in sd["param_groups"]] == \
        [g["params"] for g in tsd["param_groups"]]


CASES = {
    "Adadelta": [dict(), dict(lr=0.5, rho=0.8, eps=1e-5), dict(lr=2.0, weight_decay=0.1),
                 dict(maximize=True, rho=0.95)],
    "Adamax": [dict(), dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6),
               dict(lr=0.02, weight_decay=0.1),
               dict(lr=0.01, betas=(0.3, 0.9), maximize=True)],
    "NAdam": [dict(), dict(lr=0.01, betas=(0.8, 0.99), momentum_decay=0.02),
              dict(lr=0.01, weight_decay=0.1),
              dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
              dict(lr=0.005, maximize=True, eps=1e-6)],
    "RAdam": [dict(), dict(lr=0.01, betas=(0.6, 0.5)),  # rho_t > 5 from the first step
              dict(lr=0.01, weight_decay=0.1),
              dict(lr=0.01, weight_decay=0.1, decoupled_weight_decay=True),
              dict(lr=0.005, betas=(0.9, 0.9), maximize=True)],  # rectified from step 6
    "Rprop": [dict(), dict(lr=0.05, etas=(0.3, 1.5)), dict(lr=0.01, step_sizes=(1e-3, 0.02)),
              dict(lr=0.02, maximize=True)],
    # (lr=0.05 with beta2_decay=-0.5 oscillates here: differences grow fourfold per step)
    "Adafactor": [dict(), dict(lr=0.01, beta2_decay=-0.6, d=2.0),
                  dict(lr=0.02, eps=(1e-20, 1e-2), weight_decay=0.1),
                  dict(lr=0.01, maximize=True)],
    "ASGD": [dict(), dict(lr=0.05, lambd=0.01, alpha=0.5),
             dict(lr=0.05, t0=5, weight_decay=0.1),  # averaging starts after t0 steps
             dict(lr=0.02, t0=0, maximize=True)],
}
PARAMS = [(name, i) for name, cases in CASES.items() for i in range(len(cases))]
SPLITS = {"Adadelta": {"lr": 0.5, "rho": 0.7}, "Adamax": {"lr": 0.03, "weight_decay": 0.0},
          "NAdam": {"lr": 0.02, "momentum_decay": 0.01},
          "RAdam": {"lr": 0.02, "betas": (0.5, 0.6)}, "ASGD": {"lr": 0.1, "t0": 3},
          "Rprop": {"lr": 0.001, "etas": (0.4, 1.1)},
          "Adafactor": {"lr": 0.03, "beta2_decay": -0.6}}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name,i", PARAMS)
def test_20_steps_match_torch_in_parameters_and_state(name, i, dtype, torch):
    ours, theirs = _twins(torch, dtype)
    kw = CASES[name][i]
    opt = getattr(sg.optim, name)(ours.parameters(), **kw)
    topt = getattr(torch.optim, name)(theirs.parameters(), **kw)
    start = [p.detach().numpy().copy() for p in ours.parameters()]
    for step in range(1, STEPS + 1):  # the same batch each step, as _train(steps=20)
        _train(sg, ours, opt, dtype, steps=1)
        _train(torch, theirs, topt, dtype, steps=1)
        for p, tp in zip(ours.parameters(), theirs.parameters(), strict=True):
            assert_close(p, tp, terms=step * _step_terms(opt), msg=f"step {step}")
    _compare(ours, theirs, opt, topt)
    with pytest.raises(AssertionError, match="not close"):  # the weights did move
        assert_close(ours[0].weight, start[0], terms=STEPS * _step_terms(opt))


@pytest.mark.parametrize("name", sorted(SPLITS))
def test_param_groups_with_own_hyperparameters_and_frozen_params_match_torch(
        name, torch, cpu_backend):
    ours, theirs = _twins(torch, "float64")
    kw = CASES[name][-1]
    opt = getattr(sg.optim, name)(_groups(ours, SPLITS[name]), **kw)
    topt = getattr(torch.optim, name)(_groups(theirs, SPLITS[name]), **kw)
    _train(sg, ours, opt, "float64", freeze_last=True)
    _train(torch, theirs, topt, "float64", freeze_last=True)
    _compare(ours, theirs, opt, topt)
    assert list(ours.parameters())[-1] not in opt.state  # never had a gradient


@pytest.mark.parametrize("name", sorted(CASES) + ["LBFGS"])
def test_defaults_and_repr_match_torch(name, torch):
    p, tp = sg.nn.Parameter(sg.ones(2)), torch.nn.Parameter(torch.ones(2))
    opt, topt = getattr(sg.optim, name)([p]), getattr(torch.optim, name)([tp])
    assert opt.defaults == topt.defaults
    assert repr(opt) == repr(topt)
    assert opt.param_groups[0].keys() == topt.param_groups[0].keys()
    assert opt.state_dict() == {"state": {}, "param_groups": topt.state_dict()["param_groups"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_state_dict_resumes_training_as_torch(name, torch, tmp_path):
    """Train 5 steps, checkpoint, train 5 more; a fresh optimizer loaded from the checkpoint
    (another learning rate given) continues as torch's loaded one does. Loading casts every
    state tensor but ``step`` to the parameter's dtype, as torch does: NAdam's
    ``mu_product`` and ASGD's ``eta`` and ``mu`` go on in float64, so those two resume
    within float32 rounding of the uninterrupted run, the others bit for bit."""
    kw = CASES[name][1]
    models = dict(zip((sg, torch), _twins(torch, "float64"), strict=True))
    out = {}
    for lib, model in models.items():
        opt = getattr(lib.optim, name)(model.parameters(), **kw)
        _train(lib, model, opt, "float64", steps=5)
        lib.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ckpt")
        _train(lib, model, opt, "float64", steps=5)
        ckpt = lib.load(tmp_path / "ckpt")
        resumed = _model(lib, "float64")
        resumed.load_state_dict(ckpt["model"])
        opt2 = getattr(lib.optim, name)(resumed.parameters(), lr=0.5)
        opt2.load_state_dict(ckpt["opt"])
        assert opt2.param_groups[0]["lr"] == kw.get("lr", opt.defaults["lr"])
        loaded = {k: (v.dtype, v.ndim) for k, v in next(iter(opt2.state.values())).items()}
        _train(lib, resumed, opt2, "float64", steps=5)
        out[lib] = model, opt, resumed, opt2, loaded
    ours, theirs = out[sg], out[torch]
    assert {k: (str(d).rsplit(".", 1)[-1], n) for k, (d, n) in ours[4].items()} == \
        {k: (str(d).rsplit(".", 1)[-1], n) for k, (d, n) in theirs[4].items()}
    _compare(ours[2], theirs[2], ours[3], theirs[3], steps=10)
    for a, b in zip(ours[2].parameters(), ours[0].parameters(), strict=True):
        if name in ("NAdam", "ASGD"):  # five steps scaled by float32- vs float64-kept values
            assert_close(a, b, terms=5, dtype=np.float32)
        else:
            np.testing.assert_array_equal(a.detach().numpy(), b.detach().numpy())


ARG_ERRORS = [
    ("Adadelta", dict(lr=-1)), ("Adadelta", dict(rho=1.5)), ("Adadelta", dict(rho=-0.1)),
    ("Adadelta", dict(eps=-1e-6)), ("Adadelta", dict(weight_decay=-1)),
    ("Adamax", dict(lr=-1)), ("Adamax", dict(eps=-1.0)), ("Adamax", dict(betas=(1.0, 0.9))),
    ("Adamax", dict(betas=(0.9, -0.5))), ("Adamax", dict(weight_decay=-0.5)),
    ("NAdam", dict(lr=-1)), ("NAdam", dict(eps=-1.0)), ("NAdam", dict(betas=(-0.1, 0.9))),
    ("NAdam", dict(betas=(0.9, 1.0))), ("NAdam", dict(weight_decay=-1)),
    ("NAdam", dict(momentum_decay=-0.004)),
    ("RAdam", dict(lr=-1)), ("RAdam", dict(eps=-1.0)), ("RAdam", dict(betas=(1.5, 0.9))),
    ("RAdam", dict(betas=(0.9, 1.0))), ("RAdam", dict(weight_decay=-1)),
    ("ASGD", dict(lr=-1)), ("ASGD", dict(weight_decay=-0.1)),
    ("Rprop", dict(lr=-1)), ("Rprop", dict(etas=(1.0, 1.2))), ("Rprop", dict(etas=(0.5, 1.0))),
    ("Rprop", dict(etas=(0.0, 1.2))),
    ("Adafactor", dict(lr=-1)), ("Adafactor", dict(beta2_decay=0.5)),
    ("Adafactor", dict(eps=(-1e-30, 1e-3))), ("Adafactor", dict(eps=(None, -1e-3))),
    ("Adafactor", dict(d=0.5)), ("Adafactor", dict(weight_decay=-0.1)),
    ("LBFGS", dict(lr=-1)),
]


@pytest.mark.parametrize("name", sorted(CASES) + ["Adam", "AdamW", "RMSprop", "Adagrad"])
def test_scalar_state_is_float64_under_a_float64_default_dtype_as_torchs(name, torch):
    """torch's ``_get_scalar_dtype``: ``step`` (and NAdam's ``mu_product``, ASGD's ``eta``
    and ``mu``, which then are not rounded to float32) follow a float64 default dtype."""
    states = {}
    for lib in (sg, torch):
        before = lib.get_default_dtype()
        lib.set_default_dtype(lib.float64)
        try:
            w = lib.nn.Parameter(lib.tensor([0.3, -1.7, 2.9]))
            opt = getattr(lib.optim, name)([w], lr=0.1)
            for _ in range(3):
                opt.zero_grad()
                (lib.sin(w * 3.1) * w).sum().backward()
                opt.step()
        finally:
            lib.set_default_dtype(before)
        states[lib] = {k: (str(v.dtype).rsplit(".", 1)[-1], v.item()) for k, v in
                       opt.state[w].items() if v.ndim == 0}
    assert states[sg] == states[torch]
    assert {d for d, _ in states[sg].values()} == {"float64"}


@pytest.mark.parametrize("name", ["Adamax", "NAdam", "RAdam"])
def test_lerp_with_a_weight_of_one_gives_the_gradient_exactly_as_torch(name, torch):
    """beta1 = 0: ``exp_avg.lerp_(grad, 1)`` is torch's second formula, ``end - (end -
    start) * 0``, which is ``grad`` exactly; the first formula would round."""
    for lib in (sg, torch):
        w = lib.nn.Parameter(lib.tensor([0.3, -1.7, 2.9], dtype=lib.float64))
        opt = getattr(lib.optim, name)([w], lr=0.1, betas=(0.0, 0.9))
        for _ in range(4):
            opt.zero_grad()
            (lib.sin(w * 3.1) * w).sum().backward()
            opt.step()
            assert opt.state[w]["exp_avg"].tolist() == w.grad.tolist()


@pytest.mark.parametrize("i", range(len(ARG_ERRORS)))
def test_argument_errors_match_torch(i, torch):
    name, kw = ARG_ERRORS[i]
    msgs = []
    for lib in (sg, torch):
        with pytest.raises(ValueError) as err:
            getattr(lib.optim, name)([lib.nn.Parameter(lib.ones(2))], **kw)
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1]


@pytest.mark.parametrize("name", sorted(CASES) + ["LBFGS"])
def test_tensor_lr_of_several_elements_is_refused_as_torch(name, torch):
    msgs = []
    for lib in (sg, torch):
        with pytest.raises(ValueError) as err:
            getattr(lib.optim, name)([lib.nn.Parameter(lib.ones(2))], lr=lib.ones(2))
        msgs.append(str(err.value))
    assert msgs[0] == msgs[1] == "Tensor lr must be 1-element"


@pytest.mark.parametrize("name", sorted(CASES) + ["LBFGS"])
def test_a_tensor_lr_computes_in_its_dtype_as_torchs(name, torch):
    """torch keeps a tensor lr a (float32) 0-dim tensor, so Adamax's ``lr / (1 - b1^t)``,
    NAdam's step factors and ASGD's ``eta`` are float32 arithmetic: float64 parameters still
    match torch's within float64 rounding."""
    out = []
    for lib in (sg, torch):
        w = lib.nn.Parameter(lib.tensor([0.3, -1.7, 2.9], dtype=lib.float64))
        kw = {"LBFGS": {"max_iter": 3}, "Rprop": {}}.get(name, {"weight_decay": 0.1})
        opt = getattr(lib.optim, name)([w], lr=lib.tensor(0.05), **kw)

        def closure(w=w, opt=opt, lib=lib):
            opt.zero_grad()
            loss = (lib.sin(w * 3.1) * w).sum()
            loss.backward()
            return loss

        for _ in range(3):
            opt.step(closure)
        out.append(w.detach().numpy().copy())
    # three steps of the longest update with the sine's forward and backward (a dozen)
    assert_close(out[0], out[1], terms=3 * (16 + 12) * (3 if name == "LBFGS" else 1))


def test_lbfgs_refuses_param_groups_and_unknown_line_searches_as_torch(torch):
    msgs = []
    for lib in (sg, torch):
        a, b = lib.nn.Parameter(lib.ones(2)), lib.nn.Parameter(lib.ones(1))
        with pytest.raises(ValueError) as err:
            lib.optim.LBFGS([{"params": [a]}, {"params": [b]}])
        msgs.append(str(err.value))
        opt = lib.optim.LBFGS([a], line_search_fn="backtracking")

        def closure(a=a, opt=opt):
            opt.zero_grad()
            loss = (a * a).sum()
            loss.backward()
            return loss

        with pytest.raises(RuntimeError) as err:
            opt.step(closure)
        msgs.append(str(err.value))
    assert msgs[:2] == msgs[2:]


@pytest.mark.parametrize("name", sorted(CASES))
def test_steps_bump_version_counters_and_differentiable_is_refused(name):
    w = sg.nn.Parameter(sg.tensor([1.0, 2.0]))
    opt = getattr(sg.optim, name)([w], lr=0.1)
    (w * w).sum().backward()
    stale = (w * w).sum()
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        stale.backward()
    if name != "Adafactor":  # torch's Adafactor has no differentiable switch
        with pytest.raises(NotImplementedError, match="differentiable=True"):
            getattr(sg.optim, name)([w], differentiable=True)


# -- LBFGS -----------------------------------------------------------------------------------

X0, Y0 = [-1.5, 0.5, 1.2], [2.0, -0.3, 0.8]
N = len(X0) + len(Y0)
B = 100.0
HISTORY = 3
# Roundings in one ``.step()`` of up to MAX_ITER iterations: per iteration the two-loop
# recursion (per stored pair two dots of length N and two axpys: 2 N + 2), the direction's
# dot with the gradient (N), and per closure evaluation the loss and its gradient (Rosenbrock:
# 7 operations per pair and the sum over the pairs, N) and the parameter update; the
# strong-Wolfe search evaluates the closure up to ``max_eval`` times (cubic steps: ~10).
MAX_ITER = 4
MAX_EVAL = MAX_ITER * 5 // 4
ONE_STEP_TERMS = MAX_ITER * (HISTORY * (2 * N + 2) + N) + MAX_EVAL * (7 + N + 1 + 10)


def _rosenbrock(ps):
    x, y = ps
    return ((1 - x) ** 2).sum() + B * ((y - x ** 2) ** 2).sum()


def _as_symgrad(v, torch):
    if isinstance(v, torch.Tensor):
        return sg.tensor(v.detach().numpy().copy())
    if isinstance(v, list):
        return [_as_symgrad(u, torch) for u in v]
    return v


def _lbfgs_twins(torch, dtype, **kw):
    out = {}
    for lib in (sg, torch):
        dt = getattr(lib, dtype)
        ps = [lib.nn.Parameter(lib.tensor(X0, dtype=dt)),
              lib.nn.Parameter(lib.tensor(Y0, dtype=dt))]
        opt = lib.optim.LBFGS(ps, max_iter=MAX_ITER, history_size=HISTORY, **kw)

        def closure(ps=ps, opt=opt):
            opt.zero_grad()
            loss = _rosenbrock(ps)
            loss.backward()
            return loss

        out[lib] = ps, opt, closure
    return out


def _flat(ps):
    return np.concatenate([p.detach().numpy().ravel() for p in ps])


def _state_layout(state, tensor_type):
    """Each state entry's kind: tensors by (shape, dtype name), lists by their items."""
    def kind(v):
        if isinstance(v, tensor_type):
            return ("tensor", tuple(v.shape), str(v.dtype).rsplit(".", 1)[-1])
        if isinstance(v, list):
            return [kind(u) for u in v]
        return type(v).__name__

    return {k: kind(v) for k, v in state.items()}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("line_search", [None, "strong_wolfe"])
def test_lbfgs_steps_match_torch_on_rosenbrock(line_search, dtype, torch):
    """Eight ``.step()`` calls of 4 iterations each (the history of 3 pairs fills and shifts).
    Each step starts from the same parameters and state on both sides (torch's, loaded into
    ours with ``load_state_dict``), so a step is compared against one step's rounding bound,
    not against the growth of 1-ulp differences along Rosenbrock's curved valley over many
    L-BFGS iterations; the counters and the state's layout must agree exactly."""
    # a fixed step of 0.2 or more overshoots out of the valley (the loss jumps to 1e5 at the
    # 8th step), where a 1-ulp difference in the direction comes out a thousandfold
    lr = 1 if line_search else 0.1
    twins = _lbfgs_twins(torch, dtype, lr=lr, line_search_fn=line_search)
    (ps, opt, closure), (tps, topt, tclosure) = twins[sg], twins[torch]
    start_loss = None
    for step in range(8):
        loss, tloss = opt.step(closure), topt.step(tclosure)
        assert isinstance(loss, sg.Tensor) and loss.dtype.name == dtype
        assert_close(loss, tloss.detach(), terms=N + 7)  # the same parameters: one evaluation
        start_loss = start_loss or tloss.item()
        assert_close(_flat(ps), _flat(tps), terms=ONE_STEP_TERMS, msg=f"step {step}")
        # the loss where the step left the parameters, bounded through their difference:
        # sum |df/dp_i| |p_i| is the loss's sensitivity to relative changes of the p_i
        new, tnew = closure(), tclosure()
        sens = float(np.abs(_flat([p.grad for p in tps]) * _flat(tps)).sum())
        assert_close(new, tnew.detach(), terms=ONE_STEP_TERMS + N + 7,
                     scale=sens + abs(tnew.item()), msg=f"loss after step {step}")
        st, tst = opt.state[ps[0]], topt.state[tps[0]]
        assert (st["func_evals"], st["n_iter"]) == (tst["func_evals"], tst["n_iter"])
        assert list(st) == list(tst)
        assert _state_layout(st, sg.Tensor) == _state_layout(tst, torch.Tensor)
        # both continue from torch's parameters and state
        with sg.no_grad():
            for p, tp in zip(ps, tps, strict=True):
                p.copy_(sg.tensor(tp.detach().numpy().copy()))
        tsd = topt.state_dict()
        opt.load_state_dict({"state": {i: {k: _as_symgrad(v, torch) for k, v in s.items()}
                                       for i, s in tsd["state"].items()},
                             "param_groups": tsd["param_groups"]})
    assert tloss.item() < start_loss / 10  # it made progress down the valley
    assert len(tst["old_dirs"]) == HISTORY and tst["n_iter"] > HISTORY + 1  # it shifted


def test_lbfgs_converges_to_rosenbrocks_minimum_as_torch(torch):
    """Free-running, with torch's default 20 iterations per step and the line search: both
    reach the minimiser (1, ..., 1) within the tolerance L-BFGS was asked for."""
    found = {}
    for lib in (sg, torch):
        ps = [lib.nn.Parameter(lib.tensor(X0, dtype=lib.float64)),
              lib.nn.Parameter(lib.tensor(Y0, dtype=lib.float64))]
        opt = lib.optim.LBFGS(ps, line_search_fn="strong_wolfe", tolerance_grad=1e-10,
                              tolerance_change=1e-14)

        def closure(ps=ps, opt=opt):
            opt.zero_grad()
            loss = _rosenbrock(ps)
            loss.backward()
            return loss

        for _ in range(10):
            opt.step(closure)
        found[lib] = _flat(ps), closure().item()
    for lib in (sg, torch):
        # |grad| <= 1e-10 at a minimum whose Hessian's smallest eigenvalue is ~0.4 bounds
        # the distance to it by ~2.5e-10; rounding of the loss near 0 adds sqrt(eps)-size
        # flatness: 1e-7 covers both
        np.testing.assert_allclose(found[lib][0], np.ones(N), rtol=0, atol=1e-7)
        assert found[lib][1] < 1e-14


def test_lbfgs_stops_at_once_when_the_gradient_is_small_as_torch(torch):
    for lib in (sg, torch):
        w = lib.nn.Parameter(lib.tensor([1.0, 1.0], dtype=lib.float64))
        opt = lib.optim.LBFGS([w])
        calls = []

        def closure(w=w, opt=opt, calls=calls):
            calls.append(1)
            opt.zero_grad()
            loss = ((w - 1) ** 2).sum()
            loss.backward()
            return loss

        assert opt.step(closure).item() == 0.0
        assert len(calls) == 1 and list(opt.state[w]) == ["func_evals", "n_iter"]
        assert w.tolist() == [1.0, 1.0]


def test_lbfgs_state_dict_round_trip_resumes_exactly(torch, tmp_path):
    twins = _lbfgs_twins(torch, "float64", line_search_fn="strong_wolfe")
    ps, opt, closure = twins[sg]
    for _ in range(2):
        opt.step(closure)
    sd = opt.state_dict()
    tsd = twins[torch][1].state_dict()
    assert sd["param_groups"] == tsd["param_groups"]
    sg.save({"params": [p.detach().clone() for p in ps], "opt": sd}, tmp_path / "ckpt")
    for _ in range(2):
        opt.step(closure)
    ckpt = sg.load(tmp_path / "ckpt")
    ps2 = [sg.nn.Parameter(p) for p in ckpt["params"]]
    opt2 = sg.optim.LBFGS(ps2, max_iter=MAX_ITER, history_size=HISTORY, lr=0.5)
    opt2.load_state_dict(ckpt["opt"])
    assert opt2.param_groups[0]["lr"] == 1 and opt2.param_groups[0]["line_search_fn"] == \
        "strong_wolfe"

    def closure2():
        opt2.zero_grad()
        loss = _rosenbrock(ps2)
        loss.backward()
        return loss

    for _ in range(2):
        opt2.step(closure2)
    np.testing.assert_array_equal(_flat(ps2), _flat(ps))
    assert opt2.state[ps2[0]]["func_evals"] == opt.state[ps[0]]["func_evals"]


def test_lbfgs_closure_runs_with_grad_enabled_and_step_bumps_versions():
    w = sg.nn.Parameter(sg.tensor([3.0, -1.0], dtype=sg.float64))
    opt = sg.optim.LBFGS([w], max_iter=2)
    seen = []

    def closure():
        seen.append(sg.is_grad_enabled())
        opt.zero_grad()
        loss = (w * w).sum()
        loss.backward()
        return loss

    stale = (w * w).sum()
    with sg.no_grad():
        loss = opt.step(closure)
    assert loss.item() == 10.0 and seen and all(seen)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        stale.backward()


@pytest.mark.parametrize("name", sorted(CASES) + ["LBFGS"])
def test_optimizer_and_state_are_freed_without_the_cycle_collector(name, no_gc):
    """Steps leave no reference cycle (state, line-search closures, the closure's graph):
    deleting the optimizer and its parameter frees all their memory by reference counting."""
    base = sg.memory_allocated()
    w = sg.nn.Parameter(sg.tensor([0.3, -1.7, 2.9], dtype=sg.float64))
    kw = {"line_search_fn": "strong_wolfe", "max_iter": 4} if name == "LBFGS" else {}
    opt = getattr(sg.optim, name)([w], **kw)

    def closure(opt=opt, w=w):
        opt.zero_grad()
        loss = (sg.sin(w * 3.1) * w).sum()
        loss.backward()
        return loss

    for _ in range(3):
        loss = opt.step(closure)
    assert sg.memory_allocated() > base and opt.state[w]
    del opt, closure, w, loss
    assert sg.memory_allocated() == base


def test_adagrad_fills_every_accumulator_with_the_optimizers_initial_value_as_torch(torch):
    """torch reads ``initial_accumulator_value`` from the defaults, not from the group."""
    sums = []
    for lib in (sg, torch):
        a, b = lib.nn.Parameter(lib.ones(2)), lib.nn.Parameter(lib.ones(1))
        opt = lib.optim.Adagrad([{"params": [a]},
                                 {"params": [b], "initial_accumulator_value": 0.7}],
                                initial_accumulator_value=0.2)
        sums.append([opt.state[a]["sum"].tolist(), opt.state[b]["sum"].tolist()])
    assert sums[0] == sums[1]
    assert opt.param_groups[1]["initial_accumulator_value"] == 0.7
