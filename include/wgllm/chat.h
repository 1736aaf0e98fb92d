// Chat templates as models ship them: the Jinja template of a GGUF file (tokenizer.chat_template) or of a file
// given instead, rendered as transformers' apply_chat_template renders it. Model::render_chat / encode_chat and
// Vocab::render_chat use the model's own; ChatTemplate renders any template source.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

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

// A function call the model wrote in its reply.
struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text (an object), as OpenAI's tool_calls[].function.arguments carry it
};

struct ParsedReply {
  std::string content;  // the reply without its tool calls (surrounding whitespace trimmed where calls were found)
  std::vector<ToolCall> tool_calls;
};

// The tool calls in a reply, in the formats models write them: Hermes / Qwen (<tool_call>{"name": ..., "arguments":
// {...}}</tool_call>, any number, text around them), Mistral ([TOOL_CALLS][{"name": ..., "arguments": {...}}, ...],
// or [TOOL_CALLS]name[ARGS]{...}), Llama 3.x (the whole reply one {"name": ..., "parameters": {...}}, after an
// optional <|python_tag|>), LFM2 (<|tool_call_start|>[name(arg="value", n=1), ...]<|tool_call_end|>, Python
// literals). A reply with none, or whose calls do not parse, is all content.
ParsedReply parse_tool_calls(std::string_view reply);

// A streamed reply's content with tool calls held back: push gives the text that is surely content (what precedes a
// tool-call marker, or could not start one); finish parses what was held and the calls in it.
class ToolCallStream {
 public:
  std::string push(std::string_view text);
  ParsedReply finish();

 private:
  std::string held_;
  bool started_ = false;  // some content has passed: a reply-wide JSON call can no longer begin
  bool holding_ = false;  // a marker appeared: everything from it waits for the end
};

// gpt-oss's "harmony" replies, as they stream: messages <|channel|>NAME[ to=RECIPIENT][ <|constrain|>json]<|message|>
// BODY ended by <|end|> (then <|start|>assistant and the next), <|call|> or the end of the reply. The analysis
// channel is reasoning, final (and commentary to no one) content, commentary to=functions.NAME a tool call whose
// body is its JSON arguments. A reply that does not open with a channel is all content.
class HarmonyStream {
 public:
  ReasoningSplitter::Parts push(std::string_view text);
  struct End {
    ReasoningSplitter::Parts rest;  // what was still held
    std::vector<ToolCall> tool_calls;
  };
  End finish();

 private:
  enum class State { Start, Plain, Header, Body };
  enum class Kind { Reasoning, Content, Call };
  void emit(ReasoningSplitter::Parts& out, std::string_view body);
  void end_call(ReasoningSplitter::Parts& out);
  State state_ = State::Start;
  Kind kind_ = Kind::Content;
  std::string held_, call_name_, call_args_;
  std::vector<ToolCall> calls_;
};

// Whether a rendered prompt leaves the reply to a harmony message: it ends with "<|start|>assistant".
bool prompt_expects_harmony(std::string_view prompt);

// Whether a rendered prompt ends inside a thinking block: its last text, spaces aside, is "<think>".
bool prompt_opens_thinking(std::string_view prompt);

}  // namespace wgllm
