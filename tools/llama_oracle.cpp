// llama_oracle: what the tests ask llama.cpp and its own tools do not print. Built by tools/llamacpp.sh against the
// llama.cpp it builds (llama.h, libllama), on the CPU with 2 threads.
//
//   llama_oracle greedy -m FILE (-p TEXT | -f FILE) -n N [--no-bos] [--chat] [-c N] [-v]
//
// prints one JSON object: the prompt's token ids, the greedy continuation (argmax of the logits, the lowest id among
// equal ones; it ends after an end-of-generation id, which is included, or after N ids) and, for every step, the top
// logit and the gap between the two largest logits (a near-tie, where a flip between two implementations that round
// differently is no error). --no-bos: the prompt without BOS even when the vocabulary adds one. --chat: the prompt
// is one user message in the model's chat template (llama.cpp's built-in templates). -c: the context (default:
// prompt + N). -v: llama.cpp's log on stderr.
//
//   llama_oracle perplexity -m FILE -f FILE [-c N] [--chunks N] [-v]
//
// prints one JSON object: llama-perplexity's estimate, computed as it computes it (the text tokenized with the
// vocabulary's BOS, cut into chunks of -c tokens (default 512), each chunk's first token replaced by BOS where the
// vocabulary adds one, the chunk evaluated alone from an empty cache, the negative log-likelihood of the second half's
// next tokens summed in double; after each chunk the running perplexity, at the end the perplexity and its
// uncertainty). It exists because llama-perplexity logs through a thread that its exit does not wait for: on a busy
// machine its last lines, the final estimate among them, are now and then never printed.
#include <llama.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "llama_oracle: error: %s\n", msg.c_str());
  std::exit(1);
}

struct Args {
  std::string command, model, prompt, prompt_file;
  int n_predict = 32, n_ctx = 0, n_chunks = -1;
  bool no_bos = false, chat = false, verbose = false;
};

Args parse(int argc, char** argv) {
  if (argc < 2)
    die("usage: llama_oracle greedy -m FILE (-p TEXT | -f FILE) -n N [--no-bos] [--chat] [-c N] [-v] | "
        "llama_oracle perplexity -m FILE -f FILE [-c N] [--chunks N] [-v]");
  Args a;
  a.command = argv[1];
  for (int i = 2; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) die("option " + k + " needs a value");
      return argv[++i];
    };
    auto number = [&]() {
      const std::string v = value();
      char* end = nullptr;
      const long n = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end || n < 0 || n > 1000000) die("option " + k + ": '" + v + "' is not a count");
      return int(n);
    };
    if (k == "-m")
      a.model = value();
    else if (k == "-p")
      a.prompt = value();
    else if (k == "-f")
      a.prompt_file = value();
    else if (k == "-n")
      a.n_predict = number();
    else if (k == "-c")
      a.n_ctx = number();
    else if (k == "--chunks")
      a.n_chunks = number();
    else if (k == "--no-bos")
      a.no_bos = true;
    else if (k == "--chat")
      a.chat = true;
    else if (k == "-v")
      a.verbose = true;
    else
      die("unknown option '" + k + "'");
  }
  if (a.command != "greedy" && a.command != "perplexity")
    die("unknown command '" + a.command + "' (greedy, perplexity)");
  if (a.command == "perplexity" && a.prompt_file.empty()) die("perplexity needs the text: pass -f FILE");
  if (a.model.empty()) die("no model: pass -m FILE");
  if (a.prompt.empty() == a.prompt_file.empty()) die("pass one of -p TEXT and -f FILE");
  if (!a.prompt_file.empty()) {
    std::ifstream in(a.prompt_file, std::ios::binary);
    if (!in) die(a.prompt_file + ": cannot open");
    std::ostringstream s;
    s << in.rdbuf();
    a.prompt = s.str();
  }
  return a;
}

std::vector<llama_token> tokenize(const llama_vocab* vocab, const std::string& text, bool add_special,
                                  bool parse_special) {
  int n = -llama_tokenize(vocab, text.data(), int32_t(text.size()), nullptr, 0, add_special, parse_special);
  std::vector<llama_token> ids(std::max(n, 0));
  if (n > 0 && llama_tokenize(vocab, text.data(), int32_t(text.size()), ids.data(), n, add_special, parse_special) != n)
    die("tokenization failed");
  return ids;
}

std::string chat_prompt(const llama_model* model, const std::string& user) {
  const char* tmpl = llama_model_chat_template(model, nullptr);
  if (!tmpl) die("the model has no chat template");
  const llama_chat_message msg{"user", user.c_str()};
  std::vector<char> buf(user.size() * 2 + 1024);
  int n = llama_chat_apply_template(tmpl, &msg, 1, true, buf.data(), int32_t(buf.size()));
  if (n < 0) die("llama.cpp does not know the model's chat template");
  if (size_t(n) > buf.size()) {
    buf.resize(size_t(n));
    n = llama_chat_apply_template(tmpl, &msg, 1, true, buf.data(), int32_t(buf.size()));
  }
  return std::string(buf.data(), size_t(n));
}

// Minimal JSON output: numbers and arrays of them.
template <typename T>
std::string json_array(const std::vector<T>& v) {
  std::ostringstream s;
  s.precision(9);
  s << '[';
  for (size_t i = 0; i < v.size(); ++i) s << (i ? "," : "") << v[i];
  s << ']';
  return s.str();
}

// llama-perplexity's estimate (see the top of this file). Returns the exit status.
int perplexity(llama_model* model, const Args& a) {
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const bool add_bos = llama_vocab_get_add_bos(vocab);
  const int n_ctx = a.n_ctx ? a.n_ctx : 512;
  std::vector<llama_token> tokens = tokenize(vocab, a.prompt, true, false);
  if (int(tokens.size()) < 2 * n_ctx)
    die("the text has " + std::to_string(tokens.size()) + " tokens; a context of " + std::to_string(n_ctx) +
        " needs at least " + std::to_string(2 * n_ctx));
  const int n_chunk_max = int(tokens.size()) / n_ctx;
  const int n_chunk = a.n_chunks < 0 ? n_chunk_max : std::min(a.n_chunks, n_chunk_max);

  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = cp.n_batch = uint32_t(n_ctx);
  cp.n_threads = cp.n_threads_batch = 2;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("llama.cpp cannot make a context of " + std::to_string(n_ctx));
  const int n_vocab = llama_vocab_n_tokens(vocab);
  const int first = n_ctx / 2;
  llama_batch batch = llama_batch_init(n_ctx, 0, 1);
  double nll = 0, nll2 = 0;
  int count = 0;
  std::vector<double> chunks;
  for (int c = 0; c < n_chunk; ++c) {
    const int start = c * n_ctx;
    llama_memory_clear(llama_get_memory(ctx), true);
    batch.n_tokens = n_ctx;
    for (int k = 0; k < n_ctx; ++k) {
      batch.token[k] = k == 0 && add_bos ? llama_vocab_bos(vocab) : tokens[size_t(start + k)];
      batch.pos[k] = k;
      batch.n_seq_id[k] = 1;
      batch.seq_id[k][0] = 0;
      batch.logits[k] = k >= first;
    }
    if (llama_decode(ctx, batch) != 0) die("llama_decode failed in chunk " + std::to_string(c + 1));
    for (int k = first; k < n_ctx - 1; ++k) {
      const float* logits = llama_get_logits_ith(ctx, k);
      float max_logit = logits[0];
      for (int i = 1; i < n_vocab; ++i) max_logit = std::max(max_logit, logits[i]);
      double sum_exp = 0;
      for (int i = 0; i < n_vocab; ++i) sum_exp += expf(logits[i] - max_logit);
      const double v = -(logits[tokens[size_t(start + k + 1)]] - max_logit - std::log(sum_exp));
      nll += v;
      nll2 += v * v;
    }
    count += n_ctx - first - 1;
    chunks.push_back(std::exp(nll / count));
  }
  nll /= count;
  nll2 = nll2 / count - nll * nll;
  const double ppl = std::exp(nll);
  const double uncertainty = nll2 > 0 ? std::sqrt(nll2 / (count - 1)) * ppl : 0.0;
  std::printf("{\"n_chunks\":%d,\"chunks\":%s,\"ppl\":%.9g,\"uncertainty\":%.9g}\n", n_chunk,
              json_array(chunks).c_str(), ppl, uncertainty);
  llama_batch_free(batch);
  llama_free(ctx);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (!a.verbose) llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_backend_init();
  llama_model* model = llama_model_load_from_file(a.model.c_str(), llama_model_default_params());
  if (!model) die(a.model + ": llama.cpp cannot load it");
  if (a.command == "perplexity") {
    const int status = perplexity(model, a);
    llama_model_free(model);
    llama_backend_free();
    return status;
  }
  const llama_vocab* vocab = llama_model_get_vocab(model);

  std::vector<llama_token> prompt;
  if (a.chat) {
    const std::string text = chat_prompt(model, a.prompt);
    // A template that writes BOS itself gets none added (llama.cpp's own tools do the same).
    const llama_token bos = llama_vocab_bos(vocab);
    std::vector<llama_token> probe = tokenize(vocab, text, false, true);
    const bool has_bos = !probe.empty() && probe[0] == bos;
    prompt = tokenize(vocab, text, !a.no_bos && !has_bos, true);
  } else {
    prompt = tokenize(vocab, a.prompt, !a.no_bos, false);
  }
  if (prompt.empty()) die("the prompt has no tokens");

  llama_context_params cp = llama_context_default_params();
  const int n_ctx = a.n_ctx ? a.n_ctx : int(prompt.size()) + a.n_predict + 1;
  cp.n_ctx = uint32_t(n_ctx);
  cp.n_batch = uint32_t(std::max<size_t>(prompt.size(), 512));
  cp.n_threads = cp.n_threads_batch = 2;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (!ctx) die("llama.cpp cannot make a context of " + std::to_string(n_ctx));
  if (int(prompt.size()) + a.n_predict > int(llama_n_ctx(ctx))) die("the prompt and -n exceed the context (-c)");

  const int n_vocab = llama_vocab_n_tokens(vocab);
  std::vector<llama_token> ids;
  std::vector<float> top1, gap;
  std::vector<llama_token> input = prompt;
  for (int step = 0; step < a.n_predict; ++step) {
    if (llama_decode(ctx, llama_batch_get_one(input.data(), int32_t(input.size()))) != 0)
      die("llama_decode failed at step " + std::to_string(step));
    const float* logits = llama_get_logits_ith(ctx, -1);
    int best = 0;
    for (int i = 1; i < n_vocab; ++i)
      if (logits[i] > logits[best]) best = i;
    float second = -INFINITY;
    for (int i = 0; i < n_vocab; ++i)
      if (i != best) second = std::max(second, logits[i]);
    ids.push_back(best);
    top1.push_back(logits[best]);
    gap.push_back(logits[best] - second);
    if (llama_vocab_is_eog(vocab, best)) break;
    input.assign(1, best);
  }

  std::printf("{\"prompt_ids\":%s,\"greedy_ids\":%s,\"top1_logit\":%s,\"top2_gap\":%s,\"add_bos\":%s,\"n_vocab\":%d}\n",
              json_array(prompt).c_str(), json_array(ids).c_str(), json_array(top1).c_str(), json_array(gap).c_str(),
              llama_vocab_get_add_bos(vocab) ? "true" : "false", n_vocab);
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return std::fflush(stdout) == 0 ? 0 : 1;
}
