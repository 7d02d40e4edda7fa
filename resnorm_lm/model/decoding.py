"""Sampling text from a trained model: temperature and top-k, one token at a time."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from resnorm_lm.model.gpt import GPT


@torch.no_grad()
def sample_tokens(
    model: GPT,
    prompt: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 50,
    generator: torch.Generator | None = None,
    greedy: bool = False,
) -> Iterator[int]:
    """Yield new token ids after ``prompt`` (1D ids), cropping the context to the block size; ``greedy``: the most
    likely token each time (temperature and top-k then mean nothing)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    was_training = model.training
    model.eval()
    idx = prompt.view(1, -1)  # (1, T)
    try:
        for _ in range(max_new_tokens):
            logits, _ = model(idx[:, -model.config.block_size :])  # (1, T, V)
            if greedy:
                next_id = logits[:, -1, :].argmax(dim=-1, keepdim=True)  # (1, 1)
                idx = torch.cat([idx, next_id], dim=1)
                yield int(next_id)
                continue
            logits = logits[:, -1, :].float() / temperature  # (1, V)
            if top_k is not None:
                kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            probs = torch.softmax(logits, dim=-1)
            next_id = torch.multinomial(probs, 1, generator=generator)  # (1, 1)
            idx = torch.cat([idx, next_id], dim=1)
            yield int(next_id)
    finally:
        model.train(was_training)


def stream_text(
    model: GPT,
    tokenizer,
    prompt_ids: list[int],
    max_new_tokens: int,
    temperature: float = 0.8,
    top_k: int | None = 50,
    generator: torch.Generator | None = None,
    greedy: bool = False,
) -> Iterator[str]:
    """The generated text piece by piece, holding back a multi-byte character until it is complete."""
    device = next(model.parameters()).device
    prompt = torch.tensor(prompt_ids, device=device)
    ids: list[int] = []
    shown = ""
    for token in sample_tokens(model, prompt, max_new_tokens, temperature, top_k, generator, greedy):
        ids.append(token)
        text = tokenizer.decode(ids, skip_special_tokens=False)
        if not text.endswith("\ufffd"):  # wait for the rest of a multi-byte character
            yield text[len(shown) :]
            shown = text
