// Chat templates as models ship them: the Jinja template of a GGUF file (tokenizer.chat_template) or of a file
// given instead, rendered as transformers' apply_chat_template renders it. Model::render_chat / encode_chat and
// Vocab::render_chat use the model's own; ChatTemplate renders any template source.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "wgllm/error.h"

namespace wgllm {

// A conversation and what the template sees besides it; JSON in the shapes OpenAI's API and transformers use.
struct ChatRequest {
  // A JSON array of messages: {"role": ..., "content": a string, null or [{"type": "text", "text": ...}], and any
  // other field the template reads ("tool_calls", "tool_call_id", "name", "reasoning_content", ...)}.
  std::string messages = "[]";
  std::string tools;      // a JSON array of tools ("" : none; the template sees tools = None)
  std::string variables;  // a JSON object of more template variables, e.g. {"enable_thinking": false} ("" : none)
  bool add_generation_prompt = true;
  std::string date;                                 // the day strftime_now() formats, "YYYY-MM-DD" ("" : now)
  std::optional<std::string> bos_token, eos_token;  // unset: the model's own token texts ("" for ChatTemplate)
};

// A Jinja chat template, parsed once.
class ChatTemplate {
 public:
  // Throws Error "chat template: line L, column C: ..." when the source does not parse.
  explicit ChatTemplate(std::string_view jinja);
  ~ChatTemplate();
  ChatTemplate(ChatTemplate&&) noexcept;
  ChatTemplate& operator=(ChatTemplate&&) noexcept;

  // The rendered text. Throws InvalidArgument for JSON that does not parse or a bad date, Error "chat template:
  // line L, column C: ..." where the template fails or raises (raise_exception's message after the place).
  std::string render(const ChatRequest& request) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A reply split into its reasoning and its content as it streams: text that opens with <think> (after any
// whitespace) is reasoning up to </think>, and what follows (its leading whitespace dropped) is content, as
// llama-server's "deepseek" reasoning format gives them (message.reasoning_content beside message.content). A reply
// without <think> at its start is all content. Text that could still become a marker is held back until the next
// push decides it.
class ReasoningSplitter {
 public:
  struct Parts {
    std::string reasoning, content;
  };
  // open: the prompt itself ended inside a thinking block (a template that opens <think> for the model), so the
  // reply starts as reasoning.
  explicit ReasoningSplitter(bool open = false);
  Parts push(std::string_view text);
  // At the end: what was held back.
  Parts flush();

 private:
  enum class State { Start, Reasoning, AfterClose, Content };
  State state_;
  std::string held_;
};

// Whether a rendered prompt ends inside a thinking block: its last text, spaces aside, is "<think>".
bool prompt_opens_thinking(std::string_view prompt);

}  // namespace wgllm
