#include "gpu/batch.h"

#include <algorithm>
#include <cstring>

#include "gpu/profiler.h"
#include "wgllm/error.h"

namespace wgllm::gpu {

FoldedGrid fold_grid(uint64_t n, uint32_t max_per_dim) {
  if (n == 0) return {0, 1};
  if (n <= max_per_dim) return {static_cast<uint32_t>(n), 1};
  const uint64_t y = (n + max_per_dim - 1) / max_per_dim;
  if (y > max_per_dim)
    throw InvalidArgument("grid of " + std::to_string(n) + " workgroups exceeds the adapter's " +
                          std::to_string(max_per_dim) + "^2 limit");
  const uint64_t x = (n + y - 1) / y;
  return {static_cast<uint32_t>(x), static_cast<uint32_t>(y)};
}

const Buffer& BindCache::arena(size_t index, uint64_t size) {
  while (arenas_.size() <= index)
    arenas_.push_back(ctx_.create_buffer(size, WGPUBufferUsage_Uniform, "params (cached)"));
  return arenas_[index];
}

size_t BindCache::KeyHash::operator()(const std::vector<uint64_t>& k) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t v : k) h = (h ^ v ^ (v >> 29)) * 0x100000001b3ull;
  return size_t(h);
}

WGPUBindGroup BindCache::group(WGPUComputePipeline pipeline, std::span<const BufferBinding> bindings,
                               std::string_view label) {
  key_.assign(1, reinterpret_cast<uint64_t>(pipeline));
  for (const auto& b : bindings)
    key_.insert(key_.end(), {b.binding, reinterpret_cast<uint64_t>(b.buffer->get()), b.offset, b.size});
  if (auto it = groups_.find(key_); it != groups_.end()) return it->second.get();
  if (groups_.size() >= max_groups_) groups_.clear();
  ++misses_;
  return groups_.emplace(key_, ctx_.bind_group(pipeline, bindings, label)).first->second.get();
}

ComputeBatch::ComputeBatch(Context& ctx, std::string_view label, BindCache* cache)
    : ctx_(ctx), label_(label), cache_(cache) {
  WGPUCommandEncoderDescriptor d{};
  d.label = sv(label_);
  encoder_.reset(wgpuDeviceCreateCommandEncoder(ctx_.device(), &d));
  if (ctx_.profiler()) profiled_ = std::make_unique<ProfiledBatch>(ProfiledBatch{ctx_.profiler(), {}});
}

ComputeBatch::~ComputeBatch() {
  if (profiled_) profiled_->profiler->release(*profiled_);
}

void ComputeBatch::begin_pass(const WGPUPassTimestampWrites* timestamps) {
  if (pass_) return;
  WGPUComputePassDescriptor d{};
  d.label = sv(label_);
  d.timestampWrites = timestamps;
  pass_.reset(wgpuCommandEncoderBeginComputePass(encoder_.get(), &d));
}

void ComputeBatch::end_pass() {
  if (!pass_) return;
  wgpuComputePassEncoderEnd(pass_.get());
  pass_.reset();
}

void ComputeBatch::dispatch(WGPUComputePipeline pipeline, WGPUBindGroup group, uint32_t x, uint32_t y, uint32_t z) {
  if (submitted_) throw InvalidArgument("dispatch on a ComputeBatch that was already submitted");
  if (x == 0 || y == 0 || z == 0) return;  // nothing to do (a zero grid is valid but pointless)
  const uint32_t lim = ctx_.limits().maxComputeWorkgroupsPerDimension;
  if (x > lim || y > lim || z > lim)
    throw InvalidArgument("dispatch grid (" + std::to_string(x) + ", " + std::to_string(y) + ", " + std::to_string(z) +
                          ") exceeds maxComputeWorkgroupsPerDimension " + std::to_string(lim));
  if (profiled_) {  // a pass of its own, timed from its beginning to its end
    end_pass();
    const WGPUPassTimestampWrites timestamps =
        profiled_->profiler->add_dispatch(*profiled_, pipeline, uint64_t(x) * y * z);
    begin_pass(&timestamps);
  } else {
    begin_pass();
  }
  wgpuComputePassEncoderSetPipeline(pass_.get(), pipeline);
  wgpuComputePassEncoderSetBindGroup(pass_.get(), 0, group, 0, nullptr);
  wgpuComputePassEncoderDispatchWorkgroups(pass_.get(), x, y, z);
  if (profiled_) end_pass();
}

void ComputeBatch::dispatch(WGPUComputePipeline pipeline, std::span<const BufferBinding> bindings, uint32_t x,
                            uint32_t y, uint32_t z) {
  if (cache_) return dispatch(pipeline, cache_->group(pipeline, bindings, label_), x, y, z);
  owned_groups_.push_back(ctx_.bind_group(pipeline, bindings, label_));
  dispatch(pipeline, owned_groups_.back().get(), x, y, z);
}

BufferBinding ComputeBatch::uniform(uint32_t binding, const void* bytes, uint64_t size) {
  constexpr uint64_t kArenaBytes = 64 * 1024;
  const uint64_t align = std::max<uint64_t>(256, ctx_.limits().minUniformBufferOffsetAlignment);
  if (size == 0 || size > kArenaBytes) throw InvalidArgument("uniform of " + std::to_string(size) + " bytes");
  uint64_t offset = (arena_bytes_.size() + align - 1) / align * align;
  if (!arena_ || offset + size > kArenaBytes) {
    flush_uniforms();
    if (cache_) {
      arena_ = &cache_->arena(arenas_used_++, kArenaBytes);
    } else {
      owned_buffers_.push_back(ctx_.create_buffer(kArenaBytes, WGPUBufferUsage_Uniform, label_ + " params"));
      arena_ = &owned_buffers_.back();
    }
    offset = 0;
  }
  arena_bytes_.resize(offset + size);
  std::memcpy(arena_bytes_.data() + offset, bytes, size);
  return {binding, arena_, offset, (size + 3) & ~uint64_t(3)};
}

void ComputeBatch::flush_uniforms() {
  if (arena_ && !arena_bytes_.empty()) {
    arena_bytes_.resize((arena_bytes_.size() + 3) & ~size_t(3));
    ctx_.write_buffer(*arena_, 0, arena_bytes_.data(), arena_bytes_.size());
  }
  arena_bytes_.clear();
}

void ComputeBatch::copy(const Buffer& src, uint64_t src_offset, const Buffer& dst, uint64_t dst_offset, uint64_t size) {
  end_pass();
  wgpuCommandEncoderCopyBufferToBuffer(encoder_.get(), src.get(), src_offset, dst.get(), dst_offset, size);
}

SubmissionIndex ComputeBatch::submit() {
  if (submitted_) throw InvalidArgument("ComputeBatch submitted twice");
  end_pass();
  flush_uniforms();  // queue writes land before the commands that read them
  if (profiled_) profiled_->profiler->resolve(*profiled_, encoder_.get());
  WGPUCommandBufferDescriptor d{};
  CommandBufferHandle cmd(wgpuCommandEncoderFinish(encoder_.get(), &d));
  submitted_ = true;
  const SubmissionIndex index = ctx_.submit(cmd.get());
  if (profiled_) profiled_->profiler->submitted(*profiled_);
  return index;
}

void ComputeBatch::submit_and_wait() {
  submit();
  ctx_.wait_idle();
}

}  // namespace wgllm::gpu
