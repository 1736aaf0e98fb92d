#!/usr/bin/env python3
"""The tiny random Gemma 3 fixture: a transformers Gemma3ForCausalLM converted by llama.cpp's convert_hf_to_gguf.py,
and its float64 transformers logits and greedy tokens.

Writes, from nothing but seeds (no network):
  tests/data/models/gemma3-tiny-f32.gguf          the model as llama.cpp's converter writes it (F32)
  tests/data/models/ref/gemma3-tiny-f32.ref.gguf  reference logits and greedy tokens (the layout of hf_reference.py)
  tests/data/models/ref/gemma3-tiny-f32.ref.json  the same ids for people

The model: 7 layers (local, local, local, local, local, global, local: every 6th is global, as llama.cpp assumes
when the file has no pattern), n_embd 64, 4 heads of 32 (head_dim != n_embd / n_head), 2 KV heads (GQA), ffn 96,
a sliding window of 20 (shorter than the 64- and 130-token prompts, not a multiple of any key tile), global RoPE
base 1e6 and local 1e4, final logit softcapping 8 (llama.cpp honours it when present), tied embeddings. Every
parameter is drawn at random, the norm weights too (transformers stores w and scales by 1 + w; the converter
writes 1 + w). The vocabulary is a 512-piece SentencePiece BPE model (byte fallback, Gemma's special ids pad 0,
eos 1, bos 2, unk 3) trained on tests/data/tinyshakespeare.txt.

Needs torch, transformers (5.x), sentencepiece, numpy, safetensors, protobuf, and llama.cpp's source (tools/
llamacpp.sh --src-path; its gguf-py goes on PYTHONPATH for the converter):

  python3 tools/gemma3_fixture.py --llama-src "$(tools/llamacpp.sh --src-path)"
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import ggufio  # noqa: E402

NAME = "gemma3-tiny-f32"
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=7, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, sliding_window=20, max_position_embeddings=512, rms_norm_eps=1e-6)
ROPE_GLOBAL, ROPE_LOCAL, SOFTCAP = 1e6, 1e4, 8.0


def train_tokenizer(out_dir: Path) -> Path:
    import sentencepiece as spm
    text = (ROOT / "tests/data/tinyshakespeare.txt").read_text(encoding="utf-8")
    corpus = out_dir / "corpus.txt"
    corpus.write_text("\n".join(line for line in text.splitlines() if line.strip()) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(out_dir / "tokenizer"), vocab_size=512,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0, pad_id=0, eos_id=1,
                                   bos_id=2, unk_id=3, num_threads=1, add_dummy_prefix=False,
                                   split_digits=True, shuffle_input_sentence=False)
    return out_dir / "tokenizer.model"


def make_config(n_vocab: int):
    import inspect
    import transformers as tr
    kw = dict(SHAPE, vocab_size=n_vocab, query_pre_attn_scalar=SHAPE["head_dim"], final_logit_softcapping=SOFTCAP,
              attn_logit_softcapping=None, hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True,
              pad_token_id=0, eos_token_id=1, bos_token_id=2, use_cache=True)
    n = SHAPE["num_hidden_layers"]
    kw["layer_types"] = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    if "rope_parameters" in inspect.signature(tr.Gemma3TextConfig.__init__).parameters:  # transformers 5
        kw["rope_parameters"] = {"full_attention": {"rope_type": "default", "rope_theta": ROPE_GLOBAL},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": ROPE_LOCAL}}
    else:
        kw.update(rope_theta=ROPE_GLOBAL, rope_local_base_freq=ROPE_LOCAL, rope_scaling=None)
    cfg = tr.Gemma3TextConfig(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def make_model(cfg, seed: int):
    import torch
    import transformers as tr
    torch.manual_seed(seed)
    model = tr.Gemma3ForCausalLM(cfg).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            std = 0.3 if name.endswith("norm.weight") else 0.25 if "embed_tokens" in name else 0.12
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * std)
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", type=Path, required=True, help="llama.cpp source (tools/llamacpp.sh --src-path)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "tests/data/models")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--prompt-lengths", default="7,64,130")
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--tail", type=int, default=8)
    a = ap.parse_args(argv)
    import torch
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / "hf"
        hf_dir.mkdir()
        tok = train_tokenizer(Path(tmp))
        import sentencepiece as spm
        n_vocab = spm.SentencePieceProcessor(model_file=str(tok)).get_piece_size()
        cfg = make_config(n_vocab)
        model = make_model(cfg, a.seed)
        model.to(torch.float32).save_pretrained(hf_dir, safe_serialization=True)
        model.to(torch.float64)
        (hf_dir / "tokenizer.model").write_bytes(tok.read_bytes())
        (hf_dir / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "add_eos_token": False}))
        gguf_path = a.out_dir / f"{NAME}.gguf"
        env = dict(os.environ, PYTHONPATH=str(a.llama_src / "gguf-py"))
        subprocess.run([sys.executable, str(a.llama_src / "convert_hf_to_gguf.py"), str(hf_dir), "--outtype", "f32",
                        "--outfile", str(gguf_path)], check=True, env=env)

    # The float64 model holds the float32-rounded weights the file holds, so the reference is of the file.
    with torch.no_grad():
        for p in model.parameters():
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
          "reference.arch": "gemma3",
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
        print(f"prompt {i} (n={n}): greedy {greedy[:8]}..., top-2 gap {top[0] - top[1]:.4f}")
    ref_dir = a.out_dir / "ref"
    ref_dir.mkdir(parents=True, exist_ok=True)
    ggufio.write_simple(ref_dir / f"{NAME}.ref.gguf", kv, tensors)
    (ref_dir / f"{NAME}.ref.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
