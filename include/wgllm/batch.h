// Continuous batching: many requests share one model. Up to `parallel` sequences decode together, one token of every
// active sequence per forward step (one pass over the weights for all of them); a new request's prompt is fed in
// chunks between decode steps, so it joins without stalling the others for long. Requests past `parallel` wait in a
// bounded queue. What `wgllm serve` runs on.
//
//   wgllm::BatchEngine engine(model, {.parallel = 8});
//   engine.submit({.prompt = model.encode("Once upon a time"), .max_tokens = 64},
//                 [](const wgllm::CompletionEvent& e) { std::fputs(e.text.c_str(), stdout); return true; });
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "wgllm/error.h"
#include "wgllm/wgllm.h"

namespace wgllm {

// The queue is full: the request was not taken (a server answers 503).
class QueueFull : public Error {
 public:
  using Error::Error;
};

struct CompletionRequest {
  std::vector<int32_t> prompt;  // token ids, BOS / chat template already applied
  SamplingParams sampling;      // temperature <= 0: greedy (the same ids alone or beside other requests)
  uint32_t max_tokens = 128;    // generated tokens at most (the context may end it sooner)
  // OpenAI's penalties over the tokens generated so far: logit -= presence * [count > 0] + frequency * count.
  float presence_penalty = 0.f, frequency_penalty = 0.f;
  // 0: no log-probabilities; n >= 1: each event carries the chosen token's log-probability and the n most likely
  // (at most 20), from the log-softmax of the model's logits before penalties, temperature and filters.
  uint32_t top_logprobs = 0;
  bool logprobs = false;  // the chosen token's log-probability (implied by top_logprobs > 0)
  // Control tokens whose text streams like any other (the text skips the others): a chat format's markers that
  // the reply is parsed by (<think>, [TOOL_CALLS], ...).
  std::vector<int32_t> keep_special;
};

struct TokenLogprob {
  int32_t id = -1;
  float logprob = 0.f;
};

// One generated token, or the end of a request. Every request gets its tokens in order and then exactly one event
// with done set (also when it is cancelled or fails).
struct CompletionEvent {
  uint64_t request = 0;  // submit's id
  int32_t id = -1;       // the token; -1 in the done event
  std::string text;      // its text (whole UTF-8 characters; may be empty); the done event: text held back, if any
  float logprob = 0.f;   // with logprobs
  std::vector<TokenLogprob> top;  // with top_logprobs, most likely first
  bool done = false;
  StopReason stop_reason = StopReason::Length;  // done: why it ended (Caller: cancelled)
  std::string error;                            // done: non-empty when the request failed (the others go on)
  uint32_t n_prompt = 0, n_generated = 0;       // done: tokens of the prompt and generated
  uint32_t n_cached = 0;  // done: prompt tokens whose positions were kept from an earlier request (not computed)
  double queued_seconds = 0, first_token_seconds = 0;  // done: time in the queue; submit to the first token
};
// Called on the engine's thread, in order, for each event of a request: keep it short. Returning false cancels the
// request (its sequence stops before the next step; a done event with StopReason::Caller follows).
using CompletionCallback = std::function<bool(const CompletionEvent& event)>;

struct BatchOptions {
  uint32_t parallel = 4;         // sequences decoding together (each holds a KV cache of n_ctx positions)
  uint32_t queue = 64;           // requests waiting beyond those; one more throws QueueFull
  uint32_t n_ctx = 0;            // positions per sequence (0: default_n_ctx, the model's context shared out)
  uint32_t prefill_chunk = 256;  // prompt tokens fed between two decode steps while others decode
  // A request takes the free slot whose cache holds the longest prefix of its prompt (the system prompt, the
  // conversation so far; among equals the least recently used) and keeps those positions instead of computing them
  // again: all but the prompt's last token, at least 16 of them, and only where the slot's state rewinds in place.
  // Models whose state does not rewind far (LFM2's conv rings: within prefill_chunk positions) or at all (Qwen 3.5's
  // recurrent states) keep copies of it after each prompt and 16 tokens before its end (a conversation's next turn
  // parts from the earlier prompt there when the template renders the reply differently from how the prompt asked
  // for it), and a prompt keeps what the latest of those before it holds (about 20 MiB each for Qwen3.5-0.8B).
  // The kept positions are what the earlier request computed (by prefill or decode steps), so the outputs may differ
  // from a fresh run's in the last bits; greedy outputs were the same in the tests.
  bool cache_prompt = true;
  // Positions the sequences' KV caches hold together, in pages of 256 (0: parallel x n_ctx, every sequence's whole
  // context at hand). Fewer: a sequence takes pages as it reaches them and gives them back past a truncation; when
  // none is free, idle sequences' cached prompts give theirs up, the least recently used first (their caches then
  // end earlier). A new request that still finds none waits in the queue, a decoding one is preempted (paused,
  // resumed once pages are free: BatchStats::requests_preempted); one whose tokens alone outgrow the pool fails with
  // a one-line error naming it.
  uint32_t kv_pool = 0;
};

struct BatchStats {
  uint32_t active = 0, queued = 0;  // sequences decoding or prefilling; requests waiting
  uint32_t parallel = 0, queue_capacity = 0;
  uint64_t requests_done = 0, requests_cancelled = 0, requests_failed = 0;
  // Decoding requests paused because the KV pool (BatchOptions::kv_pool) had no page for their next token, their
  // pages then open to the others; each resumes, its tokens so far fed again where its pages went, once pages are
  // free (before any waiting request starts).
  uint64_t requests_preempted = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0;  // over the engine's life
  uint64_t prompt_tokens_cached = 0;                 // of prompt_tokens: positions kept from earlier requests
  uint64_t prompt_tokens_shared = 0;  // of those, positions another slot's cache held (its KV pages shared, not copied)
  uint64_t steps = 0;                                // forward steps run
  uint64_t steps_chosen_on_gpu = 0;  // decode steps whose tokens were all chosen on the GPU (greedy or sampled, no
                                     // logprobs or presence / frequency penalty), only their ids read back
  uint64_t steps_encoded_ahead = 0;  // decode steps encoded while the step before them ran (the same sequences)
  // Decode steps chosen on the GPU that were queued before the host had read the ids they feed (the step before
  // chose them on the GPU), so the GPU went from one step to the next; and those queued so but not taken (a request
  // joined unannounced, or a sampled one).
  uint64_t steps_run_ahead = 0, steps_run_ahead_dropped = 0;
  double busy_seconds = 0;           // time spent running steps
  // Decode steps run, and the engine's time in them other than waiting for the GPU's results: encoding and submitting
  // the step, choosing tokens on the host, handing them over (per step: the host work a batched step costs).
  uint64_t decode_steps = 0;
  double decode_host_seconds = 0;
  // The KV pool's pages of 256 positions (0 when the sequences' caches are private): all, those no sequence holds,
  // those more than one holds (a shared prefix). After the last step.
  uint32_t kv_pages = 0, kv_pages_free = 0, kv_pages_shared = 0;
};

class BatchEngine {
 public:
  // Starts the engine's thread. The model must outlive the engine.
  explicit BatchEngine(const Model& model, const BatchOptions& options = {});
  // shutdown(false) if still running.
  ~BatchEngine();
  BatchEngine(const BatchEngine&) = delete;
  BatchEngine& operator=(const BatchEngine&) = delete;

  // Thread-safe. Queues a request and returns its id; on_event receives its events. Throws InvalidArgument (empty
  // prompt, a prompt that leaves no room in n_ctx for a token, an id outside the vocabulary, sampling parameters out
  // of range, top_logprobs > 20), QueueFull, or Error after shutdown — nothing is queued then.
  uint64_t submit(CompletionRequest request, CompletionCallback on_event);
  // Thread-safe: the request stops before its next step (queued: it never starts). Unknown or finished ids: no-op.
  void cancel(uint64_t request);
  BatchStats stats() const;
  // Stops taking requests and waits for the thread: finish = true lets the queued and running requests end, false
  // cancels them (each still gets its done event).
  void shutdown(bool finish);

  uint32_t n_ctx() const;
  uint32_t parallel() const;
  // Positions per sequence when BatchOptions::n_ctx is 0: the model's context (ModelInfo::n_ctx, already sized to the
  // memory budget for one sequence) shared among `parallel` sequences, as llama.cpp's server shares -c among its
  // slots, but not below 256 positions (or the model's context when smaller).
  static uint32_t default_n_ctx(const Model& model, uint32_t parallel);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wgllm
