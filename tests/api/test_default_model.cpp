// The default model compiled into the library (models/default/shakespeare-tiny.gguf): its bytes parse, the config
// and tokenizer are what tools/train_default_model.py wrote, and the CPU forward pass generates what the
// independent numpy forward (tools/numpy_forward.py) generated from the same file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "gguf/file.h"
#include "model/config.h"
#include "model/reference.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "wgllm/default_model.h"

namespace wgllm {
namespace {

GgufFile open_default() { return GgufFile::from_bytes(default_model_gguf(), "shakespeare-tiny.gguf"); }

TEST(DefaultModel, BytesAreAnAlignedGguf) {
  const auto bytes = default_model_gguf();
  ASSERT_GT(bytes.size(), 1000000u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(bytes.data()) % 32, 0u);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.begin() + 4, "GGUF"));
  const GgufFile f = open_default();
  EXPECT_EQ(f.file_size(), bytes.size());
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  for (const GgufTensor& t : f.tensors()) EXPECT_EQ(t.type, t.n_dims == 1 ? GgufType::F32 : GgufType::F16) << t.name;
}

TEST(DefaultModel, Config) {
  const ModelConfig c = config_from_gguf(open_default());
  EXPECT_EQ(c.arch, Arch::Llama);
  EXPECT_EQ(c.n_vocab, 2000u);
  EXPECT_EQ(c.n_embd, 128u);
  EXPECT_EQ(c.n_layer, 4u);
  EXPECT_EQ(c.n_head, 4u);
  EXPECT_EQ(c.n_head_kv, 2u);
  EXPECT_EQ(c.head_dim, 32u);
  EXPECT_EQ(c.n_ff, 384u);
  EXPECT_EQ(c.n_ctx_train, 256u);
  EXPECT_EQ(c.rope_dim, 32u);
  EXPECT_EQ(c.rope_base, 10000.f);
  EXPECT_EQ(c.rope_type, RopeType::Normal);
  EXPECT_FALSE(c.rope_scaling.enabled);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.attn_bias);
}

TEST(DefaultModel, TokenizerRoundTrips) {
  const Tokenizer tok(tokenizer_data_from_gguf(open_default()));
  EXPECT_EQ(tok.n_vocab(), 2000);
  EXPECT_EQ(tok.data().model, "gpt2");
  EXPECT_EQ(tok.data().pre, "llama-bpe");
  EXPECT_EQ(tok.encode("ROMEO:", true, false), (std::vector<int32_t>{1450, 28}));  // as HF tokenizers encodes it
  const std::string s = "ROMEO: What light through yonder window breaks?";
  const auto ids = tok.encode(s, true, false);
  EXPECT_LT(ids.size(), s.size() / 2);  // merges, not bytes
  EXPECT_EQ(tok.decode(ids), s);
}

// Greedy tokens after "ROMEO:" ({1450, 28}), produced by the independent numpy implementation from the committed
// file: `.venv/bin/python tools/numpy_forward.py models/default/shakespeare-tiny.gguf --tokens 1450,28
// --n-predict 20` (float64; tools/train_default_model.py checks the same tokens against its PyTorch model).
const std::vector<int32_t> kNumpyGreedy = {301, 14, 284, 499, 330,  311,  380, 275, 201, 1450,
                                           269, 43, 514, 261, 1154, 1173, 294, 311, 261, 1154};

TEST(DefaultModel, CpuForwardGreedyMatchesNumpy) {
  const cpu::CpuModel m = cpu::load_cpu_model(open_default());
  cpu::CpuSession s(m);
  std::vector<float> logits = s.forward(std::vector<int32_t>{1450, 28});
  std::vector<int32_t> got;
  while (got.size() < kNumpyGreedy.size()) {
    got.push_back(int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    logits = s.forward(std::vector<int32_t>{got.back()});
  }
  EXPECT_EQ(got, kNumpyGreedy);
}

}  // namespace
}  // namespace wgllm
