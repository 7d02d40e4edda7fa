"""``TextDataModule``: the Lightning face of the data pipeline (built by LightningCLI from YAML)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from resnorm_lm.data.bins import Manifest, choose_dtype
from resnorm_lm.data.corpora import CORPORA
from resnorm_lm.data.errors import DataError
from resnorm_lm.data.prepare import PreparedData, prepare
from resnorm_lm.data.sampling import (
    EvalShardSampler,
    EvalWindows,
    ResumableBatchSampler,
    TrainBatchStream,
    TrainWindows,
)
from resnorm_lm.data.tokenizer import MIN_VOCAB

DEFAULT_DATA_SEED = 1337  # the data order of a data module made outside a run (a run's follows its seed), as of
# every run before data orders followed the seed


class TextDataModule(L.LightningDataModule):
    """Token windows of a corpus: infinite, resumable training batches; exact evaluation windows.

    Args:
        corpus: corpus name, one of ``CORPORA`` (shakespeare, wikitext-103, wikitext-2,
            tinystories, fineweb-edu, text).
        files: paths or globs of UTF-8 text files, only for ``corpus="text"``.
        vocab_size: byte-level BPE vocabulary size; every token id is < vocab_size (the model's
            embedding size). Tiny corpora may train fewer tokens.
        block_size: tokens per training/evaluation window (the model's context).
        batch_size: training windows per batch, per device.
        eval_batch_size: evaluation windows per batch; None uses ``batch_size``.
        num_workers: DataLoader worker processes.
        seed: data order seed; the order is a function of (seed, data epoch, rank, world size). None (the
            default): the run's seed (``seed_everything``, set by the command), so seed k sets both the init and
            the data order and runs of one seed see the same batches whatever the recipe; outside a run, 1337.
        cache_dir: data cache; None uses ``$RESNORM_LM_CACHE`` or ``~/.cache/resnorm-lm``.
        max_chars: character budget for streamed corpora (fineweb-edu); None uses the corpus default.
        dtype: token bin dtype: auto (uint16 when vocab_size <= 65536), uint16 or uint32.
        random_offset: shift window boundaries by a random offset each data epoch.

    The training position is derived, not stored: ``train_dataloader`` starts the
    sampler at ``trainer.global_step * trainer.accumulate_grad_batches`` batches,
    so resuming from a checkpoint continues the exact batch sequence.
    """

    def __init__(
        self,
        corpus: str = "shakespeare",
        files: list[str] | None = None,
        vocab_size: int = 8192,
        block_size: int = 256,
        batch_size: int = 16,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int | None = None,
        cache_dir: str | None = None,
        max_chars: int | None = None,
        dtype: str = "auto",
        random_offset: bool = True,
    ) -> None:
        super().__init__()
        corpus_cls = CORPORA.get(corpus)  # ValueError listing the valid corpora
        if files is not None and "files" not in corpus_cls.options:
            raise ValueError(f"data.files applies to data.corpus=text, not {corpus!r}")
        if corpus == "text" and not files:
            raise ValueError("data.corpus=text needs data.files: a list of paths or globs")
        if max_chars is not None and "max_chars" not in corpus_cls.options:
            raise ValueError(f"data.max_chars applies to streamed corpora (fineweb-edu), not {corpus!r}")
        if vocab_size < MIN_VOCAB:
            raise ValueError(f"data.vocab_size must be >= {MIN_VOCAB}, got {vocab_size}")
        try:
            choose_dtype(vocab_size, dtype)
        except DataError as e:
            raise ValueError(f"data.dtype: {e}") from None
        for name, value in (
            ("block_size", block_size),
            ("batch_size", batch_size),
            ("eval_batch_size", eval_batch_size),
        ):
            if value is not None and value < 1:
                raise ValueError(f"data.{name} must be >= 1, got {value}")
        if num_workers < 0:
            raise ValueError(f"data.num_workers must be >= 0, got {num_workers}")
        self.save_hyperparameters()
        self.corpus, self.files, self.vocab_size = corpus, files, vocab_size
        self.block_size, self.batch_size = block_size, batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers, self.cache_dir = num_workers, cache_dir
        self.seed = DEFAULT_DATA_SEED if seed is None else seed
        self.max_chars, self.dtype, self.random_offset = max_chars, dtype, random_offset
        self.prepared: PreparedData | None = None

    def _prepare(self, expected_fingerprint: str | None = None) -> PreparedData:
        return prepare(
            self.corpus,
            files=self.files,
            vocab_size=self.vocab_size,
            cache_dir=self.cache_dir,
            dtype=self.dtype,
            max_chars=self.max_chars,
            expected_fingerprint=expected_fingerprint,
        )

    def prepare_data(self) -> None:
        self._prepare()

    def setup_expecting(self, corpus_fingerprint: str | None) -> None:
        """``setup()`` for a checkpoint's data: a corpus whose documents no longer have the fingerprint the
        checkpoint records raises ``CorpusChangedError`` before any tokenizer is trained or bin written."""
        self.prepared = self._prepare(corpus_fingerprint)
        self.setup()

    def setup(self, stage: str | None = None) -> None:
        if self.prepared is None:
            self.prepared = self._prepare()  # a cache hit after prepare_data
        train_tokens = self.manifest.splits["train"].tokens
        if train_tokens < self.block_size + 1:
            raise DataError(
                f"the train split of corpus {self.corpus!r} has {train_tokens} tokens, fewer than one window of "
                f"block_size + 1 = {self.block_size + 1}; use a smaller data.block_size or a larger corpus"
            )

    # what the model and the metrics read
    @property
    def manifest(self) -> Manifest:
        if self.prepared is None:
            raise RuntimeError("TextDataModule.setup() has not run yet")
        return self.prepared.manifest

    def split_bytes(self, split: str) -> int:
        return self.manifest.splits[split].bytes

    def split_words(self, split: str) -> int:
        return self.manifest.splits[split].words

    def _placement(self) -> tuple[int, int, int]:
        """``(start_batch, rank, world_size)`` from the attached trainer (0, 0, 1 without one)."""
        trainer = self.trainer
        if trainer is None:
            return 0, 0, 1
        # every batch belongs to a global step, a skipped bad step's included: Lightning counts an optimizer
        # step whose training_step returned None, and a step masked on the device is a step
        start = trainer.global_step * trainer.accumulate_grad_batches
        return start, trainer.global_rank, trainer.world_size

    def _loader_kwargs(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "pin_memory": torch.cuda.is_available(),
            "persistent_workers": self.num_workers > 0,
            # a loader's own generator: creating an iterator must not draw from the global torch RNG,
            # or a resumed run (which creates its iterator after restoring RNG states) drifts from dropout on
            "generator": torch.Generator().manual_seed(self.seed),
        }

    def train_dataloader(self) -> DataLoader:
        tokens = self.prepared.tokens("train")
        start_batch, rank, world_size = self._placement()
        sampler = ResumableBatchSampler(
            len(tokens),
            self.block_size,
            self.batch_size,
            seed=self.seed,
            rank=rank,
            world_size=world_size,
            start_batch=start_batch,
            random_offset=self.random_offset,
        )
        stream = TrainBatchStream(TrainWindows(tokens, self.block_size), sampler)
        return DataLoader(stream, batch_size=None, **self._loader_kwargs())

    def eval_windows(self, split: str) -> EvalWindows:
        stats = self.manifest.splits[split]
        return EvalWindows(self.prepared.tokens(split), self.block_size, n_bytes=stats.bytes, n_words=stats.words)

    def _eval_dataloader(self, split: str) -> DataLoader:
        windows = self.eval_windows(split)
        _, rank, world_size = self._placement()
        sampler = EvalShardSampler(windows, rank=rank, world_size=world_size)
        return DataLoader(windows, batch_size=self.eval_batch_size, sampler=sampler, **self._loader_kwargs())

    def val_dataloader(self) -> DataLoader:
        return self._eval_dataloader("validation")

    def test_dataloader(self) -> DataLoader:
        return self._eval_dataloader("test")
