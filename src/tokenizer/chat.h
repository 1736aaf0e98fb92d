// Chat prompts: the few chat-template families in use, recognised from the GGUF's Jinja source and rendered
// exactly as their Jinja templates render.
#pragma once
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace wgllm {

enum class ChatTemplate {
  Llama3,  // <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> (Meta Llama 3 Instruct)
  ChatML,  // <|im_start|>role\ncontent<|im_end|>\n (Qwen, SmolLM, ...)
  Llama2,  // [INST] ... [/INST] with <<SYS>> (Llama 2 chat; Mistral-style [INST] templates)
  Gemma,   // <start_of_turn>role\ncontent<end_of_turn>\n (Gemma 1-3; "assistant" is "model")
};

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// Recognises a template by its markers; throws Error "unknown chat template (...)" otherwise.
ChatTemplate detect_chat_template(std::string_view jinja);
// The template of a model: its own (tokenizer.chat_template) when it has one, else the one its architecture
// (general.architecture) was trained with: Gemma's for gemma, gemma2 and gemma3 files, whose GGUFs often carry none.
// Throws Error for an unknown template, or for no template and an architecture without a known one.
ChatTemplate chat_template_for(std::string_view jinja, std::string_view arch);

// A rendered chat prompt and where the messages' contents sit in it. Encode it with add_special = false,
// parse_special = true and plain = content: the template's own markers become control tokens (BOS is part of the
// text), while a control token's text typed into a message stays text (a user cannot forge a turn).
struct ChatPrompt {
  std::string text;
  std::vector<TextRange> content;
};

// The prompt; apply_chat_template gives its text alone.
// Llama3: bos_text before the first message, contents trimmed of surrounding whitespace.
// ChatML: no BOS, contents as given. Llama2: bos_text before every user turn, eos_text after every assistant
// turn, a leading system message folded into the first user turn, contents trimmed; roles must alternate
// user/assistant (InvalidArgument otherwise); add_generation_prompt changes nothing (the prompt ends in [/INST]).
// Gemma: bos_text first, contents trimmed, system messages (trimmed) put in front of the next user turn's content
// with a blank line between, as llama.cpp does (Gemma has no system role).
ChatPrompt render_chat(ChatTemplate tmpl, std::span<const ChatMessage> messages, bool add_generation_prompt,
                       std::string_view bos_text, std::string_view eos_text = "");
// The prompt of one user message (and a system message when not empty) ending with the assistant's turn opener, in
// the template chat_template_for gives the tokenizer's template and `arch`; BOS / EOS texts from the tokenizer.
ChatPrompt render_user_turn(const Tokenizer& tok, std::string_view arch, std::string_view user,
                            std::string_view system);
// A conversation (roles "system", "user", "assistant"; InvalidArgument naming any other) ending with the assistant's
// turn opener. With chatml_fallback, a model whose template chat_template_for does not know gets ChatML, as
// llama.cpp's server does; without, that throws as chat_template_for does.
ChatPrompt render_conversation(const Tokenizer& tok, std::string_view arch, std::span<const ChatMessage> messages,
                               bool chatml_fallback);
std::string apply_chat_template(ChatTemplate tmpl, std::span<const ChatMessage> messages, bool add_generation_prompt,
                                std::string_view bos_text, std::string_view eos_text = "");

}  // namespace wgllm
