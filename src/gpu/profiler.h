// GPU time of every dispatch, from timestamp queries: attach a Profiler to a Context and every ComputeBatch made
// afterwards puts each dispatch in its own compute pass whose beginning and end write a timestamp. At submit the
// batch resolves its queries into a buffer and copies them to a mappable one; collect() maps those once the GPU is
// done and adds each dispatch's time to its kernel's row.
//
//   gpu::Profiler profiler(ctx);   // throws GpuError when the adapter has no timestamp-query feature
//   ctx.set_profiler(&profiler);
//   ... encode and submit batches ...
//   profiler.collect();            // one window: the batches submitted since the last collect()
//   ctx.set_profiler(nullptr);
//   const gpu::ProfileReport r = profiler.report();
//
// A pass per dispatch is not the normal run: pass boundaries add synchronisation the normal run may not have, so
// the profile tells where kernel time goes, not exactly how long the normal run takes. Not thread-safe: a profiler's
// batches are made, submitted and collected on one thread.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpu/context.h"

namespace wgllm::gpu {

struct ProfiledBatch;

// One row: a kernel over one grid size (the same matvec over two weight shapes is two rows).
struct KernelTime {
  std::string name;         // pipeline short name, "elementwise.wgsl:add"
  std::string detail;       // its variant (PipelineKey::detail), e.g. a product's weight type and shape
  uint64_t workgroups = 0;  // x * y * z of the dispatch grid
  uint64_t calls = 0;
  double ns = 0;  // sum of its dispatches' GPU time (end-of-pass minus beginning-of-pass timestamps)
};

struct ProfileReport {
  std::vector<KernelTime> kernels;  // most time first
  double kernel_ns = 0;             // sum over every dispatch
  uint64_t dispatches = 0;
  uint64_t batches = 0;       // submitted batches read back
  double batch_span_ns = 0;   // sum over batches of (last end-of-pass - first beginning-of-pass)
  uint64_t windows = 0;       // collect() calls that found work
  double window_span_ns = 0;  // sum over windows of their batches' first to last timestamp
};

class Profiler {
 public:
  explicit Profiler(Context& ctx);
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Reads back every batch submitted since the last call (waiting for the GPU to finish them) and adds them to
  // the totals, as one window: its span runs from the earliest timestamp to the latest.
  void collect();
  ProfileReport report() const;
  // Forgets the totals (batches not yet collected stay pending).
  void reset();

  // ---- used by ComputeBatch
  struct Chunk;  // a query set with its resolve and readback buffers, and what each pair of queries timed
  // The timestamp writes of one more dispatch of `batch`.
  WGPUPassTimestampWrites add_dispatch(ProfiledBatch& batch, WGPUComputePipeline pipeline, uint64_t workgroups);
  // Encodes the resolve of the batch's queries and the copy to its readback buffers.
  void resolve(ProfiledBatch& batch, WGPUCommandEncoder encoder);
  // The batch was submitted: collect() reads it.
  void submitted(ProfiledBatch& batch);
  // The batch was dropped unsubmitted: its chunks are free again.
  void release(ProfiledBatch& batch);

 private:
  static constexpr uint32_t kQueriesPerChunk = 1024;  // two per dispatch; WebGPU allows 4096 per query set
  Chunk* take_chunk();
  Context& ctx_;
  double period_ns_ = 1;  // nanoseconds per tick
  std::vector<std::unique_ptr<Chunk>> chunks_;
  std::vector<Chunk*> free_;
  std::vector<std::vector<Chunk*>> pending_;  // submitted batches, oldest first
  std::map<std::pair<WGPUComputePipeline, uint64_t>, KernelTime> rows_;
  ProfileReport totals_;  // all but kernels (those are in rows_)
};

// What one ComputeBatch recorded: the profiler attached when it was made and its chunks in order (each holds up
// to kQueriesPerChunk / 2 dispatches).
struct ProfiledBatch {
  Profiler* profiler = nullptr;
  std::vector<Profiler::Chunk*> chunks;
};

}  // namespace wgllm::gpu
