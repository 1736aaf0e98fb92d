// Python's str operations (see strings.h).
#include "jinja/strings.h"

#include <algorithm>

namespace wgllm::jinja {

namespace {

bool is_space(char c) { return kPyWhitespace.find(c) != std::string_view::npos; }
bool is_lower(char c) { return c >= 'a' && c <= 'z'; }
bool is_upper(char c) { return c >= 'A' && c <= 'Z'; }
bool is_alpha(char c) { return is_lower(c) || is_upper(c); }
char upper(char c) { return is_lower(c) ? static_cast<char>(c - 32) : c; }
char lower(char c) { return is_upper(c) ? static_cast<char>(c + 32) : c; }

}  // namespace

std::string py_strip(std::string_view s, std::string_view chars, bool left, bool right) {
  // chars may hold multi-byte characters: strip whole UTF-8 sequences of it, byte runs otherwise equal.
  const auto starts_with_one = [&](std::string_view t, bool at_end) -> size_t {
    for (size_t i = 0; i < chars.size();) {
      size_t n = 1;
      const unsigned char c = static_cast<unsigned char>(chars[i]);
      if (c >= 0xc0) n = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
      const std::string_view ch = chars.substr(i, n);
      if (at_end ? t.ends_with(ch) : t.starts_with(ch)) return ch.size();
      i += n;
    }
    return 0;
  };
  while (left && !s.empty()) {
    const size_t n = starts_with_one(s, false);
    if (!n) break;
    s.remove_prefix(n);
  }
  while (right && !s.empty()) {
    const size_t n = starts_with_one(s, true);
    if (!n) break;
    s.remove_suffix(n);
  }
  return std::string(s);
}

std::string ascii_upper(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = upper(c);
  return out;
}

std::string ascii_lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = lower(c);
  return out;
}

std::string py_title(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    c = prev_cased ? lower(c) : upper(c);
    prev_cased = is_alpha(c);
  }
  return out;
}

std::string py_capitalize(std::string_view s) {
  std::string out = ascii_lower(s);
  if (!out.empty()) out[0] = upper(out[0]);
  return out;
}

std::vector<std::string> py_split(std::string_view s, std::string_view sep, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (!from_right) {
    size_t pos = 0;
    for (size_t p; (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) &&
                   (p = s.find(sep, pos)) != std::string_view::npos;
         pos = p + sep.size())
      out.emplace_back(s.substr(pos, p - pos));
    out.emplace_back(s.substr(pos));
    return out;
  }
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
    if (end < sep.size()) break;
    const size_t p = s.rfind(sep, end - sep.size());
    if (p == std::string_view::npos) break;
    out.emplace_back(s.substr(p + sep.size(), end - p - sep.size()));
    end = p;
  }
  out.emplace_back(s.substr(0, end));
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> py_split_whitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  if (from_right) {
    std::string r(s.rbegin(), s.rend());
    out = py_split_whitespace(r, maxsplit, false);
    for (std::string& p : out) std::reverse(p.begin(), p.end());
    std::reverse(out.begin(), out.end());
    return out;
  }
  size_t i = 0;
  while (true) {
    while (i < s.size() && is_space(s[i])) ++i;
    if (i == s.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      size_t e = s.size();
      while (e > i && is_space(s[e - 1])) --e;
      out.emplace_back(s.substr(i, e - i));
      break;
    }
    size_t j = i;
    while (j < s.size() && !is_space(s[j])) ++j;
    out.emplace_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

std::string py_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count) {
  std::string out;
  if (from.empty()) {  // "ab".replace("", "-") == "-a-b-"
    int64_t n = 0;
    for (size_t i = 0; i <= s.size(); ++i) {
      const bool boundary = i == 0 || i == s.size() || (static_cast<unsigned char>(s[i]) & 0xc0) != 0x80;
      if (boundary && (count < 0 || n < count)) {
        out += to;
        ++n;
      }
      if (i < s.size()) out += s[i];
    }
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  for (size_t p; (count < 0 || n < count) && (p = s.find(from, pos)) != std::string_view::npos; ++n) {
    out.append(s.substr(pos, p - pos));
    out.append(to);
    pos = p + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

std::vector<std::string> py_splitlines(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\n' || c == '\r' || c == '\v' || c == '\f' || (c >= '\x1c' && c <= '\x1e')) {
      out.emplace_back(s.substr(start, i - start));
      if (c == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
      start = i + 1;
    }
  }
  if (start < s.size()) out.emplace_back(s.substr(start));
  return out;
}

bool py_is(std::string_view s, std::string_view what) {
  if (s.empty()) return false;
  if (what == "isupper" || what == "islower") {
    bool cased = false;
    for (char c : s) {
      if (what == "isupper" ? is_lower(c) : is_upper(c)) return false;
      cased = cased || is_alpha(c);
    }
    return cased;
  }
  return std::all_of(s.begin(), s.end(), [&](char c) {
    if (what == "isdigit") return c >= '0' && c <= '9';
    if (what == "isalpha") return is_alpha(c);
    if (what == "isspace") return is_space(c);
    return is_alpha(c) || (c >= '0' && c <= '9');
  });
}

}  // namespace wgllm::jinja
