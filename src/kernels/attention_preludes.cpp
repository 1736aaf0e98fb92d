// The WGSL preludes of the attention pipelines (attention.h's kernels): what each shader file expects the host to
// declare before it. The encoders and their checks are in attention.cpp.
#include "kernels/attention_preludes.h"

#include <algorithm>
#include <string>
#include <utility>

namespace wgllm::kernels::detail {

// The KV pools' bindings (attention_common.wgsl): read-only, or read-write for attention_decode_fresh.
std::string kv_pools(bool writable) {
  std::string s;
  for (int i = 0; i < 4; ++i)
    s += "@group(0) @binding(" + std::to_string(4 + i) + ") var<storage, " + (writable ? "read_write" : "read") +
         "> pool" + std::to_string(i) + ": array<KvUnit>;\n";
  return s;
}

// KvVec, 4 KV elements as the cache holds them, and kv_to_f32. For attention_decode_fresh.wgsl (`writable`: the pools
// read-write, DEC_FRESH on) the new token's elements go through kv_stash (rounded to the cache's type as
// qk_norm_rope_kv.wgsl rounds them, pack2x16float's pairs, kept as bits in a vec4<f32>), kv_unstash (their f32 values)
// and kv_unit (the cache's unit). Bits, not values, sit in workgroup memory between the two: no compiler can fold the
// rounding away.
std::string kv_prelude_vec4(KvView view, bool writable) {
  std::string s = kv_pools(writable) + "const DEC_FRESH: bool = " + (writable ? "true" : "false") + ";\n";
  const std::string packed =
      "fn kv_stash(x: vec4<f32>) -> vec4<f32> {\n"
      "  return vec4<f32>(bitcast<f32>(pack2x16float(x.xy)), bitcast<f32>(pack2x16float(x.zw)), 0.0, 0.0);\n}\n"
      "fn kv_unstash(s: vec4<f32>) -> vec4<f32> {\n"
      "  return vec4<f32>(unpack2x16float(bitcast<u32>(s.x)), unpack2x16float(bitcast<u32>(s.y)));\n}\n";
  switch (view) {
    case KvView::F16:
      return "enable f16;\nalias KvVec = vec4<f16>;\n" + s +
             "fn kv_to_f32(x: KvVec) -> vec4<f32> { return vec4<f32>(x); }\n" + packed +
             "fn kv_unit(s: vec4<f32>) -> KvVec { return KvVec(kv_unstash(s)); }\n";
    case KvView::PackedF16:
      return "alias KvVec = vec2<u32>;\n" + s +
             "fn kv_to_f32(x: KvVec) -> vec4<f32> { return vec4<f32>(unpack2x16float(x.x), unpack2x16float(x.y)); }\n" +
             packed + "fn kv_unit(s: vec4<f32>) -> KvVec { return KvVec(bitcast<u32>(s.x), bitcast<u32>(s.y)); }\n";
    case KvView::F32:
      return "alias KvVec = vec4<f32>;\n" + s + "fn kv_to_f32(x: KvVec) -> vec4<f32> { return x; }\n" +
             "fn kv_stash(x: vec4<f32>) -> vec4<f32> { return x; }\n" +
             "fn kv_unstash(s: vec4<f32>) -> vec4<f32> { return s; }\n" +
             "fn kv_unit(s: vec4<f32>) -> KvVec { return s; }\n";
  }
  return {};
}

// KvWord, one KV element as the cache holds it, and its accessors (attention_baseline.wgsl).
std::string kv_prelude_scalar(KvView view) {
  const std::string pools = kv_pools(false);
  switch (view) {
    case KvView::F16:
      return "enable f16;\nalias KvWord = f16;\n" + pools + "fn kv_word_index(i: u32) -> u32 { return i; }\n" +
             "fn kv_word_value(w: KvWord, i: u32) -> f32 { return f32(w); }\n";
    case KvView::PackedF16:
      return "alias KvWord = u32;\n" + pools + "fn kv_word_index(i: u32) -> u32 { return i >> 1u; }\n" +
             "fn kv_word_value(w: KvWord, i: u32) -> f32 { return unpack2x16float(w)[i & 1u]; }\n";
    case KvView::F32:
      return "alias KvWord = f32;\n" + pools + "fn kv_word_index(i: u32) -> u32 { return i; }\n" +
             "fn kv_word_value(w: KvWord, i: u32) -> f32 { return w; }\n";
  }
  return {};
}

// The tiles' constants (attention.wgsl; DEC_TPK for the decode walk).
std::string tile_prelude(const AttentionTiles& t) {
  return "const BQ: u32 = " + std::to_string(t.bq) + "u;\nconst BK: u32 = " + std::to_string(t.bk) +
         "u;\nconst TPR: u32 = " + std::to_string(t.tpr) + "u;\nconst DV: u32 = " + std::to_string(t.dv) +
         "u;\nconst RPT: u32 = " + std::to_string(t.rpt) + "u;\nconst WG: u32 = " + std::to_string(t.wg) +
         "u;\nconst NL: u32 = " + std::to_string((t.bk * t.dv * t.tpr + t.wg - 1) / t.wg) +
         "u;\nconst DEC_TPK: u32 = " + std::to_string(t.dec_tpk) + "u;\n";
}

// Chunks of 8 dims per f16 partial sum of a score: the largest divisor of head_dim / 8 that is <= 8 (at most 16
// products per f16 lane of the vec4 accumulators).
namespace {
uint32_t f16_score_block(uint32_t head_dim) {
  uint32_t b = std::min(8u, head_dim / 8);
  while ((head_dim / 8) % b) --b;
  return b;
}
}  // namespace

// Host constants of attention_f16.wgsl (its //#unroll counts among them).
std::string f16_prelude(const AttentionF16Tiles& t, uint32_t head_dim) {
  const uint32_t hd8 = head_dim / 8, rg = t.bq / kF16Rows, wg = rg * t.cg, tk = t.bk / t.cg, td8 = hd8 / t.cg;
  const uint32_t qkb = f16_score_block(head_dim);
  std::string s = "enable f16;\n";
  for (const auto& [name, value] : {std::pair{"BQ", t.bq},
                                    {"BK", t.bk},
                                    {"CG", t.cg},
                                    {"HD8", hd8},
                                    {"QKB", qkb},
                                    {"RG", rg},
                                    {"WG", wg},
                                    {"TK", tk},
                                    {"TD8", td8},
                                    {"TD16", 2 * td8},
                                    {"NQB", hd8 / qkb},
                                    {"NS", kF16Rows * tk},
                                    {"NO", kF16Rows * 2 * td8},
                                    {"NLQ", (t.bq * hd8 + wg - 1) / wg},
                                    {"NLK", (t.bk * hd8 + wg - 1) / wg}})
    s += std::string("const ") + name + ": u32 = " + std::to_string(value) + "u;\n";
  return s + kv_pools(false);
}

}  // namespace wgllm::kernels::detail
