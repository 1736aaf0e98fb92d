// The one place that uses wgpu-native's extensions (wgpu.h); everything else is standard webgpu.h.
#include <webgpu/wgpu.h>

#include "gpu/context.h"
#include "wgllm/error.h"

namespace wgllm::gpu::native {

WGPUInstance create_instance(std::string_view backends) {
  WGPUInstanceExtras extras{};
  extras.chain.sType = static_cast<WGPUSType>(WGPUSType_InstanceExtras);
  if (backends == "all")
    extras.backends = WGPUInstanceBackend_All;
  else if (backends == "vulkan")
    extras.backends = WGPUInstanceBackend_Vulkan;
  else if (backends == "gl")
    extras.backends = WGPUInstanceBackend_GL;
  else if (backends.empty() || backends == "primary")
    extras.backends = WGPUInstanceBackend_Primary;
  else
    throw InvalidArgument("backend '" + std::string(backends) + "': expected primary, vulkan, gl or all");
  WGPUInstanceDescriptor desc{};
  desc.nextInChain = &extras.chain;
  return wgpuCreateInstance(&desc);
}

std::vector<AdapterHandle> enumerate_adapters(WGPUInstance instance) {
  const size_t n = wgpuInstanceEnumerateAdapters(instance, nullptr, nullptr);
  std::vector<WGPUAdapter> raw(n, nullptr);
  if (n) wgpuInstanceEnumerateAdapters(instance, nullptr, raw.data());
  std::vector<AdapterHandle> out;
  for (WGPUAdapter a : raw) out.emplace_back(a);
  return out;
}

// wgpuInstanceWaitAny is not implemented in wgpu-native 29: block in wgpuDevicePoll instead.
void poll_wait(WGPUDevice device, const uint64_t* index) {
  const WGPUSubmissionIndex i = index ? *index : 0;
  wgpuDevicePoll(device, true, index ? &i : nullptr);
}
uint64_t submit(WGPUQueue queue, WGPUCommandBuffer commands) { return wgpuQueueSubmitForIndex(queue, 1, &commands); }
void poll(WGPUDevice device) { wgpuDevicePoll(device, false, nullptr); }

// webgpu.h has no way to ask: resolved timestamps are raw ticks (unless the instance asks wgpu to normalise them).
double timestamp_period(WGPUQueue queue) { return double(wgpuQueueGetTimestampPeriod(queue)); }

// naga guards every array index with a clamp and every loop with an iteration counter unless the module is
// "trusted". Our kernels' indices are in range by construction (the host checks every shape before dispatch) and
// storage buffers keep the driver's robust access either way, so the guards are kept only when asked for: on the
// matmul's workgroup-memory loads they cost 28 % of prefill on the H200 (PERF.md, trusted shaders).
WGPUShaderModule create_shader_module(WGPUDevice device, const WGPUShaderModuleDescriptor& desc, bool checks) {
  if (checks) return wgpuDeviceCreateShaderModule(device, &desc);
  return wgpuDeviceCreateShaderModuleTrusted(device, &desc, WGPUShaderRuntimeChecks_None);
}

// wgpu-native 29 reports subgroups as its own WGPUNativeFeature_Subgroup, not the standard
// WGPUFeatureName_Subgroups; accept either.
WGPUFeatureName subgroup_feature(WGPUAdapter adapter) {
  if (wgpuAdapterHasFeature(adapter, WGPUFeatureName_Subgroups)) return WGPUFeatureName_Subgroups;
  const auto native_subgroup = static_cast<WGPUFeatureName>(WGPUNativeFeature_Subgroup);
  if (wgpuAdapterHasFeature(adapter, native_subgroup)) return native_subgroup;
  return WGPUFeatureName_Force32;
}

}  // namespace wgllm::gpu::native
