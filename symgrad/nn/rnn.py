"""The recurrent layers of ``torch.nn``: ``RNN``, ``LSTM``, ``GRU`` and their cells.

Same constructor arguments, parameter names (``weight_ih_l0``, ``bias_hh_l1_reverse``, ...),
registration order, shapes, initialisation (U(-1/sqrt(hidden), 1/sqrt(hidden)) for every
parameter, in ``parameters()`` order; the numbers come from symgrad's generator, so they
follow torch's distribution, not torch's draws), input/hidden shape handling (unbatched
input included), return structure and error messages as torch 2.13.

The forward follows torch's CPU kernels (``aten/src/ATen/native/RNN.cpp``) step by step,
written with ordinary differentiable ops (linear, unsafe_chunk as torch cuts the gates,
sigmoid, tanh, relu, mul, add, unbind, stack, cat), so autograd, hooks and ``symgrad.verify``
need no new rule: for a whole sequence the input projection ``x W_ih^T + b_ih`` is taken
once for all time steps, each step adds ``h W_hh^T + b_hh``; the reverse direction walks the
steps backwards; layers are joined by dropout (training only, not after the last layer),
directions by ``cat`` on the feature dimension. LSTM's ``proj_size`` (``weight_hr_l{k}``) is
supported, and so are packed sequences (``nn.utils.rnn.PackedSequence``): each step runs
the sequences still going, the finished ones keep their state.
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable

from .. import creation
from .. import functional as _F
from ..tensor import Tensor
from . import functional as F
from . import init
from .modules import Module
from .parameter import Parameter
from .utils.rnn import PackedSequence

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


# -- one time step (igates: the input projection x W_ih^T + b_ih of that step) ----------------
def _rnn_step(act: Callable[[Tensor], Tensor]):
    def step(igates: Tensor, hx: Tensor, w_hh: Tensor, b_hh: Tensor | None,
             w_hr: Tensor | None = None) -> Tensor:
        return act(F.linear(hx, w_hh, b_hh) + igates)
    return step


def _lstm_step(igates: Tensor, hidden: tuple[Tensor, Tensor], w_hh: Tensor,
               b_hh: Tensor | None, w_hr: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """torch's LSTMCell: gates i, f, g, o; c' = f c + i g; h' = o tanh(c') (then W_hr)."""
    hx, cx = hidden
    gates = F.linear(hx, w_hh, b_hh) + igates
    i, f, g, o = gates.unsafe_chunk(4, 1)
    i, f, g, o = _F.sigmoid(i), _F.sigmoid(f), _F.tanh(g), _F.sigmoid(o)
    cy = f * cx + i * g
    hy = o * _F.tanh(cy)
    if w_hr is not None:
        hy = _F.matmul(hy, w_hr.t())
    return hy, cy


def _gru_step(igates: Tensor, hx: Tensor, w_hh: Tensor, b_hh: Tensor | None,
              w_hr: Tensor | None = None) -> Tensor:
    """torch's GRUCell: r, z gates; n = tanh(i_n + r (W_hn h + b_hn)); h' = (h - n) z + n."""
    i_r, i_z, i_n = igates.unsafe_chunk(3, 1)
    h_r, h_z, h_n = F.linear(hx, w_hh, b_hh).unsafe_chunk(3, 1)
    r = _F.sigmoid(h_r + i_r)
    z = _F.sigmoid(h_z + i_z)
    n = _F.tanh(i_n + h_n * r)
    return (hx - n) * z + n


_STEPS = {"RNN_TANH": _rnn_step(_F.tanh), "RNN_RELU": _rnn_step(_F.relu), "LSTM": _lstm_step,
          "GRU": _gru_step}


def _rows(hidden, n: int):
    """The first ``n`` rows (the sequences still running) of a state or (h, c) pair."""
    if isinstance(hidden, tuple):
        return tuple(h[:n] for h in hidden)
    return hidden[:n]


def _merge(new, hidden, n: int):
    """``new`` for the first ``n`` rows, the finished sequences' ``hidden`` below them."""
    if isinstance(hidden, tuple):
        return tuple(_merge(a, b, n) for a, b in zip(new, hidden))
    return new if n == hidden.size(0) else _F.cat([new, hidden[n:]], 0)


# -- whole-sequence layers --------------------------------------------------------------------
class RNNBase(Module):
    """What RNN, LSTM and GRU share: torch's parameters, checks and the layer loop."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None,
                 dtype=None) -> None:
        super().__init__()
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        self._check_arguments(dropout)
        if mode not in _GATES:
            raise ValueError("Unrecognized RNN mode: " + mode)
        gate_size = _GATES[mode] * hidden_size
        num_directions = 2 if bidirectional else 1
        real_hidden_size = proj_size if proj_size > 0 else hidden_size
        self._flat_weights_names: list[str] = []
        self._all_weights: list[list[str]] = []
        for layer in range(num_layers):
            for direction in range(num_directions):
                layer_input_size = input_size if layer == 0 else real_hidden_size * num_directions
                shapes = [(gate_size, layer_input_size), (gate_size, real_hidden_size)]
                names = ["weight_ih_l{}{}", "weight_hh_l{}{}"]
                if bias:
                    shapes += [(gate_size,), (gate_size,)]
                    names += ["bias_ih_l{}{}", "bias_hh_l{}{}"]
                if proj_size > 0:
                    shapes.append((proj_size, hidden_size))
                    names.append("weight_hr_l{}{}")
                suffix = "_reverse" if direction == 1 else ""
                names = [n.format(layer, suffix) for n in names]
                for name, shape in zip(names, shapes, strict=True):
                    setattr(self, name, Parameter(creation.empty(*shape, dtype=dtype)))
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()
        if device is not None:
            self.to(device)

    def _check_arguments(self, dropout) -> None:
        """torch's constructor checks, with its messages."""
        if not isinstance(dropout, numbers.Number) or isinstance(dropout, bool) \
                or not 0 <= dropout <= 1:
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if dropout > 0 and self.num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                          "non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={self.num_layers}", stacklevel=4)
        for name, kind in (("bias", bool), ("batch_first", bool), ("input_size", int),
                           ("hidden_size", int)):
            value = getattr(self, name)
            if not isinstance(value, kind):
                raise TypeError(f"{name} should be of type {kind.__name__}, got: "
                                f"{type(value).__name__}")
            if kind is int and value <= 0:
                raise ValueError(f"{name} must be greater than zero")
        if self.num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if self.proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable "
                             "projections")
        if self.proj_size >= self.hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")

    @property
    def _flat_weights(self) -> list[Parameter | None]:
        """The parameters in torch's flat order (read afresh: assignment keeps it current)."""
        return [getattr(self, n, None) for n in self._flat_weights_names]

    @property
    def all_weights(self) -> list[list[Parameter]]:
        """Per layer and direction, its parameters (torch's ``all_weights``)."""
        return [[getattr(self, n) for n in names] for names in self._all_weights]

    def flatten_parameters(self) -> None:
        """A no-op, as torch's off cuDNN: there is no fused weight buffer to re-pack."""

    def reset_parameters(self) -> None:
        """U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) for every parameter, in order."""
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    # -- checks (torch's wording) -----------------------------------------------------------
    def check_input(self, input: Tensor, batch_sizes=None) -> None:
        weight_dtype = self._flat_weights[0].dtype
        if input.dtype != weight_dtype:
            raise ValueError(f"RNN input dtype ({input.dtype}) does not match weight dtype "
                             f"({weight_dtype}). Convert input: input.to({weight_dtype}), or "
                             f"convert model: model.to({input.dtype})")
        expected_input_dim = 2 if batch_sizes is not None else 3
        if input.dim() != expected_input_dim:
            raise RuntimeError(f"input must have {expected_input_dim} dimensions, got "
                               f"{input.dim()}")
        if self.input_size != input.size(-1):
            raise RuntimeError("input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {input.size(-1)}")

    def get_expected_hidden_size(self, input: Tensor, batch_sizes=None) -> tuple[int, int, int]:
        if batch_sizes is not None:
            mini_batch = int(batch_sizes[0])
        else:
            mini_batch = input.size(0) if self.batch_first else input.size(1)
        num_directions = 2 if self.bidirectional else 1
        size = self.proj_size if self.proj_size > 0 else self.hidden_size
        return (self.num_layers * num_directions, mini_batch, size)

    def check_hidden_size(self, hx: Tensor, expected_hidden_size: tuple[int, int, int],
                          msg: str = "Expected hidden size {}, got {}") -> None:
        if tuple(hx.size()) != tuple(expected_hidden_size):
            raise RuntimeError(msg.format(expected_hidden_size, list(hx.size())))

    def check_forward_args(self, input: Tensor, hidden: Tensor, batch_sizes=None) -> None:
        self.check_input(input, batch_sizes)
        self.check_hidden_size(hidden, self.get_expected_hidden_size(input, batch_sizes))

    def permute_hidden(self, hx, permutation: Tensor | None):
        """The states' batch rows in ``permutation``'s order (packed sequences sort their
        batch longest first); the identity without one."""
        if permutation is None:
            return hx
        if isinstance(hx, tuple):
            return tuple(h.index_select(1, permutation) for h in hx)
        return hx.index_select(1, permutation)

    def extra_repr(self) -> str:
        s = "{input_size}, {hidden_size}"
        if self.proj_size != 0:
            s += ", proj_size={proj_size}"
        if self.num_layers != 1:
            s += ", num_layers={num_layers}"
        if self.bias is not True:
            s += ", bias={bias}"
        if self.batch_first is not False:
            s += ", batch_first={batch_first}"
        if self.dropout != 0:
            s += ", dropout={dropout}"
        if self.bidirectional is not False:
            s += ", bidirectional={bidirectional}"
        return s.format(**self.__dict__)

    # -- the computation (torch's _rnn_impl / FullLayer / ReversedFullLayer) -----------------
    def _layer_params(self, index: int) -> tuple:
        """``(w_ih, w_hh, b_ih, b_hh, w_hr)`` of layer-direction ``index`` (None if absent)."""
        params = [getattr(self, n) for n in self._all_weights[index]]
        w_ih, w_hh = params[:2]
        b_ih, b_hh = (params[2], params[3]) if self.bias else (None, None)
        w_hr = params[-1] if self.proj_size > 0 else None
        return w_ih, w_hh, b_ih, b_hh, w_hr

    def _run(self, input: Tensor, hiddens: list, batch_sizes: list[int] | None = None
             ) -> tuple[Tensor, list]:
        """Sequence-first ``input`` through every layer; ``hiddens`` per layer-direction.

        With ``batch_sizes`` (a packed sequence), ``input`` is its data: step t holds the
        first ``batch_sizes[t]`` sequences, the others keep their state (the reverse
        direction starts each sequence at its own last step), as torch's packed layers do.
        """
        step = _STEPS[self.mode]
        num_directions = 2 if self.bidirectional else 1
        if input.size(0) == 0:
            raise RuntimeError("Expected sequence length to be larger than 0 in RNN")
        finals = []
        layer_input = input
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(num_directions):
                index = layer * num_directions + direction
                w_ih, w_hh, b_ih, b_hh, w_hr = self._layer_params(index)
                projected = F.linear(layer_input, w_ih, b_ih)
                igates = projected.unbind(0) if batch_sizes is None else \
                    projected.split(batch_sizes, 0)
                hidden = hiddens[index]
                steps: list = [None] * len(igates)
                order = range(len(igates) - 1, -1, -1) if direction else range(len(igates))
                for t in order:
                    if batch_sizes is None:
                        hidden = step(igates[t], hidden, w_hh, b_hh, w_hr)
                        new = hidden
                    else:
                        n = batch_sizes[t]
                        new = step(igates[t], _rows(hidden, n), w_hh, b_hh, w_hr)
                        hidden = _merge(new, hidden, n)
                    steps[t] = new[0] if self.mode == "LSTM" else new
                outputs.append(_F.stack(steps, 0) if batch_sizes is None else
                               _F.cat(steps, 0))
                finals.append(hidden)
            layer_input = outputs[0] if num_directions == 1 else _F.cat(outputs, -1)
            if self.dropout != 0 and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, True)
        return layer_input, finals

    def _sequence(self, input: Tensor, hiddens: list) -> tuple[Tensor, list]:
        """``_run`` on input in the module's layout (batch_first transposed in and out)."""
        if self.batch_first:
            input = input.transpose(0, 1)
        output, finals = self._run(input, hiddens)
        if self.batch_first:
            output = output.transpose(0, 1)
        return output, finals

    def _batched(self, input: Tensor, hx: Tensor | None, name: str):
        """torch's input/hx dimension handling for RNN and GRU: ``(input, hx, is_batched)``."""
        if input.dim() not in (2, 3):
            raise ValueError(f"{name}: Expected input to be 2D or 3D, got {input.dim()}D"
                             f"{' tensor' if name == 'RNN' else ''} instead")
        is_batched = input.dim() == 3
        batch_dim = 0 if self.batch_first else 1
        if not is_batched:
            input = input.unsqueeze(batch_dim)
            if hx is not None:
                if hx.dim() != 2:
                    raise RuntimeError("For unbatched 2-D input, hx should also be 2-D but got "
                                       f"{hx.dim()}-D tensor")
                hx = hx.unsqueeze(1)
        elif hx is not None and hx.dim() != 3:
            raise RuntimeError("For batched 3-D input, hx should also be 3-D but got "
                               f"{hx.dim()}-D tensor")
        if hx is None:
            hx = self._zeros(input, self.hidden_size)
        return input, hx, is_batched

    def _zeros(self, input: Tensor, size: int) -> Tensor:
        num_directions = 2 if self.bidirectional else 1
        batch = input.size(0) if self.batch_first else input.size(1)
        return creation.zeros(self.num_layers * num_directions, batch, size, dtype=input.dtype,
                              device=input.device)

    def _packed(self, packed: PackedSequence, hx):
        """torch's forward of a packed sequence: ``(PackedSequence, h_n)`` (``(h_n, c_n)``
        for LSTM); h0 and the final states are in the caller's batch order."""
        data, batch_sizes, sorted_indices, unsorted_indices = packed
        sizes = [int(b) for b in batch_sizes.tolist()]
        if hx is None:
            real = self.proj_size if self.proj_size > 0 else self.hidden_size
            zeros = creation.zeros(self.num_layers * (2 if self.bidirectional else 1),
                                   sizes[0], real, dtype=data.dtype, device=data.device)
            hx = zeros if self.mode != "LSTM" else (zeros, creation.zeros(
                zeros.size(0), sizes[0], self.hidden_size, dtype=data.dtype,
                device=data.device))
        else:
            hx = self.permute_hidden(hx, sorted_indices)
        self.check_forward_args(data, hx, batch_sizes)
        states = list(hx.unbind(0)) if self.mode != "LSTM" else \
            list(zip(hx[0].unbind(0), hx[1].unbind(0), strict=True))
        output, finals = self._run(data, states, sizes)
        if self.mode == "LSTM":
            hidden = (_F.stack([h for h, _ in finals], 0), _F.stack([c for _, c in finals], 0))
        else:
            hidden = _F.stack(finals, 0)
        return (PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices),
                self.permute_hidden(hidden, unsorted_indices))

    def _single_state(self, input: Tensor, hx: Tensor | None, name: str):
        """The RNN/GRU forward: ``(output, h_n)``."""
        if isinstance(input, PackedSequence):
            return self._packed(input, hx)
        input, hx, is_batched = self._batched(input, hx, name)
        self.check_forward_args(input, hx, None)
        output, finals = self._sequence(input, list(hx.unbind(0)))
        hidden = _F.stack(finals, 0)
        if not is_batched:
            output = output.squeeze(0 if self.batch_first else 1)
            hidden = hidden.squeeze(1)
        return output, hidden


class RNN(RNNBase):
    """Elman RNN: ``h_t = act(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)``, act tanh or relu."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 nonlinearity: str = "tanh", bias: bool = True, batch_first: bool = False,
                 dropout: float = 0.0, bidirectional: bool = False, device=None, dtype=None,
                 **kwargs) -> None:
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if kwargs:
            raise TypeError(f"RNNBase.__init__() got an unexpected keyword argument "
                            f"'{next(iter(kwargs))}'")
        self.nonlinearity = nonlinearity
        if nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or "
                             "'relu'.")
        super().__init__(mode, input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(output, h_n)``: output ``(L, N, D*H)`` (``(N, L, D*H)`` batch_first), h_n
        ``(D*num_layers, N, H)``; unbatched input drops N."""
        return self._single_state(input, hx, "RNN")


class GRU(RNNBase):
    """Gated recurrent unit, torch's variant (the reset gate scales ``W_hn h + b_hn``)."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, device=None, dtype=None, **kwargs) -> None:
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if kwargs:
            raise TypeError(f"RNNBase.__init__() got an unexpected keyword argument "
                            f"'{next(iter(kwargs))}'")
        super().__init__("GRU", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, device=device, dtype=dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(output, h_n)``, shaped as RNN's."""
        return self._single_state(input, hx, "GRU")


class LSTM(RNNBase):
    """Long short-term memory; ``proj_size > 0`` projects h by ``weight_hr_l{k}``."""

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None,
                 dtype=None) -> None:
        super().__init__("LSTM", input_size, hidden_size, num_layers, bias, batch_first, dropout,
                         bidirectional, proj_size, device=device, dtype=dtype)

    def get_expected_cell_size(self, input: Tensor, batch_sizes=None) -> tuple[int, int, int]:
        if batch_sizes is not None:
            mini_batch = int(batch_sizes[0])
        else:
            mini_batch = input.size(0) if self.batch_first else input.size(1)
        num_directions = 2 if self.bidirectional else 1
        return (self.num_layers * num_directions, mini_batch, self.hidden_size)

    def check_forward_args(self, input: Tensor, hidden: tuple[Tensor, Tensor],
                           batch_sizes=None) -> None:
        self.check_input(input, batch_sizes)
        self.check_hidden_size(hidden[0], self.get_expected_hidden_size(input, batch_sizes),
                               "Expected hidden[0] size {}, got {}")
        self.check_hidden_size(hidden[1], self.get_expected_cell_size(input, batch_sizes),
                               "Expected hidden[1] size {}, got {}")

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
                ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``(output, (h_n, c_n))``; h_n has ``proj_size`` features when projecting."""
        if isinstance(input, PackedSequence):
            return self._packed(input, hx)
        if input.dim() not in (2, 3):
            raise ValueError(f"LSTM: Expected input to be 2D or 3D, got {input.dim()}D instead")
        is_batched = input.dim() == 3
        batch_dim = 0 if self.batch_first else 1
        if not is_batched:
            input = input.unsqueeze(batch_dim)
        if hx is None:
            real_hidden_size = self.proj_size if self.proj_size > 0 else self.hidden_size
            hx = (self._zeros(input, real_hidden_size), self._zeros(input, self.hidden_size))
        else:
            dims = (hx[0].dim(), hx[1].dim())
            if is_batched and dims != (3, 3):
                raise RuntimeError("For batched 3-D input, hx and cx should also be 3-D but got "
                                   f"({dims[0]}-D, {dims[1]}-D) tensors")
            if not is_batched:
                if dims != (2, 2):
                    raise RuntimeError("For unbatched 2-D input, hx and cx should also be 2-D "
                                       f"but got ({dims[0]}-D, {dims[1]}-D) tensors")
                hx = (hx[0].unsqueeze(1), hx[1].unsqueeze(1))
        self.check_forward_args(input, hx, None)
        states = list(zip(hx[0].unbind(0), hx[1].unbind(0), strict=True))
        output, finals = self._sequence(input, states)
        h_n = _F.stack([h for h, _ in finals], 0)
        c_n = _F.stack([c for _, c in finals], 0)
        if not is_batched:
            output = output.squeeze(batch_dim)
            h_n, c_n = h_n.squeeze(1), c_n.squeeze(1)
        return output, (h_n, c_n)


# -- cells ------------------------------------------------------------------------------------
def _check_cell_input(input: Tensor, w_ih: Tensor) -> None:
    """torch's ``check_rnn_cell_forward_input``."""
    if input.size(1) != w_ih.size(1):
        raise RuntimeError(f"input has inconsistent input_size: got {input.size(1)} expected "
                           f"{w_ih.size(1)}")


def _check_cell_hidden(input: Tensor, hx: Tensor, hidden_size: int, label: int) -> None:
    """torch's ``check_rnn_cell_forward_hidden``."""
    if input.size(0) != hx.size(0):
        raise RuntimeError(f"Input batch size {input.size(0)} doesn't match hidden{label} batch "
                           f"size {hx.size(0)}")
    if hx.size(1) != hidden_size:
        raise RuntimeError(f"hidden{label} has inconsistent hidden_size: got {hx.size(1)}, "
                           f"expected {hidden_size}")


class RNNCellBase(Module):
    """What the cells share: ``weight_ih``, ``weight_hh``, ``bias_ih``, ``bias_hh`` and init."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int,
                 device=None, dtype=None) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = Parameter(creation.empty(num_chunks * hidden_size, input_size,
                                                  dtype=dtype))
        self.weight_hh = Parameter(creation.empty(num_chunks * hidden_size, hidden_size,
                                                  dtype=dtype))
        if bias:
            self.bias_ih = Parameter(creation.empty(num_chunks * hidden_size, dtype=dtype))
            self.bias_hh = Parameter(creation.empty(num_chunks * hidden_size, dtype=dtype))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()
        if device is not None:
            self.to(device)

    def extra_repr(self) -> str:
        s = "{input_size}, {hidden_size}"
        if "bias" in self.__dict__ and self.bias is not True:
            s += ", bias={bias}"
        if "nonlinearity" in self.__dict__ and self.nonlinearity != "tanh":
            s += ", nonlinearity={nonlinearity}"
        return s.format(**self.__dict__)

    def reset_parameters(self) -> None:
        """U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) for every parameter, in order."""
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def _cell_input(self, name: str, input: Tensor, hx):
        """torch's dimension checks; returns ``(input as 2-D, is_batched)``."""
        if input.dim() not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.dim()}D "
                             "instead")
        for label, value in hx:
            if value is not None and value.dim() not in (1, 2):
                raise ValueError(f"{name}: Expected {label} to be 1D or 2D, got "
                                 f"{value.dim()}D instead")
        is_batched = input.dim() == 2
        return (input if is_batched else input.unsqueeze(0)), is_batched

    def _cell_zeros(self, input: Tensor) -> Tensor:
        return creation.zeros(input.size(0), self.hidden_size, dtype=input.dtype,
                              device=input.device)

    def _single(self, name: str, input: Tensor, hx: Tensor | None, mode: str) -> Tensor:
        """RNNCell/GRUCell forward: one hidden state in, one out."""
        input, is_batched = self._cell_input(name, input, [("hidden", hx)])
        if hx is None:
            hx = self._cell_zeros(input)
        elif not is_batched:
            hx = hx.unsqueeze(0)
        if mode not in _STEPS:
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        step = _STEPS[mode]
        _check_cell_input(input, self.weight_ih)
        _check_cell_hidden(input, hx, self.weight_hh.size(1), 0)
        igates = F.linear(input, self.weight_ih, self.bias_ih)
        out = step(igates, hx, self.weight_hh, self.bias_hh)
        return out if is_batched else out.squeeze(0)


class RNNCell(RNNCellBase):
    """``h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh)``, act tanh or relu."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device=None, dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=1, device=device,
                         dtype=dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        """``h'`` of shape ``(N, hidden_size)`` (``(hidden_size,)`` for unbatched input)."""
        mode = {"tanh": "RNN_TANH", "relu": "RNN_RELU"}.get(self.nonlinearity, "")
        return self._single("RNNCell", input, hx, mode)


class GRUCell(RNNCellBase):
    """One GRU step, torch's variant (see :class:`GRU`)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=3, device=device,
                         dtype=dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        """``h'`` of shape ``(N, hidden_size)`` (``(hidden_size,)`` for unbatched input)."""
        return self._single("GRUCell", input, hx, "GRU")


class LSTMCell(RNNCellBase):
    """One LSTM step: ``(h', c')`` from ``x`` and ``(h, c)``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=4, device=device,
                         dtype=dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None
                ) -> tuple[Tensor, Tensor]:
        """``(h', c')``, each ``(N, hidden_size)`` (``(hidden_size,)`` for unbatched input)."""
        pairs = [] if hx is None else [(f"hx[{i}]", v) for i, v in enumerate(hx)]
        input, is_batched = self._cell_input("LSTMCell", input, pairs)
        if hx is None:
            zeros = self._cell_zeros(input)
            hx = (zeros, zeros)
        elif not is_batched:
            hx = (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        elif len(hx) != 2:
            raise RuntimeError("lstm_cell expects two hidden states")
        _check_cell_input(input, self.weight_ih)
        _check_cell_hidden(input, hx[0], self.weight_hh.size(1), 0)
        _check_cell_hidden(input, hx[1], self.weight_hh.size(1), 1)
        igates = F.linear(input, self.weight_ih, self.bias_ih)
        h, c = _lstm_step(igates, (hx[0], hx[1]), self.weight_hh, self.bias_hh)
        return (h, c) if is_batched else (h.squeeze(0), c.squeeze(0))
