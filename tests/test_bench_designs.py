"""The designs benchmark's activation memory: what autograd keeps for the backward pass, each storage counted once,
the parameters left out (a widened stream does not change them)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.bench_designs import saved_for_backward_bytes
from resnorm_lm.model.gpt import GPT
from resnorm_lm.train.recipes import recipe_arch


class EmbedThenLinear(nn.Module):
    """Linear's backward keeps its input (B, T, C) and its weight; the embedding's keeps the token ids (B, T)."""

    def __init__(self, vocab: int = 50, width: int = 24):
        super().__init__()
        self.embed, self.linear = nn.Embedding(vocab, width), nn.Linear(width, width)

    def forward(self, idx, targets):
        x = self.embed(idx)  # (B, T, C)
        y = self.linear(x)  # (B, T, C)
        return y, y.sum()


def test_saved_bytes_are_the_activations_once_and_no_parameter():
    idx = torch.randint(50, (3, 7))
    saved = saved_for_backward_bytes(EmbedThenLinear(), idx)
    assert saved == 3 * 7 * 24 * 4 + 3 * 7 * 8  # the embedding's output (fp32) and the ids (int64); no weight


def saved(recipe: str, batch: int) -> int:
    torch.manual_seed(0)
    cfg = recipe_arch(recipe, "cpu")
    return saved_for_backward_bytes(GPT(cfg), torch.randint(cfg.vocab_size, (batch, 32)))


def test_a_gpt_saves_a_part_per_sequence_and_a_part_per_step():
    # the chunked loss computes the head's gradient in its forward and keeps it (V, C): the same at every batch
    one, two, three = (saved("prenorm-12l", b) for b in (1, 2, 3))
    assert three - two == two - one > 0


def test_hyper_connections_four_streams_cost_activation_memory():
    ratio = saved("hc-12l", 2) / saved("prenorm-12l", 2)
    assert 1.5 < ratio < 4.0
