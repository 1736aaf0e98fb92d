#!/usr/bin/env python3
"""Independent float64 numpy forward pass of llama / qwen2 / qwen3 / lfm2 GGUF models, reading the file directly.

It works in GGUF space: llama Q/K rows are stored permuted, so llama uses adjacent-pair ("normal") RoPE on them;
qwen2/qwen3/lfm2 use half-split ("neox") RoPE. llama3 frequency scaling comes from rope_freqs.weight when present,
else from the {arch}.rope.scaling.* keys.

lfm2: attention.head_count_kv is a per-layer array, 0 on the gated short-convolution layers. Such a layer computes
B, C, x = in_proj(attn_norm(h)) (three n_embd slices of its output, in that order), then per channel c the causal
convolution out[t][c] = sum_k w[c][k] * (B*x)[t - (L-1) + k][c] with w = shortconv.conv.weight (ne = [L, n_embd]:
tap L-1 multiplies the current position, tap 0 the oldest; zeros before the sequence), and adds out_proj(C * out).
Its cache is the last L-1 rows of B*x. The final norm is token_embd_norm.weight.

  tools/numpy_forward.py MODEL.gguf [--tokens 1,2,3] [--n-predict 16]
"""
from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggufio  # noqa: E402


@dataclass
class Config:
    arch: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    rms_eps: float
    rope_base: float
    rope_dim: int
    rope_scaling: dict | None   # llama3: factor, low_freq_factor, high_freq_factor, original_context_length
    tied: bool
    bos: int | None
    layer_kv: tuple[int, ...] | None = None  # lfm2: KV heads per layer, 0 for a short-convolution layer
    l_cache: int = 0                          # lfm2: shortconv.l_cache, the convolution's length


def read_config(r: ggufio.Reader) -> Config:
    arch = r.get("general.architecture")
    g = lambda k, d=None: r.get(f"{arch}.{k}", d)  # noqa: E731
    n_embd, n_head = int(g("embedding_length")), int(g("attention.head_count"))
    head_dim = int(g("attention.key_length", n_embd // n_head))
    scaling = None
    if g("rope.scaling.type") == "llama3":
        scaling = dict(factor=float(g("rope.scaling.factor")), low_freq_factor=float(g("rope.scaling.low_freq_factor", 1.0)),
                       high_freq_factor=float(g("rope.scaling.high_freq_factor", 4.0)),
                       original_context_length=int(g("rope.scaling.original_context_length", 8192)))
    bos = r.get("tokenizer.ggml.bos_token_id")
    hkv = g("attention.head_count_kv", n_head)
    layer_kv = tuple(int(v) for v in hkv) if isinstance(hkv, (list, np.ndarray)) else None
    return Config(arch=arch, n_vocab=r.tensors["token_embd.weight"].ne[1], n_embd=n_embd,
                  n_layer=int(g("block_count")), n_head=n_head,
                  n_head_kv=max(layer_kv) if layer_kv else int(hkv),
                  head_dim=head_dim, n_ff=int(g("feed_forward_length")),
                  rms_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5)),
                  rope_base=float(g("rope.freq_base", 10000.0)), rope_dim=int(g("rope.dimension_count", head_dim)),
                  rope_scaling=scaling, tied="output.weight" not in r.tensors,
                  bos=None if bos is None else int(bos), layer_kv=layer_kv, l_cache=int(g("shortconv.l_cache", 0)))


def rope_inv_freq(c: Config, rope_freqs: np.ndarray | None) -> np.ndarray:
    """inverse frequencies [rope_dim/2] in float64, llama3 scaling applied."""
    inv = c.rope_base ** (-np.arange(0, c.rope_dim, 2, dtype=np.float64) / c.rope_dim)
    if rope_freqs is not None:
        return inv / rope_freqs.astype(np.float64)
    if c.rope_scaling is not None:
        s = c.rope_scaling
        f, lo, hi, n0 = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_context_length"]
        wl = 2 * np.pi / inv
        smooth = (n0 / wl - lo) / (hi - lo)
        out = np.where(wl > n0 / lo, inv / f, inv)
        mid = (wl >= n0 / hi) & (wl <= n0 / lo)
        return np.where(mid, (1 - smooth) * inv / f + smooth * inv, out)
    return inv


class Model:
    def __init__(self, path: str | Path):
        self.reader = r = ggufio.Reader(path)
        self.c = c = read_config(r)
        w = lambda n: r.tensor(n, np.float64)  # noqa: E731
        self.tok_embd = w("token_embd.weight")                      # [n_vocab, n_embd]
        self.output = self.tok_embd if c.tied else w("output.weight")
        self.output_norm = w("token_embd_norm.weight" if c.arch == "lfm2" else "output_norm.weight")
        self.layers = []
        for i in range(c.n_layer):
            p = f"blk.{i}."
            if c.layer_kv is not None and c.layer_kv[i] == 0:  # lfm2 short convolution
                self.layers.append({k: w(p + k + ".weight") for k in (
                    "attn_norm", "shortconv.conv", "shortconv.in_proj", "shortconv.out_proj",
                    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")})
                continue
            L = {k: w(p + k + ".weight") for k in ("attn_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                                                    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")}
            for k in ("attn_q", "attn_k", "attn_v"):
                L[k + "_b"] = w(p + k + ".bias") if p + k + ".bias" in r.tensors else None
            for k in ("attn_q_norm", "attn_k_norm"):
                L[k] = w(p + k + ".weight") if p + k + ".weight" in r.tensors else None
            self.layers.append(L)
        rf = r.tensor("rope_freqs.weight", np.float64) if "rope_freqs.weight" in r.tensors else None
        self.inv_freq = rope_inv_freq(c, rf)
        self.neox = c.arch in ("qwen2", "qwen3", "lfm2")

    def _rms(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.c.rms_eps) * w

    def _rope(self, x, pos):
        """x [T, H, hd], pos [T]"""
        c = self.c
        ang = pos[:, None].astype(np.float64) * self.inv_freq[None, :]     # [T, rope_dim/2]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x = x.copy()
        r = x[..., :c.rope_dim]
        if self.neox:
            h = c.rope_dim // 2
            a, b = r[..., :h].copy(), r[..., h:].copy()
            r[..., :h], r[..., h:] = a * cos - b * sin, a * sin + b * cos
        else:
            a, b = r[..., 0::2].copy(), r[..., 1::2].copy()
            r[..., 0::2], r[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return x

    def new_cache(self):
        """per layer: dict(k, v) for attention; dict(conv, n) for a short convolution (its last l_cache - 1 rows of
        B*x, and the positions seen)"""
        c = self.c
        return [dict(k=np.zeros((0, c.n_head_kv, c.head_dim)), v=np.zeros((0, c.n_head_kv, c.head_dim)))
                if "attn_q" in L else dict(conv=np.zeros((c.l_cache - 1, c.n_embd)), n=0) for L in self.layers]

    def _shortconv(self, h, L, state):
        """lfm2's gated short convolution of the normed h [T, n_embd]; updates state (dict(conv, n))."""
        T, E = h.shape
        b, g, x = np.split(h @ L["shortconv.in_proj"].T, 3, axis=-1)
        seq = np.concatenate([state["conv"], b * x])                        # [l_cache - 1 + T, E]
        w = L["shortconv.conv"]                                             # [E, l_cache]
        n = w.shape[1]
        out = sum(w[:, k] * seq[k:k + T] for k in range(n))                 # tap n-1: the current position
        state["conv"], state["n"] = seq[seq.shape[0] - (n - 1):], state["n"] + T
        return (g * out) @ L["shortconv.out_proj"].T

    def forward(self, tokens, cache=None) -> np.ndarray:
        """logits [T, n_vocab] (float64) for new tokens, appending to cache (a list from new_cache())."""
        c = self.c
        if cache is None:
            cache = self.new_cache()
        tokens = np.asarray(tokens, dtype=np.int64)
        T, past = len(tokens), cache[0]["k"].shape[0] if "k" in cache[0] else cache[0]["n"]
        pos = np.arange(past, past + T)
        x = self.tok_embd[tokens]
        g = c.n_head // c.n_head_kv
        mask = np.where(np.arange(past + T)[None, :] <= pos[:, None], 0.0, -np.inf)  # [T, S]
        for L, kv in zip(self.layers, cache):
            h = self._rms(x, L["attn_norm"])
            if "conv" in kv:
                x = x + self._shortconv(h, L, kv)
                h = self._rms(x, L["ffn_norm"])
                gt = h @ L["ffn_gate"].T
                x = x + ((gt / (1 + np.exp(-gt))) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
                continue
            q, k, v = h @ L["attn_q"].T, h @ L["attn_k"].T, h @ L["attn_v"].T
            if L["attn_q_b"] is not None:
                q, k, v = q + L["attn_q_b"], k + L["attn_k_b"], v + L["attn_v_b"]
            q = q.reshape(T, c.n_head, c.head_dim)
            k = k.reshape(T, c.n_head_kv, c.head_dim)
            v = v.reshape(T, c.n_head_kv, c.head_dim)
            if L["attn_q_norm"] is not None:
                q, k = self._rms(q, L["attn_q_norm"]), self._rms(k, L["attn_k_norm"])
            q, k = self._rope(q, pos), self._rope(k, pos)
            kv["k"] = np.concatenate([kv["k"], k])
            kv["v"] = np.concatenate([kv["v"], v])
            K = np.repeat(kv["k"], g, axis=1)                               # [S, H, hd]
            V = np.repeat(kv["v"], g, axis=1)
            s = np.einsum("thd,shd->hts", q, K) / np.sqrt(c.head_dim) + mask[None]
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            o = np.einsum("hts,shd->thd", s, V).reshape(T, c.n_head * c.head_dim)
            x = x + o @ L["attn_output"].T
            h = self._rms(x, L["ffn_norm"])
            gt = h @ L["ffn_gate"].T
            x = x + ((gt / (1 + np.exp(-gt))) * (h @ L["ffn_up"].T)) @ L["ffn_down"].T
        return self._rms(x, self.output_norm) @ self.output.T

    def greedy(self, prompt, n: int) -> tuple[list[int], np.ndarray]:
        """(n greedy tokens after prompt, logits [len(prompt), n_vocab] of the prompt)"""
        cache = self.new_cache()
        logits = self.forward(prompt, cache)
        out, last = [], logits[-1]
        for _ in range(n):
            t = int(np.argmax(last))
            out.append(t)
            last = self.forward([t], cache)[-1]
        return out, logits


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--tokens", default=None, help="comma-separated prompt ids (default: bos + 7 seeded ids)")
    ap.add_argument("--n-predict", type=int, default=16)
    a = ap.parse_args(argv)
    m = Model(a.model)
    if a.tokens:
        prompt = [int(t) for t in a.tokens.split(",")]
    else:
        rng = np.random.default_rng(0)
        prompt = [m.c.bos or 0] + rng.integers(0, m.c.n_vocab, 7).tolist()
    out, logits = m.greedy(prompt, a.n_predict)
    print("prompt:", prompt)
    print("greedy:", out)
    print("last logits: mean %.4f std %.4f max %.4f" % (logits[-1].mean(), logits[-1].std(), logits[-1].max()))


if __name__ == "__main__":
    main()
