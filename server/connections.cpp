#include "connections.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <thread>

#include "openai.h"

namespace wgllm::server {

namespace {

using clock_type = std::chrono::steady_clock;

int to_ms(double seconds) { return int(std::max(0.0, seconds) * 1000); }

// Waits until sock has `events` (POLLIN or POLLOUT) or ms milliseconds pass; false on timeout or error.
bool wait_for(socket_t sock, short events, int ms) {
  pollfd p{sock, events, 0};
  for (;;) {
    const int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    return r > 0 && (p.revents & (events | POLLHUP | POLLERR));
  }
}

void address_of(socket_t sock, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof a;
  ip.clear();
  port = 0;
  if ((peer ? ::getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len)
            : ::getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len)) != 0)
    return;
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, buf, sizeof buf);
    port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, buf, sizeof buf);
    port = ntohs(v6->sin6_port);
  }
  ip = buf;
}

// A connection's stream whose reads all end by one deadline (set per request), and whose writes wait at most the
// write timeout for room.
class DeadlineStream final : public httplib::Stream {
 public:
  DeadlineStream(socket_t sock, double write_timeout) : sock_(sock), write_ms_(to_ms(write_timeout)) {}
  void set_deadline(clock_type::time_point t) { deadline_ = t; }
  bool timed_out() const { return timed_out_; }

  bool is_readable() const override {
    for (;;) {  // poll's milliseconds may end a little before the deadline: wait again for the rest
      const auto left = deadline_ - clock_type::now();
      if (left <= clock_type::duration::zero()) {
        timed_out_ = true;
        return false;
      }
      if (wait_for(sock_, POLLIN, int(std::chrono::ceil<std::chrono::milliseconds>(left).count()))) return true;
    }
  }
  bool is_writable() const override { return wait_for(sock_, POLLOUT, write_ms_); }
  ssize_t read(char* ptr, size_t size) override {
    if (!is_readable()) return -1;
    ssize_t n;
    do n = ::recv(sock_, ptr, size, 0);
    while (n < 0 && errno == EINTR);
    return n;
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n;
    do n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    return n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override { address_of(sock_, true, ip, port); }
  void get_local_ip_and_port(std::string& ip, int& port) const override { address_of(sock_, false, ip, port); }
  socket_t socket() const override { return sock_; }

 private:
  socket_t sock_;
  int write_ms_;
  clock_type::time_point deadline_ = clock_type::now();
  mutable bool timed_out_ = false;
};

void close_socket(socket_t sock) {
  ::shutdown(sock, SHUT_RDWR);
  ::close(sock);
}

}  // namespace

void ConnectionThreads::enqueue(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    if (running_ < max_threads_) {
      ++running_;
      try {
        std::thread([this, fn] {  // a copy: fn stays here should no thread be had
          fn();
          std::lock_guard done(mu_);
          if (--running_ == 0) cv_.notify_all();
        })
            .detach();
        return;
      } catch (const std::system_error&) {  // no thread to be had: run it here, as past the cap
        --running_;
      }
    }
  }
  fn();
}

void ConnectionThreads::shutdown() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return running_ == 0; });
}

GuardedServer::GuardedServer(ConnectionLimits limits) : limits_(std::move(limits)) {
  // The connection threads: one per open connection, and a margin for those being answered 503.
  const size_t threads = limits_.max_connections + 64;
  new_task_queue = [threads] { return new ConnectionThreads(threads); };
}

void GuardedServer::widen_backlog() {
  if (svr_sock_ != INVALID_SOCKET) ::listen(svr_sock_, SOMAXCONN);  // listen again: only the backlog changes
}

void GuardedServer::refuse(socket_t sock) {
  const std::string body = error_body(503,
                                      "the server has " + std::to_string(limits_.max_connections) +
                                          " connections open (--max-connections); try again later",
                                      "", "too_many_connections")
                               .dump();
  const std::string reply = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: " +
                            std::to_string(body.size()) + "\r\nConnection: close\r\nRetry-After: 1\r\n\r\n" + body;
  ::send(sock, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);  // best effort, never waiting on the client
  ::shutdown(sock, SHUT_WR);
  char drain[4096];  // what the client already sent, so that closing does not reset the connection under the reply
  while (::recv(sock, drain, sizeof drain, MSG_DONTWAIT) > 0) {
  }
  ::close(sock);
  if (limits_.on_refused) limits_.on_refused();
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  if (open_.fetch_add(1) >= limits_.max_connections) {
    --open_;
    refuse(sock);
    return false;
  }
  DeadlineStream strm(sock, limits_.write_timeout);
  const auto timeout =
      std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(limits_.request_timeout));
  bool ok = false;
  // The first request must arrive whole within the timeout of the accept; each later one (keep-alive) within the
  // timeout of its first byte, which must come within the keep-alive timeout.
  strm.set_deadline(clock_type::now() + timeout);
  for (size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET; --left) {
    if (left != keep_alive_max_count_) {
      if (!wait_for(sock, POLLIN, to_ms(limits_.keep_alive_timeout))) break;
      strm.set_deadline(clock_type::now() + timeout);
    }
    bool closed = false;
    ok = process_request(strm, left == 1, closed, nullptr);
    if (strm.timed_out() && limits_.on_request_timeout) limits_.on_request_timeout();
    if (!ok || closed || strm.timed_out()) break;
  }
  close_socket(sock);
  --open_;
  return ok;
}

}  // namespace wgllm::server
