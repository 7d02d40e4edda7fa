"""TextDataModule: names validated, loaders built from the cache, resume position from the trainer."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from resnorm_lm.data import TextDataModule
from resnorm_lm.targets import IGNORE_INDEX
from tests.smoke import make_documents, write_documents

VOCAB, BLOCK, BATCH = 400, 32, 4


@pytest.fixture
def module_args(tmp_path, monkeypatch):
    monkeypatch.setenv("RESNORM_LM_CACHE", str(tmp_path / "cache"))
    files = [str(p) for p in write_documents(tmp_path / "txt", make_documents(40))]
    return {"corpus": "text", "files": files, "vocab_size": VOCAB, "block_size": BLOCK, "batch_size": BATCH}


def ready(**kwargs) -> TextDataModule:
    dm = TextDataModule(**kwargs)
    dm.prepare_data()
    dm.setup("fit")
    return dm


def test_init_validates_names_and_sizes():
    with pytest.raises(ValueError, match="unknown corpus 'shakespear'; valid corpora: fineweb-edu, shakespeare"):
        TextDataModule(corpus="shakespear")
    with pytest.raises(ValueError, match="data.files applies to data.corpus=text"):
        TextDataModule(corpus="shakespeare", files=["a.txt"])
    with pytest.raises(ValueError, match="data.corpus=text needs data.files"):
        TextDataModule(corpus="text")
    with pytest.raises(ValueError, match="data.block_size must be >= 1"):
        TextDataModule(block_size=0)
    with pytest.raises(ValueError, match="does not fit uint16"):
        TextDataModule(vocab_size=70_000, dtype="uint16")
    assert TextDataModule().hparams.vocab_size == 8192  # LightningCLI-friendly defaults, nothing loaded yet


def test_loaders_from_a_prepared_corpus(module_args):
    dm = ready(**module_args, eval_batch_size=3)
    assert dm.vocab_size == VOCAB and dm.manifest.vocab_size <= VOCAB
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == y.shape == (BATCH, BLOCK) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1]) and int(x.max()) < VOCAB
    for split, loader in (("validation", dm.val_dataloader()), ("test", dm.test_dataloader())):
        targets = torch.cat([by[by != IGNORE_INDEX] for _, by in loader])
        assert targets.numel() == dm.manifest.splits[split].tokens - 1 == dm.eval_windows(split).n_targets
        assert dm.split_bytes(split) > 0 and dm.split_words(split) > 0
        assert next(iter(loader))[0].shape[0] == 3


def test_train_loader_starts_at_the_trainer_position(module_args):
    dm = ready(**module_args)
    head = [x for x, _ in itertools.islice(dm.train_dataloader(), 14)]
    dm.trainer = SimpleNamespace(global_step=5, accumulate_grad_batches=2, global_rank=0, world_size=1)
    resumed = [x for x, _ in itertools.islice(dm.train_dataloader(), 4)]
    assert all(torch.equal(a, b) for a, b in zip(resumed, head[10:14]))
    dm.trainer = SimpleNamespace(global_step=0, accumulate_grad_batches=1, global_rank=1, world_size=2)
    rank1 = next(iter(dm.train_dataloader()))[0]
    assert torch.equal(rank1, head[1])  # rank 1 takes the odd global batches


def test_corpus_shorter_than_a_window(module_args):
    from resnorm_lm.data import DataError

    with pytest.raises(DataError, match="train split of corpus 'text' has \\d+ tokens, fewer than one window"):
        ready(**{**module_args, "block_size": 1_000_000})


@pytest.mark.slow
def test_lightning_resume_sees_the_same_batches(module_args, tmp_path):
    import lightning as L

    class Recorder(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(VOCAB, 8)
            self.head = torch.nn.Linear(8, VOCAB)
            self.seen: list[torch.Tensor] = []

        def training_step(self, batch, batch_idx):
            x, y = batch
            self.seen.append(x.clone())
            logits = self.head(self.emb(x))  # (B, T, V)
            return torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(max_steps, ckpt_path=None):
        trainer = L.Trainer(
            max_steps=max_steps,
            accumulate_grad_batches=2,
            accelerator="cpu",
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        model = Recorder()
        trainer.fit(model, datamodule=TextDataModule(**module_args), ckpt_path=ckpt_path)
        return trainer, model.seen

    _, uninterrupted = fit(6)
    first, head = fit(3)
    first.save_checkpoint(tmp_path / "step3.ckpt")
    _, tail = fit(6, ckpt_path=tmp_path / "step3.ckpt")
    assert len(uninterrupted) == 12 and len(head) == len(tail) == 6
    assert all(torch.equal(a, b) for a, b in zip(head + tail, uninterrupted))
