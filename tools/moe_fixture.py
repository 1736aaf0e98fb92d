#!/usr/bin/env python3
"""The tiny random mixture-of-experts fixtures: transformers Qwen3MoeForCausalLM and Lfm2MoeForCausalLM models
converted by llama.cpp's convert_hf_to_gguf.py, and their float64 transformers logits and greedy tokens (the files and layout of
lfm2_fixture.py, whose tokenizer, runs and reference writer this reuses).

Writes, from nothing but seeds (no network), for each NAME below:
  tests/data/models/NAME.gguf          the model as llama.cpp's converter writes it (F32)
  tests/data/models/ref/NAME.ref.gguf  reference logits and greedy tokens
  tests/data/models/ref/NAME.ref.json  the same ids for people

qwen3moe is qwen3's attention (per-head q/k RMSNorm, NeoX RoPE) with every FFN a mixture of experts: router logits
h W_router, a softmax over the experts, the top k kept and renormalised to sum to 1 (norm_topk_prob, which llama.cpp
always applies for qwen3moe), and the sum of the chosen experts' SwiGLU FFNs weighted by them. The models (n_embd 64,
every parameter drawn at random, the RMSNorm gains as 1 + 0.3 N(0, 1), the router's weights larger than the others
so that the top k are well separated):

  qwen3moe-tiny-f32     3 layers; 8 experts, top 2, expert FFN 32; 4 heads of 16, 2 KV heads; tied embeddings
  qwen3moe-tiny-k4-f32  2 layers; 16 experts, top 4, expert FFN 48; 4 heads of 16, 1 KV head; untied output
  qwen3moe-tiny-k1-f32  2 layers; 4 experts, top 1, expert FFN 40; 2 heads of 32, 2 KV heads; untied output

lfm2moe is LFM2 (gated short convolutions among attention layers) whose FFNs from layer num_dense_layers on are
mixtures of experts with sigmoid gating: p = sigmoid(router logits), the top k of p + a per-expert selection bias
(expert_bias, here random), their p divided by their sum:

  lfm2moe-tiny-f32      5 layers conv, attn, conv, attn, conv, the first 2 dense (FFN 96); 8 experts, top 2, expert
                        FFN 32; 4 heads of 16, 2 KV heads; L_cache 3; tied embeddings
  lfm2moe-tiny-k4-f32   4 layers attn, conv, conv, attn, the first dense (FFN 64); 16 experts, top 4, expert FFN 48;
                        4 heads of 16, 1 KV head; L_cache 4; tied embeddings (llama.cpp's converter maps no
                        lfm2moe lm_head: the released model ties it)

The vocabulary is lfm2_fixture.py's (a 512-token byte-level BPE), named "qwen2" (qwen3moe) or "lfm2" for the
converter.

Needs what lfm2_fixture.py needs (torch, transformers 5.x, tokenizers, numpy, safetensors, llama.cpp's source):

  python3 tools/moe_fixture.py --llama-src "$(tools/llamacpp.sh --src-path)" [--only NAME..]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import ggufio  # noqa: E402
import lfm2_fixture as lf  # noqa: E402

A, C = lf.A, lf.C
FIXTURES = {
    "lfm2moe-tiny-f32": dict(arch="lfm2moe", seed=51, layer_types=[C, A, C, A, C], num_dense_layers=2,
                             intermediate_size=96, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                             num_attention_heads=4, num_key_value_heads=2, conv_L_cache=3, rope_theta=1e6,
                             tie_word_embeddings=True),
    "lfm2moe-tiny-k4-f32": dict(arch="lfm2moe", seed=53, layer_types=[A, C, C, A], num_dense_layers=1,
                                intermediate_size=64, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=48,
                                num_attention_heads=4, num_key_value_heads=1, conv_L_cache=4, rope_theta=1e4,
                                tie_word_embeddings=True),
    "qwen3moe-tiny-f32": dict(seed=41, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                              moe_intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              rope_theta=1e6, tie_word_embeddings=True),
    "qwen3moe-tiny-k4-f32": dict(seed=43, num_hidden_layers=2, num_experts=16, num_experts_per_tok=4,
                                 moe_intermediate_size=48, num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                                 rope_theta=1e4, tie_word_embeddings=False),
    "qwen3moe-tiny-k1-f32": dict(seed=47, num_hidden_layers=2, num_experts=4, num_experts_per_tok=1,
                                 moe_intermediate_size=40, num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                                 rope_theta=1e4, tie_word_embeddings=False),
}


def make_config(spec: dict, n_vocab: int):
    import transformers as tr
    kw = {k: v for k, v in spec.items() if k not in ("seed", "rope_theta", "arch")}
    rope = {"rope_type": "default", "rope_theta": spec["rope_theta"]}
    ids = dict(pad_token_id=0, bos_token_id=1, eos_token_id=lf.SPECIALS.index(lf.EOS), use_cache=True)
    if spec.get("arch") == "lfm2moe":
        kw.update(vocab_size=n_vocab, hidden_size=lf.N_EMBD, num_hidden_layers=len(spec["layer_types"]),
                  max_position_embeddings=lf.N_CTX, norm_eps=lf.NORM_EPS, conv_bias=False, use_expert_bias=True,
                  norm_topk_prob=True, routed_scaling_factor=1.0, rope_parameters=rope, **ids)
        cfg = tr.Lfm2MoeConfig(**kw)
        cfg._attn_implementation = "eager"
        return cfg
    kw.update(vocab_size=n_vocab, hidden_size=lf.N_EMBD, intermediate_size=96, max_position_embeddings=lf.N_CTX,
              rms_norm_eps=lf.NORM_EPS, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
              rope_parameters={"rope_type": "default", "rope_theta": spec["rope_theta"]},
              pad_token_id=0, bos_token_id=1, eos_token_id=lf.SPECIALS.index(lf.EOS), use_cache=True)
    cfg = tr.Qwen3MoeConfig(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def make_model(cfg, seed: int):
    import torch
    import transformers as tr
    torch.manual_seed(seed)
    lfm = isinstance(cfg, tr.Lfm2MoeConfig)
    model = (tr.Lfm2MoeForCausalLM if lfm else tr.Qwen3MoeForCausalLM)(cfg).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            z = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if "norm" in name:  # every RMSNorm is weight * x
                p.copy_(1.0 + 0.3 * z)
            elif name.endswith("mlp.gate.weight"):  # qwen3moe's router: its softmax's top k well apart
                p.copy_(0.4 * z)
            elif name.endswith("feed_forward.gate.weight"):  # lfm2moe's: logits near 1, where the sigmoid is steep
                p.copy_(0.15 * z)
            elif name.endswith("conv.conv.weight"):
                p.copy_(0.5 * z)
            else:
                p.copy_(z * (0.25 if "embed_tokens" in name or "lm_head" in name else 0.12))
        for name, b in sorted(model.named_buffers()):
            if name.endswith("expert_bias"):  # lfm2moe's selection bias (zeros by default)
                b.copy_(0.1 * torch.randn(b.shape, generator=g, dtype=torch.float64))
    return model.eval()


def fixture(name: str, spec: dict, a) -> None:
    import torch
    gguf_path = a.out_dir / f"{name}.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / name  # the converter's general.name comes from it
        hf_dir.mkdir()
        n_vocab = lf.train_tokenizer(hf_dir)
        cfg = make_config(spec, n_vocab)
        model = make_model(cfg, spec["seed"])
        model.to(torch.float32).save_pretrained(hf_dir, safe_serialization=True)
        model.to(torch.float64)
        arch = spec.get("arch", "qwen3moe")
        lf.convert(a.llama_src, hf_dir, gguf_path, pre="lfm2" if arch == "lfm2moe" else "qwen2")

    # The float64 model holds the float32-rounded weights the file holds, so the reference is of the file.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.float32).to(torch.float64))
    r = ggufio.Reader(gguf_path)
    assert int(r.get(f"{arch}.expert_count")) == spec["num_experts"]
    assert int(r.get(f"{arch}.expert_used_count")) == spec["num_experts_per_tok"]
    assert int(r.get(f"{arch}.expert_feed_forward_length")) == spec["moe_intermediate_size"]
    assert ("output.weight" in r.tensors) != spec["tie_word_embeddings"]
    lf.write_reference(name, arch, model, gguf_path, a)


def main(argv=None):
    lf.cli(__doc__, FIXTURES, fixture, argv)


if __name__ == "__main__":
    main()
