// wgllm/chat.h: ChatTemplate, and the request -> ChatInput conversion Model and Vocab share (chat_input.h).
#include "wgllm/chat.h"

#include <cstdio>

#include "api/chat_input.h"
#include "tokenizer/chat.h"
#include "wgllm/error.h"

namespace wgllm {

namespace {

nlohmann::ordered_json parse_json(const std::string& text, std::string_view what, bool want_array) {
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument("chat: " + std::string(what) + " is not JSON (" + e.what() + ")");
  }
  if (want_array ? !j.is_array() : !j.is_object())
    throw InvalidArgument("chat: " + std::string(what) + " must be a JSON " + (want_array ? "array" : "object"));
  return j;
}

}  // namespace

ChatInput chat_input(const ChatRequest& r) {
  ChatInput in;
  in.messages = parse_json(r.messages, "messages", true);
  if (!r.tools.empty()) in.tools = parse_json(r.tools, "tools", true);
  if (!r.variables.empty()) in.variables = parse_json(r.variables, "variables", false);
  in.add_generation_prompt = r.add_generation_prompt;
  if (!r.date.empty()) {
    std::tm t{};
    char rest = 0;
    if (std::sscanf(r.date.c_str(), "%4d-%2d-%2d%c", &t.tm_year, &t.tm_mon, &t.tm_mday, &rest) != 3 || t.tm_mon < 1 ||
        t.tm_mon > 12 || t.tm_mday < 1 || t.tm_mday > 31)
      throw InvalidArgument("chat: date '" + r.date + "' is not YYYY-MM-DD");
    t.tm_year -= 1900;
    t.tm_mon -= 1;
    const int day = t.tm_mday;
    timegm(&t);  // fills the weekday and the day of the year
    if (t.tm_mday != day) throw InvalidArgument("chat: date '" + r.date + "' does not exist");
    in.now = t;
  }
  return in;
}

struct ChatTemplate::Impl {
  std::unique_ptr<jinja::Template> tmpl;
};

ChatTemplate::ChatTemplate(std::string_view jinja) : impl_(std::make_unique<Impl>()) {
  try {
    impl_->tmpl = std::make_unique<jinja::Template>(jinja);
  } catch (const jinja::TemplateError& e) {
    throw Error(std::string("chat template: ") + e.what());
  }
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

std::string ChatTemplate::render(const ChatRequest& request) const {
  return render_jinja_chat(*impl_->tmpl, chat_input(request), request.bos_token.value_or(""),
                           request.eos_token.value_or(""))
      .text;
}

// ---- ReasoningSplitter

namespace {

constexpr std::string_view kThinkOpen = "<think>", kThinkClose = "</think>";
constexpr std::string_view kSpaces = " \t\n\r";

// The length of the longest end of `text` that begins `marker` (text that may yet become the marker).
size_t partial_suffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n)
    if (marker.starts_with(text.substr(text.size() - n))) return n;
  return 0;
}

}  // namespace

ReasoningSplitter::ReasoningSplitter(bool open) : state_(open ? State::Reasoning : State::Start) {}

ReasoningSplitter::Parts ReasoningSplitter::push(std::string_view text) {
  held_ += text;
  Parts out;
  while (true) {
    switch (state_) {
      case State::Start: {
        const size_t b = held_.find_first_not_of(kSpaces);
        if (b == std::string::npos) return out;  // whitespace only, so far
        const std::string_view rest = std::string_view(held_).substr(b);
        if (rest.starts_with(kThinkOpen)) {
          held_.erase(0, b + kThinkOpen.size());
          state_ = State::Reasoning;
          continue;
        }
        if (kThinkOpen.starts_with(rest)) return out;  // "<thi": wait
        state_ = State::Content;
        continue;
      }
      case State::Reasoning: {
        const size_t close = held_.find(kThinkClose);
        if (close == std::string::npos) {
          const size_t keep = partial_suffix(held_, kThinkClose);
          out.reasoning += held_.substr(0, held_.size() - keep);
          held_.erase(0, held_.size() - keep);
          return out;
        }
        out.reasoning += held_.substr(0, close);
        held_.erase(0, close + kThinkClose.size());
        state_ = State::AfterClose;
        continue;
      }
      case State::AfterClose: {
        const size_t b = held_.find_first_not_of(kSpaces);
        if (b == std::string::npos) {
          held_.clear();
          return out;
        }
        held_.erase(0, b);
        state_ = State::Content;
        continue;
      }
      case State::Content:
        out.content += held_;
        held_.clear();
        return out;
    }
  }
}

ReasoningSplitter::Parts ReasoningSplitter::flush() {
  Parts out;
  if (state_ == State::Reasoning)
    out.reasoning = std::move(held_);
  else if (state_ != State::AfterClose)
    out.content = std::move(held_);
  held_.clear();
  return out;
}

bool prompt_opens_thinking(std::string_view prompt) {
  const size_t e = prompt.find_last_not_of(kSpaces);
  return e != std::string_view::npos && prompt.substr(0, e + 1).ends_with(kThinkOpen);
}

}  // namespace wgllm
