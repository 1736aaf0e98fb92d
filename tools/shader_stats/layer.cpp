// VK_LAYER_WGLLM_shader_stats: a Vulkan layer that shows what the driver makes of our kernels. Loaded under any
// Vulkan program (wgllm, wgllm-bench) it
//   - writes every shader module's SPIR-V (what wgpu-native's naga handed to the driver) to $WGLLM_SHADER_STATS_DIR
//     as module-<n>.spv;
//   - enables VK_KHR_pipeline_executable_properties on the device where the driver offers it, creates every compute
//     pipeline with statistics (and internal representations) captured, and writes them as pipeline-<n>.txt: the
//     entry point, the module, each executable's name and description, then one line per statistic
//     ("name = value  # description"), then the internal representations the driver gives (NVIDIA: none or its own
//     text; Mesa: NIR and backend IR).
// Without the extension it still writes the SPIR-V and one line saying so. scripts/shader_stats.sh runs a command
// under it and tabulates the statistics.
#include <vulkan/vk_layer.h>
#include <vulkan/vulkan.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace {

// The next layer's (or the driver's) functions, looked up while the instance is created: asked later, the loader's
// lookup with the instance handle would give the top of the chain again (this layer).
struct InstanceData {
  PFN_vkGetInstanceProcAddr next_gipa = nullptr;
  PFN_vkDestroyInstance destroy_instance = nullptr;
  PFN_vkEnumerateDeviceExtensionProperties enumerate_device_extensions = nullptr;
};

struct DeviceData {
  PFN_vkGetDeviceProcAddr next_gdpa = nullptr;
  PFN_vkCreateShaderModule create_shader_module = nullptr;
  PFN_vkCreateComputePipelines create_compute_pipelines = nullptr;
  PFN_vkDestroyDevice destroy_device = nullptr;
  PFN_vkGetPipelineExecutablePropertiesKHR executable_properties = nullptr;
  PFN_vkGetPipelineExecutableStatisticsKHR executable_statistics = nullptr;
  PFN_vkGetPipelineExecutableInternalRepresentationsKHR internal_representations = nullptr;
  bool stats = false;  // the extension and its feature are enabled
};

std::mutex g_mu;
std::unordered_map<void*, InstanceData> g_instances;  // by dispatch key
std::unordered_map<void*, DeviceData> g_devices;      // by dispatch key
std::unordered_map<uint64_t, int> g_module_numbers;   // shader module handle -> n of module-<n>.spv
std::atomic<int> g_next_module{0}, g_next_pipeline{0};

// A Vulkan struct zeroed but for its sType.
template <typename T>
T typed(VkStructureType type) {
  T v{};
  v.sType = type;
  return v;
}

void* key(const void* dispatchable) { return *static_cast<void* const*>(dispatchable); }

std::string out_dir() {
  const char* d = std::getenv("WGLLM_SHADER_STATS_DIR");
  return d && *d ? d : ".";
}

InstanceData instance_data(VkInstance instance) {
  std::lock_guard lock(g_mu);
  auto it = g_instances.find(key(instance));
  return it == g_instances.end() ? InstanceData{} : it->second;
}

VKAPI_ATTR VkResult VKAPI_CALL CreateInstance(const VkInstanceCreateInfo* info, const VkAllocationCallbacks* alloc,
                                              VkInstance* instance) {
  auto* link = const_cast<VkLayerInstanceCreateInfo*>(static_cast<const VkLayerInstanceCreateInfo*>(info->pNext));
  while (link &&
         !(link->sType == VK_STRUCTURE_TYPE_LOADER_INSTANCE_CREATE_INFO && link->function == VK_LAYER_LINK_INFO))
    link = const_cast<VkLayerInstanceCreateInfo*>(static_cast<const VkLayerInstanceCreateInfo*>(link->pNext));
  if (!link) return VK_ERROR_INITIALIZATION_FAILED;
  const PFN_vkGetInstanceProcAddr gipa = link->u.pLayerInfo->pfnNextGetInstanceProcAddr;
  link->u.pLayerInfo = link->u.pLayerInfo->pNext;
  auto create = reinterpret_cast<PFN_vkCreateInstance>(gipa(VK_NULL_HANDLE, "vkCreateInstance"));
  const VkResult r = create(info, alloc, instance);
  if (r != VK_SUCCESS) return r;
  InstanceData d;
  d.next_gipa = gipa;
  d.destroy_instance = reinterpret_cast<PFN_vkDestroyInstance>(gipa(*instance, "vkDestroyInstance"));
  d.enumerate_device_extensions = reinterpret_cast<PFN_vkEnumerateDeviceExtensionProperties>(
      gipa(*instance, "vkEnumerateDeviceExtensionProperties"));
  std::lock_guard lock(g_mu);
  g_instances[key(*instance)] = d;
  return r;
}

VKAPI_ATTR void VKAPI_CALL DestroyInstance(VkInstance instance, const VkAllocationCallbacks* alloc) {
  const InstanceData d = instance_data(instance);
  {
    std::lock_guard lock(g_mu);
    g_instances.erase(key(instance));
  }
  if (d.destroy_instance) d.destroy_instance(instance, alloc);
}

// Whether the physical device offers VK_KHR_pipeline_executable_properties.
bool offers_stats(PFN_vkEnumerateDeviceExtensionProperties enumerate, VkPhysicalDevice phys) {
  uint32_t n = 0;
  if (!enumerate || enumerate(phys, nullptr, &n, nullptr) != VK_SUCCESS) return false;
  std::vector<VkExtensionProperties> ext(n);
  if (enumerate(phys, nullptr, &n, ext.data()) != VK_SUCCESS) return false;
  for (const auto& e : ext)
    if (std::strcmp(e.extensionName, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME) == 0) return true;
  return false;
}

VKAPI_ATTR VkResult VKAPI_CALL CreateDevice(VkPhysicalDevice phys, const VkDeviceCreateInfo* info,
                                            const VkAllocationCallbacks* alloc, VkDevice* device) {
  auto* link = const_cast<VkLayerDeviceCreateInfo*>(static_cast<const VkLayerDeviceCreateInfo*>(info->pNext));
  while (link && !(link->sType == VK_STRUCTURE_TYPE_LOADER_DEVICE_CREATE_INFO && link->function == VK_LAYER_LINK_INFO))
    link = const_cast<VkLayerDeviceCreateInfo*>(static_cast<const VkLayerDeviceCreateInfo*>(link->pNext));
  if (!link) return VK_ERROR_INITIALIZATION_FAILED;
  const PFN_vkGetInstanceProcAddr gipa = link->u.pLayerInfo->pfnNextGetInstanceProcAddr;
  const PFN_vkGetDeviceProcAddr gdpa = link->u.pLayerInfo->pfnNextGetDeviceProcAddr;
  link->u.pLayerInfo = link->u.pLayerInfo->pNext;
  PFN_vkEnumerateDeviceExtensionProperties enumerate = nullptr;  // any instance's (wgpu makes one)
  {
    std::lock_guard lock(g_mu);
    if (!g_instances.empty()) enumerate = g_instances.begin()->second.enumerate_device_extensions;
  }
  // The extension and its feature added to what the application asked for, where the driver has them.
  VkDeviceCreateInfo patched = *info;
  std::vector<const char*> names(info->ppEnabledExtensionNames,
                                 info->ppEnabledExtensionNames + info->enabledExtensionCount);
  VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR feature{
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR, nullptr, VK_TRUE};
  const bool stats = offers_stats(enumerate, phys);
  if (stats) {
    bool named = false;
    for (const char* n : names)
      named = named || std::strcmp(n, VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME) == 0;
    if (!named) names.push_back(VK_KHR_PIPELINE_EXECUTABLE_PROPERTIES_EXTENSION_NAME);
    patched.enabledExtensionCount = uint32_t(names.size());
    patched.ppEnabledExtensionNames = names.data();
    feature.pNext = const_cast<void*>(info->pNext);
    patched.pNext = &feature;
  }
  auto create = reinterpret_cast<PFN_vkCreateDevice>(gipa(VK_NULL_HANDLE, "vkCreateDevice"));
  const VkResult r = create(phys, &patched, alloc, device);
  if (r != VK_SUCCESS) return r;
  DeviceData d;
  d.next_gdpa = gdpa;
  d.create_shader_module = reinterpret_cast<PFN_vkCreateShaderModule>(gdpa(*device, "vkCreateShaderModule"));
  d.create_compute_pipelines =
      reinterpret_cast<PFN_vkCreateComputePipelines>(gdpa(*device, "vkCreateComputePipelines"));
  d.destroy_device = reinterpret_cast<PFN_vkDestroyDevice>(gdpa(*device, "vkDestroyDevice"));
  if (stats) {
    d.executable_properties = reinterpret_cast<PFN_vkGetPipelineExecutablePropertiesKHR>(
        gdpa(*device, "vkGetPipelineExecutablePropertiesKHR"));
    d.executable_statistics = reinterpret_cast<PFN_vkGetPipelineExecutableStatisticsKHR>(
        gdpa(*device, "vkGetPipelineExecutableStatisticsKHR"));
    d.internal_representations = reinterpret_cast<PFN_vkGetPipelineExecutableInternalRepresentationsKHR>(
        gdpa(*device, "vkGetPipelineExecutableInternalRepresentationsKHR"));
    d.stats = d.executable_properties && d.executable_statistics;
  }
  std::lock_guard lock(g_mu);
  g_devices[key(*device)] = d;
  return r;
}

DeviceData device_data(VkDevice device) {
  std::lock_guard lock(g_mu);
  return g_devices.at(key(device));
}

VKAPI_ATTR void VKAPI_CALL DestroyDevice(VkDevice device, const VkAllocationCallbacks* alloc) {
  const DeviceData d = device_data(device);
  {
    std::lock_guard lock(g_mu);
    g_devices.erase(key(device));
  }
  d.destroy_device(device, alloc);
}

VKAPI_ATTR VkResult VKAPI_CALL CreateShaderModule(VkDevice device, const VkShaderModuleCreateInfo* info,
                                                  const VkAllocationCallbacks* alloc, VkShaderModule* module) {
  const DeviceData d = device_data(device);
  const VkResult r = d.create_shader_module(device, info, alloc, module);
  if (r != VK_SUCCESS) return r;
  const int n = g_next_module++;
  std::ofstream(out_dir() + "/module-" + std::to_string(n) + ".spv", std::ios::binary)
      .write(reinterpret_cast<const char*>(info->pCode), std::streamsize(info->codeSize));
  std::lock_guard lock(g_mu);
  g_module_numbers[uint64_t(*module)] = n;
  return r;
}

std::string statistic_value(const VkPipelineExecutableStatisticKHR& s) {
  switch (s.format) {
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: return s.value.b32 ? "true" : "false";
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: return std::to_string(s.value.i64);
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: return std::to_string(s.value.u64);
    case VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: return std::to_string(s.value.f64);
    default: return "?";
  }
}

// One line per field, "key: value"; the statistics as "stat <name> = <value>  # <description>".
void write_pipeline(const DeviceData& d, VkDevice device, VkPipeline pipeline, const VkComputePipelineCreateInfo& ci) {
  int module = -1;
  {
    std::lock_guard lock(g_mu);
    if (auto it = g_module_numbers.find(uint64_t(ci.stage.module)); it != g_module_numbers.end()) module = it->second;
  }
  const int n = g_next_pipeline++;
  std::ofstream out(out_dir() + "/pipeline-" + std::to_string(n) + ".txt");
  out << "entry: " << (ci.stage.pName ? ci.stage.pName : "") << "\nmodule: module-" << module << ".spv\n";
  if (!d.stats) {
    out << "statistics: none (the driver has no VK_KHR_pipeline_executable_properties)\n";
    return;
  }
  VkPipelineInfoKHR pi{VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR, nullptr, pipeline};
  uint32_t count = 0;
  d.executable_properties(device, &pi, &count, nullptr);
  std::vector props(count,
                    typed<VkPipelineExecutablePropertiesKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_PROPERTIES_KHR));
  d.executable_properties(device, &pi, &count, props.data());
  for (uint32_t e = 0; e < count; ++e) {
    out << "executable: " << props[e].name << " | " << props[e].description << " | subgroup size "
        << props[e].subgroupSize << "\n";
    VkPipelineExecutableInfoKHR ei{VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, nullptr, pipeline, e};
    uint32_t ns = 0;
    d.executable_statistics(device, &ei, &ns, nullptr);
    std::vector stats(ns, typed<VkPipelineExecutableStatisticKHR>(VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR));
    d.executable_statistics(device, &ei, &ns, stats.data());
    for (const auto& s : stats)
      out << "stat " << s.name << " = " << statistic_value(s) << "  # " << s.description << "\n";
    if (!d.internal_representations) continue;
    uint32_t nr = 0;
    d.internal_representations(device, &ei, &nr, nullptr);
    std::vector reps(nr, typed<VkPipelineExecutableInternalRepresentationKHR>(
                             VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR));
    d.internal_representations(device, &ei, &nr, reps.data());
    std::vector<std::vector<char>> text(nr);
    for (uint32_t i = 0; i < nr; ++i) {
      text[i].resize(reps[i].dataSize);
      reps[i].pData = text[i].data();
    }
    d.internal_representations(device, &ei, &nr, reps.data());
    for (uint32_t i = 0; i < nr; ++i) {
      const std::string name = out_dir() + "/pipeline-" + std::to_string(n) + "." + std::to_string(e) + "." +
                               std::to_string(i) + (reps[i].isText ? ".txt" : ".bin");
      std::ofstream(name, std::ios::binary).write(text[i].data(), std::streamsize(text[i].size()));
      out << "representation: " << reps[i].name << " (" << reps[i].description << "): " << name << "\n";
    }
  }
}

VKAPI_ATTR VkResult VKAPI_CALL CreateComputePipelines(VkDevice device, VkPipelineCache cache, uint32_t count,
                                                      const VkComputePipelineCreateInfo* infos,
                                                      const VkAllocationCallbacks* alloc, VkPipeline* pipelines) {
  const DeviceData d = device_data(device);
  std::vector<VkComputePipelineCreateInfo> patched(infos, infos + count);
  if (d.stats)
    for (auto& ci : patched)
      ci.flags |=
          VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR | VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR;
  const VkResult r = d.create_compute_pipelines(device, cache, count, patched.data(), alloc, pipelines);
  if (r == VK_SUCCESS)
    for (uint32_t i = 0; i < count; ++i) write_pipeline(d, device, pipelines[i], patched[i]);
  return r;
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL GetDeviceProcAddr(VkDevice device, const char* name);

// The device-level functions this layer handles (nullptr: the next layer's).
PFN_vkVoidFunction own_device_function(const std::string& n) {
  if (n == "vkGetDeviceProcAddr") return reinterpret_cast<PFN_vkVoidFunction>(&GetDeviceProcAddr);
  if (n == "vkDestroyDevice") return reinterpret_cast<PFN_vkVoidFunction>(&DestroyDevice);
  if (n == "vkCreateShaderModule") return reinterpret_cast<PFN_vkVoidFunction>(&CreateShaderModule);
  if (n == "vkCreateComputePipelines") return reinterpret_cast<PFN_vkVoidFunction>(&CreateComputePipelines);
  return nullptr;
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL GetInstanceProcAddr(VkInstance instance, const char* name) {
  const std::string n = name;
  if (n == "vkGetInstanceProcAddr") return reinterpret_cast<PFN_vkVoidFunction>(&GetInstanceProcAddr);
  if (n == "vkCreateInstance") return reinterpret_cast<PFN_vkVoidFunction>(&CreateInstance);
  if (n == "vkDestroyInstance") return reinterpret_cast<PFN_vkVoidFunction>(&DestroyInstance);
  if (n == "vkCreateDevice") return reinterpret_cast<PFN_vkVoidFunction>(&CreateDevice);
  if (PFN_vkVoidFunction own = own_device_function(n)) return own;
  const PFN_vkGetInstanceProcAddr gipa = instance ? instance_data(instance).next_gipa : nullptr;
  return gipa ? gipa(instance, name) : nullptr;
}

VKAPI_ATTR PFN_vkVoidFunction VKAPI_CALL GetDeviceProcAddr(VkDevice device, const char* name) {
  if (PFN_vkVoidFunction own = own_device_function(name)) return own;
  PFN_vkGetDeviceProcAddr gdpa = nullptr;
  {
    std::lock_guard lock(g_mu);
    if (auto it = g_devices.find(key(device)); it != g_devices.end()) gdpa = it->second.next_gdpa;
  }
  return gdpa ? gdpa(device, name) : nullptr;
}

}  // namespace

// The one symbol the library exports (the loader's interface 2): vkGetInstanceProcAddr and vkGetDeviceProcAddr are
// handed over here, not exported, so that no other layer's calls to its own of those names resolve to ours.
extern "C" {

__attribute__((visibility("default"))) VKAPI_ATTR VkResult VKAPI_CALL
vkNegotiateLoaderLayerInterfaceVersion(VkNegotiateLayerInterface* v) {
  if (v->loaderLayerInterfaceVersion < 2) return VK_ERROR_INITIALIZATION_FAILED;
  v->loaderLayerInterfaceVersion = 2;
  v->pfnGetInstanceProcAddr = &GetInstanceProcAddr;
  v->pfnGetDeviceProcAddr = &GetDeviceProcAddr;
  v->pfnGetPhysicalDeviceProcAddr = nullptr;
  return VK_SUCCESS;
}

}  // extern "C"
