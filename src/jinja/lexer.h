// The Jinja lexer: template source -> tokens, with jinja2's whitespace control as transformers configures it
// (trim_blocks: the newline after a block or comment tag goes; lstrip_blocks: spaces and tabs before a block or
// comment tag on its line go; `{%-` / `-%}` strip all whitespace on that side, `{%+` / `+%}` keep it).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "wgllm/error.h"

namespace wgllm::jinja {

// A template that does not parse or raises while rendering; the message starts with "line L, column C: " where the
// template has a place for it (raise_exception's message is the template's own words and has none).
class TemplateError : public Error {
 public:
  using Error::Error;
};

struct Token {
  enum class Type { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };
  Type type;
  std::string text;  // Text: the text; Name, Op: as written; String: the value, escapes resolved
  int64_t int_value = 0;
  double float_value = 0;
  size_t offset = 0;  // in the source
};

// Line and column (1-based) of byte offsets in a source.
class SourceMap {
 public:
  explicit SourceMap(std::string_view source);
  std::pair<int, int> position(size_t offset) const;
  // "line L, column C: " + message
  std::string where(size_t offset, std::string_view message) const;

 private:
  std::vector<size_t> line_starts_;
};

// Throws TemplateError naming the line and column of an unterminated tag, string or comment, or a stray character.
std::vector<Token> tokenize(std::string_view source, const SourceMap& map);

}  // namespace wgllm::jinja
