// `wgllm template`: a conversation rendered exactly (no newline added), the model's BOS / EOS texts by default, the
// day of --date for strftime_now, and a template's error as one line with exit status 1.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "cli/cli_util.h"
#include "wgllm/vocab.h"

namespace wgllm {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + "wgllm_tmpl_" + std::to_string(getpid()) + "_" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

const std::string kModel = std::string(WGLLM_SOURCE_DIR) + "/models/default/shakespeare-tiny.gguf";

TEST(TemplateCli, RendersExactly) {
  const std::string msgs = write_temp("m.json", R"([{"role": "user", "content": "Hi \"there\""},
                                                   {"role": "assistant", "content": "Hello"}])");
  const std::string tmpl =
      write_temp("t.jinja",
                 "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"
                 "{% if add_generation_prompt %}>{% endif %}|{{ bos_token }}|{{ eos_token }}|{{ tools is none }}\n");
  CliResult r = run_cli("template --template " + tmpl + " --messages " + msgs);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[user:Hi \"there\"][assistant:Hello]>|||True");  // jinja2 drops the last newline
  r = run_cli("template --template " + tmpl + " --messages " + msgs +
              " --no-generation-prompt --bos-token '<s>' --eos-token '</s>' --tools " +
              write_temp("tools.json", R"([{"type": "function", "function": {"name": "f"}}])"));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[user:Hi \"there\"][assistant:Hello]|<s>|</s>|False");
  // With -m, the model's own token texts; --template still wins over the model's template.
  const Vocab vocab = Vocab::load(kModel);
  ASSERT_GE(vocab.bos(), 0);
  r = run_cli("template -m " + kModel + " --template " + tmpl + " --messages " + msgs);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "[user:Hi \"there\"][assistant:Hello]>|" + vocab.token_to_piece(vocab.bos()) + "|" +
                       (vocab.eos() >= 0 ? vocab.token_to_piece(vocab.eos()) : "") + "|True");
}

TEST(TemplateCli, DateForStrftimeNow) {
  const std::string msgs = write_temp("m.json", "[]");
  const std::string tmpl = write_temp("d.jinja", "{{ strftime_now('%Y-%m-%d %A %d %B') }}");
  CliResult r = run_cli("template --template " + tmpl + " --messages " + msgs + " --date 2024-02-29");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "2024-02-29 Thursday 29 February");
  for (const char* bad : {"2023-02-29", "2024-13-01", "yesterday", "2024-01-01x"}) {
    r = run_cli("template --template " + tmpl + " --messages " + msgs + " --date " + bad);
    EXPECT_EQ(r.status, 1) << bad;
    EXPECT_NE(r.err.find("date"), std::string::npos) << r.err;
  }
}

TEST(TemplateCli, ErrorsAreOneLine) {
  const std::string msgs = write_temp("m.json", R"([{"role": "system", "content": "x"}])");
  const std::string raises = write_temp(
      "r.jinja",
      "{% for m in messages %}\n{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}"
      "{% endif %}{% endfor %}");
  CliResult r = run_cli("template --template " + raises + " --messages " + msgs);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "wgllm: error: chat template: line 2, column 31: System role not supported\n");
  r = run_cli("template --template " + write_temp("s.jinja", "{% if x %}") + " --messages " + msgs);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "wgllm: error: chat template: line 1, column 11: unexpected end of template, expected 'elif' or "
            "'else' or 'endif'\n");
  r = run_cli("template --template " + raises + " --messages " + write_temp("bad.json", "[{"));
  EXPECT_EQ(r.status, 1);
  EXPECT_NE(r.err.find("messages is not JSON"), std::string::npos) << r.err;
  r = run_cli("template --messages " + msgs);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "wgllm: error: no template: pass -m MODEL or --template FILE\n");
}

}  // namespace
}  // namespace wgllm

namespace wgllm {
namespace {

// run --chat renders through the same code, and --chat-template replaces the model's template: a template that
// raises stops `run` with its message, before any weight loads.
TEST(TemplateCli, RunChatUsesChatTemplateFile) {
  const std::string raises = write_temp("run.jinja", "{{ raise_exception('from the given template: ' ~ messages[-1].content) }}");
  const CliResult r = run_cli("run --chat -p hello -n 1 --chat-template " + raises);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "wgllm: error: chat template: line 1, column 4: from the given template: hello\n");
  const CliResult missing = run_cli("run --chat -p hello -n 1 --chat-template /nonexistent.jinja");
  EXPECT_EQ(missing.status, 1);
  EXPECT_NE(missing.err.find("/nonexistent.jinja"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace wgllm
