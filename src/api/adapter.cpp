// wgllm/adapter.h over gpu::Context.
#include "wgllm/adapter.h"

#include "gpu/context.h"

namespace wgllm {

namespace {

AdapterInfo info_of(const gpu::AdapterDesc& d) {
  return {.index = d.index,
          .name = d.name,
          .vendor = d.vendor,
          .architecture = d.architecture,
          .driver = d.driver,
          .backend = d.backend,
          .type = d.type_name(),
          .is_cpu = d.is_cpu(),
          .subgroup_min = d.subgroup_min,
          .subgroup_max = d.subgroup_max};
}

}  // namespace

std::vector<AdapterInfo> list_adapters(const std::string& backend) {
  std::vector<AdapterInfo> out;
  for (const gpu::AdapterDesc& d : gpu::Context::list_adapters(backend)) out.push_back(info_of(d));
  return out;
}

AdapterDetails describe_adapter(const std::string& adapter, const std::string& backend) {
  const gpu::Context ctx({.adapter = adapter, .backend = backend});
  const WGPULimits& l = ctx.limits();
  const gpu::Features& f = ctx.features();
  AdapterDetails d;
  d.adapter = info_of(ctx.adapter());
  d.limits = {.max_storage_buffer_binding_size = l.maxStorageBufferBindingSize,
              .max_buffer_size = l.maxBufferSize,
              .max_storage_buffers_per_shader_stage = l.maxStorageBuffersPerShaderStage,
              .max_compute_workgroup_storage_size = l.maxComputeWorkgroupStorageSize,
              .max_compute_invocations_per_workgroup = l.maxComputeInvocationsPerWorkgroup,
              .max_compute_workgroup_size_x = l.maxComputeWorkgroupSizeX,
              .max_compute_workgroup_size_y = l.maxComputeWorkgroupSizeY,
              .max_compute_workgroup_size_z = l.maxComputeWorkgroupSizeZ,
              .max_compute_workgroups_per_dimension = l.maxComputeWorkgroupsPerDimension};
  d.features = {.shader_f16 = f.shader_f16, .subgroups = f.subgroups, .timestamp_query = f.timestamp_query};
  return d;
}

}  // namespace wgllm
