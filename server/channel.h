// What passes from the engine's thread to the HTTP thread of one request. The engine callback only cuts the text at
// stop strings and pushes into a Channel (a queue behind a mutex); the HTTP thread waits on it and writes, so a slow
// client never holds up the engine, and a gone one stops its request at the next token.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "openai.h"
#include "wgllm/batch.h"

namespace wgllm::server {

// Cuts streamed text before the first stop string. Text that could still become a stop string (a suffix that is a
// prefix of one) is held back until the next chunk decides it.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
    std::erase_if(stops_, [](const std::string& s) { return s.empty(); });  // "" would stop before any text
  }
  // The text that is safe to send now; once a stop string has appeared, the text before it and then nothing.
  std::string push(std::string_view text);
  // At the end: what was held back (no stop string completed it).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

// Text and tokens produced since the HTTP thread last looked, and the end when it came.
struct Piece {
  std::string text;
  std::vector<TokenLogprobs> tokens;    // with logprobs: one per generated token (not the end-of-generation one)
  std::optional<CompletionEvent> done;  // the engine's last event (its text already moved into `text`)
  bool stopped_by_string = false;       // with done: a stop string ended the text
};

class Channel {
 public:
  // The engine's callback feeding `channel`: it cuts the text at stop strings, pushes, and returns false (cancelling
  // the request) once a stop string appeared or the client is gone.
  static CompletionCallback callback(std::shared_ptr<Channel> channel, const Model& model,
                                     std::vector<std::string> stops, bool logprobs);

  // Waits up to `timeout` for what arrived; merges everything queued into one Piece. nullopt: nothing came.
  std::optional<Piece> take(std::chrono::milliseconds timeout);
  // Waits for the end and returns everything (a request that does not stream).
  Piece take_all();

  // The client went away: the next token cancels the request.
  void client_gone() { gone_ = true; }
  bool is_client_gone() const { return gone_; }

 private:
  void push(Piece&& p);
  static void merge(Piece& into, Piece&& from);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Piece> queue_;
  std::atomic<bool> gone_ = false;
};

}  // namespace wgllm::server
