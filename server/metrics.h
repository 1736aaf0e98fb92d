// The server's counters and their Prometheus text exposition (GET /metrics): HTTP requests by endpoint and status,
// client disconnects, connections (open, refused past the cap, requests that did not arrive in time), time to first
// token, and the engine's own BatchStats (sequences, tokens, steps).
#pragma once
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "wgllm/batch.h"

namespace wgllm::server {

class Metrics {
 public:
  // A response was sent: `endpoint` is the route (or "other"), `status` its HTTP status.
  void count_request(const std::string& endpoint, int status);
  // A streaming client went away before its response ended.
  void count_disconnect();
  // A request did not arrive whole within the request timeout; a connection past the cap was refused.
  void count_request_timeout();
  void count_refused_connection();
  // A completion produced its first token `seconds` after it arrived.
  void observe_first_token(double seconds);

  // Every metric in Prometheus' text format 0.0.4, with the engine's figures as they are now.
  std::string render(const BatchStats& engine, uint32_t http_in_flight, size_t open_connections) const;

 private:
  // Upper bounds (seconds) of the time-to-first-token histogram's buckets; +Inf is implied.
  static constexpr std::array<double, 10> kBuckets = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  uint64_t disconnects_ = 0, request_timeouts_ = 0, refused_ = 0;
  std::array<uint64_t, kBuckets.size()> ttft_buckets_{};  // cumulative: observations <= each bound
  uint64_t ttft_count_ = 0;
  double ttft_sum_ = 0;
};

}  // namespace wgllm::server
