// `wgllm run`: load a GGUF model, feed a prompt and stream the generated text.
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "command.h"
#include "wgllm/default_model.h"
#include "wgllm/wgllm.h"

namespace wgllm::cli {

// The model used when -m is absent: the tiny Shakespeare model built into the binary
// (models/default/README.md).
std::span<const uint8_t> default_model_bytes() { return default_model_gguf(); }

// A progress bar on stderr while the weights upload, when stderr is a terminal (redrawn with \r, it would fill a log
// or a pipe with ~50 copies; the line print_memory writes after the load says what was loaded).
std::function<void(uint64_t, uint64_t)> progress_bar() {
  if (!::isatty(STDERR_FILENO)) return nullptr;
  return [last = -1](uint64_t done, uint64_t total) mutable {
    const int pct = total ? int(done * 100 / total) : 100;
    if (pct == last) return;
    last = pct;
    const int width = 30, fill = pct * width / 100;
    std::fprintf(stderr, "\rloading [%s%s] %3d%%", std::string(fill, '#').c_str(),
                 std::string(width - fill, ' ').c_str(), pct);
    if (pct == 100) std::fprintf(stderr, "\n");
  };
}

Model load_model(const std::string& path, const LoadOptions& given) {
  // The developer aids of README's Development section come from the environment, read here, at the edge.
  LoadOptions options = given;
  for (auto [var, field] :
       {std::pair{"WGLLM_KERNEL_DIR", &options.kernel_dir}, std::pair{"WGLLM_DUMP_SHADERS", &options.dump_shaders_dir},
        std::pair{"WGLLM_MATMUL_TILE", &options.matmul_tile}, std::pair{"WGLLM_ROWS_SHAPE", &options.rows_shape},
        std::pair{"WGLLM_EXPERT_SHAPE", &options.expert_shape},
        std::pair{"WGLLM_ATTENTION", &options.attention_prefill}})
    if (const char* v = std::getenv(var); v && field->empty()) *field = v;
  if (const char* v = std::getenv("WGLLM_SHADER_CHECKS")) options.shader_checks |= std::string_view(v) == "1";
  for (auto [var, field] :
       {std::pair{"WGLLM_DELTA_CHUNK_FROM", &options.delta_chunk_from},
        std::pair{"WGLLM_BATCH_TILE_FROM", &options.batch_tile_from},
        std::pair{"WGLLM_BATCH_SPLIT", &options.batch_split}, std::pair{"WGLLM_MATVEC_PASS", &options.matvec_pass},
        std::pair{"WGLLM_PRE_ROWS", &options.pre_rows}, std::pair{"WGLLM_PROMPT_DIGITS", &options.prompt_digits},
        std::pair{"WGLLM_PROMPT_TILE", &options.prompt_tile}})
    if (const char* v = std::getenv(var); v && *v && !*field) {
      const std::string text = v;
      if (text.size() > 9 || text.find_first_not_of("0123456789") != std::string::npos)
        throw Error(std::string(var) + ": '" + text + "' is not a count (0 to 999999999)");
      *field = uint32_t(std::stoul(text));
    }
  if (!path.empty()) return Model::load(path, options);
  const auto bytes = default_model_bytes();
  if (bytes.empty()) throw Error("no model: pass -m FILE.gguf");
  return Model::load(bytes, options, "built-in shakespeare-tiny");
}

void print_memory(const Model& model) {
  const ModelInfo& i = model.info();
  // A context past the training one runs, on positions the model never saw: said here, not refused.
  const std::string note = i.n_ctx_capped ? ", capped from " + std::to_string(i.n_ctx_train) + " to fit memory"
                           : i.n_ctx > i.n_ctx_train ? ", past the model's trained " + std::to_string(i.n_ctx_train)
                                                     : "";
  // Layers of more than one kind (lfm2's convolutions, gemma's local attention, qwen35's DeltaNet): the pattern, and
  // the conv states.
  const bool mixed = i.layer_pattern.find_first_not_of(i.layer_pattern.substr(0, 1)) != std::string::npos;
  std::string layers = mixed ? " " + i.layer_pattern : "";
  if (i.n_expert)
    layers += ", " + std::to_string(i.n_expert) + " experts, " + std::to_string(i.n_expert_used) + " per token";
  // (qwen35: the DeltaNet layers' conv rings and recurrent states)
  const char* state = i.layer_pattern.find('D') != std::string::npos ? "recurrent state" : "conv state";
  const std::string conv = i.conv_state_bytes
                               ? ", " + std::string(state) + " " + std::to_string(i.conv_state_bytes / 1024) + " KiB"
                               : std::string();
  std::fprintf(stderr, "%s (%s, %u layers%s) on %s: weights %.1f MiB, KV cache %.1f MiB%s (context %u%s)\n",
               i.arch.c_str(), i.weight_type.c_str(), i.n_layer, layers.c_str(), i.adapter.c_str(),
               i.weight_bytes / 1048576.0, i.kv_bytes / 1048576.0, conv.c_str(), i.n_ctx, note.c_str());
}

namespace {

struct RunOptions {
  std::string model, prompt, prompt_file, prompt_ids, adapter, system, chat_template;
  uint32_t n_predict = 128, n_ctx = 0, ubatch = 512;
  std::optional<uint32_t> decode_gqa_from;  // unset: the adapter's
  std::optional<uint32_t> prompt_digits;    // LoadOptions::prompt_digits
  int int_dot = 0;                          // LoadOptions::int_dot: --int-dot 1, --no-int-dot -1, unset 0
  int fuse_post_norms = 0;                  // LoadOptions::fuse_post_norms, likewise
  int fuse_qk_norm = 0;                     // LoadOptions::fuse_qk_norm, likewise
  int fuse_moe_route = 0;                   // LoadOptions::fuse_moe_route, likewise
  int fuse_router = 0;                      // LoadOptions::fuse_router, likewise
  SamplingParams sampling;
  int64_t seed = -1;
  bool chat = false, json = false;
  bool no_check_tensors = false;
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    try {
      ids.push_back(std::stoi(item));
    } catch (const std::exception&) {
      throw InvalidArgument("--prompt-ids: '" + item + "' is not a token id");
    }
  }
  return ids;
}

// The most prompt bytes taken: 256 per position of an explicit context (a token of text is rarely over 16 bytes; no
// less than 1 MiB), else 64 MiB (more text than any model's context holds). Past it the prompt cannot fit, and
// reading on (from /dev/zero, say) would only exhaust the memory.
uint64_t prompt_byte_limit(uint32_t n_ctx) {
  return n_ctx ? std::max<uint64_t>(uint64_t(n_ctx) * 256, 1ull << 20) : 64ull << 20;
}

std::string mib(uint64_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

[[noreturn]] void too_long(const std::string& what, uint64_t limit, uint32_t n_ctx) {
  throw InvalidArgument(what + " is longer than " + mib(limit) + ", more than " +
                        (n_ctx ? "a context of " + std::to_string(n_ctx) + " tokens (-c)" : "any model's context") +
                        " holds");
}

}  // namespace

// A prompt file ("-": standard input): a regular file (a FIFO or a device could block or never end; a directory has
// no text), read only up to the limit.
std::string read_prompt_file(const std::string& path, uint64_t limit, uint32_t n_ctx) {
  if (path == "-") {
    std::string text(limit + 1, '\0');
    std::cin.read(text.data(), std::streamsize(text.size()));
    text.resize(size_t(std::cin.gcount()));
    if (text.size() > limit) too_long("the prompt on standard input", limit, n_ctx);
    return text;
  }
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec) throw Error(path + ": cannot open the prompt file: " + ec.message());
  if (!std::filesystem::is_regular_file(st)) {
    const char* kind = std::filesystem::is_directory(st)        ? "a directory"
                       : std::filesystem::is_fifo(st)           ? "a FIFO"
                       : std::filesystem::is_character_file(st) ? "a character device"
                       : std::filesystem::is_block_file(st)     ? "a block device"
                                                                : "not a file";
    throw Error(path + ": " + kind + ", not a regular file (-f takes a text file; -f - reads standard input)");
  }
  const uint64_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > limit) too_long("the prompt file " + path, limit, n_ctx);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open the prompt file: " + std::strerror(errno));
  std::string text(std::min<uint64_t>(size, limit) + 1, '\0');
  in.read(text.data(), std::streamsize(text.size()));
  text.resize(size_t(in.gcount()));
  if (text.size() > limit) too_long("the prompt file " + path, limit, n_ctx);  // it grew meanwhile
  return text;
}

namespace {

// The prompt text (from -p or -f), read before anything is loaded so a bad prompt fails fast.
std::string prompt_text(const RunOptions& o) {
  if (!o.prompt_ids.empty()) return {};
  if (o.prompt.empty() && o.prompt_file.empty()) throw InvalidArgument("no prompt: pass -p TEXT or -f FILE");
  const uint64_t limit = prompt_byte_limit(o.n_ctx);
  if (o.prompt_file.empty() && o.prompt.size() > limit) too_long("the prompt (-p)", limit, o.n_ctx);
  return o.prompt_file.empty() ? o.prompt : read_prompt_file(o.prompt_file, limit, o.n_ctx);
}

// Text to standard output; false once it cannot be written (a full disk, a closed pipe), so generation stops.
bool write_out(std::string_view text) {
  if (!text.empty() && std::fwrite(text.data(), 1, text.size(), stdout) != text.size()) return false;
  return std::fflush(stdout) == 0;
}

[[noreturn]] void output_failed() {
  throw Error(std::string("cannot write to standard output: ") + std::strerror(errno ? errno : EIO));
}

std::vector<int32_t> prompt_tokens(const Model& model, const RunOptions& o, const std::string& text) {
  if (!o.prompt_ids.empty()) return parse_ids(o.prompt_ids);
  if (o.chat) return model.encode_chat(text, o.system);
  return model.encode(text, true);
}

void check_prompt_fits(size_t n_prompt, uint32_t n_ctx) {
  if (n_prompt > n_ctx)
    throw InvalidArgument("the prompt has " + std::to_string(n_prompt) + " tokens, more than the context of " +
                          std::to_string(n_ctx) + " (raise -c)");
}

int run(RunOptions o) {
  using clock = std::chrono::steady_clock;
  validate(o.sampling);  // a bad option fails before the load
  const std::string text = prompt_text(o);
  const auto t0 = clock::now();
  // The prompt is tokenised as soon as the tokenizer is read, so a prompt that cannot fit an explicit -c fails before
  // the weights upload. The default context depends on the adapter's memory: that check waits for the load.
  std::vector<int32_t> prompt;
  Model model = load_model(
      o.model,
      {.adapter = o.adapter,
       .n_ctx = o.n_ctx,
       .ubatch = o.ubatch,
       .decode_gqa_from = o.decode_gqa_from,
       .int_dot = tri_state(o.int_dot),
       .prompt_digits = o.prompt_digits,
       .fuse_post_norms = tri_state(o.fuse_post_norms),
       .fuse_qk_norm = tri_state(o.fuse_qk_norm),
       .fuse_moe_route = tri_state(o.fuse_moe_route),
       .fuse_router = tri_state(o.fuse_router),
       .progress = o.json ? nullptr : progress_bar(),
       .before_upload =
           [&](const Model& m) {
             prompt = prompt_tokens(m, o, text);
             if (o.n_ctx) check_prompt_fits(prompt.size(), o.n_ctx);
           },
       .check_tensors = !o.no_check_tensors,
       .chat_template = o.chat_template.empty() ? std::string() : read_file(o.chat_template, "chat template file")});
  if (!o.json) print_memory(model);
  check_prompt_fits(prompt.size(), model.info().n_ctx);
  Session session(model);  // before the echo: a KV cache the adapter cannot hold fails before any text
  const double load_s = std::chrono::duration<double>(clock::now() - t0).count();  // with the kernels compiled
  if (!o.json && !o.chat && o.prompt_ids.empty()) {  // echo the prompt, then stream the continuation
    if (!write_out(text)) output_failed();
  }
  o.sampling.seed = o.seed >= 0 ? uint64_t(o.seed) : std::random_device{}();
  bool out_ok = true;
  const GenerateResult r = session.generate(prompt, o.sampling, o.n_predict, [&](int32_t, std::string_view text) {
    if (!o.json) out_ok = write_out(text);
    return out_ok;  // text that cannot be written ends the generation
  });
  if (!out_ok) output_failed();
  const size_t n_gen = r.tokens.size();
  // A full context ends the text short of -n: said on stderr (after the text), and in --json as stop_reason.
  auto say_if_full = [&] {
    if (r.stop_reason == StopReason::Context)
      std::fprintf(stderr, "stopped after %zu of %u tokens: the context of %u tokens is full (raise -c)\n", n_gen,
                   o.n_predict, session.n_ctx());
  };
  if (o.json) {
    const nlohmann::json j = {{"prompt_ids", prompt},
                              {"generated_ids", r.tokens},
                              {"text", r.text},
                              {"seed", o.sampling.seed},
                              {"stopped_by_eog", r.stopped_by_eog},
                              {"stop_reason", stop_reason_name(r.stop_reason)},
                              {"timings",
                               {{"load_s", load_s},
                                {"prompt_s", r.prompt_seconds},
                                {"generate_s", r.generate_seconds},
                                {"prompt_tokens_per_s", prompt.size() / r.prompt_seconds},
                                {"generate_tokens_per_s", n_gen / r.generate_seconds}}}};
    if (!write_out(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n")) output_failed();
    say_if_full();
    return 0;
  }
  if (!write_out("\n")) output_failed();  // the text ends before the closing lines on stderr
  say_if_full();
  std::fprintf(stderr, "load %.2f s, prompt %zu tokens %.1f tok/s, generation %zu tokens %.1f tok/s\n", load_s,
               prompt.size(), prompt.size() / r.prompt_seconds, n_gen, n_gen / r.generate_seconds);
  return 0;
}

const Register reg{
    {"run", "generate text from a prompt with a GGUF model", [](CLI::App& app) -> std::function<int()> {
       auto o = std::make_shared<RunOptions>();
       app.add_option("-m,--model", o->model, "GGUF model file");
       auto* p = app.add_option("-p,--prompt", o->prompt, "prompt text");
       auto* f = app.add_option("-f,--file", o->prompt_file, "read the prompt from a file (-: standard input)");
       auto* ids = app.add_option("--prompt-ids", o->prompt_ids, "prompt as token ids: 1,2,3")->group("Advanced");
       p->excludes(f)->excludes(ids);
       f->excludes(ids);
       app.add_option("-n,--n-predict", o->n_predict, "most tokens to generate")->capture_default_str();
       app.add_option("-c,--ctx-size", o->n_ctx, "context size (0: the model's, capped to memory)")
           ->capture_default_str();
       app.add_option("--temp", o->sampling.temperature, "temperature (0: greedy)")->capture_default_str();
       app.add_option("--top-k", o->sampling.top_k, "top-k (0: off)")->capture_default_str();
       app.add_option("--top-p", o->sampling.top_p, "top-p (1: off)")->capture_default_str();
       app.add_option("--min-p", o->sampling.min_p, "min-p (0: off)")->capture_default_str();
       app.add_option("--repeat-penalty", o->sampling.repeat_penalty, "repetition penalty (1: off)")
           ->capture_default_str();
       app.add_option("--repeat-last-n", o->sampling.repeat_last_n, "tokens the penalty looks at")
           ->capture_default_str();
       app.add_option("--seed", o->seed, "random seed (-1: random)")->capture_default_str();
       app.add_flag("--chat", o->chat, "wrap the prompt in the model's chat template");
       app.add_option("--system", o->system, "system message for --chat");
       app.add_option("--chat-template", o->chat_template,
                      "Jinja chat template file for --chat (instead of the model's)");
       app.add_flag("--json", o->json, "print one JSON object (ids, text, timings) instead");
       app.add_option("--ubatch", o->ubatch, "prompt tokens per GPU step")->capture_default_str();
       app.add_option("--adapter", o->adapter, "adapter index or name part (wgllm info --list)");
       add_prompt_digits(app, o->prompt_digits);
       app.add_option("--decode-gqa-from", o->decode_gqa_from,
                      "decode attention per GQA group (each K/V row read once per KV head) from this depth on "
                      "(default: 8192 on GPUs, 0 on CPU adapters)")
           ->group("Advanced");
       app.add_flag("--int-dot,!--no-int-dot", o->int_dot,
                    "decode the FFN's Q4_K gate/up products and a Q4_K / Q6_K LM head on packed int8 dot products (23 "
                    "bits of each input "
                    "against its 32-element block's largest; default: on GPUs for models 2,048 wide or more)")
           ->group("Advanced");
       app.add_flag("--fuse-post-norms,!--no-fuse-post-norms", o->fuse_post_norms,
                    "decoding, gemma's post norms in the next product's prologue instead of dispatches of their own "
                    "(default: on GPUs for gemma3)")
           ->group("Advanced");
       app.add_flag(
              "--fuse-qk-norm,!--no-fuse-qk-norm", o->fuse_qk_norm,
              "decoding, the q/k norms, RoPE and the KV append inside the attention dispatch (one sequence: "
              "models with q/k norms; batched steps: every model; default: on GPUs for one sequence of a model with "
              "q/k norms, on for batched steps)")
           ->group("Advanced");
       app.add_flag("--fuse-moe-route,!--no-fuse-moe-route", o->fuse_moe_route,
                    "decoding a mixture of experts, the routing inside the experts' gate/up products instead of a "
                    "dispatch of its own (default: off)")
           ->group("Advanced");
       app.add_flag("--fuse-router,!--no-fuse-router", o->fuse_router,
                    "decoding a mixture of experts, the routing inside the router's product instead of a dispatch of "
                    "its own (default: off)")
           ->group("Advanced");
       app.add_flag("--no-check-tensors", o->no_check_tensors,
                    "skip the scan of the weights for NaN and infinities at load");
       return [o] { return run(*o); };
     }}};

}  // namespace
}  // namespace wgllm::cli
