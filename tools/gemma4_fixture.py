#!/usr/bin/env python3
"""The tiny random Gemma 4 fixtures: transformers Gemma4ForCausalLM models converted by llama.cpp's
convert_hf_to_gguf.py, and their float64 transformers logits and greedy tokens (the layout of gemma3_fixture.py).

Writes, from nothing but seeds (no network), for each NAME below:
  tests/data/models/NAME.gguf          the model as llama.cpp's converter writes it (F32)
  tests/data/models/ref/NAME.ref.gguf  reference logits and greedy tokens (the layout of hf_reference.py)
  tests/data/models/ref/NAME.ref.json  the same ids for people

Gemma 4's decoder layer is Gemma 3's (RMSNorm before and after the attention and the FFN, per-head q/k RMSNorm,
gelu_tanh, local sliding-window layers among global ones) with: an RMSNorm without gain on every v head; q.k
unscaled (scaling 1); the global layers' heads of their own width (global_head_dim) and "proportional" RoPE (NeoX
pairs over the whole head, only the first partial_rotary_factor of the angles turning); with attention_k_eq_v the
global layers have no v projection (v is k before its norm and RoPE) and num_global_key_value_heads KV heads; the
last num_kv_shared_layers layers compute no k or v and attend over the cache of the last earlier layer of their kind
(their FFN twice as wide with use_double_wide_mlp); a per-layer scalar on the layer's output; and per-layer
embeddings (PLE): per token and layer a vector of hidden_size_per_layer_input from a second embedding table and a
projection of the scaled embedding, which gates a down-and-up projection added to the residual stream after the FFN.
The norm gains are stored as is (no 1 + w, unlike Gemma 3). Every parameter is drawn at random (the norm gains as
1 + 0.3 N(0, 1), those of the q and k norms times head_dim^-1/4 since q.k is not scaled, the layer scalars in
[0.5, 1.5]):

  gemma4-tiny-f32     6 layers local, local, global, local, local, global; the last 3 share the KV of layers 1
                      (local) and 2 (global), with double-wide FFNs; n_embd 48, 4 heads, 2 KV heads; local heads of
                      16, global heads of 32 (RoPE on a quarter of the angles); sliding window 20; PLE width 16; FFN
                      48 (96 in the sharing layers); untied output; final logit softcapping 8
  gemma4-tiny-kv-f32  4 layers local, global, local, global; no sharing, no PLE; attention_k_eq_v (global layers:
                      1 KV head, k = v); n_embd 48, 4 heads, 2 KV heads of 16, global heads of 32 (RoPE on half of
                      the angles); sliding window 7; FFN 64; tied embeddings; final logit softcapping 30 (the
                      released models'; without the key llama.cpp caps at 30 where transformers does not cap)

The windows are shorter than the 64- and 130-token prompts. The tied model's greedy continuations repeat a token
(its embedding, in the residual stream, is also its output row), the untied one's do not. The vocabulary is a 512-piece SentencePiece BPE (byte
fallback, Gemma's special ids pad 0, eos 1, bos 2, unk 3) trained on tests/data/tinyshakespeare.txt, as transformers'
GemmaTokenizer writes it to tokenizer.json (the converter names it "gemma4").

Needs torch, transformers (5.x), sentencepiece, tokenizers, numpy, safetensors, and llama.cpp's source (tools/
llamacpp.sh --src-path; its gguf-py goes on PYTHONPATH for the converter):

  python3 tools/gemma4_fixture.py --llama-src "$(tools/llamacpp.sh --src-path)" [--only NAME..]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import ggufio  # noqa: E402

L, G = "sliding_attention", "full_attention"
FIXTURES = {
    "gemma4-tiny-f32": dict(seed=41, layer_types=[L, L, G, L, L, G], num_kv_shared_layers=3, use_double_wide_mlp=True,
                            hidden_size=48, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=16, global_head_dim=32, partial_rotary_factor=0.25, sliding_window=20,
                            hidden_size_per_layer_input=16, tie_word_embeddings=False, final_logit_softcapping=8.0),
    "gemma4-tiny-kv-f32": dict(seed=43, layer_types=[L, G, L, G], num_kv_shared_layers=0, use_double_wide_mlp=False,
                               hidden_size=48, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                               head_dim=16, global_head_dim=32, partial_rotary_factor=0.5, sliding_window=7,
                               hidden_size_per_layer_input=0, attention_k_eq_v=True, num_global_key_value_heads=1,
                               tie_word_embeddings=True, final_logit_softcapping=30.0),
}
ROPE_GLOBAL, ROPE_LOCAL = 1e6, 1e4


def make_tokenizer(out_dir: Path) -> Path:
    """A SentencePiece BPE trained on tinyshakespeare, saved by transformers' GemmaTokenizer (tokenizer.json)."""
    import sentencepiece as spm
    import transformers as tr
    text = (ROOT / "tests/data/tinyshakespeare.txt").read_text(encoding="utf-8")
    corpus = out_dir / "corpus.txt"
    corpus.write_text("\n".join(line for line in text.splitlines() if line.strip()) + "\n", encoding="utf-8")
    spm_dir = out_dir / "spm"
    spm_dir.mkdir()
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(spm_dir / "tokenizer"), vocab_size=512,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0, pad_id=0, eos_id=1,
                                   bos_id=2, unk_id=3, num_threads=1, add_dummy_prefix=False,
                                   split_digits=True, shuffle_input_sentence=False, minloglevel=2)
    tok_dir = out_dir / "tok"
    tr.GemmaTokenizer.from_pretrained(spm_dir).save_pretrained(tok_dir)
    return tok_dir


def make_config(spec: dict, n_vocab: int):
    import transformers as tr
    keys = ("layer_types", "num_kv_shared_layers", "use_double_wide_mlp", "hidden_size", "intermediate_size",
            "num_attention_heads", "num_key_value_heads", "head_dim", "global_head_dim", "sliding_window",
            "hidden_size_per_layer_input", "tie_word_embeddings", "final_logit_softcapping", "attention_k_eq_v",
            "num_global_key_value_heads")
    kw = {k: spec[k] for k in keys if k in spec}
    kw.update(vocab_size=n_vocab, vocab_size_per_layer_input=n_vocab, num_hidden_layers=len(spec["layer_types"]),
              max_position_embeddings=512, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
              pad_token_id=0, eos_token_id=1, bos_token_id=2, use_cache=True, enable_moe_block=False,
              rope_parameters={G: {"rope_type": "proportional", "rope_theta": ROPE_GLOBAL,
                                   "partial_rotary_factor": spec["partial_rotary_factor"]},
                               L: {"rope_type": "default", "rope_theta": ROPE_LOCAL}})
    cfg = tr.Gemma4TextConfig(**kw)
    cfg._attn_implementation = "eager"
    cfg.architectures = ["Gemma4ForCausalLM"]
    return cfg


def make_model(cfg, seed: int):
    import torch
    import transformers as tr
    torch.manual_seed(seed)
    model = tr.Gemma4ForCausalLM(cfg).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                # q.k is unscaled: the q and k norms' gains carry the 1 / sqrt(head_dim) of other models
                gain = p.shape[0] ** -0.25 if name.endswith(("q_norm.weight", "k_norm.weight")) else 1.0
                p.copy_(gain * (1 + torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.3))
            else:
                std = 0.25 if "embed_tokens" in name else 0.12
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * std)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g, dtype=torch.float64))
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def run(model, prompt: list[int], n_predict: int):
    """(logits [len(prompt), n_vocab] float64, greedy tokens) with a KV cache, no EOS stop."""
    import torch
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        logits, past, last, greedy = out.logits[0].double().numpy(), out.past_key_values, out.logits[0, -1], []
        for _ in range(n_predict):
            t = int(torch.argmax(last))
            greedy.append(t)
            out = model(input_ids=torch.tensor([[t]]), past_key_values=past, use_cache=True)
            past, last = out.past_key_values, out.logits[0, -1]
    return logits, greedy


def build(name: str, spec: dict, a) -> None:
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / "hf"
        tok_dir = make_tokenizer(Path(tmp))
        shutil.copytree(tok_dir, hf_dir)
        n_vocab = len(transformers.AutoTokenizer.from_pretrained(hf_dir))
        cfg = make_config(spec, n_vocab)
        model = make_model(cfg, spec["seed"])
        # save_pretrained leaves out the layer scalars (buffers): they go into the safetensors by hand
        model.to(torch.float32).save_pretrained(hf_dir, safe_serialization=True)
        from safetensors.torch import load_file, save_file
        st = hf_dir / "model.safetensors"
        tensors = load_file(st)
        for bname, b in model.named_buffers():
            if bname.endswith("layer_scalar"):
                tensors[bname] = b.to(torch.float32).contiguous()
        save_file(tensors, st, metadata={"format": "pt"})
        model.to(torch.float64)
        gguf_path = a.out_dir / f"{name}.gguf"
        env = dict(os.environ, PYTHONPATH=str(a.llama_src / "gguf-py"))
        subprocess.run([sys.executable, str(a.llama_src / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", "f32",
                        "--outfile", str(gguf_path)], check=True, env=env)

    # The float64 model holds the float32-rounded weights the file holds, so the reference is of the file.
    with torch.no_grad():
        for p in list(model.parameters()) + [b for n, b in model.named_buffers() if n.endswith("layer_scalar")]:
            p.copy_(p.to(torch.float32).to(torch.float64))
    r = ggufio.Reader(gguf_path)
    types = np.asarray(r.get("tokenizer.ggml.token_type"))
    pool = np.nonzero(types == 1)[0]
    bos = int(r.get("tokenizer.ggml.bos_token_id"))
    rng = np.random.default_rng(0)
    lengths = [int(x) for x in a.prompt_lengths.split(",")]
    prompts = [[bos] + pool[rng.integers(0, len(pool), n - 1)].tolist() for n in lengths]
    kv = {"general.architecture": "wgllm-reference",
          "reference.model_file": gguf_path.name,
          "reference.model_sha256": ggufio.sha256_file(gguf_path),
          "reference.tensor_sha256": ggufio.tensor_digest(r),
          "reference.arch": "gemma4",
          "reference.source": f"transformers {transformers.__version__}, torch {torch.__version__}, float64, cpu, "
                              f"eager attention; model from convert_hf_to_gguf.py",
          "reference.n_prompts": len(prompts),
          "reference.n_predict": a.n_predict,
          "reference.prompt_seed": 0}
    tensors, summary = {}, {k.split(".", 1)[1]: v for k, v in kv.items() if k.startswith("reference.")}
    summary["prompts"] = []
    shortest = min(lengths)
    for i, prompt in enumerate(prompts):
        logits, greedy = run(model, prompt, a.n_predict)
        n = len(prompt)
        rows = list(range(n)) if n == shortest else list(range(max(0, n - a.tail), n))
        tensors[f"prompt.{i}.tokens"] = np.array(prompt, dtype=np.int32)
        tensors[f"prompt.{i}.logit_positions"] = np.array(rows, dtype=np.int32)
        tensors[f"prompt.{i}.logits"] = logits[rows].astype(np.float32)
        tensors[f"prompt.{i}.greedy"] = np.array(greedy, dtype=np.int32)
        top = np.sort(logits[-1])[::-1]
        summary["prompts"].append({"tokens": prompt, "greedy": greedy, "logit_positions": rows,
                                   "last_top5": np.argsort(-logits[-1])[:5].tolist(),
                                   "last_top2_gap": float(top[0] - top[1])})
        print(f"{name} prompt {i} (n={n}): greedy {greedy[:8]}..., top-2 gap {top[0] - top[1]:.4f}")
    ref_dir = a.out_dir / "ref"
    ref_dir.mkdir(parents=True, exist_ok=True)
    ggufio.write_simple(ref_dir / f"{name}.ref.gguf", kv, tensors)
    (ref_dir / f"{name}.ref.json").write_text(json.dumps(summary, indent=1) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", type=Path, required=True, help="llama.cpp source (tools/llamacpp.sh --src-path)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "tests/data/models")
    ap.add_argument("--only", nargs="*", default=list(FIXTURES), choices=list(FIXTURES))
    ap.add_argument("--prompt-lengths", default="7,64,130")
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--tail", type=int, default=8)
    a = ap.parse_args(argv)
    for name in a.only:
        build(name, FIXTURES[name], a)


if __name__ == "__main__":
    main()
