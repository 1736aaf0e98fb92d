#!/usr/bin/env python3
"""The tiny random Qwen 3.5 fixtures: transformers Qwen3_5ForCausalLM models converted by llama.cpp's
convert_hf_to_gguf.py (architecture "qwen35"), and their float64 transformers logits and greedy tokens (the files and
layout of lfm2_fixture.py, whose reference writer this reuses).

Writes, from nothing but seeds (no network), for each NAME below:
  tests/data/models/NAME.gguf          the model as llama.cpp's converter writes it (F32)
  tests/data/models/ref/NAME.ref.gguf  reference logits and greedy tokens
  tests/data/models/ref/NAME.ref.json  the same ids for people

Qwen 3.5 mixes gated DeltaNet layers ("linear_attention") with gated full-attention layers, each followed by a SwiGLU
FFN. A DeltaNet layer projects h to q, k, v (in_proj_qkv: the converter's attn_qkv), z (in_proj_z: attn_gate), b and
a (ssm_beta, ssm_alpha); q, k, v pass a causal depthwise convolution of linear_conv_kernel_dim taps and SiLU (ssm_conv1d),
q and k are L2-normalised (x / sqrt(sum x^2 + 1e-6) in transformers; llama.cpp takes rms_norm_eps there, hence
rms_norm_eps 1e-6), q scaled by 1/sqrt(head_k_dim), and each value head runs the gated delta rule
    S <- exp(g) S;  S <- S + k (beta (v - S^T k))^T;  o = S^T q
with beta = sigmoid(b) and g = -exp(A_log) softplus(a + dt_bias) (the converter stores -exp(A_log) as ssm_a and dt_bias
as ssm_dt.bias); o is RMS-normed per head with a plain gain (linear_attn.norm: ssm_norm), multiplied by SiLU(z) and
projected back (out_proj: ssm_out). With fewer key than value heads, key head j serves value heads j r .. j r + r - 1
(transformers' repeat_interleave); the converter reorders the value heads of every linear-attention tensor to the
tiled order (value head i of the file uses key head i mod n_k). A full-attention layer is qwen3's (per-head q/k
RMSNorm, NeoX RoPE over the first partial_rotary_factor of each head; the file says interleaved MRoPE with sections
2, 1, 1 (MROPE_SECTION), which for text, all positions equal, is NeoX) whose q_proj also yields a per-head output gate: attention output times
sigmoid(gate) before o_proj. Every Qwen3_5RMSNorm is zero-centred, (1 + w) x / rms(x): the converter adds the 1, to all
but linear_attn.norm.

The models (n_embd 64, rms_norm_eps 1e-6, context 512, every parameter drawn at random: the zero-centred gains
0.3 N(0, 1), linear_attn.norm 1 + 0.3 N(0, 1), A = exp(A_log) log-uniform on [0.05, 2], dt_bias N(0, 1), in_proj_a
0.12 N(0, 1) so that exp(g) spreads over about 0.2 .. 0.99, in_proj_b 0.25 N(0, 1) so that beta spreads over (0, 1)):

  qwen35-tiny-f32      6 layers lin, lin, lin, full, lin, full; full attention 4 heads of 32, 2 KV heads, RoPE on
                       8 of 32 dims (factor 0.25), base 1e6; DeltaNet 2 key heads, 4 value heads (each key head serves
                       two: the value-head reordering), head dims 16, conv kernel 4; FFN 96; tied embeddings
  qwen35-tiny-k32-f32  4 layers lin, full, lin, lin; full attention 2 heads of 16, 1 KV head, RoPE on 8 of 16 (0.5),
                       base 1e4; DeltaNet 2 key and 2 value heads of 32, conv kernel 3; FFN 128; untied output

The vocabulary is lfm2_fixture.py's 512-token byte-level BPE on tiny Shakespeare, pre-tokenized here with Qwen 3.5's
split regex and Qwen's special tokens (<|endoftext|> 0: pad, and the BOS id of config.json, though none is added to a
text; <|im_start|> 1; <|im_end|> 2 = EOS) and a ChatML chat template; the converter, in this process, names its
pre-tokenizer "qwen35" (the tokenizer.ggml.pre of the released files). The reference prompts start with
<|endoftext|> (lfm2_fixture.write_reference puts the BOS id first).

Precision. transformers' Qwen 3.5 code computes in float32 whatever the model's dtype: both delta-rule functions
(torch_chunk_gated_delta_rule for a prompt, torch_recurrent_gated_delta_rule for a cached decode step) cast q, k, v,
beta and g to float32, as do the RMSNorms, the gated norm, exp(A_log), softplus, the RoPE angles and the attention
softmax. The references are made with those functions recompiled from transformers' own source with float32 read as
float64 (the pure-torch paths: no fla, causal_conv1d or hub kernels, which the script checks are absent), so the
stored logits are float64 throughout (cached and uncached runs agree to ~1e-13). The script prints how far the stock
float32 code lands from them: up to 1.2e-5 (qwen35-tiny-f32) and 1.8e-6 (qwen35-tiny-k32-f32) of the largest logit,
the float32 chunked delta rule alone 2e-6 and 7e-7 of its largest output; so float32 references would miss 1e-6. It
also checks, layer by layer, the float64 chunked delta rule against a float64
numpy recurrence. The greedy continuation runs with transformers' cache (convolution and recurrent states, KV cache),
then every logit row of prompt + continuation is recomputed without a cache and compared, as in lfm2_fixture.py.

With --llama-bin (llama.cpp's bin directory, tools/llamacpp.sh --bin) the script also decodes every reference prompt
greedily with llama.cpp (its libllama through llama-cpp-python's ctypes bindings from the same source tree) and
prints whether the 32 tokens equal transformers'; it changes no file.

Needs torch, transformers (5.x), tokenizers, numpy, safetensors, and llama.cpp's source (tools/llamacpp.sh
--src-path; its gguf-py goes on sys.path for the converter):

  python3 tools/qwen35_fixture.py --llama-src "$(tools/llamacpp.sh --src-path)" [--llama-bin "$(tools/llamacpp.sh --bin)"] [--only NAME..]
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import ggufio  # noqa: E402
import lfm2_fixture as lf  # noqa: E402

L, F = "linear_attention", "full_attention"
FIXTURES = {
    "qwen35-tiny-f32": dict(seed=85, layer_types=[L, L, L, F, L, F], num_attention_heads=4, num_key_value_heads=2,
                            head_dim=32, partial_rotary_factor=0.25, rope_theta=1e6, linear_num_key_heads=2,
                            linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
                            linear_conv_kernel_dim=4, intermediate_size=96, tie_word_embeddings=True),
    "qwen35-tiny-k32-f32": dict(seed=83, layer_types=[L, F, L, L], num_attention_heads=2, num_key_value_heads=1,
                                head_dim=16, partial_rotary_factor=0.5, rope_theta=1e4, linear_num_key_heads=2,
                                linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=32,
                                linear_conv_kernel_dim=3, intermediate_size=128, tie_word_embeddings=False),
}
N_EMBD, N_CTX, NORM_EPS = 64, 512, 1e-6
# The interleaved-MRoPE sections, in rotated pairs: as in the released files they add up to the rotated dims / 2 (there
# 11 + 11 + 10 = 64 / 2; ggml's CPU rope asserts that their sum is at most head_dim, which the default does not meet
# with head_dim 16). For text every position id is the same in all sections: plain NeoX RoPE.
MROPE_SECTION = [2, 1, 1]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
PAD = BOS = "<|endoftext|>"
EOS = "<|im_end|>"
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{%- for message in messages -%}"
                 "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
                 "{%- endfor -%}"
                 "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")


def train_tokenizer(hf_dir: Path) -> int:
    """tokenizer.json + tokenizer_config.json into hf_dir (Qwen's layout, no BOS added); the vocabulary size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    text = (ROOT / "tests/data/tinyshakespeare.txt").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE(ignore_merges=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, show_progress=False, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text[i:i + 4096] for i in range(0, len(text), 4096)], trainer=trainer)
    assert [tok.token_to_id(s) for s in SPECIALS] == list(range(len(SPECIALS)))
    tok.save(str(hf_dir / "tokenizer.json"))
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": EOS, "pad_token": PAD,
         "add_bos_token": False, "add_eos_token": False, "model_max_length": N_CTX,
         "chat_template": CHAT_TEMPLATE}, indent=1))
    return tok.get_vocab_size()


def make_config(spec: dict, n_vocab: int):
    import transformers as tr
    kw = {k: v for k, v in spec.items() if k not in ("seed", "rope_theta", "partial_rotary_factor")}
    kw.update(vocab_size=n_vocab, hidden_size=N_EMBD, num_hidden_layers=len(spec["layer_types"]),
              max_position_embeddings=N_CTX, rms_norm_eps=NORM_EPS, hidden_act="silu", attention_bias=False,
              rope_parameters={"rope_type": "default", "rope_theta": spec["rope_theta"],
                               "partial_rotary_factor": spec["partial_rotary_factor"],
                               "mrope_interleaved": True, "mrope_section": MROPE_SECTION},
              pad_token_id=SPECIALS.index(PAD), bos_token_id=SPECIALS.index(BOS), eos_token_id=SPECIALS.index(EOS),
              use_cache=True)
    cfg = tr.Qwen3_5TextConfig(**kw)
    cfg.architectures = ["Qwen3_5ForCausalLM"]
    cfg._attn_implementation = "eager"
    return cfg


def make_model(cfg, seed: int):
    import torch
    import transformers as tr
    torch.manual_seed(seed)
    model = tr.Qwen3_5ForCausalLM(cfg).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            z = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if name.endswith("linear_attn.norm.weight"):  # Qwen3_5RMSNormGated: weight * x
                p.copy_(1.0 + 0.3 * z)
            elif "norm" in name:  # Qwen3_5RMSNorm: (1 + weight) * x
                p.copy_(0.3 * z)
            elif name.endswith("A_log"):  # A log-uniform on [0.05, 2]
                u = torch.rand(p.shape, generator=g, dtype=torch.float64)
                p.copy_(np.log(0.05) + u * (np.log(2.0) - np.log(0.05)))
            elif name.endswith("dt_bias"):
                p.copy_(z)
            elif name.endswith("conv1d.weight"):
                p.copy_(0.5 * z)
            elif name.endswith("in_proj_b.weight"):  # beta = sigmoid(b) over (0, 1)
                p.copy_(0.25 * z)
            else:  # in_proj_a among them: a of about N(0, 1)
                p.copy_(z * (0.25 if "embed_tokens" in name or "lm_head" in name else 0.12))
    return model.eval()


# --- transformers' Qwen 3.5 code in float64 -------------------------------------------------------------------------

def _modeling():
    import transformers.models.qwen3_5.modeling_qwen3_5 as m
    return m


def check_pure_torch() -> None:
    """transformers must take its own torch code: no fla, causal_conv1d or kernels package to swap in."""
    m = _modeling()
    for f in (m.torch_chunk_gated_delta_rule, m.torch_recurrent_gated_delta_rule, m.causal_conv1d_fn,
              m.causal_conv1d_update):
        assert getattr(f, "__module__", None) == m.__name__, f"{f} is not transformers' torch code"
    for pkg in ("fla", "causal_conv1d", "kernels"):
        assert importlib.util.find_spec(pkg) is None, f"{pkg} is installed: transformers would use its kernels"


def _float64_source(obj) -> str:
    src = textwrap.dedent(inspect.getsource(obj))
    src = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith("@"))  # no decorators
    out = (src.replace("torch.float32", "torch.float64").replace("dtype=torch.float)", "dtype=torch.float64)")
              .replace(".float()", ".double()"))
    return out


class Float64:
    """A context in which transformers' Qwen 3.5 code computes in float64: its delta-rule functions, RMSNorms, gated
    norm, DeltaNet forward (exp(A_log), softplus), RoPE and eager attention recompiled from their source with float32
    read as float64, the RoPE frequencies recomputed in float64."""

    def __init__(self, model):
        import torch
        m = _modeling()
        self.model, self.saved, self.patches = model, [], []
        self.ns = ns = dict(vars(m))  # the recompiled code's globals
        for fname in ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "l2norm",
                      "eager_attention_forward"):
            exec(_float64_source(getattr(m, fname)), ns)
            self.patches.append((m, fname, ns[fname]))
        for cls, meth in ((m.Qwen3_5RMSNorm, "forward"), (m.Qwen3_5RMSNormGated, "forward"),
                          (m.Qwen3_5GatedDeltaNet, "forward"), (m.Qwen3_5TextRotaryEmbedding, "forward")):
            exec(_float64_source(getattr(cls, meth)), ns)
            f = ns[meth]
            if cls is m.Qwen3_5TextRotaryEmbedding:
                f = torch.no_grad()(f)
            self.patches.append((cls, meth, f))
        rope = model.model.rotary_emb
        p = model.config.rope_parameters
        dim = int(model.config.head_dim * p["partial_rotary_factor"])
        self.inv_freq = 1.0 / (p["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        assert torch.allclose(self.inv_freq, rope.inv_freq.double(), rtol=1e-6)

    def __enter__(self):
        rope = self.model.model.rotary_emb
        self.saved = [(o, n, getattr(o, n)) for o, n, _ in self.patches] + [(rope, "inv_freq", rope.inv_freq)]
        for o, n, f in self.patches:
            setattr(o, n, f)
        rope.inv_freq = self.inv_freq
        return self

    def __exit__(self, *exc):
        for o, n, f in self.saved:
            setattr(o, n, f)


def delta_rule_numpy(q, k, v, g, beta):
    """The gated delta rule in float64 numpy, token by token ([seq, heads, dim] q, k (heads repeated), v; [seq, heads]
    g, beta), with transformers' L2 norm (eps 1e-6) and 1/sqrt(d) query scale."""
    q = q / np.sqrt((q * q).sum(-1, keepdims=True) + 1e-6) / np.sqrt(q.shape[-1])
    k = k / np.sqrt((k * k).sum(-1, keepdims=True) + 1e-6)
    S = np.zeros((v.shape[1], k.shape[-1], v.shape[-1]))
    out = np.zeros_like(v)
    for t in range(v.shape[0]):
        S *= np.exp(g[t])[:, None, None]
        delta = beta[t][:, None] * (v[t] - np.einsum("hk,hkv->hv", k[t], S))
        S += k[t][:, :, None] * delta[:, None, :]
        out[t] = np.einsum("hk,hkv->hv", q[t], S)
    return out


def probe_delta_net(model, f64: Float64, tokens: list[int]) -> dict:
    """Runs tokens without a cache (float64 code) and records every DeltaNet's delta-rule inputs: the spread of exp(g)
    and beta, and how far the chunked float64 rule (and transformers' stock float32 one) is from the numpy
    recurrence."""
    import torch
    chunk64, stock = f64.ns["torch_chunk_gated_delta_rule"], _modeling().torch_chunk_gated_delta_rule
    seen = {"decay": [], "beta": [], "err64": 0.0, "err32": 0.0}

    def probe(query, key, value, g, beta, **kw):
        out, state = chunk64(query, key, value, g=g, beta=beta, **kw)
        ref = delta_rule_numpy(*(x[0].detach().numpy() for x in (query, key, value, g, beta)))
        o32, _ = stock(query, key, value, g=g, beta=beta, **kw)
        scale = np.abs(ref).max()
        seen["err64"] = max(seen["err64"], float(np.abs(out[0].numpy() - ref).max() / scale))
        seen["err32"] = max(seen["err32"], float(np.abs(o32[0].double().numpy() - ref).max() / scale))
        seen["decay"].append(torch.exp(g).flatten().numpy())
        seen["beta"].append(beta.flatten().numpy())
        return out, state

    f64.ns["torch_chunk_gated_delta_rule"] = probe
    try:
        with f64, torch.no_grad():
            model(input_ids=torch.tensor([tokens]), use_cache=False)
    finally:
        f64.ns["torch_chunk_gated_delta_rule"] = chunk64
    seen["decay"], seen["beta"] = np.concatenate(seen["decay"]), np.concatenate(seen["beta"])
    return seen


# --- llama.cpp -------------------------------------------------------------------------------------------------------

def llama_greedy(llama_src: Path, llama_bin: Path, gguf_path: Path, prompts: list[list[int]], n: int) -> list:
    """llama.cpp's greedy continuation (n ids) of every prompt, through llama-cpp-python's ctypes bindings (the
    package's modules alone, its __init__ skipped) over the libllama of llama_bin."""
    import ctypes
    os.environ["LLAMA_CPP_LIB_PATH"] = str(llama_bin)
    pkg_dir = llama_src.parent.parent / "llama_cpp"
    if "llama_cpp" not in sys.modules:
        pkg = types.ModuleType("llama_cpp")
        pkg.__path__ = [str(pkg_dir)]
        sys.modules["llama_cpp"] = pkg
    import llama_cpp.llama_cpp as ll
    quiet = ll.llama_log_callback(lambda level, text, data: None)
    ll.llama_log_set(quiet, ctypes.c_void_p(0))
    ll.llama_backend_init()
    model = ll.llama_model_load_from_file(str(gguf_path).encode(), ll.llama_model_default_params())
    assert model, f"llama.cpp cannot load {gguf_path}"
    n_vocab = ll.llama_vocab_n_tokens(ll.llama_model_get_vocab(model))
    results = []
    for prompt in prompts:
        cp = ll.llama_context_default_params()
        cp.n_ctx = len(prompt) + n + 1
        cp.n_batch = cp.n_ubatch = max(len(prompt), 512)
        cp.n_threads = cp.n_threads_batch = 2
        ctx = ll.llama_init_from_model(model, cp)
        ids, gaps, batch = [], [], list(prompt)
        for _ in range(n):
            arr = (ll.llama_token * len(batch))(*batch)
            assert ll.llama_decode(ctx, ll.llama_batch_get_one(arr, len(batch))) == 0
            logits = np.ctypeslib.as_array(ll.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
            top = np.sort(logits)[::-1]
            ids.append(int(np.argmax(logits)))
            gaps.append(float(top[0] - top[1]))
            batch = [ids[-1]]
        ll.llama_free(ctx)
        results.append((ids, gaps))
    ll.llama_model_free(model)
    return results


def convert(llama_src: Path, hf_dir: Path, gguf_path: Path) -> None:
    """lfm2_fixture.convert with --no-mtp: the models have no multi-token-prediction layers, which the converter
    otherwise asks for."""
    subprocess.run([sys.executable, "-c", lf.CONVERT, str(llama_src), "qwen35", str(hf_dir), "--outtype", "f32",
                    "--no-mtp", "--outfile", str(gguf_path)], check=True, env=dict(os.environ, NO_LOCAL_GGUF="1"))


# --- the fixtures ----------------------------------------------------------------------------------------------------

def fixture(name: str, spec: dict, a) -> None:
    import torch
    check_pure_torch()
    gguf_path = a.out_dir / f"{name}.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir = Path(tmp) / name  # the converter's general.name comes from it
        hf_dir.mkdir()
        n_vocab = train_tokenizer(hf_dir)
        cfg = make_config(spec, n_vocab)
        model = make_model(cfg, spec["seed"])
        model.to(torch.float32).save_pretrained(hf_dir, safe_serialization=True)
        model.to(torch.float64)
        convert(a.llama_src, hf_dir, gguf_path)

    # The float64 model holds the float32-rounded weights the file holds, so the reference is of the file.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.float32).to(torch.float64))
    r = ggufio.Reader(gguf_path)
    assert r.get("general.architecture") == "qwen35"
    assert r.get("tokenizer.ggml.pre") == "qwen35"
    assert [bool(x) for x in r.get("qwen35.attention.recurrent_layers")] == [t == L for t in spec["layer_types"]]
    assert int(r.get("qwen35.ssm.conv_kernel")) == spec["linear_conv_kernel_dim"]
    assert int(r.get("qwen35.rope.dimension_count")) == int(spec["head_dim"] * spec["partial_rotary_factor"])
    assert list(r.get("qwen35.rope.dimension_sections"))[:3] == MROPE_SECTION
    assert 2 * sum(MROPE_SECTION) == int(r.get("qwen35.rope.dimension_count"))
    assert ("output.weight" in r.tensors) != spec["tie_word_embeddings"]

    f64 = Float64(model)
    with f64:
        lf.write_reference(name, "qwen35", model, gguf_path, a)
    ref = ggufio.Reader(a.out_dir / "ref" / f"{name}.ref.gguf")
    n_prompts = int(ref.get("reference.n_prompts"))
    prompts = [ref.tensors[f"prompt.{i}.tokens"].numpy(np.int64).tolist() for i in range(n_prompts)]
    greedy = [ref.tensors[f"prompt.{i}.greedy"].numpy(np.int64).tolist() for i in range(n_prompts)]

    # transformers' stock float32 code against the float64 references: every logit row of prompt + continuation
    worst = 0.0
    for prompt, cont in zip(prompts, greedy):
        seq = prompt + cont[:-1]
        with f64:
            want = lf.run_nocache(model, seq)
        got = lf.run_nocache(model, seq)
        worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    print(f"{name}: transformers' float32 code vs float64: largest logit difference {worst:.2e} of the largest logit")

    seen = probe_delta_net(model, f64, prompts[-1] + greedy[-1][:-1])
    d, b = seen["decay"], seen["beta"]
    print(f"{name}: exp(g) percentiles 5/50/95 {np.percentile(d, 5):.3f} {np.percentile(d, 50):.3f} "
          f"{np.percentile(d, 95):.3f}; beta {np.percentile(b, 5):.3f} {np.percentile(b, 50):.3f} "
          f"{np.percentile(b, 95):.3f}; chunked delta rule vs numpy recurrence: float64 {seen['err64']:.1e}, "
          f"float32 {seen['err32']:.1e} (of the largest output)")
    assert 0.1 < np.percentile(d, 10) and np.percentile(d, 90) < 0.995, "the decay leaves too little or too much"
    assert 0.05 < np.percentile(b, 10) and np.percentile(b, 90) < 0.95
    assert seen["err64"] < 1e-12

    summary = json.loads((a.out_dir / "ref" / f"{name}.ref.json").read_text())
    last_logits = ref.tensors[f"prompt.{n_prompts - 1}.logits"].numpy(np.float64)
    print(f"{name}: distinct greedy tokens per prompt {[len(set(p['greedy'])) for p in summary['prompts']]}, "
          f"logit std {last_logits.std():.3f}")
    assert all(len(set(p["greedy"])) >= 4 for p in summary["prompts"]), "degenerate greedy continuations"

    if a.llama_bin:
        for i, ((ids, gaps), want) in enumerate(zip(llama_greedy(a.llama_src, a.llama_bin, gguf_path, prompts,
                                                                 a.n_predict), greedy)):
            same = next((j for j, (x, y) in enumerate(zip(ids, want)) if x != y), len(want))
            what = "equal" if same == len(want) else f"first difference at step {same} (gap {gaps[same]:.4f})"
            print(f"{name} prompt {i}: llama.cpp's {len(ids)} greedy tokens vs transformers': {what}")


def main(argv=None):
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--llama-bin", type=Path, default=None)
    known, rest = extra.parse_known_args(argv)

    def make(name, spec, a):
        a.llama_bin = known.llama_bin
        fixture(name, spec, a)
    lf.cli(__doc__, FIXTURES, make, rest)


if __name__ == "__main__":
    main()
