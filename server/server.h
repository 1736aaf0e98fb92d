// `wgllm serve`'s HTTP server: OpenAI's /v1/chat/completions, /v1/completions and /v1/models over a BatchEngine,
// with /health, /metrics (Prometheus) and the chat page at /.
//
//   wgllm::server::Server server(model, {.port = 0});
//   const int port = server.bind();   // the port chosen
//   std::thread t([&] { server.serve(); });
//   ...
//   server.stop();                    // drains: in-flight requests finish, new ones get 503
//   t.join();
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "wgllm/batch.h"
#include "wgllm/wgllm.h"

namespace wgllm::server {

struct ServerOptions {
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 8080;                 // 0: any free port (bind() returns it)
  std::string api_key;             // non-empty: `Authorization: Bearer KEY` required on every route but /health and /
  std::string model_name;          // the model's id in /v1/models and the responses
  // Requests naming another model get 404; without, the served model answers them (its name in `model`), as
  // llama-server does for clients that send their default name (gpt-4o-mini, ...).
  bool strict_model = false;
  size_t max_body_bytes = 4u << 20;  // larger request bodies get 413
  // A request's head and body must arrive within this many seconds (of the accept, or of a kept-alive connection's
  // next first byte), however slowly the bytes trickle in; past it the connection is closed. A connection has a
  // thread of its own, so slow ones hold back no one else; beyond max_connections open, new ones get 503 at once.
  double request_timeout = 10;
  size_t max_connections = 1024;
  BatchOptions batch;  // the engine's slots, queue and context
  // Chat replies: <think>...</think> apart in reasoning_content (llama-server's "deepseek" format); false keeps it
  // inline in content (--reasoning-format none).
  bool split_reasoning = true;
  // Where the request log goes, a line at a time (default: standard error).
  std::function<void(const std::string& line)> log = nullptr;
};

class Server {
 public:
  // Starts the engine (the model must outlive the server).
  Server(const Model& model, ServerOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the listening socket; returns its port. Throws Error when the address cannot be bound.
  int bind();
  // Answers requests until stop(); call after bind().
  void serve();
  // Thread-safe, idempotent, blocking: stops taking completions (503; /health answers 503 "draining" so load
  // balancers look elsewhere), lets every request in flight finish and its response be written (up to
  // `grace_seconds` for clients that do not read), then closes the socket, so serve() returns.
  void stop(double grace_seconds = 30);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wgllm::server
