// Perplexity of a model on a text, computed as llama.cpp's `llama-perplexity` computes it:
//
//   auto model = wgllm::Model::load("model.gguf", {.n_ctx = 512});
//   wgllm::PerplexityResult r = wgllm::perplexity(model, text, {.n_ctx = 512});
//   std::printf("PPL = %.4f +/- %.5f\n", r.ppl, r.uncertainty);
//
// The whole text is tokenized once (BOS in front when the vocabulary adds one; control tokens written in the text
// are text) and cut into non-overlapping chunks of n_ctx tokens (the tail that does not fill one is dropped). Each
// chunk runs from an empty cache, its first token replaced by BOS when the vocabulary adds one. Only the second
// half is scored: the logits at positions n_ctx/2 .. n_ctx-2 of a chunk predict the tokens after them, each giving a
// negative log-likelihood (nll). The estimate is exp(mean nll) over every scored token so far, and its uncertainty
// ppl * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1)).
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "wgllm/wgllm.h"

namespace wgllm {

struct PerplexityOptions {
  uint32_t n_ctx = 512;  // tokens per chunk (llama-perplexity -c); the model's context must hold them
  // Tokens per forward call (-b): below n_ctx a chunk is fed in pieces of n_batch; from n_ctx on, llama.cpp runs
  // n_batch / n_ctx chunks side by side in one batch (n_batch lowered to a multiple of n_ctx); here they run one
  // after the other, which gives the same numbers.
  uint32_t n_batch = 2048;
  int32_t n_chunks = -1;  // chunks to score (< 0: every whole chunk of the text)
};

// -log softmax(logits)[target]: max + log(sum exp(logit - max)) - logits[target], the exponentials in float and
// their sum in double, as llama-perplexity does. Throws InvalidArgument for a target outside the logits.
double token_nll(std::span<const float> logits, int32_t target);

// The running estimate over negative log-likelihoods.
class PerplexityStats {
 public:
  void add(double nll) { sum_ += nll, sum2_ += nll * nll, ++count_; }
  uint64_t count() const { return count_; }
  double mean_nll() const;  // NaN when empty
  double ppl() const;       // exp(mean_nll())
  // ppl() * sqrt((mean(nll^2) - mean(nll)^2) / (count - 1)); NaN with fewer than 2 values or a variance that rounds
  // to zero or below (llama.cpp then prints an error instead of the final line).
  double uncertainty() const;

 private:
  double sum_ = 0, sum2_ = 0;
  uint64_t count_ = 0;
};

// One chunk done.
struct PerplexityChunk {
  uint32_t index = 0;     // 0-based
  uint32_t n_chunks = 0;  // chunks in all
  double ppl = 0;         // the running estimate after this chunk (llama-perplexity's `[index + 1]ppl,`)
  double seconds = 0;     // this chunk's evaluation
};

struct PerplexityResult {
  uint32_t n_tokens = 0;  // tokens of the whole text (BOS included when added)
  uint32_t n_ctx = 0, n_chunks = 0;
  uint32_t n_batch = 0;           // as llama-perplexity lowers it: below n_ctx, or a multiple of it
  bool add_bos = false;           // the vocabulary adds BOS (and it replaces each chunk's first token)
  uint64_t n_scored = 0;          // tokens scored: n_chunks * (n_ctx - n_ctx/2 - 1)
  std::vector<double> chunk_ppl;  // the running estimate after each chunk
  std::vector<double> chunk_seconds;
  double ppl = 0, uncertainty = 0;  // the final estimate (uncertainty NaN where PerplexityStats says)
  double tokenize_seconds = 0;
  double eval_seconds = 0;  // every chunk: forward passes, logits, log-softmax
};

// Throws InvalidArgument when n_ctx is below 3 or above the model's context (load it with LoadOptions::n_ctx), when
// n_batch is 0, or when the text has fewer than 2 n_ctx tokens (as llama-perplexity refuses it). on_chunk is called
// after each chunk.
PerplexityResult perplexity(const Model& model, std::string_view text, const PerplexityOptions& options = {},
                            const std::function<void(const PerplexityChunk&)>& on_chunk = {});

}  // namespace wgllm
