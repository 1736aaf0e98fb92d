// OpenAI request parsing and response shapes (openai.h).
#include "openai.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <random>

namespace wgllm::server {

using json = nlohmann::json;

namespace {

const char* error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 404: return "not_found_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

// ---- typed access to the body's fields; a null field counts as absent (OpenAI's clients send nulls)

const json* field(const json& body, const char* key) {
  const auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

[[noreturn]] void wrong_type(const char* key, const char* expected, const json& got) {
  throw ApiError(400,
                 std::string("Invalid type for '") + key + "': expected " + expected + ", but got " + got.type_name() +
                     " instead.",
                 key, "invalid_type");
}

[[noreturn]] void bad_value(const char* key, const std::string& message) {
  throw ApiError(400, message, key, "invalid_value");
}

std::optional<bool> get_bool(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) wrong_type(key, "a boolean", *v);
  return v->get<bool>();
}

std::optional<double> get_number(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) wrong_type(key, "a number", *v);
  return v->get<double>();
}

// Integers only (10.5 is refused as OpenAI refuses it); past int64 they saturate.
std::optional<int64_t> get_int(const json& body, const char* key) {
  const json* v = field(body, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    return u > uint64_t(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max() : int64_t(u);
  }
  if (!v->is_number_integer()) wrong_type(key, "an integer", *v);
  return v->get<int64_t>();
}

double in_range(const char* key, double v, double lo, double hi) {
  if (!(v >= lo && v <= hi))
    bad_value(key, std::string("'") + key + "' must be between " + json(lo).dump() + " and " + json(hi).dump() +
                       ", got " + json(v).dump());
  return v;
}

// ---- the prompt

// A message's content is a string, null (an assistant turn that carried only tool calls) or an array of parts of
// which only {"type": "text", "text": ...} is understood.
void check_content(const json& msg) {
  const json* c = field(msg, "content");
  if (!c || c->is_string()) return;
  if (!c->is_array()) wrong_type("messages.content", "a string or an array of content parts", *c);
  for (const json& part : *c)
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad_value("messages", "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
}

// The messages, tools and chat_template_kwargs as the model's chat template sees them: the body's own JSON, keys
// in the order the client wrote them (a tool's schema reaches the prompt as written).
// tool_choice: "none" (the template gets no tools, the reply no parsing), "auto", "required" or a named function
// (both taken as "auto": nothing constrains the sampling). Returns whether the tools go to the template.
bool use_tools(const json& body, const json* tools) {
  const json* choice = field(body, "tool_choice");
  if (!choice) return tools != nullptr;
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c != "none" && c != "auto" && c != "required")
      bad_value("tool_choice", "'tool_choice' must be none, auto, required or {\"type\": \"function\", ...}");
    return tools && c != "none";
  }
  if (!choice->is_object() || !choice->contains("function"))
    wrong_type("tool_choice", "a string or {\"type\": \"function\", \"function\": {\"name\": ...}}", *choice);
  return tools != nullptr;
}

std::vector<int32_t> chat_prompt(const json& body, const std::string& body_text, const Model& model,
                                 ParsedRequest& req) {
  const json* messages = field(body, "messages");
  if (!messages) throw ApiError(400, "'messages' is required", "messages", "missing_required_parameter");
  if (!messages->is_array()) wrong_type("messages", "an array", *messages);
  if (messages->empty()) bad_value("messages", "'messages' must hold at least one message");
  for (const json& m : *messages) {
    if (!m.is_object()) wrong_type("messages", "an array of objects", m);
    const json* role = field(m, "role");
    if (!role) throw ApiError(400, "every message needs a 'role'", "messages", "missing_required_parameter");
    if (!role->is_string()) wrong_type("messages.role", "a string", *role);
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "developer" && r != "user" && r != "assistant" && r != "tool" && r != "function")
      bad_value("messages", "role '" + r + "' is not one of system, developer, user, assistant, tool, function");
    check_content(m);
  }
  const json* tools = field(body, "tools");
  if (tools && !tools->is_array()) wrong_type("tools", "an array", *tools);
  const json* kwargs = field(body, "chat_template_kwargs");
  if (kwargs && !kwargs->is_object()) wrong_type("chat_template_kwargs", "an object", *kwargs);
  const nlohmann::ordered_json ordered = nlohmann::ordered_json::parse(body_text);
  nlohmann::ordered_json msgs = ordered["messages"];
  for (auto& m : msgs)
    if (m["role"] == "developer") m["role"] = "system";  // OpenAI's newer name for the system role
  ChatRequest r;
  r.messages = msgs.dump();
  req.tool_calls = use_tools(body, tools);
  if (req.tool_calls) r.tools = ordered["tools"].dump();
  if (kwargs) r.variables = ordered["chat_template_kwargs"].dump();
  try {
    std::vector<int32_t> ids = model.encode_chat(r);
    // The template may open the reply's thinking itself (the prompt ends in "<think>\n"): its last tokens say.
    const size_t tail = std::min<size_t>(ids.size(), 8);
    const std::string end = model.decode(std::span(ids).last(tail));
    req.thinking_open = prompt_opens_thinking(end);
    req.harmony = prompt_expects_harmony(end);
    return ids;
  } catch (const InvalidArgument& e) {
    bad_value("messages", e.what());
  } catch (const Error& e) {  // the template refused the conversation (raise_exception) or failed on it
    bad_value("messages", e.what());
  }
}

// A string (tokenized with BOS and control tokens as the model's tokenizer does for raw prompts), an array of token
// ids, or an array holding one string.
std::vector<int32_t> completion_prompt(const json& body, const Model& model) {
  const json* prompt = field(body, "prompt");
  if (!prompt) throw ApiError(400, "'prompt' is required", "prompt", "missing_required_parameter");
  if (prompt->is_string()) return model.encode(prompt->get<std::string>(), true, true);
  if (!prompt->is_array()) wrong_type("prompt", "a string or an array of token ids", *prompt);
  if (prompt->size() == 1 && (*prompt)[0].is_string()) return model.encode((*prompt)[0].get<std::string>(), true, true);
  std::vector<int32_t> ids;
  const int64_t n_vocab = model.info().n_vocab;
  for (const json& t : *prompt) {
    if (t.is_string() || t.is_array())
      bad_value("prompt", "one prompt per request: a string or an array of token ids (batches are not supported)");
    if (!t.is_number_integer()) wrong_type("prompt", "an array of integer token ids", t);
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= n_vocab)
      bad_value("prompt",
                "token id " + std::to_string(id) + " is outside the vocabulary [0, " + std::to_string(n_vocab) + ")");
    ids.push_back(int32_t(id));
  }
  return ids;
}

std::vector<std::string> stop_strings(const json& body) {
  const json* s = field(body, "stop");
  if (!s) return {};
  std::vector<std::string> out;
  if (s->is_string()) {
    out.push_back(s->get<std::string>());
  } else if (s->is_array()) {
    for (const json& x : *s) {
      if (!x.is_string()) wrong_type("stop", "a string or an array of strings", x);
      out.push_back(x.get<std::string>());
    }
  } else {
    wrong_type("stop", "a string or an array of strings", *s);
  }
  if (out.size() > 16) bad_value("stop", "at most 16 stop strings, got " + std::to_string(out.size()));
  std::erase_if(out, [](const std::string& x) { return x.empty(); });  // an empty stop string would stop at once
  return out;
}

SamplingParams sampling(const json& body) {
  SamplingParams p;  // what is not given keeps the library's defaults (llama.cpp's, as its server does)
  if (auto v = get_number(body, "temperature")) p.temperature = float(in_range("temperature", *v, 0, 2));
  if (auto v = get_number(body, "top_p")) p.top_p = float(in_range("top_p", *v, 0, 1));
  if (auto v = get_number(body, "min_p")) p.min_p = float(in_range("min_p", *v, 0, 1));
  if (auto v = get_int(body, "top_k")) p.top_k = int32_t(std::clamp<int64_t>(*v, -1, 1 << 30));
  if (auto v = get_int(body, "seed"))
    p.seed = uint64_t(*v);
  else
    p.seed = std::random_device{}();
  return p;
}

}  // namespace

json error_body(int status, const std::string& message, const std::string& param, const std::string& code) {
  return {{"error",
           {{"message", message},
            {"type", error_type(status)},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

ParsedRequest parse_request(Endpoint endpoint, const std::string& body_text, const Model& model, uint32_t n_ctx,
                            const std::string& model_name, bool strict_model) {
  const json body = json::parse(body_text, nullptr, false);
  if (body.is_discarded())
    throw ApiError(400, "the body is not valid JSON (RFC 8259; strings in UTF-8)", "", "invalid_json");
  if (!body.is_object()) throw ApiError(400, "the body must be a JSON object", "", "invalid_json");

  if (const json* m = field(body, "model")) {
    if (!m->is_string()) wrong_type("model", "a string", *m);
    if (strict_model && m->get<std::string>() != model_name)
      throw ApiError(404,
                     "The model '" + m->get<std::string>() + "' does not exist (this server runs '" + model_name + "')",
                     "model", "model_not_found");
  }
  if (auto n = get_int(body, "n"); n && *n != 1)
    bad_value("n", "'n' must be 1: one completion per request (send several requests for more)");
  if (get_bool(body, "echo").value_or(false)) bad_value("echo", "'echo' is not supported");

  ParsedRequest r;
  r.endpoint = endpoint;
  r.stream = get_bool(body, "stream").value_or(false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) wrong_type("stream_options", "an object", *so);
    r.include_usage = get_bool(*so, "include_usage").value_or(false);
  }
  r.stop = stop_strings(body);
  r.engine.sampling = sampling(body);
  if (auto v = get_number(body, "presence_penalty"))
    r.engine.presence_penalty = float(in_range("presence_penalty", *v, -2, 2));
  if (auto v = get_number(body, "frequency_penalty"))
    r.engine.frequency_penalty = float(in_range("frequency_penalty", *v, -2, 2));

  // Log-probabilities: chat asks with logprobs: true (+ top_logprobs: n), completions with logprobs: n.
  if (endpoint == Endpoint::Chat) {
    r.logprobs = get_bool(body, "logprobs").value_or(false);
    if (auto n = get_int(body, "top_logprobs")) {
      if (!r.logprobs) bad_value("top_logprobs", "'top_logprobs' needs 'logprobs': true");
      r.top_logprobs = uint32_t(in_range("top_logprobs", double(*n), 0, 20));
    }
  } else if (auto n = get_int(body, "logprobs")) {
    r.logprobs = true;
    r.top_logprobs = uint32_t(in_range("logprobs", double(*n), 0, 20));
  }
  r.engine.logprobs = r.logprobs;
  r.engine.top_logprobs = r.top_logprobs;

  // max_completion_tokens is the newer name of max_tokens; either is checked.
  std::optional<int64_t> max_tokens = get_int(body, "max_tokens");
  const char* max_key = "max_tokens";
  if (auto v = get_int(body, "max_completion_tokens")) max_tokens = v, max_key = "max_completion_tokens";
  if (max_tokens && *max_tokens <= 0)
    bad_value(max_key, std::string("'") + max_key + "' must be at least 1, got " + std::to_string(*max_tokens));

  // The prompt last: tokenizing is the costly part.
  const char* prompt_key = endpoint == Endpoint::Chat ? "messages" : "prompt";
  r.engine.prompt =
      endpoint == Endpoint::Chat ? chat_prompt(body, body_text, model, r) : completion_prompt(body, model);
  if (endpoint == Endpoint::Chat) {
    // The markers the reply is split and parsed by stay in its text where the vocabulary makes them control tokens
    // (Mistral's [TOOL_CALLS], some files' <think>).
    for (const char* marker :
         {"<think>", "</think>", "<tool_call>", "</tool_call>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>"}) {
      const std::vector<int32_t> ids = model.encode(marker, false, true);
      if (ids.size() == 1) r.engine.keep_special.push_back(ids[0]);
    }
  }
  if (r.engine.prompt.empty()) bad_value(prompt_key, "the prompt is empty");
  const size_t n_prompt = r.engine.prompt.size();
  if (n_prompt >= n_ctx)
    throw ApiError(400,
                   "This model's maximum context length is " + std::to_string(n_ctx) + " tokens, but the prompt has " +
                       std::to_string(n_prompt) + " tokens, which leaves no room for a completion",
                   prompt_key, "context_length_exceeded");
  // More than the context leaves is lowered to what it leaves (OpenAI refuses it instead; the response's usage and
  // finish_reason "length" say where it ended).
  const int64_t room = int64_t(n_ctx) - int64_t(n_prompt);
  r.engine.max_tokens = uint32_t(std::min(max_tokens.value_or(room), room));
  return r;
}

// ---- responses

ReplyParser::ReplyParser(const ReplyFormat& format) : format_(format) {
  if (format.harmony) {
    harmony_.emplace();
    return;
  }
  if (format.split_reasoning) reasoning_.emplace(format.thinking_open);
  if (format.tool_calls) tools_.emplace();
}

ReasoningSplitter::Parts ReplyParser::push(std::string_view text) {
  ReasoningSplitter::Parts p;
  if (harmony_) {
    p = harmony_->push(text);
    if (!format_.split_reasoning) p = {"", p.reasoning + p.content};
    return p;
  }
  p = reasoning_ ? reasoning_->push(text) : ReasoningSplitter::Parts{"", std::string(text)};
  if (tools_) p.content = tools_->push(p.content);
  return p;
}

std::pair<ReasoningSplitter::Parts, std::vector<ToolCall>> ReplyParser::finish() {
  if (harmony_) {
    HarmonyStream::End e = harmony_->finish();
    if (!format_.split_reasoning) e.rest = {"", e.rest.reasoning + e.rest.content};
    if (!format_.tool_calls) e.tool_calls.clear();
    return {std::move(e.rest), std::move(e.tool_calls)};
  }
  ReasoningSplitter::Parts rest = reasoning_ ? reasoning_->flush() : ReasoningSplitter::Parts{};
  std::vector<ToolCall> calls;
  if (tools_) {  // the content held back from a tool-call marker on: the calls, else content after all
    rest.content = tools_->push(rest.content);
    ParsedReply p = tools_->finish();
    rest.content += p.content;
    calls = std::move(p.tool_calls);
  }
  return {std::move(rest), std::move(calls)};
}

ResponseWriter::ResponseWriter(Endpoint endpoint, const Model& model, std::string model_name, bool logprobs,
                               ReplyFormat format)
    : endpoint_(endpoint),
      model_(model),
      model_name_(std::move(model_name)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
                   .count()),
      logprobs_(logprobs),
      format_(endpoint == Endpoint::Chat ? format : ReplyFormat{}),
      parser_(format_) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char hex[25];
  std::snprintf(hex, sizeof hex, "%016llx%08llx", (unsigned long long)rng(), (unsigned long long)(rng() >> 32));
  id_ = (endpoint == Endpoint::Chat ? "chatcmpl-" : "cmpl-") + std::string(hex);
}

json ResponseWriter::envelope(const char* object) const {
  return {{"id", id_}, {"object", object}, {"created", created_}, {"model", model_name_}};
}

std::string ResponseWriter::token_text(int32_t id) const { return model_.decode(std::span(&id, 1), false); }

json ResponseWriter::chat_logprobs(const std::vector<TokenLogprobs>& tokens) const {
  auto entry = [&](int32_t id, float logprob) {
    const std::string text = token_text(id);
    return json{{"token", text}, {"logprob", logprob}, {"bytes", std::vector<uint8_t>(text.begin(), text.end())}};
  };
  json content = json::array();
  for (const TokenLogprobs& t : tokens) {
    json e = entry(t.id, t.logprob);
    json top = json::array();
    for (const TokenLogprob& alt : t.top) top.push_back(entry(alt.id, alt.logprob));
    e["top_logprobs"] = std::move(top);
    content.push_back(std::move(e));
  }
  return {{"content", std::move(content)}};
}

json ResponseWriter::completion_logprobs(const std::vector<TokenLogprobs>& tokens, size_t offset) const {
  json out = {{"tokens", json::array()},
              {"token_logprobs", json::array()},
              {"top_logprobs", json::array()},
              {"text_offset", json::array()}};
  for (const TokenLogprobs& t : tokens) {
    const std::string text = token_text(t.id);
    out["tokens"].push_back(text);
    out["token_logprobs"].push_back(t.logprob);
    json top = json::object();
    for (const TokenLogprob& alt : t.top) top[token_text(alt.id)] = alt.logprob;
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(offset);
    offset += text.size();
  }
  return out;
}

json ResponseWriter::chunk(const std::string& text, const std::vector<TokenLogprobs>& tokens) {
  json choice = {{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
  json out;
  if (endpoint_ == Endpoint::Chat) {
    out = envelope("chat.completion.chunk");
    json d = delta(parser_.push(text));
    if (!role_sent_) d["role"] = "assistant";
    role_sent_ = true;
    choice["delta"] = std::move(d);
    if (logprobs_ && !tokens.empty()) choice["logprobs"] = chat_logprobs(tokens);
  } else {
    out = envelope("text_completion");
    choice["text"] = text;
    if (logprobs_ && !tokens.empty()) choice["logprobs"] = completion_logprobs(tokens, text_sent_);
  }
  text_sent_ += text.size();
  out["choices"] = json::array({std::move(choice)});
  return out;
}

// The delta of a chunk: content (always, as without the split, unless the chunk is reasoning alone) and
// reasoning_content where there is some.
json ResponseWriter::delta(const ReasoningSplitter::Parts& parts) const {
  json d = json::object();
  if (!parts.content.empty() || parts.reasoning.empty()) d["content"] = parts.content;
  if (!parts.reasoning.empty()) d["reasoning_content"] = parts.reasoning;
  return d;
}

json ResponseWriter::tool_calls_json(const std::vector<ToolCall>& calls, bool stream) const {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", id_ + "-call-" + std::to_string(i)},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (stream) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

json ResponseWriter::final_chunk(const std::string& text, const std::vector<TokenLogprobs>& tokens, const Finish& f) {
  json out = chunk(text, tokens);
  json& d = out["choices"][0]["delta"];
  std::string reason = f.reason;
  if (endpoint_ == Endpoint::Chat) {  // what the parser still held, and the calls
    const auto [rest, calls] = parser_.finish();
    if (!rest.content.empty()) d["content"] = d.value("content", "") + rest.content;
    if (!rest.reasoning.empty()) d["reasoning_content"] = d.value("reasoning_content", "") + rest.reasoning;
    if (!calls.empty()) {
      d["tool_calls"] = tool_calls_json(calls, true);
      reason = "tool_calls";
    }
  }
  out["choices"][0]["finish_reason"] = reason;
  return out;
}

static json usage(const Finish& f) {
  return {{"prompt_tokens", f.prompt_tokens},
          {"completion_tokens", f.completion_tokens},
          {"total_tokens", f.prompt_tokens + f.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", f.cached_tokens}}}};
}

json ResponseWriter::usage_chunk(const Finish& f) const {
  json out = envelope(endpoint_ == Endpoint::Chat ? "chat.completion.chunk" : "text_completion");
  out["choices"] = json::array();
  out["usage"] = usage(f);
  return out;
}

json ResponseWriter::whole(const std::string& text, const std::vector<TokenLogprobs>& tokens, const Finish& f) const {
  json choice = {{"index", 0}, {"finish_reason", f.reason}, {"logprobs", nullptr}};
  json out;
  if (endpoint_ == Endpoint::Chat) {
    out = envelope("chat.completion");
    // Read as the stream reads it, so that both give the same reasoning, content and calls.
    ReplyParser parser(format_);
    ReasoningSplitter::Parts parts = parser.push(text);
    const auto [rest, calls] = parser.finish();
    const std::string content = parts.content + rest.content, reasoning = parts.reasoning + rest.reasoning;
    choice["message"] = {{"role", "assistant"}, {"content", content}};
    if (!reasoning.empty()) choice["message"]["reasoning_content"] = reasoning;
    if (!calls.empty()) {
      if (content.empty()) choice["message"]["content"] = nullptr;
      choice["message"]["tool_calls"] = tool_calls_json(calls, false);
      choice["finish_reason"] = "tool_calls";
    }
    if (logprobs_) choice["logprobs"] = chat_logprobs(tokens);
  } else {
    out = envelope("text_completion");
    choice["text"] = text;
    if (logprobs_) choice["logprobs"] = completion_logprobs(tokens, 0);
  }
  out["choices"] = json::array({std::move(choice)});
  out["usage"] = usage(f);
  return out;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string sse(const json& j) { return "data: " + dump(j) + "\n\n"; }

}  // namespace wgllm::server
