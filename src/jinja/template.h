// A Jinja template as Hugging Face chat templates are written: parsed once, rendered many times, with the
// environment transformers' apply_chat_template renders in (jinja2's ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and loop controls; tojson without ASCII escaping, keys in their order;
// raise_exception, strftime_now; the {% generation %} tag).
#pragma once
#include <ctime>
#include <memory>
#include <string>
#include <string_view>

#include "jinja/lexer.h"
#include "jinja/value.h"

namespace wgllm::jinja {

class Template {
 public:
  // Throws TemplateError naming the line and column of a syntax error.
  explicit Template(std::string_view source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // The text for the variables of `vars` (a dict: messages, add_generation_prompt, bos_token, ...); strftime_now()
  // formats `now`. Throws TemplateError (line and column, then what went wrong, or raise_exception's message).
  std::string render(const Value& vars, const std::tm& now) const;
  // The same at the current local time.
  std::string render(const Value& vars) const;

 private:
  struct Parsed;
  std::unique_ptr<Parsed> parsed_;
};

}  // namespace wgllm::jinja
