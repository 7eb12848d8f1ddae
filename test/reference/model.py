"""PyTorch reference of the tptrain encoder-decoder Transformer.

Written from docs/model-and-export.md alone, so that it is an independent
oracle for the C implementation. The module tree mirrors the parameter names
of the export table (`embed.weight`, `encoder.layers.{i}.self_attn.q_proj.weight`,
...), so `load_state_dict(strict=True)` takes an exported `model.safetensors`
as it is. The output projection is tied to `embed.weight` and has no
parameter of its own. Everything is plain tensor code in whatever dtype the
module is cast to; the checker runs it in float64.
"""

import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from safetensors_io import load as load_safetensors

CONFIG_KEYS = ("d_model", "n_heads", "d_ff", "enc_layers", "dec_layers",
               "vocab_size", "max_len", "dropout", "label_smoothing",
               "activation", "ln_eps", "pad_id", "bos_id", "eos_id", "unk_id")


def sinusoidal_positions(length, d_model, dtype):
    """PE[p, 2i] = sin(p / 10000^(2i/C)), PE[p, 2i+1] = cos(p / 10000^(2i/C)).

    Computed in float64 and then cast, so the float64 oracle is exact to
    double rounding.
    """
    p = torch.arange(length, dtype=torch.float64)[:, None]
    k = torch.arange(d_model)
    expo = (k - k % 2).to(torch.float64) / d_model          # 2i/C for both 2i and 2i+1
    angle = p / torch.pow(torch.tensor(10000.0, dtype=torch.float64), expo)[None, :]
    pe = torch.where(k % 2 == 0, torch.sin(angle), torch.cos(angle))
    return pe.to(dtype)


def key_padding_mask(lengths, n_keys):
    """(B, n_keys) bool, True where key j >= lengths[b] (masked)."""
    j = torch.arange(n_keys, device=lengths.device)
    return j[None, :] >= lengths[:, None]


class Attention(nn.Module):
    """Multi-head attention with q/k/v/out projections, no dropout on probabilities."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        assert d_model % n_heads == 0, "d_model must be divisible by n_heads"
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, kv, mask):
        """x (B, Tq, C) queries, kv (B, Tk, C) keys/values,
        mask bool broadcastable to (B, 1, Tq, Tk), True = masked."""
        B, Tq, C = x.shape
        Tk = kv.shape[1]
        H, D = self.n_heads, self.head_dim
        # Head h is columns h*D .. (h+1)*D of the projected features.
        q = self.q_proj(x).view(B, Tq, H, D).transpose(1, 2)    # (B, H, Tq, D)
        k = self.k_proj(kv).view(B, Tk, H, D).transpose(1, 2)
        v = self.v_proj(kv).view(B, Tk, H, D).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(D)          # (B, H, Tq, Tk)
        # -inf before softmax gives masked keys probability exactly 0.
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        a = (probs @ v).transpose(1, 2).reshape(B, Tq, C)        # heads concatenated
        return self.out_proj(a)


class FeedForward(nn.Module):
    def __init__(self, d_model, d_ff, activation):
        super().__init__()
        if activation not in ("relu", "gelu"):
            raise ValueError(f"unknown activation '{activation}'")
        self.activation = activation
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        h = self.fc1(x)
        h = F.relu(h) if self.activation == "relu" else F.gelu(h)   # exact erf GELU
        return self.fc2(h)


class EncoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["d_model"]
        self.self_attn_ln = nn.LayerNorm(C, eps=cfg["ln_eps"])
        self.self_attn = Attention(C, cfg["n_heads"])
        self.ffn_ln = nn.LayerNorm(C, eps=cfg["ln_eps"])
        self.ffn = FeedForward(C, cfg["d_ff"], cfg["activation"])
        self.dropout = nn.Dropout(cfg["dropout"])

    def forward(self, x, self_mask):
        h = self.self_attn_ln(x)
        x = x + self.dropout(self.self_attn(h, h, self_mask))
        x = x + self.dropout(self.ffn(self.ffn_ln(x)))
        return x


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C = cfg["d_model"]
        self.self_attn_ln = nn.LayerNorm(C, eps=cfg["ln_eps"])
        self.self_attn = Attention(C, cfg["n_heads"])
        self.cross_attn_ln = nn.LayerNorm(C, eps=cfg["ln_eps"])
        self.cross_attn = Attention(C, cfg["n_heads"])
        self.ffn_ln = nn.LayerNorm(C, eps=cfg["ln_eps"])
        self.ffn = FeedForward(C, cfg["d_ff"], cfg["activation"])
        self.dropout = nn.Dropout(cfg["dropout"])

    def forward(self, y, enc_out, self_mask, cross_mask):
        h = self.self_attn_ln(y)
        y = y + self.dropout(self.self_attn(h, h, self_mask))
        y = y + self.dropout(self.cross_attn(self.cross_attn_ln(y), enc_out, cross_mask))
        y = y + self.dropout(self.ffn(self.ffn_ln(y)))
        return y


class Encoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg["enc_layers"]))
        self.final_ln = nn.LayerNorm(cfg["d_model"], eps=cfg["ln_eps"])


class Decoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg["dec_layers"]))
        self.final_ln = nn.LayerNorm(cfg["d_model"], eps=cfg["ln_eps"])


class Transformer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        missing = [k for k in CONFIG_KEYS if k not in cfg]
        if missing:
            raise ValueError(f"config lacks keys: {', '.join(missing)}")
        self.cfg = dict(cfg)
        self.embed = nn.Embedding(cfg["vocab_size"], cfg["d_model"])
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg)
        self.dropout = nn.Dropout(cfg["dropout"])

    def embed_tokens(self, tokens):
        """E[t] * sqrt(C) + PE[p], then dropout."""
        C = self.cfg["d_model"]
        T = tokens.shape[1]
        if T > self.cfg["max_len"]:
            raise ValueError(f"sequence length {T} exceeds max_len {self.cfg['max_len']}")
        w = self.embed.weight
        pe = sinusoidal_positions(T, C, w.dtype).to(w.device)
        return self.dropout(self.embed(tokens.long()) * math.sqrt(C) + pe[None])

    def forward(self, src, src_len, tgt_in, tgt_len):
        """Token ids src (B, S), tgt_in (B, T); lengths (B,). Returns logits (B, T, V)."""
        S, T = src.shape[1], tgt_in.shape[1]
        src_len, tgt_len = src_len.long(), tgt_len.long()

        # Masks are True where attention is forbidden; shaped (B, 1, Tq, Tk).
        src_keys = key_padding_mask(src_len, S)[:, None, None, :]
        tgt_keys = key_padding_mask(tgt_len, T)[:, None, None, :]
        causal = torch.ones(T, T, dtype=torch.bool, device=src.device).triu(1)
        dec_self_mask = tgt_keys | causal[None, None]

        x = self.embed_tokens(src)
        for layer in self.encoder.layers:
            x = layer(x, src_keys)
        enc_out = self.encoder.final_ln(x)

        y = self.embed_tokens(tgt_in)
        for layer in self.decoder.layers:
            y = layer(y, enc_out, dec_self_mask, src_keys)
        dec_out = self.decoder.final_ln(y)

        return dec_out @ self.embed.weight.t()      # tied output layer, no bias

    def loss(self, logits, tgt_out):
        return loss_fn(logits, tgt_out, self.cfg["pad_id"], self.cfg["label_smoothing"])


def loss_fn(logits, tgt_out, pad_id, label_smoothing):
    """Label-smoothed cross-entropy, mean over the non-padding target tokens."""
    V = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, V), tgt_out.reshape(-1).long(),
                           ignore_index=pad_id, label_smoothing=label_smoothing,
                           reduction="mean")


def load_config(export_dir):
    path = os.path.join(export_dir, "config.json")
    with open(path) as f:
        cfg = json.load(f)
    if cfg.get("format") != "tptrain-model" or cfg.get("format_version") != 1:
        raise ValueError(f"{path}: not a tptrain-model format_version 1 config "
                         f"(format={cfg.get('format')!r}, "
                         f"format_version={cfg.get('format_version')!r})")
    return cfg


def load_model(export_dir, dtype=torch.float32):
    """Build the model from `export_dir`/config.json and load
    `export_dir`/model.safetensors strictly; return it cast to `dtype`."""
    cfg = load_config(export_dir)
    path = os.path.join(export_dir, "model.safetensors")
    tensors, meta = load_safetensors(path)
    if "format" in meta and meta["format"] != "tptrain-model":
        raise ValueError(f"{path}: metadata format is {meta['format']!r}, "
                         f"expected 'tptrain-model'")
    bad = [n for n, t in tensors.items() if t.dtype != torch.float32]
    if bad:
        raise ValueError(f"{path}: tensors not float32: {', '.join(bad)}")
    model = Transformer(cfg)
    model.load_state_dict(tensors, strict=True)
    return model.to(dtype)
