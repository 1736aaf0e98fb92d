// The weight kernels (matmul_common.wgsl + matvec.wgsl / matmul.wgsl) vs the CPU reference: every weight type, matvec
// and tiled, odd shapes, weights split into pieces, and each fused epilogue; fresh random inputs, poisoned outputs.
// (The prompt digits on their exact grid: test_int_dot.cpp; the pre-residual prologue: test_matmul_pre.cpp.)
#include <cmath>
#include <cstring>
#include <iterator>
#include <optional>
#include <tuple>
#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/embedding.h"
#include "kernels/matmul.h"
#include "kernels/weight.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

using kernels::MatmulImpl;

// ---------------------------------------------------------------------------------- matmul

struct MatmulCase {
  const char* name;
  GgufType type;
  uint32_t n_in, n_out, n_tokens;
  bool bias = false;
  MatmulImpl impl = MatmulImpl::Auto;
  uint64_t max_piece_bytes = 0;  // > 0: force the weight into pieces of at most this many bytes
};

// The error of the GPU product against the reference, and how far it is from the cancellation-free scale of the
// sums: |got - want|_2 / |a|_2 with a[t][o] = sum_i |x[t][i] w[o][i]| (+ |bias[o]|). A single dot product whose
// terms cancel (n_out = 1) can be off by more than 1e-5 relative to its small result while f32 rounding is all
// there is; against a, it is not.
struct MatmulError {
  ErrorReport report;
  double vs_abs = 0;
};

MatmulError run_matmul_scaled(gpu::Context& ctx, const MatmulCase& c, uint64_t salt, size_t* pieces = nullptr);

ErrorReport run_matmul(gpu::Context& ctx, const MatmulCase& c, uint64_t salt, size_t* pieces = nullptr) {
  return run_matmul_scaled(ctx, c, salt, pieces).report;
}

MatmulError run_matmul_scaled(gpu::Context& ctx, const MatmulCase& c, uint64_t salt, size_t* pieces) {
  auto gen = rng(salt);
  const auto bytes = random_weight(c.type, c.n_in, c.n_out, gen);
  const auto w = kernels::upload_weight(ctx, c.type, c.n_in, c.n_out, bytes, c.name, c.max_piece_bytes);
  if (pieces) *pieces = w.pieces.size();
  const auto x = random_floats(size_t(c.n_tokens) * c.n_in, gen);
  const auto bias = c.bias ? random_floats(c.n_out, gen) : std::vector<float>{};
  auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  auto y = poisoned(ctx, size_t(c.n_tokens) * c.n_out, "y");
  std::optional<gpu::Buffer> bbuf;
  if (c.bias) bbuf = ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias");
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_matmul(batch, ctx, w, xbuf, y, c.n_tokens, {.bias = bbuf ? &*bbuf : nullptr, .impl = c.impl});
  batch.submit_and_wait();
  const auto got = ctx.read<float>(y);
  const auto want = cpu::matmul(c.type, bytes, c.n_in, c.n_out, x, c.n_tokens, bias);
  double err2 = 0, abs2 = 0;
  for (uint32_t o = 0; o < c.n_out; ++o) {
    const auto row = cpu::dequantize_row(c.type, bytes, c.n_in, o);
    for (uint32_t t = 0; t < c.n_tokens; ++t) {
      double a = c.bias ? std::abs(double(bias[o])) : 0.0;
      for (uint32_t i = 0; i < c.n_in; ++i) a += std::abs(double(x[size_t(t) * c.n_in + i]) * double(row[i]));
      const double d = double(got[size_t(t) * c.n_out + o]) - double(want[size_t(t) * c.n_out + o]);
      err2 += d * d;
      abs2 += a * a;
    }
  }
  return {compare(got, want), abs2 > 0 ? std::sqrt(err2 / abs2) : std::sqrt(err2)};
}

// The products' bound: 1e-5 relative to the result, or 1e-6 against the sums of |terms| (a cancelling sum, e.g. a
// product of one output, is allowed that); no NaN either way.
::testing::AssertionResult within_bound(const MatmulError& e) {
  if ((e.report.rel_l2 <= 1e-5 || e.vs_abs <= 1e-6) && !e.report.has_nan) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << e.report.describe() << "; against the sums of |terms|: " << e.vs_abs;
}

constexpr auto Matvec = MatmulImpl::Matvec;
constexpr auto Tiled = MatmulImpl::Tiled;
constexpr auto Auto = MatmulImpl::Auto;

// name, type, n_in, n_out, n_tokens, bias, impl, max piece bytes
const MatmulCase kMatmulCases[] = {
    {"f32_mv_256x64_t1", F32, 256, 64, 1},
    {"f32_mv_odd_in_257x3_t1", F32, 257, 3, 1},
    {"f32_mv_n_out1_t2", F32, 100, 1, 2},
    {"f32_mv_4100x33_t3_bias", F32, 4100, 33, 3, true},
    {"f32_mv_t4", F32, 96, 77, 4},
    {"f32_mv_t7_chunks", F32, 130, 29, 7, false, Matvec},
    {"f32_mm_t7", F32, 130, 29, 7, false, Tiled},
    {"f32_mm_t64", F32, 512, 128, 64},
    {"f32_mm_t75_bias", F32, 300, 131, 75, true},
    {"f32_mm_t1", F32, 45, 70, 1, false, Tiled},
    {"f16_mv_896x131_t1", F16, 896, 131, 1},
    {"f16_mv_odd_in_33x5_t3", F16, 33, 5, 3},
    {"f16_mm_odd_in_1001x67_t75", F16, 1001, 67, 75, true},
    {"f16_mm_t64", F16, 256, 192, 64},
    {"bf16_mv_512x65_t1", BF16, 512, 65, 1, true},
    {"bf16_mv_odd_in_35x3_t2", BF16, 35, 3, 2},
    {"bf16_mm_t75", BF16, 160, 99, 75},
    {"q8_0_mv_896x131_t1", Q8_0, 896, 131, 1},
    {"q8_0_mv_32x1_t1", Q8_0, 32, 1, 1},
    {"q8_0_mv_4096x9_t3_bias", Q8_0, 4096, 9, 3, true},
    {"q8_0_mm_t7", Q8_0, 96, 3, 7},
    {"q8_0_mm_t75", Q8_0, 544, 129, 75, true},
    {"q8_0_mm_t64", Q8_0, 256, 64, 64},
    {"q4_0_mv_896x131_t1", Q4_0, 896, 131, 1},
    {"q4_0_mv_32x1_t4", Q4_0, 32, 1, 4},
    {"q4_0_mv_4864x17_t2_bias", Q4_0, 4864, 17, 2, true},
    {"q4_0_mm_t75", Q4_0, 224, 131, 75},
    {"q4_0_mm_t64_bias", Q4_0, 64, 65, 64, true},
    {"q4_1_mv_896x131_t1", Q4_1, 896, 131, 1},
    {"q4_1_mm_t75_bias", Q4_1, 224, 131, 75, true},
    {"q5_0_mv_4096x9_t3_bias", Q5_0, 4096, 9, 3, true},
    {"q5_0_mv_odd_blocks_160x33_t1", Q5_0, 160, 33, 1},
    {"q5_0_mm_t64", Q5_0, 544, 65, 64},
    {"q5_1_mv_32x1_t2", Q5_1, 32, 1, 2},
    {"q5_1_mv_1376x45_t4", Q5_1, 1376, 45, 4},
    {"q5_1_mm_t7", Q5_1, 96, 3, 7},
    {"q2_k_mv_512x67_t1", Q2_K, 512, 67, 1},
    {"q2_k_mm_t75", Q2_K, 256, 70, 75},
    {"q3_k_mv_768x33_t3_bias", Q3_K, 768, 33, 3, true},
    {"q3_k_mm_t64", Q3_K, 512, 64, 64},
    {"q4_k_mv_256x1_t1", Q4_K, 256, 1, 1},
    {"q4_k_mv_2304x131_t2", Q4_K, 2304, 131, 2},
    {"q4_k_mm_t75_bias", Q4_K, 512, 131, 75, true},
    {"q5_k_mv_1280x45_t4", Q5_K, 1280, 45, 4},
    {"q5_k_mm_t7", Q5_K, 256, 3, 7},
    {"q6_k_mv_768x131_t1_bias", Q6_K, 768, 131, 1, true},
    {"q6_k_mv_256x3_t3", Q6_K, 256, 3, 3},
    {"q6_k_mm_t75", Q6_K, 768, 67, 75},
    {"mxfp4_mv_896x131_t1", MXFP4, 896, 131, 1},
    {"mxfp4_mv_32x1_t4", MXFP4, 32, 1, 4},
    {"mxfp4_mv_2880x17_t2_bias", MXFP4, 2880, 17, 2, true},  // gpt-oss's n_embd
    {"mxfp4_mm_t75", MXFP4, 224, 131, 75},
    {"mxfp4_mm_t64_bias", MXFP4, 64, 65, 64, true},
    // Weights split into row pieces (small pieces forced so the split runs fast).
    {"split_f32_mv_t3", F32, 100, 301, 3, true, Auto, 16 * 1024},
    {"split_f16_mm_t75", F16, 200, 257, 75, false, Auto, 20 * 1024},
    {"split_q8_0_mv_t1", Q8_0, 256, 333, 1, true, Auto, 12 * 1024},
    {"split_q4_0_mm_t64", Q4_0, 128, 190, 64, false, Auto, 3 * 1024},
    {"split_bf16_mv_t2", BF16, 64, 97, 2, false, Auto, 1024},
    {"split_q5_0_mv_t3", Q5_0, 96, 257, 3, false, Auto, 2 * 1024},
    {"split_q4_1_mm_t75", Q4_1, 128, 101, 75, true, Auto, 2 * 1024},
    {"split_q2_k_mv_t1", Q2_K, 256, 99, 1, false, Auto, 2 * 1024},
    {"split_q3_k_mm_t64", Q3_K, 256, 77, 64, false, Auto, 3 * 1024},
    {"split_q4_k_mv_t1", Q4_K, 512, 301, 1, true, Auto, 16 * 1024},
    {"split_q5_k_mv_t2", Q5_K, 256, 61, 2, false, Auto, 2 * 1024},
    {"split_q6_k_mm_t75", Q6_K, 256, 199, 75, false, Auto, 8 * 1024},
    {"split_mxfp4_mv_t1", MXFP4, 96, 257, 1, true, Auto, 2 * 1024},  // 3 scale bytes a row: unaligned scale words
    {"split_mxfp4_mm_t64", MXFP4, 128, 190, 64, false, Auto, 3 * 1024},
};

class MatmulTable : public ::testing::TestWithParam<MatmulCase> {};

TEST_P(MatmulTable, MatchesCpuReference) {
  const auto& c = GetParam();
  size_t pieces = 0;
  EXPECT_TRUE(within_bound(run_matmul_scaled(context(), c, std::hash<std::string>{}(c.name), &pieces)));
  if (c.max_piece_bytes) {
    EXPECT_GT(pieces, 1u) << "the weight was meant to be split";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, MatmulTable, ::testing::ValuesIn(kMatmulCases),
                         [](const auto& info) { return std::string(info.param.name); });

// A weight larger than one storage binding (40000 x 1024 f32 = 164 MB on an adapter with a
// 128 MiB limit) is split into pieces of rows by upload_weight itself.
TEST(Matmul, WeightLargerThanABinding) {
  auto& ctx = context();
  const uint64_t limit = ctx.max_binding_size();
  const uint32_t n_in = 1024;
  const uint32_t n_out = uint32_t(std::max<uint64_t>(40000, limit / (n_in * 4) + 1000));
  if (uint64_t(n_out) * n_in * 4 > ctx.limits().maxBufferSize * 2 || n_out > 200000)
    GTEST_SKIP() << "binding limit too large for a quick test";
  for (uint32_t t : {1u, 3u}) {
    size_t pieces = 0;
    const MatmulCase c{"huge_f32", F32, n_in, n_out, t, t == 3};
    const auto r = run_matmul(ctx, c, 1234 + t, &pieces);
    EXPECT_GE(pieces, 2u);
    EXPECT_LE(r.rel_l2, 1e-5) << "n_tokens " << t << ": " << r.describe();
  }
}

// ---------------------------------------------------------------------- matmul epilogues
// The fused extras of encode_matmul (norm folded in, residual accumulation, SwiGLU over
// interleaved rows, split outputs) against the CPU reference applied step by step.

// SplitTwo: y and y1 alone; SwigluOai: gpt-oss's clamped SwiGLU (sums here reach past its clamps at +-7);
// GeluTimes / SiluTimes / SigmoidTimes: each row activated and multiplied by a row of another input
// (MatmulOptions::times)
enum class Epilogue {
  Plain,
  Accumulate,
  Swiglu,
  Geglu,
  SwigluOai,
  Split,
  SplitTwo,
  GeluTimes,
  SiluTimes,
  SigmoidTimes
};

struct EpilogueCase {
  const char* name;
  GgufType type;
  uint32_t n_in, n_out, n_tokens;
  MatmulImpl impl;
  Epilogue epilogue;
  bool norm = false, bias = false;
  uint64_t max_piece_bytes = 0;
};

const EpilogueCase kEpilogueCases[] = {
    {"norm_f16_mv_t1", F16, 256, 96, 1, Matvec, Epilogue::Plain, true},
    {"norm_q8_0_mv_t3", Q8_0, 512, 40, 3, Matvec, Epilogue::Plain, true, true},
    {"norm_odd_in_f32_mv_t2", F32, 77, 30, 2, Matvec, Epilogue::Plain, true},
    {"norm_bf16_mm_t75", BF16, 160, 70, 75, Tiled, Epilogue::Plain, true, true},
    {"accum_f16_mv_t1", F16, 128, 64, 1, Matvec, Epilogue::Accumulate},
    {"accum_q4_0_mv_t4", Q4_0, 256, 33, 4, Matvec, Epilogue::Accumulate},
    {"accum_f32_mm_t70", F32, 96, 65, 70, Tiled, Epilogue::Accumulate},
    {"swiglu_norm_f16_mv_t1", F16, 256, 128, 1, Matvec, Epilogue::Swiglu, true},
    {"swiglu_q8_0_mv_t2_bias", Q8_0, 128, 70, 2, Matvec, Epilogue::Swiglu, false, true},
    {"swiglu_norm_f16_mm_t75", F16, 192, 134, 75, Tiled, Epilogue::Swiglu, true},
    {"swiglu_split_pieces_f32_mv_t1", F32, 64, 202, 1, Matvec, Epilogue::Swiglu, true, false, 6 * 1024},
    {"geglu_norm_f16_mv_t1", F16, 256, 128, 1, Matvec, Epilogue::Geglu, true},
    {"geglu_q8_0_mv_t3_bias", Q8_0, 128, 70, 3, Matvec, Epilogue::Geglu, false, true},
    {"geglu_norm_f32_mm_t75", F32, 192, 134, 75, Tiled, Epilogue::Geglu, true},
    {"oai_norm_bias_f16_mv_t1", F16, 256, 128, 1, Matvec, Epilogue::SwigluOai, true, true},
    {"oai_q4_0_mv_t3_bias", Q4_0, 256, 70, 3, Matvec, Epilogue::SwigluOai, false, true},
    {"oai_norm_bias_q8_0_mm_t75", Q8_0, 192, 134, 75, Tiled, Epilogue::SwigluOai, true, true},
    {"oai_norm_bias_mxfp4_mv_t2", MXFP4, 128, 70, 2, Matvec, Epilogue::SwigluOai, true, true},
    {"oai_bias_mxfp4_mm_t75", MXFP4, 96, 66, 75, Tiled, Epilogue::SwigluOai, false, true},
    // the residual add with a bias (gpt-oss's output projection)
    {"accum_bias_q8_0_mv_t1", Q8_0, 128, 64, 1, Matvec, Epilogue::Accumulate, false, true},
    {"accum_bias_f16_mm_t70", F16, 96, 65, 70, Tiled, Epilogue::Accumulate, false, true},
    {"split_norm_bias_f16_mv_t1", F16, 256, 160, 1, Matvec, Epilogue::Split, true, true},
    {"split_q8_0_mv_t3", Q8_0, 96, 45, 3, Matvec, Epilogue::Split},
    {"split_norm_f16_mm_t75", F16, 128, 100, 75, Tiled, Epilogue::Split, true, true},
    {"split_pieces_q4_0_mm_t64", Q4_0, 64, 150, 64, Tiled, Epilogue::Split, false, false, 2 * 1024},
    {"norm_q4_k_mv_t1", Q4_K, 512, 40, 1, Matvec, Epilogue::Plain, true, true},
    {"swiglu_q6_k_mv_t1", Q6_K, 256, 70, 1, Matvec, Epilogue::Swiglu, true},
    {"split_q5_0_mm_t75", Q5_0, 128, 100, 75, Tiled, Epilogue::Split, true, true},
    // Q4_1 and Q5_1 on the tiles (CPU adapters' Auto takes the rows kernel for them)
    {"accum_q4_1_mm_t70", Q4_1, 128, 65, 70, Tiled, Epilogue::Accumulate},
    {"norm_bias_q5_1_mm_t75", Q5_1, 96, 70, 75, Tiled, Epilogue::Plain, true, true},
    {"accum_q5_k_mm_t70", Q5_K, 256, 65, 70, Tiled, Epilogue::Accumulate},
    {"split_two_norm_bias_q4_k_mv_t1", Q4_K, 256, 96, 1, Matvec, Epilogue::SplitTwo, true, true},
    {"split_two_f16_mm_t75", F16, 128, 100, 75, Tiled, Epilogue::SplitTwo, true},
    {"norm_mxfp4_mv_t1", MXFP4, 512, 40, 1, Matvec, Epilogue::Plain, true, true},
    {"accum_mxfp4_mm_t70", MXFP4, 96, 65, 70, Tiled, Epilogue::Accumulate},
    {"swiglu_norm_mxfp4_mv_t2_bias", MXFP4, 128, 70, 2, Matvec, Epilogue::Swiglu, true, true},
    {"geglu_norm_mxfp4_mm_t75", MXFP4, 192, 134, 75, Tiled, Epilogue::Geglu, true},
    {"split_pieces_mxfp4_mv_t3", MXFP4, 64, 150, 3, Matvec, Epilogue::Split, false, false, 2 * 1024},
    {"split_two_norm_bias_mxfp4_mm_t75", MXFP4, 128, 100, 75, Tiled, Epilogue::SplitTwo, true, true},
    // batch decode's matvec passes: 16 tokens, then 5 in a pipeline of 8
    {"swiglu_norm_q4_k_mv_t21", Q4_K, 512, 70, 21, Matvec, Epilogue::Swiglu, true},
    {"split_norm_bias_f16_mv_t21", F16, 256, 100, 21, Matvec, Epilogue::Split, true, true},
    {"swiglu_norm_mxfp4_mv_t21", MXFP4, 512, 70, 21, Matvec, Epilogue::Swiglu, true},
    // gemma4's per-layer gate (the pipelines of cases above: the epilogue is a flag)
    {"gelu_times_norm_q8_0_mv_t3", Q8_0, 512, 40, 3, Matvec, Epilogue::GeluTimes, true},
    {"silu_times_f16_mv_t1", F16, 256, 96, 1, Matvec, Epilogue::SiluTimes},
    {"gelu_times_f32_mm_t70", F32, 96, 65, 70, Tiled, Epilogue::GeluTimes},
    {"gelu_times_q4_k_mv_t21", Q4_K, 512, 70, 21, Matvec, Epilogue::GeluTimes, true},
    // qwen35's attention gate
    {"sigmoid_times_norm_f16_mv_t1", F16, 256, 128, 1, Matvec, Epilogue::SigmoidTimes, true},
    {"sigmoid_times_norm_bf16_mm_t75", BF16, 160, 70, 75, Tiled, Epilogue::SigmoidTimes, true},
};

// tol: the largest relative L2 error allowed (0: f32's, by type).
// Returns the largest relative L2 error of the outputs.
double check_epilogue(gpu::Context& ctx, const EpilogueCase& c, double tol = 0) {
  auto gen = rng(std::hash<std::string>{}(c.name));
  const uint32_t T = c.n_tokens, N = c.n_out;
  const auto bytes = random_weight(c.type, c.n_in, N, gen);
  const auto w = kernels::upload_weight(ctx, c.type, c.n_in, N, bytes, c.name, c.max_piece_bytes);
  if (c.max_piece_bytes) {
    EXPECT_GT(w.pieces.size(), 1u) << "the weight was meant to be split";
  }
  const auto x = random_floats(size_t(T) * c.n_in, gen, -2.f, 2.f);
  auto xbuf = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  kernels::MatmulOptions o{.impl = c.impl};
  std::optional<gpu::Buffer> bias_buf, norm_buf, y1, y2, times_buf;
  std::vector<float> bias, norm, times;
  if (c.bias) {
    bias = random_floats(N, gen);
    bias_buf = ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias");
    o.bias = &*bias_buf;
  }
  std::vector<float> xin = x;  // what the plain product sees
  if (c.norm) {
    norm = random_floats(c.n_in, gen, 0.5f, 1.5f);
    std::vector<float> padded = norm;
    padded.resize((c.n_in + 7) / 8 * 8, 0.f);
    norm_buf = ctx.upload<float>(padded, WGPUBufferUsage_Storage, "norm");
    o.norm = &*norm_buf;
    o.eps = 1e-5f;
    xin = cpu::rms_norm(x, norm, T, c.n_in, o.eps);
  }
  const auto full = cpu::matmul(c.type, bytes, c.n_in, N, xin, T, bias);  // [T][N]

  std::vector<float> want, y_init;
  size_t y_width = N;
  switch (c.epilogue) {
    case Epilogue::Plain: want = full; break;
    case Epilogue::Accumulate:
      o.accumulate = true;
      y_init = random_floats(size_t(T) * N, gen);
      for (size_t i = 0; i < full.size(); ++i) want.push_back(y_init[i] + full[i]);
      break;
    case Epilogue::Swiglu:
      o.swiglu = true;
      y_width = N / 2;
      for (uint32_t t = 0; t < T; ++t)
        for (uint32_t i = 0; i < N / 2; ++i) {
          const double g = full[size_t(t) * N + 2 * i], u = full[size_t(t) * N + 2 * i + 1];
          want.push_back(float(g / (1 + std::exp(-g)) * u));
        }
      break;
    case Epilogue::Geglu:
    case Epilogue::SwigluOai: {
      o.swiglu = true;
      o.act = c.epilogue == Epilogue::Geglu ? kernels::GateAct::GeluTanh : kernels::GateAct::SwigluOai;
      y_width = N / 2;
      std::vector<float> gate, up;
      for (uint32_t t = 0; t < T; ++t)
        for (uint32_t i = 0; i < N / 2; ++i) {
          gate.push_back(full[size_t(t) * N + 2 * i]);
          up.push_back(full[size_t(t) * N + 2 * i + 1]);
        }
      want = cpu::gated(uint32_t(o.act), gate, up);
      break;
    }
    case Epilogue::GeluTimes:
    case Epilogue::SiluTimes:
    case Epilogue::SigmoidTimes: {
      // rows of times N + 7 wide, the factors from column 5: a slice of wider rows, as gemma4's per-layer inputs
      o.act = c.epilogue == Epilogue::GeluTimes   ? kernels::GateAct::GeluTanh
              : c.epilogue == Epilogue::SiluTimes ? kernels::GateAct::Silu
                                                  : kernels::GateAct::Sigmoid;
      o.times_stride = N + 7;
      o.times_offset = 5;
      times = random_floats(size_t(T) * o.times_stride, gen);
      times_buf = ctx.upload<float>(times, WGPUBufferUsage_Storage, "times");
      o.times = &*times_buf;
      std::vector<float> factors;
      for (uint32_t t = 0; t < T; ++t)
        for (uint32_t i = 0; i < N; ++i) factors.push_back(times[size_t(t) * o.times_stride + o.times_offset + i]);
      want = cpu::gated(uint32_t(o.act), full, factors);
      break;
    }
    case Epilogue::Split:
      o.split1 = N / 2;
      o.split2 = N / 2 + N / 5;
      y_width = o.split1;
      break;
    case Epilogue::SplitTwo:
      o.split1 = N - N / 3;
      o.split2 = N;
      y_width = o.split1;
      break;
  }
  gpu::Buffer y = poisoned(ctx, size_t(T) * y_width, "y");
  if (!y_init.empty()) ctx.write_buffer(y, 0, y_init.data(), y_init.size() * 4);
  const bool split = c.epilogue == Epilogue::Split || c.epilogue == Epilogue::SplitTwo;
  if (split) {
    y1 = poisoned(ctx, size_t(T) * (o.split2 - o.split1), "y1");
    o.y1 = &*y1;
  }
  if (c.epilogue == Epilogue::Split) {
    y2 = poisoned(ctx, size_t(T) * (N - o.split2), "y2");
    o.y2 = &*y2;
  }
  gpu::ComputeBatch batch(ctx, c.name);
  kernels::encode_matmul(batch, ctx, w, xbuf, y, T, o);
  batch.submit_and_wait();
  if (tol == 0) tol = c.type == F32 ? 1e-5 : 2e-5;
  if (!split) {
    const auto r = compare(ctx.read<float>(y), want);
    EXPECT_LE(r.rel_l2, tol) << r.describe();
    return r.rel_l2;
  }
  // Split: each output holds its range of rows, token-major.
  double worst = 0;
  std::vector<std::pair<const gpu::Buffer*, std::pair<uint32_t, uint32_t>>> outs = {{&y, {0, o.split1}},
                                                                                    {&*y1, {o.split1, o.split2}}};
  if (y2) outs.push_back({&*y2, {o.split2, N}});
  for (const auto& [buf, range] : outs) {
    std::vector<float> part;
    for (uint32_t t = 0; t < T; ++t)
      for (uint32_t r = range.first; r < range.second; ++r) part.push_back(full[size_t(t) * N + r]);
    const auto r = compare(ctx.read<float>(*buf), part);
    EXPECT_LE(r.rel_l2, tol) << "rows [" << range.first << ", " << range.second << "): " << r.describe();
    worst = std::max(worst, r.rel_l2);
  }
  return worst;
}

class MatmulEpilogueTable : public ::testing::TestWithParam<EpilogueCase> {};

TEST_P(MatmulEpilogueTable, MatchesCpuReference) { check_epilogue(context(), GetParam()); }

// The matvec shapes other adapters use (a GPU's, a MoE router's 256x2x1, and odd ones), run here through the override:
// groups wider than a subgroup reduce through workgroup memory, several units in flight per step.
// The matvec cases of the table and the matvec epilogue cases are dealt out over the shapes in turn (each case under
// one shape, each shape over a mix of types, sizes and epilogues): all of them under every shape cost minutes of
// compiles on a CPU adapter. Of the block types only the one-token cases: lavapipe takes 25-30 s to compile each of
// their several-token pipelines (the table's own cases run those in the default shape).
TEST(Matmul, OtherMatvecShapes) {
  const char* shapes[] = {"32x4x4", "32x4x4x2", "128x4x1", "256x4x1", "256x2x1", "16x2x2x3", "8x2x4x2x1"};
  const size_t n_shapes = std::size(shapes);
  for (size_t s = 0; s < n_shapes; ++s) {
    const char* shape = shapes[s];
    SCOPED_TRACE(shape);
    gpu::Context ctx(context_options([&](auto& o) {
      o.matvec_shape = shape;
      o.rows_shape = "off";  // CPU adapters too take the GPUs' kernels for Auto
    }));
    EXPECT_EQ(kernels::matvec_config(ctx).threads_per_row, kernels::parse_matvec_config(shape).threads_per_row);
    size_t e = 0;
    for (const EpilogueCase& c : kEpilogueCases)
      if (c.impl == Matvec && c.n_tokens <= kernels::kMatvecMaxTokens && e++ % n_shapes == s) check_epilogue(ctx, c);
    size_t i = 0;
    for (const MatmulCase& c : kMatmulCases)
      if (c.impl != Tiled && c.n_tokens <= kernels::kMatvecMaxTokens && (c.n_tokens == 1 || block_elems(c.type) == 1) &&
          i++ % n_shapes == s) {
        EXPECT_TRUE(within_bound(run_matmul_scaled(ctx, c, 99))) << c.name;  // (e.g. q8_0_mv_32x1_t1's one output)
      }
  }
  // the GPUs' shape of tall products (an LM head): 4 threads a row, the K-quants' one-token products (the 32-weight
  // blocks' took it first)
  gpu::Context tall(context_options([](auto& o) {
    o.matvec_shape = "4x4x32";
    o.rows_shape = "off";
  }));
  for (const MatmulCase& c : kMatmulCases)
    if (c.impl != Tiled && c.n_tokens == 1 && block_elems(c.type) == 256) {
      EXPECT_TRUE(within_bound(run_matmul_scaled(tall, c, 99))) << c.name << " at 4x4x32";  // (q4_k_mv_256x1_t1)
    }
  EXPECT_THROW(kernels::parse_matvec_config("32x4"), InvalidArgument);
  EXPECT_THROW(kernels::parse_matvec_config("32x3x4"), InvalidArgument);
  EXPECT_THROW(kernels::parse_matvec_config("0x2x4"), InvalidArgument);
}

// The tiled matmul's other shapes (the table runs the adapter's own: 64 x 64 on CPU adapters), through the override.
// A pipeline per tile, type and epilogue is compiled, slowly on CPU adapters (15-20 s for a tile of 4 x 8 sums per
// thread, 40-75 s for one of 8 x 8), so each compile counts: the three light tiles deal the epilogue cases out
// between them (together all of them), and every tile runs one product of several tiles each way whose last tiles
// are partial, each in another weight type (the types' loaders are the default tile's too: MatmulTable). f16 tiles
// round x and W to f16 and sum each 32-term block in f16: they are held to 3e-3 (f32 ones to 1e-5 / 2e-5).
TEST(Matmul, OtherTiles) {
  // Each accumulator shape once (MI x NJ: 1 x 2, 2 x 2, 2 x 1 with f16 tiles, 1 x 1 with f16 tiles), and workgroups of
  // 256, 128 and 64 threads (loader passes NLW x NLX: 2 x 1, 2 x 2, 2 x 2, 1 x 1; 4 x 2; 4 x 4); 64 x 64 in f32, the
  // CPU adapters' default, is what the other tests run there.
  struct Tile {
    const char* tile;
    bool light;  // takes its share of the epilogue cases
    EpilogueCase big;
  };
  // 261 tokens and 289 / 290 rows: partial last tiles both ways under every tile shape.
  const Tile tiles[] = {
      {"64x128", true, {"big_q4_k_mm_t261_bias", Q4_K, 512, 289, 261, Tiled, Epilogue::Plain, false, true}},
      {"128x64xf16", true, {"big_q8_0_mm_t261_bias", Q8_0, 544, 289, 261, Tiled, Epilogue::Plain, false, true}},
      {"64x64xf16", true, {"big_f32_odd_in_mm_t261", F32, 333, 289, 261, Tiled, Epilogue::Plain}},
      {"128x128", false, {"big_swiglu_norm_f16_odd_in_mm_t261", F16, 1001, 290, 261, Tiled, Epilogue::Swiglu, true}},
      {"64x128/8x8", false, {"big_split_norm_q6_k_mm_t261", Q6_K, 512, 289, 261, Tiled, Epilogue::Split, true, true}},
      {"64x64/8x8xf16", false, {"big_accum_bf16_mm_t261", BF16, 500, 289, 261, Tiled, Epilogue::Accumulate}},
  };
  size_t n_light = 0;
  for (const Tile& t : tiles) n_light += t.light;
  size_t light = 0;
  for (const Tile& tile : tiles) {
    SCOPED_TRACE(tile.tile);
    const auto want = kernels::parse_matmul_tile(tile.tile);
    if (want.f16 && !context().features().shader_f16) continue;
    gpu::Context ctx(context_options([&](auto& o) {
      o.matmul_tile = tile.tile;
      o.rows_shape = "off";  // CPU adapters too take the GPUs' kernels for Auto
    }));
    const auto got = kernels::matmul_tile(ctx, 512, 4096);
    EXPECT_EQ(got.tokens, want.tokens);
    EXPECT_EQ(got.rows, want.rows);
    EXPECT_EQ(got.f16, want.f16);
    EXPECT_EQ(got.threads(), want.threads());
    const double tol = want.f16 ? 3e-3 : 0;
    if (tile.light) {
      size_t e = 0;
      for (const EpilogueCase& c : kEpilogueCases)
        if (c.impl == Tiled && e++ % n_light == light) check_epilogue(ctx, c, tol);
      ++light;
    }
    SCOPED_TRACE(tile.big.name);
    check_epilogue(ctx, tile.big, tol);
  }
  for (const char* bad :
       {"32x64", "64x64/2x4", "128x128/4x4", "32x32/8x8", "16x16/4x4", "16x64", "64x128/8x", "64x128/8x8x"})
    EXPECT_THROW(kernels::parse_matmul_tile(bad), InvalidArgument) << bad;
  for (const char* good : {"64x128", "128x64xf16", "64x128/8x8", "32x64/4x4xf16", "16x64/4x4", "16x32/4x4"})
    EXPECT_EQ(kernels::to_string(kernels::parse_matmul_tile(good)), good);
  const auto t = kernels::parse_matmul_tile("64x128");
  EXPECT_EQ(t.thread_tokens, 4u);
  EXPECT_EQ(t.thread_rows, 8u);
  EXPECT_EQ(kernels::parse_matmul_tile("32x128/4x8").threads(), 128u);
  EXPECT_THROW(kernels::parse_matmul_tile("128x128xf32"), InvalidArgument);
  EXPECT_THROW(kernels::parse_matmul_tile("128"), InvalidArgument);
}

// Q4_K, Q6_K and Q8_0 prompt products on x's digits (ContextOptions::prompt_digits, matmul_int.wgsl), every epilogue,
// partial tiles of 64 both ways, a weight in pieces, against float64 on the f32 input. The error bound follows the
// digits kept (3: about f32's; 2: 2^-15 of each 32-element block's largest |x|; 1: 8-bit steps), and with one digit the
// error must also be at least that of 8-bit steps: the products did run on the digits, not on the f32 tiles.
TEST(Matmul, PromptDigits) {
  const EpilogueCase cases[] = {
      {"digits_norm_bias_q4_k_mm_t75", Q4_K, 512, 70, 75, Tiled, Epilogue::Plain, true, true},
      {"digits_swiglu_norm_q4_k_mm_t130", Q4_K, 256, 134, 130, Tiled, Epilogue::Swiglu, true},
      {"digits_accum_q4_k_mm_t64", Q4_K, 768, 65, 64, Tiled, Epilogue::Accumulate},
      {"digits_split_norm_bias_q4_k_mm_t70", Q4_K, 256, 150, 70, Tiled, Epilogue::Split, true, true},
      {"digits_gelu_times_q4_k_mm_t66", Q4_K, 256, 40, 66, Tiled, Epilogue::GeluTimes},
      {"digits_pieces_q4_k_mm_t65", Q4_K, 256, 200, 65, Tiled, Epilogue::Plain, false, false, 16 * 1024},
      {"digits_norm_bias_q6_k_mm_t75", Q6_K, 512, 70, 75, Tiled, Epilogue::Plain, true, true},
      {"digits_swiglu_norm_q6_k_mm_t130", Q6_K, 256, 134, 130, Tiled, Epilogue::Swiglu, true},
      {"digits_accum_q6_k_mm_t64", Q6_K, 768, 65, 64, Tiled, Epilogue::Accumulate},
      {"digits_split_pieces_q6_k_mm_t70", Q6_K, 256, 150, 70, Tiled, Epilogue::Split, true, true, 16 * 1024},
      // Q8_0 with one or two digits (three: the f32 tiles, held to the same bound)
      {"digits_norm_bias_q8_0_mm_t75", Q8_0, 384, 70, 75, Tiled, Epilogue::Plain, true, true},
      {"digits_swiglu_norm_q8_0_mm_t130", Q8_0, 128, 134, 130, Tiled, Epilogue::Swiglu, true},
      {"digits_accum_pieces_q8_0_mm_t64", Q8_0, 256, 150, 64, Tiled, Epilogue::Accumulate, false, false, 8 * 1024},
  };
  // lavapipe: up to 6.2e-3 (Q4_K), 6.9e-3 (Q8_0) and 1.3e-2 (Q6_K, whose signed quants cancel more), 5.5e-5 and 5.0e-7
  const double bound[] = {0, 3e-2, 1.2e-4, 2e-6};
  for (uint32_t d = 1; d <= 3; ++d) {
    SCOPED_TRACE("digits " + std::to_string(d));
    gpu::Context ctx(context_options([&](auto& o) {
      o.prompt_digits = d;
      o.rows_shape = "off";  // CPU adapters too take the GPUs' kernels
    }));
    for (const EpilogueCase& c : cases) {
      SCOPED_TRACE(c.name);
      const double err = check_epilogue(ctx, c, bound[d]);
      if (d == 1) {
        EXPECT_GT(err, 1e-3) << "one digit gave the f32 tiles' error";
      }
    }
  }
  gpu::Context bad(context_options([](auto& o) {
    o.prompt_digits = 4;
    o.rows_shape = "off";
  }));
  EXPECT_THROW(check_epilogue(bad, {"digits_bad", Q4_K, 256, 64, 64, Tiled, Epilogue::Plain}), InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Cases, MatmulEpilogueTable, ::testing::ValuesIn(kEpilogueCases),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(Matmul, FusedWeightLayouts) {
  // Stacked rows: the concatenation of the parts' bytes; interleaved: a0 b0 a1 b1 ...
  const std::vector<uint8_t> a = {1, 2, 3, 4, 5, 6}, b = {7, 8, 9, 10, 11, 12};
  const std::span<const uint8_t> parts[] = {a, b};
  EXPECT_EQ(kernels::concat_rows(parts), (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}));
  EXPECT_EQ(kernels::interleave_rows(a, b, 3), (std::vector<uint8_t>{1, 2, 7, 8, 3, 4, 9, 10, 5, 6, 11, 12}));
  EXPECT_THROW(kernels::interleave_rows(a, std::span(b).first(4), 3), InvalidArgument);
  EXPECT_THROW(kernels::interleave_rows(a, b, 4), InvalidArgument);
}

TEST(Matmul, EpilogueArgumentsAreChecked) {
  auto& ctx = context();
  auto gen = rng(9);
  const auto bytes = random_weight(F16, 64, 10, gen);
  const auto w = kernels::upload_weight(ctx, F16, 64, 10, bytes);
  const auto odd = kernels::upload_weight(ctx, F16, 64, 9, random_weight(F16, 64, 9, gen));
  auto x = ctx.create_buffer(64 * 4, WGPUBufferUsage_Storage, "x");
  auto y = ctx.create_buffer(10 * 4, WGPUBufferUsage_Storage, "y");
  auto y1 = ctx.create_buffer(10 * 4, WGPUBufferUsage_Storage, "y1");
  auto y2 = ctx.create_buffer(10 * 4, WGPUBufferUsage_Storage, "y2");
  auto short_norm = ctx.create_buffer(60 * 4, WGPUBufferUsage_Storage, "norm");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_matmul(batch, ctx, odd, x, y, 1, {.swiglu = true}); }, "even n_out");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.y1 = &y1}); }, "split outputs");
  // y2 exactly when rows go to it
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.y1 = &y1, .split1 = 6, .split2 = 8}); },
               "y2 exactly when");
  expect_throw(
      [&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.y1 = &y1, .y2 = &y2, .split1 = 6, .split2 = 10}); },
      "y2 exactly when");
  EXPECT_NO_THROW(kernels::encode_matmul(batch, ctx, w, x, y, 1, {.y1 = &y1, .split1 = 6, .split2 = 10}));
  expect_throw(
      [&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.y1 = &y1, .y2 = &y2, .split1 = 6, .split2 = 4}); },
      "split1 <= split2");
  expect_throw(
      [&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.y1 = &y1, .y2 = &y1, .split1 = 2, .split2 = 4}); },
      "different buffers");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.norm = &short_norm}); }, "norm holds");
  auto big_y = ctx.create_buffer(64 * 4, WGPUBufferUsage_Storage, "y");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, big_y, 1, {.norm = &big_y, .eps = 1e-5f}); },
               "norm must not");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.accumulate = true, .swiglu = true}); }, "swiglu");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.act = kernels::GateAct::GeluTanh}); },
               "gate activation needs swiglu");
  auto times = ctx.create_buffer(16 * 4, WGPUBufferUsage_Storage, "times");
  auto encode_times = [&](const gpu::Buffer& t, uint32_t stride, uint32_t offset, const gpu::Buffer* bias = nullptr) {
    kernels::encode_matmul(batch, ctx, w, x, y, 1,
                           {.bias = bias, .times = &t, .times_stride = stride, .times_offset = offset});
  };
  EXPECT_NO_THROW(encode_times(times, 16, 6));
  expect_throw([&] { encode_times(times, 16, 7); }, "times_offset + n_out <= times_stride");
  expect_throw([&] { encode_times(times, 20, 0); }, "times holds");
  expect_throw([&] { encode_times(times, 16, 0, &y1); }, "times takes neither");
  expect_throw([&] { encode_times(y, 10, 0); }, "times must not be the output");
  expect_throw(
      [&] { kernels::encode_matmul(batch, ctx, w, x, y, 1, {.swiglu = true, .act = kernels::GateAct::Sigmoid}); },
      "sigmoid gate is a matmul epilogue only with times");
}

// Without subgroups the matvec rows reduce through workgroup memory instead of shuffles, and the Rows kernel loads
// x in every invocation instead of sharing it by broadcasts.
TEST(Matmul, NoSubgroupsMatvec) {
  for (const char* rows : {"off", ""}) {
    SCOPED_TRACE(rows);
    gpu::Context ctx(context_options([&](auto& o) {
      o.disable_subgroups = true;
      o.rows_shape = rows;
    }));
    EXPECT_FALSE(kernels::matvec_config(ctx).shuffle);
    for (const MatmulCase& c :
         {MatmulCase{"nosg_q4_0_t1", Q4_0, 896, 131, 1, true}, MatmulCase{"nosg_f16_t3", F16, 257, 33, 3},
          MatmulCase{"nosg_q8_0_t4_split", Q8_0, 256, 99, 4, false, Auto, 4096},
          MatmulCase{"nosg_q8_0_t9", Q8_0, 64, 20, 9}, MatmulCase{"nosg_q4_k_t1", Q4_K, 512, 37, 1, true},
          MatmulCase{"nosg_q6_k_t2_split", Q6_K, 256, 61, 2, false, Auto, 2 * 1024},
          MatmulCase{"nosg_mxfp4_t1", MXFP4, 2880, 37, 1, true},
          MatmulCase{"nosg_mxfp4_t3_split", MXFP4, 96, 101, 3, false, Auto, 2 * 1024}}) {
      EXPECT_TRUE(within_bound(run_matmul_scaled(ctx, c, 77))) << c.name;
    }
  }
}

// The matvec reads the block types in 32-weight chunks (matmul_common.wgsl's load_chunk: quants left at their bit
// positions, x scaled by the matching powers of two, scales and mins per run of 16). Every block type through it for
// one token, whatever the adapter (CPU adapters otherwise take the Rows kernel for some of them): a row count that
// fills no group, rows of one chunk per thread or several, and a weight split into pieces.
TEST(Matmul, ChunkLoadersEveryBlockType) {
  gpu::Context ctx(context_options([](auto& o) { o.rows_shape = "off"; }));
  const GgufType types[] = {Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, MXFP4};
  for (size_t i = 0; i < std::size(types); ++i) {
    const GgufType t = types[i];
    SCOPED_TRACE(type_name(t));
    const uint32_t block = block_elems(t);
    const MatmulCase cases[] = {
        {"chunks_odd_rows", t, 3 * std::max(block, 256u), 37, 1, i % 2 == 0, Matvec},
        {"chunks_split", t, 2 * block, 131, 1, i % 2 == 1, Matvec, 4 * tensor_bytes(t, 2 * block, 1) + 64},
    };
    for (const MatmulCase& c : cases) {
      size_t pieces = 0;
      EXPECT_TRUE(within_bound(run_matmul_scaled(ctx, c, 1000 + i, &pieces))) << c.name;
      if (c.max_piece_bytes) {
        EXPECT_GT(pieces, 1u) << c.name;
      }
    }
  }
}

// Shaders compile without naga's index clamps and loop bounds unless ContextOptions::shader_checks asks for them
// (WGLLM_SHADER_CHECKS=1): the kernels give the CPU reference's answers either way, through each product kernel.
TEST(Matmul, ShaderChecks) {
  for (const bool checks : {true, false}) {
    for (const char* rows : {"off", ""}) {
      SCOPED_TRACE(std::string(checks ? "checks " : "trusted ") + rows);
      gpu::Context ctx(context_options([&](auto& o) {
        o.shader_checks = checks;
        o.rows_shape = rows;
      }));
      for (const MatmulCase& c :
           {MatmulCase{"checks_q8_0_t1", Q8_0, 256, 37, 1, true}, MatmulCase{"checks_f16_t9", F16, 96, 70, 9}}) {
        EXPECT_TRUE(within_bound(run_matmul_scaled(ctx, c, 78))) << c.name;
      }
    }
  }
}

// The Rows kernel (matmul_rows.wgsl; CPU adapters take it for every product, so the tables above run it there in
// the default shape) in other shapes and, forced, on any adapter: 2 or 4 rows and 1..8 tokens per invocation, odd
// workgroups; the epilogue cases and the product cases of a few weight types (the default shape runs every type),
// dealt out over the shapes (lavapipe takes seconds to compile each pipeline). A token's sum does not depend on the
// tokens beside it: one token alone gives the same bits as within a batch.
TEST(Matmul, RowsShapes) {
  const char* shapes[] = {"8x2x3", "1x2x1"};
  const size_t n_shapes = std::size(shapes);
  auto few = [](GgufType t) { return t == F32 || t == Q8_0 || t == Q6_K; };
  for (size_t s = 0; s < n_shapes; ++s) {
    const char* shape = shapes[s];
    SCOPED_TRACE(shape);
    gpu::Context ctx(context_options([&](auto& o) { o.rows_shape = shape; }));
    size_t e = 0;
    for (EpilogueCase c : kEpilogueCases)
      if (few(c.type) && e++ % n_shapes == s) {
        c.impl = MatmulImpl::Rows;
        check_epilogue(ctx, c);
      }
    size_t i = 0;
    for (MatmulCase c : kMatmulCases)
      if (few(c.type) && i++ % n_shapes == s) {
        c.impl = MatmulImpl::Rows;
        EXPECT_TRUE(within_bound(run_matmul_scaled(ctx, c, 31))) << c.name;
      }
  }
  // token independence: token 5 of a 7-token product equals the same row alone
  auto& ctx = context();
  auto gen = rng(123);
  const uint32_t n_in = 96, n_out = 37, T = 7;
  const auto bytes = random_weight(Q8_0, n_in, n_out, gen);
  const auto w = kernels::upload_weight(ctx, Q8_0, n_in, n_out, bytes);
  const auto x = random_floats(size_t(T) * n_in, gen);
  auto xs = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  auto x5 = ctx.upload<float>(std::span(x).subspan(5 * n_in, n_in), WGPUBufferUsage_Storage, "x5");
  auto y = poisoned(ctx, size_t(T) * n_out, "y");
  auto y5 = poisoned(ctx, n_out, "y5");
  gpu::ComputeBatch batch(ctx, "rows tokens");
  kernels::encode_matmul(batch, ctx, w, xs, y, T, {.impl = MatmulImpl::Rows});
  kernels::encode_matmul(batch, ctx, w, x5, y5, 1, {.impl = MatmulImpl::Rows});
  batch.submit_and_wait();
  const auto all = ctx.read<float>(y), one = ctx.read<float>(y5);
  for (uint32_t o = 0; o < n_out; ++o) EXPECT_EQ(all[5 * n_out + o], one[o]) << "row " << o;

  EXPECT_THROW(kernels::parse_rows_config("16x4"), InvalidArgument);
  EXPECT_THROW(kernels::parse_rows_config("16x3x4"), InvalidArgument);
  EXPECT_THROW(kernels::parse_rows_config("12x4x4"), InvalidArgument);
  EXPECT_THROW(kernels::parse_rows_config("16x4x9"), InvalidArgument);
  EXPECT_THROW(kernels::parse_rows_config("16x4x0"), InvalidArgument);
  EXPECT_EQ(kernels::parse_rows_config("8x2x3").tokens, 3u);
}

TEST(Matmul, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto gen = rng(5);
  const auto bytes = random_weight(Q8_0, 64, 8, gen);
  const auto w = kernels::upload_weight(ctx, Q8_0, 64, 8, bytes);
  auto x = ctx.create_buffer(2 * 64 * 4, WGPUBufferUsage_Storage, "x");
  auto y = ctx.create_buffer(2 * 8 * 4, WGPUBufferUsage_Storage, "y");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  gpu::ComputeBatch batch(ctx);
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 0); }, "n_tokens");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, small, y, 2); }, "x holds");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, small, 2); }, "y holds");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, x, 1); }, "x and y");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, w, x, y, 2, {.bias = &small}); }, "bias");
  expect_throw([&] { kernels::encode_matmul(batch, ctx, kernels::GpuWeight{}, x, y, 2); }, "weight");
  expect_throw([&] { kernels::upload_weight(ctx, Q8_0, 48, 8, bytes); }, "ne0");
  expect_throw([&] { kernels::upload_weight(ctx, Q8_0, 64, 9, bytes); }, "bytes");
  expect_throw([&] { kernels::upload_weight(ctx, F32, 0, 9, bytes); }, "ne0");
  expect_throw([&] { kernels::upload_weight(ctx, F32, 64, 0, bytes); }, "ne1");
  expect_throw([&] { kernels::upload_weight(ctx, GgufType::IQ2_XXS, 256, 2, std::vector<uint8_t>(132)); },
               "type IQ2_XXS (id 16) is not one wgllm runs");
  expect_throw([&] { kernels::upload_weight(ctx, Q4_K, 128, 2, std::vector<uint8_t>(144)); }, "multiple of 256");
  expect_throw([&] { kernels::upload_weight(ctx, F32, 4096, 2, std::vector<uint8_t>(4096 * 8), "w", 1024); },
               "one row");
  expect_throw([&] { kernels::encode_embedding(batch, ctx, w, small, y, 5); }, "ids");
  expect_throw([&] { kernels::encode_embedding(batch, ctx, w, x, small, 2); }, "out");
}

}  // namespace
}  // namespace wgllm::test
