// The default context of a loaded model, as a pure function of what the model and the adapter give, so its edges
// (tiny budgets, short training contexts, binding limits) are testable without an adapter of that size.
#pragma once
#include <cstdint>

namespace wgllm {

struct ContextSize {
  uint32_t n_ctx = 0;
  bool capped = false;  // n_ctx is below n_ctx_train
};

// The model's training context, capped to the positions whose KV cache (bytes_per_position each) fits kv_budget
// bytes and to max_positions (what the cache's storage bindings hold). When capped it is rounded down to a multiple
// of 256, but not below 256: the budget is a guess (WebGPU cannot query an adapter's memory), and a smaller context
// is rarely usable. It never exceeds n_ctx_train.
ContextSize default_context(uint32_t n_ctx_train, uint64_t kv_budget, uint64_t bytes_per_position,
                            uint64_t max_positions);

}  // namespace wgllm
