#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "gguf/file.h"
#include "gguf_builder.h"
#include "model/config.h"
#include "wgllm/error.h"

namespace wgllm::test {
namespace {

ModelConfig config_of(GgufBuilder g) { return config_from_gguf(GgufFile::from_bytes(g.build())); }

std::string config_error(GgufBuilder g) {
  try {
    config_of(std::move(g));
  } catch (const ModelError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ConfigFromGguf, Llama) {
  const auto c = config_of(tiny_model("llama"));
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.arch_name, "llama");
  EXPECT_EQ(c.n_vocab, 10u);
  EXPECT_EQ(c.n_embd, 16u);
  EXPECT_EQ(c.n_layer, 2u);
  EXPECT_EQ(c.n_head, 4u);
  EXPECT_EQ(c.n_head_kv, 2u);
  EXPECT_EQ(c.head_dim, 4u);
  EXPECT_EQ(c.n_ff, 32u);
  EXPECT_EQ(c.n_ctx_train, 256u);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
  EXPECT_EQ(c.rope_base, 10000.f);
  EXPECT_EQ(c.rope_dim, 4u);
  EXPECT_EQ(c.rope_type, RopeType::Normal);
  EXPECT_FALSE(c.rope_scaling.enabled);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.attn_bias);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.has_rope_freqs_tensor);
  EXPECT_EQ(c.q_dim(), 16u);
  EXPECT_EQ(c.kv_dim(), 8u);
}

TEST(ConfigFromGguf, Qwen2HasBiasesAndNeoxRope) {
  const auto c = config_of(tiny_model("qwen2", 1));
  EXPECT_EQ(c.arch, Arch::Qwen2);
  EXPECT_EQ(c.rope_type, RopeType::Neox);
  EXPECT_TRUE(c.attn_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.rope_base, 1000000.f);
}

TEST(ConfigFromGguf, Qwen3HasQkNorm) {
  const auto c = config_of(tiny_model("qwen3", 30));
  EXPECT_EQ(c.arch, Arch::Qwen3);
  EXPECT_EQ(c.rope_type, RopeType::Neox);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_FALSE(c.attn_bias);
}

// A gemma3 file as llama.cpp's converter writes it: key_length != n_embd / n_head, a sliding window, no pattern key,
// per-head q/k norms and the post-attention / post-FFN norms. 7 layers: layer 5 is the global one.
GgufBuilder tiny_gemma3() {
  auto g = tiny_model("gemma3");
  g.without_tensor("blk.0.attn_q.weight").without_tensor("blk.1.attn_q.weight");
  g.without_tensor("blk.0.attn_k.weight").without_tensor("blk.1.attn_k.weight");
  g.without_tensor("blk.0.attn_v.weight").without_tensor("blk.1.attn_v.weight");
  g.without_tensor("blk.0.attn_output.weight").without_tensor("blk.1.attn_output.weight");
  g.set("gemma3.block_count", GVal::u32(7))
      .set("gemma3.attention.key_length", GVal::u32(8))
      .set("gemma3.attention.value_length", GVal::u32(8))
      .set("gemma3.attention.sliding_window", GVal::u32(5));
  for (uint64_t i = 0; i < 7; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    if (i >= 2)
      g.tensor(b + "attn_norm.weight", {16})
          .tensor(b + "ffn_norm.weight", {16})
          .tensor(b + "ffn_gate.weight", {16, 32})
          .tensor(b + "ffn_up.weight", {16, 32})
          .tensor(b + "ffn_down.weight", {32, 16});
    g.tensor(b + "attn_q.weight", {16, 32})
        .tensor(b + "attn_k.weight", {16, 16})
        .tensor(b + "attn_v.weight", {16, 16})
        .tensor(b + "attn_output.weight", {32, 16})
        .tensor(b + "attn_q_norm.weight", {8})
        .tensor(b + "attn_k_norm.weight", {8})
        .tensor(b + "post_attention_norm.weight", {16})
        .tensor(b + "post_ffw_norm.weight", {16});
  }
  return g;
}

TEST(ConfigFromGguf, Gemma3AsLlamaCppReadsIt) {
  const auto c = config_of(tiny_gemma3());
  EXPECT_EQ(c.arch, Arch::Gemma3);
  EXPECT_EQ(c.arch_name, "gemma3");
  EXPECT_EQ(c.head_dim, 8u);
  EXPECT_EQ(c.q_dim(), 32u);
  EXPECT_EQ(c.rope_type, RopeType::Neox);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_TRUE(c.post_norms);
  EXPECT_EQ(c.ffn_act, FfnAct::GeluTanh);
  EXPECT_FLOAT_EQ(c.embd_scale, 4.f);                   // sqrt(16)
  EXPECT_FLOAT_EQ(c.attn_scale, 1.f / std::sqrt(8.f));  // 1 / sqrt(key_length)
  EXPECT_EQ(c.final_logit_softcap, 0.f);
  EXPECT_EQ(c.sliding_window, 5u);
  EXPECT_EQ(c.rope_base, 1000000.f);
  EXPECT_EQ(c.rope_base_swa, 10000.f);  // absent: llama.cpp's default
  for (uint32_t i = 0; i < 7; ++i) {
    EXPECT_EQ(c.is_swa(i), i != 5) << i;  // every 6th layer global
    EXPECT_EQ(c.layer_window(i), i != 5 ? 5u : 0u) << i;
  }
  EXPECT_TRUE(c.tied_embeddings);
}

TEST(ConfigFromGguf, Gemma3PatternSoftcapAndLocalBase) {
  auto g = tiny_gemma3();
  g.set("gemma3.attention.sliding_window_pattern", GVal::u32(3))
      .set("gemma3.final_logit_softcapping", GVal::f32(30.f))
      .set("gemma3.rope.freq_base_swa", GVal::f32(5000.f));
  auto c = config_of(g);
  for (uint32_t i = 0; i < 7; ++i) EXPECT_EQ(c.is_swa(i), i % 3 != 2) << i;
  EXPECT_EQ(c.final_logit_softcap, 30.f);
  EXPECT_EQ(c.rope_base_swa, 5000.f);
  // the per-layer form: one bool per layer
  std::vector<GVal> flags;
  for (int i = 0; i < 7; ++i) flags.push_back(GVal::boolean(i == 1 || i == 4));
  g.set("gemma3.attention.sliding_window_pattern", GVal::array(7, flags));
  c = config_of(g);
  for (uint32_t i = 0; i < 7; ++i) EXPECT_EQ(c.is_swa(i), i == 1 || i == 4) << i;
  flags.pop_back();
  g.set("gemma3.attention.sliding_window_pattern", GVal::array(7, flags));
  EXPECT_THAT(config_error(g), ::testing::HasSubstr("expected an array of 7 bools"));
  // no window: no local layers
  g.without("gemma3.attention.sliding_window");
  c = config_of(g);
  EXPECT_TRUE(c.swa_layers.empty());
  EXPECT_EQ(c.layer_window(0), 0u);
}

TEST(ConfigFromGguf, Gemma3TensorsAreChecked) {
  EXPECT_THAT(config_error(tiny_gemma3().without_tensor("blk.6.post_ffw_norm.weight")),
              ::testing::HasSubstr("blk.6.post_ffw_norm.weight"));
  EXPECT_THAT(config_error(tiny_gemma3().without_tensor("blk.3.attn_k_norm.weight")),
              ::testing::HasSubstr("blk.3.attn_k_norm.weight"));
  auto g = tiny_gemma3();
  g.without_tensor("blk.2.post_attention_norm.weight").tensor("blk.2.post_attention_norm.weight", {8});
  EXPECT_THAT(config_error(g), ::testing::HasSubstr("blk.2.post_attention_norm.weight"));
  g = tiny_gemma3();
  g.set("gemma3.final_logit_softcapping", GVal::f32(-1.f));
  EXPECT_THAT(config_error(g), ::testing::HasSubstr("final_logit_softcapping"));
}

TEST(ConfigFromGguf, Llama3ScalingOutputAndDefaults) {
  auto g = tiny_model("llama");
  g.tensor("output.weight", {16, 10}).tensor("rope_freqs.weight", {2});
  g.without("llama.attention.head_count_kv").without("llama.rope.freq_base");
  g.kv("llama.rope.scaling.type", GVal::str("llama3"))
      .kv("llama.rope.scaling.factor", GVal::f32(8.f))
      .kv("llama.rope.scaling.low_freq_factor", GVal::f32(1.f))
      .kv("llama.rope.scaling.high_freq_factor", GVal::f32(4.f))
      .kv("llama.rope.scaling.original_context_length", GVal::u32(8192));
  // head_count_kv defaults to head_count: the K/V weights must then be full width
  g.without_tensor("blk.0.attn_k.weight").without_tensor("blk.0.attn_v.weight");
  g.without_tensor("blk.1.attn_k.weight").without_tensor("blk.1.attn_v.weight");
  for (const char* n : {"blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.1.attn_k.weight", "blk.1.attn_v.weight"})
    g.tensor(n, {16, 16});
  const auto c = config_of(g);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_TRUE(c.has_rope_freqs_tensor);
  EXPECT_EQ(c.n_head_kv, 4u);
  EXPECT_EQ(c.rope_base, 10000.f);
  EXPECT_TRUE(c.rope_scaling.enabled);
  EXPECT_EQ(c.rope_scaling.factor, 8.f);
  EXPECT_EQ(c.rope_scaling.original_context, 8192u);
}

TEST(ConfigFromGguf, VocabFromEmbeddingWithoutTokens) {
  auto g = tiny_model("llama");
  g.without("tokenizer.ggml.tokens");
  EXPECT_EQ(config_of(g).n_vocab, 10u);
}

TEST(ConfigFromGguf, ExplicitKeyLength) {
  auto g = tiny_model("qwen3");
  g.kv("qwen3.attention.key_length", GVal::u32(4)).kv("qwen3.rope.dimension_count", GVal::u64(4));
  EXPECT_EQ(config_of(g).head_dim, 4u);
}

TEST(ConfigFromGguf, Gemma4AsLlamaCppReadsIt) {
  const auto c = config_of(tiny_gemma4());
  EXPECT_EQ(c.arch, Arch::Gemma4);
  EXPECT_EQ(c.layer_pattern(), "LALA");
  EXPECT_EQ(c.attn_scale, 1.f);
  EXPECT_FLOAT_EQ(c.embd_scale, 4.f);
  EXPECT_TRUE(c.qk_norm && c.v_norm && c.post_norms && c.layer_out_scale && c.has_rope_freqs_tensor);
  EXPECT_EQ(c.ffn_act, FfnAct::GeluTanh);
  EXPECT_EQ(c.final_logit_softcap, 30.f);
  EXPECT_EQ(c.n_embd_per_layer, 4u);
  for (uint32_t l = 0; l < 4; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    const bool local = l % 2 == 0;
    EXPECT_EQ(c.head_dim_at(l), local ? 4u : 8u);
    EXPECT_EQ(c.rope_dim_at(l), local ? 4u : 8u);
    EXPECT_EQ(c.n_head_kv_at(l), local ? 2u : 1u);
    EXPECT_EQ(c.q_dim_at(l), local ? 16u : 32u);
    EXPECT_EQ(c.kv_dim_at(l), 8u);  // 2 heads of 4, 1 of 8
    EXPECT_EQ(c.n_ff_at(l), l < 2 ? 32u : 64u);
    EXPECT_EQ(c.kv_source(l), l % 2);  // 2 -> 0 (local), 3 -> 1 (global)
    EXPECT_EQ(c.v_from_k(l), l == 1);
  }
  EXPECT_EQ(c.max_q_dim(), 32u);
  EXPECT_EQ(c.max_n_ff(), 64u);
}

TEST(ConfigFromGguf, Gemma4ErrorsNameTheKeyOrTensor) {
  using ::testing::HasSubstr;
  auto g = tiny_gemma4();
  g.set("gemma4.expert_count", GVal::u32(8));
  EXPECT_THAT(config_error(g), HasSubstr("Gemma 4's mixture-of-experts layers are not supported"));
  g = tiny_gemma4();
  g.set("gemma4.attention.shared_kv_layers", GVal::u32(3));  // layer 1 (global) would share: no global before it
  EXPECT_THAT(config_error(g), HasSubstr("layer 1 (global) has no earlier layer of its kind"));
  g = tiny_gemma4();
  g.set("gemma4.attention.shared_kv_layers", GVal::u32(4));
  EXPECT_THAT(config_error(g), HasSubstr("leaves no layer of the 4 its own KV cache"));
  g = tiny_gemma4();
  g.set("gemma4.attention.head_count_kv", GVal::array(4, {GVal::u32(2), GVal::u32(1)}));
  EXPECT_THAT(config_error(g), HasSubstr("'gemma4.attention.head_count_kv': expected an array of 4 integers"));
  g = tiny_gemma4();
  g.set("gemma4.attention.head_count_kv", GVal::array(4, {GVal::u32(2), GVal::u32(3), GVal::u32(2), GVal::u32(3)}));
  EXPECT_THAT(config_error(g), HasSubstr("layer 1: attention.head_count 4 is not a multiple of"));
  g = tiny_gemma4();
  g.without("gemma4.attention.key_length_swa");
  EXPECT_THAT(config_error(g), HasSubstr("gemma4.attention.key_length_swa"));
  g = tiny_gemma4();
  g.set("gemma4.rope.dimension_count_swa", GVal::u32(6));
  EXPECT_THAT(config_error(g), HasSubstr("rope.dimension_count_swa' = 6"));
  EXPECT_THAT(config_error(tiny_gemma4().without_tensor("blk.3.inp_gate.weight")), HasSubstr("blk.3.inp_gate.weight"));
  EXPECT_THAT(config_error(tiny_gemma4().without_tensor("rope_freqs.weight")),
              HasSubstr("tensor 'rope_freqs.weight' is missing"));
  EXPECT_THAT(config_error(tiny_gemma4().without_tensor("per_layer_model_proj.weight")),
              HasSubstr("per_layer_model_proj.weight"));
  g = tiny_gemma4();
  g.without_tensor("blk.2.ffn_up.weight").tensor("blk.2.ffn_up.weight", {16, 32});  // the double width expected
  EXPECT_THAT(config_error(g), HasSubstr("blk.2.ffn_up.weight"));
  g = tiny_gemma4();
  g.without_tensor("blk.1.attn_q.weight").tensor("blk.1.attn_q.weight", {16, 16});  // local width on a global layer
  EXPECT_THAT(config_error(g), HasSubstr("blk.1.attn_q.weight"));
}

struct ConfigCase {
  const char* name;
  std::function<void(GgufBuilder&)> edit;
  const char* expect;
};

TEST(ConfigErrors, EveryCaseGivesItsError) {
  const std::vector<ConfigCase> cases = {
      {"unknown architecture", [](GgufBuilder& g) { g.set("general.architecture", GVal::str("gpt2")); },
       "architecture 'gpt2' is not supported (supported: llama, qwen2, qwen3, qwen3moe, gemma3, lfm2, lfm2moe, "
       "gpt-oss, qwen35, gemma4)"},
      {"no architecture", [](GgufBuilder& g) { g.without("general.architecture"); },
       "key 'general.architecture' is missing"},
      {"missing block_count", [](GgufBuilder& g) { g.without("llama.block_count"); },
       "key 'llama.block_count' is missing"},
      {"block_count as string", [](GgufBuilder& g) { g.set("llama.block_count", GVal::str("2")); },
       "key 'llama.block_count': expected u32, found string"},
      {"eps as u32", [](GgufBuilder& g) { g.set("llama.attention.layer_norm_rms_epsilon", GVal::u32(1)); },
       "key 'llama.attention.layer_norm_rms_epsilon': expected f32, found u32"},
      {"negative head count", [](GgufBuilder& g) { g.set("llama.attention.head_count", GVal::i32(-4)); },
       "key 'llama.attention.head_count': i32 value -4 does not fit in u32"},
      {"zero width", [](GgufBuilder& g) { g.set("llama.embedding_length", GVal::u32(0)); },
       "key 'llama.embedding_length' is 0"},
      {"huge width", [](GgufBuilder& g) { g.set("llama.embedding_length", GVal::u32(4000000000u)); },
       "key 'llama.embedding_length' = 4000000000 is larger than"},
      {"head_count not a multiple of head_count_kv",
       [](GgufBuilder& g) { g.set("llama.attention.head_count_kv", GVal::u32(3)); },
       "attention.head_count 4 is not a multiple of attention.head_count_kv 3"},
      {"odd head dim", [](GgufBuilder& g) { g.kv("llama.attention.key_length", GVal::u32(3)); },
       "head dimension 3 is odd"},
      {"rope dim above head dim", [](GgufBuilder& g) { g.kv("llama.rope.dimension_count", GVal::u32(8)); },
       "rope.dimension_count' = 8 must be even"},
      {"zero eps", [](GgufBuilder& g) { g.set("llama.attention.layer_norm_rms_epsilon", GVal::f32(0.f)); },
       "is not positive"},
      {"linear scaling", [](GgufBuilder& g) { g.kv("llama.rope.scaling.type", GVal::str("linear")); },
       "key 'llama.rope.scaling.type': 'linear' is not supported (supported: none, llama3, yarn)"},
      {"yarn scaling without its factor", [](GgufBuilder& g) { g.kv("llama.rope.scaling.type", GVal::str("yarn")); },
       "key 'llama.rope.scaling.factor' is missing"},
      {"llama3 scaling without factor", [](GgufBuilder& g) { g.kv("llama.rope.scaling.type", GVal::str("llama3")); },
       "key 'llama.rope.scaling.factor' is missing"},
      {"tokens of the wrong type",
       [](GgufBuilder& g) {
         g.set("tokenizer.ggml.tokens", GVal::i32s({1, 2}));
       },
       "key 'tokenizer.ggml.tokens': expected array of string, found array of i32"},
      {"vocab mismatch",
       [](GgufBuilder& g) {
         g.set("tokenizer.ggml.tokens", GVal::strings({"a", "b"}));
       },
       "tensor 'token_embd.weight': shape [16, 10] does not match the config (expected [16, 2])"},
      {"missing tensor", [](GgufBuilder& g) { g.without_tensor("blk.1.ffn_up.weight"); },
       "tensor 'blk.1.ffn_up.weight' is missing"},
      {"wrong q shape",
       [](GgufBuilder& g) {
         g.without_tensor("blk.1.attn_q.weight").tensor("blk.1.attn_q.weight", {16, 12});
       },
       "tensor 'blk.1.attn_q.weight': shape [16, 12] does not match the config (expected [16, 16])"},
      {"transposed ffn_down",
       [](GgufBuilder& g) {
         g.without_tensor("blk.0.ffn_down.weight").tensor("blk.0.ffn_down.weight", {16, 32});
       },
       "tensor 'blk.0.ffn_down.weight': shape [16, 32] does not match the config (expected [32, 16])"},
      {"wrong output shape",
       [](GgufBuilder& g) {
         g.tensor("output.weight", {16, 11});
       },
       "tensor 'output.weight': shape [16, 11]"},
      {"wrong rope_freqs shape", [](GgufBuilder& g) { g.tensor("rope_freqs.weight", {4}); },
       "tensor 'rope_freqs.weight': shape [4] does not match the config (expected [2])"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto g = tiny_model("llama");
    c.edit(g);
    const std::string err = config_error(g);
    EXPECT_THAT(err, ::testing::HasSubstr(c.expect));
    EXPECT_THAT(err, ::testing::StartsWith("<memory>: "));
  }
}

TEST(ConfigErrors, Qwen3WithoutQkNormAndQwen2WithPartialBiases) {
  auto g = tiny_model("qwen3");
  g.without_tensor("blk.0.attn_k_norm.weight");
  EXPECT_THAT(config_error(g), ::testing::HasSubstr("tensor 'blk.0.attn_k_norm.weight' is missing"));
  auto h = tiny_model("qwen2");
  h.without_tensor("blk.1.attn_v.bias");
  EXPECT_THAT(config_error(h), ::testing::HasSubstr("tensor 'blk.1.attn_v.bias' is missing"));
}

// An LFM2 of two layers as llama.cpp's converter writes it: layer 0 a short convolution (head_count_kv 0 in the
// per-layer array), layer 1 attention with q/k norms; the final norm is token_embd_norm.weight.
GgufBuilder tiny_lfm2() {
  GgufBuilder g = tiny_model("lfm2");
  const uint64_t E = 16, L = 3;
  g.set("lfm2.attention.head_count_kv", GVal::array(4, {GVal::u32(0), GVal::u32(2)}));
  g.kv("lfm2.shortconv.l_cache", GVal::u32(uint32_t(L)));
  g.without_tensor("output_norm.weight").tensor("token_embd_norm.weight", {E});
  for (const char* t : {"attn_q", "attn_k", "attn_v", "attn_output"})
    g.without_tensor(std::string("blk.0.") + t + ".weight");
  g.tensor("blk.0.shortconv.conv.weight", {L, E})
      .tensor("blk.0.shortconv.in_proj.weight", {E, 3 * E})
      .tensor("blk.0.shortconv.out_proj.weight", {E, E})
      .tensor("blk.1.attn_q_norm.weight", {4})
      .tensor("blk.1.attn_k_norm.weight", {4});
  return g;
}

TEST(ConfigFromGguf, Lfm2ConvolutionLayersFromTheKvHeadArray) {
  const auto c = config_of(tiny_lfm2());
  EXPECT_EQ(c.arch, Arch::Lfm2);
  EXPECT_EQ(c.layer_pattern(), "CA");
  EXPECT_TRUE(c.is_conv(0));
  EXPECT_FALSE(c.is_conv(1));
  EXPECT_EQ(c.n_attention_layers(), 1u);
  EXPECT_EQ(c.n_head_kv, 2u);
  EXPECT_EQ(c.l_cache, 3u);
  EXPECT_EQ(c.rope_type, RopeType::Neox);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.output_norm_name, "token_embd_norm.weight");
  // One number for every layer: all attention, no l_cache needed.
  auto g = tiny_lfm2();
  g.set("lfm2.attention.head_count_kv", GVal::u32(2)).without("lfm2.shortconv.l_cache");
  for (const char* t : {"conv", "in_proj", "out_proj"})
    g.without_tensor(std::string("blk.0.shortconv.") + t + ".weight");
  g.tensor("blk.0.attn_q.weight", {16, 16})
      .tensor("blk.0.attn_k.weight", {16, 8})
      .tensor("blk.0.attn_v.weight", {16, 8});
  g.tensor("blk.0.attn_output.weight", {16, 16})
      .tensor("blk.0.attn_q_norm.weight", {4})
      .tensor("blk.0.attn_k_norm.weight", {4});
  const auto all = config_of(g);
  EXPECT_EQ(all.layer_pattern(), "AA");
  EXPECT_TRUE(all.conv_layers.empty());
}

// A qwen3moe of two layers: qwen3's attention, 4 experts of FFN 8, 2 per token, as llama.cpp's converter writes it.
GgufBuilder tiny_qwen3moe() {
  GgufBuilder g = tiny_model("qwen3moe");
  const uint64_t E = 16, X = 4, FX = 8;
  g.kv("qwen3moe.expert_count", GVal::u32(X))
      .kv("qwen3moe.expert_used_count", GVal::u32(2))
      .kv("qwen3moe.expert_feed_forward_length", GVal::u32(FX));
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    g.without_tensor(b + "ffn_gate.weight").without_tensor(b + "ffn_up.weight").without_tensor(b + "ffn_down.weight");
    g.tensor(b + "attn_q_norm.weight", {4})
        .tensor(b + "attn_k_norm.weight", {4})
        .tensor(b + "ffn_gate_inp.weight", {E, X})
        .tensor(b + "ffn_gate_exps.weight", {E, FX, X})
        .tensor(b + "ffn_up_exps.weight", {E, FX, X})
        .tensor(b + "ffn_down_exps.weight", {FX, E, X});
  }
  return g;
}

TEST(ConfigFromGguf, Qwen3MoeExperts) {
  const auto c = config_of(tiny_qwen3moe());
  EXPECT_EQ(c.arch, Arch::Qwen3Moe);
  EXPECT_TRUE(c.is_moe());
  EXPECT_EQ(c.n_expert, 4u);
  EXPECT_EQ(c.n_expert_used, 2u);
  EXPECT_EQ(c.n_ff_exp, 8u);
  EXPECT_TRUE(c.qk_norm);
  EXPECT_EQ(c.rope_type, RopeType::Neox);
  EXPECT_FALSE(config_of(tiny_model("qwen3")).is_moe());
}

TEST(ConfigErrors, Qwen3Moe) {
  const ConfigCase cases[] = {
      {"no expert count", [](GgufBuilder& g) { g.without("qwen3moe.expert_count"); }, "qwen3moe.expert_count"},
      {"more used than experts", [](GgufBuilder& g) { g.set("qwen3moe.expert_used_count", GVal::u32(5)); },
       "key 'qwen3moe.expert_used_count' = 5 of expert_count 4: needs 1 <= used <= count"},
      {"none used", [](GgufBuilder& g) { g.set("qwen3moe.expert_used_count", GVal::u32(0)); },
       "qwen3moe.expert_used_count"},
      {"sigmoid gating without its bias", [](GgufBuilder& g) { g.kv("qwen3moe.expert_gating_func", GVal::u32(2)); },
       "tensor 'blk.0.exp_probs_b.bias' is missing"},
      {"another gating", [](GgufBuilder& g) { g.kv("qwen3moe.expert_gating_func", GVal::u32(4)); },
       "key 'qwen3moe.expert_gating_func' = 4 is not supported (1 softmax, 2 sigmoid, 3 softmax of the top k)"},
      {"more dense layers than layers", [](GgufBuilder& g) { g.kv("qwen3moe.leading_dense_block_count", GVal::u32(3)); },
       "key 'qwen3moe.leading_dense_block_count' = 3 exceeds block_count 2"},
      {"experts of another width",
       [](GgufBuilder& g) {
         g.without_tensor("blk.1.ffn_up_exps.weight").tensor("blk.1.ffn_up_exps.weight", {16, 9, 4});
       },
       "tensor 'blk.1.ffn_up_exps.weight': shape [16, 9, 4] does not match the config (expected [16, 8, 4])"},
      {"no router", [](GgufBuilder& g) { g.without_tensor("blk.0.ffn_gate_inp.weight"); },
       "tensor 'blk.0.ffn_gate_inp.weight' is missing"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto g = tiny_qwen3moe();
    c.edit(g);
    EXPECT_THAT(config_error(g), ::testing::HasSubstr(c.expect));
  }
}

// A gpt-oss of two layers as llama.cpp's converter writes it: biases on q/k/v/o, sinks, the FFN's norm named
// post_attention_norm, 4 experts of FFN 8 with biases, 2 per token, a sliding window of 4, YaRN.
GgufBuilder tiny_gpt_oss() {
  GgufBuilder g = tiny_model("gpt-oss");
  const uint64_t E = 16, X = 4, FX = 8;
  g.kv("gpt-oss.expert_count", GVal::u32(X))
      .kv("gpt-oss.expert_used_count", GVal::u32(2))
      .kv("gpt-oss.expert_feed_forward_length", GVal::u32(FX))
      .kv("gpt-oss.attention.sliding_window", GVal::u32(4))
      .kv("gpt-oss.rope.scaling.type", GVal::str("yarn"))
      .kv("gpt-oss.rope.scaling.factor", GVal::f32(32.f))
      .kv("gpt-oss.rope.scaling.original_context_length", GVal::u32(128));
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    for (const char* t : {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight", "ffn_norm.weight"})
      g.without_tensor(b + t);
    g.tensor(b + "attn_q.bias", {16})
        .tensor(b + "attn_k.bias", {8})
        .tensor(b + "attn_v.bias", {8})
        .tensor(b + "attn_output.bias", {E})
        .tensor(b + "attn_sinks.weight", {4})
        .tensor(b + "post_attention_norm.weight", {E})
        .tensor(b + "ffn_gate_inp.weight", {E, X})
        .tensor(b + "ffn_gate_inp.bias", {X})
        .tensor(b + "ffn_gate_exps.weight", {E, FX, X})
        .tensor(b + "ffn_gate_exps.bias", {FX, X})
        .tensor(b + "ffn_up_exps.weight", {E, FX, X})
        .tensor(b + "ffn_up_exps.bias", {FX, X})
        .tensor(b + "ffn_down_exps.weight", {FX, E, X})
        .tensor(b + "ffn_down_exps.bias", {E, X});
  }
  return g;
}

TEST(ConfigFromGguf, GptOssAsLlamaCppReadsIt) {
  const auto c = config_of(tiny_gpt_oss());
  EXPECT_EQ(c.arch, Arch::GptOss);
  EXPECT_EQ(c.rope_type, RopeType::Neox);
  EXPECT_TRUE(c.attn_bias && c.attn_out_bias && c.attn_sinks && c.moe_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.ffn_act, FfnAct::SwigluOai);
  EXPECT_EQ(c.ffn_norm_name, "post_attention_norm.weight");
  EXPECT_EQ(c.n_expert, 4u);
  EXPECT_EQ(c.n_expert_used, 2u);
  EXPECT_FALSE(c.moe_sigmoid);
  // local layers every other one from layer 0, rotating with the global base and scaling
  EXPECT_EQ(c.layer_pattern(), "LA");
  EXPECT_EQ(c.sliding_window, 4u);
  EXPECT_EQ(c.rope_base_swa, c.rope_base);
  EXPECT_TRUE(c.rope_scaling.enabled);
  EXPECT_EQ(c.rope_scaling.kind, kernels::RopeScalingKind::Yarn);
  EXPECT_EQ(c.rope_scaling.factor, 32.f);
  EXPECT_EQ(c.rope_scaling.original_context, 128u);
  EXPECT_EQ(c.rope_scaling.beta_fast, 32.f);
  EXPECT_EQ(c.rope_scaling.beta_slow, 1.f);
  EXPECT_TRUE(c.rope_scaling_swa.enabled);
  // YaRN's magnitude scale (1 + 0.1 ln 32) on q and k, squared into the GPU's q.k scale
  const double m = 1 + 0.1 * std::log(32.0);
  EXPECT_NEAR(c.attention_scale(), m * m / 2.0, 1e-6);  // head_dim 4
}

TEST(ConfigErrors, GptOss) {
  const ConfigCase cases[] = {
      {"no sliding window", [](GgufBuilder& g) { g.without("gpt-oss.attention.sliding_window"); },
       "gpt-oss.attention.sliding_window"},
      {"no sinks", [](GgufBuilder& g) { g.without_tensor("blk.1.attn_sinks.weight"); },
       "tensor 'blk.1.attn_sinks.weight' is missing"},
      {"sinks of another length",
       [](GgufBuilder& g) { g.without_tensor("blk.0.attn_sinks.weight").tensor("blk.0.attn_sinks.weight", {2}); },
       "tensor 'blk.0.attn_sinks.weight': shape [2] does not match the config (expected [4])"},
      {"no output bias", [](GgufBuilder& g) { g.without_tensor("blk.0.attn_output.bias"); },
       "tensor 'blk.0.attn_output.bias' is missing"},
      {"no router bias", [](GgufBuilder& g) { g.without_tensor("blk.1.ffn_gate_inp.bias"); },
       "tensor 'blk.1.ffn_gate_inp.bias' is missing"},
      {"expert bias of another width",
       [](GgufBuilder& g) {
         g.without_tensor("blk.0.ffn_down_exps.bias").tensor("blk.0.ffn_down_exps.bias", {8, 4});
       },
       "tensor 'blk.0.ffn_down_exps.bias': shape [8, 4] does not match the config (expected [16, 4])"},
      {"no FFN norm", [](GgufBuilder& g) { g.without_tensor("blk.0.post_attention_norm.weight"); },
       "tensor 'blk.0.post_attention_norm.weight' is missing"},
      {"yarn without a factor", [](GgufBuilder& g) { g.without("gpt-oss.rope.scaling.factor"); },
       "gpt-oss.rope.scaling.factor"},
      {"yarn shrinking", [](GgufBuilder& g) { g.set("gpt-oss.rope.scaling.factor", GVal::f32(0.5f)); },
       "yarn rope scaling parameters are inconsistent (factor 0.500000"},
      {"yarn on part of a head", [](GgufBuilder& g) { g.kv("gpt-oss.rope.dimension_count", GVal::u32(2)); },
       "yarn rope scaling on 2 of 4 head dimensions is not supported"},
      {"another scaling", [](GgufBuilder& g) { g.set("gpt-oss.rope.scaling.type", GVal::str("longrope")); },
       "'longrope' is not supported (supported: none, llama3, yarn)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto g = tiny_gpt_oss();
    c.edit(g);
    EXPECT_THAT(config_error(g), ::testing::HasSubstr(c.expect));
  }
}

// A qwen35 of three blocks as llama.cpp's converter writes it: layer 0 a gated DeltaNet (2 key heads, 4 value heads of
// 4, 3 taps), layer 1 gated attention (attn_q twice q_dim: per head q then gate; q/k norms), block 2 a
// multi-token-prediction head (nextn_predict_layers 1) that is not run; the FFN's norm is post_attention_norm.
GgufBuilder tiny_qwen35() {
  GgufBuilder g = tiny_model("qwen35");
  const uint64_t E = 16, K = 2, H = 4, DK = 4, DV = 4, W = 2 * K * DK + H * DV;
  g.set("qwen35.block_count", GVal::u32(3))
      .kv("qwen35.nextn_predict_layers", GVal::u32(1))
      .kv("qwen35.ssm.conv_kernel", GVal::u32(3))
      .kv("qwen35.ssm.state_size", GVal::u32(uint32_t(DK)))
      .kv("qwen35.ssm.group_count", GVal::u32(uint32_t(K)))
      .kv("qwen35.ssm.time_step_rank", GVal::u32(uint32_t(H)))
      .kv("qwen35.ssm.inner_size", GVal::u32(uint32_t(H * DV)))
      .kv("qwen35.attention.recurrent_layers",
          GVal::array(7, {GVal::boolean(true), GVal::boolean(false), GVal::boolean(false)}))
      .kv("qwen35.rope.dimension_count", GVal::u32(2));
  for (const char* t : {"attn_q", "attn_k", "attn_v", "attn_output"})
    g.without_tensor(std::string("blk.0.") + t + ".weight");
  for (int i = 0; i < 2; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    g.without_tensor(b + "ffn_norm.weight").tensor(b + "post_attention_norm.weight", {E});
  }
  g.tensor("blk.0.attn_qkv.weight", {E, W})
      .tensor("blk.0.attn_gate.weight", {E, H * DV})
      .tensor("blk.0.ssm_conv1d.weight", {3, W})
      .tensor("blk.0.ssm_dt.bias", {H})
      .tensor("blk.0.ssm_a", {H})
      .tensor("blk.0.ssm_beta.weight", {E, H})
      .tensor("blk.0.ssm_alpha.weight", {E, H})
      .tensor("blk.0.ssm_norm.weight", {DV})
      .tensor("blk.0.ssm_out.weight", {H * DV, E});
  g.without_tensor("blk.1.attn_q.weight")
      .tensor("blk.1.attn_q.weight", {E, 2 * 16})
      .tensor("blk.1.attn_q_norm.weight", {4})
      .tensor("blk.1.attn_k_norm.weight", {4});
  return g;
}

TEST(ConfigFromGguf, Qwen35AsLlamaCppReadsIt) {
  const auto c = config_of(tiny_qwen35());
  EXPECT_EQ(c.arch, Arch::Qwen35);
  EXPECT_EQ(c.n_layer, 2u);  // the prediction head is not run
  EXPECT_EQ(c.layer_pattern(), "DA");
  EXPECT_TRUE(c.is_delta(0) && c.is_attention(1) && !c.is_attention(0));
  EXPECT_EQ(c.n_attention_layers(), 1u);
  EXPECT_EQ(c.ssm_k_heads, 2u);
  EXPECT_EQ(c.ssm_v_heads, 4u);
  EXPECT_EQ(c.ssm_dk, 4u);
  EXPECT_EQ(c.ssm_dv, 4u);
  EXPECT_EQ(c.ssm_conv, 3u);
  EXPECT_EQ(c.delta_conv_dim(), 32u);
  EXPECT_TRUE(c.attn_gated && c.qk_norm);
  EXPECT_EQ(c.rope_type, RopeType::Neox);
  EXPECT_EQ(c.rope_dim, 2u);
  EXPECT_EQ(c.ffn_norm_name, "post_attention_norm.weight");
  // Without attention.recurrent_layers: every full_attention_interval-th layer is attention (default 4).
  auto g = tiny_qwen35();
  g.without("qwen35.attention.recurrent_layers").kv("qwen35.full_attention_interval", GVal::u32(2));
  EXPECT_EQ(config_of(g).layer_pattern(), "DA");
}

TEST(ConfigErrors, Qwen35) {
  const ConfigCase cases[] = {
      {"no conv kernel", [](GgufBuilder& g) { g.without("qwen35.ssm.conv_kernel"); }, "qwen35.ssm.conv_kernel"},
      {"one tap", [](GgufBuilder& g) { g.set("qwen35.ssm.conv_kernel", GVal::u32(1)); },
       "key 'qwen35.ssm.conv_kernel' = 1 is outside [2, 64]"},
      {"value heads not a multiple of the key heads",
       [](GgufBuilder& g) {
         g.set("qwen35.ssm.time_step_rank", GVal::u32(3)).set("qwen35.ssm.inner_size", GVal::u32(12));
       },
       "value heads must divide inner_size and be a multiple of the key heads"},
      {"inner size not whole heads", [](GgufBuilder& g) { g.set("qwen35.ssm.inner_size", GVal::u32(18)); },
       "inner_size 18 over time_step_rank 4 value heads"},
      {"heads past the kernels", [](GgufBuilder& g) { g.set("qwen35.ssm.state_size", GVal::u32(512)); },
       "head dimensions 512 (keys) and 4 (values) must be at most 256"},
      {"recurrent_layers too short",
       [](GgufBuilder& g) { g.set("qwen35.attention.recurrent_layers", GVal::array(7, {GVal::boolean(true)})); },
       "key 'qwen35.attention.recurrent_layers': expected an array of 3 bools (one per block), found 1 of bool"},
      {"no prediction head left", [](GgufBuilder& g) { g.set("qwen35.nextn_predict_layers", GVal::u32(3)); },
       "key 'qwen35.nextn_predict_layers' = 3 leaves no layer of block_count 3"},
      {"no decay", [](GgufBuilder& g) { g.without_tensor("blk.0.ssm_a"); }, "tensor 'blk.0.ssm_a' is missing"},
      {"conv taps of another count",
       [](GgufBuilder& g) {
         g.without_tensor("blk.0.ssm_conv1d.weight").tensor("blk.0.ssm_conv1d.weight", {4, 32});
       },
       "tensor 'blk.0.ssm_conv1d.weight': shape [4, 32] does not match the config (expected [3, 32])"},
      {"attn_q without its gate",
       [](GgufBuilder& g) { g.without_tensor("blk.1.attn_q.weight").tensor("blk.1.attn_q.weight", {16, 16}); },
       "tensor 'blk.1.attn_q.weight': shape [16, 16] does not match the config (expected [16, 32])"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto g = tiny_qwen35();
    c.edit(g);
    EXPECT_THAT(config_error(g), ::testing::HasSubstr(c.expect));
  }
}

TEST(ConfigErrors, Lfm2) {
  const ConfigCase cases[] = {
      {"kv array too short",
       [](GgufBuilder& g) { g.set("lfm2.attention.head_count_kv", GVal::array(4, {GVal::u32(0)})); },
       "key 'lfm2.attention.head_count_kv': expected an array of 2 integers (one per layer), found 1 of u32"},
      {"kv array of floats",
       [](GgufBuilder& g) {
         g.set("lfm2.attention.head_count_kv", GVal::array(6, {GVal::f32(0), GVal::f32(2)}));
       },
       "expected an array of 2 integers (one per layer), found 2 of f32"},
      {"attention layers differ",
       [](GgufBuilder& g) {
         g.set("lfm2.attention.head_count_kv", GVal::array(4, {GVal::u32(1), GVal::u32(2)}));
       },
       "the attention layers differ in KV heads (1 and 2 at layer 1; not supported)"},
      {"no l_cache", [](GgufBuilder& g) { g.without("lfm2.shortconv.l_cache"); }, "lfm2.shortconv.l_cache"},
      {"l_cache 1", [](GgufBuilder& g) { g.set("lfm2.shortconv.l_cache", GVal::u32(1)); },
       "key 'lfm2.shortconv.l_cache' = 1 is outside [2, 64]"},
      {"conv taps disagree",
       [](GgufBuilder& g) {
         g.without_tensor("blk.0.shortconv.conv.weight").tensor("blk.0.shortconv.conv.weight", {4, 16});
       },
       "tensor 'blk.0.shortconv.conv.weight': shape [4, 16] does not match the config (expected [3, 16])"},
      {"no in_proj", [](GgufBuilder& g) { g.without_tensor("blk.0.shortconv.in_proj.weight"); },
       "tensor 'blk.0.shortconv.in_proj.weight' is missing"},
      {"llama's output norm name",
       [](GgufBuilder& g) { g.without_tensor("token_embd_norm.weight").tensor("output_norm.weight", {16}); },
       "tensor 'token_embd_norm.weight' is missing"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto g = tiny_lfm2();
    c.edit(g);
    EXPECT_THAT(config_error(g), ::testing::HasSubstr(c.expect));
  }
}

}  // namespace
}  // namespace wgllm::test
