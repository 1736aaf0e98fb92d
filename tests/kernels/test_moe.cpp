// Mixtures of experts on the GPU (kernels/moe.h, encode_expert_matmul in matmul.h) against the CPU reference:
// routing (softmax, top k, renormalised weights), the experts' products over stacked expert weights of every family
// of types (with the norm and SwiGLU epilogues, x per token or per pair, experts split across pieces), and the
// weighted sum into the residual stream.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <set>

#include "cpu/ops.h"
#include "kernel_test_util.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/weight.h"

namespace wgllm::test {
namespace {

struct RouteCase {
  uint32_t n_tokens, n_expert, n_used;
  bool normalize;
  bool sigmoid = false;  // sigmoid gating with a random selection bias (lfm2moe)
};

// Logits with ties and equal runs mixed in: the order must be the largest first, the lower expert first among equals.
std::vector<float> router_logits(const RouteCase& c, std::mt19937_64& gen) {
  std::vector<float> z = random_floats(size_t(c.n_tokens) * c.n_expert, gen, -4.f, 4.f);
  for (uint32_t t = 0; t < c.n_tokens; t += 3)
    for (uint32_t e = 1; e < c.n_expert; e += 5) z[size_t(t) * c.n_expert + e] = z[size_t(t) * c.n_expert + e - 1];
  return z;
}

TEST(Moe, RouteMatchesCpuReference) {
  gpu::Context& ctx = context();
  for (const RouteCase& c :
       {RouteCase{1, 8, 2, true}, RouteCase{5, 4, 1, true}, RouteCase{7, 128, 8, true}, RouteCase{3, 16, 4, false},
        RouteCase{33, 512, 10, true}, RouteCase{2, 65, 32, true}, RouteCase{4, 3, 3, false},
        RouteCase{9, 32, 4, true, true}, RouteCase{5, 8, 2, false, true}, RouteCase{3, 256, 8, true, true}}) {
    SCOPED_TRACE(testing::Message() << c.n_tokens << " tokens, " << c.n_expert << " experts, top " << c.n_used
                                    << (c.normalize ? " renormalised" : "") << (c.sigmoid ? ", sigmoid" : ""));
    auto gen = rng(c.n_expert * 31 + c.n_used);
    const auto z = router_logits(c, gen);
    const std::vector<float> bias = c.sigmoid ? random_floats(c.n_expert, gen, -0.2f, 0.2f) : std::vector<float>{};
    auto logits = ctx.upload<float>(z, WGPUBufferUsage_Storage, "logits");
    auto bias_buf = ctx.upload<float>(c.sigmoid ? bias : std::vector<float>(4), WGPUBufferUsage_Storage, "bias");
    const size_t pairs = size_t(c.n_tokens) * c.n_used;
    auto experts = poisoned(ctx, pairs, "experts");
    auto weights = poisoned(ctx, pairs, "weights");
    gpu::ComputeBatch batch(ctx, "route");
    kernels::encode_moe_route(batch, ctx, logits, experts, weights, c.n_tokens, c.n_expert, c.n_used, c.normalize,
                              c.sigmoid ? &bias_buf : nullptr);
    batch.submit_and_wait();
    const auto got_e = ctx.read<uint32_t>(experts);
    const auto got_w = ctx.read<float>(weights);
    for (uint32_t t = 0; t < c.n_tokens; ++t) {
      const auto want =
          cpu::moe_route(std::span(z).subspan(size_t(t) * c.n_expert, c.n_expert), c.n_used, c.normalize, bias);
      for (uint32_t r = 0; r < c.n_used; ++r) {
        const size_t i = size_t(t) * c.n_used + r;
        ASSERT_EQ(got_e[i], want.experts[r]) << "token " << t << " rank " << r;
        EXPECT_NEAR(got_w[i], want.weights[r], 2e-6 + 2e-6 * want.weights[r]) << "token " << t << " rank " << r;
      }
    }
  }
}

// A router's product that chooses its token's experts itself (MatmulOptions::choose; matvec_route.wgsl's mv_choose):
// the logits the same bits as the product alone on the matvec, the experts and weights those of encode_moe_route over
// them (the same bits), in the adapter's matvec shape, a GPU's router shape (256 threads a row) and without subgroup
// operations (F16 there); softmax and sigmoid with a selection bias, the router's norm and bias, rows past a whole 16
// (33, 100).
TEST(Moe, RouterChoosesInItsOwnDispatch) {
  struct Case {
    GgufType type;
    uint32_t n_in, n_expert, n_used;
    bool sigmoid;
  };
  const Case cases[] = {
      {F16, 256, 32, 4, true}, {F32, 96, 33, 8, false}, {F32, 128, 100, 2, false}, {F16, 64, 8, 8, true}};
  for (const auto& [shape, no_subgroups] : {std::pair<const char*, bool>{"", false}, {"256x2x1", false}, {"", true}}) {
    SCOPED_TRACE(std::string("matvec shape '") + shape + "'" + (no_subgroups ? ", no subgroups" : ""));
    gpu::Context ctx(context_options([&](auto& o) {
      o.matvec_shape = shape;
      o.disable_subgroups = no_subgroups;
    }));
    for (const Case& c : cases) {
      if (c.type != F16 && (*shape || no_subgroups)) continue;  // (each type and shape is two pipelines to compile)
      SCOPED_TRACE(std::string(type_name(c.type)) + " " + std::to_string(c.n_in) + "x" + std::to_string(c.n_expert) +
                   ", top " + std::to_string(c.n_used) + (c.sigmoid ? ", sigmoid" : ""));
      auto gen = rng(c.n_expert * 7 + c.n_in);
      const auto bytes = random_weight(c.type, c.n_in, c.n_expert, gen);
      const auto w = kernels::upload_weight(ctx, c.type, c.n_in, c.n_expert, bytes, "router");
      auto x = ctx.upload<float>(random_floats(c.n_in, gen), WGPUBufferUsage_Storage, "x");
      auto norm =
          ctx.upload<float>(random_floats((c.n_in + 7) / 8 * 8, gen, 0.5f, 1.5f), WGPUBufferUsage_Storage, "norm");
      auto bias = ctx.upload<float>(random_floats(c.n_expert, gen, -0.5f, 0.5f), WGPUBufferUsage_Storage, "bias");
      auto sel = ctx.upload<float>(random_floats(c.n_expert, gen, -0.2f, 0.2f), WGPUBufferUsage_Storage, "selection");
      auto logits = poisoned(ctx, c.n_expert, "logits"), logits_c = poisoned(ctx, c.n_expert + 16, "logits chosen");
      auto experts = poisoned(ctx, c.n_used, "experts"), experts_c = poisoned(ctx, c.n_used + 4, "experts chosen");
      auto weights = poisoned(ctx, c.n_used, "weights"), weights_c = poisoned(ctx, c.n_used + 4, "weights chosen");
      const kernels::MatmulOptions o{.bias = &bias, .norm = &norm, .eps = 1e-5f, .impl = kernels::MatmulImpl::Matvec};
      gpu::ComputeBatch batch(ctx, "router");
      kernels::encode_matmul(batch, ctx, w, x, logits, 1, o);
      kernels::encode_moe_route(batch, ctx, logits, experts, weights, 1, c.n_expert, c.n_used, true,
                                c.sigmoid ? &sel : nullptr);
      kernels::MatmulOptions oc = o;
      oc.choose = kernels::MatmulOptions::Choose{
          .experts = &experts_c, .weights = &weights_c, .sigmoid_bias = c.sigmoid ? &sel : nullptr, .n_used = c.n_used};
      kernels::encode_matmul(batch, ctx, w, x, logits_c, 1, oc);
      batch.submit_and_wait();
      auto bits = [&](const gpu::Buffer& b) { return ctx.read<uint32_t>(b); };
      const auto want_z = bits(logits), got_z = bits(logits_c);
      const auto want_e = bits(experts), got_e = bits(experts_c);
      const auto want_w = bits(weights), got_w = bits(weights_c);
      for (uint32_t e = 0; e < c.n_expert; ++e) ASSERT_EQ(got_z[e], want_z[e]) << "logit " << e;
      for (uint32_t r = 0; r < c.n_used; ++r) {
        ASSERT_EQ(got_e[r], want_e[r]) << "rank " << r;
        ASSERT_EQ(got_w[r], want_w[r]) << "weight of rank " << r;
      }
      for (uint32_t i = c.n_expert; i < got_z.size(); ++i) ASSERT_EQ(got_z[i], kPoison) << "past the logits";
      for (uint32_t i = c.n_used; i < got_e.size(); ++i) {
        ASSERT_EQ(got_e[i], kPoison) << "past the experts";
        ASSERT_EQ(got_w[i], kPoison) << "past the weights";
      }
    }
  }
  gpu::Context& ctx = context();
  auto gen = rng(3);
  const auto w = kernels::upload_weight(ctx, F32, 64, 8, random_weight(F32, 64, 8, gen), "router");
  auto x = ctx.upload<float>(std::vector<float>(128, 1.f), WGPUBufferUsage_Storage, "x");
  auto y = poisoned(ctx, 16, "y"), e = poisoned(ctx, 4, "e"), wt = poisoned(ctx, 4, "w");
  gpu::ComputeBatch batch(ctx, "bad");
  kernels::MatmulOptions bad{.choose = kernels::MatmulOptions::Choose{.experts = &e, .weights = &wt, .n_used = 2}};
  EXPECT_THROW(kernels::encode_matmul(batch, ctx, w, x, y, 2, bad), InvalidArgument);  // two tokens
  bad.choose->n_used = 9;
  EXPECT_THROW(kernels::encode_matmul(batch, ctx, w, x, y, 1, bad), InvalidArgument);  // more than the rows
  bad.choose->n_used = 2;
  bad.choose->weights = &e;
  EXPECT_THROW(kernels::encode_matmul(batch, ctx, w, x, y, 1, bad), InvalidArgument);  // one buffer for both
}

struct ExpertCase {
  const char* name;
  GgufType type;
  uint32_t n_in, rows;  // rows per expert (gate/up interleaved with swiglu)
  uint32_t n_expert, n_used, n_tokens;
  bool swiglu, norm, x_per_pair;
  uint64_t max_piece_bytes = 0;  // > 0: experts split across pieces
  bool bias = false;             // each expert's row biases (gpt-oss)
  kernels::GateAct act = kernels::GateAct::Silu;
};

const ExpertCase kExpertCases[] = {
    {"f32_gate_up_norm", F32, 64, 64, 8, 2, 3, true, true, false},
    {"f16_down_per_pair", F16, 96, 40, 4, 1, 5, false, false, true},
    {"bf16_plain", BF16, 64, 34, 6, 3, 2, false, false, false},
    {"q8_0_gate_up_pieces", Q8_0, 128, 48, 16, 4, 3, true, true, false, 3 * 48 * 136},
    {"q4_0_down", Q4_0, 64, 64, 5, 2, 4, false, false, true},
    {"q5_1_gate_up", Q5_1, 96, 20, 4, 2, 2, true, true, false},
    {"q4_k_gate_up_norm", Q4_K, 256, 64, 8, 2, 7, true, true, false},
    {"q4_k_one_token_pieces", Q4_K, 512, 36, 12, 8, 1, true, true, false, 2 * 36 * 288},
    {"q6_k_down_per_pair", Q6_K, 256, 70, 8, 3, 3, false, false, true},
    {"q5_k_plain", Q5_K, 256, 18, 4, 4, 2, false, true, false},
    {"q3_k_gate_up", Q3_K, 256, 16, 3, 2, 2, true, false, false},
    {"q2_k_down", Q2_K, 256, 30, 5, 1, 3, false, false, true},
    {"q4_k_many_tokens", Q4_K, 256, 32, 4, 2, 37, true, true, false},
    {"f16_many_tokens_down", F16, 64, 24, 3, 1, 40, false, false, true},  // tiles of 16 (moe_tile)
    {"q6_k_tiles_of_8", Q6_K, 256, 16, 4, 2, 14, true, false, false},
    {"q8_0_tiles_of_3_down", Q8_0, 64, 32, 4, 1, 10, false, false, true},
    // gpt-oss's: the biases of the chosen expert's rows, gate/up through the clamped SwiGLU; alone, in pieces, grouped
    {"q8_0_gate_up_bias_oai", Q8_0, 128, 48, 8, 2, 3, true, true, false, 0, true, kernels::GateAct::SwigluOai},
    {"f32_gate_up_bias_oai_pieces", F32, 64, 40, 8, 4, 2, true, true, false, 3 * 40 * 256, true,
     kernels::GateAct::SwigluOai},
    {"q4_k_many_tokens_bias_oai", Q4_K, 256, 32, 4, 2, 37, true, true, false, 0, true, kernels::GateAct::SwigluOai},
    {"f16_down_bias_per_pair", F16, 64, 24, 6, 2, 20, false, false, true, 0, true},
    // gpt-oss's experts are MXFP4: plain and in pieces, with the biases and the clamped SwiGLU, grouped, down per pair
    {"mxfp4_gate_up_norm_pieces", MXFP4, 128, 48, 16, 4, 3, true, true, false, 3 * 48 * 68},
    {"mxfp4_gate_up_bias_oai_many_tokens", MXFP4, 96, 32, 4, 2, 37, true, true, false, 0, true,
     kernels::GateAct::SwigluOai},
    {"mxfp4_down_bias_per_pair", MXFP4, 64, 64, 5, 2, 4, false, false, true, 0, true},
    // prompts: several tiles of 32 or 64 pairs per expert for the tiled products, the last of each partial
    {"f16_prompt_gate_up_norm", F16, 64, 40, 3, 2, 100, true, true, false},
    {"q4_k_prompt_gate_up_pieces", Q4_K, 256, 48, 6, 2, 90, true, true, false, 2 * 48 * 144},
    {"q8_0_prompt_down_bias_per_pair", Q8_0, 64, 70, 4, 2, 70, false, false, true, 0, true},
    {"mxfp4_prompt_gate_up_bias_oai", MXFP4, 96, 32, 4, 2, 45, true, true, false, 0, true, kernels::GateAct::SwigluOai},
    {"f32_prompt_odd_width_down", F32, 72, 24, 3, 2, 60, false, true, true},
};

// The CPU reference of a case's products: each pair's expert's rows over its x row (normed), plus the expert's
// biases, through the gate's activation with swiglu; [pair][rows, halved with swiglu].
std::vector<float> expert_reference(const ExpertCase& c, std::span<const uint8_t> bytes, const std::vector<float>& x,
                                    const std::vector<float>& norm, std::span<const uint32_t> ids,
                                    std::span<const float> bias) {
  const uint32_t pairs = c.n_tokens * c.n_used, x_rows = c.x_per_pair ? pairs : c.n_tokens;
  const auto xn = c.norm ? cpu::rms_norm(x, norm, x_rows, c.n_in, 1e-5f) : x;
  const size_t row_bytes = tensor_bytes(c.type, c.n_in, 1);
  std::vector<float> want;
  for (uint32_t i = 0; i < pairs; ++i) {
    const auto expert = bytes.subspan(size_t(ids[i]) * c.rows * row_bytes, c.rows * row_bytes);
    const uint32_t xr = c.x_per_pair ? i : i / c.n_used;
    auto out = cpu::matmul(c.type, expert, c.n_in, c.rows, std::span(xn).subspan(size_t(xr) * c.n_in, c.n_in), 1);
    if (c.bias)
      for (uint32_t r = 0; r < c.rows; ++r) out[r] += bias[size_t(ids[i]) * c.rows + r];
    if (!c.swiglu) {
      want.insert(want.end(), out.begin(), out.end());
      continue;
    }
    std::vector<float> gate, up;
    for (uint32_t r = 0; r < c.rows; r += 2) {
      gate.push_back(out[r]);
      up.push_back(out[r + 1]);
    }
    const auto act = cpu::gated(uint32_t(c.act), gate, up);
    want.insert(want.end(), act.begin(), act.end());
  }
  return want;
}

class ExpertTable : public testing::TestWithParam<ExpertCase> {};

// y[pair] against cpu::matmul over the chosen expert's rows, each pair's bits equal to a lone product of its expert
// (its sums do not depend on the other pairs) and to its product grouped by expert (encode_moe_group: several pairs
// of an expert per pass), and nothing written past the pairs. The tiled products of a prompt (tiles of 32 and of 64
// pairs, ExpertOptions::group_tile) against the same reference, and within the same bound of the matvec's.
TEST_P(ExpertTable, MatchesCpuReference) {
  const ExpertCase& c = GetParam();
  gpu::Context& ctx = context();
  auto gen = rng(std::hash<std::string>{}(c.name));
  const uint64_t total_rows = uint64_t(c.n_expert) * c.rows;
  const auto bytes = random_weight(c.type, c.n_in, total_rows, gen);
  const auto w =
      kernels::upload_weight(ctx, c.type, c.n_in, total_rows, bytes, "experts", c.max_piece_bytes, c.n_expert);
  if (c.max_piece_bytes) {
    ASSERT_GT(w.pieces.size(), 1u) << "the case must split the experts across pieces";
  }
  const uint32_t pairs = c.n_tokens * c.n_used;
  const uint32_t x_rows = c.x_per_pair ? pairs : c.n_tokens;
  const auto x = random_floats(size_t(x_rows) * c.n_in, gen);
  const auto norm = random_floats(c.n_in, gen, 0.5f, 1.5f);
  std::vector<float> norm_padded(norm);
  norm_padded.resize((c.n_in + 7) / 8 * 8, 0.f);
  // every token's experts distinct, the last expert and expert 0 among them
  std::vector<uint32_t> ids;
  for (uint32_t t = 0; t < c.n_tokens; ++t) {
    std::vector<uint32_t> all(c.n_expert);
    std::iota(all.begin(), all.end(), 0u);
    std::shuffle(all.begin(), all.end(), gen);
    if (t == 0) std::swap(*std::find(all.begin(), all.end(), c.n_expert - 1), all[0]);
    ids.insert(ids.end(), all.begin(), all.begin() + c.n_used);
  }
  // biases of a scale that moves the sums (and, with the clamped SwiGLU, across its clamps at +-7)
  const auto bias = random_floats(c.bias ? total_rows : 0, gen, -4.f, 4.f);
  auto xs = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
  auto nbuf = ctx.upload<float>(norm_padded, WGPUBufferUsage_Storage, "norm");
  auto ebuf = ctx.upload<uint32_t>(ids, WGPUBufferUsage_Storage, "experts");
  const gpu::Buffer bbuf = c.bias ? ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias") : gpu::Buffer{};
  const uint32_t width = c.swiglu ? c.rows / 2 : c.rows;
  auto y = poisoned(ctx, size_t(pairs) * width + 64, "y");
  const kernels::ExpertOptions o{.norm = c.norm ? &nbuf : nullptr,
                                 .eps = 1e-5f,
                                 .bias = c.bias ? &bbuf : nullptr,
                                 .swiglu = c.swiglu,
                                 .act = c.act,
                                 .x_per_pair = c.x_per_pair};
  gpu::ComputeBatch batch(ctx, "experts");
  kernels::encode_expert_matmul(batch, ctx, w, xs, y, ebuf, c.n_tokens, c.n_used, o);
  // pair 1 alone (its expert id and x row copied into buffers of its own)
  const uint32_t lone = std::min(1u, pairs - 1), lone_x = c.x_per_pair ? lone : lone / c.n_used;
  auto x1 = ctx.upload<float>(std::span(x).subspan(size_t(lone_x) * c.n_in, c.n_in), WGPUBufferUsage_Storage, "x1");
  auto e1 = ctx.upload<uint32_t>(std::span(ids).subspan(lone, 1), WGPUBufferUsage_Storage, "e1");
  auto y1 = poisoned(ctx, width, "y1");
  kernels::encode_expert_matmul(batch, ctx, w, x1, y1, e1, 1, 1, o);
  auto group = poisoned(ctx, kernels::moe_group_words(pairs), "group");
  auto yg = poisoned(ctx, size_t(pairs) * width + 64, "y grouped");
  kernels::encode_moe_group(batch, ctx, ebuf, group, c.n_tokens, c.n_expert, c.n_used);
  kernels::ExpertOptions og = o;
  og.group = &group;
  kernels::encode_expert_matmul(batch, ctx, w, xs, yg, ebuf, c.n_tokens, c.n_used, og);
  std::vector<gpu::Buffer> tiled_groups, tiled_ys;
  // The tiled products in the prompts' cases and those split across pieces, tiles of 64 in the prompts' alone (each
  // tile and type is a pipeline: lavapipe takes seconds to compile one).
  const std::string name = c.name;
  const bool prompt = name.find("prompt") != std::string::npos;
  for (const uint32_t tile : {32u, 64u}) {
    if (!(prompt || (tile == 32 && c.max_piece_bytes))) continue;
    tiled_groups.push_back(poisoned(ctx, kernels::moe_group_words(pairs), "group tiled"));
    tiled_ys.push_back(poisoned(ctx, size_t(pairs) * width + 64, "y tiled"));
    kernels::encode_moe_group(batch, ctx, ebuf, tiled_groups.back(), c.n_tokens, c.n_expert, c.n_used, tile);
    kernels::ExpertOptions ot = o;
    ot.group = &tiled_groups.back();
    ot.group_tile = tile;
    kernels::encode_expert_matmul(batch, ctx, w, xs, tiled_ys.back(), ebuf, c.n_tokens, c.n_used, ot);
  }
  batch.submit_and_wait();
  const auto got = ctx.read<float>(y);
  const auto got_g = ctx.read<float>(yg);
  EXPECT_EQ(std::memcmp(got.data(), got_g.data(), got.size() * 4), 0) << "grouped by expert differs from per pair";

  const auto want = expert_reference(c, bytes, x, norm, ids, bias);
  const auto r = compare(std::span<const float>(got).first(want.size()), std::span<const float>(want));
  EXPECT_LE(r.rel_l2, 2e-5) << r.describe();
  for (size_t i = want.size(); i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), kPoison) << "past the pairs";
  for (size_t k = 0; k < tiled_ys.size(); ++k) {
    SCOPED_TRACE(k == 0 ? "tiles of 32 pairs" : "tiles of 64 pairs");
    const auto got_t = ctx.read<float>(tiled_ys[k]);
    const auto rt = compare(std::span<const float>(got_t).first(want.size()), std::span<const float>(want));
    EXPECT_LE(rt.rel_l2, 2e-5) << rt.describe();
    for (size_t i = want.size(); i < got_t.size(); ++i)
      ASSERT_EQ(std::bit_cast<uint32_t>(got_t[i]), kPoison) << "past the pairs";
  }
  const auto one = ctx.read<float>(y1);
  EXPECT_EQ(std::memcmp(one.data(), got.data() + size_t(lone) * width, size_t(width) * 4), 0)
      << "pair " << lone << " differs from its lone product";
}

INSTANTIATE_TEST_SUITE_P(Cases, ExpertTable, testing::ValuesIn(kExpertCases),
                         [](const auto& info) { return std::string(info.param.name); });

// The expert products without subgroup operations (reductions through workgroup memory only) and in forced shapes
// (ContextOptions::expert_shape: fewer threads a row, more rows a group, two units in flight), K-quant and MXFP4
// experts, against the CPU reference.
TEST(Moe, ExpertsWithoutSubgroupsAndInOtherShapes) {
  for (const char* shape : {"", "8x4x16", "16x8x4x2"})
    for (const GgufType type : {Q4_K, MXFP4}) {
      SCOPED_TRACE(std::string(type_name(type)) + (*shape ? std::string(" in ") + shape : " without subgroups"));
      gpu::Context ctx(context_options([&](auto& o) {
        o.disable_subgroups = !*shape;
        o.expert_shape = shape;
      }));
      auto gen = rng(5);
      const uint32_t n_in = 256, rows = 24, X = 6, k = 2, T = 3;
      const auto bytes = random_weight(type, n_in, uint64_t(X) * rows, gen);
      const auto w = kernels::upload_weight(ctx, type, n_in, uint64_t(X) * rows, bytes, "experts", 0, X);
      if (*shape) {
        EXPECT_EQ(kernels::expert_matvec_config(ctx, w, T * k).threads_per_row, uint32_t(std::atoi(shape)));
      }
      const auto x = random_floats(size_t(T) * n_in, gen);
      const std::vector<uint32_t> ids = {5, 0, 2, 3, 1, 4};
      auto xs = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
      auto ebuf = ctx.upload<uint32_t>(ids, WGPUBufferUsage_Storage, "experts");
      auto y = poisoned(ctx, size_t(T) * k * rows, "y");
      gpu::ComputeBatch batch(ctx, "experts");
      kernels::encode_expert_matmul(batch, ctx, w, xs, y, ebuf, T, k);
      batch.submit_and_wait();
      const auto got = ctx.read<float>(y);
      const size_t row_bytes = tensor_bytes(type, n_in, 1);
      std::vector<float> want;
      for (uint32_t i = 0; i < T * k; ++i) {
        const std::span<const uint8_t> expert(bytes.data() + size_t(ids[i]) * rows * row_bytes, rows * row_bytes);
        const auto out = cpu::matmul(type, expert, n_in, rows, std::span(x).subspan(size_t(i / k) * n_in, n_in), 1);
        want.insert(want.end(), out.begin(), out.end());
      }
      const auto r = compare(got, want);
      EXPECT_LE(r.rel_l2, 2e-5) << r.describe();
    }
}

// A prompt's expert products in tiles of 64 and of 32 pairs on x's digits (ContextOptions::prompt_digits;
// matmul_int.wgsl's MQ_EXPERTS, 64 x 64 and 32 x 128 workgroups): each pair's outputs the bits of its expert's own
// prompt product (the expert's rows uploaded as a weight of their own, on the 64 x 64 tiles) over the pairs' x rows in
// order, within the digits' bound of the float64 reference (one digit's error above the f32 tiles': the digits are
// read), nothing written past the pairs. Q4_K gate/up with the norm and SwiGLU in pieces, Q6_K down per pair with
// biases, Q8_0 gate/up with gpt-oss's SwiGLU; every expert's last tile partial, in pairs and in rows (144, 70 and 40
// rows: both halves of a 128-row tile's loads).
TEST(Moe, PromptDigitsExpertsAsTheirOwnProducts) {
  const ExpertCase cases[] = {
      {"q4_k_gate_up_norm_pieces", Q4_K, 256, 144, 4, 2, 130, true, true, false, 2 * 144 * 144},
      {"q6_k_down_per_pair_bias", Q6_K, 256, 70, 3, 1, 200, false, false, true, 0, true},
      {"q8_0_gate_up_bias_oai", Q8_0, 128, 40, 2, 2, 70, true, true, false, 0, true, kernels::GateAct::SwigluOai},
  };
  // Matmul.PromptDigits' bounds (one, two, three digits): lavapipe gives up to 1.3e-2, 5.5e-5 and 5.0e-7 there
  const double bound[] = {0, 3e-2, 1.2e-4, 2e-6};
  for (const uint32_t d : {1u, 3u}) {  // (each type, tile and count of digits is a pipeline: lavapipe compiles slowly)
    SCOPED_TRACE("digits " + std::to_string(d));
    gpu::Context ctx(context_options([&](auto& o) { o.prompt_digits = d; }));
    for (const ExpertCase& c : cases)
      for (const uint32_t tile : {64u, 32u}) {
        SCOPED_TRACE(std::string(c.name) + ", tiles of " + std::to_string(tile));
        auto gen = rng(std::hash<std::string>{}(c.name));
        const uint64_t total_rows = uint64_t(c.n_expert) * c.rows;
        const auto bytes = random_weight(c.type, c.n_in, total_rows, gen);
        const auto w =
            kernels::upload_weight(ctx, c.type, c.n_in, total_rows, bytes, "experts", c.max_piece_bytes, c.n_expert);
        const uint32_t pairs = c.n_tokens * c.n_used;
        if (kernels::prompt_digits(ctx, w, pairs) != d) continue;  // Q8_0's three digits, Q6_K's in 32 KB: f32 tiles
        ASSERT_EQ(kernels::moe_matmul_tile(pairs, c.n_expert, false), 64u) << "the case must fill tiles of 64";
        if (c.max_piece_bytes) {
          ASSERT_GT(w.pieces.size(), 1u) << "the case must split the experts across pieces";
        }
        const uint32_t x_rows = c.x_per_pair ? pairs : c.n_tokens;
        const auto x = random_floats(size_t(x_rows) * c.n_in, gen);
        const auto norm = random_floats(c.n_in, gen, 0.5f, 1.5f);
        const auto bias = random_floats(c.bias ? total_rows : 0, gen, -4.f, 4.f);
        std::vector<uint32_t> ids;  // each token's experts distinct, in a random order
        for (uint32_t t = 0; t < c.n_tokens; ++t) {
          std::vector<uint32_t> all(c.n_expert);
          std::iota(all.begin(), all.end(), 0u);
          std::shuffle(all.begin(), all.end(), gen);
          ids.insert(ids.end(), all.begin(), all.begin() + c.n_used);
        }
        auto xs = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
        auto nbuf = ctx.upload<float>(norm, WGPUBufferUsage_Storage, "norm");
        auto ebuf = ctx.upload<uint32_t>(ids, WGPUBufferUsage_Storage, "experts");
        const gpu::Buffer bbuf = c.bias ? ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias") : gpu::Buffer{};
        const uint32_t width = c.swiglu ? c.rows / 2 : c.rows;
        auto group = poisoned(ctx, kernels::moe_group_words(pairs), "group");
        auto y = poisoned(ctx, size_t(pairs) * width + 64, "y");
        gpu::ComputeBatch batch(ctx, "experts on digits");
        kernels::encode_moe_group(batch, ctx, ebuf, group, c.n_tokens, c.n_expert, c.n_used, tile);
        kernels::encode_expert_matmul(batch, ctx, w, xs, y, ebuf, c.n_tokens, c.n_used,
                                      {.norm = c.norm ? &nbuf : nullptr,
                                       .eps = 1e-5f,
                                       .bias = c.bias ? &bbuf : nullptr,
                                       .swiglu = c.swiglu,
                                       .act = c.act,
                                       .x_per_pair = c.x_per_pair,
                                       .group = &group,
                                       .group_tile = tile});
        // each expert's own product over its pairs' x rows, in pair order
        const size_t row_bytes = tensor_bytes(c.type, c.n_in, 1);
        std::vector<std::vector<uint32_t>> of(c.n_expert);
        for (uint32_t i = 0; i < pairs; ++i) of[ids[i]].push_back(i);
        std::vector<kernels::GpuWeight> alone;
        std::vector<gpu::Buffer> keep, ys;
        for (uint32_t e = 0; e < c.n_expert; ++e) {
          alone.push_back(kernels::upload_weight(
              ctx, c.type, c.n_in, c.rows,
              std::span<const uint8_t>(bytes.data() + size_t(e) * c.rows * row_bytes, c.rows * row_bytes), "expert"));
          std::vector<float> xe;
          for (const uint32_t i : of[e]) {
            const uint32_t xr = c.x_per_pair ? i : i / c.n_used;
            xe.insert(xe.end(), x.begin() + size_t(xr) * c.n_in, x.begin() + size_t(xr + 1) * c.n_in);
          }
          keep.push_back(ctx.upload<float>(xe, WGPUBufferUsage_Storage, "x of the expert"));
          const auto be = std::span(bias).subspan(c.bias ? size_t(e) * c.rows : 0, c.bias ? c.rows : 0);
          keep.push_back(c.bias ? ctx.upload<float>(be, WGPUBufferUsage_Storage, "bias of the expert") : gpu::Buffer{});
          ys.push_back(poisoned(ctx, of[e].size() * width, "y of the expert"));
          ASSERT_EQ(kernels::prompt_digits(ctx, alone.back(), uint32_t(of[e].size())), d);
          kernels::encode_matmul(batch, ctx, alone.back(), keep[keep.size() - 2], ys.back(), uint32_t(of[e].size()),
                                 {.bias = c.bias ? &keep.back() : nullptr,
                                  .norm = c.norm ? &nbuf : nullptr,
                                  .eps = 1e-5f,
                                  .swiglu = c.swiglu,
                                  .act = c.act,
                                  .impl = kernels::MatmulImpl::Tiled});
        }
        batch.submit_and_wait();
        const auto got = ctx.read<float>(y);
        for (uint32_t e = 0; e < c.n_expert; ++e) {
          const auto own = ctx.read<float>(ys[e]);
          for (size_t j = 0; j < of[e].size(); ++j)
            ASSERT_EQ(std::memcmp(got.data() + size_t(of[e][j]) * width, own.data() + j * width, width * 4), 0)
                << "pair " << of[e][j] << " (expert " << e << ") differs from its expert's own product";
        }
        for (size_t i = size_t(pairs) * width; i < got.size(); ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), kPoison) << "past the pairs";
        const auto want = expert_reference(c, bytes, x, norm, ids, bias);
        const auto r = compare(std::span<const float>(got).first(want.size()), std::span<const float>(want));
        EXPECT_LE(r.rel_l2, bound[d]) << r.describe();
        if (d == 1) {
          EXPECT_GT(r.rel_l2, 1e-3) << "one digit gave the f32 tiles' error";
        }
      }
  }
}

TEST(Moe, CombineAddsTheWeightedExperts) {
  gpu::Context& ctx = context();
  auto gen = rng(9);
  const uint32_t T = 5, k = 3, width = 70;
  const auto ys = random_floats(size_t(T) * k * width, gen);
  const auto wts = random_floats(size_t(T) * k, gen, 0.f, 1.f);
  const auto x0 = random_floats(size_t(T) * width, gen);
  auto ybuf = ctx.upload<float>(ys, WGPUBufferUsage_Storage, "ys");
  auto wbuf = ctx.upload<float>(wts, WGPUBufferUsage_Storage, "weights");
  std::vector<float> xpad(x0);
  xpad.resize(x0.size() + 16, 7.f);  // past the tokens: untouched
  auto xbuf = ctx.upload<float>(xpad, WGPUBufferUsage_Storage, "x");
  gpu::ComputeBatch batch(ctx, "combine");
  kernels::encode_moe_combine(batch, ctx, ybuf, wbuf, xbuf, T, k, width);
  batch.submit_and_wait();
  const auto got = ctx.read<float>(xbuf);
  for (uint32_t t = 0; t < T; ++t)
    for (uint32_t i = 0; i < width; ++i) {
      double want = x0[size_t(t) * width + i], acc = 0;
      for (uint32_t r = 0; r < k; ++r) acc += double(wts[t * k + r]) * ys[(size_t(t) * k + r) * width + i];
      ASSERT_NEAR(got[size_t(t) * width + i], want + acc, 1e-5) << "token " << t << " element " << i;
    }
  for (size_t i = x0.size(); i < xpad.size(); ++i) ASSERT_EQ(got[i], 7.f) << "past the tokens";
}

// The down products with the combine in the same dispatch (ExpertOptions::combine) against the two dispatches it
// replaces (the products per pair, then encode_moe_combine): the same bits, every type family, odd row counts, one to
// four experts a token, with and without biases, with and without subgroups and at forced shapes; the elements past
// the tokens untouched.
TEST(Moe, DownAndCombineInOneDispatch) {
  struct Setting {
    const char* shape;
    bool no_subgroups;
    std::vector<GgufType> types;  // each type is two pipelines: lavapipe takes seconds to compile one
  };
  const std::vector<Setting> settings = {{"", false, {F32, F16, Q8_0, Q4_K, Q6_K, MXFP4}},
                                         {"", true, {F16, Q4_K}},
                                         {"64x4x2", false, {Q8_0, MXFP4}},
                                         {"16x2x4", false, {Q6_K}}};
  for (const Setting& st : settings) {
    gpu::Context ctx(context_options([&](auto& o) {
      o.matvec_shape = st.shape;
      o.disable_subgroups = st.no_subgroups;
    }));
    for (const GgufType type : st.types) {
      for (const uint32_t k : {1u, 2u, 3u, 4u}) {
        if (k == 3 && type != F16 && type != Q4_K) continue;  // three pairs: groups not a power of two
        if (k == 2 && type != F32) continue;                  // gpt-oss-tiny's shape: one block a row
        const uint32_t n_in = type == Q4_K || type == Q6_K ? 512 : k == 2 ? 32 : 96, rows = k == 2 ? 64 : 70, X = 5;
        const uint32_t T = k == 1 ? 1 : k == 2 ? 2 : 3;
        const bool with_bias = k == 4;
        SCOPED_TRACE(std::string(type_name(type)) + " k " + std::to_string(k) + " shape '" + st.shape + "'" +
                     (st.no_subgroups ? " no subgroups" : ""));
        auto gen = rng(11 + k);
        const auto bytes = random_weight(type, n_in, uint64_t(X) * rows, gen);
        const auto w = kernels::upload_weight(ctx, type, n_in, uint64_t(X) * rows, bytes, "experts", 0, X);
        ASSERT_TRUE(kernels::expert_combine_fits(ctx, w, T, k));
        const auto x = random_floats(size_t(T) * k * n_in, gen);  // one row per pair (the activated gate/up)
        std::vector<uint32_t> ids;
        for (uint32_t t = 0; t < T; ++t)
          for (uint32_t r = 0; r < k; ++r) ids.push_back((t * 2 + r * 3 + (t == 0 ? X - 1 : 0)) % X);
        const auto wts = random_floats(size_t(T) * k, gen, 0.f, 1.f);
        const auto bias = random_floats(size_t(X) * rows, gen, -2.f, 2.f);
        auto res = random_floats(size_t(T) * rows, gen);
        res.resize(res.size() + 16, 7.f);  // past the tokens: untouched
        auto xs = ctx.upload<float>(x, WGPUBufferUsage_Storage, "x");
        auto ebuf = ctx.upload<uint32_t>(ids, WGPUBufferUsage_Storage, "experts");
        auto wbuf = ctx.upload<float>(wts, WGPUBufferUsage_Storage, "weights");
        auto bbuf = ctx.upload<float>(bias, WGPUBufferUsage_Storage, "bias");
        auto fused = ctx.upload<float>(res, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "residual fused");
        auto apart = ctx.upload<float>(res, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, "residual");
        auto y = poisoned(ctx, size_t(T) * k * rows, "y");
        kernels::ExpertOptions o{.bias = with_bias ? &bbuf : nullptr, .x_per_pair = true};
        gpu::ComputeBatch batch(ctx, "down");
        kernels::encode_expert_matmul(batch, ctx, w, xs, y, ebuf, T, k, o);
        kernels::encode_moe_combine(batch, ctx, y, wbuf, apart, T, k, rows);
        o.combine = &wbuf;
        kernels::encode_expert_matmul(batch, ctx, w, xs, fused, ebuf, T, k, o);
        batch.submit_and_wait();
        const auto got = ctx.read<float>(fused), want = ctx.read<float>(apart);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "the fused combine's bits differ";
        for (size_t i = size_t(T) * rows; i < got.size(); ++i) ASSERT_EQ(got[i], 7.f) << "past the tokens";
        EXPECT_NE(got[0], res[0]) << "nothing was added";
      }
    }
  }
}

// Decode's routing inside the gate/up products (ExpertOptions::route) against the two dispatches it replaces
// (encode_moe_route, then the products reading its experts): the same experts, weights and outputs, bit for bit, with
// softmax and sigmoid routing (ties among the logits), experts in pieces, gate and up apart or interleaved, up to 128
// experts over workgroups of fewer invocations, several tokens, with and without subgroups. Outputs poisoned first.
TEST(Moe, RouteInsideTheGateUpProducts) {
  struct Case {
    const char* name;
    GgufType type;
    uint32_t n_in, rows, n_expert, n_used, n_tokens;
    bool sigmoid, swiglu;
    uint64_t max_piece_bytes = 0;
  };
  struct Setting {
    const char* shape;
    bool no_subgroups;
    std::vector<Case> cases;
  };
  const std::vector<Setting> settings = {
      {"",
       false,
       {{"q4_k_sigmoid_lfm2", Q4_K, 256, 64, 32, 4, 1, true, true},
        {"f16_softmax_128_experts", F16, 64, 40, 128, 8, 3, false, true},
        {"q8_0_pieces", Q8_0, 128, 48, 16, 4, 2, false, true, 3 * 48 * 136},
        {"f32_gate_alone_all_experts", F32, 64, 24, 5, 5, 2, true, false}}},
      {"", true, {{"q4_k_no_subgroups", Q4_K, 256, 32, 64, 8, 2, false, true}}},
      {"16x2x4", false, {{"q6_k_narrow_workgroup", Q6_K, 256, 32, 128, 8, 1, true, true}}}};
  for (const Setting& st : settings) {
    gpu::Context ctx(context_options([&](auto& o) {
      o.matvec_shape = st.shape;
      o.disable_subgroups = st.no_subgroups;
    }));
    for (const Case& c : st.cases) {
      SCOPED_TRACE(std::string(c.name) + " shape '" + st.shape + "'" + (st.no_subgroups ? " no subgroups" : ""));
      auto gen = rng(c.n_expert * 7 + c.n_used);
      const uint64_t n_out = uint64_t(c.n_expert) * c.rows;
      const auto bytes = random_weight(c.type, c.n_in, n_out, gen);
      const auto w =
          kernels::upload_weight(ctx, c.type, c.n_in, n_out, bytes, "experts", c.max_piece_bytes, c.n_expert);
      if (c.max_piece_bytes) {
        ASSERT_GT(w.pieces.size(), 1u);
      }
      ASSERT_TRUE(kernels::expert_route_fits(ctx, w, c.n_tokens, c.n_used));
      const RouteCase rc{c.n_tokens, c.n_expert, c.n_used, true, c.sigmoid};
      auto logits = ctx.upload<float>(router_logits(rc, gen), WGPUBufferUsage_Storage, "logits");
      auto sel = ctx.upload<float>(random_floats(c.n_expert, gen, -0.2f, 0.2f), WGPUBufferUsage_Storage, "bias");
      auto xs = ctx.upload<float>(random_floats(size_t(c.n_tokens) * c.n_in, gen), WGPUBufferUsage_Storage, "x");
      auto nbuf = ctx.upload<float>(random_floats(c.n_in, gen, 0.5f, 1.5f), WGPUBufferUsage_Storage, "norm");
      const size_t pairs = size_t(c.n_tokens) * c.n_used, width = c.swiglu ? c.rows / 2 : c.rows;
      auto ea = poisoned(ctx, pairs, "experts"), wa = poisoned(ctx, pairs, "weights");
      auto eb = poisoned(ctx, pairs, "experts fused"), wb = poisoned(ctx, pairs, "weights fused");
      auto ya = poisoned(ctx, pairs * width, "y"), yb = poisoned(ctx, pairs * width, "y fused");
      kernels::ExpertOptions o{.norm = &nbuf, .swiglu = c.swiglu};
      gpu::ComputeBatch batch(ctx, "route");
      kernels::encode_moe_route(batch, ctx, logits, ea, wa, c.n_tokens, c.n_expert, c.n_used, true,
                                c.sigmoid ? &sel : nullptr);
      kernels::encode_expert_matmul(batch, ctx, w, xs, ya, ea, c.n_tokens, c.n_used, o);
      const kernels::ExpertRoute route{.logits = &logits, .weights = &wb, .sigmoid_bias = c.sigmoid ? &sel : nullptr};
      o.route = &route;
      kernels::encode_expert_matmul(batch, ctx, w, xs, yb, eb, c.n_tokens, c.n_used, o);
      batch.submit_and_wait();
      const auto e_apart = ctx.read<uint32_t>(ea), e_fused = ctx.read<uint32_t>(eb);
      const auto w_apart = ctx.read<float>(wa), w_fused = ctx.read<float>(wb);
      const auto y_apart = ctx.read<float>(ya), y_fused = ctx.read<float>(yb);
      EXPECT_EQ(e_fused, e_apart) << "the chosen experts differ";
      EXPECT_EQ(std::memcmp(w_fused.data(), w_apart.data(), pairs * 4), 0) << "the weights' bits differ";
      EXPECT_EQ(std::memcmp(y_fused.data(), y_apart.data(), y_apart.size() * 4), 0) << "the products' bits differ";
      EXPECT_FALSE(std::isnan(y_apart[0])) << "nothing was computed";
    }
  }
}

TEST(Moe, BadArgumentsThrowNamingTheField) {
  gpu::Context& ctx = context();
  auto gen = rng(3);
  const auto bytes = random_weight(F16, 64, 4 * 8, gen);
  const auto stacked = kernels::upload_weight(ctx, F16, 64, 32, bytes, "experts", 0, 4);
  const auto plain = kernels::upload_weight(ctx, F16, 64, 32, bytes);
  auto buf = [&](size_t floats) { return ctx.create_buffer(floats * 4, WGPUBufferUsage_Storage, "b"); };
  auto x = buf(64 * 4), y = buf(8 * 8), ids = buf(8), small = buf(1), logits = buf(64), wts = buf(8);
  gpu::ComputeBatch batch(ctx, "bad");
  expect_throw([&] { kernels::encode_expert_matmul(batch, ctx, plain, x, y, ids, 2, 2); }, "n_experts");
  expect_throw([&] { kernels::encode_expert_matmul(batch, ctx, stacked, x, y, ids, 2, 5); }, "n_used");
  expect_throw([&] { kernels::encode_expert_matmul(batch, ctx, stacked, x, small, ids, 2, 2); }, "y");
  expect_throw([&] { kernels::encode_expert_matmul(batch, ctx, stacked, x, y, small, 2, 2); }, "experts");
  expect_throw([&] { kernels::encode_expert_matmul(batch, ctx, stacked, x, x, ids, 1, 1); }, "y must not");
  expect_throw([&] { kernels::encode_expert_matmul(batch, ctx, stacked, x, y, ids, 2, 2, {.group_tile = 32}); },
               "group_tile needs the group");
  auto group = buf(kernels::moe_group_words(4));
  expect_throw(
      [&] { kernels::encode_expert_matmul(batch, ctx, stacked, x, y, ids, 2, 2, {.group = &group, .group_tile = 16}); },
      "group_tile must be");
  // combine: its weights per pair, no swiglu, one piece
  expect_throw([&] { kernels::encode_expert_matmul(batch, ctx, stacked, x, y, ids, 2, 2, {.combine = &small}); },
               "combine");
  expect_throw(
      [&] { kernels::encode_expert_matmul(batch, ctx, stacked, x, y, ids, 2, 2, {.swiglu = true, .combine = &wts}); },
      "combine needs");
  const auto split = kernels::upload_weight(ctx, F16, 64, 32, bytes, "experts", 2 * 8 * 128, 4);
  ASSERT_GT(split.pieces.size(), 1u);
  EXPECT_FALSE(kernels::expert_combine_fits(ctx, split, 2, 2));
  expect_throw([&] { kernels::encode_expert_matmul(batch, ctx, split, x, y, ids, 2, 2, {.combine = &wts}); },
               "combine needs one piece");
  // route: not with a group or a combine, and its logits sized for the tokens' experts
  auto rlogits = buf(8), rw = buf(4), rids = buf(4);
  const kernels::ExpertRoute short_route{.logits = &small, .weights = &rw};
  expect_throw([&] { kernels::encode_expert_matmul(batch, ctx, stacked, x, y, rids, 2, 2, {.route = &short_route}); },
               "route logits");
  const kernels::ExpertRoute good{.logits = &rlogits, .weights = &rw};
  expect_throw(
      [&] { kernels::encode_expert_matmul(batch, ctx, stacked, x, y, rids, 2, 2, {.group = &group, .route = &good}); },
      "route needs");
  const kernels::ExpertRoute aliased{.logits = &rlogits, .weights = &rids};
  expect_throw([&] { kernels::encode_expert_matmul(batch, ctx, stacked, x, y, rids, 2, 2, {.route = &aliased}); },
               "different buffers");
  expect_throw([&] { kernels::encode_moe_route(batch, ctx, logits, ids, wts, 2, 8, 9, true); }, "n_used");
  expect_throw([&] { kernels::encode_moe_route(batch, ctx, logits, ids, wts, 2, 1000, 2, true); }, "n_expert");
  expect_throw([&] { kernels::encode_moe_route(batch, ctx, logits, small, wts, 2, 8, 2, true); }, "experts");
  expect_throw([&] { kernels::encode_moe_combine(batch, ctx, y, wts, x, 2, 2, 100); }, "ys");
  expect_throw([&] { kernels::upload_weight(ctx, F16, 64, 30, random_weight(F16, 64, 30, gen), "e", 0, 4); },
               "n_experts");
}

}  // namespace
}  // namespace wgllm::test
