// The library API (include/wgllm/wgllm.h) over GpuModel / GpuSession, the tokenizer and the sampler.
#include "wgllm/wgllm.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "api/chat_input.h"
#include "api/context_size.h"
#include "api/model_impl.h"
#include "api/sampling.h"
#include "gguf/file.h"
#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "tokenizer/chat.h"
#include "tokenizer/gguf_tokenizer.h"

namespace wgllm {

ContextSize default_context(uint32_t n_ctx_train, uint64_t kv_budget, uint64_t bytes_per_position,
                            uint64_t max_positions) {
  const uint64_t fits = bytes_per_position ? kv_budget / bytes_per_position : UINT64_MAX;
  const uint64_t n = std::min({uint64_t(n_ctx_train), fits, max_positions});
  if (n == n_ctx_train) return {n_ctx_train, false};
  const uint32_t rounded = uint32_t(std::min<uint64_t>(n_ctx_train, std::max<uint64_t>(256, n / 256 * 256)));
  return {rounded, rounded < n_ctx_train};
}

namespace {

// Memory the weights and the KV cache may take. WebGPU does not say how much memory an adapter has: a CPU adapter
// gets half the machine's RAM, a GPU 8 GiB (lower it with -c when the card is smaller).
uint64_t memory_budget(const gpu::Context& ctx) {
  if (ctx.adapter().is_cpu()) return uint64_t(sysconf(_SC_PHYS_PAGES)) * uint64_t(sysconf(_SC_PAGE_SIZE)) / 2;
  return 8ull << 30;
}

// The default context for this adapter: the budget left after the weights, and the positions the cache's pools can
// bind (kMaxPools storage buffers of one layer's K and V rows, f16).
ContextSize adapter_default_context(const gpu::Context& ctx, const GpuModel& m) {
  const uint64_t budget = memory_budget(ctx);
  const uint64_t left = budget > m.weight_bytes ? budget - m.weight_bytes : 0;
  const uint64_t per_layer_pos = 2ull * m.config.max_kv_dim() * 2;  // the widest layer's (gemma4: they differ)
  return default_context(m.config.n_ctx_train, left, kv_bytes_per_position(m.config),
                         kernels::KvCache::kMaxPools * (ctx.max_binding_size() / per_layer_pos));
}

uint64_t count_params(const GgufFile& f) {
  uint64_t n = 0;
  for (const GgufTensor& t : f.tensors()) n += t.n_elements;
  return n;
}

}  // namespace

Model::Model(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Model::~Model() = default;
Model::Model(Model&&) noexcept = default;
Model& Model::operator=(Model&&) noexcept = default;

namespace {

// What the GGUF alone gives: the config, the tokenizer and the model's half of ModelInfo. No GPU is touched, so an
// unsupported architecture or a caller's before_upload check fails before the adapter is opened.
std::unique_ptr<ModelAccess::Impl> parse_impl(const GgufFile& f, const LoadOptions& o) {
  auto m = std::make_unique<ModelAccess::Impl>();
  m->config = config_from_gguf(f);
  const ModelConfig& config = m->config;
  if (f.has("tokenizer.ggml.model")) {
    m->tokenizer.emplace(tokenizer_data_from_gguf(f));
    m->chat.emplace(o.chat_template.empty() ? m->tokenizer->data().chat_template : o.chat_template, config.arch_name);
  }
  m->ubatch = std::max<uint32_t>(1, o.ubatch);
  m->layers_per_submit = o.layers_per_submit;
  m->choose_on_gpu = o.choose_on_gpu;

  ModelInfo& i = m->info;
  i.arch = config.arch_name;
  // The first attention layer's q projection (without attention: lfm2's first in_proj, qwen35's first attn_qkv).
  std::string typed = config.is_delta(0) ? "blk.0.attn_qkv.weight" : "blk.0.shortconv.in_proj.weight";
  for (uint32_t l = 0; l < config.n_layer; ++l)
    if (config.is_attention(l)) {
      typed = "blk." + std::to_string(l) + ".attn_q.weight";
      break;
    }
  i.weight_type = type_name(f.tensor(typed).type);
  i.layer_pattern = config.layer_pattern();
  i.n_expert = config.n_expert, i.n_expert_used = config.n_expert_used;
  i.conv_state_bytes = conv_state_bytes(config, o.n_ctx ? std::min(m->ubatch, o.n_ctx) : m->ubatch);
  i.n_params = count_params(f);
  i.n_vocab = config.n_vocab, i.n_embd = config.n_embd, i.n_layer = config.n_layer;
  i.n_ctx_train = config.n_ctx_train;
  i.n_ctx = o.n_ctx;  // 0 until upload_impl chooses the default, which depends on the adapter
  i.kv_bytes = kv_bytes_per_position(config) * i.n_ctx;

  if (m->tokenizer) {
    const Tokenizer& t = *m->tokenizer;
    if (t.eos() >= 0) m->eog.push_back(t.eos());
    for (const char* s : {"<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|endoftext|>", "</s>"})
      if (const int32_t id = t.token_id(s); id >= 0) m->eog.push_back(id);
  }
  return m;
}

// Opens the adapter, uploads the weights and fills the adapter's half of ModelInfo.
void upload_impl(ModelAccess::Impl& m, const GgufFile& f, const LoadOptions& o) {
  m.ctx = std::make_unique<gpu::Context>(gpu::ContextOptions{.adapter = o.adapter,
                                                             .batch_tile_from = o.batch_tile_from,
                                                             .batch_split = o.batch_split,
                                                             .matvec_pass = o.matvec_pass,
                                                             .pre_rows = o.pre_rows,
                                                             .matmul_tile = o.matmul_tile,
                                                             .rows_shape = o.rows_shape,
                                                             .expert_shape = o.expert_shape,
                                                             .attention_prefill = o.attention_prefill,
                                                             .decode_gqa_from = o.decode_gqa_from,
                                                             .delta_chunk_from = o.delta_chunk_from,
                                                             .int_dot = o.int_dot,
                                                             .prompt_digits = o.prompt_digits,
                                                             .prompt_tile = o.prompt_tile,
                                                             .fuse_post_norms = o.fuse_post_norms,
                                                             .fuse_qk_norm = o.fuse_qk_norm,
                                                             .fuse_moe_route = o.fuse_moe_route,
                                                             .fuse_router = o.fuse_router,
                                                             .kernel_dir = o.kernel_dir,
                                                             .dump_shaders_dir = o.dump_shaders_dir,
                                                             .shader_checks = o.shader_checks});
  // A forced matmul tile the adapter cannot run fails here, before any weight moves, not at the first prompt.
  if (!o.matmul_tile.empty()) kernels::matmul_tile(*m.ctx, 512, 4096);
  if (!o.rows_shape.empty()) kernels::rows_config(*m.ctx);
  if (!o.expert_shape.empty()) kernels::expert_matvec_config(*m.ctx, kernels::GpuWeight{}, 1);  // and its limits
  const uint32_t prompt_digits = kernels::prompt_digits(*m.ctx);  // past 3 refused here, before any weight moves
  kernels::prompt_tile(*m.ctx, 64);                               // likewise a tile other than 32 or 64
  // Likewise a forced attention kernel that cannot run this model's heads.
  if (!o.attention_prefill.empty()) {
    kernels::check_attention_variant(*m.ctx, m.config.head_dim);
    if (m.config.head_dim_swa) kernels::check_attention_variant(*m.ctx, m.config.head_dim_swa);  // gemma4's local
  }
  m.gpu = load_gpu_model(*m.ctx, f, m.config, o.progress, o.check_tensors);
  ModelInfo& i = m.info;
  i.adapter = m.ctx->adapter().name;
  i.decode_gqa_from = kernels::decode_gqa_from(*m.ctx);
  i.int_dot = int_dot_on(*m.ctx, m.gpu.config);
  i.prompt_digits = prompt_digits;
  i.fuse_post_norms = fuse_post_norms_on(*m.ctx, m.gpu.config);
  i.fuse_qk_norm = fuse_qk_norm_on(*m.ctx, m.gpu.config);
  i.fuse_rows_rope = fuse_rows_rope_on(*m.ctx);
  i.fuse_moe_route = fuse_moe_route_on(*m.ctx, m.gpu.config);
  i.fuse_router = fuse_router_on(*m.ctx, m.gpu.config);
  if (!o.n_ctx) {
    const ContextSize c = adapter_default_context(*m.ctx, m.gpu);
    i.n_ctx = c.n_ctx, i.n_ctx_capped = c.capped;
  }
  i.weight_bytes = m.gpu.weight_bytes;
  i.kv_bytes = kv_bytes_per_position(m.gpu.config) * i.n_ctx;
  i.conv_state_bytes = conv_state_bytes(m.gpu.config, std::min(m.ubatch, i.n_ctx));  // a session's prefill chunk
  i.bytes_per_token = m.gpu.bytes_per_token;
}

}  // namespace

Model Model::load(const std::string& path, const LoadOptions& options) {
  const GgufFile f = GgufFile::open(path);
  Model model(parse_impl(f, options));
  if (options.before_upload) options.before_upload(model);
  upload_impl(*model.impl_, f, options);
  return model;
}

Model Model::load(std::span<const uint8_t> gguf, const LoadOptions& options, const std::string& label) {
  const GgufFile f = GgufFile::from_bytes(gguf, label);
  Model model(parse_impl(f, options));
  if (options.before_upload) options.before_upload(model);
  upload_impl(*model.impl_, f, options);
  return model;
}

const ModelInfo& Model::info() const { return impl_->info; }

gpu::Context& gpu_context(const Model& model) {
  const ModelAccess::Impl& m = ModelAccess::impl(model);
  if (!m.ctx) throw InvalidArgument("the model's weights are not uploaded yet (before_upload)");
  return *m.ctx;
}

std::vector<int32_t> Model::encode(std::string_view text, bool add_special, bool parse_special) const {
  return impl_->tok().encode(text, add_special, parse_special);
}
std::string Model::decode(std::span<const int32_t> ids, bool skip_special) const {
  return impl_->tok().decode(ids, skip_special);
}
int32_t Model::bos() const { return impl_->tok().bos(); }
int32_t Model::eos() const { return impl_->tok().eos(); }
bool Model::is_end_of_generation(int32_t id) const {
  return std::find(impl_->eog.begin(), impl_->eog.end(), id) != impl_->eog.end();
}

std::string Model::apply_chat_template(std::string_view user, std::string_view system) const {
  return render_user_turn(impl_->chat_format(), impl_->tok(), user, system).text;
}

std::vector<int32_t> Model::encode_chat(std::string_view user, std::string_view system) const {
  const ChatPrompt p = render_user_turn(impl_->chat_format(), impl_->tok(), user, system);
  return impl_->tok().encode(p.text, false, true, p.content);
}

std::vector<int32_t> Model::encode_chat(std::span<const ChatTurn> turns) const {
  ChatInput in;
  for (const ChatTurn& t : turns) in.messages.push_back({{"role", t.role}, {"content", t.content}});
  const Tokenizer& tok = impl_->tok();
  const ChatPrompt p = impl_->chat_format().render(in, bos_text(tok), eos_text(tok), true);
  return tok.encode(p.text, false, true, p.content);
}

namespace {

ChatPrompt render_request(const ChatFormat& format, const Tokenizer& tok, const ChatRequest& r) {
  return format.render(chat_input(r), r.bos_token ? *r.bos_token : bos_text(tok),
                       r.eos_token ? *r.eos_token : eos_text(tok), true);
}

}  // namespace

std::string Model::render_chat(const ChatRequest& request) const {
  return render_request(impl_->chat_format(), impl_->tok(), request).text;
}

std::vector<int32_t> Model::encode_chat(const ChatRequest& request) const {
  const ChatPrompt p = render_request(impl_->chat_format(), impl_->tok(), request);
  return impl_->tok().encode(p.text, false, true, p.content);
}

// ---- TextStream

struct TextStream::Impl {
  StreamDecoder decoder;
};
TextStream::TextStream(const Model& model, bool skip_special, std::vector<int32_t> keep)
    : impl_(
          std::make_unique<Impl>(Impl{StreamDecoder(ModelAccess::impl(model).tok(), skip_special, std::move(keep))})) {}
TextStream::~TextStream() = default;
std::string TextStream::push(int32_t id) { return impl_->decoder.push(id); }
std::string TextStream::flush() { return impl_->decoder.flush(); }

// ---- Session

struct Session::Impl {
  explicit Impl(const Model& m)
      : model(&m),
        gs(uploaded(m), ModelAccess::impl(m).gpu,
           {.n_ctx = m.info().n_ctx,
            .ubatch = ModelAccess::impl(m).ubatch,
            .layers_per_submit = ModelAccess::impl(m).layers_per_submit,
            .argmax_on_gpu = ModelAccess::impl(m).choose_on_gpu}) {}
  // The model's adapter; a model seen by LoadOptions::before_upload has none yet.
  static gpu::Context& uploaded(const Model& m) {
    const ModelAccess::Impl& impl = ModelAccess::impl(m);
    if (!impl.ctx) throw InvalidArgument("Session: the model's weights are not uploaded yet (before_upload)");
    return *impl.ctx;
  }
  const Model* model;
  GpuSession gs;
};

Session::Session(const Model& model) : impl_(std::make_unique<Impl>(model)) {}
Session::~Session() = default;
Session::Session(Session&&) noexcept = default;

std::vector<float> Session::feed(std::span<const int32_t> tokens) { return impl_->gs.forward(tokens); }
std::vector<std::vector<float>> Session::feed_all(std::span<const int32_t> tokens) {
  return impl_->gs.forward_all(tokens);
}
void Session::feed_rows(std::span<const int32_t> tokens, uint32_t first, const OnLogits& on_logits) {
  impl_->gs.forward_rows(tokens, first, on_logits);
}
uint32_t Session::decode_greedy(int32_t token, uint32_t max_new, const std::function<bool(int32_t)>& on_id) {
  return impl_->gs.decode_greedy(token, max_new, on_id);
}
namespace {

// Decodes after `token` (which `sampler` has seen): each step's token chosen as sampler.sample() would choose it,
// on the GPU (the argmax, or sample.wgsl with the sampler's uniforms and recent ids) or on the host.
uint32_t decode_with(GpuSession& gs, Sampler& sampler, int32_t token, uint32_t max_new,
                     const std::function<bool(int32_t)>& on_id) {
  auto take = [&](int32_t id) {
    sampler.accept(id);
    return !on_id || on_id(id);
  };
  const SamplingParams& p = sampler.params();
  if (p.host || !gs.chooses_on_gpu()) {  // each step's logits to the host
    uint32_t chosen = 0;
    for (int32_t id = token; chosen < max_new && gs.n_past() < gs.n_ctx();) {
      id = sampler.sample(gs.forward(std::span(&id, 1)));
      ++chosen;
      if (on_id && !on_id(id)) break;
    }
    return chosen;
  }
  if (sampler.argmax_only()) return gs.decode_greedy(token, max_new, take);
  DecodeSampling ds;
  ds.settings = sample_settings(p);
  ds.next_uniform = [&] { return sampler.next_uniform(); };
  if (p.repeat_penalty != 1.f && p.repeat_last_n != 0) {
    const uint64_t all = uint64_t(gs.n_ctx()) + 1;  // more ids than a session can hold
    ds.window = uint32_t(p.repeat_last_n > 0 ? std::min<uint64_t>(p.repeat_last_n, all) : all);
    ds.recent.assign(sampler.recent().begin(), sampler.recent().end());
    if (ds.recent.size() > ds.window) ds.recent.erase(ds.recent.begin(), ds.recent.end() - ds.window);
  }
  return gs.decode_sampled(token, max_new, ds, take);
}

}  // namespace

uint32_t Session::decode(int32_t token, uint32_t max_new, const SamplingParams& sampling,
                         const std::function<bool(int32_t)>& on_id) {
  Sampler sampler(sampling);
  for (int32_t id : impl_->gs.tokens()) sampler.accept(id);
  sampler.accept(token);
  return decode_with(impl_->gs, sampler, token, max_new, on_id);
}

uint32_t Session::n_past() const { return impl_->gs.n_past(); }
uint32_t Session::n_ctx() const { return impl_->gs.n_ctx(); }
Session::DecodeHostTime Session::decode_host_time() const {
  const GpuSession::HostTime t = impl_->gs.decode_host_time();
  return {t.steps, t.seconds};
}
void Session::reset() { impl_->gs.reset(); }
void Session::truncate(uint32_t n) { impl_->gs.truncate(n); }

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::EndOfGeneration: return "eog";
    case StopReason::Length: return "length";
    case StopReason::Context: return "context";
    case StopReason::Caller: return "caller";
  }
  return "?";
}

GenerateResult Session::generate(std::span<const int32_t> prompt, const SamplingParams& sampling, uint32_t max_tokens,
                                 const OnToken& on_token) {
  using clock = std::chrono::steady_clock;
  GpuSession& gs = impl_->gs;
  const Model& model = *impl_->model;
  if (prompt.empty()) throw InvalidArgument("the prompt is empty");
  if (uint64_t(gs.n_past()) + prompt.size() > gs.n_ctx())
    throw InvalidArgument("the prompt has " + std::to_string(prompt.size()) + " tokens, more than the context of " +
                          std::to_string(gs.n_ctx() - gs.n_past()) + " left (raise -c)");
  GenerateResult r;
  r.n_prompt = uint32_t(prompt.size());
  Sampler sampler(sampling);
  for (int32_t id : prompt) sampler.accept(id);
  const auto t0 = clock::now();
  std::vector<float> logits = gs.forward(prompt);
  const auto t1 = clock::now();
  r.prompt_seconds = std::chrono::duration<double>(t1 - t0).count();

  TextStream stream(model);
  bool caller_stopped = false;
  // Takes one sampled id; false when generation ends with it.
  auto take = [&](int32_t id) {
    r.tokens.push_back(id);
    r.stopped_by_eog = model.is_end_of_generation(id);
    const std::string text = r.stopped_by_eog ? std::string() : stream.push(id);
    r.text += text;
    if (on_token && !on_token(id, text)) {
      caller_stopped = true;
      return false;
    }
    return !r.stopped_by_eog && r.tokens.size() < max_tokens;
  };
  int32_t id = max_tokens > 0 ? sampler.sample(logits) : -1;
  if (max_tokens > 0 && take(id)) decode_with(gs, sampler, id, max_tokens - 1, take);
  r.stop_reason = r.stopped_by_eog                ? StopReason::EndOfGeneration
                  : caller_stopped                ? StopReason::Caller
                  : r.tokens.size() >= max_tokens ? StopReason::Length
                                                  : StopReason::Context;
  const std::string rest = stream.flush();
  r.text += rest;
  if (on_token && !rest.empty()) on_token(-1, rest);
  r.generate_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return r;
}

}  // namespace wgllm
