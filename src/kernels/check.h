// The contract checks every kernel family's host encoder shares: a failed check throws wgllm::InvalidArgument
// "encode_x: what", naming the field, before anything is dispatched.
#pragma once
#include <cstdint>
#include <string>

#include "gpu/context.h"
#include "wgllm/error.h"

namespace wgllm::kernels::detail {

[[noreturn]] inline void fail(const char* fn, const std::string& what) {
  throw InvalidArgument(std::string(fn) + ": " + what);
}

// Buffer `name` must hold `bytes`, and that range must fit one storage binding.
inline void need(const char* fn, const char* name, const gpu::Buffer& b, uint64_t bytes, const gpu::Context& ctx) {
  if (b.size < bytes)
    fail(fn, std::string(name) + " holds " + std::to_string(b.size) + " bytes, needs " + std::to_string(bytes));
  if (bytes > ctx.max_binding_size())
    fail(fn, std::string(name) + ": " + std::to_string(bytes) + " bytes exceed the storage-binding limit");
}

}  // namespace wgllm::kernels::detail
