// A model's own chat template through the Jinja interpreter (src/jinja/), and ChatFormat, which picks it or a
// built-in family (chat.h).
//
// Where the contents sit: the template is rendered a second time with every message content (a string, or a text
// part's text) replaced by a sentinel, U+E000 <index> U+E001. What lies between the sentinels there is the
// template's own text; walking the real rendering through those pieces gives each content's exact place, whether the
// template wrote it as is, trimmed, or changed (a gap between two known pieces is content). When the two renderings
// do not line up (a template that branches on what a content holds), each content is looked for in order instead.
#include <algorithm>
#include <stdexcept>

#include "tokenizer/chat.h"
#include "wgllm/error.h"

namespace wgllm {

namespace {

using json = nlohmann::ordered_json;

constexpr std::string_view kOpen = "\xEE\x80\x80", kClose = "\xEE\x80\x81";  // U+E000, U+E001

std::string_view trim(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// Every content string of the messages (in order), optionally replaced in place by its sentinel.
void collect_contents(json& messages, std::vector<std::string>& contents, bool replace) {
  const auto take = [&](json& s) {
    if (!s.is_string() || s.get_ref<const std::string&>().empty()) return;  // nothing to keep as text
    contents.push_back(s.get<std::string>());
    if (replace) s = std::string(kOpen) + std::to_string(contents.size() - 1) + std::string(kClose);
  };
  if (!messages.is_array()) return;
  for (json& m : messages) {
    if (!m.is_object() || !m.contains("content")) continue;
    json& c = m["content"];
    if (c.is_array()) {
      for (json& part : c)
        if (part.is_object() && part.contains("text")) take(part["text"]);
    } else {
      take(c);
    }
  }
}

jinja::Value variables_unchecked(const ChatInput& in, const json& messages, std::string_view bos,
                                 std::string_view eos) {
  jinja::Value vars = jinja::Value::object();
  jinja::Object& o = vars.obj();
  o.set("messages", jinja::Value::from_json(messages));
  o.set("tools", jinja::Value::from_json(in.tools));
  o.set("documents", jinja::Value::none());
  o.set("add_generation_prompt", jinja::Value(in.add_generation_prompt));
  o.set("bos_token", jinja::Value(bos));
  o.set("eos_token", jinja::Value(eos));
  if (in.variables.is_object())
    for (const auto& [k, v] : in.variables.items()) o.set(k, jinja::Value::from_json(v));
  return vars;
}

// Throws InvalidArgument for JSON nested past what a Value holds.
jinja::Value variables(const ChatInput& in, const json& messages, std::string_view bos, std::string_view eos) {
  try {
    return variables_unchecked(in, messages, bos, eos);
  } catch (const std::invalid_argument& e) {
    throw InvalidArgument(std::string("chat: ") + e.what());
  }
}

std::string render(const jinja::Template& tmpl, const jinja::Value& vars, const std::optional<std::tm>& now) {
  return now ? tmpl.render(vars, *now) : tmpl.render(vars);
}

// The content ranges of `text` from its sentinel rendering, or nullopt where the two do not line up.
std::optional<std::vector<TextRange>> align(const std::string& text, const std::string& marked,
                                            const std::vector<std::string>& contents) {
  // marked = piece[0] S(idx[0]) piece[1] S(idx[1]) ... piece[n]
  std::vector<std::string_view> pieces;
  std::vector<size_t> idx;
  size_t pos = 0;
  while (true) {
    const size_t open = marked.find(kOpen, pos);
    if (open == std::string::npos) break;
    const size_t close = marked.find(kClose, open);
    if (close == std::string::npos) return std::nullopt;
    const std::string digits = marked.substr(open + kOpen.size(), close - open - kOpen.size());
    if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    const size_t k = std::stoul(digits);
    if (k >= contents.size()) return std::nullopt;
    pieces.push_back(std::string_view(marked).substr(pos, open - pos));
    idx.push_back(k);
    pos = close + kClose.size();
  }
  pieces.push_back(std::string_view(marked).substr(pos));
  std::vector<TextRange> ranges;
  std::string_view t(text);
  if (!t.starts_with(pieces[0])) return std::nullopt;
  size_t p = pieces[0].size();
  for (size_t j = 0; j < idx.size(); ++j) {
    const std::string_view next = pieces[j + 1];
    const bool last = j + 1 == idx.size();
    const std::string& c = contents[idx[j]];
    size_t len = std::string::npos;
    for (std::string_view cand : {std::string_view(c), trim(c)}) {
      if (t.substr(p).starts_with(cand) &&
          (last ? t.substr(p + cand.size()) == next : t.substr(p + cand.size()).starts_with(next))) {
        len = cand.size();
        break;
      }
    }
    if (len == std::string::npos) {  // the template changed the content: it is what lies before the next piece
      if (last) {
        if (!t.ends_with(next) || t.size() - next.size() < p) return std::nullopt;
        len = t.size() - next.size() - p;
      } else {
        if (next.empty()) return std::nullopt;
        const size_t at = t.find(next, p);
        if (at == std::string_view::npos) return std::nullopt;
        len = at - p;
      }
    }
    if (len > 0) ranges.push_back({p, p + len});
    p += len + next.size();
  }
  if (p != t.size()) return std::nullopt;
  return ranges;
}

// Each content looked for in order (as given, else trimmed), from where the last one ended.
std::vector<TextRange> search(const std::string& text, const std::vector<std::string>& contents) {
  std::vector<TextRange> ranges;
  size_t cursor = 0;
  for (const std::string& c : contents) {
    for (std::string_view cand : {std::string_view(c), trim(c)}) {
      if (cand.empty()) break;
      const size_t at = text.find(cand, cursor);
      if (at == std::string::npos) continue;
      ranges.push_back({at, at + cand.size()});
      cursor = at + cand.size();
      break;
    }
  }
  return ranges;
}

// The messages as a built-in family takes them: roles system, user, assistant ("developer" is "system"), text.
std::vector<ChatMessage> plain_messages(const json& messages) {
  std::vector<ChatMessage> out;
  if (!messages.is_array()) throw InvalidArgument("chat: messages must be an array");
  for (const json& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      throw InvalidArgument("chat: every message needs a string 'role'");
    std::string role = m["role"].get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant")
      throw InvalidArgument("chat: role '" + role + "' is not one of system, user, assistant");
    std::string content;
    if (m.contains("content")) {
      const json& c = m["content"];
      if (c.is_string())
        content = c.get<std::string>();
      else if (c.is_array())
        for (const json& part : c)
          if (part.is_object() && part.contains("text") && part["text"].is_string()) content += part["text"];
    }
    out.push_back({std::move(role), std::move(content)});
  }
  if (out.empty()) throw InvalidArgument("chat: no messages");
  return out;
}

}  // namespace

ChatPrompt render_jinja_chat(const jinja::Template& tmpl, const ChatInput& in, std::string_view bos_text,
                             std::string_view eos_text) {
  ChatPrompt p;
  try {
    p.text = render(tmpl, variables(in, in.messages, bos_text, eos_text), in.now);
  } catch (const jinja::TemplateError& e) {
    throw Error(std::string("chat template: ") + e.what());
  }
  std::vector<std::string> contents;
  json marked_messages = in.messages;
  collect_contents(marked_messages, contents, true);
  if (contents.empty()) return p;
  std::optional<std::vector<TextRange>> ranges;
  try {
    ranges = align(p.text, render(tmpl, variables(in, marked_messages, bos_text, eos_text), in.now), contents);
  } catch (const std::exception&) {
    // a template that refuses the sentinels: look for the contents instead
  }
  p.content = ranges ? std::move(*ranges) : search(p.text, contents);
  return p;
}

struct ChatFormat::Impl {
  std::unique_ptr<jinja::Template> tmpl;
  std::string parse_error;
  std::optional<ChatFamily> family;
  std::string arch;
};

ChatFormat::ChatFormat(std::string_view jinja, std::string_view arch) : impl_(std::make_unique<Impl>()) {
  impl_->arch = arch;
  if (jinja.empty()) {
    impl_->family = builtin_chat_family(arch);
    return;
  }
  try {
    impl_->tmpl = std::make_unique<jinja::Template>(jinja);
  } catch (const jinja::TemplateError& e) {
    impl_->parse_error = std::string("chat template: ") + e.what();
  }
}

ChatFormat::~ChatFormat() = default;
ChatFormat::ChatFormat(ChatFormat&&) noexcept = default;
ChatFormat& ChatFormat::operator=(ChatFormat&&) noexcept = default;

bool ChatFormat::has_template() const { return impl_->tmpl || !impl_->parse_error.empty(); }

ChatPrompt ChatFormat::render(const ChatInput& in, std::string_view bos_text, std::string_view eos_text,
                              bool chatml_fallback) const {
  if (!impl_->parse_error.empty()) throw Error(impl_->parse_error);
  if (impl_->tmpl) return render_jinja_chat(*impl_->tmpl, in, bos_text, eos_text);
  std::optional<ChatFamily> family = impl_->family;
  if (!family && chatml_fallback) family = ChatFamily::ChatML;
  if (!family)
    throw Error("the model has no chat template (tokenizer.chat_template) and architecture '" + impl_->arch +
                "' has no default one");
  const std::vector<ChatMessage> msgs = plain_messages(in.messages);
  return render_chat(*family, msgs, in.add_generation_prompt, bos_text, eos_text);
}

std::string bos_text(const Tokenizer& tok) { return tok.bos() >= 0 ? tok.token_text(tok.bos()) : ""; }
std::string eos_text(const Tokenizer& tok) { return tok.eos() >= 0 ? tok.token_text(tok.eos()) : ""; }

ChatPrompt render_user_turn(const ChatFormat& format, const Tokenizer& tok, std::string_view user,
                            std::string_view system) {
  ChatInput in;
  if (!system.empty()) in.messages.push_back({{"role", "system"}, {"content", std::string(system)}});
  in.messages.push_back({{"role", "user"}, {"content", std::string(user)}});
  return format.render(in, bos_text(tok), eos_text(tok), false);
}

}  // namespace wgllm
