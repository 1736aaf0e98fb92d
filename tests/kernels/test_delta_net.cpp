// The gated DeltaNet kernels (delta_net.wgsl: delta_conv, delta_rule) vs cpu::conv_silu + cpu::normalize_qk and
// cpu::delta_rule (double precision), over shapes that hit the edges: one key head serving several value heads,
// head sizes below, at and between the workgroup's column block, a state carried across calls, rows of a batch.
#include <array>
#include <cmath>

#include "cpu/delta_net.h"
#include "kernel_test_util.h"
#include "kernels/delta_net.h"
#include "test_util.h"

namespace wgllm::test {
namespace {

struct Heads {
  uint32_t k_heads, v_heads, dk, dv;
  uint32_t width() const { return 2 * k_heads * dk + v_heads * dv; }
};

struct ConvCase {
  Heads h;
  uint32_t n, L, pos, R;
  uint32_t row = 0;
};

// The ring before the call holds random rows for positions pos-R+1 .. pos-1 (poison before position 0 and in the
// rows the call writes); c starts poisoned, and its rows before `row` must stay so.
TEST(DeltaNet, ConvMatchesCpuReferenceAndUpdatesTheRing) {
  auto& ctx = context();
  const ConvCase cases[] = {
      {{2, 4, 16, 16}, 1, 4, 0, 5},      {{2, 4, 16, 16}, 7, 4, 0, 11},    // the first tokens
      {{1, 2, 32, 32}, 1, 4, 40, 5},     {{2, 2, 32, 32}, 33, 3, 90, 36},  // decode with a wrapped ring; chunk
      {{4, 8, 128, 128}, 5, 4, 1000, 9}, {{3, 6, 24, 40}, 9, 2, 3, 12},    // real sizes; dk != dv, odd
      {{2, 2, 256, 256}, 2, 4, 7, 6},    {{1, 3, 8, 100}, 6, 5, 17, 11},   // the largest heads; 3 v per k
      {{2, 4, 16, 16}, 1, 4, 12, 5, 3},  {{1, 2, 32, 32}, 2, 3, 2, 4, 1},  // rows of a batch of sequences
  };
  for (const ConvCase& c : cases) {
    const uint32_t W = c.h.width();
    SCOPED_TRACE("K " + std::to_string(c.h.k_heads) + " H " + std::to_string(c.h.v_heads) + " dk " +
                 std::to_string(c.h.dk) + " dv " + std::to_string(c.h.dv) + " n " + std::to_string(c.n) + " L " +
                 std::to_string(c.L) + " pos " + std::to_string(c.pos) + " row " + std::to_string(c.row));
    auto gen = rng(c.n * 7919 + W + c.pos);
    const auto x = random_floats(size_t(c.n) * W, gen, -2.f, 2.f);
    const auto taps = random_floats(size_t(W) * c.L, gen, -1.f, 1.f);
    std::vector<float> ring(size_t(c.R) * W, std::nanf(""));
    std::vector<float> prev(size_t(c.L - 1) * W, 0.f);
    for (int64_t q = int64_t(c.pos) - c.R + 1; q < int64_t(c.pos); ++q) {
      if (q < 0) continue;
      const auto row = random_floats(W, gen, -3.f, 3.f);
      std::copy(row.begin(), row.end(), ring.begin() + (q % c.R) * W);
      if (const int64_t j = q - (int64_t(c.pos) - (c.L - 1)); j >= 0)
        std::copy(row.begin(), row.end(), prev.begin() + j * W);
    }
    const std::vector<float> ring_before = ring;
    auto want = cpu::conv_silu(x, taps, prev, c.n, W, c.L);
    const float eps = 1e-6f;
    cpu::normalize_qk(want, c.n, W, c.h.k_heads, c.h.dk, eps);

    std::vector<float> x_rows(size_t(c.row) * W, std::nanf(""));
    x_rows.insert(x_rows.end(), x.begin(), x.end());
    auto b_x = ctx.upload<float>(x_rows, WGPUBufferUsage_Storage, "x");
    auto b_taps = ctx.upload<float>(taps, WGPUBufferUsage_Storage, "taps");
    auto b_ring = ctx.upload<float>(ring, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "ring");
    auto b_c = poisoned(ctx, size_t(c.row + c.n) * W, "c");
    gpu::ComputeBatch batch(ctx);
    const kernels::DeltaShape shape{
        .n_tokens = c.n, .k_heads = c.h.k_heads, .v_heads = c.h.v_heads, .dk = c.h.dk, .dv = c.h.dv, .row = c.row};
    kernels::encode_delta_conv(batch, ctx, shape, c.L, c.pos, c.R, eps, b_x, b_taps, b_ring, b_c);
    batch.submit_and_wait();
    const auto c_rows = ctx.read<float>(b_c);
    for (size_t i = 0; i < size_t(c.row) * W; ++i) ASSERT_TRUE(std::isnan(c_rows[i])) << "c element " << i;
    const std::vector<float> got(c_rows.begin() + size_t(c.row) * W, c_rows.end());
    const auto r = compare(got, want);
    EXPECT_LE(r.rel_l2, 1e-6) << r.describe();
    // every normalised head has length 1 (q: 1 / sqrt(dk))
    for (uint32_t head = 0; head < 2 * c.h.k_heads; ++head) {
      double ss = 0;
      for (uint32_t j = 0; j < c.h.dk; ++j) ss += double(got[head * c.h.dk + j]) * got[head * c.h.dk + j];
      EXPECT_NEAR(ss, head < c.h.k_heads ? 1.0 / c.h.dk : 1.0, 1e-5) << "head " << head;
    }
    // The ring: the x rows of the last L - 1 positions (which the next call reads), from this call's x or, for
    // positions before pos, as they were; with R >= n + L - 1 every token's row was stored (in the one dispatch),
    // and every row no token of the call lands on is as it was.
    const auto ring_after = ctx.read<float>(b_ring);
    const bool all_stored = c.n + c.L - 1 <= c.R;
    for (int64_t q = int64_t(c.pos) + c.n - (c.L - 1); q < int64_t(c.pos) + c.n; ++q) {
      if (q < 0) continue;
      for (uint32_t ch = 0; ch < W; ++ch) {
        const float g = ring_after[size_t(q % c.R) * W + ch];
        const float w = q >= int64_t(c.pos) ? x[size_t(q - c.pos) * W + ch] : ring_before[size_t(q % c.R) * W + ch];
        ASSERT_EQ(g, w) << "position " << q << " channel " << ch;
      }
    }
    for (uint32_t row = 0; row < c.R && all_stored; ++row) {
      const int64_t t = ((int64_t(row) - c.pos) % c.R + c.R) % c.R;
      for (uint32_t ch = 0; ch < W; ++ch) {
        const float g = ring_after[size_t(row) * W + ch];
        const float w = t < c.n ? x[size_t(t) * W + ch] : ring_before[size_t(row) * W + ch];
        ASSERT_TRUE(g == w || (std::isnan(g) && std::isnan(w))) << "row " << row << " channel " << ch;
      }
    }
  }
}

struct RuleCase {
  Heads h;
  std::vector<uint32_t> chunks;  // tokens per call, the state carried between them
  bool stacked_gates = false;    // alpha and beta in one [n][2H] buffer
  uint32_t row = 0;
  bool fresh = false;  // the first call starts from zeros (position 0), whatever the buffer holds
};

// qkv: random q and k heads normalised as delta_conv leaves them, random v; alpha and beta spread so the decays run
// from forgetting almost everything to keeping almost everything (and softplus's linear branch past 20); a random
// initial state. The outputs of every call and the final state against the reference's, for both ways of running
// the recurrence: token by token (delta_rule) and in chunks of kDeltaChunk (delta_chunk: calls of 1 to 3 chunks and
// a part, chunk boundaries inside and across calls).
class DeltaRule : public ::testing::TestWithParam<kernels::DeltaRuleImpl> {};

TEST_P(DeltaRule, MatchesCpuReferenceAcrossCalls) {
  auto& ctx = context();
  const kernels::DeltaRuleImpl impl = GetParam();
  // measured worst: 4.0e-7 token by token; in chunks 3.3e-6 over 150 seeds and 5.1e-6 for one seen in CI
  // (8435218202598197256): the rounding of T = (I + A)^-1, whose forward substitution amplifies it where the gates
  // and the k products are near 1, and of the products
  const double tol = impl == kernels::DeltaRuleImpl::Chunked ? 1e-5 : 2e-6;
  const RuleCase cases[] = {
      {{2, 4, 16, 16}, {1}},
      {{2, 4, 16, 16}, {7, 1, 1}, true},  // decode; a chunk then steps
      {{2, 2, 32, 32}, {64}},
      {{2, 2, 32, 32}, {5, 31}, true},   // a long chunk; uneven chunks
      {{4, 8, 128, 128}, {3, 1}, true},  // Qwen 3.5's head size
      {{1, 3, 24, 100}, {4, 2}},
      {{1, 3, 200, 40}, {3}},  // dv past a block; KPT not whole
      {{2, 4, 16, 16}, {1}, false, 5},
      {{2, 2, 32, 32}, {2}, true, 3},  // rows of a batch
      {{2, 4, 16, 16}, {6, 1}, false, 0, true},
      {{4, 8, 128, 128}, {1, 1}, true, 2, true},  // from position 0
      {{2, 4, 16, 16}, {40}},                     // chunks of 16, 16, 8
      {{4, 8, 128, 128}, {37, 16, 1}, true},      // Qwen 3.5's heads: a chunk's rows across calls
      {{1, 3, 200, 40}, {33}, false, 4},          // dk past 128: 8 columns per workgroup
      {{1, 3, 24, 100}, {50}, false, 3, true},    // from position 0, rows of a batch
      {{2, 2, 32, 32}, {kernels::kDeltaChunk}},   // exactly one chunk
  };
  if (impl == kernels::DeltaRuleImpl::Chunked)
    for (const RuleCase& c : cases)
      if (!kernels::delta_chunk_supported(ctx, {.n_tokens = 1, .k_heads = c.h.k_heads, .v_heads = c.h.v_heads,
                                                .dk = c.h.dk, .dv = c.h.dv}))
        GTEST_SKIP() << "the adapter's workgroup memory is too small for delta_chunk";
  for (const RuleCase& c : cases) {
    const Heads& h = c.h;
    const uint32_t W = h.width(), H = h.v_heads;
    uint32_t total = 0;
    for (uint32_t n : c.chunks) total += n;
    SCOPED_TRACE("K " + std::to_string(h.k_heads) + " H " + std::to_string(H) + " dk " + std::to_string(h.dk) + " dv " +
                 std::to_string(h.dv) + " tokens " + std::to_string(total) + " row " + std::to_string(c.row));
    auto gen = rng(total * 131 + W + c.row);
    auto qkv = random_floats(size_t(total) * W, gen, -1.f, 1.f);
    cpu::normalize_qk(qkv, total, W, h.k_heads, h.dk, 1e-6f);
    auto alpha = random_floats(size_t(total) * H, gen, -4.f, 3.f);
    const auto beta = random_floats(size_t(total) * H, gen, -4.f, 4.f);
    alpha[0] = 25.f;  // softplus(x) = x
    auto dt_bias = random_floats(H, gen, -1.f, 1.f);
    auto a = random_floats(H, gen, -3.f, -0.05f);
    std::vector<float> consts = dt_bias;
    consts.insert(consts.end(), a.begin(), a.end());
    const auto state0 = random_floats(size_t(H) * h.dk * h.dv, gen, -0.5f, 0.5f);
    std::vector<double> state(state0.begin(), state0.end());
    if (c.fresh) std::fill(state.begin(), state.end(), 0.0);

    // two state buffers, each call reading one and writing the other; the one read must stay as it was
    std::array<gpu::Buffer, 2> b_state{
        ctx.upload<float>(state0, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "state 0"),
        poisoned(ctx, state0.size(), "state 1")};
    uint32_t cur = 0;
    auto b_consts = ctx.upload<float>(consts, WGPUBufferUsage_Storage, "consts");
    uint32_t done = 0;
    for (uint32_t n : c.chunks) {
      const size_t first = done;
      auto part = [&](const std::vector<float>& v, size_t width) {
        std::vector<float> rows(size_t(c.row) * width, std::nanf(""));
        rows.insert(rows.end(), v.begin() + first * width, v.begin() + (first + n) * width);
        return rows;
      };
      const cpu::DeltaRuleRef ref{.n_tokens = n, .k_heads = h.k_heads, .v_heads = H, .dk = h.dk, .dv = h.dv};
      const auto sub = [&](const std::vector<float>& v, size_t width) {
        return std::vector<float>(v.begin() + first * width, v.begin() + (first + n) * width);
      };
      const auto want = cpu::delta_rule(ref, sub(qkv, W), sub(alpha, H), sub(beta, H), dt_bias, a, state);

      auto b_qkv = ctx.upload<float>(part(qkv, W), WGPUBufferUsage_Storage, "qkv");
      gpu::Buffer b_alpha, b_beta;
      kernels::DeltaGates gates;
      if (c.stacked_gates) {
        std::vector<float> ab;
        for (size_t t = 0; t < n; ++t) {
          ab.insert(ab.end(), alpha.begin() + (first + t) * H, alpha.begin() + (first + t + 1) * H);
          ab.insert(ab.end(), beta.begin() + (first + t) * H, beta.begin() + (first + t + 1) * H);
        }
        std::vector<float> rows(size_t(c.row) * 2 * H, std::nanf(""));
        rows.insert(rows.end(), ab.begin(), ab.end());
        b_alpha = ctx.upload<float>(rows, WGPUBufferUsage_Storage, "ab");
        gates = {.alpha = &b_alpha, .beta = &b_alpha, .stride = 2 * H, .beta_offset = H};
      } else {
        b_alpha = ctx.upload<float>(part(alpha, H), WGPUBufferUsage_Storage, "alpha");
        b_beta = ctx.upload<float>(part(beta, H), WGPUBufferUsage_Storage, "beta");
        gates = {.alpha = &b_alpha, .beta = &b_beta, .stride = H, .beta_offset = 0};
      }
      auto b_o = poisoned(ctx, size_t(c.row + n) * H * h.dv, "o");
      const std::vector<float> state_before = ctx.read<float>(b_state[cur]);
      gpu::ComputeBatch batch(ctx);
      const kernels::DeltaShape shape{
          .n_tokens = n, .k_heads = h.k_heads, .v_heads = H, .dk = h.dk, .dv = h.dv, .row = c.row};
      auto b_tm = poisoned(ctx, kernels::delta_chunk_scratch_bytes(shape) / 4, "chunk scratch");
      kernels::encode_delta_rule(batch, ctx, shape, b_qkv, gates, b_consts, b_state[cur], b_state[1 - cur], b_o,
                                 c.fresh && done == 0, impl, &b_tm);
      batch.submit_and_wait();
      ASSERT_EQ(ctx.read<float>(b_state[cur]), state_before) << "the state read was changed";
      cur = 1 - cur;
      const auto o_rows = ctx.read<float>(b_o);
      for (size_t i = 0; i < size_t(c.row) * H * h.dv; ++i) ASSERT_TRUE(std::isnan(o_rows[i])) << "o element " << i;
      const std::vector<float> got(o_rows.begin() + size_t(c.row) * H * h.dv, o_rows.end());
      const auto r = compare(got, want);
      EXPECT_LE(r.rel_l2, tol) << "call at token " << first << ": " << r.describe();
      done += n;
    }
    const auto got_state = ctx.read<float>(b_state[cur]);
    const std::vector<float> want_state(state.begin(), state.end());
    const auto r = compare(got_state, want_state);
    EXPECT_LE(r.rel_l2, tol) << "state: " << r.describe();
  }
}

INSTANTIATE_TEST_SUITE_P(Impls, DeltaRule,
                         ::testing::Values(kernels::DeltaRuleImpl::Sequential, kernels::DeltaRuleImpl::Chunked),
                         [](const auto& info) {
                           return info.param == kernels::DeltaRuleImpl::Chunked ? "chunked" : "sequential";
                         });

// The chunked (WY / UT) form of the rule, the algebra a chunked prefill kernel is to follow, against the token-by-token
// reference on the CPU: the same outputs and final state in double for chunks of 1 token, of a few, of more than the
// sequence, and with decays from forgetting almost everything to keeping almost everything.
TEST(DeltaNet, ChunkedRuleEqualsTheSequentialOne) {
  for (const Heads& h : {Heads{2, 4, 16, 8}, Heads{1, 3, 24, 40}, Heads{2, 2, 32, 32}}) {
    const uint32_t W = h.width(), H = h.v_heads, n = 37;
    SCOPED_TRACE("H " + std::to_string(H) + " dk " + std::to_string(h.dk) + " dv " + std::to_string(h.dv));
    auto gen = rng(W * 7 + H);
    auto qkv = random_floats(size_t(n) * W, gen, -1.f, 1.f);
    cpu::normalize_qk(qkv, n, W, h.k_heads, h.dk, 1e-6f);
    auto alpha = random_floats(size_t(n) * H, gen, -4.f, 3.f);
    const auto beta = random_floats(size_t(n) * H, gen, -4.f, 4.f);
    alpha[0] = 25.f;  // softplus(x) = x
    const auto dt_bias = random_floats(H, gen, -1.f, 1.f);
    const auto a = random_floats(H, gen, -3.f, -0.05f);
    const auto state0 = random_floats(size_t(H) * h.dk * h.dv, gen, -0.5f, 0.5f);
    const cpu::DeltaRuleRef ref{.n_tokens = n, .k_heads = h.k_heads, .v_heads = H, .dk = h.dk, .dv = h.dv};
    std::vector<double> want_state(state0.begin(), state0.end());
    const auto want = cpu::delta_rule(ref, qkv, alpha, beta, dt_bias, a, want_state);
    for (uint32_t chunk : {1u, 4u, 16u, 64u}) {
      SCOPED_TRACE("chunk " + std::to_string(chunk));
      std::vector<double> state(state0.begin(), state0.end());
      const auto got = cpu::delta_rule_chunked(ref, qkv, alpha, beta, dt_bias, a, state, chunk);
      ASSERT_EQ(got.size(), want.size());
      double worst = 0, worst_state = 0;
      for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]));
      for (size_t i = 0; i < state.size(); ++i) worst_state = std::max(worst_state, std::abs(state[i] - want_state[i]));
      // the outputs are floats (one rounding each); the states doubles
      EXPECT_LE(worst, 1e-6);
      EXPECT_LE(worst_state, 1e-12);
    }
  }
  std::vector<double> state(4 * 16 * 8);
  const std::vector<float> qkv(2 * 2 * 16 + 4 * 8), four(4);
  EXPECT_THROW(cpu::delta_rule_chunked({.n_tokens = 1, .k_heads = 2, .v_heads = 4, .dk = 16, .dv = 8}, qkv, four,
                                       four, four, four, state, 0),
               InvalidArgument);
}

// delta_step (a decode step in one dispatch) against the references of both halves: the output, the state written to
// the other buffer (the one read unchanged) and the ring row of the position stored, over head shapes, positions
// before and after the ring wraps, position 0 (fresh), rows of a batch, stacked and separate gates; and
// delta_step_norm, the same with the output's gated per-head norm (every shape here fits it).
TEST(DeltaNet, StepMatchesConvThenRule) {
  auto& ctx = context();
  if (!kernels::delta_step_supported(ctx)) GTEST_SKIP() << "fewer than 9 storage buffers per stage";
  struct StepCase {
    Heads h;
    uint32_t L, pos, row;
    bool stacked;
  };
  const StepCase cases[] = {
      {{2, 4, 16, 16}, 4, 0, 0, true},   {{2, 4, 16, 16}, 4, 2, 1, false}, {{1, 2, 32, 32}, 3, 40, 0, true},
      {{4, 8, 128, 128}, 4, 9, 2, true}, {{3, 6, 24, 40}, 2, 5, 0, false}, {{1, 3, 8, 100}, 5, 17, 1, true},
  };
  for (const StepCase& c : cases) {
    const Heads& h = c.h;
    const uint32_t W = h.width(), H = h.v_heads, R = c.L;
    SCOPED_TRACE("K " + std::to_string(h.k_heads) + " H " + std::to_string(H) + " dk " + std::to_string(h.dk) + " dv " +
                 std::to_string(h.dv) + " L " + std::to_string(c.L) + " pos " + std::to_string(c.pos));
    auto gen = rng(W * 31 + c.pos + c.row);
    const auto x = random_floats(W, gen, -2.f, 2.f);
    const auto taps = random_floats(size_t(W) * c.L, gen, -1.f, 1.f);
    std::vector<float> ring(size_t(R) * W, std::nanf(""));
    std::vector<float> prev(size_t(c.L - 1) * W, 0.f);
    for (int64_t q = int64_t(c.pos) - (c.L - 1); q < int64_t(c.pos); ++q) {
      if (q < 0) continue;
      const auto row = random_floats(W, gen, -3.f, 3.f);
      std::copy(row.begin(), row.end(), ring.begin() + (q % R) * W);
      std::copy(row.begin(), row.end(), prev.begin() + (q - (int64_t(c.pos) - (c.L - 1))) * W);
    }
    const auto alpha = random_floats(H, gen, -4.f, 3.f), beta = random_floats(H, gen, -4.f, 4.f);
    const auto dt_bias = random_floats(H, gen, -1.f, 1.f), a = random_floats(H, gen, -3.f, -0.05f);
    std::vector<float> consts = dt_bias;
    consts.insert(consts.end(), a.begin(), a.end());
    const auto state0 = random_floats(size_t(H) * h.dk * h.dv, gen, -0.5f, 0.5f);
    std::vector<double> state(state0.begin(), state0.end());
    if (c.pos == 0) std::fill(state.begin(), state.end(), 0.0);
    auto qkv = cpu::conv_silu(x, taps, prev, 1, W, c.L);
    cpu::normalize_qk(qkv, 1, W, h.k_heads, h.dk, 1e-6f);
    const cpu::DeltaRuleRef ref{.n_tokens = 1, .k_heads = h.k_heads, .v_heads = H, .dk = h.dk, .dv = h.dv};
    const auto want = cpu::delta_rule(ref, qkv, alpha, beta, dt_bias, a, state);

    // the gated output norm of delta_step_norm, in double from the rule's output
    const auto z = random_floats(size_t(H) * h.dv, gen, -3.f, 3.f), norm_w = random_floats(h.dv, gen, 0.5f, 1.5f);
    std::vector<float> want_y(want.size());
    for (uint32_t hd = 0; hd < H; ++hd) {
      double ss = 0;
      for (uint32_t v = 0; v < h.dv; ++v) ss += double(want[hd * h.dv + v]) * want[hd * h.dv + v];
      const double inv = 1 / std::sqrt(ss / h.dv + 1e-6);
      for (uint32_t v = 0; v < h.dv; ++v) {
        const size_t i = hd * h.dv + v;
        want_y[i] = float(want[i] * inv * norm_w[v] * (z[i] / (1 + std::exp(-double(z[i])))));
      }
    }
    auto rows = [&](const std::vector<float>& v) {
      std::vector<float> r(size_t(c.row) * v.size(), std::nanf(""));
      r.insert(r.end(), v.begin(), v.end());
      return r;
    };
    for (const bool with_norm : {false, true}) {
      SCOPED_TRACE(with_norm ? "delta_step_norm" : "delta_step");
      if (with_norm && ctx.limits().maxStorageBuffersPerShaderStage < 11) continue;
      if (with_norm) {
        ASSERT_TRUE(kernels::delta_step_norm_supported(
            ctx, {.n_tokens = 1, .k_heads = h.k_heads, .v_heads = H, .dk = h.dk, .dv = h.dv}));
      }
      auto b_z = ctx.upload<float>(rows(z), WGPUBufferUsage_Storage, "z");
      auto b_norm = ctx.upload<float>(norm_w, WGPUBufferUsage_Storage, "norm");
      const kernels::DeltaOutputNorm norm{.weight = &b_norm, .z = &b_z, .eps = 1e-6f};
      auto b_x = ctx.upload<float>(rows(x), WGPUBufferUsage_Storage, "x");
      auto b_taps = ctx.upload<float>(taps, WGPUBufferUsage_Storage, "taps");
      auto b_ring = ctx.upload<float>(ring, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "ring");
      auto b_consts = ctx.upload<float>(consts, WGPUBufferUsage_Storage, "consts");
      auto b_state = ctx.upload<float>(state0, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "state");
      auto b_out = poisoned(ctx, state0.size(), "state out");
      auto b_o = poisoned(ctx, size_t(c.row + 1) * H * h.dv, "o");
      std::vector<float> ab = alpha;
      ab.insert(ab.end(), beta.begin(), beta.end());
      auto b_ab = ctx.upload<float>(rows(ab), WGPUBufferUsage_Storage, "ab");
      auto b_alpha = ctx.upload<float>(rows(alpha), WGPUBufferUsage_Storage, "alpha");
      auto b_beta = ctx.upload<float>(rows(beta), WGPUBufferUsage_Storage, "beta");
      const kernels::DeltaGates gates =
          c.stacked ? kernels::DeltaGates{&b_ab, &b_ab, 2 * H, H} : kernels::DeltaGates{&b_alpha, &b_beta, H, 0};
      gpu::ComputeBatch batch(ctx);
      const kernels::DeltaShape shape{
          .n_tokens = 1, .k_heads = h.k_heads, .v_heads = H, .dk = h.dk, .dv = h.dv, .row = c.row};
      kernels::encode_delta_step(batch, ctx, shape, c.L, c.pos, R, 1e-6f, b_x, b_taps, b_ring, gates, b_consts, b_state,
                                 b_out, b_o, c.pos == 0, with_norm ? &norm : nullptr);
      batch.submit_and_wait();
      const auto o_rows = ctx.read<float>(b_o);
      const std::vector<float> got(o_rows.begin() + size_t(c.row) * H * h.dv, o_rows.end());
      const std::vector<float>& want_o = with_norm ? want_y : want;
      EXPECT_LE(compare(got, want_o).rel_l2, 4e-6) << compare(got, want_o).describe();
      const std::vector<float> want_state(state.begin(), state.end());
      EXPECT_LE(compare(ctx.read<float>(b_out), want_state).rel_l2, 2e-6);
      EXPECT_EQ(ctx.read<float>(b_state), state0) << "the state read was changed";
      const auto ring_after = ctx.read<float>(b_ring);
      for (uint32_t row = 0; row < R; ++row)
        for (uint32_t ch = 0; ch < W; ++ch) {
          const float g = ring_after[size_t(row) * W + ch];
          const float w = row == c.pos % R ? x[ch] : ring[size_t(row) * W + ch];
          ASSERT_TRUE(g == w || (std::isnan(g) && std::isnan(w))) << "ring row " << row << " channel " << ch;
        }
    }
  }
}

// A decode step of several sequences whose rings and states lie in pools (continuous batching): delta_step_rows
// against delta_step on each sequence's own buffers, and delta_step on the pools at each sequence's offsets: the same
// bits of o, of the states after and of the rings; the states before untouched. Three sequences, one at position 0
// (from zeros whatever its state holds), in pool slots out of order.
TEST(DeltaNet, StepRowsOfPoolsAsIfAlone) {
  auto& ctx = context();
  const Heads heads[] = {{2, 4, 16, 16}, {1, 3, 8, 100}};
  for (const Heads& h : heads) {
    for (const bool with_norm : {false, true}) {
      const uint32_t W = h.width(), H = h.v_heads, L = 4, R = L, S = 3;
      const kernels::DeltaShape one{.n_tokens = 1, .k_heads = h.k_heads, .v_heads = H, .dk = h.dk, .dv = h.dv};
      if (!kernels::delta_step_rows_supported(
              ctx, {.n_tokens = S, .k_heads = h.k_heads, .v_heads = H, .dk = h.dk, .dv = h.dv}, with_norm))
        continue;
      SCOPED_TRACE("dk " + std::to_string(h.dk) + " dv " + std::to_string(h.dv) + (with_norm ? ", norm" : ""));
      const uint32_t positions[S] = {5, 0, 2}, slots[S] = {2, 0, 1};
      const uint64_t ring_floats = uint64_t(R) * W, state_floats = uint64_t(H) * h.dk * h.dv;
      auto gen = rng(W + (with_norm ? 1 : 0));
      const auto x = random_floats(size_t(S) * W, gen, -2.f, 2.f);
      const auto taps = random_floats(size_t(W) * L, gen, -1.f, 1.f);
      const auto ab = random_floats(size_t(S) * 2 * H, gen, -3.f, 3.f);
      const auto z = random_floats(size_t(S) * H * h.dv, gen, -3.f, 3.f);
      const auto norm_w = random_floats(h.dv, gen, 0.5f, 1.5f);
      std::vector<float> consts = random_floats(H, gen, -1.f, 1.f);
      for (const float a : random_floats(H, gen, -3.f, -0.05f)) consts.push_back(a);
      const auto rings = random_floats(S * ring_floats, gen, -3.f, 3.f);
      const auto states = random_floats(S * 2 * state_floats, gen, -0.5f, 0.5f);
      auto up = [&](const std::vector<float>& v, const char* label) {
        return ctx.upload<float>(v, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, label);
      };
      auto b_x = up(x, "x"), b_taps = up(taps, "taps"), b_ab = up(ab, "ab"), b_z = up(z, "z"),
           b_norm = up(norm_w, "norm"), b_consts = up(consts, "consts");
      const kernels::DeltaGates gates{&b_ab, &b_ab, 2 * H, H};
      const kernels::DeltaOutputNorm norm{.weight = &b_norm, .z = &b_z, .eps = 1e-6f};
      const kernels::DeltaOutputNorm* n = with_norm ? &norm : nullptr;
      // the pools (rows, and the lone calls at offsets) and each sequence's own buffers
      auto rows_rings = up(rings, "rows rings"), rows_states = up(states, "rows states");
      auto lone_rings = up(rings, "lone rings"), lone_states = up(states, "lone states");
      auto o_rows = poisoned(ctx, size_t(S) * H * h.dv, "o rows"),
           o_lone = poisoned(ctx, size_t(S) * H * h.dv, "o lone");
      auto o_own = poisoned(ctx, size_t(S) * H * h.dv, "o own");
      std::vector<gpu::Buffer> own_ring, own_state, own_out;
      std::vector<uint32_t> steps;
      gpu::ComputeBatch batch(ctx);
      for (uint32_t i = 0; i < S; ++i) {
        const uint64_t ring_at = slots[i] * ring_floats, in_at = (slots[i] * 2 + positions[i] % 2) * state_floats,
                       out_at = (slots[i] * 2 + (positions[i] + 1) % 2) * state_floats;
        steps.insert(steps.end(), {positions[i], uint32_t(ring_at), uint32_t(in_at), uint32_t(out_at)});
        own_ring.push_back(up({rings.begin() + ring_at, rings.begin() + ring_at + ring_floats}, "own ring"));
        own_state.push_back(up({states.begin() + in_at, states.begin() + in_at + state_floats}, "own state"));
        own_out.push_back(poisoned(ctx, state_floats, "own state out"));
        kernels::DeltaShape at = one;
        at.row = i;
        kernels::encode_delta_step(batch, ctx, at, L, positions[i], R, 1e-6f, b_x, b_taps, own_ring[i], gates, b_consts,
                                   own_state[i], own_out[i], o_own, positions[i] == 0, n);
        at.ring_at = ring_at * 4;
        at.state_at = in_at * 4;
        at.state_out_at = out_at * 4;
        kernels::encode_delta_step(batch, ctx, at, L, positions[i], R, 1e-6f, b_x, b_taps, lone_rings, gates, b_consts,
                                   lone_states, lone_states, o_lone, positions[i] == 0, n);
      }
      auto b_steps = ctx.upload<uint32_t>(steps, WGPUBufferUsage_Storage, "steps");
      kernels::DeltaShape all = one;
      all.n_tokens = S;
      kernels::encode_delta_step_rows(batch, ctx, all, L, R, 1e-6f, b_x, b_taps, rows_rings, gates, b_consts,
                                      rows_states, b_steps, o_rows, n);
      batch.submit_and_wait();
      const auto want_o = ctx.read<float>(o_own);
      for (float v : want_o) ASSERT_TRUE(std::isfinite(v));
      EXPECT_EQ(ctx.read<float>(o_rows), want_o) << "o: the rows' bits are not the lone steps'";
      EXPECT_EQ(ctx.read<float>(o_lone), want_o) << "o: the steps at pool offsets are not the own buffers'";
      const auto got_states = ctx.read<float>(rows_states), got_rings = ctx.read<float>(rows_rings);
      EXPECT_EQ(ctx.read<float>(lone_states), got_states);
      EXPECT_EQ(ctx.read<float>(lone_rings), got_rings);
      for (uint32_t i = 0; i < S; ++i) {
        const uint64_t ring_at = steps[i * 4 + 1], in_at = steps[i * 4 + 2], out_at = steps[i * 4 + 3];
        EXPECT_EQ(std::vector<float>(got_states.begin() + out_at, got_states.begin() + out_at + state_floats),
                  ctx.read<float>(own_out[i]))
            << "sequence " << i << ": the state after";
        EXPECT_EQ(std::vector<float>(got_states.begin() + in_at, got_states.begin() + in_at + state_floats),
                  std::vector<float>(states.begin() + in_at, states.begin() + in_at + state_floats))
            << "sequence " << i << ": the state before changed";
        EXPECT_EQ(std::vector<float>(got_rings.begin() + ring_at, got_rings.begin() + ring_at + ring_floats),
                  ctx.read<float>(own_ring[i]))
            << "sequence " << i << ": the ring";
      }
    }
  }
}

TEST(DeltaNet, BadArgumentsThrowNamingTheField) {
  auto& ctx = context();
  auto buf = ctx.create_buffer(1 << 16, WGPUBufferUsage_Storage, "buf");
  auto other = ctx.create_buffer(1 << 16, WGPUBufferUsage_Storage, "other");
  auto ring = ctx.create_buffer(1 << 16, WGPUBufferUsage_Storage, "ring");
  auto state = ctx.create_buffer(1 << 16, WGPUBufferUsage_Storage, "state");
  auto small = ctx.create_buffer(16, WGPUBufferUsage_Storage, "small");
  const kernels::DeltaShape ok{.n_tokens = 4, .k_heads = 2, .v_heads = 4, .dk = 16, .dv = 16};
  auto with = [&](auto edit) {
    kernels::DeltaShape s = ok;
    edit(s);
    return s;
  };
  gpu::ComputeBatch batch(ctx);
  auto conv = [&](const kernels::DeltaShape& s, uint32_t taps, uint32_t R, const gpu::Buffer& x, const gpu::Buffer& t,
                  const gpu::Buffer& rg,
                  const gpu::Buffer& c) { kernels::encode_delta_conv(batch, ctx, s, taps, 9, R, 1e-6f, x, t, rg, c); };
  expect_throw([&] { conv(with([](auto& s) { s.n_tokens = 0; }), 4, 8, buf, other, ring, state); }, "n_tokens must");
  expect_throw([&] { conv(with([](auto& s) { s.v_heads = 3; }), 4, 8, buf, other, ring, state); },
               "v_heads 3 must be a non-zero multiple of k_heads 2");
  expect_throw([&] { conv(with([](auto& s) { s.dk = 257; }), 4, 8, buf, other, ring, state); },
               "head dimensions dk 257");
  expect_throw([&] { conv(ok, 1, 8, buf, other, ring, state); }, "taps must");
  expect_throw([&] { conv(ok, 4, 3, buf, other, ring, state); }, "ring_rows 3 < taps 4");
  expect_throw([&] { conv(ok, 4, 8, small, other, ring, state); }, "x holds");
  expect_throw([&] { conv(ok, 4, 8, buf, small, ring, state); }, "taps holds");
  expect_throw([&] { conv(ok, 4, 8, buf, other, small, state); }, "ring holds");
  expect_throw([&] { conv(ok, 4, 8, buf, other, ring, small); }, "c holds");
  expect_throw([&] { conv(ok, 4, 8, buf, other, ring, buf); }, "different buffers");

  const kernels::DeltaGates gates{.alpha = &other, .beta = &other, .stride = 8, .beta_offset = 4};
  auto out = ctx.create_buffer(1 << 16, WGPUBufferUsage_Storage, "state out");
  auto rule = [&](const kernels::DeltaShape& s, const kernels::DeltaGates& g, const gpu::Buffer& c,
                  const gpu::Buffer& k, const gpu::Buffer& st,
                  const gpu::Buffer& o) { kernels::encode_delta_rule(batch, ctx, s, c, g, k, st, out, o); };
  expect_throw([&] { rule(ok, {.alpha = &other, .beta = nullptr, .stride = 4}, buf, other, state, ring); },
               "alpha and beta are required");
  expect_throw(
      [&] { rule(ok, {.alpha = &other, .beta = &other, .stride = 8, .beta_offset = 5}, buf, other, state, ring); },
      "stride 8 and beta_offset 5 do not hold 4 heads");
  expect_throw([&] { rule(ok, gates, small, other, state, ring); }, "c holds");
  expect_throw([&] { rule(ok, {.alpha = &small, .beta = &other, .stride = 4}, buf, other, state, ring); },
               "alpha holds");
  expect_throw([&] { rule(ok, gates, buf, small, state, ring); }, "consts holds");
  expect_throw([&] { rule(ok, gates, buf, other, small, ring); }, "state holds");
  expect_throw([&] { rule(ok, gates, buf, other, state, small); }, "o holds");
  expect_throw([&] { rule(ok, gates, buf, other, state, out); }, "state_out and o must be different buffers");
  expect_throw([&] { rule(ok, gates, buf, other, out, ring); }, "state_at 0 and state_out_at 0 overlap in one buffer");
  // one buffer for both states where their ranges are apart (a pool's); offsets of whole elements
  const uint64_t state_bytes = 4ull * 16 * 16 * 4;
  EXPECT_NO_THROW(rule(with([&](auto& s) { s.state_out_at = state_bytes; }), gates, buf, other, out, ring));
  expect_throw([&] { rule(with([&](auto& s) { s.state_out_at = state_bytes - 4; }), gates, buf, other, out, ring); },
               "overlap in one buffer");
  expect_throw([&] { rule(with([](auto& s) { s.state_at = 6; }), gates, buf, other, state, ring); },
               "state_at 6 must be a multiple of 4");
  expect_throw([&] { rule(with([](auto& s) { s.state_at = (1 << 16) - 4; }), gates, buf, other, state, ring); },
               "state holds");
  expect_throw([&] { rule(ok, gates, buf, other, state, buf); }, "state_out and o must differ from the inputs");
  expect_throw([&] { kernels::encode_delta_rule(batch, ctx, ok, buf, gates, other, state, small, ring); },
               "state_out holds");
  // the chunked rule's scratch: required, large enough, a buffer of its own
  auto chunked = [&](const gpu::Buffer* scratch) {
    kernels::encode_delta_rule(batch, ctx, ok, buf, gates, other, state, out, ring, false,
                               kernels::DeltaRuleImpl::Chunked, scratch);
  };
  if (kernels::delta_chunk_supported(ctx, ok)) {
    expect_throw([&] { chunked(nullptr); }, "the chunked rule needs a scratch buffer");
    expect_throw([&] { chunked(&small); }, "scratch holds");
    expect_throw([&] { chunked(&buf); }, "scratch must differ from every other buffer");
  }
  if (!kernels::delta_step_supported(ctx)) return;
  auto step = [&](const kernels::DeltaShape& s, uint32_t R, const gpu::Buffer& rg, const gpu::Buffer& st,
                  const gpu::Buffer& o) {
    kernels::encode_delta_step(batch, ctx, s, 4, 9, R, 1e-6f, buf, other, rg, gates, other, st, out, o);
  };
  const kernels::DeltaShape one = with([](auto& s) { s.n_tokens = 1; });
  expect_throw([&] { step(ok, 4, ring, state, ring); }, "n_tokens must be 1 (a decode step), not 4");
  expect_throw([&] { step(one, 3, ring, state, ring); }, "ring_rows 3 < taps 4");
  expect_throw([&] { step(one, 4, small, state, ring); }, "ring holds");
  expect_throw([&] { step(one, 4, ring, state, ring); }, "ring must differ from every other buffer");
  expect_throw([&] { step(one, 4, ring, state, out); }, "state_out and o must be different buffers");
  expect_throw([&] { step(one, 4, ring, out, state); }, "state_at 0 and state_out_at 0 overlap in one buffer");
  expect_throw([&] { step(one, 4, ring, out, ring); }, "ring must differ");
  expect_throw([&] { step(with([](auto& s) { s.n_tokens = 1, s.ring_at = (1 << 16) - 64; }), 4, ring, state, buf); },
               "ring holds");
  // the output norm in the step
  if (ctx.limits().maxStorageBuffersPerShaderStage < 11) return;
  auto o = ctx.create_buffer(1 << 16, WGPUBufferUsage_Storage, "o");
  auto z = ctx.create_buffer(1 << 16, WGPUBufferUsage_Storage, "z");
  auto norm_step = [&](const kernels::DeltaShape& s, const kernels::DeltaOutputNorm& n) {
    kernels::encode_delta_step(batch, ctx, s, 4, 9, 4, 1e-6f, buf, other, ring, gates, other, state, out, o, false, &n);
  };
  expect_throw([&] { norm_step(one, {.weight = &other, .z = nullptr}); }, "norm: weight and z are required");
  expect_throw([&] { norm_step(one, {.weight = &other, .z = &z, .eps = 0.f}); }, "norm: eps must be > 0");
  expect_throw([&] { norm_step(one, {.weight = &small, .z = &z}); }, "norm.weight holds");
  expect_throw([&] { norm_step(one, {.weight = &other, .z = &small}); }, "norm.z holds");
  expect_throw([&] { norm_step(one, {.weight = &other, .z = &o}); }, "state_out and o must differ from the inputs");
  expect_throw([&] { norm_step(one, {.weight = &other, .z = &ring}); }, "ring must differ from every other buffer");
  const kernels::DeltaShape wide = with([](auto& s) { s.n_tokens = 1, s.k_heads = 1, s.v_heads = 1, s.dk = 256, s.dv = 256; });
  EXPECT_FALSE(kernels::delta_step_norm_supported(ctx, wide)) << "64 state rows per invocation at most";
  expect_throw([&] { norm_step(wide, {.weight = &other, .z = &z}); }, "does not take the output norm in the step");
}

}  // namespace
}  // namespace wgllm::test
