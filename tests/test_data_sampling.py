"""Training windows and the resumable, sharded sampler; evaluation windows and their shards."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from resnorm_lm.data import (
    DataError,
    EvalShardSampler,
    EvalWindows,
    ResumableBatchSampler,
    TrainBatchStream,
    TrainWindows,
)
from resnorm_lm.targets import IGNORE_INDEX

N, T, B = 1000, 16, 4  # tokens, block size, batch size: 61 windows with offsets, 15 batches an epoch


def take(sampler, n):
    return list(itertools.islice(iter(sampler), n))


def test_train_windows_shift_by_one():
    tokens = np.arange(50, dtype=np.uint16)
    windows = TrainWindows(tokens, block_size=8)
    x, y = windows[5]
    assert x.dtype == y.dtype == torch.int64 and x.shape == y.shape == (8,)
    assert x.tolist() == list(range(5, 13)) and y.tolist() == list(range(6, 14))
    assert len(windows) == 42  # last start 41 reads tokens 41..49
    bx, by = windows.batch([0, 41])
    assert bx.shape == (2, 8) and by[1, -1] == 49 and torch.equal(bx[1], windows[41][0])


def test_order_is_a_function_of_seed_and_epoch():
    a, b = ResumableBatchSampler(N, T, B, seed=1), ResumableBatchSampler(N, T, B, seed=1)
    assert a.n_windows == 61 and a.batches_per_epoch == 15
    assert take(a, 40) == take(b, 40)
    assert take(ResumableBatchSampler(N, T, B, seed=2), 15) != take(a, 15)
    (_, order0), (_, order1) = a.epoch_windows(0), a.epoch_windows(1)
    assert sorted(order0.tolist()) == sorted(order1.tolist()) == list(range(61)) and not torch.equal(order0, order1)
    offsets = {a.epoch_windows(e)[0] for e in range(20)}
    assert len(offsets) > 1 and all(0 <= o < T for o in offsets)


def test_an_epoch_visits_distinct_windows_that_fit():
    sampler = ResumableBatchSampler(N, T, B, seed=3)
    offset, _ = sampler.epoch_windows(0)
    starts = [s for batch in take(sampler, sampler.batches_per_epoch) for s in batch]
    assert len(starts) == len(set(starts)) == 60  # 61 windows, the remainder that fills no batch dropped
    assert all((s - offset) % T == 0 and 0 <= s <= N - T - 1 for s in starts)
    no_offset = ResumableBatchSampler(N, T, B, seed=3, random_offset=False)
    assert no_offset.n_windows == (N - 1) // T and all(s % T == 0 for b in take(no_offset, 15) for s in b)


@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_are_disjoint_and_cover_the_epoch(world_size):
    single = ResumableBatchSampler(N, T, B, seed=5)
    shards = [ResumableBatchSampler(N, T, B, seed=5, rank=r, world_size=world_size) for r in range(world_size)]
    per_rank = shards[0].batches_per_epoch
    assert per_rank == 61 // (B * world_size)
    batches = [take(s, per_rank) for s in shards]
    flat = [tuple(b) for rank_batches in batches for b in rank_batches]
    assert len(set(flat)) == len(flat)  # disjoint
    assert len({s for b in flat for s in b}) == B * len(flat)
    # global batch g of the epoch is rank g % world_size's batch g // world_size
    expected = take(single, per_rank * world_size)
    assert [batches[g % world_size][g // world_size] for g in range(per_rank * world_size)] == expected


@pytest.mark.parametrize("world_size,rank", [(1, 0), (2, 1)])
def test_resume_continues_the_uninterrupted_sequence(world_size, rank):
    def sampler(start_batch):
        return ResumableBatchSampler(N, T, B, seed=9, rank=rank, world_size=world_size, start_batch=start_batch)

    per_epoch = sampler(0).batches_per_epoch
    full = take(sampler(0), 4 * per_epoch)
    for k in (1, per_epoch // 2, per_epoch - 1, per_epoch, per_epoch + 1, 2 * per_epoch + 3):
        assert take(sampler(k), 8) == full[k : k + 8], f"resume at batch {k}"
    assert sampler(0).position(per_epoch) == (1, 0) and sampler(0).position(2 * per_epoch + 3) == (2, 3)


def test_sampler_state_dict_round_trip():
    sampler = ResumableBatchSampler(N, T, B, seed=4)
    head = take(sampler, 7)
    state = sampler.state_dict()
    assert state["start_batch"] == 7
    fresh = ResumableBatchSampler(N, T, B, seed=0)
    fresh.load_state_dict(state)
    assert head + take(fresh, 5) == take(ResumableBatchSampler(N, T, B, seed=4), 12)


def test_stream_keeps_sampler_order_across_workers():
    tokens = np.random.default_rng(0).integers(0, 300, N).astype(np.uint16)
    windows = TrainWindows(tokens, T)
    stream = TrainBatchStream(windows, ResumableBatchSampler(N, T, B, seed=6))
    assert isinstance(stream, IterableDataset)  # Lightning never injects a sampler into it
    expected = [windows.batch(s) for s in take(ResumableBatchSampler(N, T, B, seed=6), 6)]
    loader = DataLoader(stream, batch_size=None, num_workers=2)
    got = list(itertools.islice(loader, 6))
    assert all(torch.equal(gx, ex) and torch.equal(gy, ey) for (gx, gy), (ex, ey) in zip(got, expected))
    assert got[0][0].shape == (B, T)


def test_train_errors_are_clear():
    with pytest.raises(DataError, match="fewer than one window of block_size \\+ 1 = 17"):
        TrainWindows(np.zeros(16, dtype=np.uint16), 16)
    with pytest.raises(DataError, match="fewer than one window"):
        ResumableBatchSampler(10, 16, 2)
    with pytest.raises(DataError, match="fewer than one batch per rank"):
        ResumableBatchSampler(100, 16, 4, world_size=2)
    with pytest.raises(ValueError, match="0 <= rank < world_size"):
        ResumableBatchSampler(N, T, B, rank=2, world_size=2)


@pytest.mark.parametrize("n_tokens", [2, 17, 160, 161, 162, 1000])
def test_eval_windows_cover_every_target_once(n_tokens):
    tokens = np.arange(n_tokens, dtype=np.uint32) % 251
    windows = EvalWindows(tokens, block_size=16, n_bytes=123, n_words=45)
    assert windows.n_targets == n_tokens - 1 and len(windows) == -(-(n_tokens - 1) // 16)
    xs, ys = zip(*(windows[i] for i in range(len(windows))))
    x, y = torch.cat(xs), torch.cat(ys)  # (len * 16,)
    keep = y != IGNORE_INDEX
    assert int(keep.sum()) == n_tokens - 1
    assert y[keep].tolist() == tokens[1:].tolist() and x[keep].tolist() == tokens[:-1].tolist()
    assert keep.tolist() == sorted(keep.tolist(), reverse=True)  # padding only at the very end
    assert (windows.n_bytes, windows.n_words) == (123, 45)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_eval_shards_split_windows_without_repeats(world_size):
    windows = EvalWindows(np.arange(100, dtype=np.uint16), block_size=16)  # 7 windows
    shards = [EvalShardSampler(windows, rank=r, world_size=world_size) for r in range(world_size)]
    assert all(isinstance(s, DistributedSampler) for s in shards)  # so Lightning keeps them
    indices = [i for s in shards for i in s]
    assert indices == list(range(len(windows))) and sum(len(s) for s in shards) == len(windows)


def test_eval_split_too_short():
    with pytest.raises(DataError, match="an evaluation split has 1 tokens"):
        EvalWindows(np.zeros(1, dtype=np.uint16), 16)
