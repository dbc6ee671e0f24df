"""Training programs in the manner of well-known public ones run with only the import changed
(issue 31, scope 7): a makemore-style MLP fed by a DataLoader, a nanoGPT-style transformer
with AdamW, pytorch/examples' time-sequence LSTM with LBFGS, and its MNIST CNN with Adadelta
and StepLR. Each program is written for torch and runs twice, as written and with its
``torch`` imports pointed at symgrad; both print the same words and integers and the same
floats within the rounding their computation allows.

Changes from the public originals, all for reproducibility across two libraries whose random
generators differ (docs/differences.md): initial weights come from a seeded NumPy generator,
or from a checkpoint written by torch (``torch.load`` reads it on both sides); data are
small and made by NumPy; dropout has p=0; sampling takes the argmax instead of
``torch.multinomial``; the runs are a few steps long.
"""

from __future__ import annotations

import contextlib
import io
import re
import warnings

import pytest
from test_torch_programs import _compare

MAKEMORE_MLP = '''
import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset
from torch.utils.data.dataloader import DataLoader

words = ["emma", "olivia", "ava", "isabella", "sophia", "charlotte", "mia", "amelia",
         "harper", "evelyn", "abigail", "emily", "elizabeth", "mila", "ella", "avery"]
chars = sorted(set("".join(words)))
stoi = {s: i + 1 for i, s in enumerate(chars)}
stoi["."] = 0
itos = {i: s for s, i in stoi.items()}
block_size = 3

def build_dataset(words):
    X, Y = [], []
    for w in words:
        context = [0] * block_size
        for ch in w + ".":
            ix = stoi[ch]
            X.append(context)
            Y.append(ix)
            context = context[1:] + [ix]
    return torch.tensor(X), torch.tensor(Y)

Xtr, Ytr = build_dataset(words)
print(Xtr.shape, Xtr.dtype, Ytr.shape, Ytr.dtype)
vocab = len(stoi)
rng = np.random.default_rng(2147483647)
C = torch.tensor(rng.standard_normal((vocab, 10)), dtype=torch.float32)
W1 = torch.tensor(rng.standard_normal((30, 64)) * (5 / 3) / 30 ** 0.5, dtype=torch.float32)
b1 = torch.tensor(rng.standard_normal(64) * 0.01, dtype=torch.float32)
W2 = torch.tensor(rng.standard_normal((64, vocab)) * 0.01, dtype=torch.float32)
b2 = torch.zeros(vocab)
parameters = [C, W1, b1, W2, b2]
print(sum(p.nelement() for p in parameters))
for p in parameters:
    p.requires_grad = True

loader = DataLoader(TensorDataset(Xtr, Ytr), batch_size=32, shuffle=False)
step = 0
for epoch in range(3):
    for Xb, Yb in loader:
        emb = C[Xb]
        h = torch.tanh(emb.view(-1, 30) @ W1 + b1)
        logits = h @ W2 + b2
        loss = F.cross_entropy(logits, Yb)
        for p in parameters:
            p.grad = None
        loss.backward()
        lr = 0.1 if step < 6 else 0.01
        for p in parameters:
            p.data += -lr * p.grad
        step += 1
    print(epoch, step, loss.item())

with torch.no_grad():
    counts = F.one_hot(Ytr, num_classes=vocab).sum(0, keepdims=True)
    print(counts.shape, counts.sum().item(), torch.all(counts >= 0).item())
    probs = F.softmax(torch.tanh(C[Xtr].view(-1, 30) @ W1 + b1) @ W2 + b2, dim=1)
    print(probs[range(5), Ytr[:5]].log().neg().mean().item())
    out, context = [], [0] * block_size
    for _ in range(8):
        h = torch.tanh(C[torch.tensor([context])].view(1, -1) @ W1 + b1)
        ix = torch.argmax(h @ W2 + b2, dim=1).item()
        context = context[1:] + [ix]
        out.append(ix)
        if ix == 0:
            break
    print("".join(itos[i] for i in out))
'''

NANOGPT = '''
import math
import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
device = "cuda" if torch.cuda.is_available() else "cpu"

class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd = n_head, n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0,
                                           is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)

class MLP(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))

class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))

class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.block_size = block_size
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd),
            wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd),
        ))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets=None):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for n, p in params.items() if p.dim() >= 2]
        nodecay = [p for n, p in params.items() if p.dim() < 2]
        print(len(decay), len(nodecay), sum(p.numel() for p in decay))
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": nodecay, "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)

    @torch.no_grad()
    def generate(self, idx, max_new_tokens):
        for _ in range(max_new_tokens):
            cond = idx if idx.size(1) <= self.block_size else idx[:, -self.block_size:]
            logits, _ = self(cond)
            logits = logits[:, -1, :]
            v, _ = torch.topk(logits, 3)
            logits[logits < v[:, [-1]]] = -float("Inf")
            idx_next = torch.argmax(F.softmax(logits, dim=-1), dim=-1, keepdim=True)
            idx = torch.cat((idx, idx_next), dim=1)
        return idx

text = "first citizen: before we proceed any further, hear me speak. all: speak, speak."
chars = sorted(list(set(text)))
stoi = {ch: i for i, ch in enumerate(chars)}
data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
block_size, batch_size = 8, 4
model = GPT(len(chars), block_size, n_layer=2, n_head=2, n_embd=16).to(device)
model.load_state_dict(torch.load(INIT))
optimizer = model.configure_optimizers(0.1, 3e-3, (0.9, 0.95))
starts = [0, 17, 33, 50]
x = torch.stack([data[i:i + block_size] for i in starts])
y = torch.stack([data[i + 1:i + 1 + block_size] for i in starts])
for it in range(6):
    logits, loss = model(x, y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    print(f"iter {it}: loss {loss.item():.6f}, norm {norm.item():.6f}")
model.eval()
out = model.generate(torch.zeros((1, 1), dtype=torch.long), max_new_tokens=10)
print(out.shape, out.dtype)
'''

TIME_SEQUENCE_LSTM = '''
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim

class Sequence(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm1 = nn.LSTMCell(1, 12)
        self.lstm2 = nn.LSTMCell(12, 12)
        self.linear = nn.Linear(12, 1)

    def forward(self, input, future=0):
        outputs = []
        h_t = torch.zeros(input.size(0), 12, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 12, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 12, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 12, dtype=torch.double)
        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for i in range(future):
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        return torch.cat(outputs, dim=1)

T, L, N = 20, 100, 8
x = np.empty((N, L), "int64")
x[:] = np.array(range(L)) + np.random.default_rng(0).integers(-4 * T, 4 * T, N).reshape(N, 1)
data = np.sin(x / 1.0 / T).astype("float64")
input = torch.from_numpy(data[3:, :-1])
target = torch.from_numpy(data[3:, 1:])
test_input = torch.from_numpy(data[:3, :-1])
test_target = torch.from_numpy(data[:3, 1:])
seq = Sequence()
seq.double()
seq.load_state_dict(torch.load(INIT))
criterion = nn.MSELoss()
optimizer = optim.LBFGS(seq.parameters(), lr=0.8)
for i in range(2):
    def closure():
        optimizer.zero_grad()
        out = seq(input)
        loss = criterion(out, target)
        print("loss:", loss.item())
        loss.backward()
        return loss
    optimizer.step(closure)
    with torch.no_grad():
        future = 5
        pred = seq(test_input, future=future)
        loss = criterion(pred[:, :-future], test_target)
        print("test loss:", loss.item())
        y = pred.detach().numpy()
    print(y.shape)
'''

MNIST_CNN = '''
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset

class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.dropout1 = nn.Dropout(0.0)
        self.dropout2 = nn.Dropout(0.0)
        self.fc1 = nn.Linear(8 * 5 * 5, 16)
        self.fc2 = nn.Linear(16, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output

def train(model, device, train_loader, optimizer, epoch):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        print("Train Epoch: {} [{}/{}]\\tLoss: {:.6f}".format(
            epoch, batch_idx * len(data), len(train_loader.dataset), loss.item()))

def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            pred = output.argmax(dim=1, keepdim=True)
            correct += pred.eq(target.view_as(pred)).sum().item()
    test_loss /= len(test_loader.dataset)
    print("Test set: Average loss: {:.4f}, Accuracy: {}/{}".format(
        test_loss, correct, len(test_loader.dataset)))

rng = np.random.default_rng(1)
images = torch.tensor(rng.random((24, 1, 14, 14)), dtype=torch.float32)
labels = torch.tensor(rng.integers(0, 10, 24))
train_loader = DataLoader(TensorDataset(images[:16], labels[:16]), batch_size=8)
test_loader = DataLoader(TensorDataset(images[16:], labels[16:]), batch_size=8)
device = torch.device("cpu")
model = Net().to(device)
model.load_state_dict(torch.load(INIT))
optimizer = optim.Adadelta(model.parameters(), lr=1.0)
scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
for epoch in range(1, 4):
    train(model, device, train_loader, optimizer, epoch)
    test(model, device, test_loader)
    scheduler.step()
    print(scheduler.get_last_lr())
'''

_IMPORT = re.compile(r"^(\s*)(import|from) torch\b", re.M)


def _pointed_at_symgrad(program: str) -> str:
    """``import torch`` -> ``import symgrad as torch``; ``import torch.nn as nn`` and
    ``from torch.x import y`` -> the same from symgrad: only the import lines change."""
    def sub(m: re.Match) -> str:
        indent, word = m.group(1), m.group(2)
        line_end = program.find("\n", m.end())
        rest = program[m.end():line_end if line_end >= 0 else None]
        if word == "import" and not rest.startswith(".") and " as " not in rest:
            return f"{indent}import symgrad as torch"
        return f"{indent}{word} symgrad"
    return _IMPORT.sub(sub, program)


def _run(program: str, lib: str, init) -> str:
    source = _pointed_at_symgrad(program) if lib == "symgrad" else program
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(source, f"<{lib} program>", "exec"), {"__name__": "__main__",
                                                           "INIT": init})
    text = re.sub(r" at 0x[0-9a-f]+", " at 0x…", buf.getvalue())
    return text.replace("symgrad", "torch")


def _init_checkpoint(torch, tmp_path, make) -> str:
    """Initial weights written by torch: both runs load the same file."""
    torch.manual_seed(0)
    path = tmp_path / "init.pt"
    torch.save(make(torch).state_dict(), path)
    return str(path)


def _gpt(torch):
    ns: dict = {"INIT": None}
    exec(compile(NANOGPT.split("text = ")[0], "<gpt classes>", "exec"), ns)
    return ns["GPT"](25, 8, n_layer=2, n_head=2, n_embd=16)  # 25 distinct chars in text


def _lstm(torch):
    ns: dict = {}
    exec(compile(TIME_SEQUENCE_LSTM.split("T, L, N")[0], "<lstm classes>", "exec"), ns)
    return ns["Sequence"]().double()


def _cnn(torch):
    ns: dict = {}
    exec(compile(MNIST_CNN.split("def train")[0], "<cnn classes>", "exec"), ns)
    return ns["Net"]()


def test_imports_are_pointed_at_symgrad_and_nothing_else():
    text = "import torch\nimport torch.nn as nn\nfrom torch.utils.data import X\n" \
           "    from torch import optim\nx = torch.ones(2)  # import torch\n"
    assert _pointed_at_symgrad(text) == (
        "import symgrad as torch\nimport symgrad.nn as nn\nfrom symgrad.utils.data import X\n"
        "    from symgrad import optim\nx = torch.ones(2)  # import torch\n")


@pytest.mark.parametrize(("program", "make", "terms", "dtype"), [
    # 3 epochs of 3 batches, each a float32 matmul chain of width <= 64 and a cross-entropy
    pytest.param(MAKEMORE_MLP, None, 9 * 64 * 30, "float32", id="makemore-mlp-dataloader"),
    # 6 AdamW steps through 2 blocks of width 16-64 over 32 tokens (Adam divides by a root)
    pytest.param(NANOGPT, _gpt, 6 * 64 * 64 * 32, "float32", id="nanogpt-adamw"),
    # LBFGS: 2 steps of up to 20 closure calls through 99 time steps of two LSTM cells
    pytest.param(TIME_SEQUENCE_LSTM, _lstm, 40 * 99 * 12 * 12, "float64", id="lstm-lbfgs"),
    # 3 epochs x 2 batches of a conv net, Adadelta (a root per step) and StepLR
    pytest.param(MNIST_CNN, _cnn, 6 * 200 * 64, "float32", id="mnist-cnn-adadelta-steplr"),
])
def test_a_public_style_program_prints_the_same_with_the_import_changed(
        torch, tmp_path, program, make, terms, dtype):
    import numpy as np

    init = _init_checkpoint(torch, tmp_path, make) if make is not None else None
    theirs = _run(program, "torch", init)
    ours = _run(program, "symgrad", init)
    assert theirs.strip(), "the program printed nothing"
    _compare(ours, theirs, terms=terms, dtype=np.dtype(dtype))
