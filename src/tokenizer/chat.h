// Chat prompts: a model's own Jinja chat template rendered by src/jinja/, and four built-in families for files
// that carry none.
#pragma once
#include <ctime>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "jinja/template.h"
#include "tokenizer/tokenizer.h"

namespace wgllm {

// The built-in renderings, for files that carry no template of their own (tokenizer.chat_template).
enum class ChatFamily {
  Llama3,  // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> (Meta Llama 3 Instruct)
  ChatML,  // <|im_start|>role\ncontent<|im_end|>\n (Qwen, SmolLM, ...)
  Llama2,  // [INST] ... [/INST] with <<SYS>> (Llama 2 chat; Mistral-style [INST] templates)
  Gemma,   // <start_of_turn>role\ncontent<end_of_turn>\n (Gemma 1-3; "assistant" is "model")
};

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// The family a file without a template gets from its architecture (general.architecture): Gemma's for gemma,
// gemma2 and gemma3 files, whose GGUFs often carry none; nothing for the others.
std::optional<ChatFamily> builtin_chat_family(std::string_view arch);

// A rendered chat prompt and where the messages' contents sit in it. Encode it with add_special = false,
// parse_special = true and plain = content: the template's own markers become control tokens (BOS is part of the
// text), while a control token's text typed into a message stays text (a user cannot forge a turn).
struct ChatPrompt {
  std::string text;
  std::vector<TextRange> content;
};

// A built-in family's prompt; apply_chat_template gives its text alone.
// Llama3: bos_text before the first message, contents trimmed of surrounding whitespace.
// ChatML: no BOS, contents as given. Llama2: bos_text before every user turn, eos_text after every assistant
// turn, a leading system message folded into the first user turn, contents trimmed; roles must alternate
// user/assistant (InvalidArgument otherwise); add_generation_prompt changes nothing (the prompt ends in [/INST]).
// Gemma: bos_text first, contents trimmed, system messages (trimmed) put in front of the next user turn's content
// with a blank line between, as llama.cpp does (Gemma has no system role).
ChatPrompt render_chat(ChatFamily family, std::span<const ChatMessage> messages, bool add_generation_prompt,
                       std::string_view bos_text, std::string_view eos_text = "");

// What a chat template renders, as transformers' apply_chat_template hands it over: the template sees messages,
// tools (None when absent), documents (None), add_generation_prompt, bos_token, eos_token and the extra variables.
struct ChatInput {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools = nullptr;                               // an array, or null
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();  // chat_template_kwargs (enable_thinking, ...)
  bool add_generation_prompt = true;
  std::optional<std::tm> now;  // strftime_now's time; unset: the local time
};

// A model's chat format: its own Jinja template (tokenizer.chat_template, or one given instead), parsed once; a
// built-in family for a file without one. Rendering is the same for `run --chat`, `serve` and `wgllm template`.
class ChatFormat {
 public:
  // `jinja` empty: the file has no template (the family from builtin_chat_family(arch), if any). A template that
  // does not parse is kept as its error, thrown by render.
  ChatFormat(std::string_view jinja, std::string_view arch);
  ~ChatFormat();
  ChatFormat(ChatFormat&&) noexcept;
  ChatFormat& operator=(ChatFormat&&) noexcept;
  bool has_template() const;

  // The prompt and where the messages' contents sit in it (found as the template placed them; see chat.cpp).
  // chatml_fallback: with neither a template nor a family, ChatML (as llama.cpp's server does) instead of an Error.
  // Throws Error "chat template: line L, column C: ..." where the template fails or raises; InvalidArgument for
  // messages a built-in family cannot render (roles other than system, user, assistant; none at all).
  ChatPrompt render(const ChatInput& in, std::string_view bos_text, std::string_view eos_text,
                    bool chatml_fallback) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The Jinja rendering alone (what ChatFormat::render does with a template), for a parsed template.
ChatPrompt render_jinja_chat(const jinja::Template& tmpl, const ChatInput& in, std::string_view bos_text,
                             std::string_view eos_text);

// The prompt of one user message (and a system message when not empty) ending with the assistant's turn opener.
ChatPrompt render_user_turn(const ChatFormat& format, const Tokenizer& tok, std::string_view user,
                            std::string_view system);
// The BOS / EOS token texts a template gets (empty where the vocabulary has none).
std::string bos_text(const Tokenizer& tok);
std::string eos_text(const Tokenizer& tok);
std::string apply_chat_template(ChatFamily family, std::span<const ChatMessage> messages, bool add_generation_prompt,
                                std::string_view bos_text, std::string_view eos_text = "");

}  // namespace wgllm
