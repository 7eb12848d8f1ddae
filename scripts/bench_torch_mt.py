#!/usr/bin/python3
"""The PyTorch side of scripts/bench_gpu.sh: tptrain's model as a PyTorch
user writes it, trained on the very batches a tptrain run read, and the
figures both are judged by.

    bench_torch_mt.py run BATCHES --mode eager|compile [--device D] [--dtype bf16|fp32]
                          [--warmup N] [--sdpa B,B,...] [--init EXPORT_DIR] [--loss-out FILE]
    bench_torch_mt.py tptrain BATCHES METRICS --warmup N [--dtype D]
    bench_torch_mt.py table RESULTS.jsonl

BATCHES is what `train_mt --dump-batches` wrote (safetensors: the model
config in its metadata, step<N>.<i>.{src,src_len,tgt_in,tgt_out,tgt_len}).
`run` trains the PyTorch model on them once per attention backend asked for
and prints one JSON line per backend; `tptrain`
prints the same line for a tptrain run from its --metrics file (log interval
1); `table` turns such lines into the markdown table of docs/gpu-benchmark.md.

The model is what a PyTorch user would write for this architecture, not a
transcription of tptrain: pre-LN encoder-decoder, tied embedding and output
layer, sinusoidal positions, scaled_dot_product_attention (the decoder's
self-attention causal only: with right padding no real query sees a padded
key; the encoder's and cross attention with a key-padding mask), label-smoothed
cross-entropy, bf16 autocast, fused AdamW, gradient clipping, the batches in
pinned memory and copied without blocking. Its parameter names are those of
tptrain's export, so `--init` starts it from a tptrain model, and
test/test_bench_torch.sh holds it to the float64 reference of
test/reference/model.py on the same weights and batch.

PyTorch at its best: each backend of scaled_dot_product_attention asked for
(--sdpa: auto, PyTorch's own choice per call; flash, efficient, cudnn, math;
through torch.nn.attention.sdpa_kernel on PyTorch >= 2.3, the older
torch.backends.cuda.sdp_kernel flags before) runs as its own trial on a fresh
model (same seed); a backend PyTorch lacks, or one that refuses the masks,
gets a row that says so. --mode compile compiles the model with
dynamic=True (batch and lengths symbolic: one graph for every shape), or as
--dynamic asks: auto (PyTorch's default: static, then what changes made
symbolic) or batch (the batch dimension symbolic, a graph per bucketed
length pair; see compiled_step). Before
timing, every distinct batch shape of the dump runs one full step (the
shape warm-up: compilation, cuDNN plans, allocator growth), then the weights
are restored and the optimizer made anew, so the timed run starts where an
untouched one would. Before PyTorch 2.0 there is no SDPA: the attention is
written out (backend "manual").

Timing: after the shape warm-up, the first --warmup steps are left out as
on tptrain's side; the rest are timed as one window between two device
synchronisations, as tptrain's are between two of its per-step metric
records. Each row also reports the shape warm-up's seconds (compile_s: the
first call's, which compiles) and first_step_s: from the process's start to
the end of its first step (for a later trial in the same process, the
process's set-up plus that trial's own time to its first step). Tokens are the
batch's target tokens (the count the loss is averaged over, tptrain's
tokens_per_s); FLOPs are those of flops_per_step below, the same for both.
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "reference"))
from safetensors_io import load as load_safetensors  # noqa: E402

FIELDS = ("src", "src_len", "tgt_in", "tgt_out", "tgt_len")
# Dense bf16 tensor-core peaks (TFLOP/s) by device name, for MFU; the H100
# and H200 SXM parts share the 989.4 figure, the H100 PCIe card has 756.
# BENCH_PEAK_TFLOPS overrides (any other device, or fp32 runs).
PEAK_BF16_TFLOPS = (("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0))
# AdamW and schedule as tptrain's defaults (transformer/optim.c); the values
# change no timing, they keep both runs doing the same arithmetic.
BETAS, EPS, WEIGHT_DECAY, CLIP_NORM = (0.9, 0.98), 1e-9, 0.01, 1.0


def load_batches(path):
    tensors, meta = load_safetensors(path)
    if meta.get("format") != "tptrain-batches" or meta.get("format_version") != "1":
        raise SystemExit(f"{path}: not a tptrain-batches version 1 file (train_mt --dump-batches writes them)")
    cfg = json.loads(meta["config"])
    first, steps, micro = int(meta["first_step"]), int(meta["steps"]), int(meta["micro_batches"])
    batches = []
    for s in range(first, first + steps):
        for i in range(micro):
            try:
                batches.append({f: tensors[f"step{s}.{i}.{f}"] for f in FIELDS})
            except KeyError as e:
                raise SystemExit(f"{path}: tensor {e.args[0]} is missing") from None
    return cfg, batches, micro


def flops_per_step(cfg, batches):
    """Model FLOPs of one training step (forward + backward = 3 x forward) on
    the padded shapes: 2 per multiply-add of every matrix product, attention
    scores and their weighted sum counted over all T x T (or T x S) pairs,
    causal or not (the PaLM/Megatron convention), the tied output layer
    included, element-wise work left out. Recomputation is not counted."""
    C, F_, V = cfg["d_model"], cfg["d_ff"], cfg["vocab_size"]
    total = 0.0
    for b in batches:
        B, S = b["src"].shape
        T = b["tgt_in"].shape[1]
        enc = 2 * B * S * (4 * C * C + 2 * C * F_) + 4 * B * S * S * C
        dec = (2 * B * T * (4 * C * C + 2 * C * C + 2 * C * F_) + 2 * B * S * 2 * C * C
               + 4 * B * T * T * C + 4 * B * T * S * C)
        total += 3.0 * (cfg["enc_layers"] * enc + cfg["dec_layers"] * dec + 2 * B * T * C * V)
    return total


def target_tokens(batches):
    return int(sum(int(b["tgt_len"].sum()) for b in batches))


def sinusoidal(length, d_model, dtype=torch.float32):
    p = torch.arange(length, dtype=torch.float64)[:, None]
    k = torch.arange(d_model)
    angle = p / torch.pow(10000.0, (k - k % 2).to(torch.float64) / d_model)[None, :]
    return torch.where(k % 2 == 0, torch.sin(angle), torch.cos(angle)).to(dtype)


def attend(q, k, v, key_mask, causal):
    """q (B, H, Tq, D), k/v (B, H, Tk, D); key_mask (B, 1, 1, Tk) True = attend."""
    if hasattr(F, "scaled_dot_product_attention"):
        if causal:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # PyTorch before 2.0
    if causal:
        n = scores.shape[-1]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    else:
        scores = scores.masked_fill(~key_mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


SDPA_NAMES = ("auto", "flash", "efficient", "cudnn", "math")


def sdpa_context(name):
    """(a context manager factory restricting SDPA to backend `name`, None) or
    (None, why it cannot be had on this PyTorch). "auto" is PyTorch's own
    choice; "manual" the written-out attention of PyTorch before 2.0."""
    import contextlib
    if not hasattr(F, "scaled_dot_product_attention"):
        if name == "manual":
            return contextlib.nullcontext, None
        return None, f"PyTorch {torch.__version__} has no scaled_dot_product_attention"
    if name == "auto":
        return contextlib.nullcontext, None
    try:  # PyTorch >= 2.3
        from torch.nn.attention import SDPBackend, sdpa_kernel
        enum = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
                "math": "MATH"}.get(name)
        if enum is None or not hasattr(SDPBackend, enum):
            return None, f"PyTorch {torch.__version__} has no SDPA backend {name}"
        return (lambda: sdpa_kernel(getattr(SDPBackend, enum))), None
    except ImportError:
        pass
    flags = {"flash": "enable_flash", "efficient": "enable_mem_efficient", "math": "enable_math"}
    if name not in flags or not hasattr(torch.backends.cuda, "sdp_kernel"):
        return None, f"PyTorch {torch.__version__} has no SDPA backend {name}"
    kw = {f: f == flags[name] for f in flags.values()}
    return (lambda: torch.backends.cuda.sdp_kernel(**kw)), None


class Attention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.q_proj, self.k_proj = nn.Linear(C, C), nn.Linear(C, C, bias=False)
        self.v_proj, self.out_proj = nn.Linear(C, C), nn.Linear(C, C)

    def forward(self, x, kv, key_mask=None, causal=False):
        B, Tq, C = x.shape
        heads = lambda t: t.view(B, -1, self.H, C // self.H).transpose(1, 2)  # noqa: E731
        a = attend(heads(self.q_proj(x)), heads(self.k_proj(kv)), heads(self.v_proj(kv)), key_mask, causal)
        return self.out_proj(a.transpose(1, 2).reshape(B, Tq, C))


class FeedForward(nn.Module):
    def __init__(self, C, F_, activation):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(C, F_), nn.Linear(F_, C)
        self.act = F.relu if activation == "relu" else F.gelu

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, eps = cfg["d_model"], cfg["ln_eps"]
        self.self_attn_ln, self.self_attn = nn.LayerNorm(C, eps=eps), Attention(C, cfg["n_heads"])
        self.ffn_ln, self.ffn = nn.LayerNorm(C, eps=eps), FeedForward(C, cfg["d_ff"], cfg["activation"])
        self.drop = nn.Dropout(cfg["dropout"])

    def forward(self, x, src_mask):
        h = self.self_attn_ln(x)
        x = x + self.drop(self.self_attn(h, h, src_mask))
        return x + self.drop(self.ffn(self.ffn_ln(x)))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        C, eps, H = cfg["d_model"], cfg["ln_eps"], cfg["n_heads"]
        self.self_attn_ln, self.self_attn = nn.LayerNorm(C, eps=eps), Attention(C, H)
        self.cross_attn_ln, self.cross_attn = nn.LayerNorm(C, eps=eps), Attention(C, H)
        self.ffn_ln, self.ffn = nn.LayerNorm(C, eps=eps), FeedForward(C, cfg["d_ff"], cfg["activation"])
        self.drop = nn.Dropout(cfg["dropout"])

    def forward(self, y, memory, src_mask):
        h = self.self_attn_ln(y)
        y = y + self.drop(self.self_attn(h, h, causal=True))
        y = y + self.drop(self.cross_attn(self.cross_attn_ln(y), memory, src_mask))
        return y + self.drop(self.ffn(self.ffn_ln(y)))


class Stack(nn.Module):
    def __init__(self, layer, n, cfg):
        super().__init__()
        self.layers = nn.ModuleList(layer(cfg) for _ in range(n))
        self.final_ln = nn.LayerNorm(cfg["d_model"], eps=cfg["ln_eps"])


class Seq2Seq(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg["vocab_size"], cfg["d_model"])
        nn.init.normal_(self.embed.weight, std=cfg["d_model"] ** -0.5)
        self.encoder = Stack(EncoderLayer, cfg["enc_layers"], cfg)
        self.decoder = Stack(DecoderLayer, cfg["dec_layers"], cfg)
        self.drop = nn.Dropout(cfg["dropout"])
        self.register_buffer("pe", sinusoidal(cfg["max_len"], cfg["d_model"]), persistent=False)

    def embed_tokens(self, ids):
        return self.drop(self.embed(ids) * math.sqrt(self.cfg["d_model"]) + self.pe[: ids.shape[1]])

    def forward(self, src, src_len, tgt_in, tgt_out):
        src_mask = (torch.arange(src.shape[1], device=src.device)[None, :] < src_len[:, None])[:, None, None, :]
        x = self.embed_tokens(src)
        for layer in self.encoder.layers:
            x = layer(x, src_mask)
        memory = self.encoder.final_ln(x)
        y = self.embed_tokens(tgt_in)
        for layer in self.decoder.layers:
            y = layer(y, memory, src_mask)
        logits = F.linear(self.decoder.final_ln(y), self.embed.weight)
        return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=self.cfg["pad_id"],
                               label_smoothing=self.cfg["label_smoothing"])


def make_optimizer(params, device):
    for kw in ({"fused": True}, {"foreach": True}, {}):  # the fastest the installed PyTorch offers
        if kw.get("fused") and device.type != "cuda":
            continue
        try:
            return torch.optim.AdamW(params, lr=1e-4, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY, **kw), kw
        except (TypeError, RuntimeError):
            continue
    raise SystemExit("bench_torch_mt: no AdamW")


def device_batches(batches, device):
    pin = device.type == "cuda"
    out = []
    for b in batches:
        out.append({f: (b[f].long().pin_memory() if pin else b[f].long()) for f in FIELDS})
    return out


def process_age_s():
    """Seconds since this process started (Linux /proc; the same clock as
    train_mt's since_launch_s), or None."""
    try:
        with open("/proc/self/stat") as f:
            start = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return up - start / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def distinct_shapes(batches):
    """Index of the first batch of each distinct (B, S, T), in order of first appearance."""
    seen = {}
    for i, b in enumerate(batches):
        seen.setdefault((tuple(b["src"].shape), tuple(b["tgt_in"].shape)), i)
    return list(seen.values())


def make_model(a, cfg, device):
    torch.manual_seed(1)
    model = Seq2Seq(cfg)
    if a.init:
        tensors, _ = load_safetensors(os.path.join(a.init, "model.safetensors"))
        model.load_state_dict(tensors, strict=True)
    if a.dropout is not None:
        for mod in model.modules():
            if isinstance(mod, nn.Dropout):
                mod.p = a.dropout
    return model.to(device)


def train_steps(step_fn, model, opt, host, steps, micro, tok, device, amp, lr, losses=None):
    """One optimizer step per entry of `steps` (micro-batch indices into host)."""
    for s in steps:
        n_tok = sum(tok[i] for i in s)
        for i in s:
            b = {f: t.to(device, non_blocking=True) for f, t in host[i].items()}
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
                loss = step_fn(b["src"], b["src_len"], b["tgt_in"], b["tgt_out"])
            (loss * (tok[i] / n_tok)).backward()  # mean over the step's tokens, as tptrain's
            if losses is not None:
                losses.append(loss.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        opt.zero_grad(set_to_none=True)


def compiled_step(a, model, batches):
    """torch.compile as --dynamic asks: "true", every dimension symbolic (one
    graph for all shapes); "auto", PyTorch's default (static first, then the
    dimensions seen to change made symbolic: two compilations); "batch", the
    batch dimension alone symbolic (mark_dynamic) and the lengths static, a
    graph per distinct (S, T), which bucketed lengths keep few: the recompile
    limit is raised to that count so no shape falls back to eager.
    --compile-scope layers compiles each encoder and decoder layer instead of
    the whole model (PyTorch's regional compilation: the layers of a kind
    share one graph, so compiling costs a layer's time, not the model's; the
    embedding, the output layer and the loss run eagerly)."""
    layers = list(model.encoder.layers) + list(model.decoder.layers)
    if a.dynamic in ("true", "auto"):
        dyn = True if a.dynamic == "true" else None
        if a.compile_scope == "model":
            return torch.compile(model, dynamic=dyn)
        for layer in layers:  # regional compilation: one graph that every layer of a kind reuses
            layer.compile(dynamic=dyn)
        return model
    cfg = torch._dynamo.config
    cfg.automatic_dynamic_shapes = False  # a length that changes recompiles, it does not go symbolic
    n_graphs = len({(tuple(b["src"].shape)[1:], tuple(b["tgt_in"].shape)[1:]) for b in batches}) + 8
    for name in ("cache_size_limit", "recompile_limit"):  # renamed in later PyTorch
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), n_graphs))
    if a.compile_scope == "layers":
        for layer in layers:
            layer.compile()
        compiled = model
    else:
        compiled = torch.compile(model)

    def step(src, src_len, tgt_in, tgt_out):
        for t in (src, src_len, tgt_in, tgt_out):
            torch._dynamo.mark_dynamic(t, 0)
        return compiled(src, src_len, tgt_in, tgt_out)
    return step


def row_mode(a):
    """The row's mode: "compile" for dynamic=True of the whole model (the
    earlier rows'), else named by its dynamic shapes and scope."""
    if a.mode == "eager":
        return a.mode
    return ("compile" + ("" if a.dynamic == "true" else f" dynamic={a.dynamic}")
            + (" per layer" if a.compile_scope == "layers" else ""))


def trial(a, cfg, batches, micro, device, backend, t_setup):
    """One backend's run: shape warm-up, restore, timed window. Returns its row."""
    ctx, why = sdpa_context(backend)
    if ctx is None:
        return {"framework": "pytorch", "mode": row_mode(a), "backend": backend, "unavailable": why}
    t_begin = time.perf_counter()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    amp = a.dtype == "bf16"
    model = make_model(a, cfg, device)
    opt, opt_kind = make_optimizer(model.parameters(), device)
    step_fn = compiled_step(a, model, batches) if a.mode == "compile" else model
    host = device_batches(batches, device)
    tok = [int(b["tgt_len"].sum()) for b in host]  # host-side, once: no device sync in the timed loop
    n_steps = len(host) // micro
    steps = [list(range(s * micro, (s + 1) * micro)) for s in range(n_steps)]
    shapes = distinct_shapes(batches)
    saved = {k: v.detach().clone() for k, v in model.state_dict().items()}
    t0 = time.perf_counter()
    try:
        with ctx():
            train_steps(step_fn, model, opt, host, [[shapes[0]]], micro, tok, device, amp, a.lr)
            sync()
            t_first = time.perf_counter() - t0  # the first call: compilation, plans
            t_launch_first = time.perf_counter() - t_begin
            train_steps(step_fn, model, opt, host, [[i] for i in shapes[1:]], micro, tok, device, amp, a.lr)
            sync()
            t_shapes = time.perf_counter() - t0
            with torch.no_grad():  # the timed run starts from the initial weights and a fresh optimizer
                for k, v in model.state_dict().items():
                    v.copy_(saved[k])
            opt.zero_grad(set_to_none=True)
            del opt
            opt, _ = make_optimizer(model.parameters(), device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            losses = []
            train_steps(step_fn, model, opt, host, steps[:a.warmup], micro, tok, device, amp, a.lr, losses)
            sync()
            t1 = time.perf_counter()
            train_steps(step_fn, model, opt, host, steps[a.warmup:], micro, tok, device, amp, a.lr, losses)
            sync()
            window = time.perf_counter() - t1
    except RuntimeError as e:  # e.g. "No available kernel": the backend refuses these masks or shapes
        msg = " ".join(str(e).split())[:200]
        return {"framework": "pytorch", "mode": row_mode(a), "backend": backend, "rejected": msg}
    timed = batches[a.warmup * micro:]
    res = result("pytorch", row_mode(a), cfg, timed, n_steps - a.warmup, window, a.dtype, device)
    res.update(backend=backend, distinct_shapes=len(shapes), shape_warmup_s=round(t_shapes, 3),
               compile_s=round(t_first, 3) if a.mode == "compile" else None,
               first_step_s=round(t_setup + t_launch_first, 3) if t_setup is not None else None,
               optimizer=",".join(opt_kind) or "plain", torch=torch.__version__, final_loss=float(losses[-1]))
    if device.type == "cuda":
        res.update(peak_allocated_mib=torch.cuda.max_memory_allocated() / 2**20,
                   peak_reserved_mib=torch.cuda.max_memory_reserved() / 2**20)
        free, total = torch.cuda.mem_get_info()
        res["device_used_mib"] = (total - free) / 2**20
    if a.loss_out:
        with open(a.loss_out, "w") as f:
            json.dump([float(x) for x in losses], f)
    return res


def release(device):
    import gc
    if hasattr(torch, "_dynamo"):
        torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def cmd_run(a):
    t_start = time.perf_counter()
    age = process_age_s()
    cfg, batches, micro = load_batches(a.batches)
    if a.warmup >= len(batches) // micro:
        raise SystemExit(f"bench_torch_mt: --warmup {a.warmup} leaves no timed step of {len(batches) // micro}")
    device = torch.device(a.device)
    if a.mode == "compile" and not hasattr(torch, "compile"):
        print(json.dumps({"framework": "pytorch", "mode": "compile", "skipped":
                          f"PyTorch {torch.__version__} has no torch.compile"}))
        return 0
    names = [n.strip() for n in a.sdpa.split(",") if n.strip()]
    bad = [n for n in names if n not in SDPA_NAMES + ("manual",)]
    if bad or not names:
        raise SystemExit(f"bench_torch_mt: --sdpa {a.sdpa}: each must be one of {', '.join(SDPA_NAMES)}")
    if not hasattr(F, "scaled_dot_product_attention") and "manual" not in names:
        names = names + ["manual"]  # what runs on this PyTorch; the others are reported unavailable
    # process age when the trials begin: a trial's first_step_s adds its own time to its first step
    t_setup = age + time.perf_counter() - t_start if age is not None else None
    for name in names:
        row = trial(a, cfg, batches, micro, device, name, t_setup)
        print(json.dumps(row), flush=True)
        release(device)
    return 0


def peak_tflops(dtype, device_name):
    if os.environ.get("BENCH_PEAK_TFLOPS"):
        return float(os.environ["BENCH_PEAK_TFLOPS"])
    if dtype != "bf16":
        return None
    for key, tf in PEAK_BF16_TFLOPS:
        if key in device_name:
            return tf
    return None


def result(framework, mode, cfg, timed, n_steps, window, dtype, device_name):
    device_name = str(device_name)
    if device_name.startswith("cuda"):
        device_name = torch.cuda.get_device_name()
    flops = flops_per_step(cfg, timed)
    peak = peak_tflops(dtype, device_name)
    res = {"framework": framework, "mode": mode, "device": device_name, "dtype": dtype,
           "d_model": cfg["d_model"], "layers": f'{cfg["enc_layers"]}+{cfg["dec_layers"]}',
           "steps": n_steps, "tokens": target_tokens(timed), "seconds": window,
           "step_s": window / n_steps, "tokens_per_s": target_tokens(timed) / window,
           "tflops": flops / window / 1e12}
    res["mfu"] = res["tflops"] / peak if peak else None
    return res


def cmd_tptrain(a):
    cfg, batches, micro = load_batches(a.batches)
    steps, memory, first_launch = {}, None, None
    with open(a.metrics) as f:
        for n, line in enumerate(f, 1):
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                raise SystemExit(f"{a.metrics}:{n}: not JSON ({e})") from None
            if "memory" in r:
                memory = r["memory"]
            elif "elapsed_s" in r and "loss" in r:
                steps[r["step"]] = r["elapsed_s"]
                if "since_launch_s" in r and first_launch is None:
                    first_launch = r["since_launch_s"]
    n_steps = len(batches) // micro
    first = min(steps) if steps else 1
    last = first + n_steps - 1
    w = first + a.warmup - 1  # the window opens after the warmup's last step
    if w not in steps or last not in steps or a.warmup < 1:
        raise SystemExit(f"{a.metrics}: no records of steps {w} and {last} (train_mt --log-interval 1; --warmup >= 1)")
    timed = batches[a.warmup * micro:]
    dev = a.device_name or ("cuda" if torch.cuda.is_available() else "cpu")
    res = result("tptrain", a.mode, cfg, timed, last - w, steps[last] - steps[w], a.dtype, dev)
    res.update(backend="own kernels", first_step_s=first_launch)
    if memory:
        r0 = memory[0]
        res["peak_allocated_mib"] = r0["allocator_peak"] / 2**20
        if "device_used" in r0:
            res["device_used_mib"] = r0["device_used"] / 2**20
    print(json.dumps(res))
    return 0


def backend_name(r):
    """A row's attention backend, with its trial where eager ran more than once."""
    return r.get("backend", "?") + (f" (trial {r['trial']})" if r.get("trial") else "")


def fmt_tried(r, best):
    """A short note on a row that is not its mode's fastest."""
    b = backend_name(r)
    for k in ("unavailable", "rejected", "error", "skipped"):
        if k in r:
            return f"{b}: {k} ({str(r[k])[:60]})"
    return f"{b}: {r['tokens_per_s'] / best['tokens_per_s']:.2f}x"


def best_rows(rs):
    """One row per (framework, mode), in order of first appearance: the
    fastest that ran, with the others noted in its "tried" list; a mode
    where nothing ran keeps its first row (its error says why)."""
    modes = {}
    for r in rs:
        modes.setdefault((r.get("framework"), r.get("mode") or ""), []).append(r)
    out = []
    for group in modes.values():
        ran = [r for r in group if "tokens_per_s" in r]
        best = max(ran, key=lambda r: r["tokens_per_s"]) if ran else group[0]
        tried = [fmt_tried(r, best) for r in group if r is not best and ran]
        out.append(dict(best, tried=tried))
    return out


def cmd_table(a):
    rows = []
    with open(a.results) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    out = ["| model | tokens/batch | bucket | run | backend | tokens/s | step ms | TFLOP/s | MFU | peak alloc MiB "
           "| compile s | first step s | vs eager: speed | vs eager: memory | also tried |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    groups = {}
    for r in rows:
        groups.setdefault((r.get("preset", "?"), r.get("batch_tokens", "?"), r.get("bucket", 1)), []).append(r)
    num = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    for (preset, btok, bucket), rs in groups.items():
        rs = best_rows(rs)
        eager = next((r for r in rs if r.get("framework") == "pytorch" and r.get("mode") == "eager"
                      and "tokens_per_s" in r), None)
        for r in rs:
            name = r["framework"] + (f" {r['mode']}" if r.get("mode") else "")
            head = f"| {preset} | {btok} | {bucket} | {name} | {backend_name(r) if 'backend' in r else '-'} |"
            tried = "; ".join(r["tried"]).replace("|", "/") or "-"
            if "tokens_per_s" not in r:
                why = str(r.get("skipped") or r.get("error") or r.get("rejected") or r.get("unavailable"))
                out.append(f"{head} {why.replace('|', '/')} |||||||||| {tried} |")
                continue
            speed = f"{r['tokens_per_s'] / eager['tokens_per_s']:.2f}x" if eager else "-"
            mem = (f"{r['peak_allocated_mib'] / eager['peak_allocated_mib']:.2f}x"
                   if eager and r.get("peak_allocated_mib") and eager.get("peak_allocated_mib") else "-")
            mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
            peak = f"{r['peak_allocated_mib']:.0f}" if r.get("peak_allocated_mib") else "-"
            out.append(f"{head} {r['tokens_per_s']:.0f} | {1e3 * r['step_s']:.1f} | {r['tflops']:.3g} | {mfu} "
                       f"| {peak} | {num(r.get('compile_s'), '.1f')} | {num(r.get('first_step_s'), '.2f')} "
                       f"| {speed} | {mem} | {tried} |")
    print("\n".join(out))
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("batches")
    r.add_argument("--mode", choices=("eager", "compile"), default="eager")
    r.add_argument("--dynamic", choices=("true", "auto", "batch"), default="true",
                   help="--mode compile: which dimensions are symbolic (compiled_step)")
    r.add_argument("--compile-scope", choices=("model", "layers"), default="model",
                   help="--mode compile: the whole model, or each layer (compiled_step)")
    r.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    r.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    r.add_argument("--warmup", type=int, default=5)
    r.add_argument("--sdpa", default="auto", help="attention backends to try, comma-separated: "
                   + ", ".join(SDPA_NAMES) + " (default auto)")
    r.add_argument("--lr", type=float, default=1e-4)
    r.add_argument("--dropout", type=float, default=None, help="override the config's")
    r.add_argument("--init", help="a tptrain export directory to start from")
    r.add_argument("--loss-out", help="write every micro-batch's loss here (JSON list)")
    t = sub.add_parser("tptrain")
    t.add_argument("batches")
    t.add_argument("metrics")
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    t.add_argument("--device-name", help="the device the run used (default: this machine's GPU, else cpu)")
    t.add_argument("--mode", default="", help="the row's mode beside tptrain (e.g. 'recompute selective')")
    b = sub.add_parser("table")
    b.add_argument("results")
    a = p.parse_args()
    return {"run": cmd_run, "tptrain": cmd_tptrain, "table": cmd_table}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
