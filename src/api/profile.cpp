// wgllm/profile.h: a gpu::Profiler attached to a model's context.
#include "wgllm/profile.h"

#include "api/model_impl.h"
#include "gpu/profiler.h"

namespace wgllm {

struct Profiler::Impl {
  explicit Impl(gpu::Context& c) : ctx(c), profiler(c) { ctx.set_profiler(&profiler); }
  ~Impl() { ctx.set_profiler(nullptr); }
  gpu::Context& ctx;
  gpu::Profiler profiler;
};

bool Profiler::supported(const Model& model) { return gpu_context(model).features().timestamp_query; }

Profiler::Profiler(const Model& model) : impl_(std::make_unique<Impl>(gpu_context(model))) {}
Profiler::~Profiler() = default;

void Profiler::collect() { impl_->profiler.collect(); }
void Profiler::reset() { impl_->profiler.reset(); }

ProfileReport Profiler::report() const {
  const gpu::ProfileReport r = impl_->profiler.report();
  ProfileReport out{.kernels = {},
                    .kernel_ns = r.kernel_ns,
                    .dispatches = r.dispatches,
                    .batches = r.batches,
                    .batch_span_ns = r.batch_span_ns,
                    .windows = r.windows,
                    .window_span_ns = r.window_span_ns};
  for (const gpu::KernelTime& k : r.kernels)
    out.kernels.push_back(
        {.name = k.name, .detail = k.detail, .workgroups = k.workgroups, .calls = k.calls, .ns = k.ns});
  return out;
}

}  // namespace wgllm
