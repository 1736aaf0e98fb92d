// Recording work for the GPU: ComputeBatch (dispatches and copies into one command buffer), BindCache (bind groups
// and parameter arenas kept across batches that repeat) and fold_grid (1-D workgroup counts past the per-dimension
// limit).
#pragma once
#include <webgpu/webgpu.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "gpu/context.h"
#include "gpu/handle.h"

namespace wgllm::gpu {

struct ProfiledBatch;

// Bind groups kept across batches, for work that repeats (a decode step): a batch given a cache takes its
// uniform arenas from it in order (arena 0, 1, ... of every batch) and looks each bind group up by its exact
// bindings, so a step whose dispatches and buffers match an earlier one's creates no bind group. Reusing an
// arena is safe: its new contents are a queue write, ordered after the work already submitted. Groups hold
// their buffers alive; the cache is dropped whole past max_groups entries (and with its owner). Every live group
// costs the driver memory (lavapipe maps descriptor memory, and a process has a bounded number of mappings), so
// owners of many caches give each a smaller bound.
class BindCache {
 public:
  static constexpr size_t kMaxGroups = 4096;
  explicit BindCache(Context& ctx, size_t max_groups = kMaxGroups) : ctx_(ctx), max_groups_(max_groups) {}
  const Buffer& arena(size_t index, uint64_t size);
  WGPUBindGroup group(WGPUComputePipeline pipeline, std::span<const BufferBinding> bindings, std::string_view label);
  size_t size() const { return groups_.size(); }
  uint64_t misses() const { return misses_; }  // bind groups created so far

 private:
  struct KeyHash {
    size_t operator()(const std::vector<uint64_t>& k) const;
  };
  Context& ctx_;
  size_t max_groups_;
  std::deque<Buffer> arenas_;
  // keyed by the pipeline and each binding's (slot, buffer, offset, size); key_ is the lookup's scratch (a hit
  // allocates nothing)
  std::unordered_map<std::vector<uint64_t>, BindGroupHandle, KeyHash> groups_;
  std::vector<uint64_t> key_;
  uint64_t misses_ = 0;
};

// Records compute dispatches into one command buffer; submit() sends them all. With a profiler attached to the
// context when the batch is made, every dispatch gets its own compute pass with timestamp writes.
class ComputeBatch {
 public:
  explicit ComputeBatch(Context& ctx, std::string_view label = "wgllm", BindCache* cache = nullptr);
  ~ComputeBatch();
  ComputeBatch(const ComputeBatch&) = delete;
  ComputeBatch& operator=(const ComputeBatch&) = delete;

  // Dispatch `pipeline` over grid (x, y, z) workgroups with a prebuilt bind group.
  void dispatch(WGPUComputePipeline pipeline, WGPUBindGroup group, uint32_t x, uint32_t y = 1, uint32_t z = 1);
  // Same, building (and keeping alive) a bind group from `bindings`.
  void dispatch(WGPUComputePipeline pipeline, std::span<const BufferBinding> bindings, uint32_t x, uint32_t y = 1,
                uint32_t z = 1);
  // Kernel parameters (a uniform struct) for @binding(binding). All of a batch's parameters
  // share a few arena buffers, uploaded once at submit: no buffer is created per dispatch.
  BufferBinding uniform(uint32_t binding, const void* bytes, uint64_t size);
  template <typename T>
  BufferBinding uniform(uint32_t binding, const T& params) {
    return uniform(binding, &params, sizeof(T));
  }
  // Copy between buffers (ends the current compute pass).
  void copy(const Buffer& src, uint64_t src_offset, const Buffer& dst, uint64_t dst_offset, uint64_t size);

  SubmissionIndex submit();  // finish and submit; the batch is spent afterwards
  void submit_and_wait();    // submit and block until done

 private:
  void begin_pass(const WGPUPassTimestampWrites* timestamps = nullptr);
  void end_pass();
  Context& ctx_;
  std::string label_;
  CommandEncoderHandle encoder_;
  ComputePassHandle pass_;
  void flush_uniforms();
  std::deque<Buffer> owned_buffers_;  // deque: references handed out stay valid
  const Buffer* arena_ = nullptr;     // current uniform arena (one of owned_buffers_ or the cache's)
  BindCache* cache_ = nullptr;
  size_t arenas_used_ = 0;
  std::vector<uint8_t> arena_bytes_;  // its contents, written at submit or when full
  std::vector<BindGroupHandle> owned_groups_;
  std::unique_ptr<ProfiledBatch> profiled_;  // only while a profiler is attached
  bool submitted_ = false;
};

// Grid (x, y) for `n` workgroups, folded into y so neither dimension exceeds the
// adapter's maxComputeWorkgroupsPerDimension. Kernels recover the flat index as
// wid.x + wid.y * grid_x (and skip indices >= n).
struct FoldedGrid {
  uint32_t x = 1, y = 1;
};
FoldedGrid fold_grid(uint64_t n, uint32_t max_per_dim);

}  // namespace wgllm::gpu
