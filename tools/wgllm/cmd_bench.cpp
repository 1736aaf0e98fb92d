// `wgllm bench`: prompt processing (pp) and generation (tg) speed of a model, llama-bench style.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "command.h"
#include "wgllm/batch.h"
#include "wgllm/profile.h"

namespace wgllm::cli {
namespace {

struct BenchOptions {
  std::string model, adapter;
  uint32_t n_prompt = 512, n_gen = 128, repeats = 5, ubatch = 512;
  uint32_t depth = 0;  // tokens already in the cache when pp and tg start (llama-bench's -d)
  bool json = false;
  bool profile = false;  // after the table: GPU time per kernel of one prompt (n_prompt) and n_gen decode steps
  bool tg_host = false;  // also time tg with every step's token chosen on the host from its logits read back
  bool parallel_host = false;  // --parallel's streams choose their tokens on the host (SamplingParams::host)
  SamplingParams sampling{.temperature = 0};  // tg's token choice (default greedy)
  int32_t layers_per_submit = -1;
  std::optional<uint32_t> prompt_digits;    // LoadOptions::prompt_digits
  std::optional<uint32_t> decode_gqa_from;  // depth from which decode attention runs per GQA group; unset: adapter's
  std::vector<uint32_t> parallel;           // concurrent streams through BatchEngine (continuous batching)
  int int_dot = 0;                          // LoadOptions::int_dot: --int-dot 1, --no-int-dot -1, unset 0
  int fuse_post_norms = 0;                  // LoadOptions::fuse_post_norms, likewise
  int fuse_qk_norm = 0;                     // LoadOptions::fuse_qk_norm, likewise
  int fuse_moe_route = 0;                   // LoadOptions::fuse_moe_route, likewise
  int fuse_router = 0;                      // LoadOptions::fuse_router, likewise
};

struct Stat {
  double median, min, max;  // tokens per second
};

// "greedy" or "temp 0.8, top-k 40, top-p 0.9, min-p 0.05" (and the penalty when on).
std::string sampling_name(const SamplingParams& p) {
  char buf[160];
  if (p.temperature <= 0)
    std::snprintf(buf, sizeof buf, "greedy");
  else
    std::snprintf(buf, sizeof buf, "temp %g, top-k %d, top-p %g, min-p %g", p.temperature, p.top_k, p.top_p, p.min_p);
  std::string s = buf;
  if (p.repeat_penalty != 1.f) {
    std::snprintf(buf, sizeof buf, ", repeat-penalty %g over %d", p.repeat_penalty, p.repeat_last_n);
    s += buf;
  }
  return s;
}

Stat stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double med = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return {med, v.front(), v.back()};
}

std::vector<int32_t> random_tokens(uint32_t n, uint32_t n_vocab, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::uniform_int_distribution<int32_t> d(0, int32_t(n_vocab) - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(gen);
  return t;
}

// The cache emptied, then filled with `depth` tokens (untimed).
void fill(Session& s, const std::vector<int32_t>& depth) {
  s.reset();
  if (!depth.empty()) s.feed(depth);
}

// Tokens per second of feeding n_prompt tokens after `depth` cached ones.
double time_pp(Session& s, const std::vector<int32_t>& prompt, const std::vector<int32_t>& depth) {
  fill(s, depth);
  const auto t0 = std::chrono::steady_clock::now();
  s.feed(prompt);
  return prompt.size() / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Tokens per second of n one-token steps after `depth` cached tokens, each step's token chosen by `sampling` as
// `wgllm run` chooses it (Session::decode: on GPUs the argmax or the draw stays there and each step is queued before
// the previous one's id is back), or with `host`, from each step's logits read back to the host (what host sampling
// costs).
double time_tg(Session& s, uint32_t n, uint32_t n_vocab, const std::vector<int32_t>& depth, bool host,
               SamplingParams sampling) {
  fill(s, depth);
  const std::vector<int32_t> ids = random_tokens(1, n_vocab, 2);
  sampling.host = host;
  const auto t0 = std::chrono::steady_clock::now();
  if (s.decode(ids[0], n, sampling) != n) throw Error("bench: decoding stopped before " + std::to_string(n) + " steps");
  return n / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Work under the GPU timestamp profiler, per unit of work (a decode step, or one prompt of n_prompt tokens): GPU time
// per kernel (and grid), their sum, the GPU span (first timestamp to last) and the wall time of Session::feed.
struct RunProfile {
  const char* unit = "step";  // "step": one decode step; "prompt": one prompt fed whole
  uint32_t units = 0;
  ProfileReport report;
  double wall_ns = 0;  // all units
  // One unit without the profiler (median): for decode, of the tg-host run when there is one (the same feed per token
  // as the profiled steps), else of the tg run (greedy decoding, no logits readback); for a prompt, of the pp run.
  double normal_us = 0;
  const char* normal_run = "tg";
};

// Runs `feed(i)` for i < n (one unit of work each) under a profiler attached to `model`, after `fill(s, depth)`
// outside the profile; one untimed run before it makes the query sets and readback buffers.
template <typename Feed>
RunProfile profile_runs(const Model& model, Session& s, const char* unit, uint32_t n, const std::vector<int32_t>& depth,
                        Feed feed) {
  if (!Profiler::supported(model)) throw GpuError("--profile: the adapter has no timestamp-query feature");
  Profiler profiler(model);  // attached until it goes, however this returns
  fill(s, depth);
  feed(0);
  profiler.collect();
  profiler.reset();
  fill(s, depth);
  profiler.collect();  // the fill's batches are not part of the profile
  profiler.reset();
  RunProfile p;
  p.unit = unit;
  p.units = n;
  for (uint32_t i = 0; i < n; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    feed(i);
    p.wall_ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
    profiler.collect();  // one window per unit: feed() has read the logits back, so its work is done
  }
  p.report = profiler.report();
  s.reset();  // drops a step the session encoded ahead under this profiler
  return p;
}

// n decode steps after `depth` cached tokens, one token each.
RunProfile profile_decode(const Model& model, Session& s, uint32_t n, const std::vector<int32_t>& depth) {
  const std::vector<int32_t> ids = random_tokens(n, model.info().n_vocab, 2);
  return profile_runs(model, s, "step", n, depth, [&](uint32_t i) { s.feed(std::span(&ids[i], 1)); });
}

// One prompt fed whole after `depth` cached tokens, as a pp run feeds it.
RunProfile profile_prompt(const Model& model, Session& s, const std::vector<int32_t>& prompt,
                          const std::vector<int32_t>& depth) {
  return profile_runs(model, s, "prompt", 1, depth, [&](uint32_t) { s.feed(prompt); });
}

constexpr const char* kProfileNote =
    "one compute pass per dispatch (the normal run shares passes), so a profiled run is slower than the normal one";

nlohmann::json profile_json(const RunProfile& p) {
  const std::string per = std::string("_per_") + p.unit;
  const double units = p.units, us = 1e3 * units;  // ns in all units -> us per unit
  nlohmann::json kernels = nlohmann::json::array();
  for (const KernelTime& k : p.report.kernels)
    kernels.push_back({{"kernel", k.name},
                       {"detail", k.detail},
                       {"workgroups", k.workgroups},
                       {"calls" + per, k.calls / units},
                       {"us" + per, k.ns / us},
                       {"us_per_call", k.ns / 1e3 / double(k.calls)},
                       {"pct_of_kernel_time", 100 * k.ns / p.report.kernel_ns},
                       {std::string("pct_of_") + p.unit, 100 * k.ns / p.wall_ns}});
  return {{std::string(p.unit) + "s", p.units},
          {"kernels", kernels},
          {"kernel_us" + per, p.report.kernel_ns / us},
          {"gpu_span_us" + per, p.report.window_span_ns / us},
          {"wall_us" + per, p.wall_ns / us},
          {"normal_wall_us" + per, p.normal_us},
          {"dispatches" + per, p.report.dispatches / units},
          {"batches" + per, p.report.batches / units},
          {"note", kProfileNote}};
}
// A profile row's kernel as the table shows it: the last shader file and the entry point (the files before it are
// the shared code it is compiled after), then the pipeline's variant: "matvec.wgsl:matvec Q4_K 64x4x2 1 token".
std::string profile_label(const KernelTime& k) {
  const size_t plus = k.name.rfind('+');
  const std::string tail = plus == std::string::npos ? k.name : k.name.substr(plus + 1);
  return k.detail.empty() ? tail : tail + " " + k.detail;
}

void print_profile(const RunProfile& p, const std::string& title) {
  const std::string u = p.unit;
  const double units = p.units, us = 1e3 * units;
  const double kernel = p.report.kernel_ns / us, span = p.report.window_span_ns / us, wall = p.wall_ns / us;
  std::printf("\n%s, GPU timestamps; %s\n", title.c_str(), kProfileNote);
  std::printf("| %-56s | %10s | %12s | %10s | %10s | %8s | %8s |\n", "kernel", "workgroups", ("calls/" + u).c_str(),
              ("us/" + u).c_str(), "us/call", "% kernel", ("% " + u).c_str());
  std::printf("|%s|%s|%s|%s|%s|%s|%s|\n", std::string(58, '-').c_str(), std::string(12, '-').c_str(),
              std::string(14, '-').c_str(), std::string(12, '-').c_str(), std::string(12, '-').c_str(),
              std::string(10, '-').c_str(), std::string(10, '-').c_str());
  for (const KernelTime& k : p.report.kernels)
    std::printf("| %-56.56s | %10llu | %12.2f | %10.1f | %10.2f | %8.1f | %8.1f |\n", profile_label(k).c_str(),
                static_cast<unsigned long long>(k.workgroups), k.calls / units, k.ns / us, k.ns / 1e3 / double(k.calls),
                100 * k.ns / p.report.kernel_ns, 100 * k.ns / p.wall_ns);
  std::printf("kernel time per %-6s %10.1f us  (%.1f dispatches in %.1f command buffers)\n", u.c_str(), kernel,
              p.report.dispatches / units, p.report.batches / units);
  std::printf("GPU span per %-6s    %10.1f us  (first timestamp to last; %.1f us not in a kernel)\n", u.c_str(), span,
              span - kernel);
  std::printf(
      "wall time per %-6s   %10.1f us  (Session::feed; %.1f us outside the GPU span: encode, submit, "
      "logits readback)\n",
      u.c_str(), wall, wall - span);
  std::printf("wall time per %-6s   %10.1f us  without the profiler (the %s run above)\n", u.c_str(), p.normal_us,
              p.normal_run);
}

// Continuous batching: n streams, each a random prompt of n_prompt tokens and n_gen greedy tokens, submitted at once
// to a BatchEngine of n slots. The aggregate generation rate counts the tokens made after every stream has its first
// token (all prompts in) until the last one ends, as llama-batched-bench's S_TG does.
struct ParallelRun {
  double tg_tokens_per_s = 0;  // aggregate over the streams
  double pp_seconds = 0;       // submit to the last first token
  double total_seconds = 0;
  double host_us_per_step = 0;  // the engine's host work per decode step (BatchStats::decode_host_seconds)
};

ParallelRun time_parallel(const Model& model, uint32_t n, uint32_t n_prompt, uint32_t n_gen, uint32_t chunk,
                          const SamplingParams& sampling) {
  using clock = std::chrono::steady_clock;
  BatchEngine engine(model, {.parallel = n, .queue = n, .n_ctx = n_prompt + n_gen + 1, .prefill_chunk = chunk});
  struct Stream {
    std::vector<clock::time_point> at;  // each token's arrival
  };
  std::vector<Stream> streams(n);
  std::mutex mu;
  std::condition_variable cv;
  uint32_t done = 0;
  const auto t0 = clock::now();
  for (uint32_t i = 0; i < n; ++i) {
    CompletionRequest r;
    r.prompt = random_tokens(std::max<uint32_t>(n_prompt, 1), model.info().n_vocab, 100 + i);
    r.sampling = sampling;  // each stream its own seed
    r.sampling.seed = sampling.seed + i;
    r.max_tokens = n_gen;
    engine.submit(std::move(r), [&, i](const CompletionEvent& e) {
      std::lock_guard lock(mu);
      if (e.done) {
        ++done;
        cv.notify_all();
      } else {
        streams[i].at.push_back(clock::now());
      }
      return true;
    });
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done == n; });
  clock::time_point all_first = t0, end = t0;
  for (const Stream& st : streams) {
    if (st.at.empty()) throw Error("bench --parallel: a stream ended without a token");
    all_first = std::max(all_first, st.at.front());
    end = std::max(end, st.at.back());
  }
  uint64_t after = 0;
  for (const Stream& st : streams)
    after += std::count_if(st.at.begin(), st.at.end(), [&](auto t) { return t > all_first; });
  ParallelRun r;
  r.pp_seconds = std::chrono::duration<double>(all_first - t0).count();
  r.total_seconds = std::chrono::duration<double>(end - t0).count();
  const double tg = std::chrono::duration<double>(end - all_first).count();
  r.tg_tokens_per_s = tg > 0 ? double(after) / tg : 0;
  const BatchStats st = engine.stats();
  r.host_us_per_step = st.decode_steps ? 1e6 * st.decode_host_seconds / double(st.decode_steps) : 0;
  return r;
}

int bench(const BenchOptions& o) {
  if (o.profile && !o.n_gen && !o.n_prompt)
    throw InvalidArgument("--profile times the prompt and decode steps: give -p or -n > 0");
  validate(o.sampling);  // a bad option fails before the load
  const uint32_t n_ctx = o.depth + std::max<uint32_t>(std::max(o.n_prompt, o.n_gen), 1) +
                         (o.parallel.empty() ? 0 : o.n_prompt + o.n_gen + 1);
  Model model = load_model(
      o.model,
      {.adapter = o.adapter,
       .n_ctx = n_ctx,
       .ubatch = o.ubatch,
       .layers_per_submit = o.layers_per_submit < 0 ? std::nullopt : std::optional<uint32_t>(o.layers_per_submit),
       .decode_gqa_from = o.decode_gqa_from,
       .int_dot = tri_state(o.int_dot),
       .prompt_digits = o.prompt_digits,
       .fuse_post_norms = tri_state(o.fuse_post_norms),
       .fuse_qk_norm = tri_state(o.fuse_qk_norm),
       .fuse_moe_route = tri_state(o.fuse_moe_route),
       .fuse_router = tri_state(o.fuse_router),
       .progress = o.json ? nullptr : progress_bar()});
  const ModelInfo& info = model.info();
  if (!o.json) print_memory(model);
  Session s(model);
  const std::vector<int32_t> prompt = random_tokens(o.n_prompt, info.n_vocab, 1);
  const std::vector<int32_t> depth = random_tokens(o.depth, info.n_vocab, 3);
  // Untimed runs of each for at least 1.5 s: they compile the shaders, and GPUs raise their clocks only
  // under sustained load (an idle H200 runs its cores at 345 MHz; after half a second of warm-up the first
  // timed tg128 could still run at 2/3 speed).
  using clock = std::chrono::steady_clock;
  auto warm = [](auto run) {
    for (const auto t0 = clock::now(); std::chrono::duration<double>(clock::now() - t0).count() < 1.5;) run();
  };
  if (o.n_prompt) warm([&] { time_pp(s, prompt, depth); });
  if (o.n_gen) warm([&] { time_tg(s, std::min<uint32_t>(o.n_gen, 8), info.n_vocab, depth, false, o.sampling); });
  if (o.n_gen && o.tg_host)
    warm([&] { time_tg(s, std::min<uint32_t>(o.n_gen, 8), info.n_vocab, depth, true, o.sampling); });
  std::vector<double> pp, tg, tg_host, tg_work_us;  // tg_work_us: the host work per tg step (decode_host_time)
  for (uint32_t r = 0; r < std::max<uint32_t>(o.repeats, 1); ++r) {
    if (o.n_prompt) pp.push_back(time_pp(s, prompt, depth));
    if (o.n_gen) {
      const Session::DecodeHostTime h0 = s.decode_host_time();
      tg.push_back(time_tg(s, o.n_gen, info.n_vocab, depth, false, o.sampling));
      const Session::DecodeHostTime h1 = s.decode_host_time();
      if (h1.steps > h0.steps) tg_work_us.push_back(1e6 * (h1.seconds - h0.seconds) / double(h1.steps - h0.steps));
    }
    if (o.n_gen && o.tg_host) tg_host.push_back(time_tg(s, o.n_gen, info.n_vocab, depth, true, o.sampling));
  }
  // Streams through BatchEngine: a warm-up at the largest count, then each count r times (median).
  struct Par {
    uint32_t streams;
    Stat tg;
    double host_us;  // per decode step, median over the runs
  };
  std::vector<Par> par;
  if (!o.parallel.empty()) {
    const uint32_t chunk = std::min<uint32_t>(o.ubatch, 128);
    SamplingParams par_sampling = o.sampling;
    par_sampling.host = o.parallel_host;
    time_parallel(model, *std::max_element(o.parallel.begin(), o.parallel.end()), o.n_prompt,
                  std::min<uint32_t>(o.n_gen, 8), chunk, par_sampling);
    for (uint32_t n : o.parallel) {
      std::vector<double> v, host;
      for (uint32_t r = 0; r < std::max<uint32_t>(o.repeats, 1); ++r) {
        const ParallelRun run = time_parallel(model, n, o.n_prompt, o.n_gen, chunk, par_sampling);
        v.push_back(run.tg_tokens_per_s);
        host.push_back(run.host_us_per_step);
      }
      par.push_back({n, stats(v), stats(host).median});
    }
  }
  std::optional<RunProfile> profile, prompt_profile;
  if (o.profile && o.n_prompt) {
    prompt_profile = profile_prompt(model, s, prompt, depth);
    prompt_profile->normal_us = 1e6 * o.n_prompt / stats(pp).median;
    prompt_profile->normal_run = "pp";
  }
  if (o.profile && o.n_gen) {
    profile = profile_decode(model, s, o.n_gen, depth);
    profile->normal_us = 1e6 / stats(tg_host.empty() ? tg : tg_host).median;
    profile->normal_run = tg_host.empty() ? "tg" : "tg-host";
  }
  const double gb = info.bytes_per_token / 1e9;
  if (o.json) {
    nlohmann::json j = {{"model", info.arch},
                        {"type", info.weight_type},
                        {"params", info.n_params},
                        {"adapter", info.adapter},
                        {"weight_bytes", info.weight_bytes},
                        {"depth", o.depth},
                        {"decode_gqa_from", info.decode_gqa_from},
                        {"int_dot", info.int_dot},
                        {"fuse_post_norms", info.fuse_post_norms},
                        {"fuse_qk_norm", info.fuse_qk_norm},
                        {"fuse_moe_route", info.fuse_moe_route},
                        {"fuse_router", info.fuse_router},
                        {"fuse_rows_rope", info.fuse_rows_rope},
                        {"prompt_digits", info.prompt_digits}};
    if (!pp.empty()) {
      const Stat p = stats(pp);
      j["pp"] = {{"n", o.n_prompt}, {"tokens_per_s", p.median}, {"min", p.min}, {"max", p.max}};
    }
    for (auto [key, v] : {std::pair{"tg", &tg}, std::pair{"tg_host", &tg_host}}) {
      if (v->empty()) continue;
      const Stat t = stats(*v);
      j[key] = {{"n", o.n_gen}, {"tokens_per_s", t.median},         {"min", t.min},
                {"max", t.max}, {"decode_gb_per_s", gb * t.median}, {"sampling", sampling_name(o.sampling)}};
    }
    if (!tg_work_us.empty()) j["tg"]["host_us_per_step"] = stats(tg_work_us).median;
    if (profile) j["profile"] = profile_json(*profile);
    if (prompt_profile) j["prompt_profile"] = profile_json(*prompt_profile);
    for (const auto& [n, st, host_us] : par)
      j["parallel"].push_back({{"streams", n},
                               {"tokens_per_s", st.median},
                               {"min", st.min},
                               {"max", st.max},
                               {"per_stream", st.median / n},
                               {"vs_one_stream", st.median / par.front().tg.median},
                               {"host_us_per_step", host_us}});
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  const std::string model_name = info.arch + " " + std::to_string(info.n_layer) + "L " + std::to_string(info.n_embd);
  std::printf("| %-16s | %-6s | %9s | %-24.24s | %13s | %24s | %10s |\n", "model", "type", "params", "adapter", "test",
              "t/s (median [min, max])", "GB/s");
  std::printf("|%s|%s|%s|%s|%s|%s|%s|\n", std::string(18, '-').c_str(), std::string(8, '-').c_str(),
              std::string(11, '-').c_str(), std::string(26, '-').c_str(), std::string(15, '-').c_str(),
              std::string(26, '-').c_str(), std::string(12, '-').c_str());
  auto row = [&](const char* kind, uint32_t n, const Stat& st, double gbs) {
    const std::string test = kind + std::to_string(n) + (o.depth ? " @ d" + std::to_string(o.depth) : "");
    char ts[64], gbuf[32] = "";
    std::snprintf(ts, sizeof ts, "%.2f [%.2f, %.2f]", st.median, st.min, st.max);
    if (gbs > 0) std::snprintf(gbuf, sizeof gbuf, "%.2f", gbs);
    std::printf("| %-16s | %-6s | %8.2fM | %-24.24s | %13s | %24s | %10s |\n", model_name.c_str(),
                info.weight_type.c_str(), info.n_params / 1e6, info.adapter.c_str(), test.c_str(), ts, gbuf);
  };
  if (!pp.empty()) row("pp", o.n_prompt, stats(pp), 0);
  if (!tg.empty()) row("tg", o.n_gen, stats(tg), gb * stats(tg).median);
  if (!tg_host.empty()) row("tg-host", o.n_gen, stats(tg_host), gb * stats(tg_host).median);
  std::printf("decode GB/s = %.2f MB of weights read per token x tokens/s\n", gb * 1e3);
  std::printf("decode options: %s, %s, %s\n", info.int_dot ? "--int-dot" : "--no-int-dot",
              info.fuse_post_norms ? "--fuse-post-norms" : "--no-fuse-post-norms",
              info.fuse_qk_norm ? "--fuse-qk-norm" : "--no-fuse-qk-norm");
  if (info.n_expert)
    std::printf("MoE decode options: %s %s\n", info.fuse_moe_route ? "--fuse-moe-route" : "--no-fuse-moe-route",
                info.fuse_router ? "--fuse-router" : "--no-fuse-router");
  if (info.prompt_digits) std::printf("prompt option: --prompt-digits %u\n", info.prompt_digits);
  std::printf("tg: %s (Session::decode: the token chosen on the GPU; on the host on CPU adapters)%s\n",
              sampling_name(o.sampling).c_str(),
              tg_host.empty() ? "" : "; tg-host: each step's logits read back, the token chosen on the host");
  if (!tg_work_us.empty())
    std::printf("tg host work: %.1f us per step encoding and submitting it (median; the step takes %.1f us)\n",
                stats(tg_work_us).median, 1e6 / stats(tg).median);
  if (!par.empty()) {
    std::printf(
        "\ncontinuous batching (BatchEngine): N streams, each pp%u then tg%u %s; aggregate tg t/s once every "
        "stream has its first token\n",
        o.n_prompt, o.n_gen, (sampling_name(o.sampling) + (o.parallel_host ? ", chosen on the host" : "")).c_str());
    std::printf("| %7s | %24s | %12s | %14s | %18s |\n", "streams", "t/s (median [min, max])", "per stream",
                "vs 1st row", "host us / step");
    std::printf("|%s|%s|%s|%s|%s|\n", std::string(9, '-').c_str(), std::string(26, '-').c_str(),
                std::string(14, '-').c_str(), std::string(16, '-').c_str(), std::string(20, '-').c_str());
    for (const auto& [n, st, host_us] : par)
      std::printf("| %7u | %10.1f [%.1f, %.1f] | %12.1f | %13.2fx | %18.1f |\n", n, st.median, st.min, st.max,
                  st.median / n, st.median / par.front().tg.median, host_us);
  }
  const std::string at = o.depth ? " after " + std::to_string(o.depth) + " cached tokens" : "";
  if (prompt_profile) print_profile(*prompt_profile, "prompt profile: one pp" + std::to_string(o.n_prompt) + at);
  if (profile) print_profile(*profile, "decode profile: " + std::to_string(o.n_gen) + " steps" + at);
  return 0;
}

const Register reg{
    {"bench", "prompt processing and generation speed of a model", [](CLI::App& app) -> std::function<int()> {
       auto o = std::make_shared<BenchOptions>();
       app.add_option("-m,--model", o->model, "GGUF model file");
       app.add_option("-p,--n-prompt", o->n_prompt, "prompt tokens (0: skip pp)")->capture_default_str();
       app.add_option("-n,--n-gen", o->n_gen, "generated tokens (0: skip tg)")->capture_default_str();
       app.add_option("-r,--repetitions", o->repeats, "repeats of each test")->capture_default_str();
       app.add_option("-d,--depth", o->depth, "tokens already cached when each test starts (filled untimed)")
           ->capture_default_str();
       app.add_option("--ubatch", o->ubatch, "prompt tokens per GPU step")->capture_default_str();
       app.add_option("--adapter", o->adapter, "adapter index or name part (wgllm info --list)");
       add_prompt_digits(app, o->prompt_digits);
       app.add_flag("--json", o->json, "print one JSON object");
       app.add_flag("--profile", o->profile,
                    "then one prompt of -p tokens and -n decode steps with GPU timestamps: time per kernel and "
                    "grid, their sum, the GPU span and the wall time per prompt and per step (one compute pass "
                    "per dispatch, so not identical to the normal run)");
       app.add_flag("--tg-host", o->tg_host,
                    "also time tg with each step's logits read back and its token chosen on the host");
       app.add_flag("--parallel-host", o->parallel_host,
                    "--parallel's streams read their logits back and choose their tokens on the host");
       app.add_option("--temp", o->sampling.temperature, "tg's (and --parallel's) temperature (0: greedy)")
           ->capture_default_str();
       app.add_option("--top-k", o->sampling.top_k, "tg top-k (0: off)")->capture_default_str();
       app.add_option("--top-p", o->sampling.top_p, "tg top-p (1: off)")->capture_default_str();
       app.add_option("--min-p", o->sampling.min_p, "tg min-p (0: off)")->capture_default_str();
       app.add_option("--repeat-penalty", o->sampling.repeat_penalty, "tg repetition penalty (1: off)")
           ->capture_default_str();
       app.add_option("--repeat-last-n", o->sampling.repeat_last_n, "tokens the penalty looks at")
           ->capture_default_str();
       app.add_option("--seed", o->sampling.seed, "tg sampling seed")->capture_default_str();
       app.add_option("--layers-per-submit", o->layers_per_submit,
                      "command buffers per step: one after layer 0, then every N layers (0: one; -1: auto)")
           ->capture_default_str();
       app.add_option("--decode-gqa-from", o->decode_gqa_from,
                      "decode attention per GQA group (each K/V row read once per KV head) from this depth on "
                      "(0: always; past the context: never; default: 8192 on GPUs, 0 on CPU adapters)");
       app.add_flag("--int-dot,!--no-int-dot", o->int_dot,
                    "decode the FFN's Q4_K gate/up products and a Q4_K / Q6_K LM head on packed int8 dot products "
                    "(LoadOptions::int_dot; "
                    "default: on GPUs for models 2,048 wide or more)")
           ->group("Advanced");
       app.add_flag("--fuse-post-norms,!--no-fuse-post-norms", o->fuse_post_norms,
                    "decoding, gemma's post norms in the next product's prologue (LoadOptions::fuse_post_norms; "
                    "default: on GPUs for gemma3)")
           ->group("Advanced");
       app.add_flag("--fuse-qk-norm,!--no-fuse-qk-norm", o->fuse_qk_norm,
                    "decoding, the q/k norms, RoPE and the KV append inside the attention dispatch "
                    "(LoadOptions::fuse_qk_norm; one sequence: models with q/k norms; --parallel's batched steps: "
                    "every model; default: on GPUs for one sequence of a model with q/k norms, on for batched steps)")
           ->group("Advanced");
       app.add_flag("--fuse-moe-route,!--no-fuse-moe-route", o->fuse_moe_route,
                    "decoding a mixture of experts, the routing inside the experts' gate/up products "
                    "(LoadOptions::fuse_moe_route; default: off)")
           ->group("Advanced");
       app.add_flag("--fuse-router,!--no-fuse-router", o->fuse_router,
                    "decoding a mixture of experts, the routing inside the router's product (LoadOptions::fuse_router; "
                    "default: off)")
           ->group("Advanced");
       app.add_option("--parallel", o->parallel,
                      "then N concurrent streams (a list: 1,4,16) through continuous batching, each -p prompt "
                      "tokens and -n generated (greedy, or sampled as --temp etc. say, each stream its own seed): "
                      "aggregate generation t/s")
           ->delimiter(',');
       return [o] { return bench(*o); };
     }}};

}  // namespace
}  // namespace wgllm::cli
