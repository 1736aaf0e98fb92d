#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

struct ConfigCase {
  const char* name;
  std::function<void(GgufBuilder&)> edit;
  const char* expect;
};

TEST(ConfigErrors, EveryCaseGivesItsError) {
  const std::vector<ConfigCase> cases = {
      {"unknown architecture", [](GgufBuilder& g) { g.set("general.architecture", GVal::str("gpt2")); },
       "architecture 'gpt2' is not supported (supported: llama, qwen2, qwen3)"},
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
      {"yarn scaling", [](GgufBuilder& g) { g.kv("llama.rope.scaling.type", GVal::str("yarn")); },
       "key 'llama.rope.scaling.type': 'yarn' is not supported (supported: none, llama3)"},
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

}  // namespace
}  // namespace wgllm::test
