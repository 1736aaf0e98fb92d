// OpenAI's API shapes: request bodies of /v1/chat/completions and /v1/completions parsed and checked into a
// BatchEngine request, and the response objects (whole, streamed chunks, errors) built from what the engine produced.
// No HTTP here: server.cpp moves these objects over the wire.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "wgllm/batch.h"
#include "wgllm/chat.h"
#include "wgllm/wgllm.h"

namespace wgllm::server {

// A request refused as OpenAI refuses it: an HTTP status and {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  int status;
  std::string param, code;
  ApiError(int status, const std::string& message, std::string param = {}, std::string code = {})
      : std::runtime_error(message), status(status), param(std::move(param)), code(std::move(code)) {}
};

// {"error": {...}}; type follows from the status (invalid_request_error, authentication_error, server_error, ...).
nlohmann::json error_body(int status, const std::string& message, const std::string& param = {},
                          const std::string& code = {});

enum class Endpoint { Chat, Completions };

// One request of either endpoint, checked: every field the server uses has its type and range, the prompt fits.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::Chat;
  CompletionRequest engine;       // prompt ids, sampling, max_tokens (clamped to the context left), penalties
  std::vector<std::string> stop;  // stop strings: the text ends before the first that appears
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
  bool logprobs = false;       // per-token log-probabilities in the response
  uint32_t top_logprobs = 0;   // alternatives per token (chat: top_logprobs; completions: logprobs = n)
  bool thinking_open = false;  // chat: the prompt ends inside <think> (the template opened it for the model)
  bool tool_calls = false;     // chat with tools (tool_choice not "none"): the reply's tool calls are parsed
  bool harmony = false;        // chat: the prompt leaves the reply to a gpt-oss harmony message
};

// How a chat reply is read: reasoning apart, tool calls parsed, harmony channels.
struct ReplyFormat {
  bool split_reasoning = false;  // <think>...</think> (or harmony's analysis) to reasoning_content
  bool thinking_open = false;    // the reply starts inside <think>
  bool tool_calls = false;       // tool calls parsed out of the content
  bool harmony = false;          // gpt-oss channels (HarmonyStream) instead of <think> and the other call formats
};

// A chat reply read as it streams (ReplyFormat): push gives each piece's reasoning and content, finish what was
// held and the tool calls.
class ReplyParser {
 public:
  explicit ReplyParser(const ReplyFormat& format);
  ReasoningSplitter::Parts push(std::string_view text);
  std::pair<ReasoningSplitter::Parts, std::vector<ToolCall>> finish();

 private:
  ReplyFormat format_;
  std::optional<ReasoningSplitter> reasoning_;
  std::optional<ToolCallStream> tools_;
  std::optional<HarmonyStream> harmony_;
};

// Parses a request body for `endpoint`. Throws ApiError: 400 for JSON that does not parse, a field of the wrong type
// or out of range (naming it), n > 1, a prompt that leaves no room in the context of n_ctx tokens; with strict_model,
// 404 for a model other than `model_name` (without it, as llama-server, any name is answered by the served model;
// an absent model is taken as the served one). Unknown fields are ignored. max_tokens past
// what the context leaves is lowered to it (the default: all it leaves).
ParsedRequest parse_request(Endpoint endpoint, const std::string& body, const Model& model, uint32_t n_ctx,
                            const std::string& model_name, bool strict_model = true);

// One token's log-probabilities as the engine gave them.
struct TokenLogprobs {
  int32_t id = -1;
  float logprob = 0.f;
  std::vector<TokenLogprob> top;
};

// How a request ended, for the last chunk and the usage.
struct Finish {
  std::string reason;  // "stop" or "length"
  uint32_t prompt_tokens = 0, completion_tokens = 0;
  uint32_t cached_tokens = 0;  // of prompt_tokens: kept from an earlier request's cache
};

// Builds the response objects of one request: one id, one creation time, one model name for all its chunks.
class ResponseWriter {
 public:
  // format (chat): how the reply is split into reasoning_content, content and tool_calls.
  ResponseWriter(Endpoint endpoint, const Model& model, std::string model_name, bool logprobs, ReplyFormat format = {});
  Endpoint endpoint() const { return endpoint_; }

  // A streamed chunk carrying `text` (and its tokens' log-probabilities); chat's first chunk carries the role.
  // With reasoning split, the delta carries the text's reasoning as reasoning_content and the rest as content; with
  // tools, content from a tool-call marker on is held for the last chunk, which carries the calls (tool_calls).
  nlohmann::json chunk(const std::string& text, const std::vector<TokenLogprobs>& tokens);
  // The last streamed chunk: the finish reason, and any text still held.
  nlohmann::json final_chunk(const std::string& text, const std::vector<TokenLogprobs>& tokens, const Finish& f);
  // stream_options.include_usage: a chunk with no choices and the usage.
  nlohmann::json usage_chunk(const Finish& f) const;
  // The whole response of a request that did not stream.
  nlohmann::json whole(const std::string& text, const std::vector<TokenLogprobs>& tokens, const Finish& f) const;

 private:
  nlohmann::json envelope(const char* object) const;
  nlohmann::json chat_logprobs(const std::vector<TokenLogprobs>& tokens) const;
  // The legacy completions shape; offsets count from `offset` bytes of text already sent.
  nlohmann::json completion_logprobs(const std::vector<TokenLogprobs>& tokens, size_t offset) const;
  std::string token_text(int32_t id) const;

  Endpoint endpoint_;
  const Model& model_;
  std::string model_name_, id_;
  int64_t created_;
  bool logprobs_;
  bool role_sent_ = false;
  size_t text_sent_ = 0;  // bytes of completion text in the chunks so far (text_offset)
  ReplyFormat format_;
  ReplyParser parser_;  // the streamed reply's
  nlohmann::json delta(const ReasoningSplitter::Parts& parts) const;
  nlohmann::json tool_calls_json(const std::vector<ToolCall>& calls, bool stream) const;
};

// The data of a streamed event: `data: <json>\n\n`.
std::string sse(const nlohmann::json& j);
// JSON text that never throws on invalid UTF-8 (a token's bytes can be part of a character): replaced by U+FFFD.
std::string dump(const nlohmann::json& j);

}  // namespace wgllm::server
