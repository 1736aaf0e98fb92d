#include "gpu/profiler.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

#include "wgllm/error.h"

namespace wgllm::gpu {

struct Profiler::Chunk {
  QuerySetHandle set;  // kQueriesPerChunk timestamps: dispatch i writes 2i (beginning) and 2i + 1 (end)
  Buffer resolve;      // QueryResolve: the resolved u64 ticks
  Buffer readback;     // MapRead copy of resolve
  std::vector<std::pair<WGPUComputePipeline, uint64_t>> dispatches;  // pipeline, workgroups
};

Profiler::Profiler(Context& ctx) : ctx_(ctx) {
  if (!ctx.features().timestamp_query)
    throw GpuError("GPU profiling needs the timestamp-query feature, which adapter '" + ctx.adapter().name + "' lacks");
  period_ns_ = native::timestamp_period(ctx.queue());
}

Profiler::~Profiler() {
  if (ctx_.profiler() == this) ctx_.set_profiler(nullptr);
}

Profiler::Chunk* Profiler::take_chunk() {
  if (!free_.empty()) {
    Chunk* c = free_.back();
    free_.pop_back();
    return c;
  }
  auto c = std::make_unique<Chunk>();
  WGPUQuerySetDescriptor d{};
  d.label = sv("wgllm timestamps");
  d.type = WGPUQueryType_Timestamp;
  d.count = kQueriesPerChunk;
  c->set.reset(wgpuDeviceCreateQuerySet(ctx_.device(), &d));
  if (!c->set) throw GpuError("could not create a timestamp query set");
  c->resolve =
      ctx_.create_buffer(kQueriesPerChunk * sizeof(uint64_t), WGPUBufferUsage_QueryResolve, "timestamps resolve");
  c->readback = ctx_.create_buffer(kQueriesPerChunk * sizeof(uint64_t), WGPUBufferUsage_MapRead, "timestamps readback");
  chunks_.push_back(std::move(c));
  return chunks_.back().get();
}

WGPUPassTimestampWrites Profiler::add_dispatch(ProfiledBatch& batch, WGPUComputePipeline pipeline,
                                               uint64_t workgroups) {
  if (batch.chunks.empty() || batch.chunks.back()->dispatches.size() * 2 == kQueriesPerChunk)
    batch.chunks.push_back(take_chunk());
  Chunk& c = *batch.chunks.back();
  const auto first = static_cast<uint32_t>(c.dispatches.size() * 2);
  c.dispatches.emplace_back(pipeline, workgroups);
  WGPUPassTimestampWrites w{};
  w.querySet = c.set.get();
  w.beginningOfPassWriteIndex = first;
  w.endOfPassWriteIndex = first + 1;
  return w;
}

void Profiler::resolve(ProfiledBatch& batch, WGPUCommandEncoder encoder) {
  for (Chunk* c : batch.chunks) {
    const auto n = static_cast<uint32_t>(c->dispatches.size() * 2);
    wgpuCommandEncoderResolveQuerySet(encoder, c->set.get(), 0, n, c->resolve.get(), 0);
    wgpuCommandEncoderCopyBufferToBuffer(encoder, c->resolve.get(), 0, c->readback.get(), 0, n * sizeof(uint64_t));
  }
}

void Profiler::submitted(ProfiledBatch& batch) {
  if (!batch.chunks.empty()) pending_.push_back(std::exchange(batch.chunks, {}));
}

void Profiler::release(ProfiledBatch& batch) {
  for (Chunk* c : batch.chunks) {
    c->dispatches.clear();
    free_.push_back(c);
  }
  batch.chunks.clear();
}

void Profiler::collect() {
  if (pending_.empty()) return;
  std::vector<std::vector<Chunk*>> batches = std::exchange(pending_, {});
  constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
  uint64_t window_first = kNone, window_last = 0;
  std::vector<uint64_t> t;
  for (const auto& b : batches) {
    uint64_t first = kNone, last = 0;
    for (Chunk* c : b) {
      t.resize(c->dispatches.size() * 2);
      ctx_.read_mapped(c->readback, 0, t.data(), t.size() * sizeof(uint64_t));  // waits for the batch
      for (size_t i = 0; i < c->dispatches.size(); ++i) {
        const uint64_t begin = t[2 * i], end = t[2 * i + 1];
        // Signed: a GPU whose end-of-pass tick precedes its beginning shows as a negative time, not a huge one.
        const double ns = double(int64_t(end - begin)) * period_ns_;
        KernelTime& row = rows_[c->dispatches[i]];
        row.workgroups = c->dispatches[i].second;
        row.calls += 1;
        row.ns += ns;
        totals_.kernel_ns += ns;
        totals_.dispatches += 1;
        first = std::min(first, begin);
        last = std::max(last, end);
      }
      c->dispatches.clear();
      free_.push_back(c);
    }
    if (first == kNone) continue;
    totals_.batches += 1;
    totals_.batch_span_ns += double(int64_t(last - first)) * period_ns_;
    window_first = std::min(window_first, first);
    window_last = std::max(window_last, last);
  }
  if (window_first == kNone) return;
  totals_.windows += 1;
  totals_.window_span_ns += double(int64_t(window_last - window_first)) * period_ns_;
}

ProfileReport Profiler::report() const {
  ProfileReport r = totals_;
  // Pipelines of different variants may share a short name and detail: merge their rows.
  std::map<std::tuple<std::string, std::string, uint64_t>, KernelTime> merged;
  for (const auto& [key, row] : rows_) {
    const std::string name = ctx_.pipeline_name(key.first), detail = ctx_.pipeline_detail(key.first);
    KernelTime& k = merged[{name, detail, row.workgroups}];
    k.name = name;
    k.detail = detail;
    k.workgroups = row.workgroups;
    k.calls += row.calls;
    k.ns += row.ns;
  }
  for (auto& [key, k] : merged) r.kernels.push_back(std::move(k));
  std::stable_sort(r.kernels.begin(), r.kernels.end(),
                   [](const KernelTime& a, const KernelTime& b) { return a.ns > b.ns; });
  return r;
}

void Profiler::reset() {
  rows_.clear();
  totals_ = {};
}

}  // namespace wgllm::gpu
