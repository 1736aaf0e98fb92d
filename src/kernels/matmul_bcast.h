// Batch decode's float-type products with x broadcast (matmul_bcast.wgsl): a lane owns one or two rows and the lanes
// of a slice walk the row's words in step, so each element of x is one load for all of them. It replaces the batch
// matvec (MatmulImpl::Batch) for F32, F16 and BF16 weights where ContextOptions::batch_bcast allows, for every token
// count (passes of 16 tokens, each weight element read once a pass): a token's sums are an fma chain per slice in
// element order, the slices added as a tree, so its bits never depend on the tokens beside it.
#pragma once
#include <cstdint>
#include <string>

#include "gpu/batch.h"
#include "kernels/matmul.h"

namespace wgllm::kernels {

// The kernel's shape: rows a lane (1, 2 or 4; 0: by the product's rows; swiglu takes 2 or 4), words of 4 (F32) or 8
// elements a row and step (1, 2 or 4), F16 converted with integer ops. The slices a workgroup splits a row into come
// from the weight alone (bcast_slices).
struct BcastShape {
  uint32_t rows = 0, units = 2;
  bool int_f16 = false;
};
// "ROWSxUNITS[xINT_F16]", e.g. "2x4" or "2x4x1" (ContextOptions::bcast_shape); InvalidArgument when malformed or out
// of range.
BcastShape parse_bcast_shape(const std::string& text);
// Slices of a row for w (a power of two, 1 to 32): enough lanes in all to fill a large GPU, each slice at least 128
// elements; decides the order of a token's sums, so it depends on the weight and the adapter's limits alone.
uint32_t bcast_slices(const gpu::Context& ctx, const GpuWeight& w);

namespace detail {

// Whether a MatmulImpl::Batch product with these options runs here: the context allows it (batch_bcast; default on
// GPUs), w is F32, F16 or BF16 with n_in a multiple of 32 and no experts, and the options ask for nothing beyond
// bias, norm, accumulate, swiglu (silu or gelu_tanh) and split outputs.
bool bcast_takes(const gpu::Context& ctx, const GpuWeight& w, const MatmulOptions& o, uint32_t n_tokens);
// The product (encode_matmul has checked the options): with a norm, first the RMSNorm of x into the context's
// scratch (norm.wgsl), then the product of that.
void encode_bcast(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                  const gpu::Buffer& y, uint32_t n_tokens, const MatmulOptions& o);

}  // namespace detail
}  // namespace wgllm::kernels
