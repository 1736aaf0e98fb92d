// GPU time per kernel of a loaded model's work, from timestamp queries (what `wgllm bench --profile` shows).
// While a Profiler exists, every dispatch of the model's sessions runs in its own compute pass with a timestamp at
// its beginning and end, so the profile tells where kernel time goes, not exactly how long the normal run takes.
//
//   wgllm::Profiler profiler(model);  // GpuError when the adapter has no timestamp-query feature
//   session.feed(tokens);
//   profiler.collect();               // one window: the work submitted since the last collect()
//   for (const wgllm::KernelTime& k : profiler.report().kernels) ...
//
// Not thread-safe: the model's work is submitted and collected on one thread. A session may encode a step ahead
// (Session::decode_greedy): reset it before the profiler goes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "wgllm/error.h"
#include "wgllm/wgllm.h"

namespace wgllm {

// One row: a kernel over one grid size (the same matvec over two weight shapes is two rows).
struct KernelTime {
  std::string name = {};    // shader file(s) and entry point, "attention.wgsl:attention_decode"
  std::string detail = {};  // the pipeline's variant where it says one: a product's weight type and shape
  uint64_t workgroups = 0;  // x * y * z of the dispatch grid
  uint64_t calls = 0;
  double ns = 0;  // sum of its dispatches' GPU time
};

struct ProfileReport {
  std::vector<KernelTime> kernels = {};  // most time first
  double kernel_ns = 0;                  // sum over every dispatch
  uint64_t dispatches = 0;
  uint64_t batches = 0;       // command buffers read back
  double batch_span_ns = 0;   // sum over command buffers of (last end-of-pass - first beginning-of-pass)
  uint64_t windows = 0;       // collect() calls that found work
  double window_span_ns = 0;  // sum over windows of their first to last timestamp
};

class Profiler {
 public:
  // Whether the model's adapter can profile (the timestamp-query feature).
  static bool supported(const Model& model);
  // Attaches to the model's GPU context. InvalidArgument for a model whose weights are not uploaded yet
  // (LoadOptions::before_upload), GpuError without timestamp-query.
  explicit Profiler(const Model& model);
  ~Profiler();  // detaches
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Waits for the work submitted since the last call and adds it to the totals, as one window.
  void collect();
  ProfileReport report() const;
  // Forgets the totals (work not yet collected stays pending).
  void reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wgllm
