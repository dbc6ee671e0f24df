"""The API coverage report (docs/api-coverage.md) is today's, and the names that stopped
real training scripts (issue 31) are all present."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the coverage is read from torch 2.13; `make test` "
                                    "installs it")

import api_coverage  # noqa: E402  (tests/ is on sys.path under pytest)

#: What public programs of the shapes issue 31 lists import or call (nanoGPT/minGPT,
#: makemore, pytorch/examples' MNIST and LSTM, the LeNet tutorial), as (module, name).
USED_BY_PROGRAMS = [
    ("utils.data.dataloader", "DataLoader"), ("utils.data.dataset", "Dataset"),
    ("utils.data.sampler", "RandomSampler"), ("utils.data", "TensorDataset"),
    ("backends.cuda.matmul", "allow_tf32"), ("backends.cudnn", "allow_tf32"),
    ("backends.cudnn", "benchmark"), ("backends.mps", "is_available"),
    ("accelerator", "is_available"), ("cuda", "manual_seed_all"), ("cuda", "is_available"),
    ("cuda.amp", "GradScaler"), ("amp", "autocast"), ("", "autocast"),
    ("", "multinomial"), ("", "unique"), ("", "all"), ("", "prod"), ("", "log10"),
    ("", "manual_seed"), ("", "no_grad"), ("", "cat"), ("", "stack"), ("", "randint"),
    ("", "softmax"), ("", "tanh"), ("", "zeros"), ("", "long"), ("", "int64"),
    ("nn.functional", "one_hot"), ("nn.functional", "cross_entropy"),
    ("nn.functional", "nll_loss"), ("nn.functional", "scaled_dot_product_attention"),
    ("nn", "LSTM"), ("nn", "LSTMCell"), ("nn", "GRU"), ("nn", "RNN"), ("nn", "Embedding"),
    ("nn", "LayerNorm"), ("nn", "Dropout"), ("nn", "Conv2d"), ("nn", "MaxPool2d"),
    ("nn", "ModuleList"), ("nn", "ModuleDict"), ("nn.init", "normal_"),
    ("nn.utils", "clip_grad_norm_"), ("optim", "AdamW"), ("optim", "SGD"),
    ("optim", "Adadelta"), ("optim", "LBFGS"), ("optim.lr_scheduler", "StepLR"),
]


def test_the_report_is_current():
    """Surveyed in a fresh interpreter, as ``python tests/api_coverage.py`` writes it: torch
    adds lazily imported submodules to its namespace (an optimizer step imports
    ``torch._dynamo``, which brings ``torch.onnx``), so in this process the count would
    depend on which tests ran before."""
    expected = subprocess.run(
        [sys.executable, "-c", "import api_coverage; "
         "print(api_coverage.render(api_coverage.survey()), end='')"],
        cwd=Path(api_coverage.__file__).parent, capture_output=True, text=True,
        check=True).stdout
    written = api_coverage.REPORT.read_text()
    assert written == expected, ("docs/api-coverage.md is stale: run "
                                 "`python tests/api_coverage.py` and commit the result")


@pytest.mark.parametrize("module,name", USED_BY_PROGRAMS,
                         ids=[f"{m}.{n}".lstrip(".") for m, n in USED_BY_PROGRAMS])
def test_names_real_programs_use_are_present(module, name):
    def reach(root: str):
        obj = importlib.import_module(root)
        for part in filter(None, module.split(".")):
            obj = getattr(obj, part, None) or importlib.import_module(
                f"{obj.__name__}.{part}")
        return obj

    assert hasattr(reach("torch"), name), "the list names something torch lacks"
    assert hasattr(reach("symgrad"), name), \
        f"symgrad.{module + '.' if module else ''}{name} is missing"


def test_every_absent_rule_is_used():
    """A rule that matches nothing torch has is dead weight (or a typo)."""
    rows = api_coverage.survey()
    used = {why for r in rows for why in r["absent"]}
    assert used == {why for _, why in api_coverage.ABSENT_RULES}
