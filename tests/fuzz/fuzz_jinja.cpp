// libFuzzer target: any bytes as a Jinja chat template, parsed and rendered for a conversation with tools. Every
// input must parse and render or throw TemplateError; anything else (a crash, another exception, a sanitizer report,
// a hang) is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "jinja/template.h"

namespace {

const wgllm::jinja::Value& variables() {
  static const wgllm::jinja::Value vars = wgllm::jinja::Value::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                 {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function":
                   {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                 {"role": "tool", "content": "sunny"}, {"role": "assistant", "content": "<think>ok</think>Sunny."}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
              "properties": {"city": {"type": "string"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})"));
  return vars;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  try {
    const wgllm::jinja::Template t(source);
    const std::tm now{};
    (void)t.render(variables(), now);
  } catch (const wgllm::jinja::TemplateError&) {
  }
  return 0;
}
