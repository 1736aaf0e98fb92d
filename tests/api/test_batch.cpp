// BatchEngine (continuous batching) on the built-in model: a request's tokens do not depend on what runs beside
// it, requests end exactly once with the right reason, and bad requests, a full queue, cancellation and shutdown
// behave as batch.h says.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "wgllm/batch.h"
#include "wgllm/default_model.h"
#include "wgllm/error.h"
#include "model_util.h"

namespace wgllm {
namespace {

const Model& model() {
  static const Model m = [] {
    LoadOptions o;
    o.n_ctx = 256;
    return Model::load(default_model_gguf(), o, "built-in");
  }();
  return m;
}

// Collects one request's events; wait() returns once its done event came.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> ids;
  std::string text;
  std::vector<CompletionEvent> events;
  bool done = false;
  int done_events = 0;
  CompletionEvent last;
  int stop_after = -1;  // return false after this many tokens

  CompletionCallback callback() {
    return [this](const CompletionEvent& e) {
      std::lock_guard lock(mu);
      events.push_back(e);
      text += e.text;
      if (e.done) {
        ++done_events;
        done = true;
        last = e;
        cv.notify_all();
        return true;
      }
      ids.push_back(e.id);
      return stop_after < 0 || int(ids.size()) < stop_after;
    };
  }
  void wait() {
    std::unique_lock lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(120), [&] { return done; })) << "no done event";
  }
};

// A test model file with a context of n_ctx.
Model load_file(const std::string& name, uint32_t n_ctx) {
  LoadOptions lo;
  lo.n_ctx = n_ctx;
  return Model::load(test::model_path(name), lo);
}

// n token ids spread over m's vocabulary (its first 4 and last 4 left out), the same for the same seed.
std::vector<int32_t> spread_ids(const Model& m, uint32_t n, uint32_t seed) {
  const uint32_t V = m.info().n_vocab;
  std::vector<int32_t> t(n);
  for (uint32_t i = 0; i < n; ++i) t[i] = int32_t((seed * 7919u + i * 104729u + i * i * 31u) % (V - 8) + 4);
  return t;
}

// a alone to its end, then b, and c once b has its first token (while b decodes); returns when all have ended.
void a_then_b_then_c(BatchEngine& engine, const CompletionRequest& a, const CompletionRequest& b,
                     const CompletionRequest& c, Collector& first, Collector& second, Collector& third) {
  engine.submit(a, first.callback());
  first.wait();
  engine.submit(b, second.callback());
  while (engine.stats().generated_tokens < first.ids.size() + 1)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine.submit(c, third.callback());
  second.wait();
  third.wait();
}

// The default model with its tokens chosen on the GPU or on the host (LoadOptions::choose_on_gpu).
Model default_model_choosing(bool on_gpu) {
  LoadOptions o;
  o.n_ctx = 256;
  o.choose_on_gpu = on_gpu;
  return Model::load(default_model_gguf(), o, "built-in");
}

CompletionRequest greedy(const std::string& prompt, uint32_t max_tokens) {
  CompletionRequest r;
  r.prompt = model().encode(prompt);
  r.sampling.temperature = 0;
  r.max_tokens = max_tokens;
  return r;
}

const std::vector<std::string> kPrompts = {"ROMEO:",
                                           "JULIET:\nO Romeo",
                                           "First Citizen:\nBefore we proceed",
                                           "KING RICHARD II:\nO that I were",
                                           "MENENIUS:\nWhat work's, my countrymen",
                                           "LADY CAPULET:",
                                           "Now is the winter",
                                           "To be, or not",
                                           "BRUTUS:\nI pray you",
                                           "CORIOLANUS:",
                                           "HAMLET:\nThe rest is",
                                           "Good morrow, cousin",
                                           "What light through yonder",
                                           "PETRUCHIO:\nI pray",
                                           "GLOUCESTER:\nNow is",
                                           "A plague o' both"};

// 16 greedy requests, each alone through the engine and then all 16 at once on 16 slots: the same tokens and text.
TEST(BatchEngine, GreedyTokensAloneEqualBesideFifteenOthers) {
  std::vector<std::vector<int32_t>> alone;
  {
    BatchEngine engine(model(), {.parallel = 16});
    for (const std::string& p : kPrompts) {
      Collector c;
      engine.submit(greedy(p, 24), c.callback());
      c.wait();
      EXPECT_EQ(c.last.stop_reason, StopReason::Length);
      alone.push_back(c.ids);
    }
  }
  BatchEngine engine(model(), {.parallel = 16, .prefill_chunk = 7});  // prompts in several chunks, between steps
  std::vector<Collector> cs(kPrompts.size());
  for (size_t i = 0; i < kPrompts.size(); ++i) engine.submit(greedy(kPrompts[i], 24), cs[i].callback());
  for (auto& c : cs) c.wait();
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(cs[i].ids, alone[i]) << "prompt " << i << " differs beside the others";
    EXPECT_EQ(cs[i].done_events, 1);
    EXPECT_EQ(cs[i].last.n_generated, 24u);
    EXPECT_EQ(cs[i].last.n_prompt, model().encode(kPrompts[i]).size());
  }
  const BatchStats s = engine.stats();
  EXPECT_EQ(s.requests_done, kPrompts.size());
  EXPECT_EQ(s.generated_tokens, 24u * kPrompts.size());
  EXPECT_EQ(s.active, 0u);
  EXPECT_EQ(s.queued, 0u);
  // 16 sequences decoded together: far fewer steps than 16 x 24 tokens.
  EXPECT_LT(s.steps, 24u * kPrompts.size() / 2);
  // Each decode step counted once, its host time a part of the engine's busy time.
  EXPECT_GE(s.decode_steps, 24u);
  EXPECT_LE(s.decode_steps, s.steps);
  EXPECT_GT(s.decode_host_seconds, 0.0);
  EXPECT_LT(s.decode_host_seconds, s.busy_seconds);
}

// Tokens chosen on the GPU (one argmax over every decoding row, only the ids read back; forced here, where a CPU
// adapter would choose on the host): the same ids as the host's choice, alone and beside 15 others; a request that
// wants logprobs sends its steps back to the host's choice, and its tokens stay the same.
// A request whose prompt continues an earlier one (a conversation's next turn: the earlier prompt, its reply, more)
// takes that request's slot, whichever it was, and keeps its positions: all the cached ones, the earlier reply's
// last token aside (never fed). Its greedy reply is the one a fresh engine gives, and an unrelated prompt keeps
// nothing. With cache_prompt off nothing is kept.
TEST(BatchEngine, PromptCacheKeepsAnEarlierRequestsPositions) {
  const CompletionRequest first = greedy(kPrompts[2], 12), other = greedy(kPrompts[6], 12);
  auto run = [&](bool cache) {
    BatchEngine engine(model(), {.parallel = 3, .prefill_chunk = 5, .cache_prompt = cache});
    Collector a, b;
    engine.submit(other, b.callback());  // the first free slot: the first request must not land beside it
    engine.submit(first, a.callback());
    a.wait();
    b.wait();
    CompletionRequest next = greedy(kPrompts[2], 16);
    next.prompt.insert(next.prompt.end(), a.ids.begin(), a.ids.end());
    const std::vector<int32_t> more = model().encode("\nSecond Citizen:\nWe are accounted");
    next.prompt.insert(next.prompt.end(), more.begin(), more.end());
    Collector c, d;
    engine.submit(next, c.callback());
    c.wait();
    engine.submit(greedy(kPrompts[9], 4), d.callback());
    d.wait();
    Collector e;  // the same request again: all its prompt but the last token kept, the same reply
    engine.submit(next, e.callback());
    e.wait();
    EXPECT_EQ(e.ids, c.ids);
    EXPECT_EQ(e.last.n_cached, cache ? next.prompt.size() - 1 : 0u);
    return std::tuple{c.ids, c.last, d.last, a.ids.size(), engine.stats(), e.last.n_cached};
  };
  const auto [cached_ids, cached_done, unrelated_done, first_reply, stats, again] = run(true);
  const auto [fresh_ids, fresh_done, fresh_unrelated, first_reply2, fresh_stats, again2] = run(false);
  EXPECT_EQ(cached_ids, fresh_ids);
  EXPECT_EQ(cached_done.n_cached, first.prompt.size() + first_reply - 1);
  EXPECT_EQ(cached_done.n_prompt, fresh_done.n_prompt);
  EXPECT_EQ(fresh_done.n_cached, 0u);
  EXPECT_EQ(unrelated_done.n_cached, 0u) << "an unrelated prompt shares a beginning-of-text token at most";
  EXPECT_EQ(stats.prompt_tokens_cached, cached_done.n_cached + unrelated_done.n_cached + again);
  EXPECT_EQ(fresh_stats.prompt_tokens_cached, 0u);
}

// Requests that begin alike in other slots: the first one's prompt (a shared beginning, then its own) is computed;
// the second takes its slot and keeps the beginning there, and while it decodes (120 tokens) the third takes a free
// slot and the beginning's positions from the second's (GpuSession::share_prefix). Their greedy replies are a fresh
// engine's (the second's first 10 tokens), and the stats count the shared positions.
TEST(BatchEngine, PromptCacheSharedAcrossSlots) {
  std::vector<int32_t> start;
  for (const std::string& p : {kPrompts[2], kPrompts[4], kPrompts[10], kPrompts[3]}) {
    const std::vector<int32_t> t = model().encode(p + "\n");
    start.insert(start.end(), t.begin(), t.end());
  }
  ASSERT_GE(start.size(), 24u);
  auto with = [&](const std::string& rest) {
    CompletionRequest r = greedy("", 10);
    r.prompt = start;
    const std::vector<int32_t> t = model().encode(rest);
    r.prompt.insert(r.prompt.end(), t.begin(), t.end());
    return r;
  };
  const CompletionRequest a = with("ROMEO:"), c = with("HAMLET:");
  CompletionRequest b = with("JULIET:");
  b.max_tokens = 120;
  ASSERT_NE(a.prompt[start.size()], b.prompt[start.size()]);
  ASSERT_NE(b.prompt[start.size()], c.prompt[start.size()]);
  ASSERT_NE(a.prompt[start.size()], c.prompt[start.size()]);
  auto run = [&](bool cache) {
    BatchEngine engine(model(), {.parallel = 3, .prefill_chunk = 8, .cache_prompt = cache});
    Collector first, second, third;
    a_then_b_then_c(engine, a, b, c, first, second, third);
    EXPECT_EQ(second.ids.size(), 120u);
    second.ids.resize(10);
    return std::tuple{std::vector{first.ids, second.ids, third.ids},
                      std::vector{first.last.n_cached, second.last.n_cached, third.last.n_cached}, engine.stats()};
  };
  const auto [ids, cached, stats] = run(true);
  const auto [fresh_ids, fresh_cached, fresh_stats] = run(false);
  EXPECT_EQ(ids, fresh_ids);
  const uint32_t n = uint32_t(start.size());
  EXPECT_EQ(cached, (std::vector<uint32_t>{0, n, n})) << "the shared beginning, in its slot and in another";
  EXPECT_EQ(stats.prompt_tokens_cached, 2u * n);
  EXPECT_EQ(stats.prompt_tokens_shared, n) << "one of the two took it from another slot";
  EXPECT_EQ(fresh_cached, (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_EQ(fresh_stats.prompt_tokens_shared, 0u);
}

// A pool of 2 pages (256 positions) for two requests of ~400 positions each: the first to reach its second page
// finds none and is preempted; the other takes its page and goes on; once that one ends, the first resumes, its 256
// tokens fed again, and both replies are those of an engine whose pool holds every page. Without any other request
// running, one that outgrows the pool alone fails with one line.
TEST(BatchEngine, RequestsOutOfPagesArePreemptedAndResume) {
  LoadOptions lo;
  lo.n_ctx = 1024;
  const Model m = Model::load(default_model_gguf(), lo, "built-in");
  auto request = [&](const std::string& prompt, uint32_t max_tokens) {
    CompletionRequest r;
    r.prompt = m.encode(prompt);
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    return r;
  };
  auto run = [&](uint32_t pool) {
    BatchEngine engine(m, {.parallel = 2, .n_ctx = 512, .prefill_chunk = 8, .kv_pool = pool});
    Collector a, b;
    engine.submit(request(kPrompts[1], 400), a.callback());
    engine.submit(request(kPrompts[3], 400), b.callback());
    a.wait();
    b.wait();
    EXPECT_TRUE(a.last.error.empty()) << a.last.error;
    EXPECT_TRUE(b.last.error.empty()) << b.last.error;
    return std::pair{std::vector{a.ids, b.ids}, engine.stats()};
  };
  const auto [ids, stats] = run(512);
  const auto [full_ids, full_stats] = run(0);
  ASSERT_EQ(full_ids[0].size(), 400u);
  ASSERT_EQ(full_ids[1].size(), 400u);
  EXPECT_EQ(ids, full_ids);
  EXPECT_GE(stats.requests_preempted, 1u);
  EXPECT_EQ(stats.requests_failed, 0u);
  EXPECT_EQ(full_stats.requests_preempted, 0u);

  BatchEngine alone(m, {.parallel = 2, .n_ctx = 512, .prefill_chunk = 8, .kv_pool = 256});
  Collector c;
  alone.submit(request(kPrompts[1], 400), c.callback());
  c.wait();
  EXPECT_NE(c.last.error.find("KV cache pool is full"), std::string::npos) << c.last.error;
  EXPECT_LT(c.ids.size(), 256u);
  EXPECT_EQ(alone.stats().requests_failed, 1u);
}

// lfm2's conv rings cross slots at page boundaries (256 positions): three prompts that begin with the same 300
// tokens, each then its own 12. The second keeps 296 in the first's slot (its checkpoint 16 before the end); the
// third, while the second decodes, takes 256 from the second's slot, the conv state there from its marks. The cuts
// fall on the chunks' edges (prefill_chunk 8), so the replies are a fresh engine's.
TEST(BatchEngine, ConvModelsShareAPrefixAtPageBoundaries) {
  const Model m = load_file("lfm2-tiny-f32", 512);
  auto ids = [&](uint32_t n, uint32_t seed) { return spread_ids(m, n, seed); };
  const std::vector<int32_t> start = ids(300, 1);
  auto with = [&](uint32_t seed, uint32_t max_tokens) {
    CompletionRequest r;
    r.prompt = start;
    const std::vector<int32_t> rest = ids(12, seed);
    r.prompt.insert(r.prompt.end(), rest.begin(), rest.end());
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    return r;
  };
  const CompletionRequest a = with(2, 10), b = with(3, 120), c = with(4, 10);
  auto run = [&](bool cache) {
    BatchEngine engine(m, {.parallel = 3, .n_ctx = 512, .prefill_chunk = 8, .cache_prompt = cache});
    Collector first, second, third;
    a_then_b_then_c(engine, a, b, c, first, second, third);
    second.ids.resize(std::min<size_t>(second.ids.size(), 10));
    return std::tuple{std::vector{first.ids, second.ids, third.ids},
                      std::vector{first.last.n_cached, second.last.n_cached, third.last.n_cached}, engine.stats()};
  };
  const auto [replies, cached, stats] = run(true);
  const auto [fresh_replies, fresh_cached, fresh_stats] = run(false);
  EXPECT_EQ(replies, fresh_replies);
  EXPECT_EQ(cached, (std::vector<uint32_t>{0, 296, 256}));
  EXPECT_EQ(stats.prompt_tokens_shared, 256u) << "the third took a page boundary's state from the second's slot";
  EXPECT_EQ(fresh_cached, (std::vector<uint32_t>{0, 0, 0}));
  EXPECT_EQ(fresh_stats.prompt_tokens_shared, 0u);
}

// A KV pool of two pages (256 positions each) for three sequences: a request whose slot finds no free page takes
// one from the least recently used idle slot, whose cached prompt is then gone (the same prompt again keeps
// nothing), and every reply is a fresh engine's. With one page, a second request waits in the queue while the first
// holds it, and starts when it ends.
TEST(BatchEngine, SmallKvPoolTakesIdleSlotsPages) {
  auto run = [&](uint32_t pool) {
    BatchEngine engine(model(), {.parallel = 3, .prefill_chunk = 8, .kv_pool = pool});
    std::vector<std::vector<int32_t>> ids;
    std::vector<uint32_t> cached;
    for (size_t p : {2, 4, 6, 2, 4}) {
      Collector c;
      engine.submit(greedy(kPrompts[p] + " " + kPrompts[p + 1] + " " + kPrompts[p + 2], 8), c.callback());
      c.wait();
      EXPECT_TRUE(c.last.error.empty()) << c.last.error;
      ids.push_back(c.ids);
      cached.push_back(c.last.n_cached);
    }
    return std::pair{ids, cached};
  };
  const auto [small_ids, small_cached] = run(512);
  const auto [full_ids, full_cached] = run(0);
  EXPECT_EQ(small_ids, full_ids);
  auto kept = [](size_t p) {
    return uint32_t(model().encode(kPrompts[p] + " " + kPrompts[p + 1] + " " + kPrompts[p + 2]).size()) - 1;
  };
  ASSERT_GE(kept(2), 16u);
  ASSERT_GE(kept(4), 16u);
  EXPECT_EQ(full_cached, (std::vector<uint32_t>{0, 0, 0, kept(2), kept(4)}));
  EXPECT_EQ(small_cached, (std::vector<uint32_t>{0, 0, 0, 0, 0})) << "the first two slots' pages went to the third";

  BatchEngine engine(model(), {.parallel = 2, .prefill_chunk = 8, .kv_pool = 256});
  Collector first, second;
  std::atomic<int> order{0}, first_done{0}, second_first{0};
  auto first_cb = first.callback(), second_cb = second.callback();
  engine.submit(greedy(kPrompts[1], 60), [&](const CompletionEvent& e) {
    if (e.done) first_done = ++order;
    return first_cb(e);
  });
  while (engine.stats().generated_tokens == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine.submit(greedy(kPrompts[3], 4), [&](const CompletionEvent& e) {
    if (!e.done && second_first == 0) second_first = ++order;
    return second_cb(e);
  });
  second.wait();
  first.wait();
  EXPECT_TRUE(first.last.error.empty()) << first.last.error;
  EXPECT_TRUE(second.last.error.empty()) << second.last.error;
  EXPECT_EQ(first.ids.size(), 60u);
  EXPECT_EQ(second.ids.size(), 4u);
  EXPECT_LT(first_done, second_first) << "the second started only once the first gave its page back";
  const BatchStats stats = engine.stats();
  EXPECT_EQ(stats.requests_failed, 0u);
  EXPECT_EQ(stats.kv_pages, 1u);
  EXPECT_EQ(stats.kv_pages_free, 0u) << "the second request's page, kept for its cached prompt";
}

// Qwen 3.5's recurrent state does not rewind: its slot keeps copies of it after each prompt and 16 tokens before its
// end. A conversation's next turn that renders the last prompt's end differently (as chat templates do with the
// generation prompt) comes back from the one 16 before; one that continues the prompt and parts from its reply, from
// the one after it. The cuts fall on the chunks' edges (prefill_chunk 8), so the tokens fed are chunked as a fresh
// engine's and the replies must be its, bit for bit; then one that does not (a chunk cut short for the checkpoint).
// With cache_prompt off nothing is kept.
TEST(BatchEngine, RecurrentModelsPromptCacheComesBackFromCheckpoints) {
  const Model m = load_file("qwen35-tiny-f32", 256);
  auto ids = [&](uint32_t n, uint32_t seed) { return spread_ids(m, n, seed); };
  auto request = [](std::vector<int32_t> prompt) {
    CompletionRequest r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.max_tokens = 12;
    return r;
  };
  auto run = [&](bool cache) {
    BatchEngine engine(m, {.parallel = 2, .prefill_chunk = 8, .cache_prompt = cache});
    auto submit = [&](const std::vector<int32_t>& prompt) {
      Collector c;
      engine.submit(request(prompt), c.callback());
      c.wait();
      return std::pair{c.ids, c.last.n_cached};
    };
    const std::vector<int32_t> first = ids(40, 1);
    const auto [reply0, cached0] = submit(first);
    std::vector<int32_t> second(first.begin(), first.end() - 2);  // parts 2 tokens before the first prompt's end
    const std::vector<int32_t> x = ids(10, 2);
    second.insert(second.end(), x.begin(), x.end());
    const auto [reply1, cached1] = submit(second);
    EXPECT_GE(reply1.size(), 6u);
    std::vector<int32_t> third = second;  // continues the second prompt, parts from its reply after 5 tokens
    third.insert(third.end(), reply1.begin(), reply1.begin() + std::min<size_t>(5, reply1.size()));
    const std::vector<int32_t> y = ids(64 - third.size(), 3);
    third.insert(third.end(), y.begin(), y.end());
    const auto [reply2, cached2] = submit(third);
    // a prompt of 43: a chunk ends at 27 for the checkpoint (the replies are not compared: the cut chunks the tokens
    // unlike a fresh engine's)
    const std::vector<int32_t> fourth = ids(43, 4);
    submit(fourth);
    std::vector<int32_t> fifth(fourth.begin(), fourth.end() - 2);
    fifth.push_back(x[0]);
    const uint32_t cached4 = submit(fifth).second;
    return std::tuple{std::vector{reply0, reply1, reply2}, std::vector{cached0, cached1, cached2, cached4},
                      engine.stats().prompt_tokens_cached};
  };
  const auto [replies, cached, total] = run(true);
  const auto [fresh_replies, fresh_cached, fresh_total] = run(false);
  EXPECT_EQ(replies, fresh_replies);
  EXPECT_EQ(cached, (std::vector<uint32_t>{0, 24, 48, 27}))
      << "the checkpoints 16 before the first prompt's end, after the second and 16 before the fourth's end";
  EXPECT_EQ(total, 99u);
  EXPECT_EQ(fresh_cached, (std::vector<uint32_t>{0, 0, 0, 0}));
  EXPECT_EQ(fresh_total, 0u);
}

TEST(BatchEngine, GreedyTokensChosenOnTheGpuEqualTheHostsChoice) {
  const Model on_host = default_model_choosing(false), on_gpu = default_model_choosing(true);
  auto run = [](const Model& m, bool with_logprobs) {
    BatchEngine engine(m, {.parallel = 16, .prefill_chunk = 7});
    std::vector<Collector> cs(kPrompts.size());
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      CompletionRequest r = greedy(kPrompts[i], 20);
      r.logprobs = with_logprobs && i == 3;
      engine.submit(std::move(r), cs[i].callback());
    }
    std::vector<std::vector<int32_t>> ids;
    for (auto& c : cs) {
      c.wait();
      ids.push_back(c.ids);
    }
    return std::pair{ids, engine.stats()};
  };
  const auto [host, host_stats] = run(on_host, false);
  const auto [gpu, gpu_stats] = run(on_gpu, false);
  const auto [mixed, mixed_stats] = run(on_gpu, true);
  EXPECT_EQ(gpu, host);
  EXPECT_EQ(mixed, host);
  EXPECT_EQ(host_stats.steps_chosen_on_gpu, 0u);
  EXPECT_GT(gpu_stats.steps_chosen_on_gpu, 0u);
  EXPECT_GT(gpu_stats.steps_run_ahead, 0u) << "steps of the same sequences queued before their ids came back";
  EXPECT_GT(mixed_stats.steps_encoded_ahead, 0u) << "logits steps of the same sequences run as encoded ahead";
  EXPECT_LT(mixed_stats.steps_chosen_on_gpu, gpu_stats.steps_chosen_on_gpu)
      << "the steps with the logprobs request beside come back to the host";
  BatchEngine alone(on_gpu, {.parallel = 2});
  Collector c;
  alone.submit(greedy(kPrompts[5], 20), c.callback());
  c.wait();
  EXPECT_EQ(c.ids, host[5]);
}

// Sampled requests on the GPU (sample.wgsl draws each row's token with its sampler's uniform and recent ids): the
// same tokens alone as beside others (greedy ones, a logprobs request whose step logits come back, other settings),
// and the tokens the host's sampler draws with the same seeds.
TEST(BatchEngine, SampledTokensOnTheGpuAloneOrBesideOthersAsOnTheHost) {
  const Model on_host = default_model_choosing(false), on_gpu = default_model_choosing(true);
  std::vector<CompletionRequest> reqs;
  const SamplingParams modes[] = {
      {.temperature = 0.9f, .top_k = 20, .top_p = 0.95f, .min_p = 0.f, .seed = 1},
      {.temperature = 1.2f, .top_k = 0, .top_p = 0.9f, .min_p = 0.05f, .seed = 2},
      {.temperature = 0.7f, .top_k = 4, .top_p = 1.f, .min_p = 0.f, .seed = 3},  // the fast path
      {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.3f, .seed = 4},
      {.temperature = 1.f,
       .top_k = 0,
       .top_p = 1.f,
       .min_p = 0.f,
       .repeat_penalty = 0.8f,
       .repeat_last_n = -1,
       .seed = 5},
  };
  for (size_t i = 0; i < std::size(modes); ++i) {
    CompletionRequest r = greedy(kPrompts[i], 24);
    r.sampling = modes[i];
    reqs.push_back(r);
  }
  const size_t n_sampled = reqs.size();
  reqs.push_back(greedy(kPrompts[8], 24));
  CompletionRequest lp = greedy(kPrompts[9], 24);
  lp.logprobs = true;
  reqs.push_back(lp);
  auto run = [&](const Model& m, size_t count, size_t only = SIZE_MAX) {
    BatchEngine engine(m, {.parallel = 8, .prefill_chunk = 7});
    std::vector<Collector> cs(count);
    for (size_t i = 0; i < count; ++i)
      if (only == SIZE_MAX || i == only) engine.submit(reqs[i], cs[i].callback());
    std::vector<std::vector<int32_t>> ids(count);
    for (size_t i = 0; i < count; ++i)
      if (only == SIZE_MAX || i == only) {
        cs[i].wait();
        ids[i] = cs[i].ids;
      }
    return std::pair{ids, engine.stats()};
  };
  const auto [host, host_stats] = run(on_host, reqs.size());
  const auto [together, together_stats] = run(on_gpu, reqs.size());
  const auto [sampled, sampled_stats] = run(on_gpu, n_sampled);
  EXPECT_EQ(host_stats.steps_chosen_on_gpu, 0u);
  EXPECT_GT(sampled_stats.steps_chosen_on_gpu, 0u) << "steps of sampled requests alone drawn on the GPU";
  for (size_t i = 0; i < reqs.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(i));
    ASSERT_EQ(together[i].size(), 24u);
    EXPECT_EQ(together[i], host[i]);
    if (i < n_sampled) {
      EXPECT_EQ(sampled[i], host[i]);
      EXPECT_EQ(run(on_gpu, reqs.size(), i).first[i], host[i]) << "alone";
    }
  }
}

// The text of the events is the decoded text of the ids (UTF-8 whole), and it is what Session::generate gives.
TEST(BatchEngine, TextAndTokensMatchSessionGenerate) {
  BatchEngine engine(model(), {.parallel = 2});
  Collector c;
  engine.submit(greedy("ROMEO:", 40), c.callback());
  c.wait();
  Session s(model());
  const GenerateResult r = s.generate(model().encode("ROMEO:"), {.temperature = 0}, 40);
  EXPECT_EQ(c.ids, r.tokens);
  EXPECT_EQ(c.text, r.text);
  EXPECT_EQ(c.text, model().decode(c.ids, true));
}

TEST(BatchEngine, StopReasonsAndCancellation) {
  BatchEngine engine(model(), {.parallel = 3, .n_ctx = 32});
  Collector len, ctx, stop;
  engine.submit(greedy("ROMEO:", 5), len.callback());
  engine.submit(greedy("JULIET:", 1000), ctx.callback());  // runs into the 32-position context
  stop.stop_after = 3;
  engine.submit(greedy("HAMLET:", 50), stop.callback());
  len.wait();
  ctx.wait();
  stop.wait();
  EXPECT_EQ(len.last.stop_reason, StopReason::Length);
  EXPECT_EQ(len.ids.size(), 5u);
  EXPECT_EQ(ctx.last.stop_reason, StopReason::Context);
  EXPECT_EQ(ctx.last.n_prompt + ctx.last.n_generated, 33u);  // 32 positions fed, then the token after the last
  EXPECT_EQ(stop.last.stop_reason, StopReason::Caller);
  EXPECT_EQ(stop.ids.size(), 3u);
  const BatchStats s = engine.stats();
  EXPECT_EQ(s.requests_cancelled, 1u);
  EXPECT_EQ(s.requests_done, 2u);
  EXPECT_EQ(s.active, 0u);
}

TEST(BatchEngine, BadRequestsThrowAndNothingIsQueued) {
  BatchEngine engine(model(), {.parallel = 1, .n_ctx = 16});
  auto expect = [&](CompletionRequest r, const std::string& what) {
    try {
      engine.submit(std::move(r), [](const CompletionEvent&) { return true; });
      ADD_FAILURE() << "no error, expected " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect(greedy("", 4), "the prompt is empty");
  CompletionRequest longer = greedy("ROMEO:", 4);
  longer.prompt.assign(16, 1);
  expect(longer, "leaves no room in the context of 16");
  CompletionRequest bad_id = greedy("ROMEO:", 4);
  bad_id.prompt.push_back(int32_t(model().info().n_vocab));
  expect(bad_id, "outside the vocabulary");
  CompletionRequest top = greedy("ROMEO:", 4);
  top.top_logprobs = 21;
  expect(top, "top_logprobs 21 > 20");
  CompletionRequest sampling = greedy("ROMEO:", 4);
  sampling.sampling.top_p = 2;
  expect(sampling, "top_p");
  EXPECT_EQ(engine.stats().queued, 0u);
  EXPECT_EQ(engine.stats().active, 0u);
}

// One slot and a queue of one: a third request while two are held is refused; cancelling the queued one ends it
// without a token; shutdown(false) cancels the running one.
TEST(BatchEngine, FullQueueCancelAndShutdown) {
  BatchEngine engine(model(), {.parallel = 1, .queue = 1});
  std::atomic<bool> release{false};
  Collector running, queued;
  auto slow = running.callback();
  engine.submit(greedy("ROMEO:", 200), [&](const CompletionEvent& e) {
    while (!e.done && !release) std::this_thread::sleep_for(std::chrono::milliseconds(1));  // holds the engine
    return slow(e);
  });
  const uint64_t q = engine.submit(greedy("JULIET:", 5), queued.callback());
  EXPECT_THROW(engine.submit(greedy("HAMLET:", 5), [](const CompletionEvent&) { return true; }), QueueFull);
  engine.cancel(q);
  release = true;
  queued.wait();
  EXPECT_EQ(queued.last.stop_reason, StopReason::Caller);
  EXPECT_TRUE(queued.ids.empty());
  engine.shutdown(false);
  running.wait();
  EXPECT_EQ(running.last.stop_reason, StopReason::Caller);
  EXPECT_EQ(running.done_events, 1);
  EXPECT_THROW(engine.submit(greedy("ROMEO:", 5), [](const CompletionEvent&) { return true; }), Error);
}

TEST(BatchEngine, ShutdownFinishesWhatIsQueued) {
  Collector a, b;
  {
    BatchEngine engine(model(), {.parallel = 1});
    engine.submit(greedy("ROMEO:", 6), a.callback());
    engine.submit(greedy("JULIET:", 6), b.callback());
    engine.shutdown(true);
  }
  EXPECT_EQ(a.last.stop_reason, StopReason::Length);
  EXPECT_EQ(b.last.stop_reason, StopReason::Length);
  EXPECT_EQ(b.ids.size(), 6u);
}

// Greedy picks the most likely token: its log-probability is the first of the top list, the list falls, and the
// probabilities are a distribution's (each <= 0, their exponentials sum to <= 1).
TEST(BatchEngine, Logprobs) {
  BatchEngine engine(model(), {.parallel = 1});
  Collector c;
  CompletionRequest r = greedy("ROMEO:", 8);
  r.top_logprobs = 5;
  engine.submit(r, c.callback());
  c.wait();
  for (const CompletionEvent& e : c.events) {
    if (e.done) continue;
    ASSERT_EQ(e.top.size(), 5u);
    EXPECT_EQ(e.top[0].id, e.id);
    EXPECT_FLOAT_EQ(e.top[0].logprob, e.logprob);
    double sum = 0;
    for (size_t i = 0; i < e.top.size(); ++i) {
      EXPECT_LE(e.top[i].logprob, 0.f);
      if (i > 0) {
        EXPECT_LE(e.top[i].logprob, e.top[i - 1].logprob);
      }
      sum += std::exp(double(e.top[i].logprob));
    }
    EXPECT_LE(sum, 1.0 + 1e-5);
  }
}

// A presence penalty far above any logit gap: greedy never picks a token twice; without it, it does.
TEST(BatchEngine, PresencePenaltyAvoidsRepeats) {
  BatchEngine engine(model(), {.parallel = 2});
  Collector plain, penalised;
  engine.submit(greedy("ROMEO:", 40), plain.callback());
  CompletionRequest r = greedy("ROMEO:", 40);
  r.presence_penalty = 1000.f;
  engine.submit(r, penalised.callback());
  plain.wait();
  penalised.wait();
  EXPECT_LT(std::set<int32_t>(plain.ids.begin(), plain.ids.end()).size(), plain.ids.size());
  EXPECT_EQ(std::set<int32_t>(penalised.ids.begin(), penalised.ids.end()).size(), penalised.ids.size());
}

// Seeded sampling: the same seed gives the same tokens alone and beside another request.
TEST(BatchEngine, SeededSamplingIsReproducible) {
  CompletionRequest r = greedy("ROMEO:", 30);
  r.sampling = {.temperature = 0.9f, .top_k = 20, .top_p = 0.95f, .min_p = 0.f, .seed = 1234};
  Collector alone;
  {
    BatchEngine engine(model(), {.parallel = 2});
    engine.submit(r, alone.callback());
    alone.wait();
  }
  BatchEngine engine(model(), {.parallel = 2});
  Collector with, other;
  engine.submit(greedy("JULIET:", 30), other.callback());
  engine.submit(r, with.callback());
  with.wait();
  other.wait();
  EXPECT_EQ(with.ids, alone.ids);
}

}  // namespace
}  // namespace wgllm
