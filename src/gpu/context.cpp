#include "gpu/context.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "gpu/profiler.h"
#include "gpu/shader_expand.h"
#include "gpu/shaders.h"
#include "wgllm/error.h"

namespace wgllm::gpu {

namespace {

std::string str(WGPUStringView v) {
  if (!v.data) return {};
  return v.length == WGPU_STRLEN ? std::string(v.data) : std::string(v.data, v.length);
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

const char* backend_name(WGPUBackendType b) {
  switch (b) {
    case WGPUBackendType_Vulkan: return "Vulkan";
    case WGPUBackendType_OpenGL: return "OpenGL";
    case WGPUBackendType_OpenGLES: return "OpenGLES";
    case WGPUBackendType_Metal: return "Metal";
    case WGPUBackendType_D3D12: return "D3D12";
    case WGPUBackendType_D3D11: return "D3D11";
    case WGPUBackendType_WebGPU: return "WebGPU";
    case WGPUBackendType_Null: return "Null";
    default: return "unknown";
  }
}

const char* adapter_type_name(WGPUAdapterType t) {
  switch (t) {
    case WGPUAdapterType_DiscreteGPU: return "discrete GPU";
    case WGPUAdapterType_IntegratedGPU: return "integrated GPU";
    case WGPUAdapterType_CPU: return "CPU";
    default: return "unknown";
  }
}

AdapterDesc describe(WGPUAdapter adapter, uint32_t index) {
  WGPUAdapterInfo info{};
  wgpuAdapterGetInfo(adapter, &info);
  AdapterDesc d;
  d.index = index;
  d.name = str(info.device);
  d.vendor = str(info.vendor);
  d.architecture = str(info.architecture);
  d.driver = str(info.description);
  d.backend = backend_name(info.backendType);
  d.type = adapter_type_name(info.adapterType);
  d.subgroup_min = info.subgroupMinSize;
  d.subgroup_max = info.subgroupMaxSize;
  wgpuAdapterInfoFreeMembers(info);
  return d;
}

// Higher is better: discrete > integrated > CPU > unknown, Vulkan before other backends.
int adapter_rank(const AdapterDesc& d) {
  int r = d.type == "discrete GPU" ? 40 : d.type == "integrated GPU" ? 30 : d.type == "CPU" ? 20 : 10;
  return r + (d.backend == "Vulkan" ? 1 : 0);
}

constexpr const char* kNoAdapterHelp =
    "no usable GPU adapter found: install a Vulkan driver (on a machine without a GPU, Mesa lavapipe: "
    "scripts/setup.sh installs mesa-vulkan-drivers from bookworm-backports)";

// Drives callbacks registered with AllowProcessEvents until `done` (bounded, never hangs forever).
template <typename Pred>
void process_until(WGPUInstance instance, WGPUDevice device, Pred done, const char* what,
                   const uint64_t* submission = nullptr) {
  for (int i = 0; i < 1000000 && !done(); ++i) {
    if (device) native::poll_wait(device, submission);
    wgpuInstanceProcessEvents(instance);
  }
  if (!done()) throw GpuError(std::string("timed out waiting for ") + what);
}

// Pops the innermost error scope and waits for its verdict: "" or the error message.
std::string pop_error_scope(WGPUInstance instance, WGPUDevice device, const char* what) {
  struct Popped {
    bool done = false;
    std::string error;
  } popped;
  WGPUPopErrorScopeCallbackInfo cb{};
  cb.mode = WGPUCallbackMode_AllowProcessEvents;
  cb.callback = [](WGPUPopErrorScopeStatus, WGPUErrorType type, WGPUStringView msg, void* p, void*) {
    auto* r = static_cast<Popped*>(p);
    r->done = true;
    if (type != WGPUErrorType_NoError) r->error = str(msg);
  };
  cb.userdata1 = &popped;
  wgpuDevicePopErrorScope(device, cb);
  process_until(instance, nullptr, [&] { return popped.done; }, what);
  return popped.error;
}

// naga reports positions as "wgsl:LINE:COL"; rewrite them as "file.wgsl:LINE:COL" in the
// file's own numbering (the prelude shifts lines).
// A pipeline's WGSL: "a.wgsl+b.wgsl" names files compiled as one module, in that order.
struct ShaderFiles {
  std::string text;
  std::vector<std::pair<std::string, int>> files;  // name, lines
};
// Kernel development aid: with WGLLM_KERNEL_DIR set, a file of that name there replaces the
// embedded source (edit a kernel and rerun without rebuilding). Empty when there is none.
std::string kernel_override(const std::string& name) {
  const char* dir = std::getenv("WGLLM_KERNEL_DIR");
  if (!dir || !*dir) return {};
  std::ifstream in(std::string(dir) + "/" + name);
  if (!in) return {};
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ShaderFiles shader_files(const std::string& names) {
  ShaderFiles out;
  size_t pos = 0;
  while (pos <= names.size()) {
    const size_t plus = std::min(names.find('+', pos), names.size());
    const std::string name = names.substr(pos, plus - pos);
    std::string src = kernel_override(name);
    if (src.empty()) src = std::string(shader_source(name));
    if (!src.empty() && src.back() != '\n') src += '\n';
    out.files.emplace_back(name, int(std::count(src.begin(), src.end(), '\n')));
    out.text += src;
    pos = plus + 1;
  }
  return out;
}

// "file:line:col: message" from a naga diagnostic on the module made of `files` after `prelude_lines`.
std::string shader_message(const std::string& message, const std::vector<std::pair<std::string, int>>& files,
                           int prelude_lines) {
  std::string where;
  for (const auto& f : files) where += (where.empty() ? "" : "+") + f.first;
  // The first "wgsl:<digits>:<digits>" in the message.
  for (size_t at = message.find("wgsl:"); at != std::string::npos; at = message.find("wgsl:", at + 1)) {
    unsigned line = 0, col = 0;
    int used = 0;
    if (std::sscanf(message.c_str() + at, "wgsl:%u:%u%n", &line, &col, &used) == 2 && used > 0) {
      int l = int(line) - prelude_lines;
      std::string file = files.front().first;
      for (const auto& f : files) {
        file = f.first;
        if (l <= f.second || &f == &files.back()) break;
        l -= f.second;
      }
      where = file + ":" + std::to_string(l) + ":" + std::to_string(col);
      break;
    }
  }
  // Keep the whole diagnostic (naga's own explanation spans several lines) on one line.
  std::string flat;
  for (char c : message) flat += (c == '\n') ? ' ' : c;
  flat.erase(std::unique(flat.begin(), flat.end(), [](char a, char b) { return a == ' ' && b == ' '; }),
             flat.end());
  return where + ": " + flat;
}

}  // namespace

struct Context::ErrorSink {
  std::mutex mutex;
  std::string first;  // first uncaptured error since the last check
  bool lost = false;
  void record(const std::string& msg) {
    std::lock_guard lock(mutex);
    if (first.empty()) first = msg;
  }
};

std::string PipelineKey::to_string() const {
  std::ostringstream s;
  s << shader << ":" << entry_point;
  if (!overrides.empty()) {
    s << "{";
    for (size_t i = 0; i < overrides.size(); ++i) s << (i ? "," : "") << overrides[i].first << "=" << overrides[i].second;
    s << "}";
  }
  if (!prelude.empty()) s << "[" << std::hash<std::string>{}(prelude) << "]";
  return s.str();
}

FoldedGrid fold_grid(uint64_t n, uint32_t max_per_dim) {
  if (n == 0) return {0, 1};
  if (n <= max_per_dim) return {static_cast<uint32_t>(n), 1};
  const uint64_t y = (n + max_per_dim - 1) / max_per_dim;
  if (y > max_per_dim) throw InvalidArgument("grid of " + std::to_string(n) + " workgroups exceeds the adapter's " +
                                             std::to_string(max_per_dim) + "^2 limit");
  const uint64_t x = (n + y - 1) / y;
  return {static_cast<uint32_t>(x), static_cast<uint32_t>(y)};
}

std::vector<AdapterDesc> Context::list_adapters(std::string_view backend) {
  InstanceHandle instance(native::create_instance(backend));
  if (!instance) throw GpuError("could not create a WebGPU instance (wgpu-native)");
  std::vector<AdapterDesc> out;
  auto adapters = native::enumerate_adapters(instance.get());
  for (uint32_t i = 0; i < adapters.size(); ++i) out.push_back(describe(adapters[i].get(), i));
  return out;
}

Context::Context(const ContextOptions& options) : options_(options), errors_(std::make_unique<ErrorSink>()) {
  instance_.reset(native::create_instance(options.backend));
  if (!instance_) throw GpuError("could not create a WebGPU instance (wgpu-native)");

  auto adapters = native::enumerate_adapters(instance_.get());
  if (adapters.empty()) throw GpuError(kNoAdapterHelp);
  std::vector<AdapterDesc> descs;
  for (uint32_t i = 0; i < adapters.size(); ++i) descs.push_back(describe(adapters[i].get(), i));

  int chosen = -1;
  const std::string& want = options.adapter;
  if (want.empty()) {
    for (size_t i = 0; i < descs.size(); ++i)
      if (chosen < 0 || adapter_rank(descs[i]) > adapter_rank(descs[chosen])) chosen = static_cast<int>(i);
  } else if (std::all_of(want.begin(), want.end(), ::isdigit)) {
    const unsigned long idx = std::stoul(want);
    if (idx >= descs.size())
      throw GpuError("--adapter " + want + ": only " + std::to_string(descs.size()) +
                     " adapter(s) present (see `wgllm info --list`)");
    chosen = static_cast<int>(idx);
  } else {
    for (size_t i = 0; i < descs.size(); ++i)
      if (lower(descs[i].name).find(lower(want)) != std::string::npos &&
          (chosen < 0 || adapter_rank(descs[i]) > adapter_rank(descs[chosen])))
        chosen = static_cast<int>(i);
    if (chosen < 0) throw GpuError("--adapter '" + want + "': no adapter name contains it (see `wgllm info --list`)");
  }
  adapter_ = std::move(adapters[chosen]);
  adapter_desc_ = descs[chosen];

  // Ask for the adapter's own maxima (the WebGPU defaults cap a binding at 128 MiB).
  WGPULimits adapter_limits{};
  if (wgpuAdapterGetLimits(adapter_.get(), &adapter_limits) != WGPUStatus_Success)
    throw GpuError("could not read the limits of adapter '" + adapter_desc_.name + "'");
  std::vector<WGPUFeatureName> wanted;
  auto want_feature = [&](WGPUFeatureName f, bool disabled, bool& flag) {
    if (!disabled && wgpuAdapterHasFeature(adapter_.get(), f)) {
      wanted.push_back(f);
      flag = true;
    }
  };
  want_feature(WGPUFeatureName_ShaderF16, options.disable_f16, features_.shader_f16);
  if (const WGPUFeatureName sg = native::subgroup_feature(adapter_.get());
      sg != WGPUFeatureName_Force32 && !options.disable_subgroups) {
    wanted.push_back(sg);
    features_.subgroups = true;
  }
  want_feature(WGPUFeatureName_TimestampQuery, false, features_.timestamp_query);

  WGPUDeviceDescriptor desc{};
  desc.label = sv("wgllm");
  desc.requiredFeatureCount = wanted.size();
  desc.requiredFeatures = wanted.data();
  desc.requiredLimits = &adapter_limits;
  desc.defaultQueue.label = sv("wgllm queue");
  desc.deviceLostCallbackInfo.mode = WGPUCallbackMode_AllowProcessEvents;
  desc.deviceLostCallbackInfo.callback = [](WGPUDevice const*, WGPUDeviceLostReason reason, WGPUStringView msg,
                                            void* sink, void*) {
    if (reason == WGPUDeviceLostReason_Destroyed || reason == WGPUDeviceLostReason_CallbackCancelled) return;
    auto* s = static_cast<ErrorSink*>(sink);
    s->record("GPU device lost: " + str(msg));
    s->lost = true;
  };
  desc.deviceLostCallbackInfo.userdata1 = errors_.get();
  desc.uncapturedErrorCallbackInfo.callback = [](WGPUDevice const*, WGPUErrorType type, WGPUStringView msg,
                                                 void* sink, void*) {
    const char* kind = type == WGPUErrorType_OutOfMemory ? "GPU out of memory" : "GPU error";
    static_cast<ErrorSink*>(sink)->record(std::string(kind) + ": " + str(msg));
  };
  desc.uncapturedErrorCallbackInfo.userdata1 = errors_.get();

  struct Result {
    bool done = false;
    WGPUDevice device = nullptr;
    std::string message;
  } result;
  WGPURequestDeviceCallbackInfo cb{};
  cb.mode = WGPUCallbackMode_AllowProcessEvents;
  cb.callback = [](WGPURequestDeviceStatus status, WGPUDevice device, WGPUStringView msg, void* r, void*) {
    auto* res = static_cast<Result*>(r);
    res->done = true;
    if (status == WGPURequestDeviceStatus_Success) res->device = device;
    else res->message = str(msg);
  };
  cb.userdata1 = &result;
  wgpuAdapterRequestDevice(adapter_.get(), &desc, cb);
  process_until(instance_.get(), nullptr, [&] { return result.done; }, "the GPU device");
  if (!result.device)
    throw GpuError("could not create a device on '" + adapter_desc_.name + "': " + result.message);
  device_.reset(result.device);
  queue_.reset(wgpuDeviceGetQueue(device_.get()));
  if (wgpuDeviceGetLimits(device_.get(), &limits_) != WGPUStatus_Success)
    throw GpuError("could not read the device limits of '" + adapter_desc_.name + "'");
}

Context::~Context() {
  layouts_.clear();
  pipelines_.clear();
  placeholder_ = {};
  placeholder_writable_ = {};
  queue_.reset();
  if (device_) {
    native::poll_wait(device_.get());
    device_.reset();
  }
}

const Buffer& Context::placeholder_storage() {
  if (!placeholder_.handle) placeholder_ = create_buffer(16, WGPUBufferUsage_Storage, "placeholder");
  return placeholder_;
}

const Buffer& Context::placeholder_writable() {
  if (!placeholder_writable_.handle) placeholder_writable_ = create_buffer(16, WGPUBufferUsage_Storage, "placeholder (rw)");
  return placeholder_writable_;
}

uint64_t Context::max_binding_size() const {
  return std::min<uint64_t>(limits_.maxStorageBufferBindingSize, limits_.maxBufferSize) & ~uint64_t(3);
}

void Context::check_errors() {
  wgpuInstanceProcessEvents(instance_.get());
  std::string msg;
  {
    std::lock_guard lock(errors_->mutex);
    msg = std::exchange(errors_->first, {});
  }
  if (!msg.empty()) {
    std::replace(msg.begin(), msg.end(), '\n', ' ');
    throw GpuError(msg);
  }
}

Buffer Context::create_buffer(uint64_t size, WGPUBufferUsage usage, std::string_view label) {
  if (size == 0) throw InvalidArgument("buffer '" + std::string(label) + "': size 0");
  if (size > limits_.maxBufferSize)
    throw GpuError("buffer '" + std::string(label) + "' of " + std::to_string(size) +
                   " bytes exceeds the adapter's maxBufferSize (" + std::to_string(limits_.maxBufferSize) + ")");
  WGPUBufferDescriptor d{};
  d.label = sv(label);
  d.size = (size + 3) & ~uint64_t(3);
  d.usage = usage | WGPUBufferUsage_CopyDst | WGPUBufferUsage_CopySrc;
  if (usage & WGPUBufferUsage_MapRead) d.usage = usage | WGPUBufferUsage_CopyDst;
  wgpuDevicePushErrorScope(device_.get(), WGPUErrorFilter_OutOfMemory);
  Buffer b{BufferHandle(wgpuDeviceCreateBuffer(device_.get(), &d)), size};
  const std::string error = pop_error_scope(instance_.get(), device_.get(), "buffer creation");
  if (!error.empty() || !b.handle)
    throw GpuError("out of GPU memory allocating buffer '" + std::string(label) + "' (" + std::to_string(size) +
                   " bytes): " + error);
  return b;
}

void Context::write_buffer(const Buffer& buf, uint64_t offset, const void* data, uint64_t size) {
  if (offset + size > buf.size || offset + size < offset)
    throw InvalidArgument("write of " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                          " past the end of a " + std::to_string(buf.size) + "-byte buffer");
  if (size == 0) return;
  const auto* bytes = static_cast<const uint8_t*>(data);
  // queue writes need 4-byte aligned offsets and sizes: patch unaligned edges through a readback.
  const uint64_t begin = offset & ~uint64_t(3), end = (offset + size + 3) & ~uint64_t(3);
  if (begin == offset && end == offset + size) {
    wgpuQueueWriteBuffer(queue_.get(), buf.get(), offset, bytes, size);
  } else {
    std::vector<uint8_t> staged(end - begin);
    const uint64_t readable = std::min<uint64_t>(end, buf.size) - begin;
    read_buffer(buf, begin, staged.data(), readable);
    std::memcpy(staged.data() + (offset - begin), bytes, size);
    wgpuQueueWriteBuffer(queue_.get(), buf.get(), begin, staged.data(), staged.size());
  }
  check_errors();
}

void Context::read_buffer(const Buffer& buf, uint64_t offset, void* dst, uint64_t size) {
  if (offset + size > buf.size || offset + size < offset)
    throw InvalidArgument("read of " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                          " past the end of a " + std::to_string(buf.size) + "-byte buffer");
  if (size == 0) return;
  constexpr uint64_t kChunk = 64ull << 20;  // staging piece: bounded host-visible memory
  const uint64_t begin = offset & ~uint64_t(3), end = (offset + size + 3) & ~uint64_t(3);
  Buffer staging = create_buffer(std::min(kChunk, end - begin), WGPUBufferUsage_MapRead, "readback staging");
  auto* out = static_cast<uint8_t*>(dst);
  for (uint64_t pos = begin; pos < end; pos += kChunk) {
    const uint64_t n = std::min(kChunk, end - pos);
    WGPUCommandEncoderDescriptor ed{};
    CommandEncoderHandle enc(wgpuDeviceCreateCommandEncoder(device_.get(), &ed));
    wgpuCommandEncoderCopyBufferToBuffer(enc.get(), buf.get(), pos, staging.get(), 0, n);
    WGPUCommandBufferDescriptor cd{};
    CommandBufferHandle cmd(wgpuCommandEncoderFinish(enc.get(), &cd));
    submit(cmd.get());
    // Copy the part of [pos, pos+n) that lies inside the requested [offset, offset+size).
    const uint64_t lo = std::max(pos, offset), hi = std::min(pos + n, offset + size);
    read_mapped(staging, lo - pos, out + (lo - offset), hi - lo);
  }
}

void Context::read_mapped(const Buffer& staging, uint64_t offset, void* dst, uint64_t size,
                          std::optional<SubmissionIndex> after) {
  if (offset + size > staging.size || offset + size < offset)
    throw InvalidArgument("mapped read of " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                          " past the end of a " + std::to_string(staging.size) + "-byte buffer");
  if (size == 0) return;
  // Map whole 4-byte words covering the range (mapAsync wants offsets of 8 and sizes of 4).
  const uint64_t begin = offset & ~uint64_t(7), end = std::min((offset + size + 3) & ~uint64_t(3), staging.size);
  struct Mapped {
    bool done = false;
    WGPUMapAsyncStatus status{};
    std::string message;
  } mapped;
  WGPUBufferMapCallbackInfo cb{};
  cb.mode = WGPUCallbackMode_AllowProcessEvents;
  cb.callback = [](WGPUMapAsyncStatus status, WGPUStringView msg, void* p, void*) {
    auto* m = static_cast<Mapped*>(p);
    m->done = true;
    m->status = status;
    m->message = str(msg);
  };
  cb.userdata1 = &mapped;
  wgpuBufferMapAsync(staging.get(), WGPUMapMode_Read, begin, end - begin, cb);
  process_until(instance_.get(), device_.get(), [&] { return mapped.done; }, "a buffer readback",
                after ? &*after : nullptr);
  check_errors();
  if (mapped.status != WGPUMapAsyncStatus_Success) throw GpuError("buffer readback failed: " + mapped.message);
  const auto* src = static_cast<const uint8_t*>(wgpuBufferGetConstMappedRange(staging.get(), begin, end - begin));
  std::memcpy(dst, src + (offset - begin), size);
  wgpuBufferUnmap(staging.get());
}

WGPUComputePipeline Context::pipeline(const PipelineKey& key) {
  const std::string name = key.to_string();
  std::lock_guard lock(pipelines_mutex_);
  if (auto it = pipelines_.find(name); it != pipelines_.end()) return it->second.get();

  const ShaderFiles source = shader_files(key.shader);
  const std::string code = key.prelude + expand_shader(source.text, key.prelude, adapter_desc_.type != "CPU");
  if (const char* dir = std::getenv("WGLLM_DUMP_SHADERS")) {  // debugging aid: the exact WGSL compiled
    std::ofstream(std::string(dir) + "/" + name.substr(0, name.find('[')) + "." +
                  std::to_string(std::hash<std::string>{}(key.prelude)) + ".wgsl")
        << code;
  }
  const int prelude_lines = static_cast<int>(std::count(key.prelude.begin(), key.prelude.end(), '\n'));
  wgpuDevicePushErrorScope(device_.get(), WGPUErrorFilter_Validation);
  WGPUShaderSourceWGSL wgsl{};
  wgsl.chain.sType = WGPUSType_ShaderSourceWGSL;
  wgsl.code = sv(code);
  WGPUShaderModuleDescriptor md{};
  md.nextInChain = &wgsl.chain;
  md.label = sv(key.shader);
  ShaderModuleHandle module(wgpuDeviceCreateShaderModule(device_.get(), &md));

  std::vector<WGPUConstantEntry> constants;
  for (const auto& [k, v] : key.overrides) {
    WGPUConstantEntry c{};
    c.key = sv(k);
    c.value = v;
    constants.push_back(c);
  }
  WGPUComputePipelineDescriptor pd{};
  pd.label = sv(name);
  pd.compute.module = module.get();
  pd.compute.entryPoint = sv(key.entry_point);
  pd.compute.constantCount = constants.size();
  pd.compute.constants = constants.data();
  ComputePipelineHandle pipe(wgpuDeviceCreateComputePipeline(device_.get(), &pd));

  const std::string error = pop_error_scope(instance_.get(), device_.get(), "shader compilation");
  if (!error.empty()) throw ShaderError(shader_message(error, source.files, prelude_lines));
  if (!pipe) throw ShaderError(key.shader + ": pipeline creation failed for entry point " + key.entry_point);
  WGPUComputePipeline raw = pipe.get();
  pipelines_.emplace(name, std::move(pipe));
  pipeline_names_.emplace(raw, key.shader + ":" + key.entry_point);
  return raw;
}

std::string Context::pipeline_name(WGPUComputePipeline pipeline) {
  std::lock_guard lock(pipelines_mutex_);
  const auto it = pipeline_names_.find(pipeline);
  return it == pipeline_names_.end() ? "?" : it->second;
}

BindGroupHandle Context::bind_group(WGPUComputePipeline pipeline, std::span<const BufferBinding> bindings,
                                    std::string_view label) {
  std::vector<WGPUBindGroupEntry> entries;
  for (const auto& b : bindings) {
    WGPUBindGroupEntry e{};
    e.binding = b.binding;
    e.buffer = b.buffer->get();
    e.offset = b.offset;
    e.size = b.size ? b.size : ((b.buffer->size + 3) & ~uint64_t(3)) - b.offset;
    if (e.size > max_binding_size() && !(b.binding == 0 && e.size <= limits_.maxUniformBufferBindingSize))
      throw InvalidArgument("binding " + std::to_string(b.binding) + " of " + std::string(label) + " covers " +
                            std::to_string(e.size) + " bytes, over the adapter's storage-binding limit of " +
                            std::to_string(max_binding_size()));
    entries.push_back(e);
  }
  WGPUBindGroupLayout layout;
  {
    std::lock_guard lock(pipelines_mutex_);
    auto it = layouts_.find(pipeline);
    if (it == layouts_.end())
      it = layouts_.emplace(pipeline, BindGroupLayoutHandle(wgpuComputePipelineGetBindGroupLayout(pipeline, 0))).first;
    layout = it->second.get();
  }
  WGPUBindGroupDescriptor d{};
  d.label = sv(label);
  d.layout = layout;
  d.entryCount = entries.size();
  d.entries = entries.data();
  return BindGroupHandle(wgpuDeviceCreateBindGroup(device_.get(), &d));
}

SubmissionIndex Context::submit(WGPUCommandBuffer commands) {
  const SubmissionIndex index = native::submit(queue_.get(), commands);
  check_errors();
  return index;
}

void Context::submit_and_wait(WGPUCommandBuffer commands) {
  submit(commands);
  wait_idle();
}

void Context::wait_idle() {
  native::poll_wait(device_.get());
  check_errors();
}

void Context::wait_until(const std::function<bool()>& done, const char* what) {
  process_until(instance_.get(), device_.get(), done, what);
}

// ---------------------------------------------------------------- ComputeBatch

const Buffer& BindCache::arena(size_t index, uint64_t size) {
  while (arenas_.size() <= index) arenas_.push_back(ctx_.create_buffer(size, WGPUBufferUsage_Uniform, "params (cached)"));
  return arenas_[index];
}

WGPUBindGroup BindCache::group(WGPUComputePipeline pipeline, std::span<const BufferBinding> bindings,
                               std::string_view label) {
  std::vector<uint64_t> key = {reinterpret_cast<uint64_t>(pipeline)};
  for (const auto& b : bindings)
    key.insert(key.end(), {b.binding, reinterpret_cast<uint64_t>(b.buffer->get()), b.offset, b.size});
  if (auto it = groups_.find(key); it != groups_.end()) return it->second.get();
  if (groups_.size() >= kMaxGroups) groups_.clear();
  ++misses_;
  return groups_.emplace(std::move(key), ctx_.bind_group(pipeline, bindings, label)).first->second.get();
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

const Buffer& ComputeBatch::scratch(uint64_t size) {
  owned_buffers_.push_back(ctx_.create_buffer(size, WGPUBufferUsage_Storage, label_ + " scratch"));
  return owned_buffers_.back();
}

void ComputeBatch::copy(const Buffer& src, uint64_t src_offset, const Buffer& dst, uint64_t dst_offset,
                        uint64_t size) {
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
