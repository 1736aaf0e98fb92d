// `wgllm bench --profile --json` through the built binary: the decode profile's rows add up to its totals, every
// step runs the same dispatches (one attention per layer), and kernel time <= GPU span <= wall time per step.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <string>

#include "gguf/file.h"
#include "model/config.h"
#include "model_util.h"
#include "test_util.h"

namespace wgllm {
namespace {

// stdout of `wgllm <args>` (stderr dropped) and its exit status.
// The CLI's exit status and stdout; env: "NAME=VALUE " assignments for the command.
std::pair<int, std::string> run_cli(const std::string& args, const std::string& env = "") {
  const std::string cmd = env + std::string(WGLLM_CLI) + " " + args + " 2>/dev/null";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed: " + cmd);
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int st = pclose(pipe);
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, out};
}

TEST(CliBench, ProfileJsonAddsUp) {
  if (!test::context().features().timestamp_query) GTEST_SKIP() << "the adapter has no timestamp-query";
  const std::string model = test::model_path("llama-f32");
  const uint32_t n_layer = config_from_gguf(GgufFile::open(model)).n_layer;
  constexpr int kSteps = 3;
  const auto [status, out] =
      run_cli("bench -m " + model + " -p 0 -n " + std::to_string(kSteps) + " -r 1 --profile --json");
  ASSERT_EQ(status, 0) << out;
  const nlohmann::json p = nlohmann::json::parse(out).at("profile");
  EXPECT_EQ(p.at("steps"), kSteps);
  ASSERT_FALSE(p.at("kernels").empty());
  double calls = 0, us = 0, attention = 0, products = 0;
  for (const auto& k : p.at("kernels")) {
    const double c = k.at("calls_per_step");
    EXPECT_EQ(c, std::round(c)) << k.dump() << ": every step runs the same dispatches";
    EXPECT_GE(double(k.at("us_per_call")), 0) << k.dump();
    calls += c;
    us += double(k.at("us_per_step"));
    // one decode attention per layer and step: per head, or per GQA group (CPU adapters' default)
    const std::string name = k.at("kernel");
    const std::string entry = name.substr(name.rfind(':') + 1);
    if (entry == "attention_decode" || entry == "attention_decode_gqa") attention += c;
    // a weight product's row says its weight type and shape (the model's weights are all F32)
    const std::string detail = k.at("detail");
    if (entry == "matvec" || entry == "matmul_rows" || entry == "matmul") {
      EXPECT_EQ(detail.rfind("F32 ", 0), 0u) << k.dump();
      EXPECT_NE(detail.find('x'), std::string::npos) << k.dump();
      products += c;
    } else {
      EXPECT_EQ(detail, "") << k.dump();
    }
  }
  EXPECT_EQ(attention, n_layer);
  EXPECT_GE(products, 4.0 * n_layer + 1);  // q/k/v, Wo, gate/up and down a layer (fused or not), and the LM head
  EXPECT_DOUBLE_EQ(calls, double(p.at("dispatches_per_step")));
  const double kernel = p.at("kernel_us_per_step"), span = p.at("gpu_span_us_per_step");
  const double wall = p.at("wall_us_per_step");
  EXPECT_NEAR(us, kernel, 1e-6 * kernel);
  EXPECT_LE(kernel, span);
  EXPECT_LE(span, wall);
}

// -d fills the cache before each test: past 256 cached keys the decode attention splits the keys and adds its
// reduce pass, once per layer; without -d it does not.
TEST(CliBench, DepthFillsTheCacheBeforeTheSteps) {
  if (!test::context().features().timestamp_query) GTEST_SKIP() << "the adapter has no timestamp-query";
  const std::string model = test::model_path("llama-f32");
  const uint32_t n_layer = config_from_gguf(GgufFile::open(model)).n_layer;
  auto reduce_calls = [&](const std::string& depth) {
    const auto [status, out] = run_cli("bench -m " + model + " -p 4 -n 2 -r 1 --profile --json" + depth);
    EXPECT_EQ(status, 0) << out;
    const nlohmann::json j = nlohmann::json::parse(out);
    EXPECT_EQ(j.at("depth"), depth.empty() ? 0 : 300);
    EXPECT_GT(double(j.at("pp").at("tokens_per_s")), 0);
    double calls = 0;
    for (const auto& k : j.at("profile").at("kernels"))
      if (k.at("kernel") == "attention_common.wgsl+attention.wgsl:attention_decode_reduce")
        calls += double(k.at("calls_per_step"));
    return calls;
  };
  EXPECT_EQ(reduce_calls(" -d 300"), n_layer);
  EXPECT_EQ(reduce_calls(""), 0);
}

// tg (greedy decoding) and, with --tg-host, tg_host (the token chosen on the host) each report n, a rate within [min,
// max] and decode GB/s of at most the weights per token; without the flag there is no tg_host.
TEST(CliBench, TgAndTgHostRows) {
  const std::string model = test::model_path("llama-f32");
  for (const bool host : {true, false}) {
    const auto [status, out] = run_cli("bench -m " + model + " -p 0 -n 5 -r 2 --json" + (host ? " --tg-host" : ""));
    ASSERT_EQ(status, 0) << out;
    const nlohmann::json j = nlohmann::json::parse(out);
    EXPECT_EQ(j.contains("tg_host"), host) << out;
    for (const char* key : {"tg", "tg_host"}) {
      if (!j.contains(key)) continue;
      const nlohmann::json& t = j.at(key);
      EXPECT_EQ(t.at("n").get<int>(), 5) << key;
      const double rate = t.at("tokens_per_s").get<double>();
      EXPECT_GT(rate, 0) << key;
      EXPECT_LE(t.at("min").get<double>(), rate) << key;
      EXPECT_GE(t.at("max").get<double>(), rate) << key;
      // GB per token: the weights one step reads, at most all of them
      const double gb_per_token = t.at("decode_gb_per_s").get<double>() / rate;
      EXPECT_GT(gb_per_token, 0) << key;
      EXPECT_LE(gb_per_token, j.at("weight_bytes").get<double>() / 1e9 * (1 + 1e-9)) << key;
    }
  }
}

// With sampling flags, tg and tg_host decode with them (the JSON names the mode); a flag out of range fails.
TEST(CliBench, SamplingFlags) {
  const std::string model = test::model_path("llama-f32");
  const auto [status, out] =
      run_cli("bench -m " + model + " -p 0 -n 5 -r 1 --json --tg-host --temp 0.8 --top-p 0.9 --top-k 40 --seed 3");
  ASSERT_EQ(status, 0) << out;
  const nlohmann::json j = nlohmann::json::parse(out);
  for (const char* key : {"tg", "tg_host"})
    EXPECT_EQ(j.at(key).at("sampling"), "temp 0.8, top-k 40, top-p 0.9, min-p 0.05") << out;
  const auto [bad, nothing] = run_cli("bench -m " + model + " -p 0 -n 5 --top-p 2");
  EXPECT_EQ(bad, 1);
  EXPECT_EQ(nothing, "");
}

// --decode-gqa-from: at 0 every decode step's attention runs the grouped kernel, once per layer; at 1000 (past the
// depths of 300 and 301 the two steps reach) the per-head one; unset, the adapter's default (0 on CPU adapters, 8192 on
// GPUs). The value in force is in the JSON. A negative one is refused.
TEST(CliBench, DecodeGqaFromPicksTheAttentionKernel) {
  if (!test::context().features().timestamp_query) GTEST_SKIP() << "the adapter has no timestamp-query";
  const std::string model = test::model_path("llama-f32");
  const uint32_t n_layer = config_from_gguf(GgufFile::open(model)).n_layer;
  const int64_t dflt = test::context().adapter().is_cpu() ? 0 : 8192;
  for (const int64_t from : {int64_t(-1), int64_t(0), int64_t(1000)}) {
    const std::string arg = from < 0 ? "" : " --decode-gqa-from " + std::to_string(from);
    const auto [status, out] = run_cli("bench -m " + model + " -p 0 -n 2 -r 1 -d 300 --profile --json" + arg);
    ASSERT_EQ(status, 0) << out;
    const nlohmann::json j = nlohmann::json::parse(out);
    const int64_t in_force = from < 0 ? dflt : from;
    EXPECT_EQ(j.at("decode_gqa_from"), in_force) << arg;
    const bool grouped = in_force <= 300;
    double per_head = 0, gqa = 0;
    for (const auto& k : j.at("profile").at("kernels")) {
      if (k.at("kernel") == "attention_common.wgsl+attention.wgsl:attention_decode")
        per_head += double(k.at("calls_per_step"));
      if (k.at("kernel") == "attention_common.wgsl+attention.wgsl+attention_decode_gqa.wgsl:attention_decode_gqa")
        gqa += double(k.at("calls_per_step"));
    }
    EXPECT_EQ(gqa, grouped ? n_layer : 0) << out;
    EXPECT_EQ(per_head, grouped ? 0 : n_layer) << out;
  }
  EXPECT_NE(run_cli("bench -m " + model + " -p 0 -n 1 -r 1 --decode-gqa-from -1").first, 0);
}

// The decode options as the profile sees them: --int-dot runs x_digits once a layer (the FFN input's digits for its
// Q4_K gate/up) and once for a Q4_K or Q6_K LM head; --fuse-post-norms (on the GPUs' matvec: WGLLM_ROWS_SHAPE=off) takes gemma4's three post norms a
// layer out of rms_norm dispatches and into the next products; --fuse-qk-norm takes qk_norm_rope_kv into the
// attention dispatch; --fuse-moe-route takes moe_route into the experts' gate/up products; the JSON says which options
// were on.
TEST(CliBench, DecodeOptionsInTheProfile) {
  if (!test::context().features().timestamp_query) GTEST_SKIP() << "the adapter has no timestamp-query";
  auto calls = [](const nlohmann::json& j, const std::string& kernel) {
    double n = 0;
    for (const auto& k : j.at("profile").at("kernels"))
      if (k.at("kernel") == kernel) n += double(k.at("calls_per_step"));
    return n;
  };
  // wgllm bench's JSON for two decode steps of `model`, profiled, with `flags` (env: before the command)
  auto bench = [](const std::string& model, const std::string& flags, const std::string& env = "") {
    const auto [status, out] = run_cli("bench -m " + model + " -p 0 -n 2 -r 1 --profile --json" + flags, env);
    EXPECT_EQ(status, 0) << out;
    return nlohmann::json::parse(out);
  };
  const bool cpu = test::context().adapter().is_cpu();
  const std::string q4k = test::model_path("llama-q4_k");
  const uint32_t q4k_layers = config_from_gguf(GgufFile::open(q4k)).n_layer;
  for (const bool on : {false, true}) {
    const nlohmann::json j = bench(q4k, on ? " --int-dot" : " --no-int-dot");
    EXPECT_EQ(j.at("int_dot"), on);
    // one a layer for the FFN's Q4_K gate/up, one for the Q4_K LM head
    EXPECT_EQ(calls(j, "int_dot.wgsl:x_digits"), on ? q4k_layers + 1 : 0) << j.dump();
  }
  // unset: off for a model under 2,048 wide (and on CPU adapters)
  EXPECT_EQ(bench(q4k, "").at("int_dot"), false);
  // --prompt-digits (a prompt option: the decode profile does not see it) in the JSON; unset: 3 on GPUs, 0 on CPU
  // adapters; 0 to 3
  EXPECT_EQ(bench(q4k, "").at("prompt_digits"), cpu ? 0 : 3);
  EXPECT_EQ(bench(q4k, " --prompt-digits 2").at("prompt_digits"), 2);
  EXPECT_EQ(bench(q4k, "", "WGLLM_PROMPT_DIGITS=1 ").at("prompt_digits"), 1);
  EXPECT_NE(run_cli("bench -m " + q4k + " -p 0 -n 1 -r 1 --prompt-digits 4").first, 0);
  const std::string gemma = test::model_path("gemma4-h512-f32");
  const uint32_t gemma_layers = config_from_gguf(GgufFile::open(gemma)).n_layer;
  double norms[2] = {}, off_norms[2] = {};
  for (const bool on : {false, true}) {
    const std::string flag = on ? " --fuse-post-norms" : " --no-fuse-post-norms";
    const nlohmann::json j = bench(gemma, flag);
    EXPECT_EQ(j.at("fuse_post_norms"), on);
    norms[on] = calls(j, "norm.wgsl:rms_norm");
    off_norms[on] = calls(bench(gemma, flag, "WGLLM_ROWS_SHAPE=off "), "norm.wgsl:rms_norm");
  }
  // unset: on for gemma3 on GPUs, off for gemma4 and on CPU adapters
  EXPECT_EQ(bench(gemma, "").at("fuse_post_norms"), false);
  EXPECT_EQ(bench(test::model_path("gemma3-tiny-f32"), "").at("fuse_post_norms"), !cpu);
  // on a CPU adapter the Rows kernel takes the products, and nothing is fused
  const double fused = cpu ? 0 : 3.0 * gemma_layers;
  EXPECT_EQ(norms[0] - norms[1], fused);
  EXPECT_EQ(off_norms[0] - off_norms[1], 3.0 * gemma_layers);
  // --fuse-qk-norm (with the per-head decode kernel, which the fused one extends): gemma3's q/k norms, RoPE and KV
  // append leave their own dispatch for the attention's; unset: on on GPUs, off on CPU adapters
  const std::string gemma3 = test::model_path("gemma3-tiny-f32");
  const uint32_t gemma3_layers = config_from_gguf(GgufFile::open(gemma3)).n_layer;
  for (const bool on : {false, true}) {
    const nlohmann::json j =
        bench(gemma3, std::string(on ? " --fuse-qk-norm" : " --no-fuse-qk-norm") + " --decode-gqa-from 100000");
    EXPECT_EQ(j.at("fuse_qk_norm"), on);
    EXPECT_EQ(j.at("fuse_rows_rope"), on);  // BatchEngine's steps follow the flag, for every model
    const std::string fresh =
        "attention_common.wgsl+attention.wgsl+rope_angle.wgsl+qk_norm_rope.wgsl+"
        "attention_decode_fresh.wgsl:attention_decode_fresh";
    EXPECT_EQ(calls(j, fresh), on ? gemma3_layers : 0) << j.dump();
    EXPECT_EQ(calls(j, "rope_angle.wgsl+qk_norm_rope.wgsl+qk_norm_rope_kv.wgsl:qk_norm_rope_kv"),
              on ? 0 : gemma3_layers)
        << j.dump();
  }
  EXPECT_EQ(bench(gemma3, "").at("fuse_qk_norm"), !cpu);
  EXPECT_EQ(bench(gemma3, "").at("fuse_rows_rope"), true);  // unset: on, every adapter
  // --fuse-moe-route: a mixture of experts' routing leaves its dispatch for the gate/up products'; unset: off
  const std::string moe = test::model_path("lfm2moe-q8_0");
  const ModelConfig mc = config_from_gguf(GgufFile::open(moe));
  uint32_t moe_layers = 0;
  for (uint32_t l = 0; l < mc.n_layer; ++l) moe_layers += mc.is_moe_layer(l);
  ASSERT_GT(moe_layers, 0u);
  for (const bool on : {false, true}) {
    const nlohmann::json j = bench(moe, on ? " --fuse-moe-route" : " --no-fuse-moe-route");
    EXPECT_EQ(j.at("fuse_moe_route"), on);
    EXPECT_EQ(calls(j, "moe_choose.wgsl+moe.wgsl:moe_route"), on ? 0 : moe_layers) << j.dump();
  }
  EXPECT_EQ(bench(moe, "").at("fuse_moe_route"), false);
  EXPECT_EQ(bench(gemma3, "").at("fuse_moe_route"), false);  // not a mixture of experts
  // --fuse-router: the routing inside the router's product (one sequence's decode steps); unset: off
  const nlohmann::json j = bench(moe, " --fuse-router");
  EXPECT_EQ(j.at("fuse_router"), true);
  EXPECT_EQ(calls(j, "moe_choose.wgsl+moe.wgsl:moe_route"), 0) << j.dump();
  EXPECT_EQ(bench(moe, "").at("fuse_router"), false);
}

TEST(CliBench, ProfileNeedsWork) {
  const auto [status, out] = run_cli("bench -m " + test::model_path("llama-f32") + " -p 0 -n 0 -r 1 --profile");
  EXPECT_EQ(status, 1) << out;
}

// With -p, --profile also times one prompt: its rows add up to its totals, each product of a layer runs once a
// prompt (a prompt of 64 tokens is one GPU step), the decode profile is there beside it, and --prompt-digits shows as
// the int8 kernel's rows and their digits' (on the GPUs' tiled kernel: WGLLM_ROWS_SHAPE=off) in place of the tiled
// matmul's.
TEST(CliBench, PromptProfile) {
  if (!test::context().features().timestamp_query) GTEST_SKIP() << "the adapter has no timestamp-query";
  const std::string model = test::model_path("llama-q4_k");
  const uint32_t n_layer = config_from_gguf(GgufFile::open(model)).n_layer;
  auto calls = [](const nlohmann::json& p, const std::string& entry) {
    double n = 0;
    for (const auto& k : p.at("kernels")) {
      const std::string name = k.at("kernel");
      if (name.substr(name.rfind(':') + 1) == entry) n += double(k.at("calls_per_prompt"));
    }
    return n;
  };
  for (const int digits : {0, 1}) {
    const auto [status, out] =
        run_cli("bench -m " + model + " -p 64 -n 2 -r 1 --profile --json --prompt-digits " + std::to_string(digits),
                "WGLLM_ROWS_SHAPE=off ");
    ASSERT_EQ(status, 0) << out;
    const nlohmann::json j = nlohmann::json::parse(out);
    EXPECT_EQ(j.at("profile").at("steps"), 2);
    const nlohmann::json& p = j.at("prompt_profile");
    EXPECT_EQ(p.at("prompts"), 1);
    double us = 0, calls_sum = 0;
    for (const auto& k : p.at("kernels")) {
      const double c = k.at("calls_per_prompt");
      EXPECT_EQ(c, std::round(c)) << k.dump();
      calls_sum += c;
      us += double(k.at("us_per_prompt"));
    }
    EXPECT_DOUBLE_EQ(calls_sum, double(p.at("dispatches_per_prompt")));
    const double kernel = p.at("kernel_us_per_prompt"), span = p.at("gpu_span_us_per_prompt");
    EXPECT_NEAR(us, kernel, 1e-6 * kernel);
    EXPECT_LE(kernel, span);
    EXPECT_LE(span, double(p.at("wall_us_per_prompt")));
    EXPECT_GT(double(p.at("normal_wall_us_per_prompt")), 0);
    const double tiled = calls(p, "matmul"), int8 = calls(p, "matmul_int");
    // q/k/v, Wo, gate/up and down a layer (fused or not); the LM head takes the last token alone
    EXPECT_GE(tiled + int8, 4.0 * n_layer) << p.dump();
    if (digits) {
      EXPECT_GE(int8, 4.0 * n_layer) << p.dump();
      EXPECT_EQ(calls(p, "x_digits"), int8) << p.dump();  // each int8 product's x as digits
    } else {
      EXPECT_EQ(int8, 0) << p.dump();
      EXPECT_EQ(calls(p, "x_digits"), 0) << p.dump();
    }
  }
}

}  // namespace
}  // namespace wgllm
