#include "kernels/matmul.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "wgllm/error.h"

namespace wgllm::kernels {

namespace {

constexpr uint32_t kBlock = 32;
constexpr uint32_t kTile = 64;             // TM = TN in matmul.wgsl
constexpr uint32_t kFlagBias = 1, kFlagLastPiece = 2;

[[noreturn]] void fail(const char* fn, const std::string& what) { throw InvalidArgument(std::string(fn) + ": " + what); }

bool quantised(WeightType t) { return t == WeightType::Q8_0 || t == WeightType::Q4_0; }

// GPU bytes of one block's elements (quants only for the quantised types).
uint32_t block_data_bytes(WeightType t) {
  switch (t) {
    case WeightType::F32: return 128;
    case WeightType::F16:
    case WeightType::BF16: return 64;
    case WeightType::Q8_0: return 32;
    case WeightType::Q4_0: return 16;
  }
  return 0;
}

// GGUF bytes of one block of 32 (or per element for the float types x 32).
uint32_t gguf_block_bytes(WeightType t) {
  switch (t) {
    case WeightType::F32: return 128;
    case WeightType::F16:
    case WeightType::BF16: return 64;
    case WeightType::Q8_0: return 34;
    case WeightType::Q4_0: return 18;
  }
  return 0;
}

uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

// Bytes of a piece of `rows` rows (quants, 16-byte aligned, then scales).
uint64_t piece_bytes(WeightType t, uint32_t nb, uint64_t rows) {
  const uint64_t data = rows * nb * block_data_bytes(t);
  if (!quantised(t)) return data;
  return data + round_up(rows * nb * 2, 16);
}

// Repacks GGUF rows [row_begin, row_begin + rows) into the GPU piece layout.
std::vector<uint8_t> repack(WeightType t, uint32_t n_in, uint32_t nb, const uint8_t* src, uint32_t row_begin,
                            uint32_t rows) {
  std::vector<uint8_t> out(piece_bytes(t, nb, rows), 0);
  if (!quantised(t)) {
    const uint32_t esize = t == WeightType::F32 ? 4 : 2;
    const uint64_t src_row = uint64_t(n_in) * esize, dst_row = uint64_t(nb) * block_data_bytes(t);
    for (uint32_t r = 0; r < rows; ++r)
      std::memcpy(&out[r * dst_row], src + (uint64_t(row_begin) + r) * src_row, src_row);
    return out;
  }
  const uint32_t qbytes = block_data_bytes(t), bbytes = gguf_block_bytes(t);
  const uint64_t scales = uint64_t(rows) * nb * qbytes;
  const uint8_t* s = src + uint64_t(row_begin) * nb * bbytes;
  for (uint64_t blk = 0; blk < uint64_t(rows) * nb; ++blk, s += bbytes) {
    std::memcpy(&out[scales + blk * 2], s, 2);
    std::memcpy(&out[blk * qbytes], s + 2, qbytes);
  }
  return out;
}

// A contiguous range of rows of `stride` 4-byte words bound with an aligned offset.
struct RowWindow {
  uint64_t offset_bytes, size_bytes;
  uint32_t first_word;  // words from the binding start to the first row
};
RowWindow row_window(const gpu::Context& ctx, uint64_t first_row, uint64_t n_rows, uint64_t stride) {
  const uint64_t align = ctx.limits().minStorageBufferOffsetAlignment;
  const uint64_t begin = first_row * stride * 4;
  const uint64_t offset = begin / align * align;
  const uint64_t end = (first_row + n_rows) * stride * 4;
  return {offset, end - offset, uint32_t((begin - offset) / 4)};
}

// Tokens per dispatch so that windows of rows with these strides (in words) fit a binding.
uint32_t tokens_per_binding(const char* fn, const gpu::Context& ctx, std::initializer_list<uint64_t> strides) {
  const uint64_t room = ctx.max_binding_size() - ctx.limits().minStorageBufferOffsetAlignment;
  uint64_t rows = UINT32_MAX;
  for (uint64_t s : strides) rows = std::min(rows, room / (s * 4));
  if (rows == 0) fail(fn, "one activation row exceeds the storage-binding limit");
  return uint32_t(rows);
}

std::string prelude(const gpu::Context& ctx, WeightType t, uint32_t nt) {
  const MatvecConfig mv = matvec_config(ctx);
  return "const WTYPE: u32 = " + std::to_string(uint32_t(t)) + "u;\nconst NT: u32 = " + std::to_string(nt) +
         "u;\nconst MV_ROWS: u32 = " + std::to_string(mv.rows) + "u;\nconst MV_T: u32 = " +
         std::to_string(mv.threads_per_row) + "u;\nconst MV_SHUFFLE: bool = " + (mv.shuffle ? "true" : "false") +
         ";\n" +
         (mv.shuffle ? "fn mv_row_sum(v: f32) -> f32 {\n  var x = v;\n"
                       "  for (var s = MV_T / 2u; s > 0u; s >>= 1u) { x += subgroupShuffleXor(x, s); }\n"
                       "  return x;\n}\n"
                     : "fn mv_row_sum(v: f32) -> f32 { return v; }\n");
}

void check_weight(const char* fn, const GpuWeight& w) {
  if (w.pieces.empty() || w.n_in == 0 || w.n_out == 0) fail(fn, "weight W is empty (not uploaded)");
}

}  // namespace

MatvecConfig matvec_config(const gpu::Context& ctx) {
  MatvecConfig c;
  // CPU adapters (lavapipe) run a workgroup on one core, SIMD across invocations: short rows of
  // threads with few reduction steps win. GPUs: 32 threads per row keeps loads coalesced.
  c.threads_per_row = ctx.adapter().type == "CPU" ? 8 : 32;
  c.rows = 8;
  c.shuffle = ctx.features().subgroups && ctx.adapter().subgroup_min >= c.threads_per_row;
  return c;
}

const char* weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::F32: return "F32";
    case WeightType::F16: return "F16";
    case WeightType::BF16: return "BF16";
    case WeightType::Q8_0: return "Q8_0";
    case WeightType::Q4_0: return "Q4_0";
  }
  return "?";
}

WeightType weight_type_from_ggml(uint32_t ggml_type) {
  switch (ggml_type) {
    case 0: return WeightType::F32;
    case 1: return WeightType::F16;
    case 2: return WeightType::Q4_0;
    case 8: return WeightType::Q8_0;
    case 30: return WeightType::BF16;
    default:
      throw InvalidArgument("weight type: GGML type " + std::to_string(ggml_type) +
                            " is not supported (F32, F16, BF16, Q8_0, Q4_0)");
  }
}

uint64_t gguf_bytes(WeightType t, uint64_t ne0, uint64_t ne1) {
  switch (t) {
    case WeightType::F32: return ne0 * ne1 * 4;
    case WeightType::F16:
    case WeightType::BF16: return ne0 * ne1 * 2;
    case WeightType::Q8_0: return ne0 / 32 * 34 * ne1;
    case WeightType::Q4_0: return ne0 / 32 * 18 * ne1;
  }
  return 0;
}

uint64_t GpuWeight::gpu_bytes() const {
  uint64_t b = 0;
  for (const auto& p : pieces) b += p.buffer.size;
  return b;
}

GpuWeight upload_weight(gpu::Context& ctx, WeightType type, uint64_t ne0, uint64_t ne1,
                        std::span<const uint8_t> bytes, std::string_view label, uint64_t max_piece_bytes) {
  const char* fn = "upload_weight";
  if (uint32_t(type) > uint32_t(WeightType::Q4_0)) fail(fn, "type " + std::to_string(uint32_t(type)) + " unknown");
  if (ne0 == 0 || ne0 > (1u << 24)) fail(fn, "ne0 (n_in) " + std::to_string(ne0) + " must be in [1, 2^24]");
  if (ne1 == 0 || ne1 > UINT32_MAX) fail(fn, "ne1 (n_out) " + std::to_string(ne1) + " must be in [1, 2^32)");
  if (quantised(type) && ne0 % kBlock != 0)
    fail(fn, "ne0 (n_in) " + std::to_string(ne0) + " must be a multiple of 32 for " + weight_type_name(type));
  if (bytes.size() != gguf_bytes(type, ne0, ne1))
    fail(fn, "bytes holds " + std::to_string(bytes.size()) + ", a " + weight_type_name(type) + " [" +
                 std::to_string(ne1) + "][" + std::to_string(ne0) + "] tensor needs " +
                 std::to_string(gguf_bytes(type, ne0, ne1)));
  GpuWeight w;
  w.type = type;
  w.n_in = uint32_t(ne0);
  w.n_out = uint32_t(ne1);
  w.n_blocks = uint32_t((ne0 + kBlock - 1) / kBlock);
  const uint64_t limit = max_piece_bytes ? std::min(max_piece_bytes, ctx.max_binding_size()) : ctx.max_binding_size();
  const uint64_t row_bytes = uint64_t(w.n_blocks) * (block_data_bytes(type) + (quantised(type) ? 2 : 0));
  const uint64_t rows_per_piece = limit < 16 + row_bytes ? 0 : (limit - 16) / row_bytes;
  if (rows_per_piece == 0)
    fail(fn, "one row (" + std::to_string(row_bytes) + " bytes) exceeds the storage-binding limit of " +
                 std::to_string(limit));
  for (uint64_t r0 = 0; r0 < ne1; r0 += rows_per_piece) {
    const uint32_t rows = uint32_t(std::min<uint64_t>(rows_per_piece, ne1 - r0));
    GpuWeightPiece piece;
    piece.row_begin = uint32_t(r0);
    piece.n_rows = rows;
    piece.scale_off4 = quantised(type) ? uint32_t(uint64_t(rows) * w.n_blocks * block_data_bytes(type) / 16) : 0;
    const auto data = repack(type, w.n_in, w.n_blocks, bytes.data(), piece.row_begin, rows);
    piece.buffer = ctx.create_buffer(data.size(), WGPUBufferUsage_Storage, label);
    ctx.write_buffer(piece.buffer, 0, data.data(), data.size());
    w.pieces.push_back(std::move(piece));
  }
  return w;
}

double matmul_flops(const GpuWeight& w, uint32_t n_tokens) { return 2.0 * w.n_in * w.n_out * n_tokens; }

void encode_matmul(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& w, const gpu::Buffer& x,
                   const gpu::Buffer& y, uint32_t n_tokens, const gpu::Buffer* bias, MatmulImpl impl) {
  const char* fn = "encode_matmul";
  check_weight(fn, w);
  if (n_tokens == 0) fail(fn, "n_tokens must be > 0");
  if (x.size < uint64_t(n_tokens) * w.n_in * 4)
    fail(fn, "x holds " + std::to_string(x.size) + " bytes, needs n_tokens * n_in * 4 = " +
                 std::to_string(uint64_t(n_tokens) * w.n_in * 4));
  if (y.size < uint64_t(n_tokens) * w.n_out * 4)
    fail(fn, "y holds " + std::to_string(y.size) + " bytes, needs n_tokens * n_out * 4 = " +
                 std::to_string(uint64_t(n_tokens) * w.n_out * 4));
  if (x.get() == y.get()) fail(fn, "x and y must be different buffers");
  if (bias && bias->size < uint64_t(w.n_out) * 4)
    fail(fn, "bias holds " + std::to_string(bias->size) + " bytes, needs n_out * 4 = " +
                 std::to_string(uint64_t(w.n_out) * 4));
  if (bias && uint64_t(w.n_out) * 4 > ctx.max_binding_size()) fail(fn, "bias exceeds the storage-binding limit");
  if (impl == MatmulImpl::Auto) impl = n_tokens <= kMatvecMaxTokens ? MatmulImpl::Matvec : MatmulImpl::Tiled;

  const uint32_t max_grid = ctx.limits().maxComputeWorkgroupsPerDimension;
  uint32_t step = tokens_per_binding(fn, ctx, {w.n_in, w.n_out});
  if (impl == MatmulImpl::Matvec) step = std::min(step, kMatvecMaxTokens);
  const gpu::Buffer& bias_buf = bias ? *bias : ctx.placeholder_storage();
  const MatvecConfig mv = matvec_config(ctx);
  const uint64_t bias_bytes = bias ? uint64_t(w.n_out) * 4 : 16;

  for (uint32_t first = 0; first < n_tokens; first += step) {
    const uint32_t count = std::min(step, n_tokens - first);
    const RowWindow xw = row_window(ctx, first, count, w.n_in);
    const RowWindow yw = row_window(ctx, first, count, w.n_out);
    WGPUComputePipeline pipe =
        impl == MatmulImpl::Matvec
            ? ctx.pipeline({"matmul.wgsl", "matvec", {}, prelude(ctx, w.type, count)})
            : ctx.pipeline({"matmul.wgsl", "matmul", {}, prelude(ctx, w.type, 1)});
    for (const auto& piece : w.pieces) {
      MatmulParams p{};
      p.n_in = w.n_in;
      p.n_out = w.n_out;
      p.n_tokens = count;
      p.nb = w.n_blocks;
      p.row_begin = piece.row_begin;
      p.n_rows = piece.n_rows;
      p.scale_off4 = piece.scale_off4;
      p.flags = bias ? kFlagBias : 0;
      p.x_off = xw.first_word;
      p.y_off = yw.first_word;
      uint64_t n_wg;
      if (impl == MatmulImpl::Matvec) {
        n_wg = (piece.n_rows + mv.rows - 1) / mv.rows;
      } else {
        p.row_tiles = (piece.n_rows + kTile - 1) / kTile;
        n_wg = uint64_t(p.row_tiles) * ((count + kTile - 1) / kTile);
      }
      const auto grid = gpu::fold_grid(n_wg, max_grid);
      p.grid_x = grid.x;
      const gpu::BufferBinding bindings[] = {
          batch.uniform(0, p),
          {1, &piece.buffer},
          {2, &x, xw.offset_bytes, xw.size_bytes},
          {3, &y, yw.offset_bytes, yw.size_bytes},
          {4, &bias_buf, 0, bias_bytes},
      };
      batch.dispatch(pipe, bindings, grid.x, grid.y);
    }
  }
}

void encode_embedding(gpu::ComputeBatch& batch, gpu::Context& ctx, const GpuWeight& table, const gpu::Buffer& ids,
                      const gpu::Buffer& out, uint32_t n_tokens) {
  const char* fn = "encode_embedding";
  check_weight(fn, table);
  if (n_tokens == 0) fail(fn, "n_tokens must be > 0");
  if (ids.size < uint64_t(n_tokens) * 4)
    fail(fn, "ids holds " + std::to_string(ids.size) + " bytes, needs n_tokens * 4 = " +
                 std::to_string(uint64_t(n_tokens) * 4));
  if (out.size < uint64_t(n_tokens) * table.n_in * 4)
    fail(fn, "out holds " + std::to_string(out.size) + " bytes, needs n_tokens * n_embd * 4 = " +
                 std::to_string(uint64_t(n_tokens) * table.n_in * 4));
  const uint32_t max_grid = ctx.limits().maxComputeWorkgroupsPerDimension;
  const uint32_t step = std::min(tokens_per_binding(fn, ctx, {table.n_in}), max_grid);
  WGPUComputePipeline pipe = ctx.pipeline({"matmul.wgsl", "embed", {}, prelude(ctx, table.type, 1)});
  for (uint32_t first = 0; first < n_tokens; first += step) {
    const uint32_t count = std::min(step, n_tokens - first);
    const RowWindow iw = row_window(ctx, first, count, 1);
    const RowWindow ow = row_window(ctx, first, count, table.n_in);
    for (size_t i = 0; i < table.pieces.size(); ++i) {
      const auto& piece = table.pieces[i];
      MatmulParams p{};
      p.n_in = table.n_in;
      p.n_out = table.n_out;
      p.n_tokens = count;
      p.nb = table.n_blocks;
      p.row_begin = piece.row_begin;
      p.n_rows = piece.n_rows;
      p.scale_off4 = piece.scale_off4;
      p.flags = i + 1 == table.pieces.size() ? kFlagLastPiece : 0;
      p.x_off = iw.first_word;
      p.y_off = ow.first_word;
      p.grid_x = count;
      const gpu::BufferBinding bindings[] = {
          batch.uniform(0, p),
          {1, &piece.buffer},
          {3, &out, ow.offset_bytes, ow.size_bytes},
          {5, &ids, iw.offset_bytes, iw.size_bytes},
      };
      batch.dispatch(pipe, bindings, count);
    }
  }
}

}  // namespace wgllm::kernels
