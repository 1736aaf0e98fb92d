#include "gpu/context.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>

#include "gpu/batch.h"
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

AdapterType adapter_type(WGPUAdapterType t) {
  switch (t) {
    case WGPUAdapterType_DiscreteGPU: return AdapterType::DiscreteGpu;
    case WGPUAdapterType_IntegratedGPU: return AdapterType::IntegratedGpu;
    case WGPUAdapterType_CPU: return AdapterType::Cpu;
    default: return AdapterType::Unknown;
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
  d.type = adapter_type(info.adapterType);
  d.subgroup_min = info.subgroupMinSize;
  d.subgroup_max = info.subgroupMaxSize;
  wgpuAdapterInfoFreeMembers(info);
  return d;
}

// Higher is better: discrete > integrated > CPU > unknown, Vulkan before other backends.
int adapter_rank(const AdapterDesc& d) {
  int r = d.type == AdapterType::DiscreteGpu     ? 40
          : d.type == AdapterType::IntegratedGpu ? 30
          : d.type == AdapterType::Cpu           ? 20
                                                 : 10;
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
std::string pop_scope(WGPUInstance instance, WGPUDevice device, const char* what) {
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
  process_until(
      instance, nullptr, [&] { return popped.done; }, what);
  return popped.error;
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

const char* AdapterDesc::type_name() const {
  switch (type) {
    case AdapterType::DiscreteGpu: return "discrete GPU";
    case AdapterType::IntegratedGpu: return "integrated GPU";
    case AdapterType::Cpu: return "CPU";
    case AdapterType::Unknown: break;
  }
  return "unknown";
}

std::vector<AdapterDesc> Context::list_adapters(std::string_view backend) {
  InstanceHandle instance(native::create_instance(backend));
  if (!instance) throw GpuError("could not create a WebGPU instance (wgpu-native)");
  std::vector<AdapterDesc> out;
  auto adapters = native::enumerate_adapters(instance.get());
  for (uint32_t i = 0; i < adapters.size(); ++i) out.push_back(describe(adapters[i].get(), i));
  return out;
}

Context::Context(const ContextOptions& options)
    : options_(options), errors_(std::make_unique<ErrorSink>()), pipelines_(std::make_unique<PipelineCache>(*this)) {
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
  desc.uncapturedErrorCallbackInfo.callback = [](WGPUDevice const*, WGPUErrorType type, WGPUStringView msg, void* sink,
                                                 void*) {
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
    if (status == WGPURequestDeviceStatus_Success)
      res->device = device;
    else
      res->message = str(msg);
  };
  cb.userdata1 = &result;
  wgpuAdapterRequestDevice(adapter_.get(), &desc, cb);
  process_until(
      instance_.get(), nullptr, [&] { return result.done; }, "the GPU device");
  if (!result.device) throw GpuError("could not create a device on '" + adapter_desc_.name + "': " + result.message);
  device_.reset(result.device);
  queue_.reset(wgpuDeviceGetQueue(device_.get()));
  if (wgpuDeviceGetLimits(device_.get(), &limits_) != WGPUStatus_Success)
    throw GpuError("could not read the device limits of '" + adapter_desc_.name + "'");
}

Context::~Context() {
  pipelines_.reset();
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
  if (!placeholder_writable_.handle)
    placeholder_writable_ = create_buffer(16, WGPUBufferUsage_Storage, "placeholder (rw)");
  return placeholder_writable_;
}

const Buffer& Context::scratch(uint64_t bytes) {
  if (!scratch_.handle || scratch_.size < bytes)
    scratch_ = create_buffer(std::max<uint64_t>(bytes, scratch_.size * 2), WGPUBufferUsage_Storage, "scratch");
  return scratch_;
}

uint32_t Context::subgroup_size() {
  if (!features_.subgroups) return 0;
  if (adapter_desc_.subgroup_max && adapter_desc_.subgroup_min == adapter_desc_.subgroup_max)
    return adapter_desc_.subgroup_max;
  if (!subgroup_size_) {
    const Buffer out = create_buffer(64 * 4, WGPUBufferUsage_Storage, "subgroup sizes");
    ComputeBatch batch(*this, "subgroup size");
    const BufferBinding bindings[] = {{0, &out}};
    batch.dispatch(pipeline({"subgroup_size.wgsl", "subgroup_size", {}, ""}), bindings, 1);
    batch.submit_and_wait();
    const auto sizes = read<uint32_t>(out);
    subgroup_size_ = std::all_of(sizes.begin(), sizes.end(), [&](uint32_t v) { return v == sizes[0]; }) ? sizes[0] : 0;
  }
  return *subgroup_size_;
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
  const std::string error = pop_scope(instance_.get(), device_.get(), "buffer creation");
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
    // wgpu copies a queue write into a staging buffer that lives until the submission carrying it has finished and
    // the device is polled, and its allocator keeps the memory for reuse: the weights, written one after another
    // before any submission, would sit twice in memory for good (device memory on a CPU adapter; lavapipe,
    // Qwen2.5-0.5B shape Q8_0: 882 MiB after the load instead of 539). Once kWriteChunk bytes are queued they are
    // submitted and waited for, so the staging never holds more than a chunk.
    for (uint64_t at = 0; at < size; at += kWriteChunk) {
      const uint64_t n = std::min(kWriteChunk, size - at);
      wgpuQueueWriteBuffer(queue_.get(), buf.get(), offset + at, bytes + at, n);
      queued_write_bytes_ += n;
      if (queued_write_bytes_ >= kWriteChunk) flush_writes();
    }
  } else {
    std::vector<uint8_t> staged(end - begin);
    const uint64_t readable = std::min<uint64_t>(end, buf.size) - begin;
    read_buffer(buf, begin, staged.data(), readable);
    std::memcpy(staged.data() + (offset - begin), bytes, size);
    wgpuQueueWriteBuffer(queue_.get(), buf.get(), begin, staged.data(), staged.size());
  }
  check_errors();
}

void Context::flush_writes() {
  WGPUCommandEncoderDescriptor ed{};
  CommandEncoderHandle encoder(wgpuDeviceCreateCommandEncoder(device_.get(), &ed));
  WGPUCommandBufferDescriptor cd{};
  CommandBufferHandle commands(wgpuCommandEncoderFinish(encoder.get(), &cd));
  submit(commands.get());  // an empty submission carries the pending writes
  wait_idle();
  queued_write_bytes_ = 0;
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
  process_until(
      instance_.get(), device_.get(), [&] { return mapped.done; }, "a buffer readback", after ? &*after : nullptr);
  check_errors();
  if (mapped.status != WGPUMapAsyncStatus_Success) throw GpuError("buffer readback failed: " + mapped.message);
  const auto* src = static_cast<const uint8_t*>(wgpuBufferGetConstMappedRange(staging.get(), begin, end - begin));
  std::memcpy(dst, src + (offset - begin), size);
  wgpuBufferUnmap(staging.get());
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
  WGPUBindGroupDescriptor d{};
  d.label = sv(label);
  d.layout = pipelines_->layout(pipeline);
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

void Context::push_error_scope(WGPUErrorFilter filter) { wgpuDevicePushErrorScope(device_.get(), filter); }

std::string Context::pop_error_scope(const char* what) { return pop_scope(instance_.get(), device_.get(), what); }

}  // namespace wgllm::gpu
