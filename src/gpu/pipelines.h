// Compute pipelines: the WGSL of a pipeline key (embedded shaders, a context's extra shaders, or a developer's
// override directory), `//#unroll` expansion, compilation with diagnostics that name file:line, and the cache
// of compiled pipelines and their bind-group layouts. A Context owns one; kernels reach it through ctx.pipeline().
#pragma once
#include <webgpu/webgpu.h>

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "gpu/handle.h"

namespace wgllm::gpu {

class Context;

// Everything that changes the generated code of a compute pipeline.
struct PipelineKey {
  std::string shader;  // file name of an embedded shader; "a.wgsl+b.wgsl" joins files
  std::string entry_point;
  std::vector<std::pair<std::string, double>> overrides;  // WGSL `override` constants
  std::string prelude;                                    // WGSL text prepended (enable f16; aliases)
  // What the prelude makes of it, for profiles ("Q4_K 64x4x2 1 token"): not part of the key (the prelude decides it)
  std::string detail = {};
  std::string to_string() const;  // also the pipeline's debug label
};

class PipelineCache {
 public:
  explicit PipelineCache(Context& ctx) : ctx_(ctx) {}
  PipelineCache(const PipelineCache&) = delete;
  PipelineCache& operator=(const PipelineCache&) = delete;

  // Compiled once per key. Shader errors throw ShaderError naming file:line.
  WGPUComputePipeline get(const PipelineKey& key);
  // The same pipeline found by what its key is made of: `site`, a string naming the call site (told apart by its
  // address: one per call site), and `args` (at most kMaxArgs values), everything its key depends on besides the
  // context. Context::pipeline(site, args, make) finds it (nullptr: not made yet) and inserts a missing one with
  // make()'s key, so a dispatch that repeats builds no prelude, no key string and no copy of make (a decode step's
  // products spent 2.5 us of host work each on the first two; PERF.md).
  static constexpr size_t kMaxArgs = 24;
  WGPUComputePipeline find(const char* site, std::span<const uint32_t> args);
  WGPUComputePipeline insert(const char* site, std::span<const uint32_t> args, const PipelineKey& key);
  // "elementwise.wgsl:add" for a pipeline made here; "?" otherwise.
  std::string name(WGPUComputePipeline pipeline);
  // Its key's detail ("" where none, or not made here).
  std::string detail(WGPUComputePipeline pipeline);
  // Bind group 0's layout of a pipeline (kept for the pipeline's life).
  WGPUBindGroupLayout layout(WGPUComputePipeline pipeline);

 private:
  struct ArgsKey {
    const char* site;
    uint32_t n;
    std::array<uint32_t, kMaxArgs> args;
    bool operator==(const ArgsKey&) const = default;
  };
  struct ArgsHash {
    size_t operator()(const ArgsKey& k) const;
  };
  static ArgsKey args_key(const char* site, std::span<const uint32_t> args);
  WGPUComputePipeline get_locked(const PipelineKey& key);
  Context& ctx_;
  std::mutex mutex_;
  std::map<std::string, ComputePipelineHandle> pipelines_;
  std::unordered_map<ArgsKey, WGPUComputePipeline, ArgsHash> by_args_;
  std::map<WGPUComputePipeline, BindGroupLayoutHandle> layouts_;
  std::map<WGPUComputePipeline, std::string> names_, details_;
};

}  // namespace wgllm::gpu
