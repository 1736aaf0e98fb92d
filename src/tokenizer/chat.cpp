// Chat prompts (see chat.h): the built-in families, each following its Jinja template line by line. The Jinja
// path is in chat_jinja.cpp.
#include "tokenizer/chat.h"

#include "wgllm/error.h"

namespace wgllm {

std::optional<ChatFamily> builtin_chat_family(std::string_view arch) {
  if (arch == "gemma" || arch == "gemma2" || arch == "gemma3") return ChatFamily::Gemma;
  return std::nullopt;
}

namespace {

// Appends the template's markers and the messages' contents, noting where contents go.
struct Builder {
  ChatPrompt p;
  Builder& markup(std::string_view s) {
    p.text += s;
    return *this;
  }
  Builder& content(std::string_view s) {
    if (!s.empty()) p.content.push_back({p.text.size(), p.text.size() + s.size()});
    p.text += s;
    return *this;
  }
};

// Jinja's `trim` / Python's str.strip(): surrounding whitespace removed.
std::string_view strip(std::string_view s) {
  constexpr std::string_view ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// {% for message in messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'
// + message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}
// {% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}
// {{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}
ChatPrompt llama3(std::span<const ChatMessage> msgs, bool gen, std::string_view bos) {
  Builder out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (i == 0) out.markup(bos);
    out.markup("<|start_header_id|>").markup(msgs[i].role).markup("<|end_header_id|>\n\n");
    out.content(strip(msgs[i].content)).markup("<|eot_id|>");
  }
  if (gen) out.markup("<|start_header_id|>assistant<|end_header_id|>\n\n");
  return out.p;
}

// {% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' +
// '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
ChatPrompt chatml(std::span<const ChatMessage> msgs, bool gen) {
  Builder out;
  for (const ChatMessage& m : msgs)
    out.markup("<|im_start|>").markup(m.role).markup("\n").content(m.content).markup("<|im_end|>\n");
  if (gen) out.markup("<|im_start|>assistant\n");
  return out.p;
}

// Llama 2 chat: a first system message becomes '<<SYS>>\n' + system + '\n<</SYS>>\n\n' in front of the first
// turn's content; user turns: bos + '[INST] ' + content.strip() + ' [/INST]'; assistant turns:
// ' ' + content.strip() + ' ' + eos. Roles must alternate starting with user.
ChatPrompt llama2(std::span<const ChatMessage> msgs, std::string_view bos, std::string_view eos) {
  std::string system;
  bool has_system = false;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    has_system = true;
    msgs = msgs.subspan(1);
  }
  Builder out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if ((m.role == "user") != (i % 2 == 0))
      throw InvalidArgument("chat messages: roles must alternate user/assistant/user/assistant/... (message " +
                            std::to_string(i + has_system) + " is '" + m.role + "')");
    std::string content = (i == 0 && has_system) ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + m.content : m.content;
    if (m.role == "user") {
      out.markup(bos).markup("[INST] ").content(strip(content)).markup(" [/INST]");
    } else if (m.role == "assistant") {
      out.markup(" ").content(strip(content)).markup(" ").markup(eos);
    }
  }
  return out.p;
}

// llama.cpp's gemma template (llm_chat_apply_template), with the BOS the Jinja template starts with:
// '<start_of_turn>' + role + '\n' + content | trim + '<end_of_turn>\n' per message, "assistant" named "model",
// system contents joined in front of the next user content; '<start_of_turn>model\n' to generate.
ChatPrompt gemma(std::span<const ChatMessage> msgs, bool gen, std::string_view bos) {
  Builder out;
  out.markup(bos);
  std::string system;
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") {
      system += strip(m.content);
      continue;
    }
    const bool model = m.role == "assistant" || m.role == "model";
    out.markup("<start_of_turn>").markup(model ? "model" : m.role).markup("\n");
    if (!system.empty() && !model) {
      out.content(system).markup("\n\n");
      system.clear();
    }
    out.content(strip(m.content)).markup("<end_of_turn>\n");
  }
  if (gen) out.markup("<start_of_turn>model\n");
  return out.p;
}

}  // namespace

std::string apply_chat_template(ChatFamily family, std::span<const ChatMessage> messages, bool add_generation_prompt,
                                std::string_view bos_text, std::string_view eos_text) {
  return render_chat(family, messages, add_generation_prompt, bos_text, eos_text).text;
}

ChatPrompt render_chat(ChatFamily family, std::span<const ChatMessage> messages, bool add_generation_prompt,
                       std::string_view bos_text, std::string_view eos_text) {
  switch (family) {
    case ChatFamily::Llama3: return llama3(messages, add_generation_prompt, bos_text);
    case ChatFamily::ChatML: return chatml(messages, add_generation_prompt);
    case ChatFamily::Llama2: return llama2(messages, bos_text, eos_text);
    case ChatFamily::Gemma: return gemma(messages, add_generation_prompt, bos_text);
  }
  throw InvalidArgument("unknown ChatFamily value");
}

}  // namespace wgllm
