#include "kernels/matmul.h"

#include <algorithm>
#include <array>
#include <bit>
#include <string>
#include <vector>

#include "kernels/check.h"
#include "kernels/int_dot.h"
#include "kernels/matmul_pipelines.h"
#include "kernels/moe.h"
#include "wgllm/error.h"

namespace wgllm::kernels {

using detail::ClassOrder;
using detail::fail;
using detail::matvec_pipeline;
using detail::matvec_slots;
using detail::MatvecMode;
using detail::rows_pipeline;
using detail::tiled_pipeline;

namespace {

// The SwiGLU epilogue's gate activation as flags (silu: none).
uint32_t act_flags(GateAct act) {
  return act == GateAct::GeluTanh    ? flags::kGelu
         : act == GateAct::SwigluOai ? flags::kSwigluOai
         : act == GateAct::Sigmoid   ? flags::kSigmoid
                                     : 0;
}

// The matvec's tokens per pipeline for a pass of `count`: the count itself up to kMatvecMaxTokens, then 8 or 16
// (the missing tokens computed and not stored), so a batch needs 6 pipelines per product, not 16.
uint32_t matvec_tokens(uint32_t count) { return count <= kMatvecMaxTokens ? count : count <= 8 ? 8 : 16; }

// The workgroup memory of a matvec pipeline with nt tokens: the slots of every value of every group.
uint64_t matvec_red_bytes(const gpu::Context& ctx, const MatvecConfig& mv, uint32_t nt) {
  return uint64_t(mv.rows + 1) * nt * mv.groups * matvec_slots(ctx, mv) * 4;
}

// The most tokens one matvec pass takes with this shape: kMatvecPassTokens, halved while its workgroup memory would
// exceed the adapter's (down to kMatvecMaxTokens, which matvec_config checks).
uint32_t matvec_pass_tokens(const gpu::Context& ctx, const MatvecConfig& mv) {
  uint32_t n = ctx.options().matvec_pass.value_or(kMatvecPassTokens);
  if (n != 8 && n != kMatvecPassTokens)
    throw InvalidArgument("matvec pass of " + std::to_string(n) + " tokens: 8 or " + std::to_string(kMatvecPassTokens));
  while (n > kMatvecMaxTokens && matvec_red_bytes(ctx, mv, n) > ctx.limits().maxComputeWorkgroupStorageSize) n /= 2;
  return n;
}

// MatmulOptions::choose: the router's rows its one workgroup computes at a time (a group's loads in flight: one unit
// of each row per thread).
constexpr uint32_t kChooseRows = 16;

struct BatchTiles {
  ClassOrder order;
  MatmulTile tile;
};
std::optional<BatchTiles> batch_tiles(gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens);

// The product with the options' epilogues, or (rk) the matvec's RoPE + KV-append epilogue. The options are checked.
void encode_product(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                    const gpu::Buffer& y, uint32_t n_tokens, const MatmulOptions& o, const detail::RopeKvEpilogue* rk) {
  const char* fn = rk ? "encode_qkv_rope_append" : "encode_matmul";
  detail::check_weight(fn, w);
  if (n_tokens == 0) fail(fn, "n_tokens must be > 0");
  // the product's rows from split2 on are w2's, read in the same dispatch (matmul_common.wgsl's TWO_TYPES)
  const GpuWeight* w2 = o.second;
  if (w2) detail::check_weight(fn, *w2);
  if (w2 && (n_tokens != 1 || o.split2 != w.n_out || !(o.y1 || rk) || o.digits ||
             (o.impl != MatmulImpl::Auto && o.impl != MatmulImpl::Matvec) || !detail::matvec_takes_second(ctx, w, *w2)))
    fail(fn, "a second weight takes one token on the matvec after w's rows, split2 = w's n_out (matvec_takes_second)");
  const uint32_t n_out = w.n_out + (w2 ? w2->n_out : 0);
  auto check_size = [&](const char* name, const gpu::Buffer& b, uint64_t floats, const char* what) {
    if (b.size < floats * 4)
      fail(fn, std::string(name) + " holds " + std::to_string(b.size) + " bytes, needs " + what + " = " +
                   std::to_string(floats * 4));
  };
  const bool split = o.y1 || o.y2 || rk;
  const std::string splits =
      " (got " + std::to_string(o.split1) + ", " + std::to_string(o.split2) + ", n_out " + std::to_string(n_out) + ")";
  // y2 may be left out when no rows go to it (split2 == n_out: a weight of q and k rows alone)
  if (split && !rk &&
      (!o.y1 || o.split1 == 0 || o.split1 > o.split2 || o.split2 > n_out || (o.split2 == n_out) == bool(o.y2)))
    fail(fn, "split outputs need y1 and 0 < split1 <= split2 <= n_out, y2 exactly when split2 < n_out" + splits);
  // The RoPE + KV epilogue: rows [0, split1) q, [split1, split2) k, [split2, n_out) v, any of them empty but not all
  // of k and v (a weight of q and k rows alone, or of v rows alone)
  if (rk && (o.split1 > o.split2 || o.split2 > n_out || o.split1 == n_out))
    fail(fn, "q, k and v rows need split1 <= split2 <= n_out and some k or v rows" + splits);
  if (o.swiglu && (n_out % 2 || split || o.accumulate))
    fail(fn, "swiglu needs an even n_out (interleaved gate/up rows) and neither split outputs nor accumulate");
  if (o.act != GateAct::Silu && !o.swiglu && !o.times)
    fail(fn, "a gate activation needs swiglu or times (it selects the gate's activation)");
  if (o.act == GateAct::Sigmoid && !o.times)
    fail(fn, "the sigmoid gate is a matmul epilogue only with times (encode_swiglu runs it otherwise)");
  if (o.times && (o.bias || o.swiglu || o.accumulate || split || o.act == GateAct::SwigluOai))
    fail(fn, "times takes neither bias, swiglu, accumulate, split outputs nor the gpt-oss gate");
  if (o.times && (o.times_stride < n_out || o.times_offset > o.times_stride - n_out))
    fail(fn, "times needs times_offset + n_out <= times_stride (got " + std::to_string(o.times_offset) + " + " +
                 std::to_string(n_out) + " > " + std::to_string(o.times_stride) + ")");
  if (split && o.accumulate) fail(fn, "accumulate does not combine with split outputs");
  // Widths (floats per token) of y, y1, y2.
  const bool split_out = split && !rk;  // y1 (and y2) written
  const bool has_y2 = split_out && o.y2;
  const uint32_t y_width = split ? std::max(o.split1, 1u) : o.swiglu ? n_out / 2 : n_out;  // 1: no q rows
  const uint32_t y1_width = split_out ? o.split2 - o.split1 : 1, y2_width = has_y2 ? n_out - o.split2 : 1;
  check_size("x", x, uint64_t(n_tokens) * w.n_in, "n_tokens * n_in * 4");
  check_size("y", y, uint64_t(n_tokens) * y_width, "n_tokens * (y's rows) * 4");
  if (split_out) {
    check_size("y1", *o.y1, uint64_t(n_tokens) * y1_width, "n_tokens * (split2 - split1) * 4");
    if (has_y2) check_size("y2", *o.y2, uint64_t(n_tokens) * y2_width, "n_tokens * (n_out - split2) * 4");
  }
  for (const gpu::Buffer* out : {&y, o.y1, o.y2})
    if (out && out->get() == x.get()) fail(fn, "x and y must be different buffers");
  if (split_out && (o.y1->get() == y.get() || (has_y2 && (o.y2->get() == y.get() || o.y1->get() == o.y2->get()))))
    fail(fn, "y, y1 and y2 must be different buffers");
  if (o.bias) check_size("bias", *o.bias, n_out, "n_out * 4");
  if (o.bias && uint64_t(n_out) * 4 > ctx.max_binding_size()) fail(fn, "bias exceeds the storage-binding limit");
  const uint64_t times_floats = o.times ? uint64_t(n_tokens) * o.times_stride : 0;
  if (o.times) check_size("times", *o.times, times_floats, "n_tokens * times_stride * 4");
  if (o.times && times_floats * 4 > ctx.max_binding_size()) fail(fn, "times exceeds the storage-binding limit");
  if (o.times && o.times->get() == y.get()) fail(fn, "times must not be the output");
  const uint64_t norm_floats = (uint64_t(w.n_in) + 7) / 8 * 8;
  if (o.norm) check_size("norm", *o.norm, norm_floats, "n_in rounded up to 8, * 4");
  if (o.norm && !(o.eps > 0)) fail(fn, "eps must be > 0 with norm");
  if (o.norm && (o.norm->get() == y.get() ||
                 (split_out && (o.norm->get() == o.y1->get() || (has_y2 && o.norm->get() == o.y2->get())))))
    fail(fn, "norm must not be an output");
  if (o.digits) {
    if (n_tokens != 1 || rk || !matvec_takes_digits(w.type) || w.n_experts)
      fail(fn, "digits take one token's product of a Q4_K or Q6_K weight (no RoPE epilogue, no experts)");
    if (o.impl != MatmulImpl::Auto && o.impl != MatmulImpl::Matvec) fail(fn, "digits are read by the matvec alone");
    if (o.digits->n_in != w.n_in)
      fail(fn,
           "digits of " + std::to_string(o.digits->n_in) + " elements for a weight of n_in " + std::to_string(w.n_in));
    detail::need(fn, "digits", o.digits->data, o.digits->bytes(), ctx);
  }
  if (o.choose) {
    const auto& c = *o.choose;
    if (n_tokens != 1 || rk || o.digits || o.pre || w2 || o.swiglu || o.y1 || o.times || o.accumulate ||
        (o.impl != MatmulImpl::Auto && o.impl != MatmulImpl::Matvec) || !matvec_takes_choose(ctx, w, c.n_used))
      fail(fn, "choose takes one token's product on the matvec (matvec_takes_choose: one piece of at most " +
                   std::to_string(kMoeMaxExperts) + " rows, n_used from 1 to the rows, " + std::to_string(kMoeMaxUsed) +
                   " and the matvec's threads a row), no digits, pre, second, swiglu, " + "split outputs or times");
    if (!c.experts || !c.weights) fail(fn, "choose needs experts and weights");
    detail::need(fn, "choose experts", *c.experts, uint64_t(c.n_used) * 4, ctx);
    detail::need(fn, "choose weights", *c.weights, uint64_t(c.n_used) * 4, ctx);
    if (c.sigmoid_bias) detail::need(fn, "choose sigmoid_bias", *c.sigmoid_bias, uint64_t(n_out) * 4, ctx);
    for (const gpu::Buffer* out : {c.experts, c.weights})
      for (const gpu::Buffer* other : {&x, &y, c.sigmoid_bias, o.norm, o.bias})
        if (other && other->get() == out->get()) fail(fn, "choose: experts and weights must be outputs of their own");
    if (c.experts->get() == c.weights->get()) fail(fn, "choose: experts and weights must be different buffers");
  }
  MatmulImpl impl = o.digits || o.choose ? MatmulImpl::Matvec : o.impl;
  if (impl == MatmulImpl::Auto)
    impl = rows_kernel_for(ctx, w.type)                      ? MatmulImpl::Rows
           : n_tokens <= kMatvecMaxTokens                    ? MatmulImpl::Matvec
           : !rk && !w2 && few_tiles_split(ctx, w, n_tokens) ? MatmulImpl::Batch
                                                             : MatmulImpl::Tiled;
  if (impl == MatmulImpl::Rows && !rows_kernel_reads(w.type)) impl = MatmulImpl::Matvec;
  if (o.pre) {
    const auto& r = *o.pre;
    if (n_tokens != 1 || o.digits || !matvec_takes_pre(ctx, w, o.impl))
      fail(fn, "pre takes one token's product on the matvec (matvec_takes_pre), without digits");
    if (!r.src || !r.weight || !r.out) fail(fn, "pre needs src, weight and out");
    check_size("pre.src", *r.src, w.n_in, "n_in * 4");
    check_size("pre.weight", *r.weight, w.n_in, "n_in * 4");
    check_size("pre.out", *r.out, w.n_in, "n_in * 4");
    for (const gpu::Buffer* b : {&x, r.src, r.weight})
      if (b->get() == r.out->get()) fail(fn, "pre.out must differ from x, pre.src and pre.weight");
    for (const gpu::Buffer* out : {&y, o.y1, o.y2})
      if (out && (out->get() == r.out->get() || out->get() == r.src->get()))
        fail(fn, "pre's buffers must not be the product's outputs");
  }
  const bool batch_shape = impl == MatmulImpl::Batch;  // the matvec kernel in batch decode's shape
  if (batch_shape) impl = MatmulImpl::Matvec;
  // Batch decode's float products where batch_takes_tiles: the tiled kernel in the matvec's order
  const std::optional<BatchTiles> batch_tiled =
      batch_shape && !rk ? batch_tiles(ctx, w, n_tokens) : std::optional<BatchTiles>{};
  if (batch_tiled) impl = MatmulImpl::Tiled;
  const uint32_t digits = impl == MatmulImpl::Tiled && !batch_tiled && !rk ? prompt_digits(ctx, w, n_tokens) : 0;
  // their workgroups' tokens: 64 (64 x 64 tiles) unless ContextOptions::prompt_tile says 32 (32 x 128)
  const uint32_t int_tm = digits ? prompt_tile(ctx, detail::kIntTile) : 0;

  const uint32_t max_grid = ctx.limits().maxComputeWorkgroupsPerDimension;
  uint32_t step = detail::tokens_per_binding(fn, ctx, {w.n_in, y_width, y1_width, y2_width});
  const gpu::Buffer& none = ctx.placeholder_storage();
  MatvecConfig mv = o.digits      ? int_matvec_config(ctx, n_out, w.n_in)
                    : batch_shape ? batch_matvec_config(ctx, n_out, w.n_in, w.type, n_tokens)
                    : o.pre       ? pre_matvec_config(ctx, n_out, w.n_in, w.type, w2 ? w.n_out : 0)
                                  : matvec_config(ctx, n_out, w.n_in, w.type);
  if (o.choose) {  // one workgroup: one group of the product's threads per row, 16 rows at a time
    mv.rows = kChooseRows;
    mv.groups = 1;
  }
  if (impl == MatmulImpl::Matvec) step = std::min(step, matvec_pass_tokens(ctx, mv));
  const MatmulTile tile = batch_tiled                 ? batch_tiled->tile
                          : impl == MatmulImpl::Tiled ? matmul_tile(ctx, std::min(step, n_tokens), w.n_out)
                                                      : MatmulTile{};
  const RowsConfig rows = impl == MatmulImpl::Rows ? rows_config(ctx).value_or(RowsConfig{}) : RowsConfig{};
  const uint32_t row_pairs = rk && rk->neox ? 2 : rows.rows / 2;  // the neox RoPE epilogue takes quads of rows
  const uint32_t flag_bits = (o.bias ? flags::kBias : 0) | (o.norm ? flags::kNorm : 0) |
                             (o.accumulate ? flags::kAccum : 0) | (o.swiglu ? flags::kSwiglu : 0) | act_flags(o.act) |
                             (split_out ? flags::kSplit : 0) | (rk ? flags::kRopeKv : 0) |
                             (rk && rk->neox ? flags::kNeox : 0) | (o.times ? flags::kTimes : 0);

  for (uint32_t first = 0; first < n_tokens; first += step) {
    const uint32_t count = std::min(step, n_tokens - first);
    const auto xw = detail::row_window(ctx, first, count, w.n_in);
    const auto yw = detail::row_window(ctx, first, count, y_width);
    const auto y1w = split_out ? detail::row_window(ctx, first, count, y1_width) : detail::RowWindow{0, 16, 0};
    const auto y2w = has_y2 ? detail::row_window(ctx, first, count, y2_width) : detail::RowWindow{0, 16, 0};
    const bool xv4 = w.n_in % 32 == 0 && xw.first_word % 4 == 0;
    // One token (decode) or the shape's tokens, the last group's missing ones clamped: two pipelines per weight type,
    // not one per count (lavapipe takes seconds to compile each).
    const uint32_t rows_tokens = count == 1 ? 1 : rows.tokens;
    const MatvecMode mode{.int_dot = bool(o.digits),
                          .choose = o.choose.has_value(),
                          .pre_n_in = o.pre ? w.n_in : 0,
                          .second = w2 ? std::optional(w2->type) : std::nullopt};
    WGPUComputePipeline pipe =
        digits                       ? detail::int_tiled_pipeline(ctx, w.type, digits, int_tm)
        : impl == MatmulImpl::Matvec ? matvec_pipeline(ctx, mv, w.type, matvec_tokens(count), xv4, mode)
        : impl == MatmulImpl::Rows
            ? rows_pipeline(ctx, rows, w.type, rows_tokens, row_pairs, xv4)
            : tiled_pipeline(ctx, tile, w.type, false, batch_tiled ? batch_tiled->order : ClassOrder{});
    // the window's digits, once for every piece (prompt_digits: matmul_int.wgsl reads them instead of x)
    const XDigits digit_shape{{}, w.n_in, count};
    const gpu::Buffer* digit_data = digits ? &ctx.scratch(digit_shape.bytes()) : nullptr;
    if (digits)
      encode_x_digits(batch, ctx, x, xw.offset_bytes, xw.size_bytes, xw.first_word, *digit_data, w.n_in, count, o.norm);
    for (const auto& piece : w.pieces) {
      MatmulParams p = detail::piece_params(w, piece, count);
      if (w2) {  // one piece each (matvec_takes_second)
        p.n_out = p.n_rows = n_out;
        p.scale2_off4 = w2->pieces[0].scale_off4;
      }
      p.flags = flag_bits;
      p.x_off = o.digits ? uint32_t(o.digits->scales_vec4()) : xw.first_word;
      p.y_off = yw.first_word;
      p.split1 = o.split1;
      p.split2 = o.split2;
      p.y1_off = y1w.first_word;
      p.y2_off = y2w.first_word;
      p.eps = o.eps;
      p.y_stride = y_width;
      p.times_off = o.times_offset + first * o.times_stride;
      p.times_stride = o.times_stride;
      p.pre_scale = o.pre ? o.pre->scale : 1.f;
      if (rk) {
        p.pos = rk->pos;
        p.head_dim = rk->head_dim;
        p.rope_dim = rk->rope_dim;
        p.kv_f16 = rk->kv_f16;
        p.kv_k_off = rk->k_elem;
        p.kv_v_off = rk->v_elem;
      }
      if (digits) {
        p.x_off = uint32_t(digit_shape.scales_vec4());
        const uint32_t int_tn = detail::int_tile_rows(int_tm);
        p.row_tiles = (piece.n_rows + int_tn - 1) / int_tn;
        const auto grid = gpu::fold_grid(uint64_t(p.row_tiles) * ((count + int_tm - 1) / int_tm), max_grid);
        p.grid_x = grid.x;
        const gpu::BufferBinding bindings[] = {
            batch.uniform(0, p),
            {1, &piece.buffer},
            {3, &y, yw.offset_bytes, yw.size_bytes},
            o.times ? gpu::BufferBinding{4, o.times, 0, times_floats * 4}
                    : gpu::BufferBinding{4, o.bias ? o.bias : &none, 0, o.bias ? uint64_t(n_out) * 4 : 16},
            {7, split_out ? o.y1 : &ctx.placeholder_writable(), y1w.offset_bytes, y1w.size_bytes},
            {8, has_y2 ? o.y2 : &ctx.placeholder_writable(), y2w.offset_bytes, y2w.size_bytes},
            {5, &none, 0, 16},
            {16, digit_data, 0, digit_shape.bytes()}};
        batch.dispatch(pipe, bindings, grid.x, grid.y);
        continue;
      }
      uint64_t n_wg;
      if (impl == MatmulImpl::Matvec) {
        const uint32_t rows_per_wg = mv.rows * mv.groups;
        n_wg = o.choose ? 1 : (p.n_rows + rows_per_wg - 1) / rows_per_wg;
        if (o.choose) {
          p.n_used = o.choose->n_used;
          p.route_flags = 1u | (o.choose->sigmoid_bias ? 2u : 0u);  // moe_choose.wgsl's CH_NORM_TOP, CH_SIGMOID
        }
      } else if (impl == MatmulImpl::Rows) {
        const uint32_t rows_per_wg = rows.workgroup * 2 * row_pairs;
        p.row_tiles = (piece.n_rows + rows_per_wg - 1) / rows_per_wg;
        n_wg = uint64_t(p.row_tiles) * ((count + rows_tokens - 1) / rows_tokens);
      } else {
        p.row_tiles = (piece.n_rows + tile.rows - 1) / tile.rows;
        n_wg = uint64_t(p.row_tiles) * ((count + tile.tokens - 1) / tile.tokens);
      }
      const auto grid = gpu::fold_grid(n_wg, max_grid);
      p.grid_x = grid.x;
      std::vector<gpu::BufferBinding> bindings = {
          batch.uniform(0, p),
          {1, &piece.buffer},
          {2, &x, xw.offset_bytes, xw.size_bytes},
          {3, &y, yw.offset_bytes, yw.size_bytes},
          o.times ? gpu::BufferBinding{4, o.times, 0, times_floats * 4}
                  : gpu::BufferBinding{4, o.bias ? o.bias : &none, 0, o.bias ? uint64_t(n_out) * 4 : 16},
          {6, o.norm ? o.norm : &none, 0, o.norm ? norm_floats * 4 : 16},
          {7, split_out ? o.y1 : &ctx.placeholder_writable(), y1w.offset_bytes, y1w.size_bytes},
          {8, has_y2 ? o.y2 : &ctx.placeholder_writable(), y2w.offset_bytes, y2w.size_bytes},
      };
      if (impl == MatmulImpl::Matvec || impl == MatmulImpl::Rows)
        bindings.push_back(xv4 ? gpu::BufferBinding{9, &x, xw.offset_bytes, xw.size_bytes}
                               : gpu::BufferBinding{9, &none, 0, 16});
      if (impl == MatmulImpl::Rows) bindings.push_back({12, &piece.buffer});
      if (impl == MatmulImpl::Matvec || impl == MatmulImpl::Tiled) bindings.push_back({5, &none, 0, 16});
      // a split product's partial sums (matmul.wgsl's MM_SPLIT): [group][token][row], then [group][token]
      const uint32_t groups = batch_tiled ? batch_tiled->order.groups : 1;
      const uint64_t part_floats = uint64_t(groups) * count * (piece.n_rows + 1);
      const gpu::Buffer& part = groups > 1 ? ctx.scratch(part_floats * 4) : ctx.placeholder_writable();
      if (impl == MatmulImpl::Tiled) bindings.push_back({10, &part, 0, groups > 1 ? part_floats * 4 : 16});
      if (impl == MatmulImpl::Matvec || impl == MatmulImpl::Rows) {
        bindings.push_back(rk ? gpu::BufferBinding{10, rk->table} : gpu::BufferBinding{10, &none, 0, 16});
        bindings.push_back(rk ? gpu::BufferBinding{11, rk->pool}
                              : gpu::BufferBinding{11, &ctx.placeholder_writable(), 0, 16});
      }
      if (impl == MatmulImpl::Matvec) {
        const uint64_t pre_bytes = uint64_t(w.n_in) * 4;
        bindings.push_back(o.pre ? gpu::BufferBinding{13, o.pre->src, 0, pre_bytes}
                                 : gpu::BufferBinding{13, &none, 0, 16});
        bindings.push_back(o.pre ? gpu::BufferBinding{14, o.pre->weight, 0, pre_bytes}
                                 : gpu::BufferBinding{14, &none, 0, 16});
        bindings.push_back(o.pre ? gpu::BufferBinding{15, o.pre->out, 0, pre_bytes}
                                 : gpu::BufferBinding{15, &ctx.placeholder_writable(), 0, 16});
        // MV_INT: x's digits and scales (int_dot.h)
        bindings.push_back(o.digits ? gpu::BufferBinding{16, &o.digits->data, 0, o.digits->bytes()}
                                    : gpu::BufferBinding{16, &none, 0, 16});
        bindings.push_back({17, &none, 0, 16});
        if (w2) bindings.push_back({18, &w2->pieces[0].buffer});
        if (o.choose) {  // matvec_route.wgsl's: its logits are y here (19 unread), the token's experts and weights
          const auto& c = *o.choose;
          bindings.insert(bindings.end(),
                          {{19, &none, 0, 16},
                           {20, c.experts, 0, uint64_t(c.n_used) * 4},
                           {21, c.weights, 0, uint64_t(c.n_used) * 4},
                           c.sigmoid_bias ? gpu::BufferBinding{22, c.sigmoid_bias, 0, uint64_t(n_out) * 4}
                                          : gpu::BufferBinding{22, &none, 0, 16}});
        }
      }
      batch.dispatch(pipe, bindings, grid.x, grid.y, groups);
      if (groups > 1) {  // the groups added, the epilogue
        const auto fold_grid = gpu::fold_grid((uint64_t(count) * ((piece.n_rows + 1) / 2) + 63) / 64, max_grid);
        p.grid_x = fold_grid.x;
        batch.dispatch(detail::fold_pipeline(ctx, w.type, batch_tiled->order),
                       std::vector<gpu::BufferBinding>{batch.uniform(0, p),
                                                       bindings[3],
                                                       bindings[4],
                                                       bindings[6],
                                                       bindings[7],
                                                       {10, &part, 0, part_floats * 4}},
                       fold_grid.x, fold_grid.y);
      }
    }
  }
}

// GPUs (measured on the H200 at full clocks, PERF.md). Block types, read in 32-weight chunks: 4 rows per group and as
// many threads per row as it takes for the whole product to have about 64k threads (a wide GPU's fill), no more
// than the row has chunks (rounded up to a power of two), 4 to 256, in workgroups of at least 128 threads. Float types,
// read in 8-element units: tall matrices stream best with a subgroup per 4 rows; below ~16k rows that leaves too few
// workgroups to fill the GPU, and 128 threads per row (4 rows per workgroup) do better, 256 for long rows and for
// routers.
MatvecConfig gpu_matvec_config(uint32_t n_rows, uint32_t n_in, GgufType type) {
  if (block_elems(type) == 1) {
    if (n_rows >= 16384) return {.threads_per_row = 32, .rows = 4, .groups = 4};
    // A MoE router (32-256 rows of 2,048 or more): 256 threads a row, 2 rows a workgroup. H100, F16 2048 wide, µs a
    // dependent dispatch: 128 rows 8.1 at 128x4x1 -> 5.6 at 256x2x1, 32 rows 7.3 -> 5.5 (PERF.md)
    if (n_rows <= 256 && n_in >= 2048) return {.threads_per_row = 256, .rows = 2, .groups = 1};
    if (n_in >= 4096) return {.threads_per_row = 256, .rows = 4, .groups = 1};
    return {.threads_per_row = 128, .rows = 4, .groups = 1};
  }
  auto pow2_floor = [](uint64_t v) {
    uint32_t p = 1;
    while (p * 2 <= v) p *= 2;
    return p;
  };
  const uint32_t rows = 4, chunks = (n_in + 31) / 32;
  const uint32_t fill = n_rows ? pow2_floor((65536ull * rows + n_rows - 1) / n_rows * 2 - 1) : 256;  // rounded up
  // Tall products (an LM head, past ~32k rows) go down to 4 threads a row: fewer lane sums per row (Gemma 3's Q8_0
  // head, 640 x 262,144 on the H100: 1,817 GB/s at 4x4x32 where 16x4x8 gave 1,087; the Q6_K heads of Q4_K_M files on
  // the H200, tg128 at 4x4x32 against 16x4x8: Llama-3.2-1B +1.4 %, a 2-layer Qwen3-30B-A3B +4 %; PERF.md)
  const uint32_t t = std::clamp(std::min(fill, pow2_floor(std::max(chunks, 1u) * 2 - 1)), 4u, 256u);
  return {.threads_per_row = t, .rows = rows, .groups = std::max(1u, 128 / t), .units = 1};
}

// The shape with the adapter's shuffles, checked against its workgroup limits.
MatvecConfig checked(const gpu::Context& ctx, MatvecConfig c) {
  c.shuffle = ctx.features().subgroups;
  const uint64_t red_bytes = matvec_red_bytes(ctx, c, kMatvecMaxTokens);
  if (red_bytes > ctx.limits().maxComputeWorkgroupStorageSize ||
      c.threads_per_row * c.groups > ctx.limits().maxComputeInvocationsPerWorkgroup)
    throw InvalidArgument("matvec config " + std::to_string(c.threads_per_row) + "x" + std::to_string(c.rows) + "x" +
                          std::to_string(c.groups) + " exceeds the adapter's workgroup limits");
  return c;
}

}  // namespace

bool matvec_takes_choose(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_used) {
  return !w.n_experts && w.pieces.size() == 1 && w.n_out <= kMoeMaxExperts && n_used >= 1 && n_used <= w.n_out &&
         n_used <= kMoeMaxUsed && n_used <= matvec_config(ctx, w.n_out, w.n_in, w.type).threads_per_row;
}

MatvecConfig matvec_config(const gpu::Context& ctx, uint32_t n_rows, uint32_t n_in, GgufType type) {
  if (!ctx.options().matvec_shape.empty()) return checked(ctx, parse_matvec_config(ctx.options().matvec_shape));
  // CPU adapters (lavapipe) run a workgroup on one core, SIMD across invocations: short rows of
  // threads with few reduction steps win.
  if (ctx.adapter().is_cpu()) return checked(ctx, {.threads_per_row = 8, .rows = 2, .groups = 8});
  return checked(ctx, gpu_matvec_config(n_rows, n_in, type));
}

bool detail::matvec_takes_second(const gpu::Context& ctx, const GpuWeight& w, const GpuWeight& w2) {
  if (block_elems(w.type) == 1 || block_elems(w2.type) == 1 || w.type == w2.type || w.n_experts || w2.n_experts)
    return false;
  if (w.pieces.size() != 1 || w2.pieces.size() != 1 || w.n_in != w2.n_in || w.n_blocks != w2.n_blocks) return false;
  if (rows_kernel_for(ctx, w.type) || rows_kernel_for(ctx, w2.type)) return false;
  const MatvecConfig mv = matvec_config(ctx, w.n_out + w2.n_out, w.n_in, w.type);
  return w.n_out % (mv.rows * mv.groups) == 0;
}

MatvecConfig pre_matvec_config(const gpu::Context& ctx, uint32_t n_rows, uint32_t n_in, GgufType type, uint32_t split) {
  MatvecConfig mv = matvec_config(ctx, n_rows, n_in, type);
  const uint32_t want = ctx.options().pre_rows.value_or(0);
  while (mv.rows * mv.groups < want && mv.threads_per_row * mv.groups * 2 <= 256 &&
         (split == 0 || split % (mv.rows * mv.groups * 2) == 0))
    mv.groups *= 2;
  return checked(ctx, mv);
}

bool matvec_takes_pre(const gpu::Context& ctx, const GpuWeight& w, MatmulImpl impl) {
  if (impl != MatmulImpl::Auto && impl != MatmulImpl::Matvec) return false;
  if (impl == MatmulImpl::Auto && rows_kernel_for(ctx, w.type)) return false;
  if (w.n_in % 32 || w.n_experts) return false;
  const MatvecConfig mv = pre_matvec_config(ctx, w.n_out, w.n_in, w.type, 0);
  const uint32_t wg = mv.threads_per_row * mv.groups;
  const uint64_t shared = uint64_t(w.n_in) * 4 + uint64_t(wg) * 4 + matvec_red_bytes(ctx, mv, 1);
  return (wg & (wg - 1)) == 0 && shared <= ctx.limits().maxComputeWorkgroupStorageSize;
}

MatvecConfig int_matvec_config(const gpu::Context& ctx, uint32_t n_rows, uint32_t n_in) {
  if (!ctx.options().matvec_shape.empty()) return checked(ctx, parse_matvec_config(ctx.options().matvec_shape));
  if (ctx.adapter().is_cpu()) return checked(ctx, {.threads_per_row = 8, .rows = 2, .groups = 8});
  // H200 (PERF.md, "Q4_K on packed int8 dot products"): long rows 4 rows a workgroup, tall products 8, else 2 x 4
  if (n_in >= 8192) return checked(ctx, {.threads_per_row = 32, .rows = 4, .groups = 1});
  if (n_rows >= 8192) return checked(ctx, {.threads_per_row = 32, .rows = 8, .groups = 1});
  return checked(ctx, {.threads_per_row = 32, .rows = 2, .groups = 4});
}

// GPUs, float types: 32 threads per row (a subgroup on NVIDIA); 4 rows x 4 groups for several tokens, 2 rows x 8
// groups x 2 units in flight for one. The one-token shape's 128 or 256 threads per row reduce 16 tokens' 80 values
// through workgroup memory, which took the H200 2-3x longer at 16 and 64 tokens (PERF.md, "Batched decode"); at one
// token 32x2x8x2 took Llama-3.2-1B's products 0.102 ms where 32x4x4 took 0.125 (PERF.md, "A batched step of one
// token"). The block types' one-token shape was already the best there.
MatvecConfig batch_matvec_config(const gpu::Context& ctx, uint32_t n_rows, uint32_t n_in, GgufType type,
                                 uint32_t n_tokens) {
  MatvecConfig c = block_elems(type) != 1 || !ctx.options().matvec_shape.empty() || ctx.adapter().is_cpu()
                       ? matvec_config(ctx, n_rows, n_in, type)
                   : n_tokens == 1 ? checked(ctx, {.threads_per_row = 32, .rows = 2, .groups = 8, .units = 2})
                                   : checked(ctx, {.threads_per_row = 32, .rows = 4, .groups = 4});
  c.fma_order = true;
  return c;
}

MatvecConfig expert_matvec_config(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_pairs) {
  if (ctx.options().expert_shape.empty())
    return batch_matvec_config(ctx, w.n_out / std::max(w.n_experts, 1u), w.n_in, w.type, n_pairs);
  MatvecConfig c = checked(ctx, parse_matvec_config(ctx.options().expert_shape));
  c.fma_order = true;
  return c;
}

uint32_t batch_tile_from(const gpu::Context& ctx) { return ctx.options().batch_tile_from.value_or(kBatchTileFrom); }

namespace {

std::optional<MatmulTile> batch_tile(const gpu::Context& ctx, uint32_t n_tokens);  // below

// The tiled kernel's order and tile for batch decode's product of w over n_tokens: from batch_tile_from(ctx) tokens
// on products of kBatchTileRows rows or more and on those that split (few tiles), from half the tokens on 8x the rows
// (any product from batch_tile_from when ContextOptions::batch_tile_from is set), where the batch matvec's lane sums
// are one fixed tree (an adapter of one subgroup size) of 4 to 32 lanes a row for the float types, up to 256 for the
// block types; nullopt otherwise (the matvec then takes the product).
std::optional<BatchTiles> batch_tiles(gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens) {
  if (const auto split = ctx.options().batch_split; split && (*split == 0 || (*split & (*split - 1))))
    throw InvalidArgument("batch split " + std::to_string(*split) + ": a power of two (1: never)");
  const uint32_t from = batch_tile_from(ctx);
  const bool forced = ctx.options().batch_tile_from.has_value();  // tuning and tests: whatever the rows
  if (w.n_experts || from == 0 || n_tokens < (forced ? from : from / 2)) return std::nullopt;
  const bool chunks = block_elems(w.type) != 1;
  const MatvecConfig mv = batch_matvec_config(ctx, w.n_out, w.n_in, w.type, 2);
  const uint32_t T = mv.threads_per_row;
  const auto& a = ctx.adapter();
  // units: classes of 4 to 32 (a pass is 4 of them, the tree's levels are those of passes within 32 lanes); chunks:
  // 1 to 256 (a tree of up to 2^kMaxLevels lanes a chunk)
  constexpr uint32_t kMaxLevels = 6;
  if ((chunks ? T > 256 : T < 4 || T > 32) || (mv.shuffle && a.subgroup_min != a.subgroup_max)) return std::nullopt;
  // the lanes of a chunk of the matvec's lane sums: its subgroup's size (at most T; all T where it is not known), one
  // without shuffles
  const uint32_t sg = mv.shuffle ? ctx.subgroup_size() : 1;
  const uint32_t lanes = sg ? std::min(T, sg) : T;
  const uint32_t levels = uint32_t(std::countr_zero(lanes));
  if (chunks && levels > kMaxLevels) return std::nullopt;
  const std::optional<MatmulTile> t = batch_tile(ctx, n_tokens);
  if (!t) return std::nullopt;
  // its x and W tiles, then each token's sums of x^2 per class (units) or the runs' scales and offsets and the
  // tokens' sums (chunks: its thread lid < TM keeps token lid's)
  const uint64_t extra =
      chunks ? 2ull * 2 * (t->rows / 4) * 16 + uint64_t(t->tokens) * (2 * 16 + 4) : uint64_t(t->tokens) * T * 4;
  if (32ull * (t->tokens + t->rows) * 4 + extra > ctx.limits().maxComputeWorkgroupStorageSize ||
      (chunks && t->threads() < t->tokens))
    return std::nullopt;
  ClassOrder order{.classes = T, .shuffle = mv.shuffle, .chunks = chunks, .levels = levels};
  // Split over groups of classes: each group a subtree of a chunk of the lanes' tree, so the subgroup size must be
  // known (gpu::Context::subgroup_size) unless there are no shuffles (chunks of one lane);
  // a float type's group holds whole passes (4 classes). By default the fewest groups that give kSplitWorkgroups
  // workgroups, where the product has fewer; ContextOptions::batch_split forces a count the classes allow.
  const uint32_t known = !mv.shuffle ? 1 : ctx.subgroup_size();
  const uint32_t min_group = chunks ? 1 : 4, classes = chunks ? T : std::max(T, 4u);
  if (known) {
    const uint32_t chunk = std::min(classes, known);  // the lanes of a chunk of the tree
    auto allowed = [&](uint32_t groups) {
      const uint32_t g = classes / groups;
      return groups > 1 && (groups & (groups - 1)) == 0 && groups <= classes && g >= min_group && g <= chunk &&
             (uint64_t(groups) * n_tokens * (w.n_out + 1)) * 4 <= ctx.max_binding_size();
    };
    const uint64_t tiles = uint64_t((w.n_out + t->rows - 1) / t->rows) * ((n_tokens + t->tokens - 1) / t->tokens);
    uint32_t groups = 1;
    if (const auto split = ctx.options().batch_split) {
      if (allowed(*split)) groups = *split;
    } else if (tiles < kSplitWorkgroups) {
      for (uint32_t g = 2; g <= classes; g *= 2)
        if (allowed(g)) {
          groups = g;
          if (tiles * g >= kSplitWorkgroups) break;
        }
    }
    order.groups = groups;
    order.lanes = chunk;
  }
  // (H100, PERF.md "split over groups of lane classes": split, every product is ahead of the matvec from 32 tokens)
  const bool rule = n_tokens >= from ? w.n_out >= kBatchTileRows || order.groups > 1 : w.n_out >= 8 * kBatchTileRows;
  if (!forced && !rule) return std::nullopt;
  return BatchTiles{.order = order, .tile = *t};
}

}  // namespace

bool batch_takes_tiles(gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens) {
  return batch_tiles(ctx, w, n_tokens).has_value();
}

uint32_t batch_tile_groups(gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens) {
  const auto t = batch_tiles(ctx, w, n_tokens);
  return t ? t->order.groups : 0;
}

bool few_tiles_split(gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens) {
  if (n_tokens <= kMatvecMaxTokens || prompt_digits(ctx, w, n_tokens) > 0) return false;
  const MatmulTile t = matmul_tile(ctx, n_tokens, w.n_out);
  const uint64_t tiles = uint64_t((w.n_out + t.rows - 1) / t.rows) * ((n_tokens + t.tokens - 1) / t.tokens);
  return tiles < kFewTiles && batch_tile_groups(ctx, w, n_tokens) > 1;
}

namespace {

// Its tile: 16, 32 or 64 tokens (the fewest that hold the step's) by 64 rows, 4 x 4 outputs a thread; or the
// context's matmul_tile option, unless it has f16 tiles (then none: the matvec).
std::optional<MatmulTile> batch_tile(const gpu::Context& ctx, uint32_t n_tokens) {
  if (!ctx.options().matmul_tile.empty()) {
    const MatmulTile t = matmul_tile(ctx, n_tokens, 0);
    return t.f16 ? std::nullopt : std::optional<MatmulTile>(t);
  }
  const uint32_t tokens = n_tokens <= 16 ? 16 : n_tokens <= 32 ? 32 : 64;
  return MatmulTile{.tokens = tokens, .rows = 64, .thread_tokens = 4, .thread_rows = 4};
}

}  // namespace

double matmul_flops(const GpuWeight& w, uint32_t n_tokens) { return 2.0 * w.n_in * w.n_out * n_tokens; }

namespace {
// The shape of the expert products with the combine (ExpertOptions::combine): the products' own, their groups shared
// out between the n_used pairs (groups = n_used x at least one), within the adapter's workgroup size and memory;
// nullopt where that cannot be.
std::optional<MatvecConfig> combine_config(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens,
                                           uint32_t n_used) {
  if (w.n_experts == 0 || n_used == 0 || w.pieces.size() != 1 ||
      n_tokens > ctx.limits().maxComputeWorkgroupsPerDimension)
    return std::nullopt;
  MatvecConfig mv = expert_matvec_config(ctx, w, n_tokens * n_used);
  mv.groups = n_used * std::max(1u, mv.groups / n_used);
  const uint64_t wg_bytes = matvec_red_bytes(ctx, mv, 1) + uint64_t(mv.groups) * mv.rows * 4;
  if (mv.rows > mv.threads_per_row ||
      uint64_t(mv.threads_per_row) * mv.groups > ctx.limits().maxComputeInvocationsPerWorkgroup ||
      wg_bytes > ctx.limits().maxComputeWorkgroupStorageSize)
    return std::nullopt;
  return mv;
}
}  // namespace

bool expert_combine_fits(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens, uint32_t n_used) {
  return combine_config(ctx, w, n_tokens, n_used).has_value();
}

namespace {
// Whether the expert products of shape mv can take the routing: the experts and pairs within moe_choose.wgsl's
// arrays, and its workgroup memory beside the one-token matvec's.
bool route_fits(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_used, const MatvecConfig& mv) {
  if (w.n_experts == 0 || w.n_experts > kMoeMaxExperts || n_used == 0 || n_used > kMoeMaxUsed || n_used > w.n_experts)
    return false;
  const uint64_t choose_bytes =
      (2ull * kMoeMaxExperts + 3ull * kMoeMaxUsed + uint64_t(mv.threads_per_row) * mv.groups) * 4;
  return matvec_red_bytes(ctx, mv, 1) + choose_bytes <= ctx.limits().maxComputeWorkgroupStorageSize;
}
}  // namespace

bool expert_route_fits(const gpu::Context& ctx, const GpuWeight& w, uint32_t n_tokens, uint32_t n_used) {
  return w.n_experts && route_fits(ctx, w, n_used, expert_matvec_config(ctx, w, n_tokens * n_used));
}

void encode_expert_matmul(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                          const gpu::Buffer& y, const gpu::Buffer& experts, uint32_t n_tokens, uint32_t n_used,
                          const ExpertOptions& o) {
  const char* fn = "encode_expert_matmul";
  detail::check_weight(fn, w);
  if (w.n_experts == 0 || w.n_out % w.n_experts)
    fail(fn, "W must stack experts (uploaded with n_experts; got " + std::to_string(w.n_experts) + ")");
  if (n_tokens == 0 || n_used == 0 || n_used > w.n_experts)
    fail(fn, "n_tokens (" + std::to_string(n_tokens) + ") must be > 0 and n_used (" + std::to_string(n_used) +
                 ") in [1, n_experts " + std::to_string(w.n_experts) + "]");
  const uint32_t rows = w.n_out / w.n_experts;  // per expert
  if (o.swiglu && rows % 2) fail(fn, "swiglu needs an even number of rows per expert (interleaved gate/up rows)");
  if (o.act != GateAct::Silu && !o.swiglu)
    fail(fn, "a gate activation needs swiglu (it selects the gate's activation)");
  if (o.act == GateAct::Sigmoid) fail(fn, "the sigmoid gate is not a matmul epilogue (encode_swiglu runs it)");
  const uint64_t pairs = uint64_t(n_tokens) * n_used;
  if (pairs > ctx.limits().maxComputeWorkgroupsPerDimension)
    fail(fn, "n_tokens * n_used = " + std::to_string(pairs) + " exceeds the adapter's " +
                 std::to_string(ctx.limits().maxComputeWorkgroupsPerDimension) + " workgroups per dimension");
  const uint32_t y_width = o.swiglu ? rows / 2 : rows;
  const uint64_t norm_floats = (uint64_t(w.n_in) + 7) / 8 * 8;
  detail::need(fn, "x", x, (o.x_per_pair ? pairs : n_tokens) * w.n_in * 4, ctx);
  detail::need(fn, "y", y, (o.combine ? n_tokens : pairs) * y_width * 4, ctx);
  detail::need(fn, "experts", experts, pairs * 4, ctx);
  if (o.norm) detail::need(fn, "norm", *o.norm, norm_floats * 4, ctx);
  if (o.norm && !(o.eps > 0)) fail(fn, "eps must be > 0 with norm");
  if (o.bias) detail::need(fn, "bias", *o.bias, uint64_t(w.n_out) * 4, ctx);
  if (o.bias && uint64_t(w.n_out) * 4 > ctx.max_binding_size()) fail(fn, "bias exceeds the storage-binding limit");
  for (const gpu::Buffer* in : {&x, &experts, o.norm, o.combine})
    if (in && in->get() == y.get()) fail(fn, "y must not be an input");

  const gpu::Buffer& none = ctx.placeholder_storage();
  const std::optional<MatvecConfig> cmv = o.combine ? combine_config(ctx, w, n_tokens, n_used) : std::nullopt;
  if (o.combine) {
    if (!cmv || o.swiglu || o.norm || o.group)
      fail(fn, "combine needs one piece, a shape that fits the adapter's workgroup, and no swiglu, norm or group");
    detail::need(fn, "combine", *o.combine, pairs * 4, ctx);
  }
  const MatvecConfig mv = cmv ? *cmv : expert_matvec_config(ctx, w, uint32_t(pairs));
  const ExpertRoute* route = o.route;
  if (route) {
    if (o.group || o.combine || !route_fits(ctx, w, n_used, mv))
      fail(fn, "route needs no group or combine, at most " + std::to_string(kMoeMaxExperts) + " experts and " +
                   std::to_string(kMoeMaxUsed) + " a token, and room in the adapter's workgroup");
    if (!route->logits || !route->weights) fail(fn, "route needs the router's logits and a weights buffer");
    detail::need(fn, "route logits", *route->logits, uint64_t(n_tokens) * w.n_experts * 4, ctx);
    detail::need(fn, "route weights", *route->weights, pairs * 4, ctx);
    if (route->sigmoid_bias)
      detail::need(fn, "route sigmoid_bias", *route->sigmoid_bias, uint64_t(w.n_experts) * 4, ctx);
    for (const gpu::Buffer* out : {&y, &experts, route->weights})
      for (const gpu::Buffer* other : {&x, route->logits, route->sigmoid_bias, o.norm, o.bias})
        if (other && other->get() == out->get()) fail(fn, "route: y, experts and the weights must not be inputs");
    if (experts.get() == route->weights->get() || y.get() == route->weights->get() || y.get() == experts.get())
      fail(fn, "route: y, experts and the weights must be different buffers");
  }
  const uint32_t combine_groups = cmv ? mv.groups / n_used : 1;
  const bool xv4 = w.n_in % 32 == 0;
  if (o.group_tile && o.group_tile != 32 && o.group_tile != 64)
    fail(fn, "group_tile must be 0 (moe_tile's grouping), 32 or 64, not " + std::to_string(o.group_tile));
  if (o.group_tile && !o.group) fail(fn, "group_tile needs the group");
  // tiles of 32 or 64 pairs: the tiled matmul, a workgroup per (tile, 64 rows of the expert; on the digits 128 rows
  // for tiles of 32)
  const bool tiled = o.group_tile != 0;
  const uint32_t tile = tiled ? o.group_tile : moe_tile(uint32_t(pairs), w.n_experts);
  const bool grouped = tiled || (o.group && tile > 1 && matvec_pass_tokens(ctx, mv) >= tile);
  const uint32_t slots = grouped ? moe_group_tiles(uint32_t(pairs), w.n_experts, tile) : uint32_t(pairs);
  if (grouped) detail::need(fn, "group", *o.group, moe_group_words(uint32_t(pairs)) * 4, ctx);
  const MatvecMode mode{
      .experts = true, .combine_pairs = cmv ? n_used : 0, .combine_groups = combine_groups, .route = route != nullptr};
  // tiles on x's digits where the prompt products take them (matmul_int.wgsl's MQ_EXPERTS): x's digits once for every
  // x row, then a workgroup per (tile, rows of the expert): 64 x 64 or 32 x 128
  const uint32_t digits = tiled ? prompt_digits(ctx, w, uint32_t(pairs)) : 0;
  const MatmulTile mt{.tokens = tile, .rows = digits ? detail::int_tile_rows(tile) : 64};
  const uint32_t x_rows = o.x_per_pair ? uint32_t(pairs) : n_tokens;
  const XDigits digit_shape{{}, w.n_in, x_rows};
  const gpu::Buffer* digit_data = digits ? &ctx.scratch(digit_shape.bytes()) : nullptr;
  if (digits) encode_x_digits(batch, ctx, x, 0, uint64_t(x_rows) * w.n_in * 4, 0, *digit_data, w.n_in, x_rows, o.norm);
  WGPUComputePipeline pipe = digits  ? detail::int_tiled_pipeline(ctx, w.type, digits, tile, /*experts=*/true)
                             : tiled ? tiled_pipeline(ctx, mt, w.type, /*experts=*/true)
                                     : matvec_pipeline(ctx, mv, w.type, grouped ? tile : 1, xv4, mode);
  // combine: a workgroup's groups share out its pairs, each pair on combine_groups groups' rows
  const uint32_t rows_per_wg = tiled ? mt.rows : cmv ? mv.rows * combine_groups : mv.rows * mv.groups;
  const uint32_t row_blocks = (rows + rows_per_wg - 1) / rows_per_wg;
  const auto grid =
      gpu::fold_grid(tiled ? uint64_t(row_blocks) * slots : row_blocks, ctx.limits().maxComputeWorkgroupsPerDimension);
  for (const auto& piece : w.pieces) {
    MatmulParams p = detail::piece_params(w, piece, 1);
    p.row_begin = 0;
    p.n_rows = rows;
    p.flags =
        (o.norm ? flags::kNorm : 0) | (o.swiglu ? flags::kSwiglu : 0) | act_flags(o.act) | (o.bias ? flags::kBias : 0);
    p.eps = o.eps;
    p.y_stride = y_width;
    p.grid_x = grid.x;
    p.n_used = n_used;
    p.x_per_pair = o.x_per_pair;
    p.expert_first = piece.row_begin / rows;
    p.n_experts = piece.n_rows / rows;
    p.tiles_off = grouped ? uint32_t(pairs) : 0;
    if (route) {
      p.route_experts = w.n_experts;
      p.route_flags = 1u | (route->sigmoid_bias ? 2u : 0u);  // moe_choose.wgsl's CH_NORM_TOP, CH_SIGMOID
    }
    if (tiled) {
      p.n_tokens = slots;
      p.row_tiles = row_blocks;
    }
    if (digits) {
      p.x_off = uint32_t(digit_shape.scales_vec4());
      const gpu::BufferBinding bindings[] = {batch.uniform(0, p),
                                             {1, &piece.buffer},
                                             {3, &y},
                                             {4, o.bias ? o.bias : &none, 0, o.bias ? uint64_t(w.n_out) * 4 : 16},
                                             {5, o.group},
                                             {7, &ctx.placeholder_writable(), 0, 16},
                                             {8, &ctx.placeholder_writable(), 0, 16},
                                             {16, digit_data, 0, digit_shape.bytes()}};
      batch.dispatch(pipe, bindings, grid.x, grid.y);
      continue;
    }
    std::vector<gpu::BufferBinding> bindings = {
        batch.uniform(0, p),
        {1, &piece.buffer},
        {2, &x},
        {3, &y},
        {4, o.bias ? o.bias : &none, 0, o.bias ? uint64_t(w.n_out) * 4 : 16},
        route ? gpu::BufferBinding{5, &none, 0, 16} : gpu::BufferBinding{5, grouped ? o.group : &experts},
        {6, o.norm ? o.norm : &none, 0, o.norm ? norm_floats * 4 : 16},
        {7, &ctx.placeholder_writable(), 0, 16},
        {8, &ctx.placeholder_writable(), 0, 16},
    };
    if (tiled) {  // a workgroup per (tile slot, row block), folded into x and y
      bindings.push_back({10, &ctx.placeholder_writable(), 0, 16});
      batch.dispatch(pipe, bindings, grid.x, grid.y);
      continue;
    }
    bindings.insert(bindings.end(), {{9, xv4 ? &x : &none, 0, xv4 ? x.size : 16},
                                     {10, &none, 0, 16},
                                     {11, &ctx.placeholder_writable(), 0, 16},
                                     {13, &none, 0, 16},
                                     {14, &none, 0, 16},
                                     {15, &ctx.placeholder_writable(), 0, 16},
                                     {16, &none, 0, 16},
                                     {17, o.combine ? o.combine : &none, 0, o.combine ? pairs * 4 : 16}});
    if (route)
      bindings.insert(bindings.end(),
                      {{19, route->logits, 0, uint64_t(n_tokens) * w.n_experts * 4},
                       {20, &experts, 0, pairs * 4},
                       {21, route->weights, 0, pairs * 4},
                       route->sigmoid_bias ? gpu::BufferBinding{22, route->sigmoid_bias, 0, uint64_t(w.n_experts) * 4}
                                           : gpu::BufferBinding{22, &none, 0, 16}});
    // combine: a workgroup row per token, its pairs in turn
    batch.dispatch(pipe, bindings, grid.x, grid.y, o.combine ? n_tokens : slots);
  }
}

void encode_matmul(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                   const gpu::Buffer& y, uint32_t n_tokens, const MatmulOptions& o) {
  encode_product(batch, ctx, w, x, y, n_tokens, o, nullptr);
}

void detail::encode_matvec_rope_kv(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w,
                                   const gpu::Buffer& x, const gpu::Buffer& y, const MatmulOptions& o,
                                   const RopeKvEpilogue& e) {
  encode_product(batch, ctx, w, x, y, 1, o, &e);
}

}  // namespace wgllm::kernels
