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

}  // namespace wgllm
