#include "common.h"

#include <cstring>
#include <random>
#include <sstream>

#include "gguf/dequant.h"
#include "gguf/half.h"
#include "wgllm/error.h"

namespace wgllm::bench {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

std::vector<std::optional<uint32_t>> parse_digit_runs(const std::string& list) {
  std::vector<std::optional<uint32_t>> runs;
  for (const auto& d : split(list, ',')) {
    if (d.size() != 1 || d[0] < '0' || d[0] > '3') throw InvalidArgument("--prompt-digits: '" + d + "' is not 0 to 3");
    runs.push_back(uint32_t(d[0] - '0'));
  }
  if (runs.empty()) runs.push_back(std::nullopt);
  return runs;
}

GgufType parse_type(const std::string& s) {
  for (uint32_t id = 0; ggml_type_name(id); ++id)
    if (is_supported_type(id) && s == ggml_type_name(id)) return GgufType(id);
  throw InvalidArgument("--types: unknown type '" + s + "' (" + supported_type_names() + ")");
}

std::vector<uint8_t> random_weight(GgufType t, uint32_t n_in, uint32_t n_out, uint64_t seed) {
  std::vector<uint8_t> out(tensor_bytes(t, n_in, n_out));
  std::mt19937 gen{static_cast<uint32_t>(seed)};
  const size_t n = size_t(n_in) * n_out;
  auto unit = [&] { return float(gen()) / 4294967296.f * 2.f - 1.f; };
  switch (t) {
    case GgufType::F32:
      for (size_t i = 0; i < n; ++i) {
        const float f = unit();
        std::memcpy(&out[i * 4], &f, 4);
      }
      break;
    case GgufType::F16:
    case GgufType::BF16:
      for (size_t i = 0; i < n; ++i) {
        const float f = unit();
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        const uint16_t h = t == GgufType::F16 ? wgllm::f32_to_f16(f) : uint16_t(bits >> 16);
        std::memcpy(&out[i * 2], &h, 2);
      }
      break;
    case GgufType::MXFP4:
      for (size_t b = 0; b < out.size(); b += 17) {
        for (size_t j = 1; j < 17; ++j) out[b + j] = uint8_t(gen());
        out[b] = uint8_t(118 + gen() % 6);
      }
      break;
    default: {
      const size_t bb = block_bytes(t);
      for (size_t b = 0; b < out.size(); b += bb) {
        for (size_t j = 0; j < bb; ++j) out[b + j] = uint8_t(gen());
        for (size_t f : scale_fields(t)) {
          const uint16_t d = wgllm::f32_to_f16(0.001f + 0.029f * (unit() * 0.5f + 0.5f));
          std::memcpy(&out[b + f], &d, 2);
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace wgllm::bench
