// The server's connections, kept apart so that slow clients starve no one. httplib reads a request in the thread
// that owns its connection, with a timeout per read only: a client that trickles a byte now and then, or opens
// hundreds of connections and sends half a request on each, would hold every thread of a fixed pool while real
// requests wait in its queue. Here:
//   - every connection has a thread of its own (ConnectionThreads), so an idle or slow one holds nothing but itself;
//   - a request's head and body must arrive within `request_timeout` of its first byte being awaited (the first
//     request of a connection: of its accept), however the bytes trickle in; past it the connection is closed;
//   - at most `max_connections` are open: beyond that a new one is answered 503 at once and closed;
//   - generation runs on the engine's own thread (BatchEngine), never on these.
#pragma once
#include <httplib.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>

namespace wgllm::server {

struct ConnectionLimits {
  double request_timeout = 10;  // seconds to receive a request's head and body
  size_t max_connections = 1024;
  double keep_alive_timeout = 2;  // seconds an idle kept-alive connection waits for its next request
  double write_timeout = 30;      // seconds a client may take no data before it counts as gone
  std::function<void()> on_request_timeout = nullptr;  // a request did not arrive whole in time
  std::function<void()> on_refused = nullptr;          // a connection over the cap was answered 503
};

// A thread per task (httplib's task per connection), joined by shutdown(). Beyond max_threads at once a task runs in
// the caller (httplib's accept loop): the connection cap then answers it 503 without waiting on the client.
class ConnectionThreads final : public httplib::TaskQueue {
 public:
  explicit ConnectionThreads(size_t max_threads) : max_threads_(max_threads) {}
  ~ConnectionThreads() override { shutdown(); }
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

 private:
  size_t max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  size_t running_ = 0;
};

// httplib's server with the limits above on every connection.
class GuardedServer final : public httplib::Server {
 public:
  explicit GuardedServer(ConnectionLimits limits);
  size_t open_connections() const { return open_; }
  // After binding: the listening socket's queue of connections not yet accepted raised from httplib's 5 (which
  // drops the SYNs of a burst of clients, each then retried a second or more later) to the system's maximum.
  void widen_backlog();

 private:
  bool process_and_close_socket(socket_t sock) override;
  void refuse(socket_t sock);
  ConnectionLimits limits_;
  std::atomic<size_t> open_ = 0;
};

}  // namespace wgllm::server
