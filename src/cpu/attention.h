// CPU ground truth for attention (float64 accumulation, plain two-pass softmax).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace wgllm::cpu {

struct AttentionRef {
  uint32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  uint32_t n_queries = 0;  // rows of q / out
  uint32_t start_pos = 0;  // query i sits at position P = start_pos + i and sees keys [0, P]
  float scale = 0;
  uint32_t window = 0;  // > 0: a sliding window, query P sees keys (P - window, P] only
  // [n_heads] attention sinks (gpt-oss), or empty: head h's softmax gets one more term e^(sinks[h]) with no value.
  std::span<const float> sinks = {};
};

// q:   [n_queries][n_heads * head_dim]
// k,v: [seq][n_kv_heads * head_dim] with seq >= start_pos + n_queries
// returns out: [n_queries][n_heads * head_dim]
std::vector<float> attention(const AttentionRef& p, std::span<const float> q, std::span<const float> k,
                             std::span<const float> v);

}  // namespace wgllm::cpu
