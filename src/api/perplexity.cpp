// wgllm::perplexity (wgllm/perplexity.h): llama-perplexity's computation (tools/perplexity/perplexity.cpp of
// llama.cpp, `perplexity()`) over a Session whose logits come back a block of rows at a time.
#include "wgllm/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "api/model_impl.h"

namespace wgllm {

double token_nll(std::span<const float> logits, int32_t target) {
  if (target < 0 || size_t(target) >= logits.size())
    throw InvalidArgument("token_nll: target " + std::to_string(target) + " is outside the " +
                          std::to_string(logits.size()) + " logits");
  float max = logits[0];
  for (float v : logits) max = std::max(max, v);
  double sum = 0;
  for (float v : logits) sum += std::exp(v - max);
  return double(max) + std::log(sum) - double(logits[size_t(target)]);
}

double PerplexityStats::mean_nll() const {
  return count_ ? sum_ / double(count_) : std::numeric_limits<double>::quiet_NaN();
}

double PerplexityStats::ppl() const { return std::exp(mean_nll()); }

double PerplexityStats::uncertainty() const {
  if (count_ < 2) return std::numeric_limits<double>::quiet_NaN();
  const double mean = mean_nll(), var = sum2_ / double(count_) - mean * mean;
  if (!(var > 0)) return std::numeric_limits<double>::quiet_NaN();
  return std::sqrt(var / double(count_ - 1)) * ppl();
}

PerplexityResult perplexity(const Model& model, std::string_view text, const PerplexityOptions& o,
                            const std::function<void(const PerplexityChunk&)>& on_chunk) {
  using clock = std::chrono::steady_clock;
  const uint32_t n_ctx = o.n_ctx;
  if (n_ctx < 3)
    throw InvalidArgument("perplexity: the chunk size (-c) must be at least 3, not " + std::to_string(n_ctx));
  if (n_ctx > model.info().n_ctx)
    throw InvalidArgument("perplexity: chunks of " + std::to_string(n_ctx) +
                          " tokens (-c) exceed the model's context of " + std::to_string(model.info().n_ctx));
  if (o.n_batch == 0) throw InvalidArgument("perplexity: the batch size (-b) must be at least 1");
  PerplexityResult r;
  r.n_ctx = n_ctx;
  // llama-perplexity runs n_batch / n_ctx chunks side by side and lowers n_batch to the tokens they hold
  r.n_batch = std::min(o.n_batch, std::max(1u, o.n_batch / n_ctx) * n_ctx);
  r.add_bos = ModelAccess::impl(model).tok().add_bos();
  const auto t0 = clock::now();
  std::vector<int32_t> tokens = model.encode(text, true, false);
  r.tokenize_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  r.n_tokens = uint32_t(tokens.size());
  if (tokens.size() < 2ull * n_ctx)
    throw InvalidArgument("perplexity: the text has " + std::to_string(tokens.size()) + " tokens, fewer than the " +
                          std::to_string(2ull * n_ctx) + " needed with chunks of " + std::to_string(n_ctx) + " (-c)");
  const uint32_t max_chunks = uint32_t(tokens.size() / n_ctx);
  r.n_chunks = o.n_chunks < 0 ? max_chunks : std::min(uint32_t(o.n_chunks), max_chunks);
  const uint32_t first = n_ctx / 2;                   // the first position whose logits are scored
  const uint32_t piece = std::min(r.n_batch, n_ctx);  // tokens per feed

  Session session(model);
  PerplexityStats stats;
  std::vector<int32_t> chunk(n_ctx);
  const auto t_eval = clock::now();
  for (uint32_t c = 0; c < r.n_chunks; ++c) {
    const auto t_chunk = clock::now();
    std::copy_n(tokens.begin() + size_t(c) * n_ctx, n_ctx, chunk.begin());
    if (r.add_bos) chunk[0] = model.bos();
    session.reset();
    for (uint32_t p = 0; p < n_ctx; p += piece) {
      const uint32_t n = std::min(piece, n_ctx - p);
      // logits at position i predict chunk[i + 1]: scored for first <= i < n_ctx - 1
      session.feed_rows(std::span(chunk).subspan(p, n), first > p ? first - p : 0,
                        [&](uint32_t row, std::span<const float> logits) {
                          const size_t V = model.info().n_vocab;
                          for (size_t t = 0; t * V < logits.size(); ++t) {
                            const uint32_t i = p + row + uint32_t(t);
                            if (i + 1 < n_ctx) stats.add(token_nll(logits.subspan(t * V, V), chunk[i + 1]));
                          }
                        });
    }
    const double seconds = std::chrono::duration<double>(clock::now() - t_chunk).count();
    r.chunk_ppl.push_back(stats.ppl());
    r.chunk_seconds.push_back(seconds);
    if (on_chunk) on_chunk({.index = c, .n_chunks = r.n_chunks, .ppl = stats.ppl(), .seconds = seconds});
  }
  r.eval_seconds = std::chrono::duration<double>(clock::now() - t_eval).count();
  r.n_scored = stats.count();
  r.ppl = stats.ppl();
  r.uncertainty = stats.uncertainty();
  return r;
}

}  // namespace wgllm
