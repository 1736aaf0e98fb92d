#!/usr/bin/env python3
"""Train the tiny default model (llama architecture) on tiny Shakespeare and write it as an F16 GGUF.

Needs numpy, torch (2.x; the CPU build is enough), tokenizers and gguf -- a separate venv, since torch is not in the
project's .venv:

  python -m venv /tmp/torchvenv && /tmp/torchvenv/bin/pip install torch numpy tokenizers gguf
  /tmp/torchvenv/bin/python tools/train_default_model.py --out models/default/shakespeare-tiny.gguf

With the defaults (2 CPU threads, 800 steps of 16 x 256 tokens, seed 1234) training takes about 5 minutes on an
idle pair of current x86-64 cores (0.33 s per step) and 9 minutes on a busy shared machine; the run is seeded (init,
batches), though bit-exact repetition also needs the same torch build and thread count.

The model: llama (RMSNorm, RoPE base 10000, SwiGLU, GQA), n_embd 128, 4 layers, 4 query heads and 2 KV heads of
dim 32, n_ff 384, context 256, tied embeddings, the committed byte-level BPE tokenizer bpe_llama3 (vocab 2000) from
tests/data/tokenizers/. The last 10% of the text (cut at a line break) is held out for the validation loss.

The PyTorch model uses HF's half-split RoPE; the export permutes the Q/K rows into GGUF's adjacent-pair order
(make_model.permute_qk) and writes the file with make_model.write_model, the writer of the test models. The check
at the end reloads the GGUF with the independent numpy forward (numpy_forward.py) and asserts that its greedy
tokens from the prompt equal those of the PyTorch model (float64, on the F16-rounded weights).
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggufio  # noqa: E402
import make_model  # noqa: E402
import numpy_forward  # noqa: E402
import train_tokenizers  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TEXT = REPO / "tests" / "data" / "tinyshakespeare.txt"
TOKENIZER = "bpe_llama3"

DIMS = dict(n_embd=128, n_layer=4, n_head=4, n_head_kv=2, head_dim=32, n_ff=384, n_vocab=2000, ctx=256,
            rope_base=10000.0, rms_eps=1e-5)


# ---------------------------------------------------------------------------------------------------------------
# tokenizer: the committed fixture as an HF tokenizer


def hf_tokenizer(kind: str = TOKENIZER):
    from tokenizers import Tokenizer, decoders, models

    d = train_tokenizers.load_fixture(kind)
    vocab = {t: i for i, t in enumerate(d["tokens"])}
    merges = [tuple(m.split(" ")) for m in d["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=(d["pre"] == "llama-bpe")))
    tok.pre_tokenizer = train_tokenizers._bpe_pre_tokenizer(d["pre"])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([t for t, ty in zip(d["tokens"], d["token_types"]) if ty == train_tokenizers.CONTROL])
    # the fixture's reference ids (written by train_tokenizers.py) must come out again
    strings = json.loads((train_tokenizers.FIXTURES / "strings.json").read_text(encoding="utf-8"))
    ref = json.loads((train_tokenizers.FIXTURES / f"{kind}.ref.json").read_text(encoding="utf-8"))["ids"]
    for s, ids in zip(strings[:400], ref[:400]):
        got = tok.encode(s, add_special_tokens=False).ids
        if got != ids:
            raise RuntimeError(f"tokenizer {kind} does not reproduce its fixture ids for {s!r}")
    return tok


# ---------------------------------------------------------------------------------------------------------------
# model


def build_model(torch, c: dict):
    nn, F = torch.nn, torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + c["rms_eps"]) * self.weight

    def rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            e, hd = c["n_embd"], c["head_dim"]
            self.attn_norm = RMSNorm(e)
            self.q = nn.Linear(e, c["n_head"] * hd, bias=False)
            self.k = nn.Linear(e, c["n_head_kv"] * hd, bias=False)
            self.v = nn.Linear(e, c["n_head_kv"] * hd, bias=False)
            self.o = nn.Linear(c["n_head"] * hd, e, bias=False)
            self.ffn_norm = RMSNorm(e)
            self.gate = nn.Linear(e, c["n_ff"], bias=False)
            self.up = nn.Linear(e, c["n_ff"], bias=False)
            self.down = nn.Linear(c["n_ff"], e, bias=False)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            hd, H, Hkv = c["head_dim"], c["n_head"], c["n_head_kv"]
            h = self.attn_norm(x)
            q = self.q(h).view(B, T, H, hd).transpose(1, 2)
            k = self.k(h).view(B, T, Hkv, hd).transpose(1, 2)
            v = self.v(h).view(B, T, Hkv, hd).transpose(1, 2)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            # query head i reads KV head i // (H / Hkv), as llama.cpp does
            k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(B, T, H * hd))
            h = self.ffn_norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class Llama(nn.Module):
        def __init__(self):
            super().__init__()
            self.embd = nn.Embedding(c["n_vocab"], c["n_embd"])
            self.blocks = nn.ModuleList(Block() for _ in range(c["n_layer"]))
            self.norm = RMSNorm(c["n_embd"])
            hd = c["head_dim"]
            inv = c["rope_base"] ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
            ang = torch.arange(c["ctx"], dtype=torch.float64)[:, None] * inv[None, :]
            ang = torch.cat([ang, ang], dim=-1)
            self.register_buffer("cos", ang.cos(), persistent=False)
            self.register_buffer("sin", ang.sin(), persistent=False)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * c["n_layer"]) if name.endswith(("o.weight", "down.weight")) else 0.02
                    nn.init.normal_(p, std=std)

        def forward(self, idx):
            T = idx.shape[1]
            x = self.embd(idx)
            cos, sin = self.cos[:T].to(x.dtype), self.sin[:T].to(x.dtype)
            for b in self.blocks:
                x = b(x, cos, sin)
            return self.norm(x) @ self.embd.weight.T

    return Llama()


def greedy(torch, model, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids]))[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):]


def sample(torch, model, prompt: list[int], n: int, temperature: float, seed: int, ctx: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids[-ctx:]]))[0, -1].double() / temperature
            ids.append(int(torch.multinomial(torch.softmax(logits, -1), 1, generator=g)))
    return ids[len(prompt):]


# ---------------------------------------------------------------------------------------------------------------
# export


def gguf_tensors(model, c: dict) -> dict[str, np.ndarray]:
    """GGUF tensor name -> float32 numpy array [out, in] (llama Q/K rows permuted for adjacent-pair RoPE)."""
    sd = {k: v.detach().double().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    out = {"token_embd.weight": sd["embd.weight"]}
    for i in range(c["n_layer"]):
        p, b = f"blk.{i}.", f"blocks.{i}."
        out[p + "attn_norm.weight"] = sd[b + "attn_norm.weight"]
        out[p + "attn_q.weight"] = make_model.permute_qk(sd[b + "q.weight"], c["n_head"])
        out[p + "attn_k.weight"] = make_model.permute_qk(sd[b + "k.weight"], c["n_head_kv"])
        out[p + "attn_v.weight"] = sd[b + "v.weight"]
        out[p + "attn_output.weight"] = sd[b + "o.weight"]
        out[p + "ffn_norm.weight"] = sd[b + "ffn_norm.weight"]
        out[p + "ffn_gate.weight"] = sd[b + "gate.weight"]
        out[p + "ffn_up.weight"] = sd[b + "up.weight"]
        out[p + "ffn_down.weight"] = sd[b + "down.weight"]
    out["output_norm.weight"] = sd["norm.weight"]
    return out


def export(model, c: dict, path: Path) -> None:
    args = ["--arch", "llama", "--type", "f16", "--tie-embeddings", "--name", "shakespeare-tiny", "--out", str(path)]
    for k, v in c.items():
        args += ["--" + k.replace("_", "-"), str(v)]
    a = make_model.build_args(args)
    tensors = gguf_tensors(model, c)

    def data(name, shape, ggml_type):
        x = tensors.pop(name)
        assert x.shape == tuple(shape), (name, x.shape, shape)
        return ggufio.encode(x, ggml_type)

    path.parent.mkdir(parents=True, exist_ok=True)
    make_model.write_model(a, tokenizer=train_tokenizers.tokenizer_metadata(TOKENIZER), tensor_data=data)
    assert not tensors, f"tensors not written: {sorted(tensors)}"


# ---------------------------------------------------------------------------------------------------------------


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "models" / "default" / "shakespeare-tiny.gguf"))
    ap.add_argument("--steps", type=int, default=800)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--prompt", default="ROMEO:")
    ap.add_argument("--n-greedy", type=int, default=40)
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    c = dict(DIMS)
    T = c["ctx"]

    tok = hf_tokenizer()
    text = TEXT.read_text(encoding="utf-8")
    cut = text.index("\n", int(len(text) * 0.9)) + 1
    train = np.array(tok.encode(text[:cut], add_special_tokens=False).ids, dtype=np.int64)
    val = np.array(tok.encode(text[cut:], add_special_tokens=False).ids, dtype=np.int64)
    print(f"tokens: train {len(train)}, val {len(val)} ({len(text[:cut]) / len(train):.2f} chars/token)", flush=True)

    model = build_model(torch, c)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"parameters: {n_params} ({json.dumps(c)})", flush=True)

    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=a.lr, betas=(0.9, 0.95))

    def lr_at(step):
        if step < a.warmup:
            return a.lr * (step + 1) / a.warmup
        t = (step - a.warmup) / max(1, a.steps - a.warmup)
        return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))

    rng = np.random.default_rng(a.seed)
    # fixed evaluation windows: every non-overlapping window of the validation text, as many from the training text
    val_win = np.stack([val[i:i + T + 1] for i in range(0, len(val) - T - 1, T)])
    train_win = np.stack([train[i:i + T + 1] for i in rng.choice(len(train) - T - 1, len(val_win), replace=False)])

    def evaluate(wins) -> float:
        model.eval()
        tot = 0.0
        with torch.no_grad():
            for i in range(0, len(wins), 32):
                w = torch.from_numpy(wins[i:i + 32])
                logits = model(w[:, :-1])
                tot += float(torch.nn.functional.cross_entropy(logits.reshape(-1, c["n_vocab"]), w[:, 1:].reshape(-1),
                                                               reduction="sum"))
        model.train()
        return tot / (len(wins) * T)

    t0 = time.time()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        starts = rng.integers(0, len(train) - T - 1, a.batch)
        w = torch.from_numpy(np.stack([train[s:s + T + 1] for s in starts]))
        logits = model(w[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c["n_vocab"]), w[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(step):.2e}  {time.time() - t0:6.0f} s", flush=True)
        if (step + 1) % a.eval_every == 0 and step + 1 < a.steps:
            print(f"step {step + 1:5d}  val loss {evaluate(val_win):.4f}", flush=True)
    train_s = time.time() - t0
    train_loss, val_loss = evaluate(train_win), evaluate(val_win)
    print(f"trained {a.steps} steps of {a.batch} x {T} tokens in {train_s:.0f} s ({a.threads} threads): "
          f"train loss {train_loss:.4f}, val loss {val_loss:.4f} nats/token", flush=True)

    out = Path(a.out)
    export(model, c, out)
    print(f"wrote {out}: {out.stat().st_size} bytes, sha256 {ggufio.sha256_file(out)}", flush=True)

    # check: the numpy forward of the file and the PyTorch model on the same (F16-rounded) weights agree on the
    # greedy tokens
    model = model.double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(p.to(torch.float16).double())
    prompt = tok.encode(a.prompt, add_special_tokens=False).ids
    want = greedy(torch, model, prompt, a.n_greedy)
    got, _ = numpy_forward.Model(out).greedy(prompt, a.n_greedy)
    print(f"prompt {a.prompt!r} = {prompt}")
    print(f"greedy (torch): {want}")
    print(f"greedy (numpy): {got}")
    if got != want:
        raise SystemExit("numpy_forward.py and the PyTorch model disagree on the greedy tokens")
    print("greedy tokens agree; text:\n" + a.prompt + tok.decode(got))
    s = sample(torch, model, prompt, 200, 0.8, a.seed, T)
    print(f"\nsample (temperature 0.8, seed {a.seed}):\n" + a.prompt + tok.decode(s))


if __name__ == "__main__":
    main()
