#!/usr/bin/env python3
"""Reference logits and greedy tokens from Hugging Face transformers (float64) for GGUF models of make_model.py.

Needs torch + transformers (4.x or 5.x) and numpy; not the `gguf` package (the GGUF is read by ggufio.py) and no
network. For each model it builds LlamaConfig / Qwen2Config / Qwen3Config from the GGUF metadata, loads the
(dequantised) weights - llama Q/K rows un-permuted back to HF's half-split RoPE layout - runs prompts in float64
and writes <out-dir>/<model stem>.ref.gguf:

  KV      reference.model_sha256, reference.tensor_sha256, reference.source, reference.n_prompts, ...
  tensors prompt.{p}.tokens          I32 [n]       bos + seeded random ids of "normal" tokens
          prompt.{p}.logit_positions I32 [r]       which prompt positions have logits
          prompt.{p}.logits          F32 [r, n_vocab] (ne = [n_vocab, r])
          prompt.{p}.greedy          I32 [n_predict] greedy continuation (no EOS stop)

plus a small <stem>.ref.json with the same ids and greedy tokens for people.

  python3 tools/hf_reference.py MODEL.gguf [MODEL2.gguf ...] --out-dir DIR [--device cuda|cpu] [--check]

--check also runs tools/numpy_forward.py (independent float64 numpy, GGUF layout, adjacent-pair RoPE for llama)
on the same prompts and fails if logits differ by more than 3e-6 x max|logit| or greedy tokens differ. In float64,
transformers computes RoPE angles, RMSNorm and the attention softmax in float32, so its logits are good to ~1e-6
(numpy_forward is float64 throughout); both are far tighter than any float32/float16 engine tolerance.
"""
from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggufio  # noqa: E402
import numpy_forward  # noqa: E402


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF (adjacent-pair RoPE) -> HF (half-split RoPE) row order; the inverse of make_model.permute_qk."""
    hd = w.shape[0] // n_head
    return w.reshape(n_head, hd // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_prompts(r: ggufio.Reader, c, lengths, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    types = r.get("tokenizer.ggml.token_type")
    pool = np.arange(c.n_vocab) if types is None else np.nonzero(np.asarray(types) == 1)[0]
    bos = c.bos if c.bos is not None else int(pool[0])
    return [[bos] + pool[rng.integers(0, len(pool), n - 1)].tolist() for n in lengths]


def hf_model(r: ggufio.Reader, c, device: str):
    import torch
    import transformers as tr
    cls_cfg, cls_model = {"llama": (tr.LlamaConfig, tr.LlamaForCausalLM),
                          "qwen2": (tr.Qwen2Config, tr.Qwen2ForCausalLM),
                          "qwen3": (tr.Qwen3Config, tr.Qwen3ForCausalLM)}[c.arch]
    kw = dict(vocab_size=c.n_vocab, hidden_size=c.n_embd, intermediate_size=c.n_ff, num_hidden_layers=c.n_layer,
              num_attention_heads=c.n_head, num_key_value_heads=c.n_head_kv, head_dim=c.head_dim,
              max_position_embeddings=int(r.get(f"{c.arch}.context_length", 4096)), rms_norm_eps=c.rms_eps,
              tie_word_embeddings=c.tied, bos_token_id=None, eos_token_id=None, pad_token_id=None,
              hidden_act="silu", use_cache=True)
    if c.arch in ("llama", "qwen3"):
        kw["attention_bias"] = False
    if c.arch == "llama":
        kw["mlp_bias"] = False
    if c.arch in ("qwen2", "qwen3"):
        kw["use_sliding_window"] = False
    rope = {"rope_type": "default"}
    if c.rope_scaling is not None:
        s = c.rope_scaling
        rope = {"rope_type": "llama3", "factor": s["factor"], "low_freq_factor": s["low_freq_factor"],
                "high_freq_factor": s["high_freq_factor"],
                "original_max_position_embeddings": s["original_context_length"]}
    if "rope_parameters" in inspect.signature(cls_cfg.__init__).parameters:   # transformers 5
        kw["rope_parameters"] = dict(rope, rope_theta=c.rope_base)
    else:                                                                      # transformers 4
        kw["rope_theta"] = c.rope_base
        kw["rope_scaling"] = None if c.rope_scaling is None else dict(rope)
    cfg = cls_cfg(**kw)
    try:
        cfg._attn_implementation = "eager"
    except Exception:  # noqa: BLE001
        pass
    torch.manual_seed(0)
    model = cls_model(cfg).to(torch.float64)

    w = lambda n: torch.from_numpy(r.tensor(n, np.float64).copy())  # noqa: E731
    sd = {"model.embed_tokens.weight": w("token_embd.weight"), "model.norm.weight": w("output_norm.weight")}
    if not c.tied:
        sd["lm_head.weight"] = w("output.weight")
    for i in range(c.n_layer):
        p, q = f"blk.{i}.", f"model.layers.{i}."
        wq, wk = r.tensor(p + "attn_q.weight", np.float64), r.tensor(p + "attn_k.weight", np.float64)
        if c.arch == "llama":   # llama GGUFs store Q/K rows permuted for adjacent-pair RoPE
            wq, wk = unpermute_qk(wq, c.n_head), unpermute_qk(wk, c.n_head_kv)
        sd[q + "self_attn.q_proj.weight"] = torch.from_numpy(wq.copy())
        sd[q + "self_attn.k_proj.weight"] = torch.from_numpy(wk.copy())
        sd[q + "self_attn.v_proj.weight"] = w(p + "attn_v.weight")
        sd[q + "self_attn.o_proj.weight"] = w(p + "attn_output.weight")
        for b in ("q", "k", "v"):
            if f"{p}attn_{b}.bias" in r.tensors:
                sd[f"{q}self_attn.{b}_proj.bias"] = w(f"{p}attn_{b}.bias")
        if c.arch == "qwen3":
            sd[q + "self_attn.q_norm.weight"] = w(p + "attn_q_norm.weight")
            sd[q + "self_attn.k_norm.weight"] = w(p + "attn_k_norm.weight")
        sd[q + "input_layernorm.weight"] = w(p + "attn_norm.weight")
        sd[q + "post_attention_layernorm.weight"] = w(p + "ffn_norm.weight")
        sd[q + "mlp.gate_proj.weight"] = w(p + "ffn_gate.weight")
        sd[q + "mlp.up_proj.weight"] = w(p + "ffn_up.weight")
        sd[q + "mlp.down_proj.weight"] = w(p + "ffn_down.weight")
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if not (c.tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"state dict mismatch: missing {missing}, unexpected {unexpected}")
    if c.tied:
        model.tie_weights()
        assert torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)
    model = model.to(device).eval()

    # the rotary frequencies transformers derived from the config must be the ones the GGUF describes
    rf = r.tensor("rope_freqs.weight", np.float64) if "rope_freqs.weight" in r.tensors else None
    want = numpy_forward.rope_inv_freq(c, rf)
    found = [m for m in model.modules() if hasattr(m, "inv_freq")]
    assert found, "no rotary embedding module found"
    for m in found:
        if rf is not None and c.rope_scaling is None:
            # llama.cpp's Llama 3.x files carry the scaling as rope_freqs.weight alone (no rope.scaling.* keys, which
            # llama.cpp refuses): the rotary embedding gets the GGUF's frequencies themselves
            m.inv_freq.copy_(torch.from_numpy(want).to(m.inv_freq.dtype))
            if hasattr(m, "original_inv_freq"):
                m.original_inv_freq = m.inv_freq.clone()
        got = m.inv_freq.detach().double().cpu().numpy()
        if not np.allclose(got, want, rtol=1e-6, atol=0):
            raise RuntimeError(f"rope inv_freq mismatch:\n got  {got}\n want {want}")
        scale = getattr(m, "attention_scaling", 1.0)
        assert abs(float(scale) - 1.0) < 1e-12, f"unexpected rope attention_scaling {scale}"
    return model


def run_hf(model, prompt: list[int], n_predict: int, device: str):
    """(logits [len(prompt), n_vocab] float64, greedy tokens) with a KV cache, no EOS stop."""
    import torch
    # the cache argument is past_key_values in 4.x and early 5.x, cache later
    arg = "past_key_values" if "past_key_values" in inspect.signature(model.forward).parameters else "cache"
    with torch.no_grad():
        ids = torch.tensor([prompt], dtype=torch.long, device=device)
        out = model(input_ids=ids, use_cache=True)
        logits = out.logits[0].double().cpu().numpy()
        past, last, greedy = getattr(out, "past_key_values", None) or out.cache, out.logits[0, -1], []
        for _ in range(n_predict):
            t = int(torch.argmax(last))
            greedy.append(t)
            out = model(input_ids=torch.tensor([[t]], device=device), use_cache=True, **{arg: past})
            past, last = getattr(out, "past_key_values", None) or out.cache, out.logits[0, -1]
    return logits, greedy


def reference(path: Path, out_dir: Path, device: str, lengths, n_predict: int, tail: int, seed: int,
              check: bool) -> dict:
    import torch
    import transformers
    r = ggufio.Reader(path)
    c = numpy_forward.read_config(r)
    model = hf_model(r, c, device)
    prompts = make_prompts(r, c, lengths, seed)
    kv = {"general.architecture": "wgllm-reference",
          "reference.model_file": path.name,
          "reference.model_sha256": ggufio.sha256_file(path),
          "reference.tensor_sha256": ggufio.tensor_digest(r),
          "reference.arch": c.arch,
          "reference.source": f"transformers {transformers.__version__}, torch {torch.__version__}, float64, "
                              f"{device}, eager attention",
          "reference.n_prompts": len(prompts),
          "reference.n_predict": n_predict,
          "reference.prompt_seed": seed}
    tensors, summary = {}, {k.split(".", 1)[1]: v for k, v in kv.items() if k.startswith("reference.")}
    summary["prompts"] = []
    nf = numpy_forward.Model(path) if check else None
    shortest = min(len(p) for p in prompts)
    for i, prompt in enumerate(prompts):
        logits, greedy = run_hf(model, prompt, n_predict, device)
        n = len(prompt)
        rows = list(range(n)) if n == shortest else list(range(max(0, n - tail), n))
        tensors[f"prompt.{i}.tokens"] = np.array(prompt, dtype=np.int32)
        tensors[f"prompt.{i}.logit_positions"] = np.array(rows, dtype=np.int32)
        tensors[f"prompt.{i}.logits"] = logits[rows].astype(np.float32)
        tensors[f"prompt.{i}.greedy"] = np.array(greedy, dtype=np.int32)
        entry = {"tokens": prompt, "greedy": greedy, "logit_positions": rows,
                 "last_top5": np.argsort(-logits[-1])[:5].tolist()}
        if nf is not None:
            g2, l2 = nf.greedy(prompt, n_predict)
            d = float(np.max(np.abs(l2 - logits)))
            entry["numpy_max_abs_diff"] = d
            print(f"  prompt {i} (n={n}): max |hf - numpy| = {d:.3e}, greedy equal: {g2 == greedy}")
            if d > 3e-6 * max(1.0, float(np.abs(logits).max())) or g2 != greedy:
                raise RuntimeError(f"{path.name}: transformers and numpy_forward disagree on prompt {i}")
        summary["prompts"].append(entry)
    stem = path.name[:-5] if path.name.endswith(".gguf") else path.name
    out_dir.mkdir(parents=True, exist_ok=True)
    ggufio.write_simple(out_dir / f"{stem}.ref.gguf", kv, tensors)
    (out_dir / f"{stem}.ref.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path)
    ap.add_argument("--out-dir", type=Path, required=True)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--prompt-lengths", default="7,64,130")
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--tail", type=int, default=8, help="logit rows kept at the end of each longer prompt")
    ap.add_argument("--seed", type=int, default=0, help="prompt seed")
    ap.add_argument("--check", action="store_true", help="compare with tools/numpy_forward.py")
    a = ap.parse_args(argv)
    lengths = [int(x) for x in a.prompt_lengths.split(",")]
    for m in a.models:
        t0 = time.time()
        s = reference(m, a.out_dir, a.device, lengths, a.n_predict, a.tail, a.seed, a.check)
        print(f"{m.name}: {len(s['prompts'])} prompts, greedy[0] {s['prompts'][0]['greedy'][:8]}... "
              f"({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
