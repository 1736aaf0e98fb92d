// libFuzzer target: any byte string is either a GGUF file or a ModelError; never a crash, never an OOB read.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <variant>
#include <vector>

#include "gguf/dequant.h"
#include "gguf/file.h"
#include "model/config.h"
#include "wgllm/error.h"

namespace {

// Reads up to `budget` elements of an array and of the arrays nested in it, as every consumer of arrays may.
void walk(const wgllm::GgufArray& a, size_t& budget) {
  using T = wgllm::GgufValueType;
  for (size_t i = 0; i < a.size() && budget > 0; ++i, --budget) {
    switch (a.elem_type()) {
      case T::String: (void)a.string(i); break;
      case T::Array: walk(a.array(i), budget); break;
      case T::Bool: (void)a.boolean(i); break;
      case T::F32:
      case T::F64: (void)a.f64(i); break;
      case T::I8:
      case T::I16:
      case T::I32:
      case T::I64: (void)a.i64(i); break;
      default: (void)a.u64(i); break;
    }
  }
  if (a.size() > 0 && a.elem_type() == T::String) (void)a.string(a.size() - 1);  // the walk from the last mark
}

}  // namespace

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
        (void)f.get_string_array(key).strings();
      } catch (const wgllm::ModelError&) {
      }
      if (const auto* a = std::get_if<wgllm::GgufArray>(&v.v)) {
        size_t budget = 4096;
        walk(*a, budget);
      }
    }
    std::vector<float> row;
    for (const auto& t : f.tensors()) {
      const auto bytes = f.tensor_data(t);
      // Dequantise the first row (capped) of each tensor of a type wgllm runs (the parser accepts every ggml type):
      // reads exactly the bytes the type implies.
      if (!wgllm::is_supported_type(uint32_t(t.type))) continue;
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
