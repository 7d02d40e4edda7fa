"""Windows over token bins, and the samplers that order and shard them.

Training: :class:`TrainWindows` maps a token start to ``(x, y)``;
:class:`ResumableBatchSampler` yields, forever, batches of starts whose order
is a pure function of (seed, data epoch, rank, world size), so a run resumed
from ``start_batch`` sees exactly the batches an uninterrupted run would;
:class:`TrainBatchStream` feeds those batches through a ``DataLoader`` (as an
IterableDataset, so Lightning never swaps in its own sampler).

Evaluation: :class:`EvalWindows` covers every token of a split exactly once as
a target; :class:`EvalShardSampler` gives each rank a contiguous share of the
windows without padding or repeats.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator

import numpy as np
import torch
from torch.utils.data import Dataset, DistributedSampler, IterableDataset, Sampler, get_worker_info

from resnorm_lm.data.errors import DataError
from resnorm_lm.targets import IGNORE_INDEX


def _check_long_enough(n_tokens: int, block_size: int, what: str) -> None:
    if block_size < 1:
        raise DataError(f"block_size must be >= 1, got {block_size}")
    if n_tokens < block_size + 1:
        raise DataError(
            f"{what} has {n_tokens} tokens, fewer than one window of block_size + 1 = {block_size + 1}; "
            "use a smaller data.block_size or a larger corpus"
        )


class TrainWindows(Dataset):
    """Item ``start`` -> ``(x, y)``: int64 tensors (block_size,), ``y`` is ``x`` shifted by one token."""

    def __init__(self, tokens: np.ndarray, block_size: int) -> None:
        _check_long_enough(len(tokens), block_size, "the train split")
        self.tokens = tokens  # (N,) uint16/uint32, usually a memmap
        self.block_size = block_size

    def __len__(self) -> int:
        return len(self.tokens) - self.block_size  # valid starts: 0 .. N - block_size - 1

    def __getitem__(self, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = torch.from_numpy(self.tokens[start : start + self.block_size + 1].astype(np.int64))  # (T+1,)
        return chunk[:-1], chunk[1:]

    def batch(self, starts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of shape (B, T) for the windows at ``starts``."""
        index = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(self.block_size + 1)  # (B, T+1)
        chunk = torch.from_numpy(self.tokens[index].astype(np.int64))  # (B, T+1)
        return chunk[:, :-1], chunk[:, 1:]


def _epoch_generator(seed: int, epoch: int) -> torch.Generator:
    digest = hashlib.sha256(f"resnorm-lm/{seed}/{epoch}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") & (2**63 - 1))


class ResumableBatchSampler(Sampler[list[int]]):
    """Infinite batches of window starts; deterministic in (seed, epoch); sharded over ranks; resumable.

    Each data epoch draws an offset in ``[0, block_size)`` (0 without
    ``random_offset``) and a permutation of the ``n_windows`` non-overlapping
    windows ``offset + k * block_size``; ``n_windows = N // block_size - 1`` fits
    every offset, so every epoch has the same number of batches. The epoch's
    permuted windows are cut into global batches of ``batch_size``; rank ``r``
    takes global batches ``r, r + world_size, ...``; the remainder that does not
    fill ``world_size`` whole batches is dropped. ``start_batch`` is the number
    of batches this rank has already consumed (on resume: ``global_step *
    accumulate_grad_batches``). There is no ``__len__``: the stream never ends.
    """

    def __init__(
        self,
        n_tokens: int,
        block_size: int,
        batch_size: int,
        *,
        seed: int = 1337,
        rank: int = 0,
        world_size: int = 1,
        start_batch: int = 0,
        random_offset: bool = True,
    ) -> None:
        _check_long_enough(n_tokens, block_size, "the train split")
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size or start_batch < 0:
            raise ValueError(
                f"need batch_size >= 1, world_size >= 1, 0 <= rank < world_size, start_batch >= 0; got "
                f"batch_size={batch_size}, rank={rank}, world_size={world_size}, start_batch={start_batch}"
            )
        self.block_size, self.batch_size = block_size, batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.start_batch = start_batch
        self.random_offset = random_offset
        self.n_windows = n_tokens // block_size - 1 if random_offset else (n_tokens - 1) // block_size
        self.batches_per_epoch = self.n_windows // (batch_size * world_size)  # per rank
        if self.batches_per_epoch == 0:
            raise DataError(
                f"the train split has {self.n_windows} windows of {block_size} tokens, fewer than one batch per rank "
                f"(batch_size {batch_size} x {world_size} ranks); use a smaller block_size or batch_size"
            )
        self._yielded = 0

    def position(self, batch_count: int) -> tuple[int, int]:
        """``(epoch, batch index within the epoch)`` after this rank has consumed ``batch_count`` batches."""
        return divmod(batch_count, self.batches_per_epoch)

    def epoch_windows(self, epoch: int) -> tuple[int, torch.Tensor]:
        """``(offset, window indices)`` of data epoch ``epoch``: a permutation of range(n_windows)."""
        g = _epoch_generator(self.seed, epoch)
        offset = int(torch.randint(self.block_size, (1,), generator=g)) if self.random_offset else 0
        return offset, torch.randperm(self.n_windows, generator=g)

    def __iter__(self) -> Iterator[list[int]]:
        epoch, index = self.position(self.start_batch)
        self._yielded = 0
        while True:
            offset, order = self.epoch_windows(epoch)
            for i in range(index, self.batches_per_epoch):
                g = i * self.world_size + self.rank  # global batch index in this epoch
                windows = order[g * self.batch_size : (g + 1) * self.batch_size]  # (B,)
                self._yielded += 1
                yield (offset + windows * self.block_size).tolist()
            epoch, index = epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        """Batches consumed through this sampler's iterator (ahead of training when a loader prefetches;
        prefer deriving ``start_batch`` from the trainer's step count)."""
        return {"start_batch": self.start_batch + self._yielded, "seed": self.seed, "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("world_size", self.world_size) != self.world_size:
            raise ValueError(f"sampler state is for world_size={state['world_size']}, this run has {self.world_size}")
        self.seed, self.start_batch = state["seed"], state["start_batch"]


class TrainBatchStream(IterableDataset):
    """Batches ``(x, y)`` (B, T) in the sampler's order; DataLoader workers take turns, so order is kept.

    Use with ``DataLoader(stream, batch_size=None)``: worker ``w`` of ``W`` builds
    batches ``w, w + W, ...``, and the loader interleaves them back in order.
    """

    def __init__(self, windows: TrainWindows, sampler: ResumableBatchSampler) -> None:
        self.windows, self.sampler = windows, sampler

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = get_worker_info()
        worker, n_workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for i, starts in enumerate(self.sampler):
            if i % n_workers == worker:
                yield self.windows.batch(starts)


class EvalWindows(Dataset):
    """Non-overlapping windows; every token after the first is a target exactly once.

    Window ``i`` has inputs ``tokens[i*T : i*T + T]`` and targets ``tokens[i*T + 1 :
    i*T + T + 1]``; the last window is padded (inputs with 0, targets with
    ``IGNORE_INDEX``), so the tail is kept. ``n_bytes``/``n_words`` come from the manifest:
    bits per byte = sum_nll / (ln 2 * n_bytes), word perplexity = exp(sum_nll / n_words).
    """

    def __init__(self, tokens: np.ndarray, block_size: int, n_bytes: int | None = None, n_words: int | None = None):
        _check_long_enough(len(tokens), 1, "an evaluation split")
        if block_size < 1:
            raise DataError(f"block_size must be >= 1, got {block_size}")
        self.tokens, self.block_size = tokens, block_size  # (N,)
        self.n_bytes, self.n_words = n_bytes, n_words

    @property
    def n_targets(self) -> int:
        return len(self.tokens) - 1

    def __len__(self) -> int:
        return math.ceil(self.n_targets / self.block_size)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if not 0 <= i < len(self):
            raise IndexError(f"window {i} out of range({len(self)})")
        start = i * self.block_size
        chunk = torch.from_numpy(self.tokens[start : start + self.block_size + 1].astype(np.int64))  # (<=T+1,)
        x = torch.zeros(self.block_size, dtype=torch.int64)  # (T,)
        y = torch.full((self.block_size,), IGNORE_INDEX, dtype=torch.int64)  # (T,)
        x[: len(chunk) - 1] = chunk[:-1]
        y[: len(chunk) - 1] = chunk[1:]
        return x, y


class EvalShardSampler(DistributedSampler):
    """Rank ``r`` of ``W`` takes windows ``[r*n//W, (r+1)*n//W)``: contiguous, no padding, no repeats.

    It is a ``DistributedSampler`` so that Lightning keeps it instead of
    injecting its own (which pads by repeating windows).
    """

    def __init__(self, dataset: EvalWindows, rank: int = 0, world_size: int = 1) -> None:
        super().__init__(dataset, num_replicas=world_size, rank=rank, shuffle=False, drop_last=False)
        n = len(dataset)
        self.begin, self.end = rank * n // world_size, (rank + 1) * n // world_size

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.begin, self.end))

    def __len__(self) -> int:
        return self.end - self.begin
