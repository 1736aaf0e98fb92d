#!/usr/bin/env python3
"""Write the tiny test-model matrix into a folder (in one process, a few seconds).

  tools/make_test_models.py OUT_DIR [--list] [--only NAME ...]

Models (all n_embd 64, 2 layers, 4 heads, 2 kv heads, head_dim 16, ffn 128, vocab 1024, ctx 256):
  {llama,qwen2,qwen3}-{f32,f16,bf16,q8_0,q4_0}   seed 1, byte-level BPE tokenizer, untied output
  llama-rope3-tied-{f32,q8_0,q4_0}               seed 2, llama3 rope scaling (factor 8, orig ctx 64) as rope_freqs.weight, tied
  qwen2-tied-{f32,q8_0}                          seed 3, tied embeddings
  qwen2-mixed                                    seed 4, f16 with attn_v in q8_0 and ffn_up in f32
  qwen2-mixed-q4_0                               seed 4, q4_0 with attn_v in q8_0
  gemma3-mixed-q4_0                              seed 4, gemma3 (q/k norms, post-norms), q4_0 with attn_v in q8_0
  llama-spm-f32                                  seed 1, SentencePiece tokenizer (same tensors as llama-f32)
  llama-spm-{f16,q8_0}                           the same in F16 and Q8_0 (compared with llama.cpp)
  llama-q4_k                                     seed 9, n_embd 256, 4 heads of 64 (2 kv), ffn 512: Q4_K throughout
                                                 (its 256-element super-blocks need rows of 256)
  qwen3moe-{q8_0,mixed,mxfp4}                    seed 5, 8 experts of 64, 2 per token; mixed: f16 with the experts'
                                                 up in q8_0; mxfp4: llama-quantize's MXFP4_MOE mix (experts MXFP4,
                                                 the rest q8_0)
  gpt-oss-{q8_0,mxfp4}                           seed 7, 3 layers, 8 experts of 64, 2 per token, YaRN; mxfp4 as above
  qwen35-{q8_0,q4_0,mixed}                       seed 8, 4 layers: gated DeltaNet, gated attention, DeltaNet,
                                                 attention (2 key and 4 value heads of 16, 4 taps; RoPE on 4 of 16
                                                 dims), untied; mixed: q4_0 with layer 0's attn_qkv and layer 2's
                                                 ssm_alpha in q8_0
  gemma4-h512-f32                                seed 8, gemma4: 7 layers (local heads of 64, global ones of 512 with
                                                 1 KV head and v = k), the last 2 sharing KV, windows of 9
A given seed/arch/shape gives the same float weights in every type: the quantised files are the F32 file
quantised. Prints each file's sha256; with --manifest FILE also writes "sha256  name" lines.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggufio  # noqa: E402
import make_model  # noqa: E402

TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0"]


def matrix() -> dict[str, list[str]]:
    m = {}
    for arch in ("llama", "qwen2", "qwen3"):
        for t in TYPES:
            m[f"{arch}-{t}"] = ["--arch", arch, "--type", t, "--seed", "1"]
    for t in ("f32", "q8_0", "q4_0"):
        m[f"llama-rope3-tied-{t}"] = ["--arch", "llama", "--type", t, "--seed", "2", "--rope-scaling", "llama3",
                                      "--tie-embeddings"]
    for t in ("f32", "q8_0"):
        m[f"qwen2-tied-{t}"] = ["--arch", "qwen2", "--type", t, "--seed", "3", "--tie-embeddings"]
    m["llama-spm-f32"] = ["--arch", "llama", "--type", "f32", "--seed", "1", "--tokenizer", "spm"]
    m["llama-spm-f16"] = ["--arch", "llama", "--type", "f16", "--seed", "1", "--tokenizer", "spm"]
    m["llama-spm-q8_0"] = ["--arch", "llama", "--type", "q8_0", "--seed", "1", "--tokenizer", "spm"]
    m["llama-q4_k"] = ["--arch", "llama", "--type", "q4_k", "--seed", "9", "--n-embd", "256", "--n-head", "4",
                       "--n-head-kv", "2", "--head-dim", "64", "--n-ff", "512"]
    # projections of one layer in different types: the engine cannot fuse q/k/v or gate/up there
    m["qwen2-mixed"] = ["--arch", "qwen2", "--type", "f16", "--seed", "4", "--tensor-type", "attn_v=q8_0",
                        "--tensor-type", "ffn_up=f32"]
    # v alone in another block type (as Q4_K_M's Q6_K v): a GPU's decode reads q/k and v in one dispatch
    m["qwen2-mixed-q4_0"] = ["--arch", "qwen2", "--type", "q4_0", "--seed", "4", "--tensor-type", "attn_v=q8_0"]
    m["gemma3-mixed-q4_0"] = ["--arch", "gemma3", "--type", "q4_0", "--seed", "4", "--tensor-type", "attn_v=q8_0"]
    # mixtures of experts: 8 experts of 64, 2 per token; in the mixed one the experts' gate and up differ in type
    moe = ["--arch", "qwen3moe", "--seed", "5", "--n-expert", "8", "--n-expert-used", "2", "--n-ff-exp", "64"]
    m["qwen3moe-q8_0"] = moe + ["--type", "q8_0"]
    m["qwen3moe-mixed"] = moe + ["--type", "f16", "--tensor-type", "ffn_up_exps=q8_0"]
    m["qwen3moe-mxfp4"] = moe + ["--type", "mxfp4_moe"]
    # LFM2-MoE: conv, attn, conv, attn; the first layer dense; 8 experts of 64, 2 per token, a selection bias
    m["lfm2moe-q8_0"] = ["--arch", "lfm2moe", "--seed", "6", "--type", "q8_0", "--n-layer", "4", "--lfm2-attn-layers",
                         "1,3", "--n-dense-lead", "1", "--n-expert", "8", "--n-expert-used", "2", "--n-ff-exp", "64"]
    # gpt-oss: 3 layers (local, global, local: windows of 5), 8 experts of 64, 2 per token, YaRN x4 over 64 positions
    oss = ["--arch", "gpt-oss", "--seed", "7", "--n-layer", "3", "--n-expert", "8", "--n-expert-used", "2", "--n-ff-exp",
           "64", "--sliding-window", "5", "--rope-scaling", "yarn", "--rope-scaling-factor", "4", "--rope-scaling-orig-ctx",
           "64"]
    m["gpt-oss-q8_0"] = oss + ["--type", "q8_0"]
    m["gpt-oss-mxfp4"] = oss + ["--type", "mxfp4_moe"]  # as gpt-oss ships: the experts MXFP4 (their biases F32)
    # Qwen 3.5: DeltaNet, attention, DeltaNet, attention; 2 key heads each serving 2 of the 4 value heads
    q35 = ["--arch", "qwen35", "--seed", "8", "--n-layer", "4", "--full-attention-interval", "2", "--ssm-k-heads", "2",
           "--ssm-v-heads", "4", "--ssm-head-dim", "16"]
    for t in ("q8_0", "q4_0"):
        m[f"qwen35-{t}"] = q35 + ["--type", t]
    # layer 0's attn_qkv alone in another type (the other in-projections stacked apart from it), layer 2's ssm_alpha
    # (all four apart)
    m["qwen35-mixed"] = q35 + ["--type", "q4_0", "--tensor-type", "blk.0.attn_qkv=q8_0", "--tensor-type",
                               "blk.2.ssm_alpha=q8_0"]
    # gemma4 with the released models' global head width (512, the attention kernels' widest)
    m["gemma4-h512-f32"] = ["--arch", "gemma4", "--seed", "8", "--type", "f32", "--n-layer", "7", "--shared-kv-layers",
                            "2", "--head-dim", "64", "--global-head-dim", "512", "--n-head-kv-global", "1", "--k-eq-v",
                            "--sliding-window", "9"]
    return m


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--only", nargs="*", help="model names to write (default: all)")
    ap.add_argument("--list", action="store_true", help="print the command line of each model and exit")
    ap.add_argument("--manifest", type=Path, help="also write 'sha256  name' lines here")
    a = ap.parse_args(argv)
    todo = matrix()
    if a.only:
        unknown = set(a.only) - set(todo)
        if unknown:
            ap.error(f"unknown models {sorted(unknown)}")
        todo = {k: v for k, v in todo.items() if k in a.only}
    if a.list:
        for name, args in todo.items():
            print(f"tools/make_model.py {' '.join(args)} --out {name}.gguf")
        return
    a.out_dir.mkdir(parents=True, exist_ok=True)
    t0, lines = time.time(), []
    for name, args in todo.items():
        out = a.out_dir / f"{name}.gguf"
        make_model.write_model(make_model.build_args(args + ["--out", str(out)]))
        lines.append(f"{ggufio.sha256_file(out)}  {name}.gguf")
        print(lines[-1])
    if a.manifest:
        a.manifest.write_text("\n".join(lines) + "\n")
    print(f"{len(todo)} models in {time.time() - t0:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
