// The Jinja lexer (see lexer.h), following jinja2's Lexer.tokeniter for the whitespace rules.
#include "jinja/lexer.h"

#include <algorithm>
#include <charconv>

namespace wgllm::jinja {

SourceMap::SourceMap(std::string_view source) {
  line_starts_.push_back(0);
  for (size_t i = 0; i < source.size(); ++i)
    if (source[i] == '\n') line_starts_.push_back(i + 1);
}

std::pair<int, int> SourceMap::position(size_t offset) const {
  const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset) - 1;
  return {static_cast<int>(it - line_starts_.begin()) + 1, static_cast<int>(offset - *it) + 1};
}

std::string SourceMap::where(size_t offset, std::string_view message) const {
  const auto [line, col] = position(offset);
  return "line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + std::string(message);
}

namespace {

constexpr std::string_view kSpace = " \t\n\r\v\f";

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// A string literal's body with Python's escapes resolved (jinja2 decodes literals with "unicode-escape").
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char c = s[++i];
    const auto hex = [&](size_t n) {
      uint32_t cp = 0;
      if (i + n >= s.size()) return false;
      const auto r = std::from_chars(s.data() + i + 1, s.data() + i + 1 + n, cp, 16);
      if (r.ptr != s.data() + i + 1 + n) return false;
      append_utf8(out, cp);
      i += n;
      return true;
    };
    switch (c) {
      case 'n': out += '\n'; break;
      case 't': out += '\t'; break;
      case 'r': out += '\r'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'v': out += '\v'; break;
      case 'a': out += '\a'; break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case '\n': break;
      case 'x':
        if (!hex(2)) out += "\\x";
        break;
      case 'u':
        if (!hex(4)) out += "\\u";
        break;
      case 'U':
        if (!hex(8)) out += "\\U";
        break;
      default:
        if (c >= '0' && c <= '7') {
          uint32_t cp = 0;
          size_t n = 0;
          while (n < 3 && i + n < s.size() && s[i + n] >= '0' && s[i + n] <= '7') cp = cp * 8 + (s[i + n++] - '0');
          append_utf8(out, cp);
          i += n - 1;
        } else {
          out += '\\';
          out += c;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view src, const SourceMap& map) : src_(src), map_(map) {}

  std::vector<Token> run() {
    bool line_starting = true;  // the text that follows starts a line (jinja2's lstrip rule)
    size_t pos = 0;
    while (pos <= src_.size()) {
      const size_t tag = find_tag(pos);
      std::string_view text = src_.substr(pos, tag - pos);
      if (tag == src_.size()) {
        add_text(text, pos);
        break;
      }
      const char kind = src_[tag + 1];  // '{', '%' or '#'
      const char sign = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (sign == '-') {
        text = text.substr(0, text.find_last_not_of(kSpace) + 1);
        if (text.find_first_not_of(kSpace) == std::string_view::npos) text = {};
      } else if (sign != '+' && kind != '{') {
        const size_t line = text.rfind('\n');
        const size_t l = line == std::string_view::npos ? 0 : line + 1;
        if ((l > 0 || line_starting) && text.substr(l).find_first_not_of(" \t") == std::string_view::npos)
          text = text.substr(0, l);
      }
      add_text(text, pos);
      size_t end;  // just past the tag
      char end_sign;
      if (kind == '#') {
        const size_t close = src_.find("#}", tag + 2);
        if (close == std::string_view::npos) fail(tag, "unterminated comment");
        end_sign = close > tag + 2 ? src_[close - 1] : '\0';
        end = close + 2;
      } else {
        tokens_.push_back({kind == '{' ? Token::Type::VarBegin : Token::Type::BlockBegin, "", 0, 0, tag});
        end = lex_tag(tag + 2 + (sign == '-' || sign == '+'), kind == '{' ? '}' : '%', end_sign);
      }
      pos = end;
      line_starting = false;
      if (end_sign == '-') {  // all whitespace after the tag goes
        const size_t b = src_.find_first_not_of(kSpace, pos);
        const size_t stop = b == std::string_view::npos ? src_.size() : b;
        line_starting = stop > pos && src_[stop - 1] == '\n';
        pos = stop;
      } else if (end_sign != '+' && kind != '{' && pos < src_.size() && src_[pos] == '\n') {
        ++pos;  // trim_blocks
        line_starting = true;
      }
    }
    tokens_.push_back({Token::Type::End, "", 0, 0, src_.size()});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void fail(size_t offset, std::string_view message) const {
    throw TemplateError(map_.where(offset, message));
  }

  size_t find_tag(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string_view::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return src_.size();
  }

  void add_text(std::string_view text, size_t offset) {
    if (!text.empty()) tokens_.push_back({Token::Type::Text, std::string(text), 0, 0, offset});
  }

  // The tokens of one {{ ... }} or {% ... %} from `pos`; returns the offset after its end, its sign in end_sign.
  size_t lex_tag(size_t pos, char closer, char& end_sign) {
    const size_t start = pos;
    int depth = 0;  // open brackets: an end marker inside them is not the tag's end
    while (true) {
      while (pos < src_.size() && kSpace.find(src_[pos]) != std::string_view::npos) ++pos;
      if (pos >= src_.size()) fail(start - 2, closer == '}' ? "unterminated '{{'" : "unterminated '{%'");
      const std::string_view rest = src_.substr(pos);
      if (depth == 0) {
        for (char s : {'-', '+', '\0'}) {
          const std::string marker = s ? std::string{s, closer, '}'} : std::string{closer, '}'};
          if (rest.starts_with(marker) && !(s == '+' && closer == '}')) {
            end_sign = s;
            tokens_.push_back({closer == '}' ? Token::Type::VarEnd : Token::Type::BlockEnd, "", 0, 0, pos});
            return pos + marker.size();
          }
        }
      }
      const char c = rest[0];
      if (is_name_start(c)) {
        size_t n = 1;
        while (n < rest.size() && (is_name_start(rest[n]) || is_digit(rest[n]))) ++n;
        tokens_.push_back({Token::Type::Name, std::string(rest.substr(0, n)), 0, 0, pos});
        pos += n;
      } else if (is_digit(c)) {
        pos = lex_number(pos);
      } else if (c == '\'' || c == '"') {
        size_t i = 1;
        while (i < rest.size() && rest[i] != c) i += rest[i] == '\\' ? 2 : 1;
        if (i >= rest.size()) fail(pos, "unterminated string");
        tokens_.push_back({Token::Type::String, unescape(rest.substr(1, i - 1)), 0, 0, pos});
        pos += i + 1;
      } else {
        static constexpr std::string_view two[] = {"//", "**", "==", "!=", "<=", ">="};
        size_t n = 0;
        for (std::string_view t : two)
          if (rest.starts_with(t)) n = 2;
        if (n == 0) {
          if (std::string_view("+-*/%~[](){}<>=.:|,;").find(c) == std::string_view::npos)
            fail(pos, std::string("unexpected character '") + c + "'");
          n = 1;
          if (c == '(' || c == '[' || c == '{') ++depth;
          if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
        }
        tokens_.push_back({Token::Type::Op, std::string(rest.substr(0, n)), 0, 0, pos});
        pos += n;
      }
    }
  }

  size_t lex_number(size_t pos) {
    size_t i = pos;
    std::string digits;
    const auto run = [&] {
      while (i < src_.size() && (is_digit(src_[i]) || (src_[i] == '_' && i + 1 < src_.size() && is_digit(src_[i + 1]))))
        if (src_[i++] != '_') digits += src_[i - 1];
    };
    run();
    bool is_float = false;
    const bool after_dot = !tokens_.empty() && tokens_.back().type == Token::Type::Op && tokens_.back().text == ".";
    if (!after_dot && i + 1 < src_.size() && src_[i] == '.' && is_digit(src_[i + 1])) {
      digits += src_[i++];
      run();
      is_float = true;
    }
    if (!after_dot && i < src_.size() && (src_[i] == 'e' || src_[i] == 'E')) {
      size_t j = i + 1;
      if (j < src_.size() && (src_[j] == '+' || src_[j] == '-')) ++j;
      if (j < src_.size() && is_digit(src_[j])) {
        digits += 'e';
        digits.append(src_.substr(i + 1, j - i - 1));
        i = j;
        run();
        is_float = true;
      }
    }
    Token t{is_float ? Token::Type::Float : Token::Type::Int, digits, 0, 0, pos};
    if (is_float)
      t.float_value = std::strtod(digits.c_str(), nullptr);
    else if (std::from_chars(digits.data(), digits.data() + digits.size(), t.int_value).ec != std::errc())
      fail(pos, "integer literal out of range");
    tokens_.push_back(std::move(t));
    return i;
  }

  std::string_view src_;
  const SourceMap& map_;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const SourceMap& map) { return Lexer(source, map).run(); }

}  // namespace wgllm::jinja
