// The Jinja parser: tokens -> the statements of a template (ast.h), with jinja2's operator precedence.
#pragma once
#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace wgllm::jinja {

// Throws TemplateError naming the line and column of the first syntax error.
Body parse(const std::vector<Token>& tokens, const SourceMap& map);

}  // namespace wgllm::jinja
