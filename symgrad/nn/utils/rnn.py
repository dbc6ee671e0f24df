"""``torch.nn.utils.rnn``: packed sequences for the recurrent layers, with torch's names.

A :class:`PackedSequence` holds a batch of sequences of different lengths time step by time
step: ``data`` stacks, for each step t, the rows of the ``batch_sizes[t]`` sequences still
running (sorted longest first; ``sorted_indices`` maps back to the caller's order). The
functions here are built from ordinary differentiable ops (slicing, cat, stack,
index_select), so values and gradients are torch's; the nodes differ (torch records one
``PackPaddedSequenceBackward0`` where symgrad records the slices and a cat).
"""

from __future__ import annotations

from collections import namedtuple
from typing import Any

import numpy as np

from ... import creation
from ... import dtypes as _dt
from ... import functional as _F
from ...tensor import Tensor

__all__ = ["PackedSequence", "invert_permutation", "pack_padded_sequence",
           "pad_packed_sequence", "pad_sequence", "unpad_sequence", "pack_sequence",
           "unpack_sequence"]

_PackedSequenceBase = namedtuple("PackedSequence_",
                                 ["data", "batch_sizes", "sorted_indices", "unsorted_indices"])


class PackedSequence(_PackedSequenceBase):
    """``(data, batch_sizes, sorted_indices, unsorted_indices)``: see the module's doc.
    Made by :func:`pack_padded_sequence` or :func:`pack_sequence`, not by hand."""

    __slots__ = ()

    def __new__(cls, data: Tensor, batch_sizes: Tensor | None = None,
                sorted_indices: Tensor | None = None,
                unsorted_indices: Tensor | None = None) -> PackedSequence:
        if unsorted_indices is None:
            unsorted_indices = invert_permutation(sorted_indices)
        if batch_sizes is None:  # torch's PackedSequence(*packed) form: data is the pair
            data, batch_sizes = data[0], data[1]
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    def to(self, *args: Any, **kwargs: Any) -> PackedSequence:
        """``data`` converted as ``Tensor.to``; the indices move to its device only."""
        data = self.data.to(*args, **kwargs)
        if data is self.data:
            return self
        dev = data.device
        return type(self)(data, self.batch_sizes,
                          *(None if t is None else t.to(dev)
                            for t in (self.sorted_indices, self.unsorted_indices)))

    def cpu(self) -> PackedSequence:
        return self.to("cpu")

    def cuda(self, *args: Any, **kwargs: Any) -> PackedSequence:
        return self.to("cuda")

    def double(self) -> PackedSequence:
        return self.to(dtype=_dt.float64)

    def float(self) -> PackedSequence:  # noqa: A003
        return self.to(dtype=_dt.float32)

    @property
    def is_cuda(self) -> bool:
        return self.data.is_cuda


def invert_permutation(permutation: Tensor | None) -> Tensor | None:
    """The permutation that undoes ``permutation`` (None stays None)."""
    if permutation is None:
        return None
    perm = np.asarray(permutation.tolist(), dtype=np.int64)
    inv = np.empty_like(perm)
    inv[perm] = np.arange(perm.size, dtype=np.int64)
    return creation.tensor(inv, dtype=_dt.int64, device=permutation.device)


def _lengths_list(lengths: Any) -> list[int]:
    if isinstance(lengths, Tensor):
        return [int(v) for v in lengths.reshape(-1).tolist()]
    return [int(v) for v in lengths]


def _batch_sizes(lengths: list[int]) -> list[int]:
    """``batch_sizes[t]``: how many of the (sorted) sequences are longer than t."""
    return [sum(1 for n in lengths if n > t) for t in range(max(lengths))]


def pack_padded_sequence(input: Tensor, lengths: Tensor | list[int], batch_first: bool = False,
                         enforce_sorted: bool = True) -> PackedSequence:
    """Pack a padded batch ``(T, B, *)`` (``(B, T, *)`` batch_first) of sequences of
    ``lengths``; unsorted lengths need ``enforce_sorted=False`` (the batch is sorted,
    longest first, and the permutation kept)."""
    lens = _lengths_list(lengths)
    batch_dim = 0 if batch_first else 1
    if input.dim() < 2:
        raise RuntimeError("pack_padded_sequence expects an input with a time and a batch "
                           f"dimension, got a {input.dim()}-D tensor")
    if len(lens) != input.size(batch_dim):
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got "
                           f"{len(lens)} (batch_size={input.size(batch_dim)})")
    if enforce_sorted:
        if any(a < b for a, b in zip(lens, lens[1:])):
            raise RuntimeError(
                "`lengths` array must be sorted in decreasing order when `enforce_sorted` is "
                "True. You can pass `enforce_sorted=False` to pack_padded_sequence and/or "
                "pack_sequence to sidestep this requirement if you do not need ONNX "
                "exportability.")
        sorted_indices = None
    else:
        order = np.argsort(-np.asarray(lens, dtype=np.int64), kind="stable")
        sorted_indices = creation.tensor(order, dtype=_dt.int64, device=input.device)
        lens = [lens[k] for k in order]
        input = input.index_select(batch_dim, sorted_indices)
    if lens and lens[-1] <= 0:
        raise RuntimeError("Length of all samples has to be greater than 0, but found an "
                           "element in 'lengths' that is <= 0")
    steps = input.size(1 if batch_first else 0)
    if lens and lens[0] > steps:
        raise RuntimeError(f"pack_padded_sequence: a length of {lens[0]} exceeds the "
                           f"{steps} time steps of the padded input")
    if batch_first:
        input = input.transpose(0, 1)
    sizes = _batch_sizes(lens)
    data = _F.cat([input[t, :n] for t, n in enumerate(sizes)], 0)
    return PackedSequence(data, creation.tensor(sizes, dtype=_dt.int64), sorted_indices, None)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False,
                        padding_value: float = 0.0, total_length: int | None = None
                        ) -> tuple[Tensor, Tensor]:
    """The padded batch of a packed one and the sequences' lengths (the inverse of
    :func:`pack_padded_sequence`, padding with ``padding_value`` up to ``total_length``)."""
    data, batch_sizes, _, unsorted_indices = sequence
    sizes = [int(v) for v in batch_sizes.tolist()]
    steps = len(sizes)
    if total_length is not None:
        if total_length < steps:
            raise ValueError("Expected total_length to be at least the length of the longest "
                             f"sequence in input, but got total_length={total_length} and "
                             f"max sequence length being {steps}")
        steps = total_length
    batch = sizes[0]
    feature = tuple(data.shape[1:])
    rows = []
    for piece in data.split(sizes, 0):
        if piece.size(0) < batch:
            pad = creation.full((batch - piece.size(0),) + feature, padding_value,
                                dtype=data.dtype, device=data.device)
            piece = _F.cat([piece, pad], 0)
        rows.append(piece)
    for _ in range(len(sizes), steps):
        rows.append(creation.full((batch,) + feature, padding_value, dtype=data.dtype,
                                  device=data.device))
    padded = _F.stack(rows, 0)
    lengths = np.array([sum(1 for n in sizes if n > b) for b in range(batch)], dtype=np.int64)
    if unsorted_indices is not None:
        padded = padded.index_select(1, unsorted_indices)
        lengths = lengths[np.asarray(unsorted_indices.tolist(), dtype=np.int64)]
    if batch_first:
        padded = padded.transpose(0, 1)
    return padded, creation.tensor(lengths, dtype=_dt.int64)


def pad_sequence(sequences: Tensor | list[Tensor], batch_first: bool = False,
                 padding_value: float = 0.0, padding_side: str = "right") -> Tensor:
    """Stack sequences of shapes ``(L_i, *)`` into ``(max L, B, *)`` (``(B, max L, *)``
    batch_first), padding each on ``padding_side`` with ``padding_value``."""
    if padding_side not in ("left", "right"):
        raise RuntimeError("Expected padding_side to be one of left or right, but got "
                         f"{padding_side}.")
    if isinstance(sequences, Tensor):
        sequences = list(sequences.unbind(0))
    if not sequences:
        raise RuntimeError("received an empty list of sequences")
    longest = max(s.size(0) for s in sequences)
    rows = []
    for s in sequences:
        missing = longest - s.size(0)
        if missing:
            pad = creation.full((missing,) + tuple(s.shape[1:]), padding_value, dtype=s.dtype,
                                device=s.device)
            s = _F.cat([s, pad] if padding_side == "right" else [pad, s], 0)
        rows.append(s)
    return _F.stack(rows, 0 if batch_first else 1)


def unpad_sequence(padded_sequences: Tensor, lengths: Tensor, batch_first: bool = False
                   ) -> list[Tensor]:
    """The sequences of a padded batch, each cut to its length."""
    if not batch_first:
        padded_sequences = padded_sequences.transpose(0, 1)
    return [padded_sequences[b, :n] for b, n in enumerate(_lengths_list(lengths))]


def pack_sequence(sequences: list[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of sequences ``(L_i, *)`` (longest first unless enforce_sorted=False)."""
    lengths = [s.size(0) for s in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths,
                                enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list[Tensor]:
    """The list of sequences a packed batch holds, in the caller's order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return unpad_sequence(padded, lengths, batch_first=True)
