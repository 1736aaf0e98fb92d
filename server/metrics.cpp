// Prometheus exposition of the server's and the engine's figures (metrics.h).
#include "metrics.h"

#include <sstream>

namespace wgllm::server {

void Metrics::count_request(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::count_disconnect() {
  std::lock_guard lock(mu_);
  ++disconnects_;
}

void Metrics::count_request_timeout() {
  std::lock_guard lock(mu_);
  ++request_timeouts_;
}

void Metrics::count_refused_connection() {
  std::lock_guard lock(mu_);
  ++refused_;
}

void Metrics::observe_first_token(double seconds) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < kBuckets.size(); ++i)
    if (seconds <= kBuckets[i]) ++ttft_buckets_[i];
  ++ttft_count_;
  ttft_sum_ += seconds;
}

namespace {

// One metric: its HELP and TYPE lines, then the samples the caller writes.
void header(std::ostringstream& out, const char* name, const char* type, const char* help) {
  out << "# HELP " << name << ' ' << help << "\n# TYPE " << name << ' ' << type << '\n';
}

template <typename T>
void sample(std::ostringstream& out, const char* name, const char* type, const char* help, T value) {
  header(out, name, type, help);
  out << name << ' ' << value << '\n';
}

}  // namespace

std::string Metrics::render(const BatchStats& e, uint32_t http_in_flight, size_t open_connections) const {
  std::lock_guard lock(mu_);
  std::ostringstream out;
  out.precision(9);
  header(out, "wgllm_http_requests_total", "counter", "HTTP responses sent, by endpoint and status code");
  for (const auto& [key, n] : requests_)
    out << "wgllm_http_requests_total{endpoint=\"" << key.first << "\",code=\"" << key.second << "\"} " << n << '\n';
  sample(out, "wgllm_http_completions_in_flight", "gauge", "completion requests whose response is being written",
         http_in_flight);
  sample(out, "wgllm_client_disconnects_total", "counter", "streaming clients gone before their response ended",
         disconnects_);
  sample(out, "wgllm_http_connections_open", "gauge", "client connections open", open_connections);
  sample(out, "wgllm_http_connections_refused_total", "counter",
         "connections answered 503 and closed because --max-connections were open", refused_);
  sample(out, "wgllm_http_request_timeouts_total", "counter",
         "connections closed because a request's head and body did not arrive within --request-timeout",
         request_timeouts_);

  sample(out, "wgllm_requests_active", "gauge", "sequences prefilling or decoding in the engine", e.active);
  sample(out, "wgllm_requests_queued", "gauge", "requests waiting for a free sequence slot", e.queued);
  sample(out, "wgllm_parallel_slots", "gauge", "sequences the engine runs together (--parallel)", e.parallel);
  sample(out, "wgllm_queue_capacity", "gauge", "requests that may wait beyond those (--queue)", e.queue_capacity);
  header(out, "wgllm_requests_total", "counter", "requests the engine ended, by outcome");
  out << "wgllm_requests_total{outcome=\"done\"} " << e.requests_done << '\n'
      << "wgllm_requests_total{outcome=\"cancelled\"} " << e.requests_cancelled << '\n'
      << "wgllm_requests_total{outcome=\"failed\"} " << e.requests_failed << '\n';
  sample(out, "wgllm_requests_preempted_total", "counter",
         "decoding requests paused for want of a KV page (--kv-pool), resumed once pages were free",
         e.requests_preempted);
  sample(out, "wgllm_prompt_tokens_total", "counter", "prompt tokens of the requests that reached their first token",
         e.prompt_tokens);
  sample(out, "wgllm_prompt_tokens_cached_total", "counter",
         "of those, positions kept from an earlier request's cache instead of prefilled", e.prompt_tokens_cached);
  sample(out, "wgllm_prompt_tokens_shared_total", "counter",
         "of those, positions another sequence slot held (its KV pages shared)", e.prompt_tokens_shared);
  sample(out, "wgllm_generated_tokens_total", "counter", "tokens generated", e.generated_tokens);
  sample(out, "wgllm_kv_pages", "gauge", "pages of 256 positions in the KV cache pool (--kv-pool)", e.kv_pages);
  sample(out, "wgllm_kv_pages_free", "gauge", "of those, held by no sequence", e.kv_pages_free);
  sample(out, "wgllm_kv_pages_shared", "gauge", "of those, held by more than one sequence (a shared prefix)",
         e.kv_pages_shared);
  sample(out, "wgllm_engine_steps_total", "counter", "forward steps the engine ran", e.steps);
  sample(out, "wgllm_engine_busy_seconds_total", "counter", "time the engine spent running steps", e.busy_seconds);
  sample(out, "wgllm_generated_tokens_per_second", "gauge",
         "generated tokens per second of engine busy time, over the server's life",
         e.busy_seconds > 0 ? double(e.generated_tokens) / e.busy_seconds : 0.0);

  header(out, "wgllm_time_to_first_token_seconds", "histogram", "from a request's arrival to its first token");
  for (size_t i = 0; i < kBuckets.size(); ++i)
    out << "wgllm_time_to_first_token_seconds_bucket{le=\"" << kBuckets[i] << "\"} " << ttft_buckets_[i] << '\n';
  out << "wgllm_time_to_first_token_seconds_bucket{le=\"+Inf\"} " << ttft_count_ << '\n'
      << "wgllm_time_to_first_token_seconds_sum " << ttft_sum_ << '\n'
      << "wgllm_time_to_first_token_seconds_count " << ttft_count_ << '\n';
  return out.str();
}

}  // namespace wgllm::server
