// `wgllm-bench experts`: a mixture of experts' FFN at a real model's shape, on random weights: the router's product,
// the routing, the grouping where a step groups its pairs, the experts' gate/up and down products and the weighted
// sum, in the order encode_moe_ffn (model/blocks.cpp) runs them. Per token count, the time of the whole and its
// rates: GB/s of the experts actually chosen (each distinct expert's gate/up and down bytes, read once) and GFLOP/s
// of the expert products. Decode (one token) runs the routing apart, inside the gate/up products
// (ExpertOptions::route) and inside the router's product (MatmulOptions::choose); prompts sweep --prompt-digits
// (ExpertOptions::group_tile's tiles on x's digits);
// --group-tile forces the tiled steps' tile.
#include <cstdio>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "command.h"
#include "common.h"
#include "kernels/matmul.h"
#include "kernels/moe.h"
#include "kernels/weight.h"
#include "wgllm/error.h"

namespace wgllm::bench {
namespace {

struct Shape {
  const char* name;
  uint32_t width, ffn, experts, used;
  bool sigmoid;  // lfm2moe's sigmoid router with a selection bias
};
// The experts of the MoE presets of tools/make_model.py (their FFN layers; attention and the rest are not run).
constexpr Shape kShapes[] = {{"lfm2-8b-a1b", 2048, 1792, 32, 4, true},
                             {"qwen3-30b-a3b", 2048, 768, 128, 8, false},
                             {"gpt-oss-20b", 2880, 2880, 32, 4, false}};

struct Options {
  std::string adapter;
  std::string shape = "lfm2-8b-a1b";
  std::string types = "Q4_K,Q6_K";  // gate/up, down
  std::string tokens = "1,16,512";
  std::string prompt_digits;  // comma-separated ContextOptions::prompt_digits ("": unset)
  uint32_t group_tile = 0;    // tiles of the tiled steps' pairs (ExpertOptions::group_tile; 0: moe_matmul_tile's)
  std::string expert_shapes;  // comma-separated ContextOptions::expert_shape ("default": unset)
  uint32_t repeats = 5;
};

// Distinct token inputs cycled through the runs: each draws other experts, so the chosen experts' weights come from
// memory, not from the last run's cache.
constexpr uint32_t kInputs = 8;

int run_experts(const Options& o) {
  const Shape* sh = nullptr;
  for (const Shape& s : kShapes)
    if (o.shape == s.name) sh = &s;
  if (!sh) throw InvalidArgument("--shape: '" + o.shape + "' is not lfm2-8b-a1b, qwen3-30b-a3b or gpt-oss-20b");
  const auto type_names = split(o.types, ',');
  if (type_names.size() != 2) throw InvalidArgument("--types: two types, gate/up then down (e.g. Q4_K,Q6_K)");
  const GgufType gu_type = parse_type(type_names[0]), down_type = parse_type(type_names[1]);
  std::vector<uint32_t> tokens;
  for (const auto& n : split(o.tokens, ',')) {
    if (n.size() > 5 || n.find_first_not_of("0123456789") != std::string::npos || std::stoul(n) == 0)
      throw InvalidArgument("--tokens: '" + n + "' is not a token count (1..99999)");
    tokens.push_back(uint32_t(std::stoul(n)));
  }
  const std::vector<std::optional<uint32_t>> digit_runs = parse_digit_runs(o.prompt_digits);
  const uint32_t W = sh->width, F = sh->ffn, E = sh->experts, K = sh->used;
  for (const GgufType t : {gu_type, down_type})
    if (W % block_elems(t) || F % block_elems(t))
      throw InvalidArgument(std::string("--types: ") + type_name(t) + "'s " + std::to_string(block_elems(t)) +
                            "-element blocks do not divide " + sh->name + "'s rows of " + std::to_string(W) + " and " +
                            std::to_string(F));
  uint32_t max_tokens = 1;
  for (uint32_t n : tokens) max_tokens = std::max(max_tokens, n);
  const auto gate_up_bytes = random_weight(gu_type, W, E * 2 * F, 1);
  const auto down_bytes = random_weight(down_type, F, E * W, 2);
  const auto router_bytes = random_weight(GgufType::F32, W, E, 3);

  std::vector<std::string> shapes = split(o.expert_shapes.empty() ? "default" : o.expert_shapes, ',');
  for (auto& s : shapes) {
    if (s == "default") s.clear();
    if (!s.empty()) kernels::parse_matvec_config(s);  // a malformed shape refused before any work
  }
  for (size_t run = 0; run < digit_runs.size() * shapes.size(); ++run) {
    const size_t di = run % digit_runs.size();
    const std::string& expert_shape = shapes[run / digit_runs.size()];
    gpu::ContextOptions options = context_options(o.adapter);
    options.prompt_digits = digit_runs[di];
    options.expert_shape = expert_shape;
    gpu::Context ctx(options);
    if (run == 0) {
      std::printf(
          "adapter %s (%s); %s's experts: %u of %u rows (gate/up interleaved: %u) x %u, %u a token, %s router; "
          "gate/up %s, down %s\n",
          ctx.adapter().name.c_str(), ctx.adapter().backend.c_str(), sh->name, E, F, 2 * F, W, K,
          sh->sigmoid ? "sigmoid" : "softmax", type_name(gu_type), type_name(down_type));
      std::printf(
          "| prompt digits | tokens | pairs an expert | path | ms | chosen experts' GB/s | expert GFLOP/s |\n"
          "|---|---:|---:|---|---:|---:|---:|\n");
    }
    const auto gate_up = kernels::upload_weight(ctx, gu_type, W, uint64_t(E) * 2 * F, gate_up_bytes, "gate/up", 0, E);
    const auto down = kernels::upload_weight(ctx, down_type, F, uint64_t(E) * W, down_bytes, "down", 0, E);
    const auto router = kernels::upload_weight(ctx, GgufType::F32, W, E, router_bytes, "router");
    const uint64_t expert_bytes = tensor_bytes(gu_type, W, 2 * F) + tensor_bytes(down_type, F, W);
    std::mt19937 gen(7);
    auto uniform = [&](size_t n, float lo, float hi) {
      std::vector<float> v(n);
      for (float& f : v) f = lo + (hi - lo) * float(gen()) / 4294967296.f;
      return v;
    };
    std::vector<gpu::Buffer> xs;
    for (uint32_t i = 0; i < kInputs; ++i)
      xs.push_back(ctx.upload<float>(uniform(size_t(max_tokens) * W, -1.f, 1.f), WGPUBufferUsage_Storage, "x"));
    const auto norm = ctx.upload<float>(uniform(W, 0.5f, 1.5f), WGPUBufferUsage_Storage, "norm");
    const auto bias = ctx.upload<float>(uniform(E, -0.1f, 0.1f), WGPUBufferUsage_Storage, "selection bias");
    const uint64_t max_pairs = uint64_t(max_tokens) * K;
    auto buffer = [&](uint64_t bytes, const char* label) {
      return ctx.create_buffer(bytes, WGPUBufferUsage_Storage | WGPUBufferUsage_CopySrc, label);
    };
    const auto logits = buffer(uint64_t(max_tokens) * E * 4, "logits");
    const auto chosen = buffer(max_pairs * 4, "experts");
    const auto weights = buffer(max_pairs * 4, "weights");
    const auto group = buffer(kernels::moe_group_words(uint32_t(max_pairs)) * 4, "group");
    const auto act = buffer(max_pairs * F * 4, "act");
    const auto out = buffer(max_pairs * W * 4, "out");
    // the weighted sums land here, not in x: x stays the same input run after run
    const auto residual = buffer(uint64_t(max_tokens) * W * 4, "residual");
    const gpu::Buffer* sel = sh->sigmoid ? &bias : nullptr;

    for (const uint32_t n : tokens) {
      const uint32_t pairs = n * K;
      uint32_t mm_tile = kernels::moe_matmul_tile(pairs, E, kernels::prompt_digits(ctx, gate_up, pairs) > 0);
      if (mm_tile && o.group_tile) mm_tile = o.group_tile;
      const bool grouped = mm_tile || kernels::moe_tile(pairs, E) > 1;
      const kernels::ExpertRoute route{.logits = &logits, .weights = &weights, .sigmoid_bias = sel};
      // the layer's FFN for input set i, the routing in a dispatch of its own, in the gate/up products
      // (ExpertOptions::route) or in the router's (MatmulOptions::choose)
      enum Routing { kApart, kInGateUp, kInRouter };
      auto layer = [&](gpu::ComputeBatch& b, uint32_t i, Routing routing) {
        const bool fused = routing == kInGateUp;
        const gpu::Buffer& x = xs[i % kInputs];
        if (routing == kInRouter) {
          kernels::encode_matmul(b, ctx, router, x, logits, n,
                                 {.norm = &norm,
                                  .impl = kernels::MatmulImpl::Matvec,
                                  .choose = kernels::MatmulOptions::Choose{
                                      .experts = &chosen, .weights = &weights, .sigmoid_bias = sel, .n_used = K}});
        } else {
          kernels::encode_matmul(b, ctx, router, x, logits, n, {.norm = &norm});
        }
        if (routing == kApart) kernels::encode_moe_route(b, ctx, logits, chosen, weights, n, E, K, true, sel);
        if (grouped) kernels::encode_moe_group(b, ctx, chosen, group, n, E, K, mm_tile);
        kernels::encode_expert_matmul(b, ctx, gate_up, x, act, chosen, n, K,
                                      {.norm = &norm,
                                       .swiglu = true,
                                       .group = grouped ? &group : nullptr,
                                       .group_tile = mm_tile,
                                       .route = fused ? &route : nullptr});
        kernels::ExpertOptions d{.x_per_pair = true, .group = grouped ? &group : nullptr, .group_tile = mm_tile};
        if (!grouped && kernels::expert_combine_fits(ctx, down, n, K)) {
          d.combine = &weights;
          kernels::encode_expert_matmul(b, ctx, down, act, residual, chosen, n, K, d);
          return;
        }
        kernels::encode_expert_matmul(b, ctx, down, act, out, chosen, n, K, d);
        kernels::encode_moe_combine(b, ctx, out, weights, residual, n, K, W);
      };
      // the distinct experts the inputs choose, on average (read back once from each input's routing)
      double distinct = 0;
      for (uint32_t i = 0; i < kInputs; ++i) {
        gpu::ComputeBatch b(ctx, "bench-experts routing");
        kernels::encode_matmul(b, ctx, router, xs[i], logits, n, {.norm = &norm});
        kernels::encode_moe_route(b, ctx, logits, chosen, weights, n, E, K, true, sel);
        b.submit_and_wait();
        const auto ids = ctx.read<uint32_t>(chosen, 0, pairs);
        distinct += double(std::set<uint32_t>(ids.begin(), ids.end()).size()) / kInputs;
      }
      std::vector<Routing> routings{kApart};
      if (!grouped && kernels::expert_route_fits(ctx, gate_up, n, K)) routings.push_back(kInGateUp);
      if (n == 1 && kernels::matvec_takes_choose(ctx, router, K)) routings.push_back(kInRouter);
      for (const Routing routing : routings) {
        const double s = median_time(
            ctx, [&](gpu::ComputeBatch& b, uint32_t i) { layer(b, i, routing); }, kInputs, o.repeats);
        const uint32_t d = mm_tile ? kernels::prompt_digits(ctx, gate_up, pairs) : 0;
        const std::string path = mm_tile   ? "tiles of " + std::to_string(mm_tile) + (d ? ", digits" : ", f32")
                                 : grouped ? "grouped matvec"
                                 : routing == kInGateUp ? "matvec, routing inside gate/up"
                                 : routing == kInRouter ? "matvec, routing inside the router"
                                                        : "matvec, routing apart";
        const std::string shown = expert_shape.empty() ? path : path + " [" + expert_shape + "]";
        const double flops = 2.0 * pairs * (2.0 * F * W + double(W) * F);
        std::printf("| %s | %u | %.2f | %s | %.3f | %.1f | %.1f |\n",
                    digit_runs[di] ? std::to_string(*digit_runs[di]).c_str() : "default", n, double(pairs) / E,
                    shown.c_str(), s * 1e3, distinct * double(expert_bytes) / s / 1e9, flops / s / 1e9);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

const Register reg{
    {"experts", "benchmark a mixture of experts' FFN at a real model's shape: routing, grouping, expert products",
     [](CLI::App& app) -> std::function<int()> {
       auto o = std::make_shared<Options>();
       app.add_option("--adapter", o->adapter, "adapter index or name substring");
       app.add_option("--shape", o->shape, "lfm2-8b-a1b, qwen3-30b-a3b or gpt-oss-20b")->capture_default_str();
       app.add_option("--types", o->types, "the gate/up and the down weights' types")->capture_default_str();
       app.add_option("--tokens", o->tokens, "token counts, comma-separated")->capture_default_str();
       app.add_option("--prompt-digits", o->prompt_digits,
                      "ContextOptions::prompt_digits to sweep, comma-separated 0 to 3 (unset: the adapter's default)");
       app.add_option("--group-tile", o->group_tile,
                      "pairs a tile where the prompt's experts take tiles: 32 or 64 (0: the model's choice)")
           ->capture_default_str();
       app.add_option("--expert-shapes", o->expert_shapes,
                      "the expert products' matvec shapes to sweep, comma-separated THREADSxROWSxGROUPS[xUNITS] or "
                      "default (ContextOptions::expert_shape; tuning)");
       app.add_option("--repeats", o->repeats, "timed samples (median)")->capture_default_str();
       return [o] {
         if (o->repeats == 0) throw InvalidArgument("--repeats must be > 0");
         if (o->group_tile != 0 && o->group_tile != 32 && o->group_tile != 64)
           throw InvalidArgument("--group-tile must be 0, 32 or 64");
         return run_experts(*o);
       };
     }}};

}  // namespace
}  // namespace wgllm::bench
