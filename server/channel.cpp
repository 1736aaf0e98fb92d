// The engine-to-HTTP hand-over of one request (channel.h).
#include "channel.h"

#include <algorithm>

namespace wgllm::server {

std::string StopMatcher::push(std::string_view text) {
  if (stopped_) return {};
  held_ += text;
  // The earliest stop string wins.
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = held_.substr(0, cut);
    held_.clear();
    return out;
  }
  // Hold back the longest suffix that begins some stop string. A stop string is UTF-8, so such a suffix starts on a
  // character boundary and what goes out is whole characters.
  size_t keep = 0;
  for (const std::string& s : stops_)
    for (size_t n = std::min(s.size() - 1, held_.size()); n > keep; --n)
      if (held_.compare(held_.size() - n, n, s, 0, n) == 0) {
        keep = n;
        break;
      }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

std::string StopMatcher::flush() {
  std::string out = stopped_ ? std::string() : std::move(held_);
  held_.clear();
  return out;
}

CompletionCallback Channel::callback(std::shared_ptr<Channel> channel, const Model& model,
                                     std::vector<std::string> stops, bool logprobs) {
  auto matcher = std::make_shared<StopMatcher>(std::move(stops));
  return [channel, matcher, &model, logprobs](const CompletionEvent& e) {
    Piece p;
    p.text = matcher->push(e.text);
    if (e.done) {
      p.text += matcher->flush();
      p.stopped_by_string = matcher->stopped();
      p.done = e;
      p.done->text.clear();
    } else if (logprobs && !model.is_end_of_generation(e.id)) {
      p.tokens.push_back({e.id, e.logprob, e.top});
    }
    const bool go_on = !matcher->stopped() && !channel->is_client_gone();
    channel->push(std::move(p));
    return go_on;
  };
}

void Channel::merge(Piece& into, Piece&& from) {
  into.text += from.text;
  for (TokenLogprobs& t : from.tokens) into.tokens.push_back(std::move(t));
  if (from.done) {
    into.done = std::move(from.done);
    into.stopped_by_string = from.stopped_by_string;
  }
}

void Channel::push(Piece&& p) {
  {
    std::lock_guard lock(mu_);
    queue_.push_back(std::move(p));
  }
  cv_.notify_one();
}

std::optional<Piece> Channel::take(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !queue_.empty(); })) return std::nullopt;
  Piece out;
  while (!queue_.empty()) {
    merge(out, std::move(queue_.front()));
    queue_.pop_front();
  }
  return out;
}

Piece Channel::take_all() {
  Piece out;
  while (!out.done) {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return !queue_.empty(); });
    while (!queue_.empty()) {
      merge(out, std::move(queue_.front()));
      queue_.pop_front();
    }
  }
  return out;
}

}  // namespace wgllm::server
