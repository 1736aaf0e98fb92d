// wgllm's exceptions: one hierarchy, each message a single line a user can act on.
#pragma once
#include <stdexcept>
#include <string>

namespace wgllm {

// Base of everything wgllm throws.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// No adapter, device lost, validation error, out of GPU memory.
class GpuError : public Error {
 public:
  using Error::Error;
};

// A WGSL shader failed to compile; the message names the file and line.
class ShaderError : public GpuError {
 public:
  using GpuError::GpuError;
};

// A caller passed parameters that break a kernel's or API's contract (names the field).
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

// A model file is malformed or unsupported (names the key/tensor and byte offset).
class ModelError : public Error {
 public:
  using Error::Error;
};

}  // namespace wgllm
