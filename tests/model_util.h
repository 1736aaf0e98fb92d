// Helpers of the model tests: where the regenerated test models are, SHA-256 and the tooling's tensor digest,
// and a reader for the reference fixtures (tests/data/models/ref/*.ref.gguf).
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "gguf/file.h"

namespace wgllm::test {

// $WGLLM_TEST_MODELS (set by CTest to <build>/test-models, filled by the make_test_models fixture).
inline std::string models_dir() {
  const char* d = std::getenv("WGLLM_TEST_MODELS");
  return d ? d : std::string(WGLLM_BINARY_DIR) + "/test-models";
}
// A model committed under tests/data/models/ (one converted by llama.cpp's converter: gemma3-tiny-f32), else a
// regenerated one.
inline std::string model_path(const std::string& name) {
  const std::string committed = std::string(WGLLM_SOURCE_DIR) + "/tests/data/models/" + name + ".gguf";
  if (std::ifstream(committed).good()) return committed;
  return models_dir() + "/" + name + ".gguf";
}
inline std::string ref_dir() { return std::string(WGLLM_SOURCE_DIR) + "/tests/data/models/ref"; }
// A test's name from its model's (INSTANTIATE_TEST_SUITE_P over model names): '-' is not allowed there.
inline std::string model_param_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  std::replace(s.begin(), s.end(), '-', '_');
  return s;
}

// ---- SHA-256 (FIPS 180-4), hex digest
class Sha256 {
 public:
  void update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    total_ += n;
    while (n > 0) {
      const size_t take = std::min(n, size_t{64} - fill_);
      std::memcpy(buf_ + fill_, p, take);
      fill_ += take, p += take, n -= take;
      if (fill_ == 64) block(buf_), fill_ = 0;
    }
  }
  void update(const std::string& s) { update(s.data(), s.size()); }
  std::string hex() {
    const uint64_t bits = total_ * 8;
    const uint8_t one = 0x80, zero = 0;
    update(&one, 1);
    while (fill_ != 56) update(&zero, 1);
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(bits >> (56 - 8 * i));
    update(len, 8);
    std::string out;
    const char* digits = "0123456789abcdef";
    for (uint32_t v : h_)
      for (int s = 28; s >= 0; s -= 4) out += digits[(v >> s) & 15];
    return out;
  }

 private:
  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }
  void block(const uint8_t* b) {
    static constexpr uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
        0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
        0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
        0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
        0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
        0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
        0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(b[4 * i]) << 24 | uint32_t(b[4 * i + 1]) << 16 | uint32_t(b[4 * i + 2]) << 8 | b[4 * i + 3];
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h_[0], bb = h_[1], c = h_[2], d = h_[3], e = h_[4], f = h_[5], g = h_[6], h = h_[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & bb) ^ (a & c) ^ (bb & c));
      h = g, g = f, f = e, e = d + t1, d = c, c = bb, bb = a, a = t1 + t2;
    }
    h_[0] += a, h_[1] += bb, h_[2] += c, h_[3] += d, h_[4] += e, h_[5] += f, h_[6] += g, h_[7] += h;
  }
  uint32_t h_[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  uint8_t buf_[64] = {};
  size_t fill_ = 0;
  uint64_t total_ = 0;
};

// tools/ggufio.py tensor_digest: sha256 over the tensors in name order of "name:type:[ne0, ne1]\n" + raw bytes.
inline std::string tensor_digest(const GgufFile& f) {
  std::vector<const GgufTensor*> ts;
  for (const auto& t : f.tensors()) ts.push_back(&t);
  std::sort(ts.begin(), ts.end(), [](const GgufTensor* a, const GgufTensor* b) { return a->name < b->name; });
  Sha256 h;
  for (const GgufTensor* t : ts) {
    std::string head = t->name + ":" + std::to_string(uint32_t(t->type)) + ":[";
    for (uint32_t d = 0; d < t->n_dims; ++d) head += (d ? ", " : "") + std::to_string(t->ne[d]);
    h.update(head + "]\n");
    const auto data = f.tensor_data(*t);
    h.update(data.data(), data.size());
  }
  return h.hex();
}

// ---- reference fixtures. They hold I32 tensors, which GgufFile (a model loader) rejects, so this is a small
// reader for exactly what tools/ggufio.py write_simple writes: GGUF v3, scalar/string KVs, F32 and I32 tensors.
struct RefPrompt {
  std::vector<int32_t> tokens;             // the prompt
  std::vector<int32_t> logit_positions;    // prompt positions that have logits
  std::vector<std::vector<float>> logits;  // [positions][n_vocab]
  std::vector<int32_t> greedy;             // greedy continuation
};
struct RefFixture {
  std::map<std::string, std::string> strings;  // string KVs
  std::map<std::string, uint64_t> ints;        // integer KVs
  std::vector<RefPrompt> prompts;
};

inline RefFixture read_ref_fixture(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  const std::vector<uint8_t> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  auto need = [&](size_t n) {
    if (pos + n > b.size()) throw std::runtime_error(path + ": truncated at byte " + std::to_string(pos));
  };
  auto rd = [&]<typename T>(T) {
    need(sizeof(T));
    T v;
    std::memcpy(&v, b.data() + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  };
  auto str = [&] {
    const auto n = rd(uint64_t{});
    need(n);
    std::string s(reinterpret_cast<const char*>(b.data() + pos), n);
    pos += n;
    return s;
  };
  if (rd(uint32_t{}) != 0x46554747u) throw std::runtime_error(path + ": not a GGUF file");
  if (rd(uint32_t{}) != 3) throw std::runtime_error(path + ": not GGUF v3");
  const auto n_tensors = rd(uint64_t{}), n_kv = rd(uint64_t{});
  RefFixture fx;
  uint64_t alignment = 32;
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = str();
    const auto type = rd(uint32_t{});
    switch (type) {
      case 4: fx.ints[key] = rd(uint32_t{}); break;
      case 10: fx.ints[key] = rd(uint64_t{}); break;
      case 11: fx.ints[key] = uint64_t(rd(int64_t{})); break;
      case 6: rd(float{}); break;
      case 7: rd(uint8_t{}); break;
      case 8: fx.strings[key] = str(); break;
      default: throw std::runtime_error(path + ": key '" + key + "' has a type this reader does not handle");
    }
    if (key == "general.alignment") alignment = fx.ints[key];
  }
  struct Info {
    uint32_t type;
    std::vector<uint64_t> ne;
    uint64_t offset;
  };
  std::map<std::string, Info> infos;
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const std::string name = str();
    Info t;
    t.ne.resize(rd(uint32_t{}));
    for (auto& d : t.ne) d = rd(uint64_t{});
    t.type = rd(uint32_t{});
    t.offset = rd(uint64_t{});
    if (t.type != 0 && t.type != 26) throw std::runtime_error(path + ": tensor '" + name + "' is not F32 or I32");
    infos[name] = t;
  }
  const size_t data_start = (pos + alignment - 1) / alignment * alignment;
  auto elems = [&](const std::string& name, auto zero) {
    const auto it = infos.find(name);
    if (it == infos.end()) throw std::runtime_error(path + ": tensor '" + name + "' is missing");
    uint64_t n = 1;
    for (auto d : it->second.ne) n *= d;
    pos = data_start + it->second.offset;
    need(n * 4);
    std::vector<decltype(zero)> v(n);
    std::memcpy(v.data(), b.data() + pos, n * 4);
    return std::make_pair(v, it->second.ne);
  };
  const uint64_t n_prompts = fx.ints.at("reference.n_prompts");
  for (uint64_t p = 0; p < n_prompts; ++p) {
    const std::string pre = "prompt." + std::to_string(p) + ".";
    RefPrompt rp;
    rp.tokens = elems(pre + "tokens", int32_t{}).first;
    rp.logit_positions = elems(pre + "logit_positions", int32_t{}).first;
    rp.greedy = elems(pre + "greedy", int32_t{}).first;
    const auto [logits, ne] = elems(pre + "logits", float{});
    if (ne.size() != 2 || ne[1] != rp.logit_positions.size())
      throw std::runtime_error(path + ": " + pre + "logits has the wrong shape");
    for (uint64_t r = 0; r < ne[1]; ++r)
      rp.logits.emplace_back(logits.begin() + r * ne[0], logits.begin() + (r + 1) * ne[0]);
    fx.prompts.push_back(std::move(rp));
  }
  return fx;
}

}  // namespace wgllm::test
