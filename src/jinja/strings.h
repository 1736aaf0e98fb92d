// Python's str operations on UTF-8 text, as chat templates call them (case mapping is ASCII's).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace wgllm::jinja {

// What str.strip() / str.split() count as whitespace.
inline constexpr std::string_view kPyWhitespace = " \t\n\r\v\f\x1c\x1d\x1e\x1f";

std::string py_strip(std::string_view s, std::string_view chars, bool left, bool right);
std::string ascii_upper(std::string_view s);
std::string ascii_lower(std::string_view s);
std::string py_title(std::string_view s);       // str.title()
std::string py_capitalize(std::string_view s);  // str.capitalize()
// str.split(sep, maxsplit) / rsplit (maxsplit < 0: no limit).
std::vector<std::string> py_split(std::string_view s, std::string_view sep, int64_t maxsplit, bool from_right);
// str.split() / rsplit() without a separator: runs of whitespace, none empty.
std::vector<std::string> py_split_whitespace(std::string_view s, int64_t maxsplit, bool from_right);
std::string py_replace(std::string_view s, std::string_view from, std::string_view to, int64_t count);
std::vector<std::string> py_splitlines(std::string_view s);
// str.isdigit(), isalpha(), isspace(), isalnum(), isupper(), islower() (ASCII).
bool py_is(std::string_view s, std::string_view what);

}  // namespace wgllm::jinja
