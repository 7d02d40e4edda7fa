"""A GPT as other tools read it, and back: safetensors weights in a layout, and the JSON that rebuilds the model.

An exported folder holds ``model.safetensors`` (weights only: no pickle, nothing that runs when read) and
``resnorm_lm.json`` (this model's config and which layout the weights are in), plus, where transformers has the
same architecture, its ``config.json``:

* ``gpt2``: pre-norm with LayerNorm is GPT-2's function (``GPT2LMHeadModel``, with exact GELU: ``"activation_function":
  "gelu"``). GPT-2 keeps its Linear weights transposed (``Conv1D``, (in, out)) and always has biases: a model without
  biases is written with zero ones.
* ``opt``: post-norm with LayerNorm (eps 1e-5, the only one OPT has) is OPT with ``do_layer_norm_before: false``
  (as OPT-350m), which has no final norm either; its position table has two leading rows it never reads from
  position 0, and q, k and v are separate Linears.
* ``resnorm_lm``: every other placement or norm, in this package's own names; transformers has no architecture for
  it (``layout_for`` says why).

The head tied to the token embedding is not written twice; ``read`` restores it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import torch

from resnorm_lm.errors import ResnormError
from resnorm_lm.model.gpt import GPT, GPTConfig

WEIGHTS, CONFIG, HF_CONFIG = "model.safetensors", "resnorm_lm.json", "config.json"
FORMAT = 1  # of resnorm_lm.json
Tensors = dict[str, torch.Tensor]


class ExportError(ResnormError, ValueError):
    """A folder that is not a resnorm-lm export, or weights that do not fit the architecture it states."""


def layout_for(cfg: GPTConfig) -> tuple[str, str]:
    """The layout a model is exported in, and why (which transformers class reads it, or why none does)."""
    plain = cfg.norm == "layernorm" and cfg.qk_norm == "none"  # any init: weights are weights
    if plain and cfg.placement == "prenorm":
        return "gpt2", "pre-norm with LayerNorm: transformers' GPT2LMHeadModel computes this model's function"
    if plain and cfg.placement == "postnorm" and cfg.norm_eps == 1e-5:
        return "opt", "post-norm with LayerNorm: transformers' OPTForCausalLM (do_layer_norm_before false)"
    why = f"placement {cfg.placement!r} with norm {cfg.norm!r}"
    if cfg.qk_norm != "none":
        why += f" and qk_norm {cfg.qk_norm!r}"
    if cfg.placement == "postnorm" and cfg.norm == "layernorm":
        why += f" and norm_eps {cfg.norm_eps:g} (OPT's LayerNorm has eps 1e-5, fixed)"
    return "resnorm_lm", f"transformers has no architecture for {why}: the weights are in resnorm-lm's own names"


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32).contiguous().clone()


def _bias(linear_or_norm, size: int) -> torch.Tensor:
    return _f32(linear_or_norm.bias) if linear_or_norm.bias is not None else torch.zeros(size)


def gpt2_tensors(model: GPT) -> Tensors:
    cfg, C = model.config, model.config.n_embd
    out = {"transformer.wte.weight": _f32(model.wte.weight), "transformer.wpe.weight": _f32(model.wpe.weight)}
    for i, block in enumerate(model.blocks):
        p = f"transformer.h.{i}"
        for name, norm in (("ln_1", block.attn_norm), ("ln_2", block.mlp_norm)):
            out[f"{p}.{name}.weight"], out[f"{p}.{name}.bias"] = _f32(norm.weight), _bias(norm, C)
        for name, linear in (
            ("attn.c_attn", block.attn.c_attn),
            ("attn.c_proj", block.attn.c_proj),
            ("mlp.c_fc", block.mlp.c_fc),
            ("mlp.c_proj", block.mlp.c_proj),
        ):
            out[f"{p}.{name}.weight"] = _f32(linear.weight.t())  # Conv1D: (in, out)
            out[f"{p}.{name}.bias"] = _bias(linear, linear.out_features)
    final = model.stream.final_norm
    out["transformer.ln_f.weight"], out["transformer.ln_f.bias"] = _f32(final.weight), _bias(final, C)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = _f32(model.lm_head.weight)
    return out


def gpt2_state(tensors: Tensors, cfg: GPTConfig) -> Tensors:
    """``gpt2_tensors`` read back into this package's names."""
    state = {"wte.weight": tensors["transformer.wte.weight"], "wpe.weight": tensors["transformer.wpe.weight"]}
    for i in range(cfg.n_layer):
        p, q = f"transformer.h.{i}", f"stream.blocks.{i}"
        for theirs, ours in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
            state[f"{q}.{ours}.weight"] = tensors[f"{p}.{theirs}.weight"]
            if cfg.bias:
                state[f"{q}.{ours}.bias"] = tensors[f"{p}.{theirs}.bias"]
        for name in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"):
            state[f"{q}.{name}.weight"] = tensors[f"{p}.{name}.weight"].t()
            if cfg.bias:
                state[f"{q}.{name}.bias"] = tensors[f"{p}.{name}.bias"]
    state["stream.final_norm.weight"] = tensors["transformer.ln_f.weight"]
    if cfg.bias:
        state["stream.final_norm.bias"] = tensors["transformer.ln_f.bias"]
    state["lm_head.weight"] = state["wte.weight"] if cfg.tie_embeddings else tensors["lm_head.weight"]
    return state


def opt_tensors(model: GPT) -> Tensors:
    cfg, C, d = model.config, model.config.n_embd, "model.decoder"
    out = {
        f"{d}.embed_tokens.weight": _f32(model.wte.weight),
        f"{d}.embed_positions.weight": torch.cat([torch.zeros(2, C), _f32(model.wpe.weight)]),
    }
    for i, block in enumerate(model.blocks):
        p = f"{d}.layers.{i}"
        qkv = {"q_proj": slice(0, C), "k_proj": slice(C, 2 * C), "v_proj": slice(2 * C, 3 * C)}
        linears = {f"self_attn.{n}": (block.attn.c_attn.weight[s], block.attn.c_attn.bias) for n, s in qkv.items()}
        linears.update(
            {
                "self_attn.out_proj": (block.attn.c_proj.weight, block.attn.c_proj.bias),
                "fc1": (block.mlp.c_fc.weight, block.mlp.c_fc.bias),
                "fc2": (block.mlp.c_proj.weight, block.mlp.c_proj.bias),
            }
        )
        for name, (weight, bias) in linears.items():
            out[f"{p}.{name}.weight"] = _f32(weight)
            if cfg.bias:
                rows = qkv.get(name.removeprefix("self_attn."), slice(None))
                out[f"{p}.{name}.bias"] = _f32(bias[rows])
        for name, norm in (("self_attn_layer_norm", block.attn_norm), ("final_layer_norm", block.mlp_norm)):
            out[f"{p}.{name}.weight"], out[f"{p}.{name}.bias"] = _f32(norm.weight), _bias(norm, C)
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = _f32(model.lm_head.weight)
    return out


def opt_state(tensors: Tensors, cfg: GPTConfig) -> Tensors:
    """``opt_tensors`` read back into this package's names."""
    d = "model.decoder"
    state = {
        "wte.weight": tensors[f"{d}.embed_tokens.weight"],
        "wpe.weight": tensors[f"{d}.embed_positions.weight"][2:],
    }
    for i in range(cfg.n_layer):
        p, q = f"{d}.layers.{i}", f"stream.blocks.{i}"
        qkv = [f"{p}.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj")]
        state[f"{q}.attn.c_attn.weight"] = torch.cat([tensors[f"{n}.weight"] for n in qkv])
        for ours, theirs in (("attn.c_proj", "self_attn.out_proj"), ("mlp.c_fc", "fc1"), ("mlp.c_proj", "fc2")):
            state[f"{q}.{ours}.weight"] = tensors[f"{p}.{theirs}.weight"]
            if cfg.bias:
                state[f"{q}.{ours}.bias"] = tensors[f"{p}.{theirs}.bias"]
        if cfg.bias:
            state[f"{q}.attn.c_attn.bias"] = torch.cat([tensors[f"{n}.bias"] for n in qkv])
        for ours, theirs in (("attn_norm", "self_attn_layer_norm"), ("mlp_norm", "final_layer_norm")):
            state[f"{q}.{ours}.weight"] = tensors[f"{p}.{theirs}.weight"]
            if cfg.bias:
                state[f"{q}.{ours}.bias"] = tensors[f"{p}.{theirs}.bias"]
    state["lm_head.weight"] = state["wte.weight"] if cfg.tie_embeddings else tensors["lm_head.weight"]
    return state


def own_tensors(model: GPT) -> Tensors:
    state = {k: _f32(v) for k, v in model.state_dict().items()}
    if model.config.tie_embeddings:
        del state["lm_head.weight"]  # the token embedding's, restored on reading
    return state


def own_state(tensors: Tensors, cfg: GPTConfig) -> Tensors:
    return {**tensors, "lm_head.weight": tensors["wte.weight"]} if cfg.tie_embeddings else dict(tensors)


def hf_config(cfg: GPTConfig, layout: str, eot_id: int) -> dict[str, Any] | None:
    """transformers' config.json for the layouts it reads (None for resnorm-lm's own)."""
    common = {
        "vocab_size": cfg.vocab_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": eot_id,
        "eos_token_id": eot_id,
        "dtype": "float32",
        "torch_dtype": "float32",
    }
    if layout == "gpt2":
        return {
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_positions": cfg.block_size,
            "n_embd": cfg.n_embd,
            "n_layer": cfg.n_layer,
            "n_head": cfg.n_head,
            "n_inner": None,
            "activation_function": "gelu",  # exact GELU, as F.gelu: GPT-2's default gelu_new is tanh's
            "layer_norm_epsilon": cfg.norm_eps,
            "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.dropout,
            "scale_attn_weights": True,
            **common,
        }
    if layout == "opt":
        return {
            "architectures": ["OPTForCausalLM"],
            "model_type": "opt",
            "hidden_size": cfg.n_embd,
            "num_hidden_layers": cfg.n_layer,
            "num_attention_heads": cfg.n_head,
            "ffn_dim": 4 * cfg.n_embd,
            "max_position_embeddings": cfg.block_size,
            "do_layer_norm_before": False,
            "word_embed_proj_dim": cfg.n_embd,
            "activation_function": "gelu",
            "enable_bias": cfg.bias,
            "layer_norm_elementwise_affine": True,
            "dropout": cfg.dropout,
            "attention_dropout": cfg.dropout,
            "layerdrop": 0.0,
            "pad_token_id": None,
            **common,
        }
    return None


LAYOUTS = {"gpt2": (gpt2_tensors, gpt2_state), "opt": (opt_tensors, opt_state), "resnorm_lm": (own_tensors, own_state)}


def files(model: GPT, eot_id: int, extra: dict[str, Any]) -> tuple[str, dict[str, bytes]]:
    """The layout that fits ``model`` and the export's files, name -> content: the weights in that layout, this
    package's config (with ``extra``: the run, its data) and, where transformers reads the layout, its config and
    generation config."""
    from safetensors.torch import save

    layout, _ = layout_for(model.config)
    out = {WEIGHTS: save(LAYOUTS[layout][0](model), metadata={"format": "pt"})}  # transformers asks for "pt"
    texts = {CONFIG: {"format": FORMAT, "layout": layout, "arch": asdict(model.config), **extra}}
    hf = hf_config(model.config, layout, eot_id)
    if hf is not None:
        texts[HF_CONFIG] = hf
        texts["generation_config.json"] = {"bos_token_id": eot_id, "eos_token_id": eot_id, "pad_token_id": eot_id}
    out.update({name: (json.dumps(content, indent=2) + "\n").encode() for name, content in texts.items()})
    return layout, out


def is_export(path: Path) -> bool:
    return path.is_dir() and (path / CONFIG).is_file()


def read(folder: Path) -> tuple[GPTConfig, Tensors, dict[str, Any]]:
    """The model's config, its state dict in this package's names, and the rest of resnorm_lm.json. Weights are
    read by safetensors: data only, whatever the file holds."""
    if not is_export(folder):
        raise ExportError(f"{folder} is not a resnorm-lm export (no {CONFIG}): make one with resnorm-lm export")
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        meta = json.loads((folder / CONFIG).read_text())
        known = {f.name for f in fields(GPTConfig)}
        cfg = GPTConfig(**{k: v for k, v in meta["arch"].items() if k in known})
        unpack = LAYOUTS[meta["layout"]][1]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ExportError(f"{folder / CONFIG} is not a resnorm-lm export's config ({err})") from None
    try:
        tensors = load_file(str(folder / WEIGHTS))
        return cfg, unpack(tensors, cfg), meta
    except (OSError, SafetensorError, KeyError) as err:
        raise ExportError(f"{folder / WEIGHTS} does not hold this export's weights ({err})") from None


def load_model(folder: Path) -> tuple[GPT, dict[str, Any]]:
    """The exported GPT, built from its config and loaded strictly, and resnorm_lm.json's other facts."""
    cfg, state, meta = read(folder)
    model = GPT(cfg)
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ExportError(f"{folder}: the weights do not fit the architecture it states: {str(err)[:300]}") from None
    return model, meta
