// `wgllm perplexity`: a model's perplexity on a text file, as llama.cpp's llama-perplexity computes and prints it
// (wgllm/perplexity.h says how).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "command.h"
#include "wgllm/perplexity.h"
#include "wgllm/wgllm.h"

namespace wgllm::cli {
namespace {

struct PerplexityCliOptions {
  std::string model, file, adapter;
  uint32_t n_ctx = 512, n_batch = 2048, ubatch = 512;
  int32_t n_chunks = -1;
  std::optional<uint32_t> prompt_digits;  // LoadOptions::prompt_digits
  bool json = false, no_check_tensors = false;
};

// The most text read: far more than any perplexity run scores (wikitext-2's test set is 1.3 MB).
constexpr uint64_t kTextLimit = 256ull << 20;

int perplexity_command(const PerplexityCliOptions& o) {
  using clock = std::chrono::steady_clock;
  const std::string text = read_prompt_file(o.file, kTextLimit, 0);
  const auto t0 = clock::now();
  // The model's context holds one chunk; the GPU steps take at most -b and --ubatch tokens.
  Model model = load_model(o.model, {.adapter = o.adapter,
                                     .n_ctx = o.n_ctx,
                                     .ubatch = std::max(1u, std::min({o.ubatch, o.n_batch, o.n_ctx})),
                                     .prompt_digits = o.prompt_digits,
                                     .progress = o.json ? nullptr : progress_bar(),
                                     .check_tensors = !o.no_check_tensors});
  const double load_s = std::chrono::duration<double>(clock::now() - t0).count();
  if (!o.json) print_memory(model);
  auto out = [](const std::string& s) {
    if (std::fwrite(s.data(), 1, s.size(), stdout) != s.size() || std::fflush(stdout) != 0)
      throw Error("cannot write to standard output");
  };
  char buf[128];
  const PerplexityResult r = perplexity(
      model, text, {.n_ctx = o.n_ctx, .n_batch = o.n_batch, .n_chunks = o.n_chunks}, [&](const PerplexityChunk& c) {
        if (o.json) return;
        if (c.index == 0) {
          std::fprintf(stderr, "perplexity: calculating perplexity over %u chunks, n_ctx=%u, batch_size=%u\n",
                       c.n_chunks, o.n_ctx, std::min(o.n_batch, o.n_ctx));
          std::fprintf(stderr, "perplexity: %.2f seconds per pass - ETA %.2f minutes\n", c.seconds,
                       c.seconds * c.n_chunks / 60.0);
        }
        std::snprintf(buf, sizeof buf, "[%u]%.4f,", c.index + 1, c.ppl);
        out(buf);
      });
  const double tokens_per_s = double(r.n_chunks) * r.n_ctx / r.eval_seconds;
  if (o.json) {
    nlohmann::json chunks = nlohmann::json::array();
    for (size_t i = 0; i < r.chunk_ppl.size(); ++i)
      chunks.push_back({{"ppl", r.chunk_ppl[i]}, {"seconds", r.chunk_seconds[i]}});
    const nlohmann::json j = {
        {"ppl", r.ppl},
        {"uncertainty", std::isfinite(r.uncertainty) ? nlohmann::json(r.uncertainty) : nlohmann::json(nullptr)},
        {"n_tokens", r.n_tokens},
        {"n_ctx", r.n_ctx},
        {"n_batch", r.n_batch},
        {"n_chunks", r.n_chunks},
        {"n_scored", r.n_scored},
        {"add_bos", r.add_bos},
        {"chunks", chunks},
        {"timings",
         {{"load_s", load_s},
          {"tokenize_s", r.tokenize_seconds},
          {"eval_s", r.eval_seconds},
          {"tokens_per_s", tokens_per_s}}}};
    out(j.dump() + "\n");
    return 0;
  }
  out("\n");
  if (std::isfinite(r.uncertainty)) {
    std::snprintf(buf, sizeof buf, "Final estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.uncertainty);
    out(buf);
  } else {
    std::snprintf(buf, sizeof buf, "Final estimate: PPL = %.4f (no uncertainty: too few tokens or no spread)\n", r.ppl);
    out(buf);
  }
  std::fprintf(stderr, "load %.2f s, %u tokens (tokenized in %.1f ms), %u chunks of %u in %.2f s (%.1f tok/s)\n",
               load_s, r.n_tokens, r.tokenize_seconds * 1e3, r.n_chunks, r.n_ctx, r.eval_seconds, tokens_per_s);
  return 0;
}

const Register reg{{"perplexity", "perplexity of a model on a text file, as llama.cpp's llama-perplexity",
                    [](CLI::App& app) -> std::function<int()> {
                      auto o = std::make_shared<PerplexityCliOptions>();
                      app.add_option("-m,--model", o->model, "GGUF model file");
                      app.add_option("-f,--file", o->file, "the text (-: standard input)")->required();
                      app.add_option("-c,--ctx-size", o->n_ctx, "tokens per chunk")->capture_default_str();
                      app.add_option("-b,--batch-size", o->n_batch,
                                     "tokens per forward call: below -c, or a multiple of it")
                          ->capture_default_str();
                      app.add_option("--chunks", o->n_chunks, "chunks to score (-1: all)")->capture_default_str();
                      app.add_flag("--json", o->json, "print one JSON object (per-chunk values, PPL, timings)");
                      app.add_option("--ubatch", o->ubatch, "most tokens per GPU step")->capture_default_str();
                      app.add_option("--adapter", o->adapter, "adapter index or name part (wgllm info --list)");
                      add_prompt_digits(app, o->prompt_digits);
                      app.add_flag("--no-check-tensors", o->no_check_tensors,
                                   "skip the scan of the weights for NaN and infinities at load");
                      return [o] { return perplexity_command(*o); };
                    }}};

}  // namespace
}  // namespace wgllm::cli
