"""torch's module layout where training scripts import from it (issue 31, scope 2): the
``utils.data`` submodules, ``backends`` switches, ``accelerator``, ``amp`` and
``cuda.amp``, each compared with torch 2.13 on this CPU-only machine."""

from __future__ import annotations

import importlib
import tracemalloc
import warnings

import numpy as np
import pytest

import symgrad as sg

IMPORTS = [
    ("utils.data.dataloader", ["DataLoader", "default_collate", "default_convert"]),
    ("utils.data.dataset", ["Dataset", "IterableDataset", "TensorDataset", "ConcatDataset",
                            "Subset", "random_split"]),
    ("utils.data.sampler", ["Sampler", "SequentialSampler", "RandomSampler",
                            "SubsetRandomSampler", "BatchSampler"]),
    ("utils.data", ["DataLoader", "TensorDataset", "RandomSampler", "random_split"]),
    ("amp", ["GradScaler", "autocast", "custom_fwd", "custom_bwd", "is_autocast_available"]),
    ("cuda.amp", ["GradScaler", "autocast", "custom_fwd", "custom_bwd"]),
    ("cuda", ["manual_seed", "manual_seed_all", "seed", "seed_all", "is_available"]),
    ("accelerator", ["is_available", "current_accelerator", "device_count",
                     "current_device_index", "synchronize", "empty_cache",
                     "memory_allocated"]),
    ("backends.cudnn", ["enabled", "benchmark", "deterministic", "allow_tf32", "is_available",
                        "version"]),
    ("backends.cuda", ["matmul", "is_built", "flash_sdp_enabled", "enable_flash_sdp"]),
    ("backends.mps", ["is_available", "is_built"]),
    ("backends.mkldnn", ["is_available"]),
    ("backends.openmp", ["is_available"]),
]


@pytest.mark.parametrize("module,names", IMPORTS, ids=[m for m, _ in IMPORTS])
def test_names_import_from_torchs_paths(torch, module, names):
    ours = importlib.import_module(f"symgrad.{module}")
    theirs = importlib.import_module(f"torch.{module}")
    for name in names:
        assert hasattr(theirs, name), f"torch.{module}.{name} (the list is wrong)"
        assert hasattr(ours, name), f"symgrad.{module}.{name} is missing"
    # reached as attributes too, as scripts write `torch.backends.cudnn.benchmark = True`
    obj = sg
    for part in module.split("."):
        obj = getattr(obj, part)
    assert obj is ours


def test_backend_switch_defaults_and_setting_match_torch(torch):
    for ours, theirs, names in [
        (sg.backends.cudnn, torch.backends.cudnn,
         ["enabled", "benchmark", "deterministic", "allow_tf32"]),
        (sg.backends.cuda.matmul, torch.backends.cuda.matmul,
         ["allow_tf32", "allow_fp16_reduced_precision_reduction",
          "allow_bf16_reduced_precision_reduction"]),
    ]:
        for name in names:
            assert getattr(ours, name) == getattr(theirs, name), name
    assert sg.backends.cudnn.is_available() is torch.backends.cudnn.is_available() is False
    assert sg.backends.mps.is_available() is torch.backends.mps.is_available()
    assert sg.backends.cudnn.version() is None
    before = sg.backends.cuda.matmul.allow_tf32
    try:
        sg.backends.cuda.matmul.allow_tf32 = True
        assert sg.backends.cuda.matmul.allow_tf32 is True
    finally:
        sg.backends.cuda.matmul.allow_tf32 = before
    for lib in (sg, torch):
        with pytest.raises(AttributeError, match="^Unknown attribute allow_tf33$"):
            lib.backends.cuda.matmul.allow_tf33 = True
        with pytest.raises(AttributeError, match="^Unknown attribute allow_tf33$"):
            _ = lib.backends.cuda.matmul.allow_tf33


def test_backends_cuda_switches_do_not_load_numba_cuda():
    import subprocess
    import sys

    code = ("import sys, symgrad as sg; sg.backends.cuda.matmul.allow_tf32 = True; "
            "sg.backends.cudnn.benchmark = True; sg.backends.cuda.is_built(); "
            "print('numba.cuda' in sys.modules, 'symgrad.backends.cuda.backend' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_accelerator_without_gpu_answers_as_torch(torch):
    assert not sg.cuda.is_available(), "this test is for a machine without CUDA"
    assert sg.accelerator.is_available() is torch.accelerator.is_available() is False
    assert sg.accelerator.current_accelerator() is None
    assert torch.accelerator.current_accelerator() is None
    assert sg.accelerator.device_count() == torch.accelerator.device_count() == 0
    for name in ("current_device_index", "synchronize", "empty_cache", "memory_allocated"):
        with pytest.raises(RuntimeError) as theirs:
            getattr(torch.accelerator, name)()
        with pytest.raises(RuntimeError) as ours:
            getattr(sg.accelerator, name)()
        assert str(ours.value) == str(theirs.value)


def _messages(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, [(w.category, str(w.message)) for w in caught]


def test_autocast_cuda_without_gpu_warns_and_disables_as_torch(torch):
    for make in (lambda lib: lib.autocast("cuda"), lambda lib: lib.amp.autocast("cuda"),
                 lambda lib: lib.cuda.amp.autocast()):
        ours, ours_w = _messages(lambda: make(sg))  # noqa: B023
        theirs, theirs_w = _messages(lambda: make(torch))  # noqa: B023
        assert ours_w == theirs_w
        assert ours._enabled is theirs._enabled is False
    x = sg.ones(2, 3, requires_grad=True)
    with sg.autocast("cuda"):
        y = (x @ sg.ones(3, 2)).sum()
    assert y.dtype == sg.float32 and y.grad_fn.name() == "SumBackward0"


def test_autocast_cpu_says_it_keeps_full_precision():
    _, caught = _messages(lambda: sg.autocast("cpu"))
    assert len(caught) == 1 and "reduced-precision" in caught[0][1]

    @sg.autocast("cpu", enabled=False)
    def f(a):
        return a * 2

    assert f(sg.ones(2)).dtype == sg.float32
    with pytest.raises(RuntimeError, match="unsupported autocast device_type 'tpu'"):
        sg.autocast("tpu")


def test_grad_scaler_cuda_without_gpu_is_a_pass_through_as_torch(torch):
    ours, ours_w = _messages(lambda: sg.cuda.amp.GradScaler())
    theirs, theirs_w = _messages(lambda: torch.cuda.amp.GradScaler())
    assert ours_w == theirs_w
    assert ours.is_enabled() is theirs.is_enabled() is False
    assert ours.get_scale() == theirs.get_scale() == 1.0
    assert ours.state_dict() == theirs.state_dict() == {}
    w = sg.nn.Parameter(sg.tensor([1.0, 2.0]))
    opt = sg.optim.SGD([w], lr=0.5)
    loss = (w * w).sum()
    assert ours.scale(loss) is loss
    loss.backward()
    ours.step(opt)
    ours.update()
    np.testing.assert_array_equal(w.detach().numpy(), np.float32([0.0, 0.0]))


def _scaled_training(lib, init):
    """An MLP trained under a CPU GradScaler; step 2's gradients are made infinite."""
    lib.manual_seed(0)
    model = lib.nn.Linear(3, 2)
    with lib.no_grad():
        model.weight.copy_(lib.tensor(init["w"]))
        model.bias.copy_(lib.tensor(init["b"]))
    opt = lib.optim.SGD(model.parameters(), lr=0.1)
    scaler = lib.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
    x = lib.tensor(init["x"])
    scales, losses = [], []
    for step in range(6):
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        if step == 2:
            loss = loss * float("inf")
        scaled = scaler.scale(loss)
        assert scaled.grad_fn.name() == "MulBackward0"
        scaled.backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        losses.append(loss.item())
    return scales, losses, model.weight.detach().numpy(), scaler.state_dict()


def test_grad_scaler_on_cpu_matches_torch_step_for_step(torch):
    rng = np.random.default_rng(3)
    init = {"w": rng.standard_normal((2, 3)).astype(np.float32),
            "b": rng.standard_normal(2).astype(np.float32),
            "x": rng.standard_normal((4, 3)).astype(np.float32)}
    ours = _scaled_training(sg, init)
    theirs = _scaled_training(torch, init)
    assert ours[0] == theirs[0]  # skipped step backs off, two good ones grow: exact powers of 2
    assert ours[0] == [8.0, 16.0, 8.0, 8.0, 16.0, 16.0]
    # six steps of 3-term dot products, a mean and an SGD update, each rounding once per
    # operation in float32 (the two libraries may sum in another order): 64 eps covers it
    eps = np.finfo(np.float32).eps
    np.testing.assert_allclose(ours[1], theirs[1], rtol=64 * eps)
    np.testing.assert_allclose(ours[2], theirs[2], rtol=64 * eps, atol=64 * eps)
    assert ours[3] == theirs[3]


def test_grad_scaler_misuse_raises_torchs_errors(torch):
    for lib in (sg, torch):
        w = lib.nn.Parameter(lib.tensor([1.0]))
        opt = lib.optim.SGD([w], lr=0.1)
        scaler = lib.amp.GradScaler("cpu")
        scaler.scale((w * 2).sum()).backward()
        scaler.unscale_(opt)
        with pytest.raises(RuntimeError, match=r"unscale_\(\) has already been called"):
            scaler.unscale_(opt)
        scaler.step(opt)
        with pytest.raises(RuntimeError, match=r"step\(\) has already been called"):
            scaler.step(opt)
        with pytest.raises(RuntimeError, match="Closure use is not currently supported"):
            scaler.step(opt, closure=lambda: None)
        with pytest.raises(RuntimeError, match="The source state dict is empty"):
            scaler.load_state_dict({})


def test_cuda_seeding_names_exist_and_check_their_argument():
    sg.cuda.manual_seed_all(3)
    sg.cuda.manual_seed(3)
    with pytest.raises((TypeError, ValueError)):
        sg.cuda.manual_seed_all("three")


def test_random_sampler_with_replacement_draws_lazily():
    data = sg.utils.data.TensorDataset(sg.arange(10))
    sampler = sg.utils.data.RandomSampler(data, replacement=True, num_samples=10 ** 10)
    assert len(sampler) == 10 ** 10
    tracemalloc.start()
    it = iter(sampler)
    first = [next(it) for _ in range(100)]
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert all(0 <= i < 10 for i in first)
    assert peak < 1 << 20  # drawing all 10**10 indices at once would need 80 GB
    sg.manual_seed(5)
    small = list(sg.utils.data.RandomSampler(data, replacement=True, num_samples=70))
    assert len(small) == 70 and set(small) <= set(range(10))
