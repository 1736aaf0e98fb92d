// The GPU context: instance -> adapter -> device -> queue, with the adapter's own limits,
// optional features, errors turned into exceptions, synchronous upload/readback and one
// pipeline cache. Everything that touches wgpu-native's extras (wgpu.h) lives in native.cpp.
#pragma once
#include <webgpu/webgpu.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "gpu/handle.h"

namespace wgllm::gpu {

class Profiler;
struct ProfiledBatch;

struct AdapterDesc {
  uint32_t index = 0;          // position in the enumeration (what --adapter N selects)
  std::string name;            // e.g. "llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA H200"
  std::string vendor;
  std::string architecture;
  std::string driver;          // driver description, e.g. "Mesa 25.0.7"
  std::string backend;         // "Vulkan", "OpenGL", ...
  std::string type;            // "discrete GPU", "integrated GPU", "CPU", "unknown"
  uint32_t subgroup_min = 0, subgroup_max = 0;
};

struct Features {
  bool shader_f16 = false;
  bool subgroups = false;
  bool timestamp_query = false;
};

struct ContextOptions {
  // "" picks the best adapter (discrete GPU > integrated > CPU; Vulkan first);
  // a number picks that index of `wgllm info --list`; anything else is a case-insensitive
  // substring of the adapter name.
  std::string adapter;
  // Which WebGPU backends to consider: "primary" (Vulkan/Metal/D3D12; default), "vulkan",
  // "gl" (wgpu's OpenGL backend: no f16, fewer bindings) or "all".
  std::string backend = "primary";
  bool disable_f16 = false;        // behave as if shader-f16 were absent (tests the fallbacks)
  bool disable_subgroups = false;  // likewise for subgroups
  // The matvec kernel's shape, "THREADSxROWSxGROUPS[xUNITS[xINT_F16]]" (kernels::parse_matvec_config); "" = the
  // adapter's default. A tuning knob for benchmarks and tests.
  std::string matvec_shape = "";
};

// A GPU buffer with its logical size (the allocation is rounded up to 4 bytes).
struct Buffer {
  BufferHandle handle;
  uint64_t size = 0;
  WGPUBuffer get() const { return handle.get(); }
};

// Everything that changes the generated code of a compute pipeline.
struct PipelineKey {
  std::string shader;                               // file name under src/kernels/
  std::string entry_point;
  std::vector<std::pair<std::string, double>> overrides;  // WGSL `override` constants
  std::string prelude;                              // WGSL text prepended (enable f16; aliases)
  std::string to_string() const;                    // also the pipeline's debug label
};

// Identifies one queue submission (Context::submit); later submissions have larger indices.
using SubmissionIndex = uint64_t;

// One storage/uniform buffer range bound at @binding(binding) of group 0.
struct BufferBinding {
  uint32_t binding;
  const Buffer* buffer;
  uint64_t offset = 0;
  uint64_t size = 0;  // 0 = to the end of the buffer
};

class Context {
 public:
  explicit Context(const ContextOptions& options = {});
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // All adapters this machine offers, in enumeration order (creates a private instance).
  static std::vector<AdapterDesc> list_adapters(std::string_view backend = "all");

  const AdapterDesc& adapter() const { return adapter_desc_; }
  const WGPULimits& limits() const { return limits_; }
  const Features& features() const { return features_; }
  const ContextOptions& options() const { return options_; }
  WGPUDevice device() const { return device_.get(); }
  WGPUQueue queue() const { return queue_.get(); }
  WGPUInstance instance() const { return instance_.get(); }

  // Buffers. Usage always includes CopySrc|CopyDst so tests can poison and read anything.
  Buffer create_buffer(uint64_t size, WGPUBufferUsage usage, std::string_view label);
  void write_buffer(const Buffer& buf, uint64_t offset, const void* data, uint64_t size);
  void read_buffer(const Buffer& buf, uint64_t offset, void* dst, uint64_t size);
  // Reads from a MapRead buffer that submitted work copies into: maps it (waiting for that work),
  // copies [offset, offset + size) out and unmaps. One wait, no staging buffer of its own. With `after`, the wait
  // is for that submission only (the one that copies into `staging`): later submissions keep running.
  void read_mapped(const Buffer& staging, uint64_t offset, void* dst, uint64_t size,
                   std::optional<SubmissionIndex> after = std::nullopt);
  template <typename T>
  std::vector<T> read(const Buffer& buf, uint64_t offset_bytes = 0, uint64_t count = 0) {
    if (count == 0) count = (buf.size - offset_bytes) / sizeof(T);
    std::vector<T> out(count);
    read_buffer(buf, offset_bytes, out.data(), count * sizeof(T));
    return out;
  }
  template <typename T>
  Buffer upload(std::span<const T> data, WGPUBufferUsage usage, std::string_view label) {
    Buffer b = create_buffer(data.size_bytes(), usage, label);
    write_buffer(b, 0, data.data(), data.size_bytes());
    return b;
  }

  // Compute pipelines, compiled once per key. Shader errors throw ShaderError naming file:line.
  WGPUComputePipeline pipeline(const PipelineKey& key);
  // A pipeline's short name: its shader file(s) and entry point ("elementwise.wgsl:add"); "?" if not made here.
  std::string pipeline_name(WGPUComputePipeline pipeline);
  BindGroupHandle bind_group(WGPUComputePipeline pipeline, std::span<const BufferBinding> bindings,
                             std::string_view label = "");

  // Submission. submit_and_wait blocks until the GPU finished; errors raised by the work throw.
  SubmissionIndex submit(WGPUCommandBuffer commands);
  void submit_and_wait(WGPUCommandBuffer commands);
  void wait_idle();
  // Throws the first uncaptured error or device loss recorded since the last call.
  void check_errors();
  // Polls the device and drives callbacks (registered with AllowProcessEvents) until `done`; bounded.
  void wait_until(const std::function<bool()>& done, const char* what);

  // GPU timestamps of every dispatch (profiler.h); nullptr = off. While one is attached, each batch made puts
  // every dispatch in its own compute pass; the profiler must outlive those batches.
  void set_profiler(Profiler* profiler) { profiler_ = profiler; }
  Profiler* profiler() const { return profiler_; }

  // A tiny storage buffer for bindings a dispatch does not use (created once).
  const Buffer& placeholder_storage();
  // Another, for unused read_write bindings (a buffer bound read-only and writable in one
  // dispatch is a usage conflict).
  const Buffer& placeholder_writable();

  // Largest range one binding may cover: min(maxStorageBufferBindingSize, maxBufferSize).
  uint64_t max_binding_size() const;

 private:
  struct ErrorSink;
  InstanceHandle instance_;
  AdapterHandle adapter_;
  DeviceHandle device_;
  QueueHandle queue_;
  AdapterDesc adapter_desc_;
  WGPULimits limits_{};
  Features features_;
  ContextOptions options_;
  std::unique_ptr<ErrorSink> errors_;
  std::mutex pipelines_mutex_;
  std::map<std::string, ComputePipelineHandle> pipelines_;
  std::map<WGPUComputePipeline, BindGroupLayoutHandle> layouts_;  // group 0 of each pipeline
  std::map<WGPUComputePipeline, std::string> pipeline_names_;      // for profiles
  Buffer placeholder_, placeholder_writable_;
  Profiler* profiler_ = nullptr;
};

// Bind groups kept across batches, for work that repeats (a decode step): a batch given a cache takes its
// uniform arenas from it in order (arena 0, 1, ... of every batch) and looks each bind group up by its exact
// bindings, so a step whose dispatches and buffers match an earlier one's creates no bind group. Reusing an
// arena is safe: its new contents are a queue write, ordered after the work already submitted. Groups hold
// their buffers alive; the cache is dropped whole past kMaxGroups entries (and with its owner).
class BindCache {
 public:
  explicit BindCache(Context& ctx) : ctx_(ctx) {}
  const Buffer& arena(size_t index, uint64_t size);
  WGPUBindGroup group(WGPUComputePipeline pipeline, std::span<const BufferBinding> bindings, std::string_view label);
  size_t size() const { return groups_.size(); }
  uint64_t misses() const { return misses_; }  // bind groups created so far

 private:
  static constexpr size_t kMaxGroups = 4096;
  Context& ctx_;
  std::deque<Buffer> arenas_;
  std::map<std::vector<uint64_t>, BindGroupHandle> groups_;
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
  void dispatch(WGPUComputePipeline pipeline, std::span<const BufferBinding> bindings, uint32_t x,
                uint32_t y = 1, uint32_t z = 1);
  // Kernel parameters (a uniform struct) for @binding(binding). All of a batch's parameters
  // share a few arena buffers, uploaded once at submit: no buffer is created per dispatch.
  BufferBinding uniform(uint32_t binding, const void* bytes, uint64_t size);
  template <typename T>
  BufferBinding uniform(uint32_t binding, const T& params) { return uniform(binding, &params, sizeof(T)); }
  // A storage buffer of `size` bytes owned by the batch (scratch space, placeholders).
  const Buffer& scratch(uint64_t size);
  // Copy between buffers (ends the current compute pass).
  void copy(const Buffer& src, uint64_t src_offset, const Buffer& dst, uint64_t dst_offset, uint64_t size);

  SubmissionIndex submit();  // finish and submit; the batch is spent afterwards
  void submit_and_wait();  // submit and block until done

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

// wgpu-native extras (native.cpp): waiting on submissions and enumerating adapters.
namespace native {
// backends: "primary" (Vulkan/Metal/D3D12, the default), "vulkan", "gl" or "all".
WGPUInstance create_instance(std::string_view backends);
std::vector<AdapterHandle> enumerate_adapters(WGPUInstance instance);
// Submits one command buffer; returns its submission index.
uint64_t submit(WGPUQueue queue, WGPUCommandBuffer commands);
// Blocks until the submission `index` is done (nullptr: every submission so far).
void poll_wait(WGPUDevice device, const uint64_t* index = nullptr);
void poll(WGPUDevice device);
// Nanoseconds per timestamp-query tick.
double timestamp_period(WGPUQueue queue);
// The feature to request for WGSL subgroup operations, or WGPUFeatureName_Force32 when absent.
WGPUFeatureName subgroup_feature(WGPUAdapter adapter);
}  // namespace native

}  // namespace wgllm::gpu
