"""``symgrad.utils.data``: datasets, samplers, ``default_collate`` and ``DataLoader``, with
``torch.utils.data``'s names, arguments, defaults, batches and errors.

What differs from torch, and why:

- Shuffling draws from symgrad's random generator (NumPy's PCG64), not torch's Mersenne
  Twister, so ``shuffle=True`` gives a different order than torch for the same seed; it is
  reproducible the same way: ``symgrad.manual_seed(n)`` before iterating, or a seeded
  ``generator=`` (a ``numpy.random.Generator``, or any generator object carrying one as
  ``_rng``), which advances from epoch to epoch as torch's does.
- ``num_workers > 0`` loads in the main process (same batches, same order); there are no
  worker processes, so ``worker_init_fn``, ``pin_memory`` and ``prefetch_factor`` have no
  effect.
"""


from __future__ import annotations

from . import dataloader, dataset, sampler
from .dataloader import DataLoader, default_collate, default_convert
from .dataset import ConcatDataset, Dataset, IterableDataset, Subset, TensorDataset, random_split
from .sampler import (
    BatchSampler,
    RandomSampler,
    Sampler,
    SequentialSampler,
    SubsetRandomSampler,
)

__all__ = ["Dataset", "IterableDataset", "TensorDataset", "ConcatDataset", "Subset",
           "random_split", "Sampler", "SequentialSampler", "RandomSampler",
           "SubsetRandomSampler", "BatchSampler", "DataLoader", "default_collate",
           "default_convert", "dataloader", "dataset", "sampler"]
