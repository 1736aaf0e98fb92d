#include "kernels/weight.h"

#include <algorithm>
#include <cstring>

#include "kernels/check.h"

namespace wgllm::kernels {

namespace {

constexpr uint32_t kBlock = 32;  // elements per GPU unit block (matmul_common.wgsl's nb counts these)

// The GPU layout of a type (matmul_common.wgsl documents each): every GGUF block (for F32/F16/BF16: every 32
// elements) becomes `data` bytes, a multiple of 4 (padded with zeros where the GGUF block is not), in row order;
// the `split` bytes at `split_at` of each block (the f16 scale d, or d and dmin; MXFP4's scale byte) move to a second
// array after the data. Splitting or padding makes the data's 4-byte words, and the pairs of words a load reads,
// aligned (PERF.md: the layouts measured).
struct Layout {
  uint32_t elems, data, split_at, split;
};
Layout layout(GgufType t) {
  switch (t) {
    case GgufType::F32: return {32, 128, 0, 0};
    case GgufType::F16:
    case GgufType::BF16: return {32, 64, 0, 0};
    case GgufType::Q8_0: return {32, 32, 0, 2};
    case GgufType::Q4_0: return {32, 16, 0, 2};
    case GgufType::Q4_1: return {32, 20, 0, 0};
    case GgufType::Q5_0: return {32, 20, 0, 2};
    case GgufType::Q5_1: return {32, 24, 0, 0};
    case GgufType::Q2_K: return {256, 80, 80, 4};
    case GgufType::Q3_K: return {256, 112, 0, 0};  // 110 bytes padded to 112
    case GgufType::Q4_K: return {256, 144, 0, 0};
    case GgufType::Q5_K: return {256, 176, 0, 0};
    case GgufType::Q6_K: return {256, 208, 208, 2};
    case GgufType::MXFP4: return {32, 16, 0, 1};  // the scale byte e apart: the quants one aligned vec4
    default: return {0, 0, 0, 0};
  }
}

uint64_t round_up(uint64_t v, uint64_t m) { return (v + m - 1) / m * m; }

// GPU blocks per row: nb unit blocks of 32 grouped by the type's block.
uint64_t row_blocks(GgufType t, uint32_t nb) { return uint64_t(nb) * kBlock / layout(t).elems; }

// Bytes of the data array of a piece of `rows` rows, rounded to 16 (the split array starts there).
uint64_t data_bytes(GgufType t, uint32_t nb, uint64_t rows) {
  return round_up(rows * row_blocks(t, nb) * layout(t).data, 16);
}

// Bytes of a piece of `rows` rows: the data, then the split array.
uint64_t piece_bytes(GgufType t, uint32_t nb, uint64_t rows) {
  return data_bytes(t, nb, rows) + round_up(rows * row_blocks(t, nb) * layout(t).split, 16);
}

// Repacks GGUF rows [row_begin, row_begin + rows) into the GPU piece layout.
std::vector<uint8_t> repack(GgufType t, uint32_t n_in, uint32_t nb, const uint8_t* src, uint32_t row_begin,
                            uint32_t rows) {
  std::vector<uint8_t> out(piece_bytes(t, nb, rows), 0);
  const Layout l = layout(t);
  if (block_elems(t) == 1) {  // float types: rows padded to whole unit blocks
    const uint64_t src_row = tensor_bytes(t, n_in), dst_row = uint64_t(nb) * l.data;
    for (uint32_t r = 0; r < rows; ++r)
      std::memcpy(&out[r * dst_row], src + (uint64_t(row_begin) + r) * src_row, src_row);
    return out;
  }
  const uint32_t bb = block_bytes(t), tail = bb - l.split_at - l.split;
  const uint64_t blocks = uint64_t(rows) * row_blocks(t, nb), split_base = data_bytes(t, nb, rows);
  const uint8_t* s = src + uint64_t(row_begin) * row_blocks(t, nb) * bb;
  for (uint64_t blk = 0; blk < blocks; ++blk, s += bb) {
    uint8_t* d = &out[blk * l.data];
    std::memcpy(d, s, l.split_at);
    std::memcpy(d + l.split_at, s + l.split_at + l.split, tail);
    if (l.split) std::memcpy(&out[split_base + blk * l.split], s + l.split_at, l.split);
  }
  return out;
}

}  // namespace

namespace detail {

void check_weight(const char* fn, const GpuWeight& w) {
  if (w.pieces.empty() || w.n_in == 0 || w.n_out == 0) fail(fn, "weight W is empty (not uploaded)");
}

RowWindow row_window(const gpu::Context& ctx, uint64_t first_row, uint64_t n_rows, uint64_t stride) {
  const uint64_t align = ctx.limits().minStorageBufferOffsetAlignment;
  const uint64_t begin = first_row * stride * 4;
  const uint64_t offset = begin / align * align;
  const uint64_t end = (first_row + n_rows) * stride * 4;
  return {offset, end - offset, uint32_t((begin - offset) / 4)};
}

uint32_t tokens_per_binding(const char* fn, const gpu::Context& ctx, std::initializer_list<uint64_t> strides) {
  const uint64_t room = ctx.max_binding_size() - ctx.limits().minStorageBufferOffsetAlignment;
  uint64_t rows = UINT32_MAX;
  for (uint64_t s : strides) rows = std::min(rows, room / (s * 4));
  if (rows == 0) fail(fn, "one activation row exceeds the storage-binding limit");
  return uint32_t(rows);
}

std::string weight_prelude(GgufType t, uint32_t nt, bool int_f16, std::optional<GgufType> t2) {
  std::string s = "const WTYPE: u32 = " + std::to_string(uint32_t(t)) + "u;\nconst NT: u32 = " + std::to_string(nt) +
                  "u;\nconst F16_INT: bool = " + (int_f16 ? "true" : "false") + ";\n";
  if (!t2)
    return s +
           "const TWO_TYPES: bool = false;\nconst N_WTYPES: u32 = 1u;\nconst WTYPE2: u32 = WTYPE;\n"
           "fn wvec(wt: u32, i: u32) -> vec4<u32> { return w[i]; }\n"
           "fn wword(wt: u32, i: u32, c: u32) -> u32 { return w[i][c]; }\n"
           "fn scale_off(wt: u32) -> u32 { return p.scale_off4; }\n";
  return s + "const TWO_TYPES: bool = true;\nconst N_WTYPES: u32 = 2u;\nconst WTYPE2: u32 = " +
         std::to_string(uint32_t(*t2)) +
         "u;\n@group(0) @binding(18) var<storage, read> w2: array<vec4<u32>>;\n"
         "fn wvec(wt: u32, i: u32) -> vec4<u32> {\n  if (wt == WTYPE2) { return w2[i]; }\n  return w[i];\n}\n"
         "fn wword(wt: u32, i: u32, c: u32) -> u32 {\n  if (wt == WTYPE2) { return w2[i][c]; }\n  return w[i][c];\n}\n"
         "fn scale_off(wt: u32) -> u32 { return select(p.scale_off4, p.scale2_off4, wt == WTYPE2); }\n";
}

MatmulParams piece_params(const GpuWeight& w, const GpuWeightPiece& piece, uint32_t n_tokens) {
  MatmulParams p{};
  p.n_in = w.n_in;
  p.n_out = w.n_out;
  p.n_tokens = n_tokens;
  p.nb = w.n_blocks;
  p.row_begin = piece.row_begin;
  p.n_rows = piece.n_rows;
  p.scale_off4 = piece.scale_off4;
  return p;
}

}  // namespace detail

using detail::fail;

std::vector<uint8_t> concat_rows(std::span<const std::span<const uint8_t>> parts) {
  std::vector<uint8_t> out;
  for (const auto& part : parts) out.insert(out.end(), part.begin(), part.end());
  return out;
}

std::vector<uint8_t> interleave_rows(std::span<const uint8_t> a, std::span<const uint8_t> b, uint64_t rows) {
  if (rows == 0 || a.size() != b.size() || a.size() % rows)
    throw InvalidArgument("interleave_rows: the two tensors must have the same size and " + std::to_string(rows) +
                          " rows");
  const uint64_t row = a.size() / rows;
  std::vector<uint8_t> out(a.size() * 2);
  for (uint64_t r = 0; r < rows; ++r) {
    std::memcpy(&out[2 * r * row], &a[r * row], row);
    std::memcpy(&out[(2 * r + 1) * row], &b[r * row], row);
  }
  return out;
}

uint64_t GpuWeight::gpu_bytes() const {
  uint64_t b = 0;
  for (const auto& p : pieces) b += p.buffer.size;
  return b;
}

GpuWeight upload_weight(gpu::Context& ctx, GgufType type, uint64_t ne0, uint64_t ne1, std::span<const uint8_t> bytes,
                        std::string_view label, uint64_t max_piece_bytes, uint32_t n_experts) {
  const char* fn = "upload_weight";
  if (!is_supported_type(uint32_t(type)))
    fail(fn, "type " + std::string(type_name(type)) + " (id " + std::to_string(uint32_t(type)) +
                 ") is not one wgllm runs (it runs " + supported_type_names() + ")");
  if (ne0 == 0 || ne0 > (1u << 24)) fail(fn, "ne0 (n_in) " + std::to_string(ne0) + " must be in [1, 2^24]");
  if (ne1 == 0 || ne1 > UINT32_MAX) fail(fn, "ne1 (n_out) " + std::to_string(ne1) + " must be in [1, 2^32)");
  if (ne0 % block_elems(type) != 0)
    fail(fn, "ne0 (n_in) " + std::to_string(ne0) + " must be a multiple of " + std::to_string(block_elems(type)) +
                 " for " + type_name(type));
  if (bytes.size() != tensor_bytes(type, ne0, ne1))
    fail(fn, "bytes holds " + std::to_string(bytes.size()) + ", a " + type_name(type) + " [" + std::to_string(ne1) +
                 "][" + std::to_string(ne0) + "] tensor needs " + std::to_string(tensor_bytes(type, ne0, ne1)));
  GpuWeight w;
  w.type = type;
  w.n_in = uint32_t(ne0);
  w.n_out = uint32_t(ne1);
  w.n_blocks = uint32_t((ne0 + kBlock - 1) / kBlock);
  const uint64_t limit = max_piece_bytes ? std::min(max_piece_bytes, ctx.max_binding_size()) : ctx.max_binding_size();
  const Layout l = layout(type);
  const uint64_t row_bytes = row_blocks(type, w.n_blocks) * (l.data + l.split);
  uint64_t rows_per_piece = limit < 32 + row_bytes ? 0 : (limit - 32) / row_bytes;  // 32: the two arrays' padding
  if (rows_per_piece > 1) rows_per_piece &= ~uint64_t(1);  // pieces start at even rows (SwiGLU pairs)
  if (rows_per_piece == 0)
    fail(fn, "one row (" + std::to_string(row_bytes) + " bytes) exceeds the storage-binding limit of " +
                 std::to_string(limit));
  if (n_experts > 0) {  // whole experts per piece
    if (ne1 % n_experts) fail(fn, "ne1 (" + std::to_string(ne1) + ") is not a multiple of n_experts " + std::to_string(n_experts));
    const uint64_t expert_rows = ne1 / n_experts;
    if (rows_per_piece < expert_rows)
      fail(fn, "one expert (" + std::to_string(expert_rows * row_bytes) +
                   " bytes) exceeds the storage-binding limit of " + std::to_string(limit));
    rows_per_piece -= rows_per_piece % expert_rows;
    w.n_experts = n_experts;
  }
  for (uint64_t r0 = 0; r0 < ne1; r0 += rows_per_piece) {
    const uint32_t rows = uint32_t(std::min<uint64_t>(rows_per_piece, ne1 - r0));
    GpuWeightPiece piece;
    piece.row_begin = uint32_t(r0);
    piece.n_rows = rows;
    piece.scale_off4 = l.split ? uint32_t(data_bytes(type, w.n_blocks, rows) / 16) : 0;
    const auto data = repack(type, w.n_in, w.n_blocks, bytes.data(), piece.row_begin, rows);
    piece.buffer = ctx.create_buffer(data.size(), WGPUBufferUsage_Storage, label);
    ctx.write_buffer(piece.buffer, 0, data.data(), data.size());
    w.pieces.push_back(std::move(piece));
  }
  return w;
}

}  // namespace wgllm::kernels
