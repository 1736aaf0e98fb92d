// `wgllm serve`: an OpenAI-compatible HTTP server (server/server.h) for one model. SIGINT / SIGTERM drain it: new
// completions get 503 while those in flight finish, then it exits 0.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "command.h"
#include "server/server.h"
#include "wgllm/batch.h"

namespace wgllm::cli {
namespace {

struct ServeOptions {
  std::string model, adapter, host = "127.0.0.1", api_key, alias, chat_template, reasoning_format = "deepseek";
  int port = 8080;
  uint32_t parallel = 4, queue = 64, n_ctx = 0;
  std::optional<uint32_t> prompt_digits;  // LoadOptions::prompt_digits
  double max_body_mib = 4;
  bool strict_model = false;
  double request_timeout = 10;
  size_t max_connections = 1024;
  uint32_t batch_tokens = 256;
  bool no_cache_prompt = false;
  uint32_t kv_pool = 0;
};

// Each connection takes a file descriptor: the soft open-file limit is raised toward max_connections + 256 (model
// files, pipes, the listening socket); returns the connections it allows.
size_t connections_within_file_limit(size_t max_connections) {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return max_connections;
  const rlim_t want = rlim_t(max_connections) + 256;
  if (r.rlim_cur < want) {
    r.rlim_cur = r.rlim_max == RLIM_INFINITY ? want : std::min(want, r.rlim_max);
    ::setrlimit(RLIMIT_NOFILE, &r);
    ::getrlimit(RLIMIT_NOFILE, &r);
  }
  if (r.rlim_cur >= want) return max_connections;
  const size_t allowed = r.rlim_cur > 512 ? size_t(r.rlim_cur) - 256 : 256;
  std::fprintf(stderr, "warning: --max-connections %zu lowered to %zu: the open-file limit is %llu (ulimit -n)\n",
               max_connections, allowed, (unsigned long long)r.rlim_cur);
  return allowed;
}

// The id clients name the model by: --alias, else the file's name without .gguf, else the built-in model's.
std::string model_name(const ServeOptions& o) {
  if (!o.alias.empty()) return o.alias;
  if (o.model.empty()) return "shakespeare-tiny";
  return std::filesystem::path(o.model).stem().string();
}

int serve(const ServeOptions& o) {
  if (o.parallel == 0) throw InvalidArgument("--parallel must be at least 1");
  if (o.port < 0 || o.port > 65535) throw InvalidArgument("--port must be in [0, 65535]");
  if (!(o.max_body_mib > 0)) throw InvalidArgument("--max-body must be positive");
  if (!(o.request_timeout > 0) || o.request_timeout > 86400)
    throw InvalidArgument("--request-timeout must be in (0, 86400] seconds");
  if (o.max_connections == 0) throw InvalidArgument("--max-connections must be at least 1");
  if (o.batch_tokens == 0) throw InvalidArgument("--batch-tokens must be at least 1");
  // SIGINT and SIGTERM are taken by a thread of ours (sigwait), not by whichever thread they hit: blocked here,
  // before any thread starts, so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not the end of the process

  const std::string jinja = o.chat_template.empty() ? "" : read_file(o.chat_template, "chat template file");
  Model model = load_model(o.model, {.adapter = o.adapter,
                                     .n_ctx = o.n_ctx,
                                     .prompt_digits = o.prompt_digits,
                                     .progress = progress_bar(),
                                     .chat_template = jinja});
  print_memory(model);
  // -c is each sequence's context; without it the model's (sized for one sequence) is shared among them.
  const uint32_t per_sequence = o.n_ctx ? o.n_ctx : BatchEngine::default_n_ctx(model, o.parallel);
  server::Server server(model, {.host = o.host,
                                .port = o.port,
                                .api_key = o.api_key,
                                .model_name = model_name(o),
                                .strict_model = o.strict_model,
                                .max_body_bytes = size_t(o.max_body_mib * 1048576),
                                .request_timeout = o.request_timeout,
                                .max_connections = connections_within_file_limit(o.max_connections),
                                .batch = {.parallel = o.parallel,
                                          .queue = o.queue,
                                          .n_ctx = per_sequence,
                                          .prefill_chunk = o.batch_tokens,
                                          .cache_prompt = !o.no_cache_prompt,
                                          .kv_pool = o.kv_pool},
                                .split_reasoning = o.reasoning_format == "deepseek"});
  const int port = server.bind();
  std::fprintf(stderr, "serving '%s': %u sequences of %u positions together, %u more may wait\n", model_name(o).c_str(),
               o.parallel, per_sequence, o.queue);
  if (o.kv_pool)
    std::fprintf(stderr, "KV cache pool: %u positions in pages of 256, taken as sequences reach them\n",
                 (o.kv_pool + 255) / 256 * 256);
  const bool v6 = o.host.find(':') != std::string::npos;
  std::fprintf(stderr, "listening on http://%s%s%s:%d\n", v6 ? "[" : "", o.host.c_str(), v6 ? "]" : "", port);

  std::atomic<bool> served = false;
  std::thread signal_thread([&] {
    const timespec tick{0, 200'000'000};
    while (!served) {
      const int sig = sigtimedwait(&signals, nullptr, &tick);
      if (sig == SIGINT || sig == SIGTERM) {
        std::fprintf(stderr, "%s: finishing the requests in flight, then exiting\n",
                     sig == SIGINT ? "SIGINT" : "SIGTERM");
        server.stop();
        return;
      }
    }
  });
  server.serve();
  served = true;
  signal_thread.join();
  std::fprintf(stderr, "stopped\n");
  return 0;
}

const Register reg{
    {"serve", "an OpenAI-compatible HTTP server (chat, completions, models, health, metrics, a chat page)",
     [](CLI::App& app) -> std::function<int()> {
       auto o = std::make_shared<ServeOptions>();
       app.add_option("-m,--model", o->model, "GGUF model file (none: the built-in tiny Shakespeare model)");
       app.add_option("--host", o->host, "address to listen on (0.0.0.0: every interface)")->capture_default_str();
       app.add_option("--port", o->port, "port (0: any free one; the line 'listening on ...' names it)")
           ->capture_default_str();
       app.add_option("--parallel", o->parallel,
                      "sequences generated together (each holds a KV cache of -c positions; without -c they share the "
                      "model's default context, at least 256 each)")
           ->capture_default_str();
       app.add_option("--queue", o->queue, "requests waiting beyond those; past it: 503")->capture_default_str();
       app.add_option(
              "-c,--ctx-size", o->n_ctx,
              "context per sequence (0: the model's default context shared among --parallel, at least 256 each)")
           ->capture_default_str();
       app.add_option("--api-key", o->api_key, "require 'Authorization: Bearer KEY' (not on /health and /)");
       app.add_option("--alias", o->alias, "the model's id in the API (default: the file name without .gguf)");
       app.add_option("--max-body", o->max_body_mib, "largest request body in MiB; past it: 413")
           ->capture_default_str();
       app.add_option("--batch-tokens", o->batch_tokens,
                      "prompt tokens a step feeds beside the running streams' decode (a long prompt enters in "
                      "chunks of this, so it does not stall them; llama.cpp's -b)")
           ->capture_default_str();
       app.add_flag(
           "--no-cache-prompt", o->no_cache_prompt,
           "compute every prompt in full; by default a request takes the free sequence whose cache holds the "
           "longest prefix of its prompt and keeps those positions (usage.prompt_tokens_details.cached_tokens)");
       app.add_option("--kv-pool", o->kv_pool,
                      "positions the sequences' KV caches hold together, in pages of 256 (default: --parallel x "
                      "their context); fewer: pages are taken as sequences reach them and idle sequences' cached "
                      "prompts give theirs up, the least recently used first; a decoding request that finds none is "
                      "paused until pages are free");
       app.add_option("--request-timeout", o->request_timeout,
                      "seconds for a request's head and body to arrive, however slowly; past it the connection "
                      "is closed")
           ->capture_default_str();
       app.add_option("--max-connections", o->max_connections,
                      "connections open at once (each has a thread); past it: 503 and closed")
           ->capture_default_str();
       app.add_option("--adapter", o->adapter, "adapter index or name part (wgllm info --list)");
       add_prompt_digits(app, o->prompt_digits);
       app.add_flag("--strict-model", o->strict_model,
                    "a request naming another model than this one gets 404 (default: this model answers it)");
       app.add_option("--chat-template", o->chat_template, "Jinja chat template file (instead of the model's)");
       app.add_option("--reasoning-format", o->reasoning_format,
                      "deepseek: a reply's <think>...</think> in message.reasoning_content; none: left in content")
           ->check(CLI::IsMember({"deepseek", "none"}))
           ->capture_default_str();
       return [o] { return serve(*o); };
     }}};

}  // namespace
}  // namespace wgllm::cli
