// BatchEngine: a scheduler thread over `parallel` sequence slots of one model (include/wgllm/batch.h).
//
// Each turn of the loop: take waiting requests into free slots; feed prompt chunks of the slots waiting for their
// prompts, earliest first, about prefill_chunk tokens in all; then one decode step for every slot that is
// generating, all of them in one forward (GpuBatchDecode: the weight products of every sequence together). When
// every decoding slot is plain greedy (no penalty, no logprobs) and the model chooses tokens on the GPU
// (LoadOptions::choose_on_gpu), their ids are chosen there (one argmax for all rows) and only the ids come back, the
// next step of the same slots already queued behind it, fed those ids on the GPU (it serves the slots that go on
// when some end; none is queued while a prompt is being fed, whose slot would join). Otherwise the GPU draws the token
// of every slot it can (sample.wgsl with the slot's sampler's settings, uniform and recent ids: no presence or
// frequency penalty, no logprobs, not sampling.host), all rows in one set of dispatches, and the logits come back to
// the host only for the other slots, where each one's own sampler picks its token. Either way a request's tokens do
// not depend on what runs beside it.
#include "wgllm/batch.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "api/model_impl.h"
#include "api/sampling.h"
#include "gpu/batch.h"
#include "model/batch_decode.h"

namespace wgllm {

namespace {

using clock_type = std::chrono::steady_clock;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

// log-softmax of `logits` at `ids` (and the n largest), in double.
struct LogSoftmax {
  double max = 0, log_sum = 0;
  explicit LogSoftmax(std::span<const float> logits) {
    max = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (float v : logits) sum += std::exp(double(v) - max);
    log_sum = std::log(sum);
  }
  float operator()(float v) const { return float(double(v) - max - log_sum); }
};

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, uint32_t n, const LogSoftmax& ls) {
  std::vector<int32_t> ids(logits.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  n = std::min<uint32_t>(n, uint32_t(ids.size()));
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  std::vector<TokenLogprob> out;
  for (uint32_t i = 0; i < n; ++i) out.push_back({ids[i], ls(logits[ids[i]])});
  return out;
}

}  // namespace

struct BatchEngine::Impl {
  struct Request {
    uint64_t id = 0;
    CompletionRequest req;
    CompletionCallback on_event;
    clock_type::time_point submitted, started;  // started: set by the engine thread under mu
    bool running = false;                       // in a slot; guarded by mu
    bool cancelled = false;                     // guarded by mu
  };
  struct Slot {
    std::unique_ptr<GpuSession> session;
    std::shared_ptr<Request> request;  // empty: free
    uint32_t fed = 0;                  // prompt tokens fed so far (or kept: cached)
    uint32_t cached = 0;               // prompt tokens kept from the request before (BatchOptions::cache_prompt)
    uint32_t shared = 0;               // of those, taken from another slot's cache
    uint64_t started = 0;              // when its last request started (a count of starts; 0: never)
    std::optional<Sampler> sampler;
    std::unique_ptr<TextStream> stream;
    std::unordered_map<int32_t, uint32_t> counts;  // generated ids (presence / frequency penalties)
    int32_t next = -1;                             // the sampled token the next decode step feeds
    uint32_t generated = 0;
    bool first_token_seen = false;
    double first_token_seconds = 0;
    // Preempted (the pool had no page for its next token): it waits, its pages idle, with the tokens its cache held
    // (the prompt and the reply so far but `next`), to be fed again from wherever its pages end when it resumes.
    bool paused = false;
    std::vector<int32_t> history;
    bool prefilling() const { return request && !paused && fed < request->req.prompt.size(); }
    bool decoding() const { return request && !paused && !prefilling(); }
    bool running() const { return request && !paused; }
  };

  const Model& model;
  BatchOptions options;
  uint32_t n_ctx = 0;
  bool choose_on_gpu = false;  // plain greedy steps choose their ids on the GPU (LoadOptions::choose_on_gpu)
  std::optional<SharedKv> shared_kv;  // the caches the slots' caches are views of (or none)
  std::vector<Slot> slots;
  uint64_t starts = 0;  // requests started into slots
  std::unique_ptr<GpuBatchDecode> decode;

  mutable std::mutex mu;
  std::condition_variable wake;
  std::deque<std::shared_ptr<Request>> queue;                   // guarded by mu
  std::unordered_map<uint64_t, std::shared_ptr<Request>> live;  // queued or running, by id; guarded by mu
  uint64_t next_id = 1;                                         // guarded by mu
  bool stopping = false, finish_on_stop = false;                // guarded by mu
  BatchStats stats;                                             // guarded by mu
  std::thread thread;

  Impl(const Model& m, const BatchOptions& o) : model(m), options(o) {
    if (options.parallel == 0) throw InvalidArgument("BatchEngine: parallel must be >= 1");
    if (options.prefill_chunk == 0) throw InvalidArgument("BatchEngine: prefill_chunk must be >= 1");
    auto& impl = ModelAccess::impl(model);
    n_ctx = options.n_ctx ? options.n_ctx : BatchEngine::default_n_ctx(model, options.parallel);
    gpu::Context& ctx = gpu_context(model);
    choose_on_gpu = impl.choose_on_gpu.value_or(!ctx.adapter().is_cpu());
    // Every slot's KV cache a view of one pool per layer (pages of 256 positions), so that a decode step runs the
    // RoPE + append and the attention of all sequences in one dispatch each; private caches when the pool would
    // exceed the storage bindings a cache may span.
    constexpr uint32_t kPage = 256;
    const uint32_t slot_ctx = (n_ctx + kPage - 1) / kPage * kPage;
    try {
      const uint32_t pages = (uint64_t(options.kv_pool) + kPage - 1) / kPage;
      shared_kv.emplace(ctx, impl.gpu.config, options.parallel, slot_ctx, kPage, kernels::KvType::F16, pages);
    } catch (const InvalidArgument&) {
      shared_kv.reset();
      if (options.kv_pool)
        throw InvalidArgument("kv_pool " + std::to_string(options.kv_pool) +
                              ": the sequences' KV caches do not fit one pool of storage bindings; lower it");
    }
    slots.resize(options.parallel);
    for (uint32_t i = 0; i < options.parallel; ++i) {
      GpuSessionOptions so{.n_ctx = n_ctx, .ubatch = std::min(options.prefill_chunk, n_ctx), .argmax_on_gpu = false};
      // the slots' prompt chunks keep at most ~16k bind groups in all (each live group holds driver memory; lavapipe
      // maps it, and past the process's mapping limit, ~60 slots of a small Gemma 4 at 2,000 groups each, it crashed)
      so.bind_groups_max =
          std::max<uint32_t>(512, std::min<uint32_t>(gpu::BindCache::kMaxGroups, 16384 / options.parallel));
      if (shared_kv) {
        so.n_ctx = slot_ctx;
        so.shared_kv = &*shared_kv;
        so.kv_sequence = i;
      }
      slots[i].session = std::make_unique<GpuSession>(ctx, impl.gpu, so);
    }
    decode = std::make_unique<GpuBatchDecode>(ctx, impl.gpu, options.parallel, shared_kv ? &*shared_kv : nullptr);
    stats.parallel = options.parallel;
    stats.queue_capacity = options.queue;
    thread = std::thread([this] { run(); });
  }

  // Sends an event; false when the callback asks to stop (or throws: the request is then cancelled too).
  static bool send(Request& r, const CompletionEvent& e) {
    try {
      return r.on_event(e);
    } catch (...) {
      return false;
    }
  }

  void finish(Slot& s, StopReason why, const std::string& error = {}) {
    Request& r = *s.request;
    CompletionEvent e;
    e.request = r.id;
    e.done = true;
    e.stop_reason = why;
    e.error = error;
    e.text = s.stream ? s.stream->flush() : std::string();
    e.n_prompt = uint32_t(r.req.prompt.size());
    e.n_generated = s.generated;
    e.n_cached = s.cached;
    e.first_token_seconds = s.first_token_seconds;
    // The books first: whoever the done event wakes sees the request gone from stats().
    {
      std::lock_guard lock(mu);
      e.queued_seconds = std::chrono::duration<double>(r.started - r.submitted).count();
      live.erase(r.id);
      if (!error.empty())
        ++stats.requests_failed;
      else if (why == StopReason::Caller)
        ++stats.requests_cancelled;
      else
        ++stats.requests_done;
    }
    send(r, e);
    if (!error.empty()) s.session->reset();  // whatever a failed step left is not offered to the next request
    s.request.reset();
    s.sampler.reset();
    s.stream.reset();
    s.counts.clear();
    s.paused = false;
    s.history.clear();
    if (shared_kv) shared_kv->set_idle(index(s), true);  // its pages may go to others now
  }

  uint32_t index(const Slot& s) const { return uint32_t(&s - slots.data()); }

  // The done event of a request cancelled before it had a slot.
  void finish_unstarted(Request& r, const std::string& error = {}) {
    CompletionEvent e;
    e.request = r.id;
    e.done = true;
    e.stop_reason = StopReason::Caller;
    e.error = error;
    e.n_prompt = uint32_t(r.req.prompt.size());
    e.queued_seconds = seconds_since(r.submitted);
    {
      std::lock_guard lock(mu);
      live.erase(r.id);
      ++(error.empty() ? stats.requests_cancelled : stats.requests_failed);
    }
    send(r, e);
  }

  // The positions of slot s's cache that a prompt can keep: its longest common prefix with the tokens cached there,
  // short of the prompt's last token (whose logits start the reply), where the state rewinds to it in place and it
  // saves at least kMinCachedPrompt tokens. Shorter prefixes (a beginning-of-text token that every prompt shares) are
  // computed again: they save nothing, and a prompt computed whole gives a fresh run's bits whatever ran before it.
  uint32_t reusable(const Slot& s, const std::vector<int32_t>& prompt) const {
    if (!options.cache_prompt || prompt.empty()) return 0;
    uint32_t n = common_prefix(s, prompt);
    n = s.session->rewind_point(n);  // a rewind that feeds tokens gains nothing: back to a checkpoint
    return n < kMinCachedPrompt ? 0 : n;
  }
  static constexpr uint32_t kMinCachedPrompt = 16;

  // How many of slot s's cached tokens begin the prompt, short of its last token (whose logits start the reply).
  static uint32_t common_prefix(const Slot& s, const std::vector<int32_t>& prompt) {
    const std::span<const int32_t> cached = s.session->tokens();
    const size_t limit = std::min(cached.size(), prompt.size() - 1);
    uint32_t n = 0;
    while (n < limit && cached[n] == prompt[n]) ++n;
    return n;
  }

  // Another slot, running or not, whose cache begins with more of the prompt than slot s's own: s takes those
  // positions over (GpuSession::share_prefix: whole KV pages shared, the last partial one copied) instead of computing
  // them. A system prompt or a conversation's history is then computed once for every request that begins with it.
  // With conv rings (lfm2) the positions taken end at a page boundary (their conv state kept there); models with
  // recurrent states (qwen35) keep to their own slot's cache (GpuSession::shareable).
  std::pair<const Slot*, uint32_t> donor(const Slot& s, const std::vector<int32_t>& prompt, uint32_t own) const {
    const Slot* best = nullptr;
    uint32_t best_n = std::max(own, kMinCachedPrompt - 1);
    if (!options.cache_prompt || prompt.empty()) return {nullptr, 0};
    for (const Slot& t : slots) {
      if (&t == &s) continue;
      const uint32_t n = s.session->shareable(*t.session, common_prefix(t, prompt));
      if (n > best_n) best = &t, best_n = n;
    }
    return {best, best ? best_n : 0};
  }

  // Where a prompt's state is kept for the next request (GpuSession::checkpoint), on models whose state does not
  // rewind in place (conv rings, recurrent states): after the prompt, for a next prompt that continues it and then
  // parts from the reply; and kCheckpointTail tokens before its end, for one that renders this turn's reply
  // differently from how this prompt asked for it (a chat template's generation prompt, thinking dropped from the
  // history), parting from it within those tokens.
  static constexpr uint32_t kCheckpointTail = 16;
  bool checkpoints(const Slot& s) const { return options.cache_prompt && s.session->keeps_rolling_state(); }
  // The tokens of slot s's next prompt chunk: up to prefill_chunk, ending at the tail checkpoint when it comes first.
  uint32_t next_chunk(const Slot& s) const {
    const uint32_t size = uint32_t(s.request->req.prompt.size());
    uint32_t n = std::min(options.prefill_chunk, size - s.fed);
    if (checkpoints(s) && size >= kCheckpointTail + kMinCachedPrompt) {
      const uint32_t tail = size - kCheckpointTail;
      if (s.fed < tail && s.fed + n > tail) n = tail - s.fed;
    }
    return n;
  }

  // The free slot for a prompt: the one that keeps the most of it; among equals the least recently started (an
  // unused one first), so that the caches other prompts may want are the last to go.
  Slot* free_slot(const std::vector<int32_t>& prompt) {
    for (Slot& s : slots)  // idle slots' caches cut back where their pages were taken (before start compares them)
      if (!s.request || s.paused) s.session->sync_pages();
    Slot* best = nullptr;
    uint32_t best_n = 0;
    for (Slot& s : slots) {
      if (s.request) continue;
      const uint32_t n = reusable(s, prompt);
      if (!best || n > best_n || (n == best_n && s.started < best->started)) best = &s, best_n = n;
    }
    return best;
  }

  // Starts request r in free slot s; false when a KV pool of fewer pages than the slots' contexts (kv_pool) has no
  // pages for its prompt now: the slot stays free and r is the caller's again (to wait, or to fail when nothing runs
  // that could give pages back; the message then in `error`).
  bool start(Slot& s, std::shared_ptr<Request>& r, std::string& error) {
    s.request = r;
    s.generated = 0;
    s.next = -1;
    s.first_token_seen = false;
    s.first_token_seconds = 0;
    s.started = ++starts;
    if (shared_kv) shared_kv->set_idle(index(s), false);
    s.cached = reusable(s, s.request->req.prompt);
    const auto [from, shared] = donor(s, s.request->req.prompt, s.cached);
    s.shared = from ? shared : 0;
    try {
      if (from) {
        s.session->share_prefix(*from->session, shared);
        s.cached = shared;
      } else {
        s.session->truncate(s.cached);  // in place (reusable); 0: reset
      }
    } catch (const KvPoolFull&) {  // no page to copy a shared partial page to: the prompt computed in full
      s.session->truncate(0);
      s.cached = s.shared = 0;
    }
    s.fed = s.cached;
    try {  // the prompt's pages and the first step's, so that a request admitted does not fail midway for want of one
      s.session->reserve(uint32_t(s.request->req.prompt.size()) + 1);
    } catch (const KvPoolFull& e) {
      error = e.what();
      s.request.reset();
      shared_kv->set_idle(index(s), true);
      return false;
    }
    s.sampler.emplace(s.request->req.sampling);
    s.stream = std::make_unique<TextStream>(model, true, s.request->req.keep_special);
    for (int32_t id : s.request->req.prompt) s.sampler->accept(id);
    return true;
  }

  // Picks the token after `logits` for slot s and hands it over; false when the request ends with it.
  bool take(Slot& s, std::span<const float> logits) {
    Request& r = *s.request;
    const CompletionRequest& q = r.req;
    std::span<const float> use = logits;
    std::vector<float> penalised;
    if ((q.presence_penalty != 0 || q.frequency_penalty != 0) && !s.counts.empty()) {
      penalised.assign(logits.begin(), logits.end());
      for (const auto& [id, n] : s.counts) penalised[id] -= q.presence_penalty + q.frequency_penalty * float(n);
      use = penalised;
    }
    return hand_over(s, s.sampler->sample(use), logits);
  }

  // Whether slot s's next token is the argmax of its logits as they come, which the GPU can choose.
  bool plain_greedy(const Slot& s) const { return s.sampler->argmax_only() && plain_sampled(s); }

  // Whether slot s's next token can be drawn on the GPU (sample.wgsl: the sampler's settings, uniform and recent ids),
  // as it then always is, whatever runs beside it.
  bool plain_sampled(const Slot& s) const {
    const CompletionRequest& q = s.request->req;
    return !q.sampling.host && q.presence_penalty == 0 && q.frequency_penalty == 0 && !q.logprobs &&
           q.top_logprobs == 0;
  }

  // Hands slot s's token `id` over (logits: its step's, for logprobs; empty when chosen on the GPU); false when the
  // request ends with it.
  bool hand_over(Slot& s, int32_t id, std::span<const float> logits) {
    Request& r = *s.request;
    const CompletionRequest& q = r.req;
    if (q.presence_penalty != 0 || q.frequency_penalty != 0) ++s.counts[id];  // (read only by those penalties)
    ++s.generated;
    CompletionEvent e;
    e.request = r.id;
    e.id = id;
    const bool eog = model.is_end_of_generation(id);
    e.text = eog ? std::string() : s.stream->push(id);
    if ((q.logprobs || q.top_logprobs > 0) && !logits.empty()) {
      const LogSoftmax ls(logits);
      e.logprob = ls(logits[id]);
      if (q.top_logprobs > 0) e.top = top_logprobs(logits, q.top_logprobs, ls);
    }
    if (!s.first_token_seen) {
      s.first_token_seen = true;
      s.first_token_seconds = seconds_since(r.submitted);
    }
    {
      std::lock_guard lock(mu);
      ++stats.generated_tokens;
    }
    if (!send(r, e)) {
      finish(s, StopReason::Caller);
      return false;
    }
    if (eog) {
      finish(s, StopReason::EndOfGeneration);
      return false;
    }
    if (s.generated >= q.max_tokens) {
      finish(s, StopReason::Length);
      return false;
    }
    if (s.session->n_past() >= n_ctx) {
      finish(s, StopReason::Context);
      return false;
    }
    s.next = id;
    return true;
  }

  bool cancelled(const Slot& s) {
    std::lock_guard lock(mu);
    return s.request->cancelled;
  }

  // Prompt chunks between two decode steps: the next chunk of each prefilling slot, those that started first first,
  // while the turn's chunks stay within prefill_chunk tokens (at least one chunk). A request's chunks are always
  // [0, prefill_chunk), [prefill_chunk, 2 prefill_chunk), ... of its prompt from its cached positions on (split at
  // its tail checkpoint where one is kept: next_chunk), whoever else is waiting. With the last chunk of a prompt
  // comes its first token.
  void prefill_step() {
    std::vector<Slot*> waiting;
    for (Slot& s : slots)
      if (s.prefilling()) waiting.push_back(&s);
    std::sort(waiting.begin(), waiting.end(),
              [](const Slot* a, const Slot* b) { return a->request->started < b->request->started; });
    uint32_t fed = 0;
    for (Slot* sp : waiting) {
      Slot& s = *sp;
      const uint32_t n = next_chunk(s);
      if (fed > 0 && fed + n > options.prefill_chunk) break;
      if (cancelled(s)) {
        finish(s, StopReason::Caller);
        continue;
      }
      fed += n;
      feed_chunk(s, n);
    }
  }

  void feed_chunk(Slot& s, uint32_t n) {
    const auto& prompt = s.request->req.prompt;
    const std::span<const int32_t> chunk(prompt.data() + s.fed, n);
    try {
      if (s.fed + n < prompt.size()) {
        s.session->forward_rows(chunk, n, [](uint32_t, std::span<const float>) {});  // no logits
        s.fed += n;
        if (checkpoints(s) && s.fed + kCheckpointTail == prompt.size()) s.session->checkpoint();
      } else {
        const std::vector<float> logits = s.session->forward(chunk);
        s.fed += n;
        if (checkpoints(s)) s.session->checkpoint();
        {
          std::lock_guard lock(mu);
          stats.prompt_tokens += prompt.size();
          stats.prompt_tokens_cached += s.cached;
          stats.prompt_tokens_shared += s.shared;
        }
        take(s, logits);
      }
    } catch (const std::exception& e) {
      finish(s, StopReason::Caller, e.what());
    }
  }

  bool others_running(const Slot& s) const {
    return std::any_of(slots.begin(), slots.end(), [&](const Slot& t) { return &t != &s && t.running(); });
  }
  bool any_paused() const {
    return std::any_of(slots.begin(), slots.end(), [](const Slot& s) { return s.request && s.paused; });
  }

  void pause(Slot& s) {
    s.paused = true;
    const std::span<const int32_t> held = s.session->tokens();
    s.history.assign(held.begin(), held.end());
    shared_kv->set_idle(index(s), true);
    std::lock_guard lock(mu);
    ++stats.requests_preempted;
  }

  // Preempted requests, the longest-running first, take pages back while the pool has them: each one's tokens past
  // where its cache now ends (other sequences took its last pages) are fed again, and it decodes on from `next`. A
  // request cancelled meanwhile ends; one that cannot resume while nothing else runs fails (its tokens alone exceed
  // the pool).
  void resume_paused() {
    std::vector<Slot*> paused;
    for (Slot& s : slots)
      if (s.request && s.paused) paused.push_back(&s);
    std::sort(paused.begin(), paused.end(), [](const Slot* a, const Slot* b) { return a->started < b->started; });
    for (Slot* sp : paused) {
      Slot& s = *sp;
      if (cancelled(s)) {
        finish(s, StopReason::Caller);
        continue;
      }
      shared_kv->set_idle(index(s), false);
      try {
        s.session->sync_pages();
        s.session->reserve(uint32_t(s.history.size()) + 2);
      } catch (const KvPoolFull& e) {
        shared_kv->set_idle(index(s), true);
        if (!others_running(s)) finish(s, StopReason::Caller, e.what());
        return;  // in order: the next ones wait behind it
      }
      try {
        const uint32_t kept = s.session->n_past();
        if (kept < s.history.size())
          s.session->forward_rows(std::span(s.history).subspan(kept), uint32_t(s.history.size() - kept),
                                  [](uint32_t, std::span<const float>) {});  // no logits
      } catch (const std::exception& e) {
        finish(s, StopReason::Caller, e.what());
        continue;
      }
      s.paused = false;
      s.history.clear();
    }
  }

  // One token of every decoding slot, in one forward.
  void decode_step() {
    std::vector<Slot*> active;
    for (Slot& s : slots)
      if (s.decoding() && s.next >= 0) {
        if (cancelled(s))
          finish(s, StopReason::Caller);
        else
          active.push_back(&s);
      }
    // Each sequence's page for this step and the one queued behind it. A request that finds none is preempted while
    // others run (they will give pages back; its own are theirs to take meanwhile), and fails when it runs alone:
    // then its tokens alone exceed the pool.
    std::erase_if(active, [&](Slot* s) {
      try {
        s->session->reserve(s->session->n_past() + 2);
        return false;
      } catch (const KvPoolFull& e) {
        if (others_running(*s))
          pause(*s);
        else
          finish(*s, StopReason::Caller, e.what());
        return true;
      }
    });
    if (active.empty()) return;
    const auto t0 = clock_type::now();
    const double waited = decode->wait_seconds();
    struct Books {  // the step's host time, however it ends
      Impl& e;
      clock_type::time_point t0;
      double waited;
      ~Books() {
        std::lock_guard lock(e.mu);
        ++e.stats.decode_steps;
        e.stats.decode_host_seconds += seconds_since(t0) - (e.decode->wait_seconds() - waited);
      }
    } books{*this, t0, waited};
    std::vector<GpuSession*> sessions;
    std::vector<int32_t> ids;
    for (Slot* s : active) {
      sessions.push_back(s->session.get());
      ids.push_back(s->next);
    }
    const bool on_gpu =
        choose_on_gpu && std::all_of(active.begin(), active.end(), [&](const Slot* s) { return plain_greedy(*s); });
    // Otherwise the slots whose tokens the GPU draws (every one it can, so that a request's tokens never depend on
    // its company): their rows' settings, uniforms and recent ids; the logits come back only for the others.
    std::vector<uint8_t> drawn(active.size(), 0);
    std::vector<kernels::SampleRow> rows;
    if (!on_gpu && choose_on_gpu && decode->samples_rows())
      for (size_t i = 0; i < active.size(); ++i) drawn[i] = plain_sampled(*active[i]);
    const bool any_drawn = std::find(drawn.begin(), drawn.end(), 1) != drawn.end();
    const bool all_drawn = std::find(drawn.begin(), drawn.end(), 0) == drawn.end();
    std::vector<float> logits;
    std::vector<int32_t> chosen;
    try {
      // The next step is queued behind this one unless a prompt being fed may join it (it would be dropped).
      const bool none_joining =
          std::none_of(slots.begin(), slots.end(), [](const Slot& s) { return s.prefilling(); });
      if (on_gpu) {
        chosen = decode->step_argmax(sessions, ids, none_joining);
      } else if (any_drawn) {
        for (size_t i = 0; i < active.size(); ++i) {
          kernels::SampleRow row;  // (greedy, for a row sampled on the host from its logits)
          row.settings.temperature = 0;
          if (drawn[i]) {
            Sampler& sampler = *active[i]->sampler;
            row.settings = sample_settings(sampler.params());
            row.u = sampler.next_uniform();
            if (row.settings.repeat_penalty != 1.f) row.recent.assign(sampler.recent().begin(), sampler.recent().end());
          }
          rows.push_back(std::move(row));
        }
        chosen = decode->step_sample(sessions, ids, rows, all_drawn ? nullptr : &logits);
      } else {
        logits = decode->step(sessions, ids);
      }
    } catch (const std::exception& e) {
      for (Slot* s : active) finish(*s, StopReason::Caller, e.what());
      return;
    }
    {
      std::lock_guard lock(mu);
      stats.steps_encoded_ahead = decode->prepared_steps();
      stats.steps_run_ahead = decode->ahead_steps();
      stats.steps_run_ahead_dropped = decode->dropped_steps();
    }
    if (on_gpu || all_drawn) {
      {
        std::lock_guard lock(mu);
        ++stats.steps_chosen_on_gpu;
      }
      for (size_t i = 0; i < active.size(); ++i) {
        active[i]->sampler->accept(chosen[i]);
        hand_over(*active[i], chosen[i], {});
      }
      return;
    }
    const size_t V = model.info().n_vocab;
    for (size_t i = 0; i < active.size(); ++i) {
      if (drawn[i]) {
        active[i]->sampler->accept(chosen[i]);
        hand_over(*active[i], chosen[i], {});
      } else {
        take(*active[i], std::span(logits).subspan(i * V, V));
      }
    }
  }

  void run() {
    for (;;) {
      {
        std::unique_lock lock(mu);
        const auto busy = [&] {
          return std::any_of(slots.begin(), slots.end(), [](const Slot& s) { return bool(s.request); });
        };
        wake.wait(lock, [&] { return stopping || !queue.empty() || busy(); });
        if (stopping && !finish_on_stop) {
          for (auto& r : queue) r->cancelled = true;
          for (Slot& s : slots)
            if (s.request) s.request->cancelled = true;
        }
        // Cancelled while waiting: they end now, without a slot.
        std::vector<std::shared_ptr<Request>> dropped;
        std::erase_if(queue, [&](const std::shared_ptr<Request>& r) {
          if (r->cancelled) dropped.push_back(r);
          return r->cancelled;
        });
        if (!dropped.empty()) {
          lock.unlock();
          for (auto& r : dropped) finish_unstarted(*r);
          lock.lock();
        }
        // Waiting requests into free slots, in order, each into the slot that keeps the most of its prompt; none while
        // a preempted request waits for pages.
        while (!queue.empty() && !any_paused()) {
          Slot* s = free_slot(queue.front()->req.prompt);
          if (!s) break;
          std::shared_ptr<Request> r = std::move(queue.front());
          queue.pop_front();
          r->started = clock_type::now();
          r->running = true;
          lock.unlock();
          std::string error;
          const bool started = start(*s, r, error);
          if (!started && !busy()) finish_unstarted(*r, error);  // nothing runs that would give pages back
          lock.lock();
          if (!started && busy()) {  // it waits, first in line, for a running request to end
            r->running = false;
            queue.push_front(std::move(r));
            break;
          }
        }
        if (stopping && queue.empty() && !busy()) break;
      }
      const auto t0 = clock_type::now();
      if (any_paused()) resume_paused();
      prefill_step();
      decode_step();
      std::lock_guard lock(mu);
      ++stats.steps;
      stats.busy_seconds += seconds_since(t0);
      if (shared_kv) {
        stats.kv_pages = shared_kv->pages();
        stats.kv_pages_free = shared_kv->pages_free();
        stats.kv_pages_shared = shared_kv->pages_shared();
      }
    }
  }

  uint64_t submit(CompletionRequest req, CompletionCallback on_event) {
    if (!on_event) throw InvalidArgument("BatchEngine::submit: no callback");
    if (req.prompt.empty()) throw InvalidArgument("the prompt is empty");
    if (req.prompt.size() >= n_ctx)
      throw InvalidArgument("the prompt has " + std::to_string(req.prompt.size()) +
                            " tokens, which leaves no room in the context of " + std::to_string(n_ctx) + " tokens");
    const uint32_t V = model.info().n_vocab;
    for (int32_t t : req.prompt)
      if (t < 0 || uint32_t(t) >= V)
        throw InvalidArgument("token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) +
                              ")");
    validate(req.sampling);
    if (req.top_logprobs > 20) throw InvalidArgument("top_logprobs " + std::to_string(req.top_logprobs) + " > 20");
    if (!std::isfinite(req.presence_penalty) || !std::isfinite(req.frequency_penalty))
      throw InvalidArgument("presence_penalty and frequency_penalty must be finite");
    auto r = std::make_shared<Request>();
    r->req = std::move(req);
    r->on_event = std::move(on_event);
    r->submitted = clock_type::now();
    {
      std::lock_guard lock(mu);
      if (stopping) throw Error("the engine is shutting down");
      // Capacity: a request per slot, and `queue` more waiting.
      if (live.size() >= uint64_t(options.parallel) + options.queue)
        throw QueueFull("the queue is full (" + std::to_string(options.queue) + " requests waiting, " +
                        std::to_string(options.parallel) + " running)");
      r->id = next_id++;
      live[r->id] = r;
      queue.push_back(r);
    }
    wake.notify_one();
    return r->id;
  }
};

BatchEngine::BatchEngine(const Model& model, const BatchOptions& options)
    : impl_(std::make_unique<Impl>(model, options)) {}

BatchEngine::~BatchEngine() {
  if (impl_) shutdown(false);
}

uint64_t BatchEngine::submit(CompletionRequest request, CompletionCallback on_event) {
  return impl_->submit(std::move(request), std::move(on_event));
}

void BatchEngine::cancel(uint64_t request) {
  std::lock_guard lock(impl_->mu);
  if (auto it = impl_->live.find(request); it != impl_->live.end()) it->second->cancelled = true;
  impl_->wake.notify_one();
}

BatchStats BatchEngine::stats() const {
  std::lock_guard lock(impl_->mu);
  BatchStats s = impl_->stats;
  s.queued = uint32_t(impl_->queue.size());
  s.active = 0;
  for (const auto& [id, r] : impl_->live) s.active += r->running ? 1 : 0;
  return s;
}

void BatchEngine::shutdown(bool finish) {
  {
    std::lock_guard lock(impl_->mu);
    if (!impl_->stopping) {
      impl_->stopping = true;
      impl_->finish_on_stop = finish;
    }
  }
  impl_->wake.notify_one();
  if (impl_->thread.joinable()) impl_->thread.join();
}

uint32_t BatchEngine::n_ctx() const { return impl_->n_ctx; }

uint32_t BatchEngine::default_n_ctx(const Model& model, uint32_t parallel) {
  const uint32_t whole = model.info().n_ctx;
  return std::max(std::min<uint32_t>(whole, 256), whole / std::max<uint32_t>(parallel, 1));
}
uint32_t BatchEngine::parallel() const { return impl_->options.parallel; }

}  // namespace wgllm
