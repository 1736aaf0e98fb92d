// The WGSL preludes of the attention pipelines: the KV pools' bindings, the KV element types and their conversions,
// the tile constants (attention_preludes.cpp). For attention.cpp alone.
#pragma once
#include <cstdint>
#include <string>

#include "kernels/attention.h"

namespace wgllm::kernels::detail {

inline constexpr uint32_t kDecodeWorkgroup = 128;  // DEC_WG in attention.wgsl
inline constexpr uint32_t kF16Rows = 4;            // TQ in attention_f16.wgsl: rows per thread

// The pools' bindings 4-7 (attention_common.wgsl), read-only or read-write.
std::string kv_pools(bool writable);
// KvVec and its conversions for attention.wgsl's kernels; `writable`: the pools read-write and DEC_FRESH on
// (attention_decode_fresh.wgsl).
std::string kv_prelude_vec4(KvView view, bool writable = false);
std::string kv_prelude_scalar(KvView view);
std::string tile_prelude(const AttentionTiles& t);
std::string f16_prelude(const AttentionF16Tiles& t, uint32_t head_dim);

}  // namespace wgllm::kernels::detail
