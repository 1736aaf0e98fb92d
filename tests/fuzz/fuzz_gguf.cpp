// libFuzzer target: any byte string is either a GGUF file or a ModelError; never a crash, never an OOB read.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "gguf/dequant.h"
#include "gguf/file.h"
#include "model/config.h"
#include "wgllm/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = wgllm::GgufFile::from_bytes(std::span<const uint8_t>(data, size), "fuzz");
    for (const auto& [key, v] : f.metadata()) {
      (void)v.type_string();
      try {
        (void)f.get_u32(key);
      } catch (const wgllm::ModelError&) {
      }
      try {
        (void)f.get_string_array(key);
      } catch (const wgllm::ModelError&) {
      }
    }
    std::vector<float> row;
    for (const auto& t : f.tensors()) {
      const auto bytes = f.tensor_data(t);
      // Dequantise the first row (capped) of each tensor: reads exactly the bytes the type implies.
      const uint64_t n = std::min<uint64_t>(t.ne[0], 4096) / wgllm::block_elems(t.type) * wgllm::block_elems(t.type);
      if (n == 0 || n / wgllm::block_elems(t.type) * wgllm::block_bytes(t.type) > bytes.size()) continue;
      row.resize(n);
      wgllm::dequantize_row(t.type, bytes.data(), row.data(), n);
    }
    try {
      (void)wgllm::config_from_gguf(f);
    } catch (const wgllm::ModelError&) {
    }
  } catch (const wgllm::ModelError&) {
  }
  return 0;
}
