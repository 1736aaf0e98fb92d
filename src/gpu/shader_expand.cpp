#include "gpu/shader_expand.h"

#include <cctype>
#include <map>
#include <sstream>
#include <vector>

#include "wgllm/error.h"

namespace wgllm::gpu {

namespace {

std::vector<std::string> split_lines(std::string_view text) {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) {
      lines.emplace_back(text.substr(start));
      break;
    }
    lines.emplace_back(text.substr(start, nl - start));
    start = nl + 1;
  }
  return lines;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  for (size_t pos = 0; (pos = s.find(from, pos)) != std::string::npos; pos += to.size())
    s.replace(pos, from.size(), to);
}

struct Expander {
  std::map<std::string, long> constants;
  bool unroll = true;

  long count_of(const std::string& token, size_t line) const {
    if (!token.empty() && std::isdigit(static_cast<unsigned char>(token[0]))) return std::stol(token);
    auto it = constants.find(token);
    if (it == constants.end())
      throw ShaderError("line " + std::to_string(line + 1) + ": //#unroll count '" + token + "' is not a u32 const");
    return it->second;
  }

  // Expands lines [begin, end) (no directives left unbalanced) into code without line breaks.
  std::string flatten(const std::vector<std::string>& lines, size_t begin, size_t end) const {
    std::string out;
    for (size_t i = begin; i < end; ++i) {
      const std::string t = trim(lines[i]);
      if (t.rfind("//#unroll", 0) == 0) {
        const size_t close = matching_end(lines, i);
        const bool forced = t.rfind("//#unroll!", 0) == 0;  // always unrolled (e.g. pasted names)
        std::istringstream words(t.substr(forced ? 10 : 9));
        std::string name, count;
        words >> name >> count;
        std::string body = flatten(lines, i + 1, close);
        const long n = count_of(count, i);
        if (unroll || forced) {
          for (long k = 0; k < n; ++k) {
            std::string copy = body;
            replace_all(copy, "$" + name, std::to_string(k));
            out += copy;
          }
        } else {
          const std::string var = "unroll_" + name;
          replace_all(body, "$" + name, var);
          out += "for (var " + var + " = 0u; " + var + " < " + std::to_string(n) + "u; " + var + " += 1u) { " + body +
                 "} ";
        }
        i = close;
        continue;
      }
      std::string code = lines[i];
      if (const size_t c = code.find("//"); c != std::string::npos) code.resize(c);
      out += code + ' ';
    }
    return out;
  }

  static size_t matching_end(const std::vector<std::string>& lines, size_t open) {
    int depth = 0;
    for (size_t i = open; i < lines.size(); ++i) {
      const std::string t = trim(lines[i]);
      if (t.rfind("//#unroll", 0) == 0) ++depth;
      if (t.rfind("//#end", 0) == 0 && --depth == 0) return i;
    }
    throw ShaderError("line " + std::to_string(open + 1) + ": //#unroll without //#end");
  }
};

// Records every `const NAME: u32 = <digits>u;` of `text` (the unroll counts it may name).
void collect_u32_constants(std::string_view text, std::map<std::string, long>& out) {
  auto skip_space = [&](size_t& i) {
    while (i < text.size() && (text[i] == ' ' || text[i] == '\t')) ++i;
  };
  auto expect = [&](size_t& i, std::string_view word) {
    skip_space(i);
    if (text.substr(i, word.size()) != word) return false;
    i += word.size();
    return true;
  };
  for (size_t at = text.find("const "); at != std::string_view::npos; at = text.find("const ", at + 1)) {
    if (at > 0 && (std::isalnum(static_cast<unsigned char>(text[at - 1])) || text[at - 1] == '_')) continue;
    size_t i = at + 6;
    skip_space(i);
    const size_t name_begin = i;
    while (i < text.size() && (std::isalnum(static_cast<unsigned char>(text[i])) || text[i] == '_')) ++i;
    const std::string name(text.substr(name_begin, i - name_begin));
    if (name.empty() || !expect(i, ":") || !expect(i, "u32") || !expect(i, "=")) continue;
    skip_space(i);
    const size_t digits = i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
    if (i == digits) continue;
    const long value = std::stol(std::string(text.substr(digits, i - digits)));
    if (i < text.size() && text[i] == 'u') ++i;
    if (expect(i, ";")) out[name] = value;
  }
}

}  // namespace

std::string expand_shader(std::string_view source, std::string_view prelude, bool unroll) {
  if (source.find("//#unroll") == std::string_view::npos) return std::string(source);
  Expander ex;
  ex.unroll = unroll;
  for (std::string_view text : {prelude, source}) collect_u32_constants(text, ex.constants);
  const auto lines = split_lines(source);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (trim(lines[i]).rfind("//#unroll", 0) == 0) {
      const size_t close = Expander::matching_end(lines, i);
      out += ex.flatten(lines, i, close + 1) + '\n';
      for (size_t k = i + 1; k <= close; ++k) out += '\n';
      i = close;
      continue;
    }
    out += lines[i] + (i + 1 < lines.size() ? "\n" : "");
  }
  return out;
}

}  // namespace wgllm::gpu
