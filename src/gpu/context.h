// The GPU context: instance -> adapter -> device -> queue, with the adapter's own limits,
// optional features, errors turned into exceptions, synchronous upload/readback and submission.
// It owns the pipeline cache (pipelines.h); work is recorded with ComputeBatch (batch.h).
// Everything that touches wgpu-native's extras (wgpu.h) lives in native.cpp.
#pragma once
#include <webgpu/webgpu.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "gpu/handle.h"
#include "gpu/pipelines.h"
#include "gpu/shaders.h"

namespace wgllm::gpu {

class Profiler;

enum class AdapterType { DiscreteGpu, IntegratedGpu, Cpu, Unknown };

struct AdapterDesc {
  uint32_t index = 0;  // position in the enumeration (what --adapter N selects)
  std::string name;    // e.g. "llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA H200"
  std::string vendor;
  std::string architecture;
  std::string driver;   // driver description, e.g. "Mesa 25.0.7"
  std::string backend;  // "Vulkan", "OpenGL", ...
  AdapterType type = AdapterType::Unknown;
  uint32_t subgroup_min = 0, subgroup_max = 0;
  // "discrete GPU", "integrated GPU", "CPU", "unknown"
  const char* type_name() const;
  // A CPU adapter (lavapipe): kernels pick loops and shapes suited to SIMD across invocations.
  bool is_cpu() const { return type == AdapterType::Cpu; }
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
  // The matvec kernel's shape, "THREADSxROWSxGROUPS[xUNITS[xINT_F16]]" (kernels::parse_matvec_config);
  // "" = the adapter's default. A tuning knob for benchmarks and tests.
  std::string matvec_shape = {};
  // Batch decode's products of this many tokens or more on the tiled kernel in the batch matvec's order, of any
  // row count (kernels::batch_tile_from); 0: never; unset: the rule of kernels::kBatchTileFrom, kBatchTileRows and
  // kSplitWorkgroups (kernels/matmul.h). A tuning knob for benchmarks and tests.
  std::optional<uint32_t> batch_tile_from = std::nullopt;
  // Batch decode's tiled products split over this many groups of the matvec's lane classes (a workgroup per tile and
  // group, then a dispatch that adds the groups: kernels::batch_takes_tiles), where the classes allow it; 1: never;
  // unset: as many as it takes for enough workgroups. A tuning knob for benchmarks and tests.
  std::optional<uint32_t> batch_split = std::nullopt;
  // The batch matvec's tokens per pass over W, 8 or 16 (kernels::matvec_pass_tokens); unset: 16. A tuning knob.
  std::optional<uint32_t> matvec_pass = std::nullopt;
  // One-token products with a post norm's residual add in their prologue (MatmulOptions::pre): workgroups of at least
  // this many rows where 256 threads allow (kernels::pre_matvec_config); unset or 0: the matvec's own shape. A tuning
  // knob.
  std::optional<uint32_t> pre_rows = std::nullopt;
  // The tiled matmul's shape, "TOKENSxROWS[/TTxTR][xf16]" (kernels::parse_matmul_tile); "" = chosen per product.
  std::string matmul_tile = {};
  // The CPU adapters' product kernel's shape, "WORKGROUPxROWSxTOKENS" (kernels::parse_rows_config), or "off": the
  // GPUs' kernels on a CPU adapter too; "" = the default.
  std::string rows_shape = {};
  // The MoE expert products' matvec shape (decode and the grouped matvec; kernels::expert_matvec_config),
  // "THREADSxROWSxGROUPS[xUNITS]"; "" = the batch matvec's. A tuning knob for benchmarks.
  std::string expert_shape = {};
  // The prefill attention kernel, "f32", "f16" or "BQxBKxCGxf16" (kernels::parse_attention_variant); "" = chosen
  // per adapter (kernels::AttentionImpl::Auto). A tuning knob for benchmarks.
  std::string attention_prefill = {};
  // Single-sequence decode attention switches from the per-head kernel to the GQA-grouped one (each K/V row read
  // once per kv head) at this depth: the keys a step attends besides itself (kernels::DecodeKernel::Auto). 0: always
  // grouped; past the context: never; unset: the adapter's (kernels::decode_gqa_from). The defaults are measured
  // (PERF.md, long-context decode; `wgllm-bench kernels --decode-depths`): on the H200 the grouped kernel ties or
  // wins for every shape from 8192 on; on lavapipe it wins at every depth, 0 included.
  static constexpr uint32_t kDefaultDecodeGqaFrom = 8192;  // GPUs
  static constexpr uint32_t kCpuDecodeGqaFrom = 0;         // CPU adapters
  std::optional<uint32_t> decode_gqa_from = std::nullopt;
  // A gated DeltaNet call of this many tokens or more runs its recurrence in chunks (kernels::delta_chunk_from,
  // DeltaRuleImpl::Auto); unset: never (token by token), until the chunked kernel is measured ahead on a GPU (on
  // lavapipe its extra arithmetic makes it slower; PERF.md).
  std::optional<uint32_t> delta_chunk_from = std::nullopt;
  // A decoded token's Q4_K FFN gate/up products and Q4_K / Q6_K LM head on packed int8 dot products (kernels::XDigits,
  // MatmulOptions::digits): the normed input as 8-bit digits, 23 bits against each 32-element block's largest element
  // instead of f32's 24 per element. Unset: the model's default (model/transformer.h, int_dot_on: on GPUs where the FFN input is 2,048 wide or
  // more, measured ahead there; PERF.md, "The decode options on the H200").
  std::optional<bool> int_dot = std::nullopt;
  // Prompt products (the tiled kernel's) of Q4_K, Q6_K and Q8_0 (1 or 2 digits) weights on packed int8 dot products
  // (kernels/matmul_int.wgsl): x as this many 8-bit digits per element under one scale per 32 elements, 1 to 3 (3:
  // about 2^-23 of each block's largest element, as int_dot's; 1: llama.cpp's 8-bit activations). 0: off (f32 tiles).
  // Unset: 3 on GPUs for products of 16 tokens or more, 0 on CPU adapters (kernels::prompt_digits).
  std::optional<uint32_t> prompt_digits = std::nullopt;
  // Those products' workgroups on the digits: 64 (64 tokens x 64 rows) or 32 (32 x 128), the tiles of a mixture's
  // experts as well where they take tiles of 32 or 64 pairs. Unset: 64 for the dense products, moe_matmul_tile's for
  // the experts (kernels::prompt_tile). A tuning knob for benchmarks.
  std::optional<uint32_t> prompt_tile = std::nullopt;
  // Decoding one sequence, a post norm's residual add (gemma3, gemma4) runs in the prologue of the next product of x
  // on the matvec (MatmulOptions::pre) instead of as a one-workgroup dispatch of its own: a dispatch fewer per post
  // norm, each workgroup of that product reading two more vectors of n_embd. Unset: the model's default
  // (model/transformer.h, fuse_post_norms_on: gemma3 on GPUs, measured ahead there; PERF.md, "The decode options on the
  // H200").
  std::optional<bool> fuse_post_norms = std::nullopt;
  // Decoding one sequence, a model with per-head q/k norms (qwen3, gemma3/4, lfm2, qwen35) normalises and rotates the
  // new token's q and k, and appends its K and V to the cache, inside the decode attention's dispatch
  // (kernels::encode_attention_decode_fresh) instead of a qk_norm_rope_kv dispatch before it: one dependent link fewer
  // a layer, the same bits. Batched steps over one KV pool likewise for every sequence and every model
  // (kernels::encode_attention_decode_rows_fresh). Unset: the defaults of model/transformer.h (fuse_qk_norm_on,
  // fuse_rows_rope_on).
  std::optional<bool> fuse_qk_norm = std::nullopt;
  // Decoding, a mixture of experts' routing (kernels::encode_moe_route) inside its experts' gate/up products
  // (kernels::ExpertOptions::route), each workgroup choosing its pair's expert from the router's logits: one dependent
  // link fewer a MoE layer, the same bits. Unset: model/transformer.h's fuse_moe_route_on.
  std::optional<bool> fuse_moe_route = std::nullopt;
  // Decoding one sequence, a mixture of experts' router product choosing the token's experts itself
  // (kernels::MatmulOptions::choose) instead of kernels::encode_moe_route's dispatch after it: one dependent link
  // fewer a MoE layer, the same bits. Unset: model/transformer.h's fuse_router_on.
  std::optional<bool> fuse_router = std::nullopt;
  // Shaders beyond the library's, found by name by pipeline() (a test's or a benchmark's own kernels). The
  // span must outlive the context.
  std::span<const EmbeddedShader> extra_shaders = {};
  // Developer aids, read from the environment only at the edges (the CLI, the tests): a file in kernel_dir
  // (WGLLM_KERNEL_DIR) replaces the shader of that name; into dump_shaders_dir (WGLLM_DUMP_SHADERS) goes every
  // WGSL source exactly as compiled (prelude + expanded `//#unroll` blocks). "" = off.
  std::string kernel_dir = {};
  std::string dump_shaders_dir = {};
  // naga's runtime checks in every shader (WGLLM_SHADER_CHECKS=1): each array index clamped, each loop bounded.
  // Off by default: the host checks every shape before dispatch, and the checks slow the inner loops.
  bool shader_checks = false;
};

// A GPU buffer with its logical size (the allocation is rounded up to 4 bytes).
struct Buffer {
  BufferHandle handle;
  uint64_t size = 0;
  WGPUBuffer get() const { return handle.get(); }
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

  const ContextOptions& options() const { return options_; }
  const AdapterDesc& adapter() const { return adapter_desc_; }
  const WGPULimits& limits() const { return limits_; }
  const Features& features() const { return features_; }
  WGPUDevice device() const { return device_.get(); }
  WGPUQueue queue() const { return queue_.get(); }

  // Buffers. Usage always includes CopySrc|CopyDst so tests can poison and read anything.
  Buffer create_buffer(uint64_t size, WGPUBufferUsage usage, std::string_view label);
  // Queued before any work submitted later. Once kWriteChunk bytes of writes are queued they are submitted and
  // waited for, so their staging copies never hold more than a chunk.
  void write_buffer(const Buffer& buf, uint64_t offset, const void* data, uint64_t size);
  static constexpr uint64_t kWriteChunk = 16ull << 20;
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

  // Compute pipelines, compiled once per key (pipelines.h). Shader errors throw ShaderError naming file:line.
  WGPUComputePipeline pipeline(const PipelineKey& key) { return pipelines_->get(key); }
  // The same, found by what make()'s key is made of (a call site's name and its arguments; PipelineCache::find): for
  // the dispatches every decode step repeats.
  template <typename Make>
  WGPUComputePipeline pipeline(const char* site, std::span<const uint32_t> args, Make&& make) {
    if (WGPUComputePipeline found = pipelines_->find(site, args)) return found;
    return pipelines_->insert(site, args, make());
  }
  // A pipeline's short name: its shader file(s) and entry point ("elementwise.wgsl:add"); "?" if not made here.
  std::string pipeline_name(WGPUComputePipeline pipeline) { return pipelines_->name(pipeline); }
  std::string pipeline_detail(WGPUComputePipeline pipeline) { return pipelines_->detail(pipeline); }
  BindGroupHandle bind_group(WGPUComputePipeline pipeline, std::span<const BufferBinding> bindings,
                             std::string_view label = "");

  // Submission. submit_and_wait blocks until the GPU finished; errors raised by the work throw.
  SubmissionIndex submit(WGPUCommandBuffer commands);
  void submit_and_wait(WGPUCommandBuffer commands);
  void wait_idle();
  // Throws the first uncaptured error or device loss recorded since the last call.
  void check_errors();
  // Errors of the calls between push and pop are captured instead of reported: pop returns the first one's
  // message ("" when none), waiting for the verdict.
  void push_error_scope(WGPUErrorFilter filter);
  std::string pop_error_scope(const char* what);

  // GPU timestamps of every dispatch (profiler.h); nullptr = off. While one is attached, each batch made puts
  // every dispatch in its own compute pass; the profiler must outlive those batches.
  void set_profiler(Profiler* profiler) { profiler_ = profiler; }
  Profiler* profiler() const { return profiler_; }

  // A tiny storage buffer for bindings a dispatch does not use (created once).
  const Buffer& placeholder_storage();
  // Another, for unused read_write bindings (a buffer bound read-only and writable in one
  // dispatch is a usage conflict).
  const Buffer& placeholder_writable();

  // A storage buffer of at least `bytes` for intermediate results that one dispatch writes and the next reads (the
  // partial sums of a split product): one per context, grown when asked for more (the work already recorded keeps
  // the smaller one alive), so repeated steps bind the same buffer.
  const Buffer& scratch(uint64_t bytes);

  // The subgroup size invocations run with: the adapter's where it reports one size, else measured once (a
  // workgroup of 64 reads the builtin: subgroup_size.wgsl; wgpu-native reports none for lavapipe or NVIDIA); 0
  // without subgroups or where a workgroup's invocations differ.
  uint32_t subgroup_size();

  // Largest range one binding may cover: min(maxStorageBufferBindingSize, maxBufferSize).
  uint64_t max_binding_size() const;

 private:
  void flush_writes();               // submits the queued writes and waits for them
  uint64_t queued_write_bytes_ = 0;  // written since the last flush_writes
  struct ErrorSink;
  ContextOptions options_;
  InstanceHandle instance_;
  AdapterHandle adapter_;
  DeviceHandle device_;
  QueueHandle queue_;
  AdapterDesc adapter_desc_;
  WGPULimits limits_{};
  Features features_;
  std::unique_ptr<ErrorSink> errors_;
  std::unique_ptr<PipelineCache> pipelines_;
  Buffer placeholder_, placeholder_writable_, scratch_;
  std::optional<uint32_t> subgroup_size_;  // subgroup_size(), once known
  Profiler* profiler_ = nullptr;
};

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
// A shader module with naga's runtime checks (array-index clamps, loop bounding) or without them (checks = false).
WGPUShaderModule create_shader_module(WGPUDevice device, const WGPUShaderModuleDescriptor& desc, bool checks);
// The feature to request for WGSL subgroup operations, or WGPUFeatureName_Force32 when absent.
WGPUFeatureName subgroup_feature(WGPUAdapter adapter);
}  // namespace native

}  // namespace wgllm::gpu
