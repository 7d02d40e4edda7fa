"""The GPT: shapes, causality, loss at init, gradient reach, every (norm x placement) pair."""

import math

import pytest
import torch

from resnorm_lm.model.gpt import GPT, GPTConfig, count_parameters, initial_loss
from resnorm_lm.model.norms import NORMS
from resnorm_lm.model.placements import PLACEMENTS

TINY = dict(vocab_size=97, block_size=16, n_layer=3, n_head=2, n_embd=32)


def tiny(**overrides):
    return GPT(GPTConfig(**{**TINY, **overrides}))


@pytest.mark.parametrize("placement", PLACEMENTS.names())
def test_output_shapes(placement):
    model = tiny(placement=placement)
    idx = torch.randint(0, 97, (3, 11))
    logits, loss = model(idx)
    assert logits.shape == (3, 11, 97) and loss is None
    _, loss = model(idx, torch.randint(0, 97, (3, 11)))
    assert loss.shape == ()


@pytest.mark.parametrize("placement", PLACEMENTS.names())
def test_causality(placement):
    """Changing token t never changes the logits before t."""
    model = tiny(placement=placement, dropout=0.0).eval()
    idx = torch.randint(0, 97, (2, 16))
    t = 9
    changed = idx.clone()
    changed[:, t] = (idx[:, t] + 1) % 97
    with torch.no_grad():
        a, _ = model(idx)
        b, _ = model(changed)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=0)
    assert (a[:, t] - b[:, t]).abs().max() > 0  # and it does change position t itself


@pytest.mark.parametrize("placement", PLACEMENTS.names())
def test_loss_near_log_vocab_at_init(placement):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=512, block_size=32, n_layer=4, n_head=4, n_embd=64, placement=placement))
    _, loss = model(torch.randint(0, 512, (8, 32)), torch.randint(0, 512, (8, 32)))
    assert loss.item() == pytest.approx(initial_loss(512), abs=0.1)  # what an untrained model should score


@pytest.mark.parametrize("placement", PLACEMENTS.names())
def test_gradients_reach_every_parameter(placement):
    model = tiny(placement=placement)
    # off the init: ReZero's gates, hyper-connections' dynamic scales and AttnRes's queries start at zero, where
    # they block the gradient of what they gate (their own gradient at init is tested beside each design)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    _, loss = model(torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16)))
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name} got no gradient"
        assert p.grad.abs().sum() > 0, f"{name} got a zero gradient"


def test_rezero_gates_get_gradient_at_init():
    model = tiny(placement="rezero")
    _, loss = model(torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16)))
    loss.backward()
    assert all(block.alpha.grad.abs().min() > 0 for block in model.blocks)


@pytest.mark.parametrize("norm", NORMS.names())
@pytest.mark.parametrize("placement", PLACEMENTS.names())
def test_every_norm_and_placement_pair_trains_a_step(norm, placement):
    torch.manual_seed(0)
    if not PLACEMENTS.get(placement).has_norms and norm not in ("layernorm", "none"):
        with pytest.raises(ValueError, match=f"placement {placement!r} has no norm, so norm={norm!r} would change"):
            tiny(norm=norm, placement=placement)
        return
    if NORMS.get(norm).needs_roles and not PLACEMENTS.get(placement).names_norm_roles:
        with pytest.raises(ValueError, match=f"placement {placement!r} does not say; use it with placement: .*prenorm"):
            tiny(norm=norm, placement=placement)
        return
    model = tiny(norm=norm, placement=placement, dropout=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx, tgt = torch.randint(0, 97, (4, 16)), torch.randint(0, 97, (4, 16))
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        _, loss = model(idx, tgt)
        assert torch.isfinite(loss), f"{placement}/{norm}: loss {loss.item()}"
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_bf16_autocast_forward_backward():
    model = tiny(placement="prenorm")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        _, loss = model(torch.randint(0, 97, (2, 16)), torch.randint(0, 97, (2, 16)))
    loss.backward()
    assert torch.isfinite(loss) and loss.dtype == torch.float32


def test_tied_embeddings_and_parameter_count():
    model = GPT(GPTConfig(vocab_size=100, block_size=8, n_layer=2, n_head=2, n_embd=16))
    assert model.lm_head.weight is model.wte.weight
    C, V, T, L = 16, 100, 8, 2
    per_block = (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C) + 2 * 2 * C
    total = V * C + T * C + L * per_block + 2 * C  # final LayerNorm of prenorm
    assert count_parameters(model) == total
    assert model.num_parameters() == total - T * C
    assert model.num_parameters(non_embedding=False) == total


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(n_embd=30, n_head=4), r"n_embd \(30\) must be divisible by n_head \(4\)"),
        (dict(block_size=0), "block_size must be a positive integer"),
        (dict(n_layer=-1), "n_layer must be a positive integer"),
        (dict(vocab_size=2.5), "vocab_size must be a positive integer"),
        (dict(dropout=1.0), r"dropout must be in \[0, 1\)"),
        (dict(norm_eps=0), "norm_eps must be > 0"),
        (
            dict(norm="group"),
            "unknown norm 'group'; valid norms: derf, dyt, dyt_llm, dyt_lnout, dyt_paper, dyt_paper_unscaled, "
            "dyt_rms_readout, layernorm",
        ),
        (dict(norm="dyt", norm_backend="triton"), "norm_backend 'triton' implements layernorm and rmsnorm, not 'dyt'"),
        # settings nothing would read: a placement without norms, a norm without an epsilon
        (dict(placement="rezero", norm="rmsnorm"), "placement 'rezero' has no norm, so norm='rmsnorm' would change"),
        (dict(placement="rezero_shared", norm_eps=1e-6), r"leave norm_eps at the default \(norm_eps=1e-05"),
        (dict(norm="dyt", norm_eps=1e-6), "norm 'dyt' has no epsilon, so norm_eps=1e-06 would change nothing"),
        (dict(norm="none", norm_eps=1e-3), "norm 'none' has no epsilon"),
    ],
)
def test_bad_config_gives_a_clear_error(overrides, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{**TINY, **overrides})


def test_sequence_longer_than_block_size_is_rejected():
    with pytest.raises(ValueError, match="sequence length 17 exceeds block_size 16"):
        tiny()(torch.zeros(1, 17, dtype=torch.long))


def test_dyt_llm_is_set_up_as_the_reference_llama_code_sets_it():
    """jiachenzhu/DyT other_tasks/LLaMA: alpha 0.8 before attention, 0.2 before the MLP and at the end, no bias,
    and a learnable scalar sqrt(d) on the embeddings; the project's own DyT keeps one alpha 0.5 and a bias."""
    model = tiny(norm="dyt_llm")
    for block in model.blocks:
        attn_norm, mlp_norm = block.attn_norm, block.mlp_norm
        assert (attn_norm.alpha.item(), mlp_norm.alpha.item()) == pytest.approx((0.8, 0.2))
        assert attn_norm.bias is None and mlp_norm.bias is None
    assert model.stream.final_norm.alpha.item() == pytest.approx(0.2)
    d = model.config.n_embd
    assert model.stream.embed_scale.gain.item() == pytest.approx(math.sqrt(d))
    idx = torch.randint(0, 97, (2, 9))
    pos = torch.arange(9)
    first_input = {}
    model.blocks[0].attn.register_forward_pre_hook(lambda m, args: first_input.setdefault("x", args[0]))
    model(idx)
    x = (model.wte(idx) + model.wpe(pos)) * math.sqrt(d)  # (B, T, C) the scaled embeddings
    expected = model.blocks[0].attn_norm.weight * torch.tanh(0.8 * x)
    torch.testing.assert_close(first_input["x"], expected)
    plain = tiny(norm="dyt")
    assert isinstance(plain.stream.embed_scale, torch.nn.Identity)
    assert {n.alpha.item() for b in plain.blocks for n in (b.attn_norm, b.mlp_norm)} == {0.5}


def test_dyt_lnout_keeps_dyt_in_the_blocks_and_a_layernorm_at_the_readout():
    from resnorm_lm.model.norms import DynamicTanh, LayerNorm

    model = tiny(norm="dyt_lnout")
    norms = [n for b in model.blocks for n in (b.attn_norm, b.mlp_norm)]
    assert all(type(n) is not LayerNorm and isinstance(n, DynamicTanh) for n in norms)
    assert type(model.stream.final_norm) is LayerNorm
    plain = tiny(norm="dyt")
    plain.stream.final_norm = LayerNorm(plain.config.n_embd)  # the same model built by hand: the same function
    plain.load_state_dict(model.state_dict())
    idx = torch.randint(0, 97, (2, 9))
    torch.testing.assert_close(model(idx)[0], plain(idx)[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="use it with placement: .*prenorm"):
        tiny(norm="dyt_lnout", placement="postnorm")
