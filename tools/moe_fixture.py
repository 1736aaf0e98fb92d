#!/usr/bin/env python3
"""The tiny random mixture-of-experts fixtures: transformers Qwen3MoeForCausalLM, Lfm2MoeForCausalLM and
GptOssForCausalLM models converted by llama.cpp's convert_hf_to_gguf.py, and their float64 transformers logits and
greedy tokens (the files and layout of lfm2_fixture.py, whose tokenizer, runs and reference writer this reuses).

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

gpt-oss (GptOssForCausalLM; llama.cpp's architecture "gpt-oss", its graph openai-moe.cpp) alternates sliding-window
attention (even layers) with full attention, every attention with biased q/k/v/o projections, NeoX RoPE and a learned
per-head sink: a logit that joins each row's softmax and is then dropped (its probability mass goes to no value).
Every FFN is a mixture of experts: router logits h W + b, the top k of them softmaxed, each chosen expert a clamped
SwiGLU with biases: gate = min(g, 7), up = clamp(u, -7, 7), out = W_down ((up + 1) gate sigmoid(1.702 gate)) + b_down,
g and u the even and odd columns of one gate_up projection (the converter splits them into ffn_gate_exps and
ffn_up_exps). The RMSNorm before the FFN is the converter's post_attention_norm. Every bias random (0.1 N(0, 1)),
the sinks 2 N(0, 1) (some far below the scores, some above them), the router 0.4 N(0, 1), the expert gate_up weights
0.45 N(0, 1) so that a few % of the gate and up values meet the clamps (the script counts them), untied output:

  gpt-oss-tiny-f32      4 layers sliding, full, sliding, full; sliding window 6; 8 experts, top 2, expert FFN 32;
                        4 heads of 16, 2 KV heads; YaRN RoPE (base 1e4, factor 4, original context 128 = 512 / 4,
                        beta_fast 32, beta_slow 1, the correction range truncated: the floor/ceil of llama.cpp's
                        ggml_rope_yarn_corr_dims, here dims 0 to 3; cos and sin scaled by 1 + 0.1 ln 4)
  gpt-oss-tiny-k4-f32   2 layers sliding, full; sliding window 5; 16 experts, top 4, expert FFN 48; 4 heads of 16,
                        1 KV head; plain RoPE (base 1e4)

(The released gpt-oss models, as GptOssConfig's default, say truncate false: transformers then ramps between
fractional correction dims, where llama.cpp always floors and ceils them; llama.cpp reads no beta from a gpt-oss file
either, using 32 and 1.) The windows
are shorter than every prompt with its continuation. The script checks every converted tensor against the
transformers parameter it came from (the converter splits gate_up's columns and transposes the stacked experts),
prints the share of clamped gate and up values over the reference runs (and fails outside 0.5-20%), and how far the
longest prompt's last logits move without the sinks.

The vocabulary is lfm2_fixture.py's (a 512-token byte-level BPE), named "qwen2" (qwen3moe), "lfm2" or "llama-bpe"
(gpt-oss: the vocabulary splits text with the Llama 3 regex, not gpt-oss's own "gpt-4o" one) for the converter.

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
    "gpt-oss-tiny-f32": dict(arch="gpt-oss", seed=71, num_hidden_layers=4, sliding_window=6, num_experts=8,
                             num_experts_per_tok=2, moe_intermediate_size=32, num_attention_heads=4,
                             num_key_value_heads=2, head_dim=16, rope_theta=1e4,
                             yarn=dict(factor=4.0, original_max_position_embeddings=128), tie_word_embeddings=False),
    "gpt-oss-tiny-k4-f32": dict(arch="gpt-oss", seed=65, num_hidden_layers=2, sliding_window=5, num_experts=16,
                                num_experts_per_tok=4, moe_intermediate_size=48, num_attention_heads=4,
                                num_key_value_heads=1, head_dim=16, rope_theta=1e4, tie_word_embeddings=False),
}
PRE = {"qwen3moe": "qwen2", "lfm2moe": "lfm2", "gpt-oss": "llama-bpe"}  # the converter's tokenizer.ggml.pre


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
    if spec.get("arch") == "gpt-oss":
        for k in ("num_experts", "moe_intermediate_size", "yarn"):
            kw.pop(k, None)
        if "yarn" in spec:  # truncate: the integer correction range of llama.cpp (beta_fast 32, beta_slow 1 its own)
            rope.update(rope_type="yarn", beta_fast=32.0, beta_slow=1.0, truncate=True, **spec["yarn"])
        n = spec["num_hidden_layers"]
        kw.update(vocab_size=n_vocab, hidden_size=lf.N_EMBD, num_local_experts=spec["num_experts"],
                  intermediate_size=spec["moe_intermediate_size"], max_position_embeddings=lf.N_CTX,
                  rms_norm_eps=lf.NORM_EPS, attention_bias=True, rope_parameters=rope,
                  layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(n)], **ids)
        cfg = tr.GptOssConfig(**kw)
        cfg._attn_implementation = "eager"  # eager_attention_forward adds the sinks to the softmax
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
    oss = isinstance(cfg, tr.GptOssConfig)
    cls = {tr.Lfm2MoeConfig: tr.Lfm2MoeForCausalLM, tr.GptOssConfig: tr.GptOssForCausalLM}
    model = cls.get(type(cfg), tr.Qwen3MoeForCausalLM)(cfg).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            z = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if "norm" in name:  # every RMSNorm is weight * x
                p.copy_(1.0 + 0.3 * z)
            elif name.endswith("mlp.gate.weight") or name.endswith("mlp.router.weight"):
                p.copy_(0.4 * z)  # qwen3moe's and gpt-oss's router: its softmax's top k well apart
            elif name.endswith("feed_forward.gate.weight"):  # lfm2moe's: logits near 1, where the sigmoid is steep
                p.copy_(0.15 * z)
            elif name.endswith("conv.conv.weight"):
                p.copy_(0.5 * z)
            elif oss and "bias" in name:  # gpt-oss's projection, router and expert biases
                p.copy_(0.1 * z)
            elif oss and name.endswith("self_attn.sinks"):  # gpt-oss's (empty by default): some far above the scores
                p.copy_(2.0 * z)
            elif oss and name.endswith("experts.gate_up_proj"):  # a few % of gpt-oss's gate and up values clamped
                p.copy_(0.45 * z)
            else:
                p.copy_(z * (0.25 if "embed_tokens" in name or "lm_head" in name else 0.12))
        for name, b in sorted(model.named_buffers()):
            if name.endswith("expert_bias"):  # lfm2moe's selection bias (zeros by default)
                b.copy_(0.1 * torch.randn(b.shape, generator=g, dtype=torch.float64))
    return model.eval()


def gpt_oss_tensors(model) -> dict:
    """The GGUF tensors llama.cpp's converter should make of a GptOssForCausalLM, as numpy arrays in the reader's
    layout (reversed ne: a weight [out, in], a stacked expert weight [expert, out, in])."""
    def f(t):
        return t.detach().to("cpu").numpy()
    m = model.model
    out = {"token_embd.weight": f(m.embed_tokens.weight), "output_norm.weight": f(m.norm.weight),
           "output.weight": f(model.lm_head.weight)}
    for i, layer in enumerate(m.layers):
        at, ex, b = layer.self_attn, layer.mlp.experts, f"blk.{i}."
        gate_up, gate_up_b = ex.gate_up_proj.transpose(1, 2), ex.gate_up_proj_bias  # [expert, 2 n_ff, n_embd]
        out.update({
            b + "attn_norm.weight": f(layer.input_layernorm.weight),
            b + "post_attention_norm.weight": f(layer.post_attention_layernorm.weight),
            b + "attn_sinks.weight": f(at.sinks),
            b + "ffn_gate_inp.weight": f(layer.mlp.router.weight), b + "ffn_gate_inp.bias": f(layer.mlp.router.bias),
            b + "ffn_gate_exps.weight": f(gate_up[:, ::2]), b + "ffn_gate_exps.bias": f(gate_up_b[:, ::2]),
            b + "ffn_up_exps.weight": f(gate_up[:, 1::2]), b + "ffn_up_exps.bias": f(gate_up_b[:, 1::2]),
            b + "ffn_down_exps.weight": f(ex.down_proj.transpose(1, 2)),
            b + "ffn_down_exps.bias": f(ex.down_proj_bias)})
        for x, proj in (("q", at.q_proj), ("k", at.k_proj), ("v", at.v_proj), ("output", at.o_proj)):
            out[f"{b}attn_{x}.weight"], out[f"{b}attn_{x}.bias"] = f(proj.weight), f(proj.bias)
    return out


def count_clamps(model) -> dict:
    """Counts, in every later forward of a GptOssForCausalLM, the expert gate values above the clamp (gate = min(g,
    7)) and the up values outside [-7, 7], of how many each: {"gate": n, "up": n, "of": n}."""
    counts = {"gate": 0, "up": 0, "of": 0}
    for layer in model.model.layers:
        ex = layer.mlp.experts

        def apply_gate(gate_up, ex=ex, apply=type(ex)._apply_gate):
            counts["gate"] += int((gate_up[..., ::2] > ex.limit).sum())
            counts["up"] += int((gate_up[..., 1::2].abs() > ex.limit).sum())
            counts["of"] += gate_up[..., ::2].numel()
            return apply(ex, gate_up)
        ex._apply_gate = apply_gate  # what the experts' forward calls (any experts implementation)
    return counts


def fixture(name: str, spec: dict, a) -> None:
    import numpy as np
    import torch
    gguf_path = a.out_dir / f"{name}.gguf"
    arch = spec.get("arch", "qwen3moe")
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / name  # the converter's general.name comes from it
        hf_dir.mkdir()
        n_vocab = lf.train_tokenizer(hf_dir)
        cfg = make_config(spec, n_vocab)
        model = make_model(cfg, spec["seed"])
        model.to(torch.float32).save_pretrained(hf_dir, safe_serialization=True)
        model.to(torch.float64)
        lf.convert(a.llama_src, hf_dir, gguf_path, pre=PRE[arch])

    # The float64 model holds the float32-rounded weights the file holds, so the reference is of the file.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.float32).to(torch.float64))
    r = ggufio.Reader(gguf_path)
    assert int(r.get(f"{arch}.expert_count")) == spec["num_experts"]
    assert int(r.get(f"{arch}.expert_used_count")) == spec["num_experts_per_tok"]
    assert int(r.get(f"{arch}.expert_feed_forward_length")) == spec["moe_intermediate_size"]
    assert ("output.weight" in r.tensors) != spec["tie_word_embeddings"]
    if arch != "gpt-oss":
        lf.write_reference(name, arch, model, gguf_path, a)
        return

    assert int(r.get("gpt-oss.attention.sliding_window")) == spec["sliding_window"]
    assert "blk.0.attn_sinks.weight" in r.tensors
    if "yarn" in spec:
        assert r.get("gpt-oss.rope.scaling.type") == "yarn"
        assert r.get("gpt-oss.rope.scaling.factor") == spec["yarn"]["factor"]
        assert r.get("gpt-oss.rope.scaling.original_context_length") == spec["yarn"]["original_max_position_embeddings"]
    else:
        assert r.get("gpt-oss.rope.scaling.type") is None
    want = gpt_oss_tensors(model)
    assert sorted(want) == sorted(r.tensors), sorted(set(want) ^ set(r.tensors))
    for k, w in want.items():  # the converter's split of gate_up, its transposes: the very values
        assert r.tensors[k].type == ggufio.F32 and np.array_equal(r.tensor(k, np.float64), w), k
    counts = count_clamps(model)
    lf.write_reference(name, arch, model, gguf_path, a)
    gate, up = counts["gate"] / counts["of"], counts["up"] / counts["of"]
    print(f"{name}: over the reference runs {100 * gate:.2f}% of the expert gate values above 7, "
          f"{100 * up:.2f}% of the up values outside [-7, 7] ({counts['of']} each)")
    assert 0.005 < gate < 0.2 and 0.005 < up < 0.2, (gate, up)

    # the sinks matter: without them (a sink of -inf takes nothing) the longest prompt's last logits move
    ref = ggufio.Reader(a.out_dir / "ref" / f"{name}.ref.gguf")
    last = int(ref.get("reference.n_prompts")) - 1
    tokens = torch.from_numpy(ref.tensors[f"prompt.{last}.tokens"].numpy(np.int64))[None]
    with torch.no_grad():
        with_sinks = model(input_ids=tokens, use_cache=False).logits[0, -1]
        for layer in model.model.layers:
            layer.self_attn.sinks.fill_(-torch.inf)
        without = model(input_ids=tokens, use_cache=False).logits[0, -1]
    print(f"{name}: without the sinks the last logits of prompt {len(tokens[0])} move by up to "
          f"{float((with_sinks - without).abs().max()):.3f}")


def main(argv=None):
    lf.cli(__doc__, FIXTURES, fixture, argv)


if __name__ == "__main__":
    main()
