// UTF-8 decoding with the Unicode "maximal subpart" rule for invalid input.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

namespace wgllm::utf8 {

enum class Status : uint8_t { Ok, Invalid, Incomplete };

struct Char {
  uint32_t cp;   // valid only when status == Ok
  uint32_t len;  // bytes consumed: the character, the invalid maximal subpart (>= 1), or what is there so far
  Status status;
};

inline constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The character at s[k] (k < s.size()). Incomplete: a valid prefix of a character that the string cuts off.
inline Char next(std::string_view s, size_t k) {
  const auto b0 = static_cast<uint8_t>(s[k]);
  if (b0 < 0x80) return {b0, 1, Status::Ok};
  uint32_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  uint32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1, cp = b0 & 0x1Fu;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2, cp = b0 & 0x0Fu;
    if (b0 == 0xE0) lo = 0xA0;  // no overlongs
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3, cp = b0 & 0x07u;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return {0, 1, Status::Invalid};
  }
  for (uint32_t i = 1; i <= need; ++i) {
    if (k + i >= s.size()) return {0, i, Status::Incomplete};
    const auto b = static_cast<uint8_t>(s[k + i]);
    const bool in_range = i == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
    if (!in_range) return {0, i, Status::Invalid};
    cp = cp << 6 | (b & 0x3Fu);
  }
  return {cp, need + 1, Status::Ok};
}

inline std::string encode(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace wgllm::utf8
