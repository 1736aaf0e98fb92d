// The chat page served at GET / (server/chat.html, compiled in by cmake/embed_binary.cmake).
#pragma once
#include <cstdint>
#include <span>

namespace wgllm::server {
std::span<const uint8_t> chat_page_html();
}  // namespace wgllm::server
