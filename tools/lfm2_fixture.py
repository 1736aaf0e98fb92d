#!/usr/bin/env python3
"""The tiny random LFM2 fixtures: transformers Lfm2ForCausalLM models converted by llama.cpp's convert_hf_to_gguf.py,
and their float64 transformers logits and greedy tokens.

Writes, from nothing but seeds (no network), for each NAME below:
  tests/data/models/NAME.gguf          the model as llama.cpp's converter writes it (F32)
  tests/data/models/ref/NAME.ref.gguf  reference logits and greedy tokens (the layout of hf_reference.py)
  tests/data/models/ref/NAME.ref.json  the same ids for people

LFM2 mixes gated short-convolution layers with GQA attention layers (RoPE half-split, RMS-normed Q and K), each
followed by a SwiGLU FFN; its final norm is the converter's token_embd_norm. The models (n_embd 64, every parameter
drawn at random, the RMSNorm gains as 1 + 0.3 N(0, 1) since LFM2's norm is `weight * x`, conv without bias as in the
released models):

  lfm2-tiny-f32      6 layers conv, conv, attn, conv, attn, conv; 4 heads of 16, 2 KV heads; L_cache 3; ffn 96;
                     RoPE base 1e6; tied embeddings
  lfm2-tiny-l4-f32   5 layers attn, conv, conv, conv, attn; 4 heads of 16, 1 KV head; L_cache 4; ffn 160 from
                     LFM2's automatic sizing (block_ff_dim 200 -> 2/3 = 133 -> x1.0 -> rounded up to a multiple of
                     32);
                     RoPE base 1e4; untied output
  lfm2-tiny-mha-f32  4 layers conv, attn, attn, conv; 2 heads of 32, 2 KV heads; L_cache 3; ffn 80; RoPE base 1e4;
                     untied output

The vocabulary (shared) is a 512-token byte-level BPE trained with `tokenizers` on tests/data/tinyshakespeare.txt,
pre-tokenized as LFM2's tokenizer.json does (the Llama 3 split regex, then ByteLevel without its own regex; merges
ignored for whole-vocabulary words), with LFM2's leading special tokens (<|pad|> 0, <|startoftext|> 1 = BOS, added
before every text, <|endoftext|> 2, <|fim_pre|> 3, <|fim_mid|> 4, <|fim_suf|> 5, <|im_start|> 6, <|im_end|> 7 = EOS)
and a ChatML chat template. The converter names a BPE pre-tokenizer by hashing its tokenization of a fixed string
(`get_vocab_base_pre`), which no freshly trained vocabulary matches: it runs in this process with that method
returning "lfm2", the `tokenizer.ggml.pre` of the released LFM2 files.

The greedy continuation runs with transformers' cache (convolution state and KV cache); the script then recomputes
every logit row of prompt + continuation without a cache and compares (they agree to a few 1e-6: transformers takes
norms, RoPE angles and softmax in float32). Past 1e-5, or on a different greedy token, it says so and takes the
greedy tokens of recomputation without a cache instead; the stored logits are always those of the uncached run.

Needs torch, transformers (5.x), tokenizers, numpy, safetensors, and llama.cpp's source (tools/llamacpp.sh
--src-path; its gguf-py goes on sys.path for the converter):

  python3 tools/lfm2_fixture.py --llama-src "$(tools/llamacpp.sh --src-path)" [--only NAME..]
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

A, C = "full_attention", "conv"
FIXTURES = {
    "lfm2-tiny-f32": dict(seed=21, layer_types=[C, C, A, C, A, C], num_attention_heads=4, num_key_value_heads=2,
                          conv_L_cache=3, intermediate_size=96, block_auto_adjust_ff_dim=False, rope_theta=1e6,
                          tie_word_embeddings=True),
    "lfm2-tiny-l4-f32": dict(seed=35, layer_types=[A, C, C, C, A], num_attention_heads=4, num_key_value_heads=1,
                             conv_L_cache=4, intermediate_size=200, block_auto_adjust_ff_dim=True,
                             block_ffn_dim_multiplier=1.0, block_multiple_of=32, rope_theta=1e4,
                             tie_word_embeddings=False),
    "lfm2-tiny-mha-f32": dict(seed=23, layer_types=[C, A, A, C], num_attention_heads=2, num_key_value_heads=2,
                              conv_L_cache=3, intermediate_size=80, block_auto_adjust_ff_dim=False, rope_theta=1e4,
                              tie_word_embeddings=False),
}
N_EMBD, N_CTX, NORM_EPS = 64, 512, 1e-5
SPECIALS = ["<|pad|>", "<|startoftext|>", "<|endoftext|>", "<|fim_pre|>", "<|fim_mid|>", "<|fim_suf|>",
            "<|im_start|>", "<|im_end|>"]
BOS, EOS = "<|startoftext|>", "<|im_end|>"
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
CHAT_TEMPLATE = ("{{- bos_token -}}"
                 "{%- for message in messages -%}"
                 "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
                 "{%- endfor -%}"
                 "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")

# The converter, run with get_vocab_base_pre answering PRE (argv: llama.cpp source dir, PRE, then the converter's).
CONVERT = """
import runpy, sys
src = sys.argv.pop(1)
pre = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base
conversion.base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv[0] = src + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def train_tokenizer(hf_dir: Path) -> int:
    """tokenizer.json + tokenizer_config.json into hf_dir; the vocabulary size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    text = (ROOT / "tests/data/tinyshakespeare.txt").read_text(encoding="utf-8")
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, show_progress=False, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text[i:i + 4096] for i in range(0, len(text), 4096)], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, tok.token_to_id(BOS))])
    assert [tok.token_to_id(s) for s in SPECIALS] == list(range(len(SPECIALS)))
    tok.save(str(hf_dir / "tokenizer.json"))
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS, "pad_token": "<|pad|>",
         "add_bos_token": True, "add_eos_token": False, "model_max_length": N_CTX,
         "chat_template": CHAT_TEMPLATE}, indent=1))
    return tok.get_vocab_size()


def make_config(spec: dict, n_vocab: int):
    import transformers as tr
    kw = {k: v for k, v in spec.items() if k not in ("seed", "rope_theta")}
    kw.update(vocab_size=n_vocab, hidden_size=N_EMBD, num_hidden_layers=len(spec["layer_types"]),
              max_position_embeddings=N_CTX, norm_eps=NORM_EPS, conv_bias=False,
              rope_parameters={"rope_type": "default", "rope_theta": spec["rope_theta"]},
              pad_token_id=0, bos_token_id=1, eos_token_id=SPECIALS.index(EOS), use_cache=True)
    cfg = tr.Lfm2Config(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def make_model(cfg, seed: int):
    import torch
    import transformers as tr
    torch.manual_seed(seed)
    model = tr.Lfm2ForCausalLM(cfg).to(torch.float64)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            z = torch.randn(p.shape, generator=g, dtype=torch.float64)
            if "norm" in name:           # operator_norm, ffn_norm, q/k_layernorm, embedding_norm: weight * x
                p.copy_(1.0 + 0.3 * z)
            elif name.endswith("conv.conv.weight"):
                p.copy_(0.5 * z)
            else:
                p.copy_(z * (0.25 if "embed_tokens" in name or "lm_head" in name else 0.12))
    return model.eval()


def run(model, prompt: list[int], n_predict: int):
    """(logits [len(prompt) + n_predict - 1, n_vocab] float64, greedy tokens) with transformers' cache, no EOS stop:
    the prompt's rows, then the row of each decode step but the last."""
    import torch
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        key = "cache" if hasattr(out, "cache") else "past_key_values"  # LFM2's output names it cache
        rows, cache, greedy = [out.logits[0].double()], getattr(out, key), []
        for i in range(n_predict):
            t = int(torch.argmax(rows[-1][-1]))
            greedy.append(t)
            if i + 1 == n_predict:
                break
            out = model(input_ids=torch.tensor([[t]]), use_cache=True, **{key: cache})
            cache = getattr(out, key)
            rows.append(out.logits[0].double())
    return torch.cat(rows).numpy(), greedy


def run_nocache(model, tokens: list[int]) -> np.ndarray:
    import torch
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens]), use_cache=False).logits[0].double().numpy()


def convert(llama_src: Path, hf_dir: Path, gguf_path: Path, pre: str = "lfm2") -> None:
    subprocess.run([sys.executable, "-c", CONVERT, str(llama_src), pre, str(hf_dir), "--outtype", "f32",
                    "--outfile", str(gguf_path)], check=True, env=dict(os.environ, NO_LOCAL_GGUF="1"))


def fixture(name: str, spec: dict, a) -> None:
    import torch
    import transformers
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
    n_ff = model.model.layers[0].feed_forward.w1.out_features
    assert int(r.get("lfm2.feed_forward_length")) == n_ff, (r.get("lfm2.feed_forward_length"), n_ff)
    assert ("output.weight" in r.tensors) != spec["tie_word_embeddings"]
    write_reference(name, "lfm2", model, gguf_path, a)


def write_reference(name: str, arch: str, model, gguf_path: Path, a) -> None:
    """The reference files of the model at gguf_path (transformers' float64 `model`, holding the file's weights):
    prompts of a.prompt_lengths tokens from the file's vocabulary, their logits and greedy continuations."""
    import torch
    import transformers
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
          "reference.arch": arch,
          "reference.source": f"transformers {transformers.__version__}, torch {torch.__version__}, float64, cpu, "
                              f"eager attention; model from convert_hf_to_gguf.py",
          "reference.n_prompts": len(prompts),
          "reference.n_predict": a.n_predict,
          "reference.prompt_seed": 0}
    tensors, summary = {}, {k.split(".", 1)[1]: v for k, v in kv.items() if k.startswith("reference.")}
    summary["prompts"] = []
    shortest = min(lengths)
    for i, prompt in enumerate(prompts):
        n = len(prompt)
        cached, greedy = run(model, prompt, a.n_predict)
        full = run_nocache(model, prompt + greedy[:-1])
        diff = float(np.abs(cached - full).max())
        if diff > 1e-5 or full[n - 1:].argmax(-1).tolist() != greedy:
            print(f"{name} prompt {i}: cached and uncached logits differ by {diff:.3g}; using the uncached run")
            greedy = []
            while len(greedy) < a.n_predict:  # the greedy tokens of full recomputation
                greedy.append(int(run_nocache(model, prompt + greedy)[-1].argmax()))
            full = run_nocache(model, prompt + greedy[:-1])
        logits = full[:n]
        rows = list(range(n)) if n == shortest else list(range(max(0, n - a.tail), n))
        tensors[f"prompt.{i}.tokens"] = np.array(prompt, dtype=np.int32)
        tensors[f"prompt.{i}.logit_positions"] = np.array(rows, dtype=np.int32)
        tensors[f"prompt.{i}.logits"] = logits[rows].astype(np.float32)
        tensors[f"prompt.{i}.greedy"] = np.array(greedy, dtype=np.int32)
        top = np.sort(logits[-1])[::-1]
        steps = np.sort(full[n - 1:], axis=-1)
        min_gap = float((steps[:, -1] - steps[:, -2]).min())
        summary["prompts"].append({"tokens": prompt, "greedy": greedy, "logit_positions": rows,
                                   "last_top5": np.argsort(-logits[-1])[:5].tolist(),
                                   "last_top2_gap": float(top[0] - top[1]), "min_greedy_top2_gap": min_gap})
        print(f"{name} prompt {i} (n={n}): greedy {greedy[:8]}..., top-2 gap {top[0] - top[1]:.4f}, "
              f"smallest over the greedy steps {min_gap:.4f}, cached vs uncached {diff:.2e}")
    ref_dir = a.out_dir / "ref"
    ref_dir.mkdir(parents=True, exist_ok=True)
    ggufio.write_simple(ref_dir / f"{name}.ref.gguf", kv, tensors)
    (ref_dir / f"{name}.ref.json").write_text(json.dumps(summary, indent=1) + "\n")


def cli(doc: str, fixtures: dict, make_fixture, argv=None) -> None:
    """The command line of a fixture script: make_fixture(name, spec, args) for each fixture asked for."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-src", type=Path, required=True, help="llama.cpp source (tools/llamacpp.sh --src-path)")
    ap.add_argument("--out-dir", type=Path, default=ROOT / "tests/data/models")
    ap.add_argument("--only", nargs="+", choices=list(fixtures), default=list(fixtures))
    ap.add_argument("--prompt-lengths", default="7,64,130")
    ap.add_argument("--n-predict", type=int, default=32)
    ap.add_argument("--tail", type=int, default=8)
    a = ap.parse_args(argv)
    a.out_dir.mkdir(parents=True, exist_ok=True)
    for name in a.only:
        make_fixture(name, fixtures[name], a)


def main(argv=None):
    cli(__doc__, FIXTURES, fixture, argv)


if __name__ == "__main__":
    main()
