// wgllm's library API: load a GGUF model onto a WebGPU adapter, tokenize, run a session, sample and generate.
//
//   auto model = wgllm::Model::load("model.gguf", {.n_ctx = 2048});
//   wgllm::Session session(model);
//   session.generate(model.encode("Once upon a time", true), {.temperature = 0.8f},
//                    [](int32_t id, std::string_view text) { std::fputs(std::string(text).c_str(), stdout); return
//                    true; });
//
// Every failure throws a wgllm::Error (wgllm/error.h) whose message is one line.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "wgllm/chat.h"
#include "wgllm/error.h"

namespace wgllm {

class Model;

struct LoadOptions {
  std::string adapter;  // "" = best adapter; an index or a name part (see `wgllm info --list`)
  // 0 = the model's context, capped so the KV cache fits the memory budget. Any other value is taken as given: past
  // the model's training context is allowed (positions the model never saw; quality usually drops), and a cache
  // larger than the adapter can bind fails when a Session is made.
  uint32_t n_ctx = 0;
  uint32_t ubatch = 512;  // most prompt tokens per GPU step
  // Command buffers per step: submitted after layer 0 and then every this many layers, so the GPU starts
  // while the rest is encoded (0: one per step; unset: 4 on GPUs, 0 on CPU adapters).
  std::optional<uint32_t> layers_per_submit = std::nullopt;
  // Where decoding chooses each token (the greedy argmax, or a draw with the sampling parameters): true on the GPU,
  // each step queued before the last id is back and only the id read back; false on the host from each step's
  // logits; unset: the GPU, except on CPU adapters (where the "GPU" shares the cores and the readback costs little).
  // Both choose the same tokens (up to floating-point ties). SamplingParams::host forces the host per call.
  std::optional<bool> choose_on_gpu = std::nullopt;
  // A decode step whose attention reaches this depth (keys attended besides the new token: its position, or the
  // sliding window) uses the GQA-grouped attention kernel, which reads each cached K/V row once per KV head instead
  // of once per query head. 0: always; more than n_ctx: never; unset: the adapter's (ModelInfo::decode_gqa_from):
  // 8192 on GPUs, where it is ahead on long contexts and behind on short ones, 0 on CPU adapters, where it is ahead
  // at every depth. Sequences decoded together by BatchEngine's shared pool keep the per-head kernel.
  std::optional<uint32_t> decode_gqa_from = std::nullopt;
  // Gated DeltaNet layers (qwen35) run a call of this many tokens or more in chunks of 16 (the WY / UT form of the
  // recurrence) instead of one token after another; unset: never (the CLI reads $WGLLM_DELTA_CHUNK_FROM): a tuning
  // knob for benchmarks.
  std::optional<uint32_t> delta_chunk_from = std::nullopt;
  // BatchEngine's steps of this many sequences or more run their weight products on the tiled kernel in the batch
  // matvec's order (each sequence's bits as alone; GPUs), whatever the product's rows; 0: never; unset: 32 sequences
  // and products of 8,192 rows or more or that split (batch_split), 16 and 65,536 (the CLI reads
  // $WGLLM_BATCH_TILE_FROM): a tuning knob for benchmarks.
  std::optional<uint32_t> batch_tile_from = std::nullopt;
  // Those tiled products split over this many groups of lane classes (a workgroup per tile and group, a dispatch
  // adding the groups); 1: never; unset: where a product has too few tiles to fill the GPU (the CLI reads
  // $WGLLM_BATCH_SPLIT): a tuning knob for benchmarks.
  std::optional<uint32_t> batch_split = std::nullopt;
  // Batch decode's matvec: tokens per pass over the weights, 8 or 16 (a token's bits are the same either way; the CLI
  // reads $WGLLM_MATVEC_PASS); unset: 16. A tuning knob for benchmarks.
  std::optional<uint32_t> matvec_pass = std::nullopt;
  // Decoding with fuse_post_norms, the products that take a post norm in their prologue: workgroups of at least this
  // many rows (every workgroup reads the prologue's three vectors; the CLI reads $WGLLM_PRE_ROWS); unset: the
  // product's own shape. A tuning knob for benchmarks.
  std::optional<uint32_t> pre_rows = std::nullopt;
  // Decoding, the FFN's Q4_K gate/up products and a Q4_K / Q6_K LM head on packed int8 dot products (the normed input
  // as three 8-bit digits per element under one scale per 32: 23 bits against the block's largest element instead of
  // f32's 24 per element; PERF.md). Unset: on GPUs for models whose FFN input is 2,048 wide or more (Llama-3.1-8B
  // Q4_K_M decodes 9 % faster on the H200; narrower ones gain nothing), off on CPU adapters (ModelInfo::int_dot).
  // Sessions decoded by BatchEngine keep the f32 products.
  std::optional<bool> int_dot = std::nullopt;
  // Prompt processing, the Q4_K, Q6_K and Q8_0 weight products on packed int8 dot products: x as this many 8-bit digits
  // per element under one scale per 32 elements, 1 to 3 (3: within about 2^-23 of each block's largest element; 1:
  // llama.cpp's 8-bit activations, the fastest and least exact). 0: f32 products. Unset: 3 on GPUs for products of 16
  // tokens or more (Q4_K_M pp16-pp512 7-18 % faster on the H100 than f32, perplexity within 0.002 %), 0 on CPU adapters
  // (ModelInfo::prompt_digits; the CLI reads $WGLLM_PROMPT_DIGITS). A mixture of experts' products take them where a
  // prompt gives its experts 16 or more pairs each on average (tiles of 32 pairs of one expert).
  std::optional<uint32_t> prompt_digits = std::nullopt;
  // Those products' workgroups: 64 (64 tokens x 64 rows) or 32 (32 tokens x 128 rows), a mixture's expert tiles too.
  // Unset: 64 for the dense products, the pairs' share's for the experts (the CLI reads $WGLLM_PROMPT_TILE). A tuning
  // knob for benchmarks.
  std::optional<uint32_t> prompt_tile = std::nullopt;
  // Decoding, gemma's post norms (their residual adds) in the next product's prologue instead of dispatches of their
  // own (ContextOptions::fuse_post_norms). Unset: on GPUs for gemma3 (Gemma 3 270M decodes 5-20 % faster on the
  // H200; Gemma 4's Q4_K_M 3-6 % slower), off otherwise and on CPU adapters (ModelInfo::fuse_post_norms).
  std::optional<bool> fuse_post_norms = std::nullopt;
  // Decoding one sequence, the new token's per-head q/k norms, RoPE and KV append inside the attention dispatch
  // (models with q/k norms: qwen3, gemma3/4, lfm2, qwen35; ContextOptions::fuse_qk_norm): one dispatch fewer a layer,
  // the same bits. Unset: on GPUs (Gemma 3 270M decodes 5-6 % faster on the H100, Gemma 4 small 3.5 %, the others
  // 0.3-2 %), off on CPU adapters (ModelInfo::fuse_qk_norm). BatchEngine's steps over one KV pool do the same for
  // every sequence in one dispatch, for every model (RoPE and the append alone where there are no q/k norms): unset,
  // on every adapter (on lavapipe one stream 13-39 % faster; not yet measured on a GPU).
  std::optional<bool> fuse_qk_norm = std::nullopt;
  // Decoding a mixture of experts, each token's routing inside its experts' gate/up products, every workgroup
  // choosing its pair's expert from the router's logits, instead of a dispatch of its own (ContextOptions::
  // fuse_moe_route): one dependent link fewer a MoE layer, the same bits. Unset: off (each gate/up workgroup ranks
  // the experts before its first weight load, which costs more than the link: the H200 1-3 % slower with it,
  // lavapipe's real-shape expert layers 5-59 %); ModelInfo::fuse_moe_route.
  std::optional<bool> fuse_moe_route = std::nullopt;
  // Decoding one sequence of a mixture of experts, the router's product choosing the token's experts itself (one
  // workgroup walks the router's rows, then ranks them) instead of a routing dispatch after it (ContextOptions::
  // fuse_router): one dependent link fewer a MoE layer, the same bits. Unset: off (H100: slower, the one workgroup's
  // walk costs more than the dispatch it saves: LFM2-8B-A1B Q4_K_M tg128 -10 %, Qwen3-30B-A3B -27 %);
  // ModelInfo::fuse_router.
  std::optional<bool> fuse_router = std::nullopt;
  // Called while weights upload: bytes done, bytes in all.
  std::function<void(uint64_t done, uint64_t total)> progress;
  // Called once the GGUF is parsed, before the adapter is opened and the weights upload: the tokenizer and chat
  // template work, info() holds what the file says (adapter, weight_bytes and bytes_per_token are still empty; n_ctx
  // is this n_ctx, 0 when the default is yet to be chosen). A throw stops the load: a caller can reject its input
  // (a prompt longer than the context, say) without waiting for the upload. No Session can be made from it.
  std::function<void(const Model& model)> before_upload = nullptr;
  // Every weight is scanned for NaN and infinities before it uploads (a ModelError names the tensor and element):
  // such a model would compute NaN and sample garbage. Off skips the scan (it reads each weight once more on the
  // CPU; PERF.md gives its cost).
  bool check_tensors = true;
  // A Jinja chat template used instead of the file's tokenizer.chat_template (its source text; "" : the file's).
  std::string chat_template = {};
  // Developer aids ("" = off; the library never reads the environment, the wgllm CLI fills these from
  // $WGLLM_KERNEL_DIR, $WGLLM_DUMP_SHADERS and $WGLLM_SHADER_CHECKS): a kernel file in kernel_dir (e.g. matvec.wgsl)
  // replaces the built-in one of that name; dump_shaders_dir receives every WGSL source exactly as compiled;
  // shader_checks
  // ($WGLLM_SHADER_CHECKS=1) compiles every kernel with naga's index clamps and loop bounds.
  std::string kernel_dir = {};
  std::string dump_shaders_dir = {};
  bool shader_checks = false;
  // The tiled matmul's shape for every prefill product, "TOKENSxROWS[/TTxTR][xf16]" ("" = chosen per product; the CLI
  // reads $WGLLM_MATMUL_TILE): a tuning knob for benchmarks.
  std::string matmul_tile = {};
  // CPU adapters' product kernel (matmul_rows.wgsl), "WORKGROUPxROWSxTOKENS" or "off" (the GPUs' kernels instead;
  // "" = the default; the CLI reads $WGLLM_ROWS_SHAPE): a tuning knob for benchmarks.
  std::string rows_shape = {};
  // The MoE expert products' matvec shape, "THREADSxROWSxGROUPS[xUNITS]" ("" = chosen per weight; the CLI reads
  // $WGLLM_EXPERT_SHAPE): a tuning knob for benchmarks.
  std::string expert_shape = {};
  // The prefill attention kernel: "f32", "f16" or "BQxBKxCGxf16" ("" = chosen per adapter: f16 arithmetic on GPUs
  // with shader-f16 where head_dim is 64 or 128, f32 otherwise; the CLI reads $WGLLM_ATTENTION): a tuning knob
  // for benchmarks.
  std::string attention_prefill = {};
};

// What a loaded model is and what it takes.
struct ModelInfo {
  std::string arch;         // "llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "lfm2"
  std::string adapter;      // adapter name
  std::string weight_type;  // GGUF type of the layer matrices ("Q8_0", "F16", ...)
  uint64_t n_params = 0;
  uint32_t n_vocab = 0, n_embd = 0, n_layer = 0;
  uint32_t n_ctx_train = 0;
  uint32_t n_ctx = 0;            // the context sessions get
  bool n_ctx_capped = false;     // n_ctx was lowered from n_ctx_train to fit the memory budget
  uint64_t weight_bytes = 0;     // GPU memory of the weights
  uint64_t kv_bytes = 0;         // GPU memory of one session's KV cache (f16)
  uint64_t bytes_per_token = 0;  // weight bytes one decode step reads
  // One letter per layer: A attention, L local (sliding-window) attention, C short convolution (lfm2).
  std::string layer_pattern;
  uint32_t n_expert = 0, n_expert_used = 0;  // mixtures of experts: experts per layer, chosen per token (0: dense)
  // GPU memory of one session's conv and recurrent states (lfm2, qwen35; 0 without such layers)
  uint64_t conv_state_bytes = 0;
  uint32_t decode_gqa_from = 0;   // the depth from which decode attention runs per GQA group (LoadOptions'; resolved)
  bool int_dot = false;           // decoding takes the Q4_K FFN products and the LM head on int8 digits (LoadOptions')
  bool fuse_post_norms = false;   // decoding runs post norms in the next product's prologue (LoadOptions'; resolved)
  bool fuse_qk_norm = false;      // decoding runs the q/k norms and the KV append in attention (LoadOptions'; resolved)
  bool fuse_rows_rope = false;    // BatchEngine's steps over one KV pool likewise, every model (fuse_qk_norm; resolved)
  bool fuse_moe_route = false;    // decoding picks MoE experts inside the gate/up products (LoadOptions'; resolved)
  bool fuse_router = false;       // decoding picks MoE experts inside the router's product (LoadOptions'; resolved)
  uint32_t prompt_digits = 0;     // prompt products of K-quant/Q8_0 weights on x's int8 digits (LoadOptions'; resolved)
};

// Sampling, with llama.cpp's filters and order: repetition penalty, top-k, top-p, min-p, temperature; then a draw
// with one uniform per step from a std::mt19937_64 seeded with `seed` (src/cpu/sample.h defines the algorithm; the
// GPU runs the same one, so a seed gives the same tokens on either).
struct SamplingParams {
  float temperature = 0.8f;     // <= 0: greedy (argmax after the penalty), deterministic
  int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off; keeps tokens with p >= min_p * p_max
  float repeat_penalty = 1.0f;  // 1: off; positive logits of recent tokens divided, negative ones multiplied
  int32_t repeat_last_n = 64;   // how many recent tokens the penalty looks at (-1: all)
  uint64_t seed = 0;
  bool host = false;  // choose on the host from each step's logits read back, whatever LoadOptions::choose_on_gpu says
};
// Throws InvalidArgument naming the first parameter out of its range: temperature must be finite, top_p and min_p in
// [0, 1], repeat_penalty finite and > 0, repeat_last_n >= -1. Every sampler of the library checks its parameters so.
void validate(const SamplingParams& params);

class Model {
 public:
  static Model load(const std::string& path, const LoadOptions& options = {});
  // A GGUF held in memory (copied; `label` names it in errors).
  static Model load(std::span<const uint8_t> gguf, const LoadOptions& options = {},
                    const std::string& label = "<memory>");
  ~Model();
  Model(Model&&) noexcept;
  Model& operator=(Model&&) noexcept;

  const ModelInfo& info() const;

  // ---- tokenizer
  // add_special: BOS (and EOS) as the model's tokenizer says. parse_special: control tokens written in the text
  // (`<|im_start|>`) become their ids, for raw prompts that spell out a format; off, they are text like any other.
  std::vector<int32_t> encode(std::string_view text, bool add_special = true, bool parse_special = true) const;
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  int32_t bos() const;
  int32_t eos() const;
  // End of generation: EOS or a chat turn end (<|im_end|>, <|eot_id|>, </s>) present in the vocabulary.
  bool is_end_of_generation(int32_t id) const;
  // The model's chat template applied to one user message (and a system message when not empty), ending with the
  // assistant's turn opener. The file's Jinja template (or LoadOptions::chat_template) renders it; a file without
  // one gets its architecture's built-in template (Gemma's for gemma files). Throws Error when it has neither, or
  // where the template fails or raises (its line and column).
  std::string apply_chat_template(std::string_view user, std::string_view system = "") const;
  // The same prompt as token ids: the template's markers become control tokens, while the messages are text
  // whatever they hold (a control token typed into a message cannot open a turn of its own).
  std::vector<int32_t> encode_chat(std::string_view user, std::string_view system = "") const;
  // A conversation in the model's template, ending with the assistant's turn opener, as ids. A model with neither
  // a template nor a built-in one gets ChatML, as llama.cpp's server gives it (the one-message encode_chat above
  // throws instead); the built-in ones take the roles "system", "user", "assistant" only (InvalidArgument).
  struct ChatTurn {
    std::string role;
    std::string content;
  };
  std::vector<int32_t> encode_chat(std::span<const ChatTurn> turns) const;
  // Any request (tool calls, tools, template variables; wgllm/chat.h) as the model's template renders it, falling
  // back as encode_chat(turns) does; its text, and its ids (markers as control tokens, contents as text).
  std::string render_chat(const ChatRequest& request) const;
  std::vector<int32_t> encode_chat(const ChatRequest& request) const;

 private:
  friend class ModelAccess;  // the library's own sources (src/api/model_impl.h)
  struct Impl;
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenization for streaming: every chunk is whole UTF-8 characters.
class TextStream {
 public:
  // keep: control tokens written even when skip_special (a chat format's markers: <think>, [TOOL_CALLS], ...).
  explicit TextStream(const Model& model, bool skip_special = true, std::vector<int32_t> keep = {});
  ~TextStream();
  std::string push(int32_t id);
  std::string flush();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Why generation ended.
enum class StopReason {
  EndOfGeneration,  // the model ended its text (EOS or a turn end)
  Length,           // max_tokens were generated
  Context,          // the context is full: no position is left for another token (raise the context)
  Caller,           // on_token returned false
};
// "eog", "length", "context", "caller".
const char* stop_reason_name(StopReason r);

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (the end-of-generation token included when one stopped it)
  std::string text;             // their text (special tokens skipped)
  uint32_t n_prompt = 0;
  double prompt_seconds = 0;    // prompt processing
  double generate_seconds = 0;  // every decode step
  StopReason stop_reason = StopReason::Length;
  bool stopped_by_eog = false;  // stop_reason == EndOfGeneration
};

// One sequence with its own KV cache. The model must outlive the session. Making the first session of a model
// also compiles its kernels (later ones reuse them), so the first prompt is not charged for that.
class Session {
 public:
  explicit Session(const Model& model);
  ~Session();
  Session(Session&&) noexcept;

  // Appends tokens (prefill in ubatch chunks) and returns the logits [n_vocab] of the last one.
  std::vector<float> feed(std::span<const int32_t> tokens);
  // Logits of every token fed: [tokens][n_vocab].
  std::vector<std::vector<float>> feed_all(std::span<const int32_t> tokens);
  // Appends tokens as feed does, and hands the logits of tokens [first, tokens.size()) to on_logits a block of rows
  // at a time (never [tokens][n_vocab] at once: a large vocabulary takes 1 MiB per row): on_logits(row, logits)
  // gets rows row, row + 1, ... of `tokens` as [n][n_vocab], in order; the span is valid during the call only.
  using OnLogits = std::function<void(uint32_t row, std::span<const float> logits)>;
  void feed_rows(std::span<const int32_t> tokens, uint32_t first, const OnLogits& on_logits);

  // Greedy decoding with the argmax taken on the GPU: feeds `token`, then each step's argmax is the next step's
  // input without a round trip to the host (the next step is queued before the current one's id is read back; on a
  // CPU adapter, where that gains nothing, each step's logits are read back and the argmax taken on the host, with
  // the same choice: the lowest id among equal logits). on_id gets each chosen id; stops after max_new ids, at a full
  // context, or when on_id returns false. Returns the ids chosen; n_past() then counts `token` and every chosen id but
  // the last, as if each were fed.
  uint32_t decode_greedy(int32_t token, uint32_t max_new, const std::function<bool(int32_t id)>& on_id = {});
  // As decode_greedy, with each token chosen by `sampling` (the penalty's window starts with the cached tokens and
  // `token`): on the GPU where LoadOptions::choose_on_gpu says so (each step queued before the last id is back), on
  // the host from each step's logits otherwise or with sampling.host. Returns the ids chosen.
  uint32_t decode(int32_t token, uint32_t max_new, const SamplingParams& sampling,
                  const std::function<bool(int32_t id)>& on_id = {});

  // Feeds the prompt, then samples up to max_tokens tokens (stopping at end of generation, a full context or when
  // on_token returns false); after the first token, each is chosen as decode() chooses it. on_token gets
  // each id and its text as a TextStream chunk (may be empty), and at the end id -1 with text held back by the
  // stream, if any. The prompt must fit the context (InvalidArgument before any work otherwise).
  using OnToken = std::function<bool(int32_t id, std::string_view text)>;
  GenerateResult generate(std::span<const int32_t> prompt, const SamplingParams& sampling, uint32_t max_tokens,
                          const OnToken& on_token = {});

  uint32_t n_past() const;
  uint32_t n_ctx() const;
  // The host's work in decoding with the token chosen on the GPU, over the session's life: the steps, and the time
  // spent encoding and submitting them (while the GPU runs the step before). Where seconds / steps comes near the
  // time of a step, decoding is bound by the host. No steps on CPU adapters or with host sampling.
  struct DecodeHostTime {
    uint64_t steps = 0;
    double seconds = 0;
  };
  DecodeHostTime decode_host_time() const;
  // Forgets every cached position.
  void reset();
  // Keeps the first n cached positions (n <= n_past()) and forgets the rest, as if only those n tokens had been fed
  // (a model with convolution layers may feed them again when n is more than a prefill chunk back; InvalidArgument
  // for n > n_past()).
  void truncate(uint32_t n);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace wgllm
