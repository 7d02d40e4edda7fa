"""QK-norm, an option of the attention: each kind against its formula, and against transformers' OLMo 2 (over all
heads) and Qwen3 (per head) attention given the same weights; and OLMo 2's whole block (reordered norm, QK-norm)
against transformers' ``Olmo2DecoderLayer``."""

import math

import pytest
import torch

from resnorm_lm.model.gpt import GPT, GPTConfig
from resnorm_lm.model.layers import CausalSelfAttention

C, H = 16, 4


def attention(qk_norm: str, bias: bool = True) -> CausalSelfAttention:
    cfg = GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=H, n_embd=C, qk_norm=qk_norm, bias=bias)
    attn = CausalSelfAttention(cfg)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in attn.qk_norm.parameters():  # gains other than 1, so the test sees which one is used where
            p.uniform_(0.5, 1.5)
    return attn


def rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(hs)) v per head, masked to the past: q, k, v (B, T, C) -> (B, T, C)."""
    B, T, _ = q.shape
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, hs)
    scores = q @ k.transpose(-1, -2) / math.sqrt(C // H)  # (B, H, T, T)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)


@pytest.fixture
def x():
    return torch.randn(2, 6, C) * 2


def test_full_width_qk_norm_is_one_rmsnorm_over_all_heads(x):
    attn = attention("full")
    q, k, v = attn.c_attn(x).split(C, dim=2)
    q, k = rms(q, attn.qk_norm.q_norm.weight), rms(k, attn.qk_norm.k_norm.weight)  # over C, before the heads split
    torch.testing.assert_close(attn(x), attn.c_proj(causal_attention(q, k, v)))


def test_per_head_qk_norm_normalizes_each_head(x):
    attn = attention("per_head")
    q, k, v = attn.c_attn(x).split(C, dim=2)
    heads = (*x.shape[:2], H, C // H)
    q = rms(q.view(heads), attn.qk_norm.q_norm.weight).reshape(x.shape)  # over head_dim, one gain for every head
    k = rms(k.view(heads), attn.qk_norm.k_norm.weight).reshape(x.shape)
    torch.testing.assert_close(attn(x), attn.c_proj(causal_attention(q, k, v)))
    assert attn.qk_norm.q_norm.weight.shape == (C // H,)


def test_no_qk_norm_is_gpt2_attention_and_has_no_parameters(x):
    attn = attention("none")
    q, k, v = attn.c_attn(x).split(C, dim=2)
    torch.testing.assert_close(attn(x), attn.c_proj(causal_attention(q, k, v)))
    assert not list(attn.qk_norm.parameters())


def test_with_qk_norm_the_attention_pattern_does_not_change_with_the_input_scale(x):
    """What QK-norm is for: the attention logits no longer grow with the stream's scale. Without biases, queries
    and keys of 10x are normed back to the same, so the output is 10x (the values'); without QK-norm the softmax
    sharpens and it is not."""
    for kind in ("full", "per_head"):
        attn = attention(kind, bias=False)
        torch.testing.assert_close(attn(10 * x), 10 * attn(x), rtol=2e-3, atol=2e-3)  # eps: 4e-4 of mean(q^2)
    attn = attention("none", bias=False)
    assert not torch.allclose(attn(10 * x), 10 * attn(x), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("kind, module", [("full", "olmo2"), ("per_head", "qwen3")])
def test_transformers_attention_with_the_same_weights_agrees(x, kind, module):
    """OLMo 2's attention (q_norm over num_heads * head_dim) and Qwen3's (over head_dim), with their rotary
    embedding made the identity (cos 1, sin 0: this model's positions are learned), give this attention's output."""
    transformers = pytest.importorskip("transformers")
    if module == "olmo2":
        cfg = transformers.Olmo2Config(hidden_size=C, num_attention_heads=H, num_key_value_heads=H, rms_norm_eps=1e-5)
        theirs = transformers.models.olmo2.modeling_olmo2.Olmo2Attention(cfg, layer_idx=0)
    else:
        cfg = transformers.Qwen3Config(
            hidden_size=C, num_attention_heads=H, num_key_value_heads=H, head_dim=C // H, rms_norm_eps=1e-5
        )
        theirs = transformers.models.qwen3.modeling_qwen3.Qwen3Attention(cfg, layer_idx=0)
    cfg._attn_implementation = "sdpa"  # causal when no mask is given
    ours = attention(kind, bias=False)
    with torch.no_grad():
        for proj, rows in zip(("q_proj", "k_proj", "v_proj"), ours.c_attn.weight.split(C), strict=True):
            getattr(theirs, proj).weight.copy_(rows)
        theirs.o_proj.weight.copy_(ours.c_proj.weight)
        theirs.q_norm.weight.copy_(ours.qk_norm.q_norm.weight)
        theirs.k_norm.weight.copy_(ours.qk_norm.k_norm.weight)
    cos, sin = torch.ones(1, x.shape[1], C // H), torch.zeros(1, x.shape[1], C // H)
    out, _ = theirs(x, position_embeddings=(cos, sin), attention_mask=None)
    torch.testing.assert_close(ours(x), out)


def test_olmo2_block_is_transformers_olmo2_decoder_layer_given_the_same_weights(x):
    """recipe olmo2-12l's block (placement olmo2, RMSNorm, qk_norm full, no biases) against transformers'
    ``Olmo2DecoderLayer`` with the same weights: its own attention (rotary made the identity: this model's positions
    are learned), its own post-attention and post-feedforward RMSNorms and its residual adds; only its SwiGLU MLP
    is replaced by this model's GELU MLP (the MLP is not what the design is about)."""
    transformers = pytest.importorskip("transformers")
    from resnorm_lm.model.placements import ReorderedNorm

    arch = dict(placement="olmo2", norm="rmsnorm", qk_norm="full", bias=False)
    torch.manual_seed(1)
    block = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=H, n_embd=C, **arch)).blocks[0]
    assert isinstance(block, ReorderedNorm)
    with torch.no_grad():
        for p in block.parameters():  # every weight its own random value, norm gains away from 1 included
            p.copy_(torch.randn_like(p) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    cfg = transformers.Olmo2Config(hidden_size=C, num_attention_heads=H, num_key_value_heads=H, rms_norm_eps=1e-5)
    cfg._attn_implementation = "sdpa"  # causal when no mask is given
    theirs = transformers.models.olmo2.modeling_olmo2.Olmo2DecoderLayer(cfg, layer_idx=0)
    with torch.no_grad():
        attn = block.attn
        for proj, rows in zip(("q_proj", "k_proj", "v_proj"), attn.c_attn.weight.split(C), strict=True):
            getattr(theirs.self_attn, proj).weight.copy_(rows)
        theirs.self_attn.o_proj.weight.copy_(attn.c_proj.weight)
        theirs.self_attn.q_norm.weight.copy_(attn.qk_norm.q_norm.weight)
        theirs.self_attn.k_norm.weight.copy_(attn.qk_norm.k_norm.weight)
        theirs.post_attention_layernorm.weight.copy_(block.attn_norm.weight)
        theirs.post_feedforward_layernorm.weight.copy_(block.mlp_norm.weight)
    theirs.mlp = block.mlp
    cos, sin = torch.ones(1, x.shape[1], C // H), torch.zeros(1, x.shape[1], C // H)
    torch.testing.assert_close(block(x), theirs(x, position_embeddings=(cos, sin)))


def test_qk_norm_trains_with_every_kind_and_names_the_valid_kinds():
    for kind in ("none", "full", "per_head"):
        model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=2, n_head=2, n_embd=16, qk_norm=kind))
        idx = torch.randint(0, 64, (2, 8))
        _, loss = model(idx, idx)
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        if kind != "none":
            assert model.blocks[0].attn.qk_norm.q_norm.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="unknown qk_norm 'head'; valid qk_norms: full, none, per_head"):
        GPTConfig(qk_norm="head")
