// wgllm/inspect.h: what inspect_gguf reports is what the file holds.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "gguf/file.h"
#include "gguf_builder.h"
#include "model_util.h"
#include "wgllm/inspect.h"

namespace wgllm {
namespace {

using test::GVal;

std::string write_temp(const std::string& name, const std::vector<uint8_t>& bytes) {
  const auto path = std::filesystem::temp_directory_path() / ("wgllm_inspect_" + name);
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  return path.string();
}

TEST(InspectGguf, ReportsMetadataTensorsAndConfig) {
  test::GgufBuilder g = test::tiny_model("qwen2");
  g.kv("general.name", GVal::str("tiny"))
      .kv("test.numbers", GVal::i32s({3, -1, 4, 1, 5, 9}))
      .kv("tokenizer.ggml.add_bos_token", GVal::boolean(false))
      .kv("tokenizer.ggml.cls_token_id", GVal::u32(7))
      .kv("tokenizer.ggml.seperator_token_id", GVal::u32(8));  // llama.cpp's spelling
  const std::vector<uint8_t> bytes = g.build();
  const std::string path = write_temp("tiny.gguf", bytes);
  const GgufSummary s = inspect_gguf(path);
  EXPECT_EQ(s.path, path);
  EXPECT_EQ(s.file_size, bytes.size());
  EXPECT_EQ(s.version, 3u);
  EXPECT_EQ(s.alignment, 32u);
  EXPECT_EQ(s.data_offset, g.layout.data_start);
  EXPECT_EQ(s.architecture, "qwen2");
  EXPECT_EQ(s.name, "tiny");

  std::map<std::string, std::pair<std::string, std::string>> md;
  for (const GgufMetadataRow& r : s.metadata) md[r.key] = {r.type, r.value};
  const GgufFile f = GgufFile::open(path);  // the parser's view of what was written
  EXPECT_EQ(md.size(), f.metadata().size());
  for (const auto& [key, v] : f.metadata()) EXPECT_TRUE(md.count(key)) << key;
  EXPECT_EQ(md.at("general.name"), (std::pair<std::string, std::string>{"string", "'tiny'"}));
  EXPECT_EQ(md.at("qwen2.block_count"), (std::pair<std::string, std::string>{"u32", "2"}));
  EXPECT_EQ(md.at("test.numbers"),
            (std::pair<std::string, std::string>{"array", "array of i32 [6]: 3, -1, 4, 1, 5, ..."}));
  EXPECT_TRUE(
      std::is_sorted(s.metadata.begin(), s.metadata.end(), [](const auto& a, const auto& b) { return a.key < b.key; }));

  ASSERT_EQ(s.tensors.size(), f.tensors().size());
  EXPECT_EQ(s.tensors.front().name, "token_embd.weight");
  EXPECT_EQ(s.tensors.front().shape, (std::vector<uint64_t>{16, 10}));
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const GgufTensorRow& t = s.tensors[i];
    EXPECT_EQ(t.name, f.tensors()[i].name);
    EXPECT_EQ(t.type, "F32");
    EXPECT_EQ(t.shape, std::vector<uint64_t>(f.tensors()[i].dims().begin(), f.tensors()[i].dims().end())) << t.name;
    EXPECT_EQ(t.n_bytes, test::gguf_nbytes(0, t.shape)) << t.name;
    EXPECT_EQ(t.n_elements, t.n_bytes / 4) << t.name;
    EXPECT_EQ(g.layout.data_start + t.offset, g.layout.tensor_data_start[i]) << t.name;
  }

  ASSERT_TRUE(s.config) << s.config_error;
  EXPECT_TRUE(s.config_error.empty());
  EXPECT_EQ(s.config->n_embd, 16u);
  EXPECT_EQ(s.config->n_layer, 2u);
  EXPECT_EQ(s.config->n_head, 4u);
  EXPECT_EQ(s.config->n_head_kv, 2u);
  EXPECT_EQ(s.config->head_dim, 4u);
  EXPECT_EQ(s.config->n_ff, 32u);
  EXPECT_EQ(s.config->n_vocab, 10u);
  EXPECT_EQ(s.config->n_ctx_train, 256u);
  EXPECT_EQ(s.config->rope_type, "neox");
  EXPECT_TRUE(s.config->attn_bias);
  EXPECT_FALSE(s.config->qk_norm);

  EXPECT_EQ(s.tokenizer.model, "gpt2");
  EXPECT_EQ(s.tokenizer.vocab_size, 10u);
  EXPECT_FALSE(s.tokenizer.merges);
  EXPECT_EQ(s.tokenizer.bos_id, 1u);
  EXPECT_EQ(s.tokenizer.eos_id, 2u);
  EXPECT_FALSE(s.tokenizer.unknown_id);
  EXPECT_EQ(s.tokenizer.cls_id, 7u);
  EXPECT_EQ(s.tokenizer.sep_id, 8u);
  EXPECT_EQ(s.tokenizer.add_bos, false);
  EXPECT_FALSE(s.tokenizer.chat_template);
  std::filesystem::remove(path);
}

// A mixture of experts (the committed qwen3moe fixture, written by llama.cpp's converter): its experts are reported.
TEST(InspectGguf, ReportsExperts) {
  const GgufSummary s = inspect_gguf(test::model_path("qwen3moe-tiny-k4-f32"));
  ASSERT_TRUE(s.config) << s.config_error;
  EXPECT_EQ(s.config->n_expert, 16u);
  EXPECT_EQ(s.config->n_expert_used, 4u);
  EXPECT_EQ(s.config->n_ff_exp, 48u);
}

// gpt-oss (the committed fixture): YaRN, sinks, local layers every other one, the experts.
TEST(InspectGguf, ReportsGptOss) {
  const GgufSummary s = inspect_gguf(test::model_path("gpt-oss-tiny-f32"));
  ASSERT_TRUE(s.config) << s.config_error;
  EXPECT_EQ(s.architecture, "gpt-oss");
  EXPECT_TRUE(s.config->rope_scaling);
  EXPECT_EQ(s.config->rope_scaling_type, "yarn");
  EXPECT_EQ(s.config->rope_scaling_factor, 4.f);
  EXPECT_EQ(s.config->rope_scaling_original_context, 128u);
  EXPECT_EQ(s.config->rope_scaling_beta_fast, 32.f);
  EXPECT_TRUE(s.config->attn_sinks);
  EXPECT_TRUE(s.config->attn_bias);
  EXPECT_EQ(s.config->layer_pattern, "LALA");
  EXPECT_EQ(s.config->sliding_window, 6u);
  EXPECT_EQ(s.config->n_expert, 8u);
  EXPECT_EQ(s.config->n_expert_used, 2u);
}

// qwen35 (the committed fixture): DeltaNet layers among gated attention layers, their heads and taps.
TEST(InspectGguf, ReportsQwen35) {
  const GgufSummary s = inspect_gguf(test::model_path("qwen35-tiny-f32"));
  ASSERT_TRUE(s.config) << s.config_error;
  EXPECT_EQ(s.architecture, "qwen35");
  EXPECT_EQ(s.config->layer_pattern, "DDDADA");
  EXPECT_EQ(s.config->delta_k_heads, 2u);
  EXPECT_EQ(s.config->delta_v_heads, 4u);
  EXPECT_EQ(s.config->delta_dk, 16u);
  EXPECT_EQ(s.config->delta_dv, 16u);
  EXPECT_EQ(s.config->delta_taps, 4u);
  EXPECT_TRUE(s.config->attn_gated);
  EXPECT_EQ(s.config->rope_dim, 8u);
}

// A file wgllm cannot run is still described; why it cannot run is config_error.
TEST(InspectGguf, UnsupportedModelKeepsTheRest) {
  test::GgufBuilder g = test::tiny_model("llama");
  g.set("general.architecture", GVal::str("mamba"));
  const std::string path = write_temp("mamba.gguf", g.build());
  const GgufSummary s = inspect_gguf(path);
  EXPECT_FALSE(s.config);
  EXPECT_NE(s.config_error.find("mamba"), std::string::npos) << s.config_error;
  EXPECT_EQ(s.architecture, "mamba");
  EXPECT_EQ(s.tensors.size(), GgufFile::open(path).tensors().size());
  EXPECT_FALSE(s.tensors.empty());
  std::filesystem::remove(path);
}

TEST(InspectGguf, CorruptFileThrowsOneLineModelError) {
  test::GgufBuilder g = test::tiny_model("llama");
  std::vector<uint8_t> bytes = g.build();
  bytes.resize(g.layout.kv_start.at(3) + 5);  // cut inside a metadata value
  const std::string path = write_temp("cut.gguf", bytes);
  try {
    inspect_gguf(path);
    FAIL() << "a truncated file was inspected";
  } catch (const ModelError& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find("byte"), std::string::npos) << msg;
  }
  std::filesystem::remove(path);
  EXPECT_THROW(inspect_gguf(path), ModelError);  // missing
}

}  // namespace
}  // namespace wgllm
