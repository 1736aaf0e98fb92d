// `wgllm tokenize`: a text's token ids under a GGUF file's vocabulary, as llama.cpp's llama-tokenize prints them
// (one `id -> 'piece'` line per token, or --ids: `[1, 2, 3]`). Reads the vocabulary alone (wgllm/vocab.h): no
// weights, no adapter, any architecture.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "command.h"
#include "wgllm/default_model.h"
#include "wgllm/vocab.h"

namespace wgllm::cli {
namespace {

struct TokenizeOptions {
  std::string model, prompt, file;
  bool from_stdin = false, ids = false, no_bos = false, show_count = false;
  bool parse_special = true, escape = true;
};

// llama.cpp's escapes (common's string_process_escapes): \n \r \t \' \" \\ and \xHH; any other backslash stays.
std::string process_escapes(const std::string& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '\\' || i + 1 >= in.size()) {
      out += in[i];
      continue;
    }
    const char c = in[++i];
    switch (c) {
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\\': out += '\\'; break;
      default: {
        auto hex = [](char h) { return std::isxdigit(static_cast<unsigned char>(h)) != 0; };
        if (c == 'x' && i + 2 < in.size() && hex(in[i + 1]) && hex(in[i + 2])) {
          out += static_cast<char>(std::strtol(in.substr(i + 1, 2).c_str(), nullptr, 16));
          i += 2;
        } else {
          out += '\\';
          out += c;
        }
      }
    }
  }
  return out;
}

// The whole of a regular file, verbatim (a trailing newline is a token too).
std::string read_text_file(const std::string& path) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec) throw Error(path + ": cannot open the text file: " + ec.message());
  if (!std::filesystem::is_regular_file(st))
    throw Error(path + ": not a regular file (-f takes a text file; --stdin reads standard input)");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open the text file");
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int tokenize(const TokenizeOptions& o) {
  std::string text;
  if (o.from_stdin) {
    text.assign(std::istreambuf_iterator<char>(std::cin), {});
    if (std::cin.bad()) throw Error("cannot read standard input");
  } else if (!o.file.empty()) {
    text = read_text_file(o.file);
  } else {
    text = o.prompt;
  }
  if (o.escape) text = process_escapes(text);

  const Vocab vocab = o.model.empty() ? Vocab::load(default_model_gguf(), "the built-in model") : Vocab::load(o.model);
  // llama-tokenize's rule: the special tokens (BOS, and EOS where the vocabulary adds one) only when the vocabulary
  // adds BOS and --no-bos is absent.
  const std::vector<int32_t> ids = vocab.encode(text, vocab.add_bos() && !o.no_bos, o.parse_special);

  if (o.ids) {
    std::string line = "[";
    for (size_t i = 0; i < ids.size(); ++i) line += (i ? ", " : "") + std::to_string(ids[i]);
    std::printf("%s]\n", line.c_str());
  } else {
    for (int32_t id : ids) {
      const std::string piece = vocab.token_to_piece(id);
      std::printf("%6d -> '", id);
      std::fwrite(piece.data(), 1, piece.size(), stdout);
      std::fputs("'\n", stdout);
    }
  }
  if (o.show_count) std::printf("Total number of tokens: %zu\n", ids.size());
  return 0;
}

const Register reg{{"tokenize",
                    "print a text's token ids under a GGUF file's vocabulary (as llama-tokenize; no weights loaded)",
                    [](CLI::App& app) -> std::function<int()> {
                      auto o = std::make_shared<TokenizeOptions>();
                      app.add_option("-m,--model", o->model, "GGUF file (a vocabulary-only file will do)");
                      auto* p = app.add_option("-p,--prompt", o->prompt, "text to tokenize");
                      auto* f = app.add_option("-f,--file", o->file, "read the text from a file, verbatim");
                      auto* in = app.add_flag("--stdin", o->from_stdin, "read the text from standard input");
                      p->excludes(f)->excludes(in);
                      f->excludes(in);
                      app.add_flag("--ids", o->ids, "print only the ids, as a list: [1, 2, 3]");
                      app.add_flag("--no-bos", o->no_bos, "no BOS token, even if the vocabulary adds one");
                      app.add_flag("--parse-special,!--no-parse-special", o->parse_special,
                                   "control tokens written in the text become their ids (default: on)");
                      app.add_flag("-e,--escape,!--no-escape", o->escape,
                                   "process escapes \\n \\r \\t \\' \\\" \\\\ \\xHH in the text (default: on)");
                      app.add_flag("--show-count", o->show_count, "print the number of tokens at the end");
                      return [o, p, f, in] {
                        if (!*p && !*f && !*in) throw InvalidArgument("no text: pass -p TEXT, -f FILE or --stdin");
                        return tokenize(*o);
                      };
                    }}};

}  // namespace
}  // namespace wgllm::cli
