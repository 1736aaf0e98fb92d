// The WebGPU adapters of this machine: what `wgllm info` shows. Enumerating opens no device; describing one opens
// a device on it (as Model::load would) and reports the limits and features wgllm gets there.
//
//   for (const wgllm::AdapterInfo& a : wgllm::list_adapters()) std::printf("[%u] %s\n", a.index, a.name.c_str());
//   const wgllm::AdapterDetails d = wgllm::describe_adapter("");  // the adapter Model::load picks by default
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "wgllm/error.h"

namespace wgllm {

struct AdapterInfo {
  uint32_t index = 0;     // position in the enumeration of its backends (what LoadOptions::adapter "N" selects)
  std::string name = {};  // e.g. "llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA H200"
  std::string vendor = {};
  std::string architecture = {};
  std::string driver = {};                      // driver description, e.g. "Mesa 25.0.7"
  std::string backend = {};                     // "Vulkan", "OpenGL", ...
  std::string type = {};                        // "discrete GPU", "integrated GPU", "CPU", "unknown"
  bool is_cpu = false;                          // a CPU adapter (e.g. Mesa lavapipe)
  uint32_t subgroup_min = 0, subgroup_max = 0;  // 0 when the adapter does not say
};

// The device limits that matter to wgllm (wgllm asks for the adapter's own maxima, not WebGPU's defaults).
struct AdapterLimits {
  uint64_t max_storage_buffer_binding_size = 0;
  uint64_t max_buffer_size = 0;
  uint32_t max_storage_buffers_per_shader_stage = 0;
  uint32_t max_compute_workgroup_storage_size = 0;
  uint32_t max_compute_invocations_per_workgroup = 0;
  uint32_t max_compute_workgroup_size_x = 0, max_compute_workgroup_size_y = 0, max_compute_workgroup_size_z = 0;
  uint32_t max_compute_workgroups_per_dimension = 0;
};

// Optional WebGPU features wgllm uses when present.
struct AdapterFeatures {
  bool shader_f16 = false;
  bool subgroups = false;
  bool timestamp_query = false;  // needed by Profiler (wgllm/profile.h)
};

struct AdapterDetails {
  AdapterInfo adapter;
  AdapterLimits limits;
  AdapterFeatures features;
};

// Every adapter of the backends: "primary" (Vulkan/Metal/D3D12), "vulkan", "gl" or "all"; in enumeration order
// (may be empty). InvalidArgument for another backend name.
std::vector<AdapterInfo> list_adapters(const std::string& backend = "all");

// Opens a device on `adapter` ("" = the best one, as Model::load picks; an index of list_adapters(backend); or a
// case-insensitive part of the name) and reports it. GpuError when there is no such adapter or no device.
AdapterDetails describe_adapter(const std::string& adapter = "", const std::string& backend = "primary");

}  // namespace wgllm
