// Move-only RAII owners for WebGPU handles.
#pragma once
#include <webgpu/webgpu.h>

#include <string_view>
#include <utility>

namespace wgllm::gpu {

template <typename T, void (*Release)(T)>
class Handle {
 public:
  Handle() = default;
  explicit Handle(T h) : h_(h) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  Handle(Handle&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  Handle& operator=(Handle&& o) noexcept {
    if (this != &o) reset(std::exchange(o.h_, nullptr));
    return *this;
  }
  ~Handle() { reset(); }

  T get() const { return h_; }
  explicit operator bool() const { return h_ != nullptr; }
  void reset(T h = nullptr) {
    if (h_) Release(h_);
    h_ = h;
  }

 private:
  T h_ = nullptr;
};

using InstanceHandle = Handle<WGPUInstance, wgpuInstanceRelease>;
using AdapterHandle = Handle<WGPUAdapter, wgpuAdapterRelease>;
using DeviceHandle = Handle<WGPUDevice, wgpuDeviceRelease>;
using QueueHandle = Handle<WGPUQueue, wgpuQueueRelease>;
using BufferHandle = Handle<WGPUBuffer, wgpuBufferRelease>;
using ShaderModuleHandle = Handle<WGPUShaderModule, wgpuShaderModuleRelease>;
using ComputePipelineHandle = Handle<WGPUComputePipeline, wgpuComputePipelineRelease>;
using BindGroupHandle = Handle<WGPUBindGroup, wgpuBindGroupRelease>;
using BindGroupLayoutHandle = Handle<WGPUBindGroupLayout, wgpuBindGroupLayoutRelease>;
using CommandEncoderHandle = Handle<WGPUCommandEncoder, wgpuCommandEncoderRelease>;
using CommandBufferHandle = Handle<WGPUCommandBuffer, wgpuCommandBufferRelease>;
using ComputePassHandle = Handle<WGPUComputePassEncoder, wgpuComputePassEncoderRelease>;
using QuerySetHandle = Handle<WGPUQuerySet, wgpuQuerySetRelease>;

inline WGPUStringView sv(const char* s) { return WGPUStringView{s, WGPU_STRLEN}; }
inline WGPUStringView sv(std::string_view s) { return WGPUStringView{s.data(), s.size()}; }

}  // namespace wgllm::gpu
