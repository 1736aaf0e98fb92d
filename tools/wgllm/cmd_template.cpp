// `wgllm template`: a conversation rendered by a chat template, exactly as the model would be prompted: the Jinja
// template of a GGUF file (-m, its vocabulary alone is read) or of a file (--template), with the model's BOS / EOS
// texts unless given.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "command.h"
#include "wgllm/chat.h"
#include "wgllm/vocab.h"

namespace wgllm::cli {

std::string read_file(const std::string& path, const char* what) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec) throw Error(path + ": cannot open the " + what + ": " + ec.message());
  if (!std::filesystem::is_regular_file(st)) throw Error(path + ": not a regular file (the " + what + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open the " + what);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

namespace {

struct TemplateOptions {
  std::string model, template_file, messages_file, tools_file, variables, date;
  std::string bos, eos;
  bool no_generation_prompt = false;
};

int render_template(const TemplateOptions& o, bool bos_given, bool eos_given) {
  ChatRequest r;
  r.messages = read_file(o.messages_file, "messages file");
  if (!o.tools_file.empty()) r.tools = read_file(o.tools_file, "tools file");
  r.variables = o.variables;
  r.add_generation_prompt = !o.no_generation_prompt;
  r.date = o.date;
  if (bos_given) r.bos_token = o.bos;
  if (eos_given) r.eos_token = o.eos;
  const std::string jinja = o.template_file.empty() ? "" : read_file(o.template_file, "template file");
  const std::string text = o.model.empty() ? ChatTemplate(jinja).render(r) : Vocab::load(o.model).render_chat(r, jinja);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

const Register reg{
    {"template", "print a conversation as a chat template renders it (a GGUF file's own, or a Jinja file)",
     [](CLI::App& app) -> std::function<int()> {
       auto o = std::make_shared<TemplateOptions>();
       auto* m = app.add_option("-m,--model", o->model, "GGUF file: its template, BOS and EOS (vocabulary only)");
       auto* t = app.add_option("--template", o->template_file, "Jinja chat template file (instead of the model's)");
       app.add_option("--messages", o->messages_file, "JSON file: an array of messages (OpenAI's shape)")->required();
       app.add_option("--tools", o->tools_file, "JSON file: an array of tools (the template's `tools`)");
       app.add_option("--vars", o->variables,
                      "JSON object of more template variables, e.g. '{\"enable_thinking\": false}'");
       auto* b = app.add_option("--bos-token", o->bos, "bos_token's text (default: the model's; none without -m)");
       auto* e = app.add_option("--eos-token", o->eos, "eos_token's text (default: the model's; none without -m)");
       app.add_flag("--no-generation-prompt", o->no_generation_prompt,
                    "add_generation_prompt = false (e.g. to continue a final assistant message)");
       app.add_option("--date", o->date, "the day strftime_now() formats, YYYY-MM-DD (default: today)");
       return [o, m, t, b, e] {
         if (!*m && !*t) throw InvalidArgument("no template: pass -m MODEL or --template FILE");
         return render_template(*o, b->count() > 0, e->count() > 0);
       };
     }}};

}  // namespace
}  // namespace wgllm::cli
