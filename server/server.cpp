// The HTTP routes and the streaming of completions (server.h). cpp-httplib answers each connection on a thread of
// its own (connections.h: requests read within a deadline, connections capped); a completion's thread submits to the
// BatchEngine and then waits on the request's Channel, writing what the engine produced as it comes (server-sent
// events) or once it ended (one JSON object).
#include "server.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "channel.h"
#include "chat_page.h"
#include "connections.h"
#include "metrics.h"
#include "openai.h"

namespace wgllm::server {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

namespace {

// Every route and the methods it answers; any other path is 404, another method 405.
struct Route {
  const char* path;
  const char* method;
};
constexpr Route kRoutes[] = {{"/", "GET"},
                             {"/health", "GET"},
                             {"/metrics", "GET"},
                             {"/v1/models", "GET"},
                             {"/v1/chat/completions", "POST"},
                             {"/v1/completions", "POST"}};

const Route* find_route(const std::string& path) {
  for (const Route& r : kRoutes)
    if (path == r.path) return &r;
  return nullptr;
}

// The request log's line is written after the response (httplib's logger), on the thread that answered it; what the
// handler learnt on the way (arrival time, tokens) waits for it here.
struct LogNote {
  std::optional<clock_type::time_point> arrived;
  std::string text;
};
thread_local LogNote t_note;

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& param = {},
                const std::string& code = {}) {
  res.status = status;
  res.set_content(dump(error_body(status, message, param, code)), "application/json");
}

const char* finish_reason(const CompletionEvent& done, bool stopped_by_string) {
  if (stopped_by_string) return "stop";
  switch (done.stop_reason) {
    case StopReason::Length:
    case StopReason::Context: return "length";
    default: return "stop";
  }
}

long long milliseconds_since(clock_type::time_point t) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - t).count();
}

std::string local_time() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

}  // namespace

struct Server::Impl {
  const Model& model;
  ServerOptions options;
  BatchEngine engine;
  Metrics metrics;
  GuardedServer http;  // a thread per connection, requests read within a deadline, connections capped
  const int64_t started = std::time(nullptr);

  std::atomic<bool> draining = false;
  std::mutex stop_mu;  // one stop() at a time, and serve() starts only before it
  bool stopped = false, serving = false;

  // Completion responses still being written; stop() waits for none.
  std::mutex flight_mu;
  std::condition_variable flight_cv;
  uint32_t in_flight = 0;

  Impl(const Model& m, ServerOptions o)
      : model(m),
        options(std::move(o)),
        engine(m, options.batch),
        http(ConnectionLimits{.request_timeout = options.request_timeout,
                              .max_connections = options.max_connections,
                              .on_request_timeout = [this] { metrics.count_request_timeout(); },
                              .on_refused = [this] { metrics.count_refused_connection(); }}) {
    if (!options.log) options.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
    http.set_payload_max_length(options.max_body_bytes);
    routes();
  }

  void enter_flight() {
    std::lock_guard lock(flight_mu);
    ++in_flight;
  }
  void leave_flight() {
    {
      std::lock_guard lock(flight_mu);
      --in_flight;
    }
    flight_cv.notify_all();
  }
  uint32_t flight() {
    std::lock_guard lock(flight_mu);
    return in_flight;
  }

  // ---- the routes

  void routes() {
    // Before any handler: unknown paths and methods, draining, and the API key.
    http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      t_note = {clock_type::now(), {}};
      const Route* route = find_route(req.path);
      if (!route) {
        send_error(res, 404, "no route for " + req.path, "", "not_found");
        return httplib::Server::HandlerResponse::Handled;
      }
      const bool allowed = req.method == route->method || (req.method == "HEAD" && std::string(route->method) == "GET");
      if (!allowed) {
        res.set_header("Allow", route->method);
        send_error(res, 405, req.method + " is not allowed on " + req.path + " (use " + route->method + ")", "",
                   "method_not_allowed");
        return httplib::Server::HandlerResponse::Handled;
      }
      // The page itself holds nothing: it asks for the key and sends it with its API calls.
      const bool open = req.path == "/health" || req.path == "/";
      if (!options.api_key.empty() && !open && req.get_header_value("Authorization") != "Bearer " + options.api_key) {
        send_error(res, 401,
                   req.has_header("Authorization") ? "Incorrect API key provided"
                                                   : "Missing API key: send the header 'Authorization: Bearer KEY'",
                   "", "invalid_api_key");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });

    http.Get("/", [](const httplib::Request&, httplib::Response& res) {
      const auto page = chat_page_html();
      res.set_content(std::string(reinterpret_cast<const char*>(page.data()), page.size()), "text/html; charset=utf-8");
    });
    http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      res.status = draining ? 503 : 200;
      res.set_content(json{{"status", draining ? "draining" : "ok"}}.dump(), "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(metrics.render(engine.stats(), flight(), http.open_connections()),
                      "text/plain; version=0.0.4; charset=utf-8");
    });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      const ModelInfo& i = model.info();
      const json m = {{"id", options.model_name},
                      {"object", "model"},
                      {"created", started},
                      {"owned_by", "wgllm"},
                      {"meta",
                       {{"arch", i.arch},
                        {"n_params", i.n_params},
                        {"n_ctx", engine.n_ctx()},
                        {"n_vocab", i.n_vocab},
                        {"weight_type", i.weight_type}}}};
      res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    http.Post("/v1/chat/completions",
              [this](const httplib::Request& req, httplib::Response& res) { complete(Endpoint::Chat, req, res); });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(Endpoint::Completions, req, res);
    });

    // Errors httplib answers itself (413 past the body limit, 400 for a request it cannot parse) get OpenAI's
    // shape too; responses that already have a body keep it.
    http.set_error_handler([this](const httplib::Request&, httplib::Response& res) {
      if (!res.body.empty()) return;
      const std::string message = res.status == 413 ? "the request body is larger than the limit of " +
                                                          std::to_string(options.max_body_bytes) + " bytes"
                                  : res.status == 400 ? "the HTTP request could not be parsed"
                                                      : "HTTP error " + std::to_string(res.status);
      send_error(res, res.status, message);
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, 500, "internal error: " + what);
    });
    http.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      metrics.count_request(find_route(req.path) ? req.path : "other", res.status);
      std::string line =
          local_time() + " " + req.remote_addr + " " + req.method + " " + req.path + " " + std::to_string(res.status);
      if (t_note.arrived) line += " " + std::to_string(milliseconds_since(*t_note.arrived)) + " ms";
      if (!t_note.text.empty()) line += " " + t_note.text;
      t_note = {};
      options.log(line);
    });
  }

  // ---- completions

  // The note of a finished completion in the request log.
  static std::string note(const CompletionEvent& done, const char* reason) {
    return "prompt " + std::to_string(done.n_prompt) + " (cached " + std::to_string(done.n_cached) + ") generated " +
           std::to_string(done.n_generated) + " finish " + reason + (done.error.empty() ? "" : " error: " + done.error);
  }

  Finish finish_of(const Piece& p) const {
    return {finish_reason(*p.done, p.stopped_by_string), p.done->n_prompt, p.done->n_generated, p.done->n_cached};
  }

  void complete(Endpoint endpoint, const httplib::Request& req, httplib::Response& res) {
    try {
      if (draining) throw ApiError(503, "the server is shutting down", "", "shutting_down");
      ParsedRequest r =
          parse_request(endpoint, req.body, model, engine.n_ctx(), options.model_name, options.strict_model);
      auto channel = std::make_shared<Channel>();
      const bool stream = r.stream, include_usage = r.include_usage, logprobs = r.logprobs;
      ResponseWriter writer(endpoint, model, options.model_name, logprobs,
                            {.split_reasoning = options.split_reasoning,
                             .thinking_open = r.thinking_open,
                             .tool_calls = r.tool_calls,
                             .harmony = r.harmony});
      uint64_t id = 0;
      try {
        id = engine.submit(std::move(r.engine), Channel::callback(channel, model, std::move(r.stop), logprobs));
      } catch (const QueueFull& e) {
        throw ApiError(503, std::string(e.what()) + "; retry later", "", "queue_full");
      } catch (const InvalidArgument& e) {
        throw ApiError(400, e.what());
      } catch (const Error& e) {  // shut down meanwhile
        throw ApiError(503, e.what(), "", "shutting_down");
      }
      enter_flight();  // left once the response is written (nothing between here and there throws)
      if (stream)
        stream_response(res, id, channel, std::move(writer), include_usage);
      else
        whole_response(res, channel, writer);
    } catch (const ApiError& e) {
      send_error(res, e.status, e.what(), e.param, e.code);
    }
  }

  void whole_response(httplib::Response& res, const std::shared_ptr<Channel>& channel, const ResponseWriter& writer) {
    const Piece p = channel->take_all();
    leave_flight();
    const CompletionEvent& done = *p.done;
    if (done.n_generated) metrics.observe_first_token(done.first_token_seconds);
    const Finish f = finish_of(p);
    t_note.text = note(done, f.reason.c_str());
    if (!done.error.empty()) return send_error(res, 500, "generation failed: " + done.error, "", "generation_failed");
    res.set_content(dump(writer.whole(p.text, p.tokens, f)), "application/json");
  }

  // What one streamed response keeps between the calls of its content provider.
  struct StreamState {
    uint64_t id = 0;
    std::shared_ptr<Channel> channel;
    ResponseWriter writer;
    bool include_usage = false;
    bool started = false, finished = false, gone = false;
  };

  void stream_response(httplib::Response& res, uint64_t id, std::shared_ptr<Channel> channel, ResponseWriter writer,
                       bool include_usage) {
    auto st = std::make_shared<StreamState>(StreamState{id, std::move(channel), std::move(writer), include_usage});
    // The client is gone (a write failed, or httplib found the socket closed): cancel, so the sequence stops at its
    // next token and its slot frees.
    auto lost = [this, st] {
      if (st->gone || st->finished) return;
      st->gone = true;
      st->channel->client_gone();
      engine.cancel(st->id);
      metrics.count_disconnect();
    };
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, st, lost](size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& data) {
            if (sink.write(data.data(), data.size())) return true;
            lost();
            return false;
          };
          if (!st->started) {  // chat's first chunk is the role alone, sent before any token
            st->started = true;
            if (st->writer.endpoint() == Endpoint::Chat && !send(sse(st->writer.chunk("", {})))) return false;
          }
          std::optional<Piece> p = st->channel->take(std::chrono::milliseconds(1000));
          if (!p) return send(": waiting\n\n");  // a comment (clients skip it) finds a closed connection while queued
          if (!p->done)
            return p->text.empty() && p->tokens.empty() ? true : send(sse(st->writer.chunk(p->text, p->tokens)));
          // The end: the last chunk with the finish reason, the usage when asked, [DONE].
          const CompletionEvent& done = *p->done;
          const Finish f = finish_of(*p);
          t_note.text = note(done, f.reason.c_str());
          if (done.n_generated) metrics.observe_first_token(done.first_token_seconds);
          if (st->gone) return false;
          std::string out;
          if (!done.error.empty())
            out += sse(error_body(500, "generation failed: " + done.error, "", "generation_failed"));
          else
            out += sse(st->writer.final_chunk(p->text, p->tokens, f));
          if (st->include_usage) out += sse(st->writer.usage_chunk(f));
          out += "data: [DONE]\n\n";
          if (!send(out)) return false;
          st->finished = true;
          sink.done();
          return true;
        },
        [this, st, lost](bool success) {
          if (!success) lost();
          leave_flight();
        });
  }
};

Server::Server(const Model& model, ServerOptions options) : impl_(std::make_unique<Impl>(model, std::move(options))) {}

Server::~Server() { stop(0); }

int Server::bind() {
  Impl& s = *impl_;
  int port = s.options.port;
  const bool ok =
      port == 0 ? (port = s.http.bind_to_any_port(s.options.host)) > 0 : s.http.bind_to_port(s.options.host, port);
  if (!ok)
    throw Error("cannot listen on " + s.options.host + ":" + std::to_string(s.options.port) +
                " (address in use, or not an address of this machine?)");
  s.http.widen_backlog();
  return port;
}

void Server::serve() {
  {
    std::lock_guard lock(impl_->stop_mu);
    if (impl_->stopped) return;
    impl_->serving = true;
  }
  impl_->http.listen_after_bind();
}

void Server::stop(double grace_seconds) {
  Impl& s = *impl_;
  std::lock_guard lock(s.stop_mu);
  if (s.stopped) return;
  s.stopped = true;
  s.draining = true;
  s.engine.shutdown(true);  // every request taken ends (and has sent its last event)
  {
    std::unique_lock flight(s.flight_mu);
    s.flight_cv.wait_for(flight, std::chrono::duration<double>(grace_seconds), [&] { return s.in_flight == 0; });
  }
  // httplib's stop() reaches only a server already in its accept loop: a serve() that has just begun is waited for.
  if (s.serving)
    for (int i = 0; i < 5000 && !s.http.is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  s.http.stop();
}

}  // namespace wgllm::server
