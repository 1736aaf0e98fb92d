// wgllm/chat.h: tool calls in a model's reply (parse_tool_calls) and their hold-back while it streams
// (ToolCallStream).
#include <nlohmann/json.hpp>

#include <cctype>

#include "wgllm/chat.h"

namespace wgllm {

namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kSpaces = " \t\n\r";
constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kMistral = "[TOOL_CALLS]", kMistralArgs = "[ARGS]", kPythonTag = "<|python_tag|>";
constexpr std::string_view kLfmOpen = "<|tool_call_start|>", kLfmClose = "<|tool_call_end|>";
constexpr std::string_view kMarkers[] = {kHermesOpen, kMistral, kPythonTag, kLfmOpen};

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(kSpaces);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpaces) - b + 1);
}

struct Unparsable {};

// {"name": ..., "arguments" or "parameters": an object or a JSON string}.
ToolCall call_from(const json& j) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) throw Unparsable{};
  const json* args = j.contains("arguments") ? &j["arguments"] : j.contains("parameters") ? &j["parameters"] : nullptr;
  if (!args) return {j["name"].get<std::string>(), "{}"};
  if (args->is_string()) return {j["name"].get<std::string>(), args->get<std::string>()};
  if (!args->is_object()) throw Unparsable{};
  return {j["name"].get<std::string>(), args->dump()};
}

json parse_json(std::string_view s) {
  json j = json::parse(s, nullptr, false);
  if (j.is_discarded()) throw Unparsable{};
  return j;
}

// The end of the JSON object or array that starts s (strings and escapes skipped), or npos.
size_t json_end(std::string_view s) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      return i + 1;
    }
  }
  return std::string_view::npos;
}

ParsedReply hermes(std::string_view reply) {
  ParsedReply out;
  size_t pos = 0;
  for (size_t open; (open = reply.find(kHermesOpen, pos)) != std::string_view::npos;) {
    out.content += reply.substr(pos, open - pos);
    const size_t body = open + kHermesOpen.size();
    const size_t close = reply.find(kHermesClose, body);
    out.tool_calls.push_back(
        call_from(parse_json(reply.substr(body, close == std::string_view::npos ? close : close - body))));
    pos = close == std::string_view::npos ? reply.size() : close + kHermesClose.size();
  }
  out.content += reply.substr(pos);
  out.content = std::string(trim(out.content));
  return out;
}

ParsedReply mistral(std::string_view reply, size_t at) {
  ParsedReply out{std::string(trim(reply.substr(0, at))), {}};
  std::string_view rest = trim(reply.substr(at + kMistral.size()));
  if (rest.starts_with("[")) {  // [TOOL_CALLS][{"name": ..., "arguments": ...}, ...]
    const json calls = parse_json(rest);
    if (!calls.is_array() || calls.empty()) throw Unparsable{};
    for (const json& c : calls) out.tool_calls.push_back(call_from(c));
    return out;
  }
  while (!rest.empty()) {  // [TOOL_CALLS]name[ARGS]{...} (repeated, each after its own [TOOL_CALLS])
    const size_t args = rest.find(kMistralArgs);
    if (args == std::string_view::npos) throw Unparsable{};
    const std::string name(trim(rest.substr(0, args)));
    rest = trim(rest.substr(args + kMistralArgs.size()));
    const size_t end = json_end(rest);
    if (name.empty() || end == std::string_view::npos) throw Unparsable{};
    const json a = parse_json(rest.substr(0, end));
    if (!a.is_object()) throw Unparsable{};
    out.tool_calls.push_back({name, a.dump()});
    rest = trim(rest.substr(end));
    if (rest.starts_with(kMistral))
      rest = trim(rest.substr(kMistral.size()));
    else if (!rest.empty())
      throw Unparsable{};
  }
  return out;
}

// Python literals as LFM2 writes call arguments: strings ('' or ""), numbers, True / False / None, lists, dicts.
class PythonLiteral {
 public:
  explicit PythonLiteral(std::string_view s) : s_(s) {}

  json value() {
    skip();
    if (i_ >= s_.size()) throw Unparsable{};
    const char c = s_[i_];
    if (c == '"' || c == '\'') return json(string());
    if (c == '[' || c == '(') {
      const char close = c == '[' ? ']' : ')';
      ++i_;
      json a = json::array();
      while (!eat(close)) {
        if (!a.empty() && !eat(',')) throw Unparsable{};
        if (eat(close)) break;
        a.push_back(value());
      }
      return a;
    }
    if (c == '{') {
      ++i_;
      json o = json::object();
      while (!eat('}')) {
        if (!o.empty() && !eat(',')) throw Unparsable{};
        if (eat('}')) break;
        const json k = value();
        if (!k.is_string() || !eat(':')) throw Unparsable{};
        o[k.get<std::string>()] = value();
      }
      return o;
    }
    const size_t b = i_;
    while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '.' || s_[i_] == '-' ||
                              s_[i_] == '+' || s_[i_] == '_'))
      ++i_;
    const std::string word(s_.substr(b, i_ - b));
    if (word == "True" || word == "true") return true;
    if (word == "False" || word == "false") return false;
    if (word == "None" || word == "null") return nullptr;
    const json n = json::parse(word, nullptr, false);
    if (n.is_discarded() || !n.is_number()) throw Unparsable{};
    return n;
  }

  // name(arg=value, ...)
  ToolCall call() {
    skip();
    const size_t b = i_;
    while (i_ < s_.size() &&
           (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_' || s_[i_] == '.' || s_[i_] == '-'))
      ++i_;
    const std::string name(s_.substr(b, i_ - b));
    if (name.empty() || !eat('(')) throw Unparsable{};
    json args = json::object();
    while (!eat(')')) {
      if (!args.empty() && !eat(',')) throw Unparsable{};
      if (eat(')')) break;
      skip();
      const size_t k = i_;
      while (i_ < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[i_])) || s_[i_] == '_')) ++i_;
      const std::string key(s_.substr(k, i_ - k));
      if (key.empty() || !eat('=')) throw Unparsable{};
      args[key] = value();
    }
    return {name, args.dump()};
  }

  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  bool at_end() {
    skip();
    return i_ == s_.size();
  }

 private:
  void skip() {
    while (i_ < s_.size() && kSpaces.find(s_[i_]) != std::string_view::npos) ++i_;
  }
  std::string string() {
    const char q = s_[i_++];
    std::string out;
    while (i_ < s_.size() && s_[i_] != q) {
      char c = s_[i_++];
      if (c == '\\' && i_ < s_.size()) {
        c = s_[i_++];
        if (c == 'n')
          c = '\n';
        else if (c == 't')
          c = '\t';
        else if (c == 'r')
          c = '\r';
      }
      out += c;
    }
    if (i_ >= s_.size()) throw Unparsable{};
    ++i_;
    return out;
  }

  std::string_view s_;
  size_t i_ = 0;
};

// LFM2: <|tool_call_start|>[name(arg=value, ...), ...]<|tool_call_end|>, text around it.
ParsedReply lfm2(std::string_view reply, size_t at) {
  const size_t body = at + kLfmOpen.size();
  const size_t close = reply.find(kLfmClose, body);
  std::string_view inner = trim(reply.substr(body, close == std::string_view::npos ? close : close - body));
  ParsedReply out;
  out.content =
      std::string(trim(std::string(reply.substr(0, at)) +
                       std::string(close == std::string_view::npos ? "" : reply.substr(close + kLfmClose.size()))));
  PythonLiteral p(inner);
  if (!p.eat('[')) throw Unparsable{};
  while (!p.eat(']')) {
    if (!out.tool_calls.empty() && !p.eat(',')) throw Unparsable{};
    out.tool_calls.push_back(p.call());
  }
  if (!p.at_end() || out.tool_calls.empty()) throw Unparsable{};
  return out;
}

}  // namespace

ParsedReply parse_tool_calls(std::string_view reply) {
  try {
    if (const size_t at = reply.find(kLfmOpen); at != std::string_view::npos) return lfm2(reply, at);
    if (reply.find(kHermesOpen) != std::string_view::npos) return hermes(reply);
    if (const size_t at = reply.find(kMistral); at != std::string_view::npos) return mistral(reply, at);
    std::string_view t = trim(reply);
    if (t.starts_with(kPythonTag)) t = trim(t.substr(kPythonTag.size()));
    if (t.starts_with("{") && t.ends_with("}")) {  // Llama 3.x: the whole reply is the call
      const json j = parse_json(t);
      if (j.contains("parameters") || j.contains("arguments")) return {"", {call_from(j)}};
    }
  } catch (const Unparsable&) {
  } catch (const json::exception&) {
  }
  return {std::string(reply), {}};
}

std::string ToolCallStream::push(std::string_view text) {
  held_ += text;
  if (holding_) return "";
  if (!started_) {  // a reply that opens with '{' may be a Llama 3.x call as a whole
    const size_t b = held_.find_first_not_of(kSpaces);
    if (b == std::string::npos) return "";
    if (held_[b] == '{') {
      holding_ = true;
      return "";
    }
  }
  size_t first = std::string::npos;
  for (std::string_view m : kMarkers) first = std::min(first, held_.find(m));
  size_t keep = 0;  // a marker's beginning at the end waits for the next piece
  if (first == std::string::npos) {
    for (std::string_view m : kMarkers)
      for (size_t n = std::min(held_.size(), m.size() - 1); n > keep; --n)
        if (m.starts_with(std::string_view(held_).substr(held_.size() - n))) {
          keep = n;
          break;
        }
  } else {
    holding_ = true;
    keep = held_.size() - first;
  }
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  started_ = started_ || !out.empty();
  return out;
}

ParsedReply ToolCallStream::finish() {
  ParsedReply p = holding_ ? parse_tool_calls(held_) : ParsedReply{held_, {}};
  if (p.tool_calls.empty()) p.content = held_;  // what was held is content after all
  held_.clear();
  return p;
}

// ---- HarmonyStream

namespace {

constexpr std::string_view kChannel = "<|channel|>", kMessage = "<|message|>", kStart = "<|start|>";
constexpr std::string_view kBodyEnds[] = {"<|end|>", "<|call|>", "<|return|>", kStart};

// The value after `key` in a harmony header, up to a space or a marker.
std::string header_field(std::string_view header, std::string_view key) {
  const size_t at = header.rfind(key);
  if (at == std::string_view::npos) return {};
  std::string_view v = header.substr(at + key.size());
  return std::string(v.substr(0, std::min(v.find(' '), v.find("<|"))));
}

}  // namespace

void HarmonyStream::emit(ReasoningSplitter::Parts& out, std::string_view body) {
  if (kind_ == Kind::Reasoning)
    out.reasoning += body;
  else if (kind_ == Kind::Content)
    out.content += body;
  else
    call_args_ += body;
}

void HarmonyStream::end_call(ReasoningSplitter::Parts& out) {
  if (kind_ != Kind::Call) return;
  const std::string args(trim(call_args_));
  const json j = json::parse(args, nullptr, false);
  if (!j.is_discarded() && j.is_object())
    calls_.push_back({call_name_, j.dump()});
  else
    out.content += call_args_;  // arguments that do not parse stay content
  call_args_.clear();
  kind_ = Kind::Content;
}

ReasoningSplitter::Parts HarmonyStream::push(std::string_view text) {
  held_ += text;
  ReasoningSplitter::Parts out;
  while (true) {
    switch (state_) {
      case State::Start: {
        const size_t b = held_.find_first_not_of(kSpaces);
        if (b == std::string::npos) return out;
        const std::string_view rest = std::string_view(held_).substr(b);
        if (rest.starts_with(kChannel) || rest.starts_with(kStart)) {
          state_ = State::Header;
          continue;
        }
        if (kChannel.starts_with(rest) || kStart.starts_with(rest)) return out;
        state_ = State::Plain;
        continue;
      }
      case State::Plain:
        out.content += held_;
        held_.clear();
        return out;
      case State::Header: {
        const size_t m = held_.find(kMessage);
        if (m == std::string::npos) return out;
        const std::string_view header = std::string_view(held_).substr(0, m);
        const std::string channel = header_field(header, kChannel), to = header_field(header, "to=");
        if (to.starts_with("functions.")) {
          kind_ = Kind::Call;
          call_name_ = to.substr(std::string_view("functions.").size());
        } else {
          kind_ = channel == "analysis" ? Kind::Reasoning : Kind::Content;
        }
        held_.erase(0, m + kMessage.size());
        state_ = State::Body;
        continue;
      }
      case State::Body: {
        size_t end = std::string::npos, len = 0;
        for (std::string_view e : kBodyEnds)
          if (const size_t at = held_.find(e); at < end) end = at, len = e == kStart ? 0 : e.size();
        if (end == std::string::npos) {  // all but a marker's possible beginning
          size_t keep = 0;
          if (const size_t lt = held_.rfind("<|"); lt != std::string::npos && held_.find("|>", lt) == std::string::npos)
            keep = held_.size() - lt;
          else if (held_.ends_with("<"))
            keep = 1;
          emit(out, std::string_view(held_).substr(0, held_.size() - keep));
          held_.erase(0, held_.size() - keep);
          return out;
        }
        emit(out, std::string_view(held_).substr(0, end));
        held_.erase(0, end + len);
        end_call(out);
        state_ = State::Header;
        continue;
      }
    }
  }
}

HarmonyStream::End HarmonyStream::finish() {
  End e;
  if (state_ == State::Body) {
    emit(e.rest, held_);
    end_call(e.rest);
  } else if (state_ != State::Header) {
    e.rest.content = held_;  // a reply that never opened a channel
  }
  held_.clear();
  e.tool_calls = std::move(calls_);
  return e;
}

bool prompt_expects_harmony(std::string_view prompt) {
  const size_t e = prompt.find_last_not_of(kSpaces);
  return e != std::string_view::npos && prompt.substr(0, e + 1).ends_with("<|start|>assistant");
}

}  // namespace wgllm
