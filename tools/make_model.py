#!/usr/bin/env python3
"""Write a random-weight GGUF model (llama / qwen2 / qwen3 / qwen3moe / gemma3 / lfm2 / lfm2moe / gpt-oss / qwen35 /
gemma4) laid out exactly as llama.cpp's converters do.

Same arguments -> byte-identical file. Every tensor draws from its own generator,
np.random.default_rng([seed, crc32(arch), crc32(name)]) (PCG64, standard_normal float32), so the same seed gives the same
float weights whatever the storage type: the q8_0 model is the quantised f32 model.

Examples:
  tools/make_model.py --arch llama --type f32 --seed 1 --out /tmp/llama.gguf
  tools/make_model.py --arch qwen2 --type q4_0 --shape qwen2.5-0.5b --out /tmp/qwen-shape.gguf
  tools/make_model.py --arch lfm2 --n-layer 6 --lfm2-attn-layers 2,4 --l-cache 3 --out /tmp/lfm2.gguf
  tools/make_model.py --arch qwen3moe --type mxfp4_moe --seed 5 --out /tmp/moe-mxfp4.gguf   # experts MXFP4
  tools/make_model.py --arch qwen35 --type q8_0 --n-layer 4 --full-attention-interval 2 --out /tmp/qwen35.gguf

lfm2 (Liquid AI's LFM2, as convert_hf_to_gguf.py writes it): attention.head_count_kv is a per-layer INT32 array, 0 on
the gated short-convolution layers; shortconv.l_cache the convolution's length; head_dim is n_embd / n_head (no
key_length / rope.dimension_count keys); attention layers hold attn_q/k/v/output and attn_q_norm/attn_k_norm (neox
RoPE, no row permutation), convolution layers shortconv.in_proj (ne [n_embd, 3 n_embd]: B, C, x), shortconv.conv
(ne [l_cache, n_embd], always F32) and shortconv.out_proj; the final norm is token_embd_norm.weight.
lfm2moe (LFM2-8B-A1B) is lfm2 whose FFNs from layer --n-dense-lead on are mixtures of experts: a sigmoid router
(expert_gating_func 2) with a per-expert selection bias exp_probs_b.bias, as convert_hf_to_gguf.py writes it.
gpt-oss: every FFN a mixture of experts with biases (router and experts, F32 like every bias), q/k/v/o biases, a sink
logit per head (attn_sinks.weight), the FFN's norm named post_attention_norm, local layers every other one from 0
(attention.sliding_window), YaRN RoPE (rope.scaling.*), the gpt-4o pre-tokenizer.
qwen35 (Qwen 3.5, as convert_hf_to_gguf.py's Qwen3_5TextModel writes it): gated DeltaNet layers and, every
--full-attention-interval-th layer, gated full attention (attention.recurrent_layers, a bool per layer, true on the
DeltaNet layers, beside full_attention_interval); ssm.conv_kernel, ssm.state_size (the key and value head dimension),
ssm.group_count (key heads), ssm.time_step_rank (value heads) and ssm.inner_size (value heads x head dimension) give the
DeltaNet's shape; RoPE on the first rope.dimension_count dims of each head (partial_rotary_factor 0.25) with the
multi-axis rope.dimension_sections. A DeltaNet layer holds attn_qkv (ne [n_embd, 2 keys + values]: q, k, v), attn_gate
(z), ssm_conv1d (ne [conv_kernel, 2 keys + values], always F32), ssm_dt.bias, ssm_a (-exp(A_log), negative),
ssm_alpha, ssm_beta (ne [n_embd, value heads]), ssm_norm (one value head's gain) and ssm_out; an attention layer
attn_q (ne [n_embd, 2 x heads x head_dim]: each head's query, then its output gate), attn_k, attn_v, attn_q_norm,
attn_k_norm and attn_output; every layer's FFN norm is post_attention_norm. Tensors in the converter's order (the
checkpoint's names sorted); no multi-token-prediction block. Quantised as llama-quantize does: ssm_conv1d and the 1-D
tensors stay F32, every other matrix (ssm_alpha and ssm_beta too) takes --type.
gemma4 (Gemma 4's dense models, as convert_hf_to_gguf.py writes them): every 5th layer and the last global
(attention.sliding_window_pattern, a bool per layer), the others local; local heads of --head-dim, global ones of
--global-head-dim (default twice that) with --n-head-kv-global KV heads, RoPE on a quarter of their angles through
rope_freqs.weight (1, then 1e30); the last --shared-kv-layers layers have no k, v or k norm and attend over the last
earlier layer of their kind, their FFN twice --n-ff wide; --k-eq-v drops the global layers' attn_v (v is k); per-layer
embeddings of --n-embd-per-layer (0: none); layer_output_scale per layer; final logit softcapping 30.
"""
from __future__ import annotations

import argparse
import math
import sys
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggufio  # noqa: E402
from make_model_vocab import LFM2, tokenizer_metadata  # noqa: E402


# storage types (--type, --tensor-type; mxfp4 only through --tensor-type or a mix)
TYPES = {"f32": ggufio.F32, "f16": ggufio.F16, "bf16": ggufio.BF16, "q8_0": ggufio.Q8_0, "q4_0": ggufio.Q4_0,
         "q4_k": ggufio.Q4_K, "mxfp4": ggufio.MXFP4}
# --type mixes as llama-quantize writes them: (the 2-D weights' type, [(name part, type) of the 3-D tensors]).
# mxfp4_moe: the stacked experts ffn_{gate,up,down}_exps in MXFP4, the rest Q8_0 (llama-quantize MXFP4_MOE, which
# also leaves the router ffn_gate_inp unquantised; here it is Q8_0 as in --type q8_0).
MIXES = {"mxfp4_moe": ("q8_0", [("_exps.", "mxfp4")])}
# gguf "general.file_type" (llama_ftype) for each --type
FILE_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "q4_k": 14, "bf16": 32, "mxfp4_moe": 38}

SHAPES = {
    "qwen2.5-0.5b": dict(arch="qwen2", n_embd=896, n_layer=24, n_head=14, n_head_kv=2, head_dim=64, n_ff=4864,
                         n_vocab=151936, ctx=32768, rope_base=1e6, rms_eps=1e-6, tie_embeddings=True),
    "qwen3-0.6b": dict(arch="qwen3", n_embd=1024, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_ff=3072,
                       n_vocab=151936, ctx=40960, rope_base=1e6, rms_eps=1e-6, tie_embeddings=True),
    "llama-3.2-1b": dict(arch="llama", n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192,
                         n_vocab=128256, ctx=131072, rope_base=500000.0, rms_eps=1e-5, tie_embeddings=True,
                         rope_scaling="llama3", rope_scaling_factor=32.0, rope_scaling_low=1.0,
                         rope_scaling_high=4.0, rope_scaling_orig_ctx=8192),
    "llama-3.1-8b": dict(arch="llama", n_embd=4096, n_layer=32, n_head=32, n_head_kv=8, head_dim=128, n_ff=14336,
                         n_vocab=128256, ctx=131072, rope_base=500000.0, rms_eps=1e-5, tie_embeddings=False,
                         rope_scaling="llama3", rope_scaling_factor=8.0, rope_scaling_low=1.0,
                         rope_scaling_high=4.0, rope_scaling_orig_ctx=8192),
    # Gemma 3 270M: head_dim 256 != n_embd / n_head, sliding window 512 on 5 of every 6 layers (local RoPE base 10k).
    "gemma-3-270m": dict(arch="gemma3", n_embd=640, n_layer=18, n_head=4, n_head_kv=1, head_dim=256, n_ff=2048,
                         n_vocab=262144, ctx=32768, rope_base=1e6, rms_eps=1e-6, tie_embeddings=True,
                         sliding_window=512),
    # LFM2 350M: 10 short-convolution layers and 6 attention layers; ffn 4608 is block_ff_dim 6656 after LFM2's
    # automatic sizing (2/3, rounded up to a multiple of 256), as the converter writes it.
    # Qwen3-30B-A3B: 48 layers, each FFN 128 experts of 768 of which 8 per token (the dense n_ff is unused).
    "qwen3-30b-a3b": dict(arch="qwen3moe", n_embd=2048, n_layer=48, n_head=32, n_head_kv=4, head_dim=128, n_ff=6144,
                          n_vocab=151936, ctx=40960, rope_base=1e6, rms_eps=1e-6, tie_embeddings=False,
                          n_expert=128, n_expert_used=8, n_ff_exp=768),
    "lfm2-350m": dict(arch="lfm2", n_embd=1024, n_layer=16, n_head=16, n_head_kv=8, head_dim=64, n_ff=4608,
                      n_vocab=65536, ctx=128000, rope_base=1e6, rms_eps=1e-5, tie_embeddings=True,
                      lfm2_attn_layers="2,5,8,10,12,14", l_cache=3),
    # LFM2-8B-A1B: 24 layers, 6 of them attention; the first 2 FFNs dense (7168), the others 32 experts of 1792 of
    # which 4 per token (8.3 B parameters, 1.5 B active).
    "lfm2-8b-a1b": dict(arch="lfm2moe", n_embd=2048, n_layer=24, n_head=32, n_head_kv=8, head_dim=64, n_ff=7168,
                        n_vocab=65536, ctx=128000, rope_base=1e6, rms_eps=1e-5, tie_embeddings=True,
                        lfm2_attn_layers="2,6,10,14,18,21", l_cache=3, n_expert=32, n_expert_used=4, n_ff_exp=1792,
                        n_dense_lead=2),
    # gpt-oss-20b: 24 layers of 32 experts of 2880, 4 per token; 64 heads / 8 KV heads of 64; windows of 128 on every
    # other layer; YaRN x32 over 4096 positions (20.9 B parameters, 3.6 B active).
    "gpt-oss-20b": dict(arch="gpt-oss", n_embd=2880, n_layer=24, n_head=64, n_head_kv=8, head_dim=64, n_ff=2880,
                        n_vocab=201088, ctx=131072, rope_base=150000.0, rms_eps=1e-5, tie_embeddings=False,
                        n_expert=32, n_expert_used=4, n_ff_exp=2880, sliding_window=128, rope_scaling="yarn",
                        rope_scaling_factor=32.0, rope_scaling_orig_ctx=4096),
    # Qwen3.5-0.8B (text): 24 layers, 3 of every 4 gated DeltaNet (16 key and 16 value heads of 128, 4 taps), every
    # 4th gated attention (8 heads / 2 KV heads of 256, RoPE on 64 dims, base 1e7); tied embeddings over 248,320 tokens.
    "qwen3.5-0.8b": dict(arch="qwen35", n_embd=1024, n_layer=24, n_head=8, n_head_kv=2, head_dim=256, n_ff=3584,
                         n_vocab=248320, ctx=262144, rope_base=1e7, rms_eps=1e-6, tie_embeddings=True,
                         ssm_k_heads=16, ssm_v_heads=16, ssm_head_dim=128, ssm_conv=4, full_attention_interval=4),
    # Qwen3.5-2B (text): the 0.8B's layers at width 2048, FFN 6144.
    "qwen3.5-2b": dict(arch="qwen35", n_embd=2048, n_layer=24, n_head=8, n_head_kv=2, head_dim=256, n_ff=6144,
                       n_vocab=248320, ctx=262144, rope_base=1e7, rms_eps=1e-6, tie_embeddings=True,
                       ssm_k_heads=16, ssm_v_heads=16, ssm_head_dim=128, ssm_conv=4, full_attention_interval=4),
    # A small Gemma 4 in the layout of the E2B model (35 layers as llama.cpp's loader knows it, 4 local to 1 global,
    # the last 20 reading earlier layers' KV caches with FFNs twice as wide, per-layer embeddings of 256, local heads
    # of 256 and global ones of 512, one KV head): the widths are this preset's, not checked against a released file.
    "gemma4-small": dict(arch="gemma4", n_embd=1536, n_layer=35, n_head=8, n_head_kv=1, head_dim=256, n_ff=6144,
                         n_vocab=262144, ctx=131072, rope_base=1e6, rms_eps=1e-6, tie_embeddings=True,
                         sliding_window=512, global_head_dim=512, n_head_kv_global=1, shared_kv_layers=20,
                         n_embd_per_layer=256),
}
MOE = ("qwen3moe", "lfm2moe", "gpt-oss")  # FFNs of experts


# ---------------------------------------------------------------------------------------------------------------
# Q/K row permutation

def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF (half-split RoPE) -> GGUF (adjacent-pair RoPE) row order of a q/k weight [n_head*hd, ...] or bias."""
    rows = w.shape[0]
    hd = rows // n_head
    return w.reshape(n_head, 2, hd // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF -> HF: the inverse of permute_qk."""
    rows = w.shape[0]
    hd = rows // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _self_test_permute() -> None:
    w = np.arange(4 * 8 * 3).reshape(32, 3)
    p = permute_qk(w, 4)
    assert np.array_equal(unpermute_qk(p, 4), w)
    assert not np.array_equal(p, w)
    # within a head, GGUF row 2i is HF row i and GGUF row 2i+1 is HF row i + hd/2
    assert np.array_equal(p[0::2][:4], w[:4]) and np.array_equal(p[1::2][:4], w[4:8])


# ---------------------------------------------------------------------------------------------------------------
# model

def llama3_rope_factors(hd: int, rope_dim: int, base: float, factor: float, low: float, high: float,
                        orig_ctx: int) -> np.ndarray:
    """Per-frequency divisors (llama.cpp's rope_freqs.weight): theta_i = pos * base^(-2i/d) / f_i."""
    freqs = base ** (-np.arange(0, rope_dim, 2, dtype=np.float64) / rope_dim)
    low_wl, high_wl = orig_ctx / low, orig_ctx / high
    out = []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (orig_ctx / wl - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def lfm2_attn_layers(a) -> list[int]:
    """lfm2: the attention layers (--lfm2-attn-layers; default every other layer from 1)."""
    if not a.lfm2_attn_layers:
        return list(range(1, a.n_layer, 2))
    return sorted({int(x) for x in str(a.lfm2_attn_layers).split(",") if x.strip()})


def qwen35_delta_layers(a) -> list[bool]:
    """qwen35: per layer, whether it is a gated DeltaNet layer (llama.cpp: all but every full_attention_interval-th)."""
    return [(i + 1) % a.full_attention_interval != 0 for i in range(a.n_layer)]


def qwen35_rope_sections(rope_dim: int) -> list[int]:
    """The multi-axis RoPE sections over rope_dim / 2 rotated pairs, split 3 ways as Qwen 3.5's [11, 11, 10] of 32."""
    n = rope_dim // 2
    return [(n + 2) // 3, (n + 1) // 3, n // 3, 0]


def qwen35_plan(a) -> list[tuple[str, tuple[int, ...], str, float]]:
    """qwen35 in the converter's order (the checkpoint's names sorted: lm_head, embed_tokens, each layer's, norm)."""
    E, F = a.n_embd, a.n_ff
    q_dim, kv_dim = a.n_head * a.head_dim, a.n_head_kv * a.head_dim
    KD, VH, VD = a.ssm_k_heads * a.ssm_head_dim, a.ssm_v_heads, a.ssm_v_heads * a.ssm_head_dim
    conv = 2 * KD + VD
    plan = []
    if not a.tie_embeddings:
        plan.append(("output.weight", (a.n_vocab, E), "w", 2 / math.sqrt(E)))
    plan.append(("token_embd.weight", (a.n_vocab, E), "w", 0.5 / math.sqrt(E) if a.tie_embeddings else 1.0))
    ffn = [("ffn_down.weight", (E, F), "w", 1 / math.sqrt(F)), ("ffn_gate.weight", (F, E), "w", 1 / math.sqrt(E)),
           ("ffn_up.weight", (F, E), "w", 1 / math.sqrt(E)), ("post_attention_norm.weight", (E,), "norm", 0.1)]
    for i, delta in enumerate(qwen35_delta_layers(a)):
        p = f"blk.{i}."
        layer = [("attn_norm.weight", (E,), "norm", 0.1)]
        if delta:
            # on the normed input, alpha's output has a standard deviation of about 1 (with dt_bias, g = ssm_a
            # softplus(alpha x + dt_bias) spreads exp(g) over (0, 1)), beta's about 2 (sigmoid: beta spreads over (0, 1))
            layer += [("ssm_a", (VH,), "ssm_a", 0.0),
                      ("ssm_conv1d.weight", (conv, a.ssm_conv), "w", 1 / math.sqrt(a.ssm_conv)),
                      ("ssm_dt.bias", (VH,), "bias", 1.0),
                      ("ssm_alpha.weight", (VH, E), "w", 1 / math.sqrt(E)),
                      ("ssm_beta.weight", (VH, E), "w", 2 / math.sqrt(E)),
                      ("attn_qkv.weight", (conv, E), "w", 1 / math.sqrt(E)),
                      ("attn_gate.weight", (VD, E), "w", 1 / math.sqrt(E)),
                      ("ssm_norm.weight", (a.ssm_head_dim,), "norm", 0.1),
                      ("ssm_out.weight", (E, VD), "w", 1 / math.sqrt(VD))] + ffn
        else:
            layer += ffn + [("attn_k_norm.weight", (a.head_dim,), "norm", 0.1),
                            ("attn_k.weight", (kv_dim, E), "w", 1 / math.sqrt(E)),
                            ("attn_output.weight", (E, q_dim), "w", 1 / math.sqrt(q_dim)),
                            ("attn_q_norm.weight", (a.head_dim,), "norm", 0.1),
                            ("attn_q.weight", (2 * q_dim, E), "w", 1 / math.sqrt(E)),  # per head: query, then gate
                            ("attn_v.weight", (kv_dim, E), "w", 1 / math.sqrt(E))]
        plan += [(p + n, shape, kind, std) for n, shape, kind, std in layer]
    plan.append(("output_norm.weight", (E,), "norm_out" if a.tie_embeddings else "norm", 0.1))
    return plan


def ffn_plan(a, i: int) -> list[tuple[str, tuple[int, ...], str, float]]:
    """Layer i's FFN: its norm and the dense gate/up/down, or (a mixture's layers) the router and the stacked experts,
    numpy [expert][out][in], with lfm2moe's selection bias."""
    p = f"blk.{i}."
    plan = [(p + ("post_attention_norm.weight" if a.arch == "gpt-oss" else "ffn_norm.weight"), (a.n_embd,), "norm", 0.1)]
    if a.arch not in MOE or i < a.n_dense_lead:
        return plan + [(p + "ffn_gate.weight", (a.n_ff, a.n_embd), "w", 1 / math.sqrt(a.n_embd)),
                       (p + "ffn_up.weight", (a.n_ff, a.n_embd), "w", 1 / math.sqrt(a.n_embd)),
                       (p + "ffn_down.weight", (a.n_embd, a.n_ff), "w", 1 / math.sqrt(a.n_ff))]
    X, FX = a.n_expert, a.n_ff_exp
    if a.arch == "lfm2moe":
        plan.append((p + "exp_probs_b.bias", (X,), "bias", 0.1))
    plan += [(p + "ffn_gate_inp.weight", (X, a.n_embd), "w", 4 / math.sqrt(a.n_embd)),
             (p + "ffn_gate_exps.weight", (X, FX, a.n_embd), "w", 1 / math.sqrt(a.n_embd)),
             (p + "ffn_up_exps.weight", (X, FX, a.n_embd), "w", 1 / math.sqrt(a.n_embd)),
             (p + "ffn_down_exps.weight", (X, a.n_embd, FX), "w", 1 / math.sqrt(FX))]
    if a.arch == "gpt-oss":  # biases of the router and of every expert's rows: numpy [expert][rows]
        plan += [(p + "ffn_gate_inp.bias", (X,), "bias", 0.1), (p + "ffn_gate_exps.bias", (X, FX), "bias", 0.1),
                 (p + "ffn_up_exps.bias", (X, FX), "bias", 0.1), (p + "ffn_down_exps.bias", (X, a.n_embd), "bias", 0.1)]
    return plan


def gemma4_layers(a) -> list[dict]:
    """gemma4: per layer whether it is local, its head width, KV heads, FFN width, whether it has k and v of its
    own (the last --shared-kv-layers do not) and whether its v is k (--k-eq-v on global layers)."""
    first_shared = a.n_layer - a.shared_kv_layers
    out = []
    for i in range(a.n_layer):
        local = (i + 1) % 5 != 0 and i != a.n_layer - 1
        out.append(dict(local=local, head_dim=a.head_dim if local else a.global_head_dim,
                        n_kv=a.n_head_kv if local else a.n_head_kv_global, n_ff=a.n_ff * (2 if i >= first_shared else 1),
                        own_kv=i < first_shared, v_is_k=a.k_eq_v and not local))
    return out


def gemma4_plan(a) -> list[tuple[str, tuple[int, ...], str, float]]:
    P, E = a.n_embd_per_layer, a.n_embd
    plan = [("token_embd.weight", (a.n_vocab, E), "w", 0.5 / math.sqrt(E) if a.tie_embeddings else 1.0)]
    if P:
        plan += [("per_layer_token_embd.weight", (a.n_vocab, a.n_layer * P), "w", 1 / math.sqrt(P)),
                 ("per_layer_model_proj.weight", (a.n_layer * P, E), "w", 1 / math.sqrt(E)),
                 ("per_layer_proj_norm.weight", (P,), "norm", 0.1)]
    for i, L in enumerate(gemma4_layers(a)):
        p, D, F = f"blk.{i}.", L["head_dim"], L["n_ff"]
        plan += [(p + "attn_norm.weight", (E,), "norm", 0.1),
                 (p + "attn_q.weight", (a.n_head * D, E), "w", 1 / math.sqrt(E))]
        if L["own_kv"]:
            plan += [(p + "attn_k.weight", (L["n_kv"] * D, E), "w", 1 / math.sqrt(E))]
            if not L["v_is_k"]:
                plan += [(p + "attn_v.weight", (L["n_kv"] * D, E), "w", 1 / math.sqrt(E))]
        plan += [(p + "attn_q_norm.weight", (D,), "qk_norm", 0.1)]
        if L["own_kv"]:
            plan += [(p + "attn_k_norm.weight", (D,), "qk_norm", 0.1)]
        plan += [(p + "attn_output.weight", (E, a.n_head * D), "w", 1 / math.sqrt(a.n_head * D)),
                 (p + "post_attention_norm.weight", (E,), "norm", 0.1),
                 (p + "ffn_norm.weight", (E,), "norm", 0.1),
                 (p + "ffn_gate.weight", (F, E), "w", 1 / math.sqrt(E)),
                 (p + "ffn_up.weight", (F, E), "w", 1 / math.sqrt(E)),
                 (p + "ffn_down.weight", (E, F), "w", 1 / math.sqrt(F)),
                 (p + "post_ffw_norm.weight", (E,), "norm", 0.1),
                 (p + "layer_output_scale.weight", (1,), "norm", 0.1)]
        if P:
            plan += [(p + "inp_gate.weight", (P, E), "w", 1 / math.sqrt(E)),
                     (p + "proj.weight", (E, P), "w", 1 / math.sqrt(P)),
                     (p + "post_norm.weight", (E,), "norm", 0.1)]
    plan.append(("output_norm.weight", (E,), "norm_out" if a.tie_embeddings else "norm", 0.1))
    if not a.tie_embeddings:
        plan.append(("output.weight", (a.n_vocab, E), "w", 2 / math.sqrt(E)))
    return plan


def tensor_plan(a) -> list[tuple[str, tuple[int, ...], str, float]]:
    """(name, numpy shape [out, in], init kind, std) in llama.cpp's tensor order."""
    if a.arch == "qwen35":
        return qwen35_plan(a)
    if a.arch == "gemma4":
        return gemma4_plan(a)
    q_dim, kv_dim = a.n_head * a.head_dim, a.n_head_kv * a.head_dim
    # tied: a small embedding keeps the token's own row from dominating its logit (else greedy repeats the input
    # token); a larger final-norm gain then restores a useful logit spread.
    plan = [("token_embd.weight", (a.n_vocab, a.n_embd), "w", 0.5 / math.sqrt(a.n_embd) if a.tie_embeddings else 1.0)]
    attn = lfm2_attn_layers(a) if a.arch in LFM2 else None
    for i in range(a.n_layer):
        p = f"blk.{i}."
        if attn is not None and i not in attn:  # lfm2 gated short convolution
            plan += [(p + "attn_norm.weight", (a.n_embd,), "norm", 0.1),
                     (p + "shortconv.in_proj.weight", (3 * a.n_embd, a.n_embd), "w", 1 / math.sqrt(a.n_embd)),
                     (p + "shortconv.conv.weight", (a.n_embd, a.l_cache), "w", 1 / math.sqrt(a.l_cache)),
                     (p + "shortconv.out_proj.weight", (a.n_embd, a.n_embd), "w", 1 / math.sqrt(a.n_embd))]
            plan += ffn_plan(a, i)
            continue
        plan += [(p + "attn_norm.weight", (a.n_embd,), "norm", 0.1),
                 (p + "attn_q.weight", (q_dim, a.n_embd), "w", 1 / math.sqrt(a.n_embd)),
                 (p + "attn_k.weight", (kv_dim, a.n_embd), "w", 1 / math.sqrt(a.n_embd)),
                 (p + "attn_v.weight", (kv_dim, a.n_embd), "w", 1 / math.sqrt(a.n_embd))]
        if a.arch in ("qwen2", "gpt-oss"):
            plan += [(p + "attn_q.bias", (q_dim,), "bias", 0.1), (p + "attn_k.bias", (kv_dim,), "bias", 0.1),
                     (p + "attn_v.bias", (kv_dim,), "bias", 0.1)]
        if a.arch in ("qwen3", "qwen3moe", "gemma3", "lfm2", "lfm2moe"):
            plan += [(p + "attn_q_norm.weight", (a.head_dim,), "norm", 0.1),
                     (p + "attn_k_norm.weight", (a.head_dim,), "norm", 0.1)]
        plan += [(p + "attn_output.weight", (a.n_embd, q_dim), "w", 1 / math.sqrt(q_dim))]
        if a.arch == "gpt-oss":
            plan += [(p + "attn_output.bias", (a.n_embd,), "bias", 0.1), (p + "attn_sinks.weight", (a.n_head,), "bias", 1.0)]
        if a.arch == "gemma3":  # the norms after attention and after the FFN, before each residual add
            plan += [(p + "post_attention_norm.weight", (a.n_embd,), "norm", 0.1)]
        plan += ffn_plan(a, i)
        if a.arch == "gemma3":
            plan += [(p + "post_ffw_norm.weight", (a.n_embd,), "norm", 0.1)]
    plan.append(("token_embd_norm.weight" if a.arch in LFM2 else "output_norm.weight", (a.n_embd,),
                 "norm_out" if a.tie_embeddings else "norm", 0.1))
    if not a.tie_embeddings:
        plan.append(("output.weight", (a.n_vocab, a.n_embd), "w", 2 / math.sqrt(a.n_embd)))
    return plan


CHUNK = 1 << 22  # elements generated / quantised at a time


def gen_tensor(seed: int, arch: str, name: str, shape: tuple[int, ...], kind: str, std: float, ggml_type: int) -> np.ndarray:
    """float32 random tensor encoded as ggml_type (raw array whose bytes are the file contents)."""
    rng = np.random.default_rng([seed, zlib.crc32(arch.encode()), zlib.crc32(name.encode())])
    if kind == "ssm_a":  # -(0.5 + 7.5 u^2), u uniform on [0, 1): decay rates from slow to fast, in [-8, -0.5]
        u = rng.random(shape, dtype=np.float32)
        return -(np.float32(0.5) + np.float32(7.5) * u * u)
    if len(shape) == 1:
        x = rng.standard_normal(shape, dtype=np.float32) * np.float32(std)
        if kind == "norm":
            x += np.float32(1.0)
        elif kind == "qk_norm":  # gemma4's q.k is unscaled: the q and k norms' gains carry 1 / sqrt(head_dim)
            x = (x + np.float32(1.0)) * np.float32(shape[0] ** -0.25)
        elif kind == "norm_out":
            x = (x + np.float32(1.0)) * np.float32(6.0)
        return x
    rows, cols = int(np.prod(shape[:-1])), shape[-1]  # stacked experts: their rows one after the other
    enc_cols = ggufio.nbytes(ggml_type, cols) // np.dtype(
        {ggufio.F32: np.float32, ggufio.F16: np.float16, ggufio.BF16: np.uint16}.get(ggml_type, np.uint8)).itemsize
    out = None
    step = max(1, CHUNK // cols)
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        x = rng.standard_normal((r1 - r0, cols), dtype=np.float32)
        x *= np.float32(std)
        e = ggufio.encode(x, ggml_type)
        if out is None:
            out = np.empty((rows, enc_cols), dtype=e.dtype)
        out[r0:r1] = e
    return out


def build_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", choices=["llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "lfm2", "lfm2moe", "gpt-oss",
                                       "qwen35", "gemma4"], default=None)
    ap.add_argument("--type", choices=[t for t in TYPES if t != "mxfp4"] + list(MIXES), default="f32",
                    help="storage type of the 2-D weights, or a mix (mxfp4_moe: experts MXFP4, the rest Q8_0)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    ap.add_argument("--shape", choices=list(SHAPES), help="random weights with a real model's shapes")
    ap.add_argument("--n-embd", type=int, default=64)
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-head-kv", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=16)
    ap.add_argument("--n-ff", type=int, default=128)
    ap.add_argument("--n-vocab", type=int, default=1024)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--rope-base", type=float, default=10000.0)
    ap.add_argument("--rms-eps", type=float, default=1e-5)
    ap.add_argument("--sliding-window", type=int, default=0,
                    help="gemma3, gpt-oss: attention.sliding_window (gemma3: every 6th layer global; gpt-oss: every "
                         "other one; default n_ctx / 4)")
    ap.add_argument("--lfm2-attn-layers", default=None, metavar="I,J,..",
                    help="lfm2: the attention layers, the others gated short convolutions (default 1,3,5,..)")
    ap.add_argument("--l-cache", type=int, default=3, help="lfm2: shortconv.l_cache, the convolution's length")
    ap.add_argument("--n-expert", type=int, default=8, help="qwen3moe, lfm2moe: experts per layer")
    ap.add_argument("--n-expert-used", type=int, default=2, help="qwen3moe, lfm2moe: experts chosen per token")
    ap.add_argument("--n-ff-exp", type=int, default=64, help="qwen3moe, lfm2moe: each expert's FFN width")
    ap.add_argument("--n-dense-lead", type=int, default=0,
                    help="lfm2moe: leading layers with a dense FFN (leading_dense_block_count)")
    ap.add_argument("--full-attention-interval", type=int, default=4,
                    help="qwen35: every N-th layer full attention, the others gated DeltaNet")
    ap.add_argument("--ssm-k-heads", type=int, default=2, help="qwen35: DeltaNet key heads (ssm.group_count)")
    ap.add_argument("--ssm-v-heads", type=int, default=4,
                    help="qwen35: DeltaNet value heads (ssm.time_step_rank), a multiple of --ssm-k-heads")
    ap.add_argument("--ssm-head-dim", type=int, default=16,
                    help="qwen35: DeltaNet key and value head dimension (ssm.state_size)")
    ap.add_argument("--ssm-conv", type=int, default=4, help="qwen35: DeltaNet convolution taps (ssm.conv_kernel)")
    ap.add_argument("--rope-dim", type=int, default=None,
                    help="qwen35: rope.dimension_count, the rotated dims of each head (default --head-dim / 4)")
    ap.add_argument("--global-head-dim", type=int, default=0, help="gemma4: the global layers' heads (default 2 x "
                    "--head-dim)")
    ap.add_argument("--n-head-kv-global", type=int, default=0, help="gemma4: the global layers' KV heads (default "
                    "--n-head-kv)")
    ap.add_argument("--shared-kv-layers", type=int, default=0,
                    help="gemma4: the last layers reading an earlier layer's KV cache (attention.shared_kv_layers)")
    ap.add_argument("--n-embd-per-layer", type=int, default=32,
                    help="gemma4: per-layer embedding width (embedding_length_per_layer_input; 0: none)")
    ap.add_argument("--k-eq-v", action="store_true", help="gemma4: no attn_v on the global layers (v is k)")
    ap.add_argument("--rope-scaling", choices=["none", "llama3", "yarn"], default="none",
                    help="llama3: the rope_freqs.weight tensor; yarn: rope.scaling.* keys (factor, original context)")
    ap.add_argument("--rope-scaling-factor", type=float, default=8.0)
    ap.add_argument("--rope-scaling-low", type=float, default=1.0, help="llama3 low_freq_factor")
    ap.add_argument("--rope-scaling-high", type=float, default=4.0, help="llama3 high_freq_factor")
    ap.add_argument("--rope-scaling-orig-ctx", type=int, default=64,
                    help="llama3 original_max_position_embeddings (small so short prompts see the scaling)")
    ap.add_argument("--tensor-type", action="append", metavar="PART=TYPE",
                    help="2-D tensors whose name contains PART stored as TYPE instead of --type (repeatable)")
    ap.add_argument("--tie-embeddings", action="store_true", help="no output.weight: logits use token_embd")
    ap.add_argument("--tokenizer", choices=["bpe", "spm", "synthetic"], default=None,
                    help="default: synthetic with --shape, bpe otherwise")
    ap.add_argument("--name", default=None, help="general.name")
    a = ap.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    explicit = {s[2:].split("=")[0].replace("-", "_") for s in given if s.startswith("--")}
    if a.shape:
        for k, v in SHAPES[a.shape].items():
            if k not in explicit:
                setattr(a, k, v)
    if a.arch is None:
        a.arch = "llama"
    if a.tokenizer is None:
        a.tokenizer = "synthetic" if a.shape else "bpe"
    if a.arch in LFM2:
        if a.shape and a.lfm2_attn_layers and "lfm2_attn_layers" not in explicit:  # the shape's, cut to --n-layer
            a.lfm2_attn_layers = ",".join(x for x in a.lfm2_attn_layers.split(",") if int(x) < a.n_layer)
        # head_dim is n_embd / n_head (the converter writes no key_length); llama.cpp's attn_output is n_embd square
        if "head_dim" not in explicit:
            a.head_dim = a.n_embd // a.n_head
        if a.n_head * a.head_dim != a.n_embd:
            ap.error("lfm2 needs --n-head * --head-dim == --n-embd")
        if a.l_cache < 2:
            ap.error("--l-cache must be at least 2")
        try:
            layers = lfm2_attn_layers(a)
        except ValueError:
            ap.error(f"--lfm2-attn-layers {a.lfm2_attn_layers}: expected comma-separated layer indices")
        if any(i < 0 or i >= a.n_layer for i in layers):
            ap.error(f"--lfm2-attn-layers {a.lfm2_attn_layers}: indices must be below --n-layer {a.n_layer}")
    if a.arch == "qwen35":
        if a.rope_dim is None:
            a.rope_dim = a.head_dim // 4
        if a.rope_dim < 2 or a.rope_dim % 2 or a.rope_dim > a.head_dim:
            ap.error("--rope-dim must be even, at least 2 and at most --head-dim")
        if a.full_attention_interval < 1:
            ap.error("--full-attention-interval must be at least 1")
        if min(a.ssm_k_heads, a.ssm_v_heads, a.ssm_head_dim) < 1 or a.ssm_v_heads % a.ssm_k_heads:
            ap.error("--ssm-v-heads must be a positive multiple of --ssm-k-heads")
        if a.ssm_conv < 2:
            ap.error("--ssm-conv must be at least 2")
    if a.arch in MOE and not 1 <= a.n_expert_used <= a.n_expert:
        ap.error("--n-expert-used must be in [1, --n-expert]")
    if a.arch == "qwen3moe":
        a.n_dense_lead = 0
    if not 0 <= a.n_dense_lead <= a.n_layer:
        ap.error("--n-dense-lead must be in [0, --n-layer]")
    if a.arch == "gemma4":
        a.global_head_dim = a.global_head_dim or 2 * a.head_dim
        a.n_head_kv_global = a.n_head_kv_global or a.n_head_kv
        if a.n_head % a.n_head_kv_global or a.global_head_dim % 8:
            ap.error("gemma4 needs --n-head a multiple of --n-head-kv-global and --global-head-dim a multiple of 8")
        if a.rope_scaling != "none":
            ap.error("gemma4: no --rope-scaling (its global layers' RoPE is rope_freqs.weight)")
        layers = gemma4_layers(a) if 0 <= a.shared_kv_layers < a.n_layer else []
        for i, L in enumerate(layers[a.n_layer - a.shared_kv_layers:]):
            if not any(M["own_kv"] and M["local"] == L["local"] for M in layers):
                ap.error(f"--shared-kv-layers {a.shared_kv_layers}: layer {a.n_layer - a.shared_kv_layers + i} has "
                         "no earlier layer of its kind")
        if not layers:
            ap.error("--shared-kv-layers must be in [0, --n-layer)")
        first = a.n_layer - a.shared_kv_layers
        if a.shared_kv_layers and (first < 2 or not layers[first - 2]["local"] or layers[first - 1]["local"]):
            # llama.cpp reads the shared layers' caches from layers first - 2 (local) and first - 1 (global)
            ap.error(f"--shared-kv-layers {a.shared_kv_layers}: the last two layers with their own KV cache must be "
                     "local then global (llama.cpp's rule)")
    if a.n_head % a.n_head_kv:
        ap.error("--n-head must be a multiple of --n-head-kv")
    if a.head_dim % 2:
        ap.error("--head-dim must be even")
    for o in a.tensor_type or []:
        part, _, t = o.partition("=")
        if not part or t not in TYPES:
            ap.error(f"--tensor-type {o}: expected PART=TYPE with TYPE one of {', '.join(TYPES)}")
    if TYPES[base_type(a.type)] in (ggufio.Q8_0, ggufio.Q4_0, ggufio.Q4_K):
        block = ggufio.BLOCK[TYPES[base_type(a.type)]][0]
        for n, v in (("n-embd", a.n_embd), ("n-ff", a.n_ff), ("n-head*head-dim", a.n_head * a.head_dim),
                     ("n-ff-exp", a.n_ff_exp if a.arch in MOE else block),
                     ("ssm-v-heads*ssm-head-dim", a.ssm_v_heads * a.ssm_head_dim if a.arch == "qwen35" else block),
                     ("n-embd-per-layer", a.n_embd_per_layer if a.arch == "gemma4" else block)):
            if v % block:
                ap.error(f"{a.type} needs {n} to be a multiple of {block} (got {v})")
    return a


def base_type(t: str) -> str:
    """The storage type of --type t's 2-D weights."""
    return MIXES[t][0] if t in MIXES else t


def write_model(a, tokenizer: dict | None = None, tensor_data=None) -> None:
    """Write the GGUF a.out for the arguments `a` (from build_args).

    tokenizer: tokenizer.ggml.* keys to embed (default: tokenizer_metadata(a.tokenizer, ...)); ints become u32,
    lists of ints i32 arrays, lists of floats f32 arrays.
    tensor_data(name, numpy_shape, ggml_type) -> the encoded tensor (as gen_tensor returns it), called once per
    tensor of tensor_plan(a) in file order (default: seeded random weights); lets trained weights reuse this writer.
    """
    import gguf
    arch = a.arch
    wtype = TYPES[base_type(a.type)]
    w = gguf.GGUFWriter(a.out, arch)  # adds general.architecture
    w.add_name(a.name or f"wgllm-test-{arch}-{a.type}" + (f"-{a.shape}" if a.shape else ""))
    w.add_file_type(FILE_TYPE[a.type])
    w.add_uint32("general.quantization_version", 2)
    w.add_uint32("general.alignment", ggufio.DEFAULT_ALIGNMENT)
    w.add_context_length(a.ctx)
    w.add_embedding_length(a.n_embd)
    w.add_block_count(a.n_layer)
    if arch == "gemma4":  # per layer: double-wide FFNs in the KV-sharing layers, fewer KV heads on global ones
        g4 = gemma4_layers(a)
        w.add_array(f"{arch}.feed_forward_length", [L["n_ff"] for L in g4])
    else:
        w.add_feed_forward_length(a.n_ff)
    w.add_head_count(a.n_head)
    if arch == "gemma4":
        w.add_array(f"{arch}.attention.head_count_kv", [L["n_kv"] for L in g4])
        w.add_key_length(a.global_head_dim)
        w.add_value_length(a.global_head_dim)
        w.add_uint32(f"{arch}.attention.key_length_swa", a.head_dim)
        w.add_uint32(f"{arch}.attention.value_length_swa", a.head_dim)
    elif arch in LFM2:  # per layer, 0 on short-convolution layers; no key/value length or rope dimension keys
        attn = lfm2_attn_layers(a)
        w.add_array(f"{arch}.attention.head_count_kv", [a.n_head_kv if i in attn else 0 for i in range(a.n_layer)])
    else:
        w.add_head_count_kv(a.n_head_kv)
        w.add_key_length(a.head_dim)
        w.add_value_length(a.head_dim)
    w.add_layer_norm_rms_eps(a.rms_eps)
    w.add_rope_freq_base(a.rope_base)
    if arch == "qwen35":
        w.add_rope_dimension_count(a.rope_dim)
        w.add_rope_dimension_sections(qwen35_rope_sections(a.rope_dim))
    elif arch == "gemma4":
        w.add_rope_dimension_count(a.global_head_dim)
        w.add_uint32(f"{arch}.rope.dimension_count_swa", a.head_dim)
        w.add_float32(f"{arch}.rope.freq_base_swa", 10000.0)
        w.add_sliding_window(a.sliding_window or max(1, a.ctx // 4))
        w.add_array(f"{arch}.attention.sliding_window_pattern", [L["local"] for L in g4])
        w.add_uint32(f"{arch}.attention.shared_kv_layers", a.shared_kv_layers)
        w.add_uint32(f"{arch}.embedding_length_per_layer_input", a.n_embd_per_layer)
        w.add_float32(f"{arch}.final_logit_softcapping", 30.0)
    elif arch not in LFM2:
        w.add_rope_dimension_count(a.head_dim)
    w.add_vocab_size(a.n_vocab)
    if arch in LFM2:
        w.add_uint32(f"{arch}.shortconv.l_cache", a.l_cache)
    if arch == "qwen35":
        w.add_ssm_conv_kernel(a.ssm_conv)
        w.add_ssm_state_size(a.ssm_head_dim)
        w.add_ssm_group_count(a.ssm_k_heads)
        w.add_ssm_time_step_rank(a.ssm_v_heads)
        w.add_ssm_inner_size(a.ssm_v_heads * a.ssm_head_dim)
        w.add_array(f"{arch}.attention.recurrent_layers", qwen35_delta_layers(a))
        w.add_full_attention_interval(a.full_attention_interval)
    if arch in ("gemma3", "gpt-oss"):
        w.add_sliding_window(a.sliding_window or max(1, a.ctx // 4))
    if a.rope_scaling == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(a.rope_scaling_factor)
        w.add_rope_scaling_orig_ctx_len(a.rope_scaling_orig_ctx)
    if arch in MOE:
        w.add_expert_count(a.n_expert)
        w.add_expert_used_count(a.n_expert_used)
        w.add_expert_feed_forward_length(a.n_ff_exp)
    if arch == "lfm2moe":
        w.add_uint32(f"{arch}.leading_dense_block_count", a.n_dense_lead)
        w.add_uint32(f"{arch}.expert_gating_func", 2)  # sigmoid
    # llama3 RoPE scaling is the rope_freqs.weight tensor alone (below), as in llama.cpp's Llama 3.x files: llama.cpp
    # aborts on a {arch}.rope.scaling.type of "llama3".

    tok = tokenizer if tokenizer is not None else tokenizer_metadata(a.tokenizer, arch, a.n_vocab)
    assert len(tok["tokenizer.ggml.tokens"]) == a.n_vocab
    for k, v in tok.items():
        if isinstance(v, bool):
            w.add_bool(k, v)
        elif isinstance(v, int):
            w.add_uint32(k, v)
        elif isinstance(v, str):
            w.add_string(k, v)
        elif isinstance(v, np.ndarray):
            w.add_array(k, v.tolist())  # int32 -> INT32, float32 -> FLOAT32 via numpy scalar types
        else:
            w.add_array(k, list(v))

    plan = tensor_plan(a)
    rope_freqs = None
    if a.rope_scaling == "llama3":
        rope_freqs = llama3_rope_factors(a.head_dim, a.head_dim, a.rope_base, a.rope_scaling_factor,
                                         a.rope_scaling_low, a.rope_scaling_high, a.rope_scaling_orig_ctx)
        plan.insert(0, ("rope_freqs.weight", (a.head_dim // 2,), "fixed", 0.0))
    if arch == "gemma4":  # the global layers' proportional RoPE: the first quarter of the angles turn
        half = a.global_head_dim // 2
        rope_freqs = np.array([1.0] * (half // 4) + [1e30] * (half - half // 4), dtype=np.float32)
        plan.insert(0, ("rope_freqs.weight", (half,), "fixed", 0.0))

    overrides = [o.split("=", 1) for o in (a.tensor_type or [])]

    def storage(name, shape):
        # F32 always, as the converter and llama-quantize keep them: the conv taps, every bias, the sinks
        if name.endswith(("shortconv.conv.weight", "ssm_conv1d.weight", ".bias", "attn_sinks.weight")):
            return ggufio.F32
        for part, t in overrides:
            if part in name and len(shape) >= 2:
                return TYPES[t]
        for part, t in MIXES.get(a.type, ("", []))[1]:
            if part in name and len(shape) == 3:
                return TYPES[t]
        return wtype if len(shape) >= 2 else ggufio.F32

    for name, shape, _, _ in plan:
        t = storage(name, shape)
        n = int(np.prod(shape))
        w.add_tensor_info(name, shape, np.dtype(np.float32), ggufio.nbytes(t, n),
                          raw_dtype=gguf.GGMLQuantizationType(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for name, shape, kind, std in plan:
        if kind == "fixed":
            data = rope_freqs
        elif tensor_data is not None:
            data = tensor_data(name, shape, storage(name, shape))
        else:
            data = gen_tensor(a.seed, a.arch, name, shape, kind, std, storage(name, shape))
        w.write_tensor_data(data)
    w.close()


def main(argv=None):
    a = build_args(argv)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    write_model(a)


if __name__ == "__main__":
    main()
