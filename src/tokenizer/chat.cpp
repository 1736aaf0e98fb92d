// Chat templates (see chat.h). Each renderer follows its Jinja template line by line.
#include "tokenizer/chat.h"

#include "wgllm/error.h"

namespace wgllm {

ChatTemplate detect_chat_template(std::string_view jinja) {
  if (jinja.find("<|start_header_id|>") != std::string_view::npos) return ChatTemplate::Llama3;
  if (jinja.find("<|im_start|>") != std::string_view::npos) return ChatTemplate::ChatML;
  if (jinja.find("[INST]") != std::string_view::npos) return ChatTemplate::Llama2;
  throw Error("unknown chat template (supported: llama3, chatml, llama2/mistral [INST])");
}

namespace {

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
std::string llama3(std::span<const ChatMessage> msgs, bool gen, std::string_view bos) {
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    if (i == 0) out += bos;
    out += "<|start_header_id|>";
    out += msgs[i].role;
    out += "<|end_header_id|>\n\n";
    out += strip(msgs[i].content);
    out += "<|eot_id|>";
  }
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// {% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' +
// '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}
std::string chatml(std::span<const ChatMessage> msgs, bool gen) {
  std::string out;
  for (const ChatMessage& m : msgs) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

// Llama 2 chat: a first system message becomes '<<SYS>>\n' + system + '\n<</SYS>>\n\n' in front of the first
// turn's content; user turns: bos + '[INST] ' + content.strip() + ' [/INST]'; assistant turns:
// ' ' + content.strip() + ' ' + eos. Roles must alternate starting with user.
std::string llama2(std::span<const ChatMessage> msgs, std::string_view bos, std::string_view eos) {
  std::string system;
  bool has_system = false;
  if (!msgs.empty() && msgs[0].role == "system") {
    system = msgs[0].content;
    has_system = true;
    msgs = msgs.subspan(1);
  }
  std::string out;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const ChatMessage& m = msgs[i];
    if ((m.role == "user") != (i % 2 == 0))
      throw InvalidArgument("chat messages: roles must alternate user/assistant/user/assistant/... (message " +
                            std::to_string(i + has_system) + " is '" + m.role + "')");
    std::string content = (i == 0 && has_system) ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + m.content : m.content;
    if (m.role == "user") {
      out += bos;
      out += "[INST] ";
      out += strip(content);
      out += " [/INST]";
    } else if (m.role == "assistant") {
      out += " ";
      out += strip(content);
      out += " ";
      out += eos;
    }
  }
  return out;
}

}  // namespace

std::string apply_chat_template(ChatTemplate tmpl, std::span<const ChatMessage> messages, bool add_generation_prompt,
                                std::string_view bos_text, std::string_view eos_text) {
  switch (tmpl) {
    case ChatTemplate::Llama3: return llama3(messages, add_generation_prompt, bos_text);
    case ChatTemplate::ChatML: return chatml(messages, add_generation_prompt);
    case ChatTemplate::Llama2: return llama2(messages, bos_text, eos_text);
  }
  throw InvalidArgument("unknown ChatTemplate value");
}

}  // namespace wgllm
