// The GPU forward pass of the decoder (llama / qwen2 / qwen3 / qwen3moe / gemma3 / lfm2 / lfm2moe / gpt-oss / qwen35): weights uploaded from a GGUF in
// their own types (GpuModel) and one sequence's run state with its paged f16 KV cache (GpuSession). Prefill runs in
// chunks of `ubatch` tokens, decode one token at a time; each chunk or token is encoded into a few command buffers
// (the GPU starts on the first layers while the rest is encoded), and only the logits are read back. Per layer and
// token: the q/k/v projection with the norm folded in, RoPE of q and k, KV append, attention, the output projection
// added to the residual, gate/up with the norm folded in and SwiGLU, the down projection added to the residual.
// Decoding, the q/k/v projection also does the RoPE and the KV append (5 dispatches per layer); with qwen3's q/k norm
// the attention's dispatch does the norm, the RoPE and the append (5; fuse_qk_norm_on). lfm2's convolution layers run
// in_proj (norm folded in), the short convolution with its conv state, and out_proj (3 dispatches, then the FFN's 2).
// Greedy decoding (decode_greedy) takes the argmax on the GPU and feeds it to the next step there, so steps run back
// to back while the host reads the ids behind them.
// Where it lives: loading in load.cpp; the blocks a layer is made of (attention, FFN, short convolution) in
// blocks.cpp; each architecture's layer program (which weights a layer uploads, which blocks it runs) in
// model/arch/, registered in arch/arch.h; the per-sequence state (KV caches, conv states) in state.h; the session's
// buffers, steps, decoding loops and logits here (transformer.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "gpu/batch.h"
#include "kernels/kv_cache.h"
#include "kernels/sample.h"
#include "kernels/weight.h"
#include "model/config.h"
#include "model/state.h"

namespace wgllm {

class GgufFile;
struct SessionBuffers;
struct LayerProgram;
enum class DecodeQkv : uint8_t;

// Every matrix is a GGUF weight of ne = [in, out] (row-major [out][in]); vectors are f32. Norm weights are padded
// with zeros to a multiple of 8 floats (the matmul kernels fold the norm in and read them as vec4).
// Projections that read the same input are fused when their tensors share a type: q, k and v stacked into one
// weight (one dispatch writes q, k and v), gate and up interleaved row by row (one dispatch writes SwiGLU of the
// pair). Otherwise the separate weights are used.
struct GpuLayer {
  gpu::Buffer attn_norm;         // [n_embd] f32
  kernels::GpuWeight wqkv;       // [q_dim + 2 kv_dim][n_embd] = wq, wk, wv stacked; empty when not fused
  gpu::Buffer bqkv;              // [q_dim + 2 kv_dim] f32 stacked biases (qwen2; with wqkv, or with wqk for decode)
  kernels::GpuWeight wqk;        // [q_dim + kv_dim][n_embd] = wq, wk stacked when wv alone differs in type (Q4_K_M
                                 // files keep some layers' v in Q6_K); wv then holds v; empty otherwise
  gpu::Buffer bqk;               // [q_dim + kv_dim] f32 stacked biases (qwen2, with wqk; bv then holds v's)
  kernels::GpuWeight wq;         // [q_dim][n_embd]  (llama: rows permuted for adjacent-pair RoPE, as in the file)
  kernels::GpuWeight wk;         // [kv_dim][n_embd]
  kernels::GpuWeight wv;         // [kv_dim][n_embd]
  gpu::Buffer bq, bk, bv;        // [q_dim], [kv_dim], [kv_dim] f32; qwen2 only, not fused (size 0 otherwise)
  gpu::Buffer q_norm, k_norm;    // [head_dim] f32 each, shared by every head; qwen3 / gemma3 (size 0 otherwise)
  kernels::GpuWeight wo;         // [n_embd][q_dim]
  gpu::Buffer bo;                // [n_embd] f32 output projection bias; gpt-oss only (size 0 otherwise)
  gpu::Buffer attn_sinks;        // [n_head] f32 per-head sink logits; gpt-oss only
  gpu::Buffer ffn_norm;          // [n_embd] f32 (gpt-oss: post_attention_norm)
  kernels::GpuWeight w_gate_up;  // [2 n_ff][n_embd]: gate row i at 2i, up row i at 2i + 1; empty when not fused
  kernels::GpuWeight w_gate;     // [n_ff][n_embd]
  kernels::GpuWeight w_up;       // [n_ff][n_embd]
  kernels::GpuWeight w_down;     // [n_embd][n_ff]
  gpu::Buffer post_attn_norm;    // [n_embd] f32; gemma3 only (size 0 otherwise): x += norm(attn Wo)
  gpu::Buffer post_ffn_norm;     // [n_embd] f32; gemma3 only: x += norm(act Wdown)
  // lfm2 short-convolution layers (config.is_conv) have these instead of the attention weights; attn_norm is the
  // operator norm, folded into in_proj: x += out_proj(C * conv(B * x)) with B, C, x = norm(x) in_proj.
  kernels::GpuWeight in_proj;   // [3 n_embd][n_embd]
  gpu::Buffer conv;             // [n_embd][l_cache] f32 taps
  kernels::GpuWeight out_proj;  // [n_embd][n_embd]
  // qwen35's attention layers: the gate rows of attn_q (each head's second half), x += (attn * sigmoid(norm(x)
  // wgate)) wo; wq (or wqkv) holds the first halves.
  kernels::GpuWeight wgate;  // [q_dim][n_embd]
  // qwen35's gated DeltaNet layers (config.is_delta) have these instead of the attention weights; attn_norm is the
  // operator norm, folded into the in-projections (kernels/delta_net.h for the rest).
  kernels::GpuWeight ssm_in;     // [W + v_heads dv + 2 v_heads][n_embd] = attn_qkv, attn_gate, ssm_alpha, ssm_beta
                                 // stacked when they share a type (W = config.delta_conv_dim()); empty otherwise
  kernels::GpuWeight ssm_zab;    // [v_heads dv + 2 v_heads][n_embd] = attn_gate, ssm_alpha, ssm_beta stacked when
                                 // they share a type and attn_qkv has another (Q4_K_M's Q6_K layers); else empty
  kernels::GpuWeight ssm_qkv;    // [W][n_embd]   (not in ssm_in)
  kernels::GpuWeight ssm_z;      // [v_heads dv][n_embd]   (in neither)
  kernels::GpuWeight ssm_alpha;  // [v_heads][n_embd]   (in neither)
  kernels::GpuWeight ssm_beta;   // [v_heads][n_embd]   (in neither)
  gpu::Buffer ssm_conv;          // [W][ssm_conv] f32 taps
  gpu::Buffer ssm_consts;        // [2 v_heads] f32: dt_bias, then a = -exp(A_log)
  gpu::Buffer ssm_norm;          // [dv] f32, shared by every value head
  kernels::GpuWeight ssm_out;    // [n_embd][v_heads dv]
  // Mixtures of experts (config.is_moe()) have these instead of the dense FFN's gate/up and down: x += the chosen
  // experts' down(act(norm(x) gate_e) * (norm(x) up_e)), weighted by the router (kernels/moe.h).
  kernels::GpuWeight router;        // [n_expert][n_embd] ffn_gate_inp
  kernels::GpuWeight exps_gate_up;  // [n_expert][2 n_ff_exp][n_embd]: each expert's gate and up rows interleaved
  kernels::GpuWeight exps_gate;     // [n_expert][n_ff_exp][n_embd], when gate and up differ in type (else empty)
  kernels::GpuWeight exps_up;       // [n_expert][n_ff_exp][n_embd], likewise
  kernels::GpuWeight exps_down;     // [n_expert][n_embd][n_ff_exp]
  gpu::Buffer exp_probs_b;          // [n_expert] f32 selection bias (sigmoid gating, lfm2moe); size 0 otherwise
  // gpt-oss's biases (config.moe_bias; size 0 otherwise), laid out as the weights' rows
  gpu::Buffer router_b;                  // [n_expert]
  gpu::Buffer exps_gate_up_b;            // [n_expert][2 n_ff_exp], gate and up interleaved as exps_gate_up
  gpu::Buffer exps_gate_b, exps_up_b;    // [n_expert][n_ff_exp] each, with exps_gate and exps_up
  gpu::Buffer exps_down_b;               // [n_expert][n_embd]
  // gemma4 (size 0 / empty otherwise; its q/k/v shapes are the layer's own, config.*_at): a layer sharing another's
  // KV cache has only wq; one whose v is k has wqkv = wq, wk, wk stacked (or wq, wk, wk separately).
  gpu::Buffer v_norm;                    // [head_dim] f32 ones: the v heads' RMSNorm without gain
  kernels::GpuWeight ple_gate;           // [P][n_embd] inp_gate: the per-layer embedding's gate
  kernels::GpuWeight ple_proj;           // [n_embd][P] proj
  gpu::Buffer ple_post_norm;             // [n_embd] f32 post_norm: x += norm(ple_proj(...)) post_norm
  float out_scale = 1.f;                 // layer_output_scale: x *= it after the layer (config.layer_out_scale)
};

struct GpuWeights {
  kernels::GpuWeight token_embd;  // [n_vocab][n_embd]: row t is the embedding of token t
  std::vector<GpuLayer> layers;   // [n_layer]
  gpu::Buffer output_norm;        // [n_embd] f32
  kernels::GpuWeight output;      // [n_vocab][n_embd]; empty when tied (logits use token_embd)
  gpu::Buffer rope_table;         // [rope_dim / 2] x 16 bytes: upload_rope_table (llama3 factors folded in)
  gpu::Buffer rope_table_swa;     // the same for local (sliding-window) layers' rope_base_swa; size 0 without
  // gemma4's per-layer embeddings (config.n_embd_per_layer P > 0; empty otherwise)
  kernels::GpuWeight per_layer_token_embd;  // [n_vocab][n_layer P]
  kernels::GpuWeight per_layer_model_proj;  // [n_layer P][n_embd]
  gpu::Buffer per_layer_proj_norm;          // [P] f32
  const gpu::Buffer& layer_rope_table(const ModelConfig& c, uint32_t layer) const {
    return c.is_swa(layer) ? rope_table_swa : rope_table;
  }
};

struct GpuModel {
  ModelConfig config;
  GpuWeights weights;
  uint64_t weight_bytes = 0;     // GPU memory taken by the weights
  uint64_t bytes_per_token = 0;  // weight bytes one decode step reads (every matrix once, embedding row aside)
  const kernels::GpuWeight& logits_weight() const {
    return config.tied_embeddings ? weights.token_embd : weights.output;
  }
};

// The decode options (ContextOptions::int_dot, fuse_post_norms) as set, or where unset as measured on the H200
// (PERF.md, "The decode options on the H200"), both off on CPU adapters:
// - int8 FFN products (Q4_K gate/up) and LM head (Q4_K or Q6_K) where the FFN input is at least kIntDotAutoWidth wide
//   (the FFN's: Llama-3.1-8B Q4_K_M +9 %, Llama-3.2-1B +1-5 %; Gemma 4 small's 1,536 -1 %: a lane has under one
//   64-weight unit a row);
// - post norms in the next product's prologue for gemma3 (Gemma 3 270M +5-20 %); not gemma4, whose Q4_K_M lost 3-6 %.
inline constexpr uint32_t kIntDotAutoWidth = 2048;
bool int_dot_on(const gpu::Context& ctx, const ModelConfig& c);
bool fuse_post_norms_on(const gpu::Context& ctx, const ModelConfig& c);
// ContextOptions::fuse_qk_norm as set; unset: on GPUs for the models with per-head q/k norms (on the H100 Gemma 3
// 270M +5-6 %, Qwen3-0.6B +1-2 %, LFM2-350M, Qwen3.5-0.8B and Gemma 4 small +0.3-1.5 %; PERF.md), off on CPU adapters
// (lavapipe decodes with the grouped attention kernel, which does not take the new token itself).
bool fuse_qk_norm_on(const gpu::Context& ctx, const ModelConfig& c);
// Batched steps over one KV pool: each sequence's q/k norms (where the model has them), RoPE and append inside the
// attention's dispatch (kernels::encode_attention_decode_rows_fresh; the same bits as the two dispatches).
// ContextOptions::fuse_qk_norm as set, for every model; unset: on, every adapter (lavapipe: one stream +13-39 %, four
// +9-65 %; not yet measured on a GPU; PERF.md).
bool fuse_rows_rope_on(const gpu::Context& ctx);
// ContextOptions::fuse_moe_route as set, for mixtures of experts; unset: on, every adapter. Decode steps and batched
// steps whose pairs are not grouped by expert choose the experts inside the gate/up products (the same bits as
// moe_route's dispatch, one dependent link fewer a MoE layer).
bool fuse_moe_route_on(const gpu::Context& ctx, const ModelConfig& c);
// ContextOptions::fuse_router as set, for mixtures of experts; unset: off (slower on the H100). Decode steps of
// one sequence whose router the matvec takes in one workgroup (kernels::matvec_takes_choose) run it with the routing
// (kernels::MatmulOptions::choose: the same bits as the product, then moe_route's dispatch).
bool fuse_router_on(const gpu::Context& ctx, const ModelConfig& c);

// progress(done, total): bytes of tensor data uploaded so far, called after each tensor.
using LoadProgress = std::function<void(uint64_t done, uint64_t total)>;

// Uploads every weight of `f`, whose config (config_from_gguf(f)) is `config`. Throws ModelError (a tensor of the
// wrong type or shape; with check_finite, one holding a NaN or an infinity) or GpuError (device out of memory).
GpuModel load_gpu_model(gpu::Context& ctx, const GgufFile& f, const ModelConfig& config,
                        const LoadProgress& progress = {}, bool check_finite = true);
// The same, reading the config of `f` first.
GpuModel load_gpu_model(gpu::Context& ctx, const GgufFile& f);

// How decode_sampled chooses each step's token: sample.wgsl with these settings and one uniform per step.
struct DecodeSampling {
  kernels::SampleSettings settings;
  uint32_t window = 0;                  // how many recent ids the penalty sees (0: none; at most n_ctx + 1 count)
  std::vector<int32_t> recent;          // the ids in it before the first step, oldest first (at most window)
  std::function<float()> next_uniform;  // called once per step, in step order, as the step is queued
};

struct GpuSessionOptions {
  uint32_t n_ctx = 0;     // positions the KV cache holds (0: the model's training context)
  uint32_t ubatch = 512;  // most tokens per prefill chunk (activation buffers are sized for it)
  kernels::KvType kv_type = kernels::KvType::F16;  // F32 doubles the cache (tests compare against it)
  // A step's command buffer is submitted after layer 0 and then every `layers_per_submit` layers, so the GPU
  // starts while the CPU encodes the rest. 0: one command buffer per step; unset: 4 on GPUs, 0 on CPU adapters
  // (where the "GPU" shares the cores and extra submits only cost).
  std::optional<uint32_t> layers_per_submit = std::nullopt;
  // decode_greedy's argmax: true on the GPU, each step queued before the last id is back; false on the host after
  // each step's logits are read back; unset: the GPU, except on CPU adapters (there the "GPU" shares the cores:
  // encoding ahead competes with it, and the two argmax dispatches cost more than the readback). The library's
  // sampled decoding (api) follows the same choice (chooses_on_gpu()); decode_sampled runs on the GPU regardless.
  std::optional<bool> argmax_on_gpu = std::nullopt;
  // forward_rows' rows of logits per block (0: as many as fit GpuSession::kLogitBlockBytes; tests force small ones).
  uint32_t logit_block_rows = 0;
  // Several sequences in one pool (continuous batching, GpuBatchDecode): the session's KV caches are views of
  // sequence kv_sequence of these caches (SharedKv, which must outlive the session). n_ctx must be theirs per
  // sequence; kv_type is theirs.
  SharedKv* shared_kv = nullptr;
  uint32_t kv_sequence = 0;
  // The bind groups the session keeps for steps that repeat (gpu::BindCache; 0: gpu::BindCache::kMaxGroups). An
  // owner of many sessions bounds them: every live group holds driver memory.
  uint32_t bind_groups_max = 0;
};

// One sequence: activations for `ubatch` tokens, a KV cache per layer and the decode scratch. The context and
// model must outlive the session.
class GpuSession {
 public:
  GpuSession(gpu::Context& ctx, const GpuModel& model, const GpuSessionOptions& options = {});
  ~GpuSession();
  GpuSession(const GpuSession&) = delete;
  GpuSession& operator=(const GpuSession&) = delete;

  // Runs `tokens` after those already cached, in chunks of at most ubatch, and returns the logits [n_vocab] of the
  // last one. Throws InvalidArgument for no tokens, an id outside the vocabulary or a full context (before any
  // work is done), and ModelError naming the position when logits come out NaN or infinite (here, in forward_all
  // and in decode_greedy alike).
  std::vector<float> forward(std::span<const int32_t> tokens);
  // As forward, but returns the logits of every token: [tokens.size()][n_vocab].
  std::vector<std::vector<float>> forward_all(std::span<const int32_t> tokens);
  // As forward, but hands the logits of tokens [first, tokens.size()) to on_rows a block at a time, never
  // [tokens][n_vocab] at once (a 262,144-token vocabulary takes 1 MiB per row): on_rows(row, logits) gets rows
  // row, row + 1, ... of `tokens` as [n][n_vocab], n <= logit_rows_per_block(), in order. The span is valid during the
  // call only. Non-finite logits throw ModelError naming the position.
  using OnLogitRows = std::function<void(uint32_t row, std::span<const float> logits)>;
  void forward_rows(std::span<const int32_t> tokens, uint32_t first, const OnLogitRows& on_rows);
  // Rows of logits forward_rows computes and hands over at once: as many as fit kLogitBlockBytes (and one binding),
  // or the option's logit_block_rows; at most ubatch, at least 1.
  uint32_t logit_rows_per_block() const;
  static constexpr uint64_t kLogitBlockBytes = 64ull << 20;
  // Greedy decoding with the argmax taken on the GPU: feeds `token`, and the argmax of each step's logits becomes
  // the next step's input on the GPU, so the next step is queued before the host has read the current one's id
  // (no round trip between steps). on_id gets each chosen id in order; decoding stops after max_new ids, at a full
  // context, or when on_id returns false. Returns the ids chosen. n_past() then counts `token` and every chosen id
  // but the last (as if each had been fed with forward); the cache rows a step queued beyond that are forgotten.
  // With argmax_on_gpu off (CPU adapters), each step is a forward and the argmax is taken on the host.
  uint32_t decode_greedy(int32_t token, uint32_t max_new, const std::function<bool(int32_t id)>& on_id = {});
  // As decode_greedy with the GPU argmax, but each step's token is drawn on the GPU (sample.wgsl) with
  // `sampling`: the ring of recent ids lives on the GPU and takes each drawn id, so steps still queue back to back
  // and only the ids come back. With the same uniforms and recent ids, cpu::sample_reference chooses the same
  // tokens from the same logits. Runs on the GPU whatever argmax_on_gpu says.
  uint32_t decode_sampled(int32_t token, uint32_t max_new, const DecodeSampling& sampling,
                          const std::function<bool(int32_t id)>& on_id = {});
  // Whether the token choice of decoding belongs on the GPU (GpuSessionOptions::argmax_on_gpu).
  bool chooses_on_gpu() const { return argmax_on_gpu_; }

  uint32_t n_past() const { return n_past_; }
  uint32_t n_ctx() const { return n_ctx_; }
  uint32_t ubatch() const { return ubatch_; }
  uint64_t kv_bytes() const { return state_.kv_bytes(); }              // GPU memory of the KV caches
  uint64_t bind_groups_made() const { return bind_cache_->misses(); }  // over the session's life
  // decode_on_gpu's host work over the session's life: its steps, and the time spent encoding and submitting them
  // (Session::decode_host_time).
  struct HostTime {
    uint64_t steps = 0;
    double seconds = 0;
  };
  HostTime decode_host_time() const { return host_time_; }
  // Forget the cached positions (their rows are overwritten later) and the step encoded ahead.
  void reset() { truncate(0); }
  // Keeps the first n positions (n <= n_past) and forgets the rest: the state is what feeding those n tokens gives.
  // KV rows past n are overwritten later. A model with convolution layers rewinds its conv states from their rings
  // when n is at most ubatch positions back; a recurrent state (qwen35) does not rewind. Otherwise the state comes
  // back from the latest checkpoint at or before n and the tokens after it are fed again (all n of them without
  // one; on a shared pool, conv rings also come back from the mark of a page boundary: SequenceState::marks).
  // Checkpoints past n are forgotten.
  void truncate(uint32_t n);
  // Replaces this session's state with the first n positions of `from`'s (n <= from.n_past()), as if those tokens
  // had been fed here: their KV pages shared, not computed again (SharedKv::share); with conv rings (lfm2), their
  // state at n from `from`'s marks, so n must be a page boundary. Only between sessions whose caches are views of one
  // SharedKv, on models whose state is the KV cache and conv rings (can_share_prefix; not recurrent states).
  void share_prefix(const GpuSession& from, uint32_t n);
  bool can_share_prefix(const GpuSession& from) const;
  // The most of `from`'s first n positions share_prefix can take: n capped at from.n_past(), down to a page boundary
  // where conv rings come along; 0 where nothing can be shared.
  uint32_t shareable(const GpuSession& from, uint32_t n) const;
  // On a SharedKv of fewer pages than its sequences' (SharedKv::on_demand): where this sequence's pages were taken
  // while it was idle, its cache is cut back there (truncated in place; the positions past it are computed again when
  // fed again). Every call that reads or extends the state does this first; callers that read tokens() or n_past()
  // of an idle sequence call it themselves. Pages are reserved as a step needs them; SharedKv's KvPoolFull leaves
  // the session as it was.
  void sync_pages();
  // The KV pages of positions [0, end) mapped now (SharedKv::reserve; KvPoolFull when the pool has none), so that the
  // steps to come find them: a batched step's caller reserves each sequence's before it.
  void reserve(uint32_t end) { state_.reserve(end); }
  // Whether truncate(n) keeps the state in place (no tokens fed again): n == 0, the state rewinds to n, or a
  // checkpoint or a page boundary's mark holds it.
  bool truncates_in_place(uint32_t n) const;
  // The largest m <= min(n, n_past) that truncate(m) reaches in place: 0 when none but 0 does.
  uint32_t rewind_point(uint32_t n) const;
  // Keeps a copy of the conv rings and recurrent states at n_past (SequenceState::Checkpoint; the last
  // kMaxCheckpoints are kept), so that a later truncate to n_past, or past it, feeds no token before it again. For
  // a conversation's prompt cache on models whose state does not rewind. Nothing for a model without such state.
  void checkpoint();
  // Whether some layer keeps a state beyond its KV cache (conv rings, recurrent states): what checkpoint() copies.
  bool keeps_rolling_state() const { return state_.rolls(); }
  // Positions of the checkpoints kept, oldest first.
  std::vector<uint32_t> checkpoints() const;
  // The tokens behind the n_past() cached positions.
  std::span<const int32_t> tokens() const { return {tokens_.data(), n_past_}; }

 private:
  friend class GpuBatchDecode;  // a decode step of several sessions reads and advances their caches and state
  using Piece = std::unique_ptr<gpu::ComputeBatch>;
  // What a step leaves behind after its layers.
  enum class Output {
    None,        // nothing (a prefill chunk before the last)
    LastLogits,  // the last token's logits, copied to the mappable logits_host
    AllLogits,   // every token's logits in logits_all
    Argmax,      // the last token's argmax written to ids[0] (the next step's input) and copied to a readback slot
    Sample,      // likewise, the token drawn by sample.wgsl (StepSample)
  };
  // What an Output::Sample step draws with.
  struct StepSample {
    const kernels::SampleSettings* settings;
    float u;
    kernels::SampleRecent recent;
  };
  // A decode step encoded ahead (the one at position pos), its pieces not yet submitted.
  struct PreparedStep {
    uint32_t pos = 0;
    const gpu::Profiler* profiler = nullptr;  // attached while it was encoded
    std::vector<Piece> pieces;
  };
  void check_tokens(std::span<const int32_t> tokens) const;
  // state_.reserve(end), false on KvPoolFull (for work that is only worth doing when a page is at hand).
  bool try_reserve(uint32_t end);
  // One chunk of n tokens at positions n_past_.. : a few command buffers; logits of the last or of every token.
  std::vector<float> run_chunk(std::span<const int32_t> tokens, Output output);
  // Encodes the step of n tokens at position pos (the ids already in place when it runs), handing each finished
  // piece to `ready` in order: submitted at once, or kept for later. Output::Argmax copies the id to
  // id_readback[slot]. one_piece: a single command buffer whatever layers_per_submit_ says (a step queued behind
  // another gains nothing from starting early, and each submission boundary costs GPU time).
  void encode_step(uint32_t n, uint32_t pos, Output output, const std::function<void(Piece)>& ready, uint32_t slot = 0,
                   bool one_piece = false, const StepSample* sample = nullptr);
  // The GPU loop of decode_greedy and decode_sampled: step k's output (Argmax or Sample, made by step_sample(k))
  // is step k+1's input; each step is queued before the previous id is read back.
  uint32_t decode_on_gpu(int32_t token, uint32_t max_new, Output output,
                         const std::function<StepSample(uint32_t k)>& step_sample,
                         const std::function<bool(int32_t id)>& on_id);
  // The layer's dispatches as the architecture's layer program (model/arch/) gives them.
  void encode_layer(gpu::ComputeBatch& batch, uint32_t layer, uint32_t n, uint32_t pos);
  void encode_logits(gpu::ComputeBatch& batch, uint32_t n, Output output, uint32_t slot, const StepSample* sample);
  // y[t] = logits of the final residual rows x[t], t < n (the final norm folded into the product, the softcap after).
  void encode_logit_rows(gpu::ComputeBatch& batch, const gpu::Buffer& x, const gpu::Buffer& y, uint32_t n);

  gpu::Context& ctx_;
  const GpuModel& model_;
  uint32_t n_ctx_, ubatch_;
  uint32_t layers_per_submit_;  // 0: one command buffer per step
  bool argmax_on_gpu_;
  uint32_t logit_block_rows_;    // 0: as many as fit kLogitBlockBytes
  const LayerProgram& program_;  // the architecture's layers (model/arch/arch.h)
  // How each layer's decode step gets q into place and k, v into the cache (model/blocks.h).
  std::vector<DecodeQkv> decode_qkv_;  // [n_layer]
  uint32_t n_past_ = 0;
  // Counts the changes of the state (every chunk fed, decode step and truncation): a batched step queued ahead
  // (GpuBatchDecode::step_argmax) stands only while it does not move.
  uint64_t changes_ = 0;
  HostTime host_time_;
  std::unique_ptr<SessionBuffers> buf_;
  std::unique_ptr<gpu::BindCache> bind_cache_;  // decode steps repeat: their bind groups are made once
  SequenceState state_;                         // the KV caches and conv states
  kernels::KvCache& kv(uint32_t layer) { return *state_.kv[layer]; }
  std::vector<int32_t> tokens_;  // every token fed, [0, n_past_) valid (a rewind beyond the rings feeds them again)
  // While the GPU runs a decode step, the CPU encodes the next one (it depends only on the position): the next
  // token then only writes its id and submits.
  std::unique_ptr<PreparedStep> next_;
};

}  // namespace wgllm
