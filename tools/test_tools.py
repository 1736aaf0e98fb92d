#!/usr/bin/env python3
"""Self-tests of the model tooling: .venv/bin/python tools/test_tools.py (plain unittest, no pytest needed)."""
from __future__ import annotations

import dataclasses
import hashlib
import math
import sys
import tempfile
import unittest
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ggufio  # noqa: E402
import hf_reference  # noqa: E402
import make_model  # noqa: E402
import make_test_models  # noqa: E402
import numpy_forward  # noqa: E402


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


class Tools(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.dir = Path(cls.tmp.name)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def model(self, name: str, *args: str) -> Path:
        out = self.dir / f"{name}.gguf"
        if not out.exists():
            make_model.main(list(args) + ["--out", str(out)])
        return out

    def test_deterministic(self):
        for t in ("f32", "q4_0"):
            a = self.model(f"det-a-{t}", "--arch", "qwen2", "--type", t, "--seed", "7")
            b = self.model(f"det-b-{t}", "--arch", "qwen2", "--type", t, "--seed", "7")
            c = self.model(f"det-c-{t}", "--arch", "qwen2", "--type", t, "--seed", "8")
            self.assertEqual(sha(a), sha(b))
            self.assertNotEqual(sha(a), sha(c))

    def test_permute_round_trip(self):
        make_model._self_test_permute()
        rng = np.random.default_rng(0)
        for n_head, hd in ((4, 16), (2, 64), (14, 64)):
            w = rng.standard_normal((n_head * hd, 24))
            p = make_model.permute_qk(w, n_head)
            self.assertTrue(np.array_equal(make_model.unpermute_qk(p, n_head), w))
            self.assertTrue(np.array_equal(hf_reference.unpermute_qk(p, n_head), w))
            b = rng.standard_normal(n_head * hd)
            self.assertTrue(np.array_equal(make_model.unpermute_qk(make_model.permute_qk(b, n_head), n_head), b))

    def test_permute_matches_rope_layouts(self):
        # rotating adjacent pairs of a permuted vector == rotating halves of the original, then permuting
        hd, n_head, pos, base = 16, 2, 5, 10000.0
        x = np.random.default_rng(1).standard_normal(n_head * hd)
        inv = base ** (-np.arange(0, hd, 2) / hd)
        cos, sin = np.cos(pos * inv), np.sin(pos * inv)
        h = x.reshape(n_head, hd)
        a, b = h[:, :hd // 2], h[:, hd // 2:]
        neox = np.concatenate([a * cos - b * sin, a * sin + b * cos], axis=1).reshape(-1)
        y = make_model.permute_qk(x, n_head).reshape(n_head, hd)
        e, o = y[:, 0::2], y[:, 1::2]
        normal = np.empty_like(y)
        normal[:, 0::2], normal[:, 1::2] = e * cos - o * sin, e * sin + o * cos
        self.assertTrue(np.allclose(normal.reshape(-1), make_model.permute_qk(neox, n_head)))

    def test_quantisers_match_gguf_package(self):
        import gguf
        rng = np.random.default_rng(3)
        x = (rng.standard_normal((64, 256)) * rng.uniform(0.01, 3, (64, 1))).astype(np.float32)
        x[0, :32] = 0  # an all-zero block
        x[1, :32] = np.linspace(-1, 1, 32, dtype=np.float32)  # exact halves
        for ours, qt, tol in ((ggufio.quantize_q8_0, gguf.GGMLQuantizationType.Q8_0, 1 / 254),
                              (ggufio.quantize_q4_0, gguf.GGMLQuantizationType.Q4_0, 1 / 8)):  # -max clamps to q=15
            q = ours(x)
            self.assertTrue(np.array_equal(q, gguf.quants.quantize(x, qt)), qt.name)  # bit-exact
            d = gguf.quants.dequantize(q, qt)
            self.assertTrue(np.array_equal(d, ggufio.decode(q, qt.value, x.size).reshape(x.shape)))
            amax = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True)
            err = np.abs(d - x).reshape(-1, 32)
            self.assertTrue(np.all(err <= amax * tol * 1.2 + 1e-7), qt.name)  # d/2 + f16 rounding of d
        # Q4_0 layout: element j in the low nibble of byte j, element j+16 in the high nibble
        blk = np.arange(32, dtype=np.float32) - 8  # largest magnitude is 23 -> d = -23/8
        q = ggufio.quantize_q4_0(blk[None])[0]
        d = float(q[:2].view(np.float16)[0])
        self.assertAlmostEqual(d, -23 / 8, places=2)
        vals = np.concatenate([q[2:] & 15, q[2:] >> 4]).astype(np.float32) - 8
        self.assertTrue(np.allclose(vals * d, blk, atol=abs(d) / 2 + 1e-3))
        # MXFP4: bit-exact too (ggml's quantize_row_mxfp4_ref through the package); every value within half the
        # grid's widest gap (4 scales, between 8 and 12) or clamped to 12 scales, both at most amax / 2
        mx = gguf.GGMLQuantizationType.MXFP4
        q = ggufio.quantize_mxfp4(x)
        self.assertTrue(np.array_equal(q, gguf.quants.quantize(x, mx)))
        d = gguf.quants.dequantize(q, mx)
        self.assertTrue(np.array_equal(d, ggufio.decode(q, ggufio.MXFP4, x.size).reshape(x.shape)))
        amax = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True)
        self.assertTrue(np.all(np.abs(d - x).reshape(-1, 32) <= amax / 2))
        # MXFP4 layout: the scale byte, then element j's code in the low nibble of byte j, element j+16's in the high
        # nibble; a block on the grid (amax 12: scale 2^(3 - 3) = 1) comes back exactly, +0 for the code 8 as 0
        blk = np.concatenate([ggufio.MXFP4_VALUES, -ggufio.MXFP4_VALUES[::-1]])
        q = ggufio.quantize_mxfp4(blk[None])[0]
        self.assertEqual(q[0], 127 + 3 - 2)
        self.assertEqual(list(q[1:] & 15), [0, 1, 2, 3, 4, 5, 6, 7, 0, 9, 10, 11, 12, 13, 14, 15])
        self.assertEqual(list(q[1:] >> 4), [7, 6, 5, 4, 3, 2, 1, 0, 15, 14, 13, 12, 11, 10, 9, 0])
        self.assertTrue(np.array_equal(ggufio.decode(q, ggufio.MXFP4, 32), blk))
        self.assertEqual(list(ggufio.e8m0_half(np.array([0, 1, 2, 127, 255])).astype(np.float64)),
                         [2.0 ** -128, 2.0 ** -127, 2.0 ** -126, 0.5, 2.0 ** 127])
        bf = ggufio.to_bf16(x)
        self.assertTrue(np.array_equal(bf.view(np.uint8).reshape(x.shape[0], -1),
                                       gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16)))

    def test_q4_k_quantiser(self):
        # Ours is not ggml's searched Q4_K, so no bit-exact match: the gguf package decodes our bytes as we do, every
        # element lies within half a step of its sub-block (d sc / 2, plus the 6-bit min's rounding), and a block on
        # the grid of its own scales (integers 0..15 times one step, min 0) comes back exactly.
        import gguf
        qt = gguf.GGMLQuantizationType.Q4_K
        rng = np.random.default_rng(5)
        x = (rng.standard_normal((16, 512)) * rng.uniform(0.01, 3, (16, 1))).astype(np.float32)
        x[0, :32] = 0  # an all-zero sub-block
        x[1, :] = np.abs(x[1, :])  # every min 0
        x[2, :256] = 0  # an all-zero super-block
        q = ggufio.quantize_q4_k(x)
        self.assertEqual(q.shape, (16, 2 * 144))
        d = gguf.quants.dequantize(q, qt)
        self.assertTrue(np.array_equal(d, ggufio.decode(q, ggufio.Q4_K, x.size).reshape(x.shape)))
        sub = x.reshape(-1, 32)
        step = (sub.max(axis=1) - np.minimum(sub.min(axis=1), 0)) / 15
        sup = np.repeat(np.abs(x.reshape(-1, 256)).max(axis=1) / 63 * 2, 8)  # the 6-bit scale's and min's rounding
        err = np.abs(d - x).reshape(-1, 32).max(axis=1)
        self.assertTrue(np.all(err <= step / 2 * 1.01 + sup + 1e-7))
        self.assertTrue(np.all(d[2, :256] == 0))
        grid = (np.arange(256, dtype=np.float32) % 16) * np.float32(63 / 1024)  # d = 2^-10, every scale 63
        self.assertTrue(np.array_equal(ggufio.decode(ggufio.quantize_q4_k(grid[None]), ggufio.Q4_K, 256), grid))

    def test_reader_matches_gguf_package(self):
        import gguf
        for t in ("f32", "f16", "bf16", "q8_0", "q4_0"):
            p = self.model(f"rd-{t}", "--arch", "qwen3", "--type", t, "--seed", "1", "--tokenizer", "spm")
            ref, ours = gguf.GGUFReader(p), ggufio.Reader(p)
            self.assertEqual(len(ref.tensors), len(ours.tensors))
            for rt in ref.tensors:
                a = gguf.quants.dequantize(rt.data, rt.tensor_type)
                b = ours.tensor(rt.name)
                self.assertEqual(a.shape, b.shape, rt.name)
                self.assertTrue(np.array_equal(a, b), rt.name)
            self.assertEqual(ours.tensors["blk.0.ffn_down.weight"].ne, [128, 64])
            self.assertEqual(ours.tensors["token_embd.weight"].ne, [64, 1024])
            self.assertEqual(ours.tensors["blk.0.attn_norm.weight"].type, ggufio.F32)
            self.assertEqual(len(ours.get("tokenizer.ggml.tokens")), 1024)

    def test_mxfp4_moe_mix(self):
        # llama-quantize's MXFP4_MOE: the stacked experts MXFP4, the other matrices Q8_0, vectors F32
        import gguf
        p = self.model("mxfp4-moe", "--arch", "qwen3moe", "--type", "mxfp4_moe", "--seed", "5")
        ref, ours = gguf.GGUFReader(p), ggufio.Reader(p)
        self.assertEqual(ours.get("general.file_type"), 38)
        for rt in ref.tensors:
            t = ours.tensors[rt.name]
            want = ggufio.MXFP4 if "_exps." in rt.name else ggufio.Q8_0 if len(t.ne) >= 2 else ggufio.F32
            self.assertEqual(t.type, want, rt.name)
            self.assertTrue(np.array_equal(gguf.quants.dequantize(rt.data, rt.tensor_type), ours.tensor(rt.name)))
        f = ggufio.Reader(self.model("mxfp4-moe-f32", "--arch", "qwen3moe", "--seed", "5"))
        a, b = f.tensor("blk.1.ffn_down_exps.weight"), ours.tensor("blk.1.ffn_down_exps.weight")
        self.assertLess(np.abs(a - b).max(), np.abs(a).max() / 4)  # the same weights, quantised
        self.assertTrue(np.array_equal(f.tensor("blk.0.ffn_norm.weight"), ours.tensor("blk.0.ffn_norm.weight")))

    def test_types_share_weights(self):
        f = ggufio.Reader(self.model("sw-f32", "--arch", "llama", "--seed", "4"))
        q = ggufio.Reader(self.model("sw-q8", "--arch", "llama", "--type", "q8_0", "--seed", "4"))
        a, b = f.tensor("blk.1.ffn_up.weight"), q.tensor("blk.1.ffn_up.weight")
        self.assertLess(np.abs(a - b).max(), np.abs(a).max() / 100)

    def test_metadata_and_layout(self):
        r = ggufio.Reader(self.model("md", "--arch", "llama", "--seed", "1", "--rope-scaling", "llama3",
                                     "--tie-embeddings"))
        self.assertEqual(r.get("general.architecture"), "llama")
        self.assertIsNone(r.get("llama.rope.scaling.type"))  # llama.cpp aborts on it: the tensor alone says it
        self.assertNotIn("output.weight", r.tensors)
        self.assertEqual(r.tensors["rope_freqs.weight"].ne, [8])
        c = numpy_forward.read_config(r)
        self.assertEqual((c.n_embd, c.n_layer, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab),
                         (64, 2, 4, 2, 16, 128, 1024))
        # rope_freqs.weight holds llama3's scaling of the make_model defaults (factor 8, low 1, high 4, context 64)
        via_tensor = numpy_forward.rope_inv_freq(c, r.tensor("rope_freqs.weight", np.float64))
        llama3 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context_length=64)
        via_keys = numpy_forward.rope_inv_freq(dataclasses.replace(c, rope_scaling=llama3), None)
        self.assertTrue(np.allclose(via_tensor, via_keys, rtol=1e-6))
        self.assertFalse(np.allclose(via_tensor, 10000.0 ** (-np.arange(0, 16, 2) / 16)))
        toks = r.get("tokenizer.ggml.tokens")
        self.assertEqual(toks[r.get("tokenizer.ggml.bos_token_id")], "<|begin_of_text|>")
        q2 = ggufio.Reader(self.model("md-q2", "--arch", "qwen2", "--seed", "1"))
        self.assertEqual(q2.tensors["blk.0.attn_k.bias"].ne, [32])
        q3 = ggufio.Reader(self.model("md-q3", "--arch", "qwen3", "--seed", "1"))
        self.assertEqual(q3.tensors["blk.1.attn_q_norm.weight"].ne, [16])
        self.assertIn("<|im_start|>", q3.get("tokenizer.chat_template"))

    def test_numpy_forward_varied_and_cached(self):
        for arch in ("llama", "qwen2", "qwen3"):
            m = numpy_forward.Model(self.model(f"fw-{arch}", "--arch", arch, "--seed", "1"))
            prompt = [m.c.bos] + list(range(100, 120))
            out, logits = m.greedy(prompt, 32)
            self.assertGreaterEqual(len(set(out)), 8, (arch, out))
            self.assertGreater(logits[-1].std(), 0.5)
            full = m.forward(prompt + out[:-1])         # no cache: same logits as the cached decode
            self.assertEqual([int(t) for t in full[len(prompt) - 1:].argmax(-1)], out)
            self.assertTrue(np.allclose(full[:len(prompt)], logits, atol=1e-9))

    def test_shape_preset_args(self):
        a = make_model.build_args(["--shape", "llama-3.2-1b", "--type", "q4_0", "--out", "x"])
        self.assertEqual((a.arch, a.n_embd, a.n_layer, a.n_head, a.n_head_kv, a.n_ff, a.n_vocab, a.rope_base),
                         ("llama", 2048, 16, 32, 8, 8192, 128256, 500000.0))
        self.assertTrue(a.tie_embeddings and a.rope_scaling == "llama3" and a.rope_scaling_factor == 32.0)
        self.assertEqual(a.rope_scaling_orig_ctx, 8192)
        a = make_model.build_args(["--shape", "qwen2.5-0.5b", "--n-layer", "1", "--out", "x"])
        self.assertEqual((a.arch, a.n_embd, a.n_layer, a.head_dim, a.n_vocab), ("qwen2", 896, 1, 64, 151936))

    def test_qwen3moe_layout(self):
        # the layout convert_hf_to_gguf.py writes for Qwen3-MoE (see tests/data/models/qwen3moe-tiny-f32.gguf)
        # the fixture's sizes (n_embd 64, 8 experts of 32, 2 per token): every expert tensor's shape as the converter's
        r = ggufio.Reader(self.model("moe", "--arch", "qwen3moe", "--type", "q8_0", "--seed", "1", "--n-expert", "8",
                                     "--n-expert-used", "2", "--n-ff-exp", "32"))
        fx = ggufio.Reader(Path(__file__).resolve().parent.parent / "tests/data/models/qwen3moe-tiny-f32.gguf")
        for k in ("expert_count", "expert_used_count", "expert_feed_forward_length"):
            self.assertEqual(r.get("qwen3moe." + k), fx.get("qwen3moe." + k), k)
        for part in ("ffn_gate_inp", "ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            name = f"blk.1.{part}.weight"
            self.assertEqual(tuple(r.tensors[name].shape), tuple(fx.tensors[name].shape), name)
        self.assertNotIn("blk.0.ffn_gate.weight", r.tensors)
        self.assertIn("blk.0.attn_q_norm.weight", r.tensors)
        a = make_model.build_args(["--shape", "qwen3-30b-a3b", "--n-layer", "8", "--out", "x"])
        self.assertEqual((a.arch, a.n_embd, a.n_layer, a.n_expert, a.n_expert_used, a.n_ff_exp),
                         ("qwen3moe", 2048, 8, 128, 8, 768))

    def test_lfm2moe_layout(self):
        # the layout convert_hf_to_gguf.py writes for LFM2-MoE (see tests/data/models/lfm2moe-tiny-f32.gguf: 5 layers
        # conv, attn, conv, attn, conv, the first 2 dense, 8 experts of 32, 2 per token)
        r = ggufio.Reader(self.model("lfm2moe", "--arch", "lfm2moe", "--seed", "1", "--n-layer", "5",
                                     "--lfm2-attn-layers", "1,3", "--n-dense-lead", "2", "--n-ff", "96",
                                     "--n-expert", "8", "--n-expert-used", "2", "--n-ff-exp", "32"))
        fx = ggufio.Reader(Path(__file__).resolve().parent.parent / "tests/data/models/lfm2moe-tiny-f32.gguf")
        for k in ("expert_count", "expert_used_count", "expert_feed_forward_length", "leading_dense_block_count",
                  "expert_gating_func", "shortconv.l_cache"):
            self.assertEqual(r.get("lfm2moe." + k), fx.get("lfm2moe." + k), k)
        self.assertEqual(r.get("lfm2moe.attention.head_count_kv").tolist(),
                         fx.get("lfm2moe.attention.head_count_kv").tolist())
        for i in range(5):
            mine = {n: r.tensors[n].ne for n in r.tensors if n.startswith(f"blk.{i}.")}
            theirs = {n: fx.tensors[n].ne for n in fx.tensors if n.startswith(f"blk.{i}.")}
            self.assertEqual(mine, theirs, i)
        self.assertEqual(r.get("tokenizer.ggml.pre"), "lfm2")
        a = make_model.build_args(["--shape", "lfm2-8b-a1b", "--out", "x"])
        self.assertEqual((a.arch, a.n_embd, a.n_layer, a.n_expert, a.n_expert_used, a.n_ff_exp, a.n_dense_lead),
                         ("lfm2moe", 2048, 24, 32, 4, 1792, 2))
        self.assertEqual(make_model.lfm2_attn_layers(a), [2, 6, 10, 14, 18, 21])

    def test_gpt_oss_layout(self):
        # the layout convert_hf_to_gguf.py writes for gpt-oss (see tests/data/models/gpt-oss-tiny-f32.gguf: 4 layers,
        # 8 experts of 32, 2 per token, 4 heads of 16, 2 KV heads, windows of 6, YaRN x4 over 128 positions)
        r = ggufio.Reader(self.model("gpt-oss", "--arch", "gpt-oss", "--type", "q8_0", "--seed", "1", "--n-layer", "4",
                                     "--n-expert", "8", "--n-expert-used", "2", "--n-ff-exp", "32", "--n-ff", "32",
                                     "--sliding-window", "6", "--rope-scaling", "yarn", "--rope-scaling-factor", "4",
                                     "--rope-scaling-orig-ctx", "128"))
        fx = ggufio.Reader(Path(__file__).resolve().parent.parent / "tests/data/models/gpt-oss-tiny-f32.gguf")
        for k in ("expert_count", "expert_used_count", "expert_feed_forward_length", "attention.sliding_window",
                  "rope.scaling.type", "rope.scaling.factor", "rope.scaling.original_context_length"):
            self.assertEqual(r.get("gpt-oss." + k), fx.get("gpt-oss." + k), k)
        for i in range(4):
            mine = {n: r.tensors[n].ne for n in r.tensors if n.startswith(f"blk.{i}.")}
            theirs = {n: fx.tensors[n].ne for n in fx.tensors if n.startswith(f"blk.{i}.")}
            self.assertEqual(mine, theirs, i)
        self.assertEqual(r.tensors["blk.0.ffn_gate_exps.bias"].type, ggufio.F32)  # biases stay F32
        self.assertEqual(r.tensors["blk.0.ffn_gate_exps.weight"].type, ggufio.Q8_0)
        self.assertEqual(r.get("tokenizer.ggml.pre"), "gpt-4o")
        a = make_model.build_args(["--shape", "gpt-oss-20b", "--out", "x"])
        self.assertEqual((a.arch, a.n_embd, a.n_layer, a.n_head, a.n_expert, a.n_expert_used, a.n_ff_exp,
                          a.sliding_window, a.rope_scaling), ("gpt-oss", 2880, 24, 64, 32, 4, 2880, 128, "yarn"))

    def test_qwen35_layout(self):
        # the layout convert_hf_to_gguf.py writes for Qwen 3.5 (see tests/data/models/qwen35-tiny-f32.gguf, whose first
        # 4 layers are DeltaNet, DeltaNet, DeltaNet, attention: 4 heads of 32, 2 KV heads, RoPE on 8 dims; 2 key and 4
        # value heads of 16, 4 taps; FFN 96; tied)
        r = ggufio.Reader(self.model("qwen35", "--arch", "qwen35", "--type", "q8_0", "--seed", "1", "--n-layer", "4",
                                     "--head-dim", "32", "--n-ff", "96", "--tie-embeddings"))
        fx = ggufio.Reader(Path(__file__).resolve().parent.parent / "tests/data/models/qwen35-tiny-f32.gguf")
        for k in ("ssm.conv_kernel", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank", "ssm.inner_size",
                  "full_attention_interval", "rope.dimension_count", "attention.key_length", "attention.value_length",
                  "attention.head_count", "attention.head_count_kv"):
            self.assertEqual(r.get("qwen35." + k), fx.get("qwen35." + k), k)
        self.assertEqual(r.get("qwen35.rope.dimension_sections").tolist(),
                         fx.get("qwen35.rope.dimension_sections").tolist())
        self.assertEqual(r.get("qwen35.attention.recurrent_layers"), fx.get("qwen35.attention.recurrent_layers")[:4])
        names = list(r.tensors)
        fx_names = list(fx.tensors)
        for i in range(4):  # the converter's order and shapes, layer by layer
            mine = [(n, r.tensors[n].ne) for n in names if n.startswith(f"blk.{i}.")]
            theirs = [(n, fx.tensors[n].ne) for n in fx_names if n.startswith(f"blk.{i}.")]
            self.assertEqual(mine, theirs, i)
        self.assertEqual((names[0], names[-1]), (fx_names[0], fx_names[-1]))
        # as llama-quantize: the convolution and every 1-D tensor F32, the other weights (ssm_alpha, ssm_beta too) Q8_0
        for n in ("blk.0.ssm_conv1d.weight", "blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_norm.weight"):
            self.assertEqual(r.tensors[n].type, ggufio.F32, n)
        for n in ("blk.0.ssm_alpha.weight", "blk.0.ssm_beta.weight", "blk.0.attn_qkv.weight", "blk.0.attn_gate.weight",
                  "blk.0.ssm_out.weight", "blk.3.attn_q.weight", "token_embd.weight"):
            self.assertEqual(r.tensors[n].type, ggufio.Q8_0, n)
        ssm_a = np.concatenate([r.tensor(f"blk.{i}.ssm_a") for i in range(3)])
        self.assertTrue(np.all((ssm_a >= -8) & (ssm_a <= -0.5)), ssm_a)
        self.assertLess(abs(r.tensor("blk.0.ssm_norm.weight").mean() - 1), 0.1)
        u = ggufio.Reader(self.model("qwen35-untied", "--arch", "qwen35", "--seed", "1", "--n-layer", "2",
                                     "--full-attention-interval", "2"))
        self.assertEqual(list(u.tensors)[:2], ["output.weight", "token_embd.weight"])  # lm_head sorts first
        self.assertEqual(u.get("qwen35.attention.recurrent_layers"), [True, False])
        self.assertEqual(u.tensors["blk.1.attn_q.weight"].ne, [64, 128])  # each head's query and output gate
        self.assertEqual(u.tensors["blk.1.attn_output.weight"].ne, [64, 64])

    def test_qwen35_shape_presets(self):
        a = make_model.build_args(["--shape", "qwen3.5-0.8b", "--out", "x"])
        self.assertEqual((a.arch, a.n_embd, a.n_layer, a.n_head, a.n_head_kv, a.head_dim, a.n_ff, a.n_vocab, a.ctx),
                         ("qwen35", 1024, 24, 8, 2, 256, 3584, 248320, 262144))
        self.assertEqual((a.ssm_k_heads, a.ssm_v_heads, a.ssm_head_dim, a.ssm_conv, a.rope_dim, a.rope_base),
                         (16, 16, 128, 4, 64, 1e7))
        self.assertTrue(a.tie_embeddings and a.tokenizer == "synthetic")
        self.assertEqual(make_model.qwen35_delta_layers(a), [True, True, True, False] * 6)
        self.assertEqual(make_model.qwen35_rope_sections(a.rope_dim), [11, 11, 10, 0])  # the released files'
        a = make_model.build_args(["--shape", "qwen3.5-2b", "--n-layer", "4", "--out", "x"])
        self.assertEqual((a.n_embd, a.n_layer, a.n_ff, a.ssm_v_heads), (2048, 4, 6144, 16))

    def test_gemma4_layout(self):
        # the tensors convert_hf_to_gguf.py writes for Gemma 4 (tests/data/models/gemma4-tiny{,-kv}-f32.gguf): the same
        # names per kind of layer, the per-layer keys, the proportional RoPE's factors
        p = self.model("gemma4", "--arch", "gemma4", "--seed", "3", "--n-layer", "7", "--shared-kv-layers", "2",
                       "--k-eq-v")
        r = ggufio.Reader(p)
        models = Path(__file__).resolve().parent.parent / "tests/data/models"
        fx = ggufio.Reader(models / "gemma4-tiny-f32.gguf")
        kv = ggufio.Reader(models / "gemma4-tiny-kv-f32.gguf")

        def names(reader, i):
            return sorted(n.split(".", 2)[2] for n in reader.tensors if n.startswith(f"blk.{i}."))
        self.assertEqual(names(r, 0), names(fx, 0))  # local, own KV
        self.assertEqual(names(r, 5), names(fx, 3))  # local, sharing
        self.assertEqual(names(r, 6), names(fx, 5))  # global, sharing
        self.assertEqual([n for n in names(r, 4) if not n.startswith(("inp_gate", "proj", "post_norm"))],
                         names(kv, 1))  # global, own KV, v = k (the kv fixture has no per-layer embeddings)
        self.assertEqual(sorted(n for n in r.tensors if not n.startswith("blk.")),
                         sorted(n for n in fx.tensors if not n.startswith("blk.")))
        self.assertEqual(list(r.get("gemma4.attention.sliding_window_pattern")),
                         [True, True, True, True, False, True, False])
        self.assertEqual(list(r.get("gemma4.feed_forward_length")), [128] * 5 + [256] * 2)
        self.assertEqual(r.get("gemma4.attention.shared_kv_layers"), 2)
        self.assertEqual((r.get("gemma4.attention.key_length"), r.get("gemma4.attention.key_length_swa")), (32, 16))
        self.assertEqual(r.tensors["blk.4.attn_q.weight"].ne, [64, 128])
        self.assertEqual(r.tensors["blk.4.attn_k.weight"].ne, [64, 64])
        freqs = r.tensor("rope_freqs.weight")
        self.assertEqual(freqs.tolist(), [1.0] * 4 + [np.float32(1e30)] * 12)
        with self.assertRaises(SystemExit):  # layer 4, global, would share with no earlier global layer
            make_model.build_args(["--arch", "gemma4", "--n-layer", "7", "--shared-kv-layers", "3", "--out", "x"])
        a = make_model.build_args(["--shape", "gemma4-small", "--out", "x"])
        layers = make_model.gemma4_layers(a)
        self.assertEqual(sum(not L["local"] for L in layers), 7)
        self.assertEqual([i for i, L in enumerate(layers) if not L["own_kv"]], list(range(15, 35)))
        self.assertEqual((layers[0]["head_dim"], layers[4]["head_dim"], layers[34]["n_ff"]), (256, 512, 12288))

    def test_lfm2_layout_and_forward(self):
        # the layout convert_hf_to_gguf.py writes for LFM2 (see tests/data/models/lfm2-tiny-f32.gguf)
        p = self.model("lfm2", "--arch", "lfm2", "--seed", "1", "--n-layer", "6", "--lfm2-attn-layers", "2,4")
        r = ggufio.Reader(p)
        self.assertEqual(r.get("lfm2.attention.head_count_kv").tolist(), [0, 0, 2, 0, 2, 0])
        self.assertEqual(r.get("lfm2.attention.head_count_kv").dtype, np.int32)
        self.assertEqual(r.get("lfm2.shortconv.l_cache"), 3)
        self.assertIsNone(r.get("lfm2.attention.key_length"))
        self.assertEqual(r.get("tokenizer.ggml.pre"), "lfm2")
        self.assertEqual(r.tensors["blk.0.shortconv.conv.weight"].ne, [3, 64])
        self.assertEqual(r.tensors["blk.0.shortconv.in_proj.weight"].ne, [64, 192])
        self.assertEqual(r.tensors["blk.2.attn_k.weight"].ne, [64, 32])
        self.assertEqual(r.tensors["blk.2.attn_q_norm.weight"].ne, [16])
        self.assertIn("token_embd_norm.weight", r.tensors)
        self.assertNotIn("output_norm.weight", r.tensors)
        self.assertNotIn("blk.0.attn_q.weight", r.tensors)
        self.assertNotIn("blk.2.shortconv.conv.weight", r.tensors)
        q = ggufio.Reader(self.model("lfm2-q8", "--arch", "lfm2", "--seed", "1", "--n-layer", "6",
                                     "--lfm2-attn-layers", "2,4", "--type", "q8_0"))
        self.assertEqual(q.tensors["blk.0.shortconv.conv.weight"].type, ggufio.F32)  # as llama-quantize keeps it
        self.assertEqual(q.tensors["blk.0.shortconv.in_proj.weight"].type, ggufio.Q8_0)
        m = numpy_forward.Model(p)
        self.assertEqual((m.c.layer_kv, m.c.l_cache, m.c.head_dim), ((0, 0, 2, 0, 2, 0), 3, 16))
        prompt = [m.c.bos] + list(range(100, 120))
        out, logits = m.greedy(prompt, 32)
        self.assertGreaterEqual(len(set(out)), 8, out)
        full = m.forward(prompt + out[:-1])             # no cache: same logits as the decode with the conv state
        self.assertEqual([int(t) for t in full[len(prompt) - 1:].argmax(-1)], out)
        self.assertTrue(np.allclose(full[:len(prompt)], logits, atol=1e-9))
        # the convolution's taps are not symmetric: reversing them changes the logits
        for L in m.layers:
            if "shortconv.conv" in L:
                L["shortconv.conv"] = L["shortconv.conv"][:, ::-1]
        self.assertFalse(np.allclose(m.forward(prompt), logits, atol=1e-3))

    def test_lfm2_shape_preset(self):
        a = make_model.build_args(["--shape", "lfm2-350m", "--out", "x"])
        self.assertEqual((a.arch, a.n_embd, a.n_layer, a.n_head, a.n_head_kv, a.head_dim, a.n_ff, a.n_vocab, a.ctx),
                         ("lfm2", 1024, 16, 16, 8, 64, 4608, 65536, 128000))
        self.assertEqual(make_model.lfm2_attn_layers(a), [2, 5, 8, 10, 12, 14])
        self.assertTrue(a.tie_embeddings and a.l_cache == 3 and a.rope_base == 1e6 and a.tokenizer == "synthetic")
        a = make_model.build_args(["--shape", "lfm2-350m", "--n-layer", "6", "--out", "x"])
        self.assertEqual(make_model.lfm2_attn_layers(a), [2, 5])

    def test_lfm2_fixtures(self):
        # the committed LFM2 models (tools/lfm2_fixture.py: transformers -> convert_hf_to_gguf.py): numpy_forward
        # reproduces their transformers logits and greedy tokens
        models = Path(__file__).resolve().parent.parent / "tests/data/models"
        names = sorted(p.name[:-len(".gguf")] for p in models.glob("lfm2-*.gguf"))
        for name in names:
            ref = ggufio.Reader(models / "ref" / f"{name}.ref.gguf")
            m = numpy_forward.Model(models / f"{name}.gguf")
            self.assertEqual(ref.get("reference.tensor_sha256"), ggufio.tensor_digest(m.reader), name)
            for i in range(int(ref.get("reference.n_prompts"))):
                toks = ref.tensors[f"prompt.{i}.tokens"].numpy(np.int32).tolist()
                pos = ref.tensors[f"prompt.{i}.logit_positions"].numpy(np.int32)
                greedy, logits = m.greedy(toks, int(ref.get("reference.n_predict")))
                want = ref.tensor(f"prompt.{i}.logits", np.float64)
                self.assertLess(np.linalg.norm(logits[pos] - want) / np.linalg.norm(want), 1e-5, (name, i))
                self.assertEqual(greedy, ref.tensors[f"prompt.{i}.greedy"].numpy(np.int32).tolist(), (name, i))

    def test_shape_preset_small_layer_count(self):
        # the real shapes, one layer, synthetic vocab: checks the writer at full width
        p = self.model("preset", "--shape", "qwen2.5-0.5b", "--n-layer", "1", "--type", "q4_0")
        r = ggufio.Reader(p)
        self.assertEqual(r.tensors["token_embd.weight"].ne, [896, 151936])
        self.assertEqual(r.tensors["blk.0.attn_q.weight"].ne, [896, 896])
        self.assertEqual(r.tensors["blk.0.attn_k.weight"].ne, [896, 128])
        self.assertEqual(len(r.get("tokenizer.ggml.tokens")), 151936)
        self.assertGreater(len(r.get("tokenizer.ggml.merges")), 0)

    def test_matrix(self):
        out = self.dir / "matrix"
        make_test_models.main([str(out)])
        self.assertEqual(len(list(out.glob("*.gguf"))), len(make_test_models.matrix()))
        a = ggufio.tensor_digest(ggufio.Reader(out / "llama-f32.gguf"))
        self.assertEqual(a, ggufio.tensor_digest(ggufio.Reader(out / "llama-spm-f32.gguf")))

    def test_fixtures_match_regenerated_models(self):
        # tests/data/models/ref/*.ref.gguf came from transformers; the regenerated models must be the same tensors
        # and numpy_forward must reproduce their logits and greedy tokens
        # (models committed beside ref/, such as gemma3-tiny-f32 made by tools/gemma3_fixture.py through llama.cpp's
        # converter, are not regenerated here: the C++ model tests match them with their fixtures)
        ref_dir = Path(__file__).resolve().parent.parent / "tests/data/models/ref"
        refs = sorted(p for p in ref_dir.glob("*.ref.gguf")
                      if not (ref_dir.parent / (p.name[:-len(".ref.gguf")] + ".gguf")).exists())
        self.assertTrue(refs)
        out = self.dir / "fixture-models"
        names = [p.name[:-len(".ref.gguf")] for p in refs]
        make_test_models.main([str(out), "--only", *names])
        for ref_path, name in zip(refs, names):
            ref = ggufio.Reader(ref_path)
            m = numpy_forward.Model(out / f"{name}.gguf")
            self.assertEqual(ref.get("reference.tensor_sha256"), ggufio.tensor_digest(m.reader), name)
            for i in range(int(ref.get("reference.n_prompts"))):
                toks = ref.tensors[f"prompt.{i}.tokens"].numpy(np.int32).tolist()
                pos = ref.tensors[f"prompt.{i}.logit_positions"].numpy(np.int32)
                greedy, logits = m.greedy(toks, int(ref.get("reference.n_predict")))
                self.assertLess(np.abs(logits[pos] - ref.tensor(f"prompt.{i}.logits")).max(), 1e-4, (name, i))
                self.assertEqual(greedy, ref.tensors[f"prompt.{i}.greedy"].numpy(np.int32).tolist(), (name, i))


if __name__ == "__main__":
    unittest.main(verbosity=2)
