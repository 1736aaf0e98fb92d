// `wgllm info`: the adapter, its limits that matter to wgllm, and its features.
#include <cstdio>
#include <string>
#include <vector>

#include "command.h"
#include "wgllm/adapter.h"

namespace wgllm::cli {
namespace {

std::string mib(uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.0f MiB", bytes / 1048576.0);
  return buf;
}

int run_info(const std::string& adapter, const std::string& backend, bool list) {
  if (list) {
    const std::vector<AdapterInfo> adapters = list_adapters(backend);
    if (adapters.empty()) {
      std::fprintf(stderr, "wgllm: error: no GPU adapter found (install a Vulkan driver, e.g. Mesa lavapipe)\n");
      return 1;
    }
    for (const auto& a : adapters)
      std::printf("[%u] %s (%s, %s, %s)\n", a.index, a.name.c_str(), a.backend.c_str(), a.type.c_str(),
                  a.driver.c_str());
    return 0;
  }
  const AdapterDetails d = describe_adapter(adapter, backend);
  const AdapterInfo& a = d.adapter;
  const AdapterLimits& l = d.limits;
  const AdapterFeatures& f = d.features;
  std::printf("adapter        %s\n", a.name.c_str());
  std::printf("backend        %s\n", a.backend.c_str());
  std::printf("device type    %s\n", a.type.c_str());
  std::printf("vendor         %s%s%s\n", a.vendor.c_str(), a.architecture.empty() ? "" : " / ", a.architecture.c_str());
  std::printf("driver         %s\n", a.driver.c_str());
  if (a.subgroup_max) std::printf("subgroup size  %u..%u\n", a.subgroup_min, a.subgroup_max);
  std::printf("limits\n");
  std::printf("  maxStorageBufferBindingSize       %llu (%s)\n", (unsigned long long)l.max_storage_buffer_binding_size,
              mib(l.max_storage_buffer_binding_size).c_str());
  std::printf("  maxBufferSize                     %llu (%s)\n", (unsigned long long)l.max_buffer_size,
              mib(l.max_buffer_size).c_str());
  std::printf("  maxStorageBuffersPerShaderStage   %u\n", l.max_storage_buffers_per_shader_stage);
  std::printf("  maxComputeWorkgroupStorageSize    %u\n", l.max_compute_workgroup_storage_size);
  std::printf("  maxComputeInvocationsPerWorkgroup %u\n", l.max_compute_invocations_per_workgroup);
  std::printf("  maxComputeWorkgroupSize           %u x %u x %u\n", l.max_compute_workgroup_size_x,
              l.max_compute_workgroup_size_y, l.max_compute_workgroup_size_z);
  std::printf("  maxComputeWorkgroupsPerDimension  %u\n", l.max_compute_workgroups_per_dimension);
  std::printf("features       %s%s%s\n", f.shader_f16 ? "shader-f16 " : "", f.subgroups ? "subgroups " : "",
              f.timestamp_query ? "timestamp-query" : "");
  return 0;
}

const Register reg{
    {"info", "show the GPU adapter, its limits and features", [](CLI::App& app) -> std::function<int()> {
       auto adapter = std::make_shared<std::string>();
       auto list = std::make_shared<bool>(false);
       app.add_option("--adapter", *adapter, "adapter index or name substring (see --list)");
       auto backend = std::make_shared<std::string>("primary");
       app.add_option("--backend", *backend, "primary (Vulkan/Metal/D3D12), vulkan, gl or all")->capture_default_str();
       app.add_flag("--list", *list, "list every adapter of the chosen backends");
       return [=] { return run_info(*adapter, *backend, *list); };
     }}};

}  // namespace
}  // namespace wgllm::cli
