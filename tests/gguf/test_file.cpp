#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "gguf/file.h"
#include "gguf_builder.h"
#include "wgllm/error.h"

namespace wgllm::test {
namespace {

GgufFile parse(const std::vector<uint8_t>& b) { return GgufFile::from_bytes(b); }

std::string parse_error(const std::vector<uint8_t>& b) {
  try {
    parse(b);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "(no error)";
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

GgufBuilder every_type_builder(uint32_t version) {
  GgufBuilder g;
  g.version = version;
  g.kv("u8", GVal::u8(200))
      .kv("i8", GVal::i8(-100))
      .kv("u16", GVal::u16(60000))
      .kv("i16", GVal::i16(-30000))
      .kv("u32", GVal::u32(4000000000u))
      .kv("i32", GVal::i32(-2000000000))
      .kv("f32", GVal::f32(1.5f))
      .kv("bool", GVal::boolean(true))
      .kv("string", GVal::str("héllo"))
      .kv("u64", GVal::u64(1ull << 40))
      .kv("i64", GVal::i64(-(1ll << 40)))
      .kv("f64", GVal::f64(0.1))
      .kv("empty_string", GVal::str(""))
      .kv("strings", GVal::strings({"a", "", "ccc"}))
      .kv("f32s", GVal::f32s({1.f, -2.5f}))
      .kv("i32s", GVal::i32s({-1, 7, 2147483647}))
      .kv("u8s", GVal::array(0, {GVal::u8(1), GVal::u8(255)}))
      .kv("bools", GVal::array(7, {GVal::boolean(false), GVal::boolean(true)}))
      .kv("f64s", GVal::array(12, {GVal::f64(2.0)}))
      .kv("u64s", GVal::array(10, {GVal::u64(~0ull)}))
      .kv("empty_array", GVal::array(4, {}))
      .kv("nested", GVal::array(9, {GVal::array(5, {GVal::i32(1), GVal::i32(2)}),
                                    GVal::array(9, {GVal::array(8, {GVal::str("deep")})})}));
  g.tensor(GTensor{"w", {4, 2}, 0, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8}), {}, {}});
  return g;
}

TEST(GgufFile, RoundTripsEveryValueType) {
  for (uint32_t version : {2u, 3u}) {
    SCOPED_TRACE("version " + std::to_string(version));
    auto g = every_type_builder(version);
    const auto f = parse(g.build());
    EXPECT_EQ(f.version(), version);
    EXPECT_EQ(f.metadata().size(), 22u);
    EXPECT_EQ(f.get_u32("u8"), 200u);
    EXPECT_EQ(f.get_i32("i8"), -100);
    EXPECT_EQ(f.get_u32("u16"), 60000u);
    EXPECT_EQ(f.get_i32("i16"), -30000);
    EXPECT_EQ(f.get_u32("u32"), 4000000000u);
    EXPECT_EQ(f.get_i32("i32"), -2000000000);
    EXPECT_EQ(f.get_f32("f32"), 1.5f);
    EXPECT_TRUE(f.get_bool("bool"));
    EXPECT_EQ(f.get_string("string"), "héllo");
    EXPECT_EQ(f.get_u64("u64"), 1ull << 40);
    EXPECT_EQ(std::get<int64_t>(f.find("i64")->v), -(1ll << 40));
    EXPECT_EQ(std::get<double>(f.find("f64")->v), 0.1);
    EXPECT_EQ(f.get_f32("f64"), 0.1f);
    EXPECT_EQ(f.get_string("empty_string"), "");
    EXPECT_EQ(f.get_string_array("strings").strings(), (std::vector<std::string>{"a", "", "ccc"}));
    EXPECT_EQ(f.get_string_array("strings").string(2), "ccc");
    EXPECT_EQ(f.get_f32_array("f32s"), (std::vector<float>{1.f, -2.5f}));
    EXPECT_EQ(f.get_i32_array("i32s"), (std::vector<int32_t>{-1, 7, 2147483647}));
    EXPECT_EQ(f.get_i32_array("u8s"), (std::vector<int32_t>{1, 255}));
    const auto& bools = std::get<GgufArray>(f.find("bools")->v);
    EXPECT_EQ(bools.elem_type(), GgufValueType::Bool);
    ASSERT_EQ(bools.size(), 2u);
    EXPECT_FALSE(bools.boolean(0));
    EXPECT_TRUE(bools.boolean(1));
    EXPECT_EQ(f.get_f32_array("f64s"), (std::vector<float>{2.f}));
    EXPECT_EQ(std::get<GgufArray>(f.find("u64s")->v).u64(0), ~0ull);
    EXPECT_EQ(f.get_i32_array("empty_array").size(), 0u);
    const auto& nested = std::get<GgufArray>(f.find("nested")->v);
    EXPECT_EQ(f.find("nested")->type_string(), "array of array");
    ASSERT_EQ(nested.elem_type(), GgufValueType::Array);
    ASSERT_EQ(nested.size(), 2u);
    const GgufArray first = nested.array(0);
    ASSERT_EQ(first.size(), 2u);
    EXPECT_EQ(first.i64(0), 1);
    EXPECT_EQ(first.i64(1), 2);
    const GgufArray inner = nested.array(1);
    ASSERT_EQ(inner.size(), 1u);
    ASSERT_EQ(inner.array(0).size(), 1u);
    EXPECT_EQ(inner.array(0).string(0), "deep");
    // accessors of another element type, or past the end
    EXPECT_THROW(first.u64(0), std::logic_error);
    EXPECT_THROW(first.string(0), std::logic_error);
    EXPECT_THROW(first.i64(2), std::out_of_range);
    EXPECT_THROW(nested.array(2), std::out_of_range);
    // find_* variants
    EXPECT_EQ(f.find_u32("u16"), 60000u);
    EXPECT_EQ(f.find_u32("absent"), std::nullopt);
    EXPECT_EQ(f.find_string("absent"), std::nullopt);
    EXPECT_EQ(f.find_f32("f32"), 1.5f);
    EXPECT_EQ(f.find_bool("bool"), true);
    EXPECT_EQ(f.find_i32("i8"), -100);
    // the tensor
    ASSERT_EQ(f.tensors().size(), 1u);
    const auto& t = f.tensor("w");
    EXPECT_EQ(t.n_dims, 2u);
    EXPECT_EQ(t.ne[0], 4u);
    EXPECT_EQ(t.ne[1], 2u);
    EXPECT_EQ(t.n_elements, 8u);
    EXPECT_EQ(t.n_bytes, 32u);
    EXPECT_EQ(t.shape_string(), "[4, 2]");
    const auto d = f.tensor_data(t);
    ASSERT_EQ(d.size(), 32u);
    float x[8];
    std::memcpy(x, d.data(), 32);
    EXPECT_EQ(x[0], 1.f);
    EXPECT_EQ(x[7], 8.f);
    EXPECT_EQ(f.data_offset() % 32, 0u);
  }
}

TEST(GgufFile, GettersNameTheKeyAndTheTypes) {
  auto g = every_type_builder(3);
  const auto f = parse(g.build());
  auto msg = [&](const std::function<void()>& fn) -> std::string {
    try {
      fn();
    } catch (const ModelError& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_THAT(msg([&] { f.get_u32("string"); }), ::testing::HasSubstr("key 'string': expected u32, found string"));
  EXPECT_THAT(msg([&] { f.get_u32("i8"); }), ::testing::HasSubstr("key 'i8': i8 value -100 does not fit in u32"));
  EXPECT_THAT(msg([&] { f.get_i32("u32"); }), ::testing::HasSubstr("u32 value 4000000000 does not fit in i32"));
  EXPECT_THAT(msg([&] { f.get_f32("u32"); }), ::testing::HasSubstr("expected f32, found u32"));
  EXPECT_THAT(msg([&] { f.get_string("strings"); }), ::testing::HasSubstr("expected string, found array of string"));
  EXPECT_THAT(msg([&] { f.get_string_array("f32s"); }),
              ::testing::HasSubstr("expected array of string, found array of f32"));
  EXPECT_THAT(msg([&] { f.get_f32_array("strings"); }), ::testing::HasSubstr("expected array of f32"));
  EXPECT_THAT(msg([&] { f.get_i32_array("u64s"); }), ::testing::HasSubstr("does not fit in i32"));
  EXPECT_THAT(msg([&] { f.get_bool("u8"); }), ::testing::HasSubstr("expected bool, found u8"));
  EXPECT_THAT(msg([&] { f.find_u32("f32"); }), ::testing::HasSubstr("key 'f32': expected u32, found f32"));
  EXPECT_THAT(msg([&] { f.get_u32("nope"); }), ::testing::HasSubstr("<memory>: key 'nope' is missing"));
  EXPECT_THAT(msg([&] { f.tensor("nope"); }), ::testing::HasSubstr("tensor 'nope' is missing"));
  // the message names the value's byte offset
  EXPECT_THAT(msg([&] { f.get_u32("string"); }),
              ::testing::StartsWith("<memory>: byte " + std::to_string(f.find("string")->offset) + ": "));
}

TEST(GgufFile, CustomAlignmentAndEveryTensorType) {
  for (uint32_t align : {1u, 8u, 64u, 256u}) {
    SCOPED_TRACE("alignment " + std::to_string(align));
    GgufBuilder g;
    g.alignment = align;
    g.kv("general.alignment", GVal::u32(align));
    std::vector<uint8_t> q8(34 * 2), q4(18 * 3);
    for (size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<uint8_t>(i * 7);
    for (size_t i = 0; i < q4.size(); ++i) q4[i] = static_cast<uint8_t>(i * 13);
    g.tensor(GTensor{"f32", {3}, 0, f32_bytes({1, 2, 3}), {}, {}})
        .tensor("f16", {5, 3}, 1)
        .tensor("bf16", {7}, 30)
        .tensor(GTensor{"q8", {64}, 8, q8, {}, {}})
        .tensor(GTensor{"q4", {32, 3, 1, 1}, 2, q4, {}, {}});
    const auto bytes = g.build();
    const auto f = parse(bytes);
    EXPECT_EQ(f.alignment(), align);
    EXPECT_EQ(f.data_offset(), g.layout.data_start);
    const uint64_t want_bytes[] = {12, 30, 14, 68, 54};
    for (size_t i = 0; i < 5; ++i) {
      const auto& t = f.tensors()[i];
      EXPECT_EQ(t.n_bytes, want_bytes[i]) << t.name;
      EXPECT_EQ((f.data_offset() + t.offset) % align, 0u) << t.name;
      const auto d = f.tensor_data(t);
      EXPECT_EQ(d.data() - f.tensor_data(f.tensors()[0]).data() + f.data_offset(),
                static_cast<ptrdiff_t>(g.layout.tensor_data_start[i]));
    }
    EXPECT_EQ(f.tensor("q4").n_dims, 4u);
    EXPECT_EQ(f.tensor("q4").type, GgufType::Q4_0);
    EXPECT_TRUE(std::equal(q8.begin(), q8.end(), f.tensor_data(f.tensor("q8")).begin()));
    EXPECT_TRUE(std::equal(q4.begin(), q4.end(), f.tensor_data(f.tensor("q4")).begin()));
  }
}

TEST(GgufFile, OpensAFileByPath) {
  auto g = every_type_builder(3);
  const auto bytes = g.build();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("wgllm_gguf_test_" + std::to_string(::getpid()) + ".gguf")).string();
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  {
    const auto f = GgufFile::open(path);
    EXPECT_EQ(f.file_size(), bytes.size());
    EXPECT_EQ(f.label(), path);
    EXPECT_EQ(f.get_string("string"), "héllo");
    GgufFile moved = std::move(const_cast<GgufFile&>(f));
    EXPECT_EQ(moved.tensor_data(moved.tensor("w"))[4], bytes[g.layout.tensor_data_start[0] + 4]);
  }
  std::remove(path.c_str());
  try {
    GgufFile::open(path);
    FAIL() << "no error";
  } catch (const ModelError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(path + ": cannot open: No such file"));
  }
  // an empty file
  { std::ofstream out(path, std::ios::binary); }
  try {
    GgufFile::open(path);
    FAIL() << "no error";
  } catch (const ModelError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr(path + ": byte 0: header: truncated"));
  }
  std::remove(path.c_str());
}

// A path that is not a regular file is refused by what it is, before an open that could block: opening a FIFO for
// reading waits for a writer (this test would then hang until its timeout).
TEST(GgufFile, NonRegularFilesAreRefusedWithoutBlocking) {
  const auto dir = std::filesystem::temp_directory_path() / ("wgllm_gguf_kinds_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string fifo = (dir / "model.gguf").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  for (const auto& [path, kind] : {std::pair<std::string, std::string>{fifo, "a FIFO"},
                                   {dir.string(), "a directory"},
                                   {"/dev/zero", "a character device"}}) {
    try {
      GgufFile::open(path);
      ADD_FAILURE() << "no error for " << path;
    } catch (const ModelError& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(path + ": " + kind + ", not a regular file"));
    }
  }
  std::filesystem::remove_all(dir);
}

TEST(GgufFile, LargeStringArrayParses) {
  std::vector<std::string> toks(150000);
  for (size_t i = 0; i < toks.size(); ++i) toks[i] = "token_" + std::to_string(i);
  GgufBuilder g;
  g.kv("tokenizer.ggml.tokens", GVal::strings(toks));
  const auto bytes = g.build();
  const auto f = parse(bytes);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").size(), 150000u);
  EXPECT_EQ(f.get_string_array("tokenizer.ggml.tokens").string(149999), "token_149999");
}

// Large arrays are views of the file's bytes: every element reads back, none is copied out of the file.
TEST(GgufFile, LargeArraysAreViewsOfTheFile) {
  const size_t n = size_t{16} << 20;
  GVal u8s = GVal::array(0, {}, n);
  for (size_t i = 0; i < n; ++i) u8s.bytes.push_back(static_cast<uint8_t>(i * 7 + (i >> 13)));
  std::vector<std::string> strs(100003);
  for (size_t i = 0; i < strs.size(); ++i) strs[i] = std::string(i % 5, static_cast<char>('a' + i % 26));
  std::vector<GVal> nested;
  for (size_t i = 0; i < 40; ++i) nested.push_back(GVal::strings({std::to_string(i), std::string(i, 'x')}));
  GgufBuilder g;
  g.kv("u8s", u8s).kv("strs", GVal::strings(strs)).kv("nested", GVal::array(9, nested));
  g.kv("i16s", GVal::array(3, {GVal::i16(-3), GVal::i16(32767)}));
  const auto f = parse(g.build());
  const auto inside = [&](const void* p) {
    const auto* b = static_cast<const uint8_t*>(p);
    return b >= f.bytes().data() && b < f.bytes().data() + f.bytes().size();
  };

  const auto& a = std::get<GgufArray>(f.find("u8s")->v);
  ASSERT_EQ(a.size(), n);
  ASSERT_EQ(a.bytes().size(), n);
  EXPECT_TRUE(inside(a.bytes().data()) && inside(a.bytes().data() + n - 1));
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += a.u64(i) != static_cast<uint8_t>(i * 7 + (i >> 13));
  EXPECT_EQ(wrong, 0u);

  const GgufArray& s = f.get_string_array("strs");
  ASSERT_EQ(s.size(), strs.size());
  EXPECT_TRUE(s.bytes().empty());
  for (size_t i = 0; i < strs.size(); ++i) wrong += s.string(i) != strs[i];
  for (size_t i : {size_t{1}, size_t{17}, strs.size() - 1}) EXPECT_TRUE(inside(s.string(i).data()));
  EXPECT_EQ(wrong, 0u);
  EXPECT_EQ(s.strings(), strs);

  const auto& nn = std::get<GgufArray>(f.find("nested")->v);
  ASSERT_EQ(nn.size(), 40u);
  for (size_t i = 0; i < 40; ++i) {
    const GgufArray e = nn.array(i);
    ASSERT_EQ(e.size(), 2u);
    EXPECT_EQ(e.string(0), std::to_string(i));
    EXPECT_EQ(e.string(1), std::string(i, 'x'));
    EXPECT_TRUE(inside(e.string(1).data()));
  }
  const auto& i16s = std::get<GgufArray>(f.find("i16s")->v);
  EXPECT_EQ(i16s.i64(0), -3);
  EXPECT_EQ(i16s.i64(1), 32767);
  EXPECT_EQ(f.get_i32_array("i16s"), (std::vector<int32_t>{-3, 32767}));
}

TEST(GgufFile, F64OutOfFloatRangeBecomesInfinity) {
  GgufBuilder g;
  g.kv("big", GVal::f64(1e300)).kv("small", GVal::f64(-1e300)).kv("arr", GVal::array(12, {GVal::f64(1e39)}));
  const auto f = parse(g.build());
  EXPECT_EQ(f.get_f32("big"), INFINITY);
  EXPECT_EQ(f.get_f32("small"), -INFINITY);
  EXPECT_EQ(f.get_f32_array("arr")[0], INFINITY);
}

TEST(GgufFile, ZeroTensorsAndTypeNames) {
  GgufBuilder g;
  g.kv("a", GVal::u8(1));
  const auto f = parse(g.build());
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_STREQ(ggml_type_name(12), "Q4_K");
  EXPECT_STREQ(ggml_type_name(30), "BF16");
  EXPECT_STREQ(ggml_type_name(39), "MXFP4");
  EXPECT_EQ(ggml_type_name(99), nullptr);
  EXPECT_EQ(block_bytes(GgufType::Q8_0), 34u);
  EXPECT_EQ(block_bytes(GgufType::Q4_0), 18u);
  EXPECT_EQ(block_elems(GgufType::Q4_0), 32u);
}

// Any type ggml defines parses, runnable or not: sizes follow its block layout.
TEST(GgufFile, EveryKnownTypeParses) {
  GgufBuilder g;
  g.tensor("k", {512, 3}, 12).tensor("q5", {64, 2}, 6).tensor("iq", {256, 2}, 16).tensor("q6", {256}, 14);
  const auto f = parse(g.build());
  EXPECT_EQ(f.tensor("k").type, GgufType::Q4_K);
  EXPECT_EQ(f.tensor("k").n_bytes, 2u * 3 * 144);
  EXPECT_EQ(f.tensor("q5").n_bytes, 2u * 2 * 22);
  EXPECT_EQ(f.tensor("iq").type, GgufType::IQ2_XXS);
  EXPECT_EQ(f.tensor("iq").n_bytes, 2u * 66);
  EXPECT_EQ(f.tensor("q6").n_bytes, 210u);
  EXPECT_FALSE(is_supported_type(uint32_t(f.tensor("iq").type)));
}

// ---- corrupt files -----------------------------------------------------------

template <typename T>
void patch(std::vector<uint8_t>& b, size_t at, T v) {
  std::memcpy(b.data() + at, &v, sizeof v);
}

GgufBuilder small_valid() {
  GgufBuilder g;
  g.kv("general.architecture", GVal::str("llama"))
      .kv("tokenizer.ggml.tokens", GVal::strings({"a", "b", "c"}))
      .kv("x", GVal::u32(7));
  g.tensor(GTensor{"a", {8}, 0, {}, {}, {}}).tensor(GTensor{"b", {32, 2}, 8, {}, {}, {}});
  return g;
}

struct CorruptCase {
  const char* name;
  std::function<std::vector<uint8_t>()> make;
  const char* expect;  // substring of the error
};

GVal raw(uint32_t type, std::vector<uint8_t> bytes) { return GVal{type, std::move(bytes)}; }

GVal nested_arrays(int depth) {
  GVal v = GVal::array(4, {GVal::u32(1)});
  for (int i = 0; i < depth; ++i) v = GVal::array(9, {v});
  return v;
}

GgufBuilder one_tensor(GTensor t) {
  GgufBuilder g;
  g.tensor(std::move(t));
  return g;
}

const std::vector<CorruptCase>& corrupt_cases() {
  // One case a line, as a table.
  // clang-format off
  static const std::vector<CorruptCase> cases = {
      {"empty file", [] { return std::vector<uint8_t>{}; }, "byte 0: header: truncated: file has 0 bytes"},
      {"bad magic", [] { auto b = small_valid().build(); b[0] = 'X'; return b; }, "byte 0: header: bad magic"},
      {"version 1", [] { auto g = small_valid(); g.version = 1; return g.build(); },
       "byte 4: header: GGUF version 1 is not supported"},
      {"version 4", [] { auto g = small_valid(); g.version = 4; return g.build(); },
       "GGUF version 4 is not supported (supported: 2, 3)"},
      {"big-endian version", [] { auto g = small_valid(); g.version = 0x03000000; return g.build(); }, "big-endian"},
      {"huge tensor count", [] { auto g = small_valid(); g.n_tensors_override = 1ull << 60; return g.build(); },
       "byte 8: header: tensor count 1152921504606846976 exceeds the"},
      {"huge KV count", [] { auto g = small_valid(); g.n_kv_override = 1ull << 60; return g.build(); },
       "byte 16: header: metadata key count 1152921504606846976 exceeds the"},
      {"counts together too large", [] {
         auto g = small_valid();
         g.n_tensors_override = 10;
         g.n_kv_override = 20;
         return g.build(); }, "exceed the"},
      {"tensor count one too many", [] { auto g = small_valid(); g.n_tensors_override = 3; return g.build(); },
       "tensor #2 (''): n_dims 0 is outside 1..4"},
      {"huge key length", [] { auto g = small_valid(); auto b = g.build(); patch(b, g.layout.kv_start[1], ~0ull); return b; },
       "metadata key #1: key length 18446744073709551615 exceeds the"},
      {"huge string length", [] {
         GgufBuilder g;
         auto v = GVal::str("abc");
         patch(v.bytes, 0, 1ull << 62);
         g.kv("s", v);
         return g.build(); }, "metadata key #0 ('s'): string length 4611686018427387904 exceeds the 3 bytes left"},
      {"huge array length", [] {
         GgufBuilder g;
         g.kv("general.architecture", GVal::str("llama"));
         g.kv("tokenizer.ggml.tokens", GVal::array(8, {GVal::str("a")}, 1ull << 62));
         return g.build(); },
       "metadata key #1 ('tokenizer.ggml.tokens'): array length 4611686018427387904 exceeds the 9 bytes left"},
      {"huge u64 array length", [] { GgufBuilder g; g.kv("a", GVal::array(10, {GVal::u64(1)}, 2)); return g.build(); },
       "array length 2 exceeds the 8 bytes left"},
      {"array of 2^40 arrays", [] { GgufBuilder g; g.kv("a", GVal::array(9, {}, 1ull << 40)); return g.build(); },
       "array length 1099511627776 exceeds the 0 bytes left"},
      {"nested array bomb", [] { GgufBuilder g; g.kv("a", nested_arrays(50)); return g.build(); },
       "arrays nested deeper than 8"},
      {"unknown value type", [] { GgufBuilder g; g.kv("a", raw(13, {0, 0, 0, 0})); return g.build(); },
       "metadata key #0 ('a'): unknown value type 13"},
      {"unknown array element type", [] { GgufBuilder g; g.kv("a", GVal::array(77, {})); return g.build(); },
       "unknown array element type 77"},
      {"duplicate key", [] { auto g = small_valid(); g.kv("x", GVal::u32(8)); return g.build(); },
       "metadata key #3 ('x'): duplicate key"},
      {"duplicate tensor", [] { auto g = small_valid(); g.tensor("a", {8}); return g.build(); },
       "tensor #2 ('a'): duplicate tensor name"},
      {"alignment 0", [] { auto g = small_valid(); g.kv("general.alignment", GVal::u32(0)); return g.build(); },
       "key 'general.alignment': 0 is not a power of two"},
      {"alignment 48", [] { auto g = small_valid(); g.alignment = 48; g.kv("general.alignment", GVal::u32(48)); return g.build(); },
       "key 'general.alignment': 48 is not a power of two"},
      {"alignment as string", [] { auto g = small_valid(); g.kv("general.alignment", GVal::str("32")); return g.build(); },
       "key 'general.alignment': expected u32, found string"},
      {"n_dims 5", [] { return one_tensor({"t", {1, 1, 1, 1, 1}, 0, {}, {}, {}}).build(); },
       "tensor #0 ('t'): n_dims 5 is outside 1..4"},
      {"n_dims 0", [] { return one_tensor({"t", {}, 0, {}, {}, {}}).build(); }, "n_dims 0 is outside 1..4"},
      {"n_dims huge", [] { return one_tensor({"t", {4}, 0, {}, {}, 0xFFFFFFFFu}).build(); },
       "n_dims 4294967295 is outside 1..4"},
      {"dim 0", [] { return one_tensor({"t", {4, 0}, 0, {}, {}, {}}).build(); }, "tensor #0 ('t'): dimension 1 is 0"},
      {"dims product overflows u64", [] { return one_tensor({"t", {1ull << 32, 1ull << 32}, 0, {}, 0, {}}).build(); },
       "overflow 64 bits"},
      {"dims product overflows i64", [] { return one_tensor({"t", {1ull << 40, 1ull << 23}, 0, {}, 0, {}}).build(); },
       "overflow 63 bits"},
      {"dim above i64", [] { return one_tensor({"t", {~0ull}, 0, {}, 0, {}}).build(); }, "overflow"},
      {"byte size overflows", [] { return one_tensor({"t", {1ull << 62}, 0, {}, 0, {}}).build(); },
       "size of [4611686018427387904] overflows 64 bits"},
      {"offset past EOF", [] { return one_tensor({"t", {8}, 0, {}, 1ull << 20, {}}).build(); },
       "tensor 't': data [1048576, +32) runs past the end of the 0-byte data section"},
      {"offset near 2^64", [] { return one_tensor({"t", {8}, 0, {}, ~0ull - 31, {}}).build(); }, "runs past the end"},
      {"offset misaligned", [] { return one_tensor({"t", {8}, 0, {}, 4, {}}).build(); },
       "tensor #0 ('t'): data offset 4 is not a multiple of the alignment 32"},
      {"unknown tensor type", [] { return one_tensor({"t", {8}, 99, {}, 0, {}}).build(); },
       "tensor #0 ('t'): unknown tensor type id 99"},
      {"removed type Q4_0_4_4", [] { return one_tensor({"t", {256}, 31, {}, 0, {}}).build(); },
       "tensor #0 ('t'): type Q4_0_4_4 (id 31) was removed from ggml: no GGUF file holds it"},
      {"Q4_K row not a block multiple", [] { return one_tensor({"t", {128, 2}, 12, {}, 0, {}}).build(); },
       "row length 128 is not a multiple of the Q4_K block size 256"},
      {"Q8_0 row not a block multiple", [] { return one_tensor({"t", {33}, 8, {}, 0, {}}).build(); },
       "row length 33 is not a multiple of the Q8_0 block size 32"},
      {"overlapping tensors", [] {
         GgufBuilder g;
         g.tensor("a", {16}).tensor(GTensor{"b", {8}, 0, {}, 32, {}});
         return g.build(); }, "tensor 'b': data overlaps tensor 'a'"},
      {"data section cut short", [] { auto g = small_valid(); auto b = g.build(); b.resize(b.size() - 1); return b; },
       "tensor 'b': data [32, +68) runs past the end of the 99-byte data section"},
      {"tensor info cut short", [] { auto g = small_valid(); auto b = g.build(); b.resize(g.layout.infos_end - 3); return b; },
       "tensor #1 ('b'): truncated: tensor data offset needs 8 bytes, 5 left"},
  };
  // clang-format on
  return cases;
}

TEST(GgufCorrupt, EveryCaseGivesItsError) {
  for (const auto& c : corrupt_cases()) {
    SCOPED_TRACE(c.name);
    const std::string err = parse_error(c.make());
    EXPECT_THAT(err, ::testing::HasSubstr(c.expect));
    EXPECT_THAT(err, ::testing::StartsWith("<memory>: "));
    EXPECT_EQ(err.find('\n'), std::string::npos);
  }
}

TEST(GgufCorrupt, ExactMessageForAHugeArray) {
  GgufBuilder g;
  g.kv("general.architecture", GVal::str("llama"));
  g.kv("tokenizer.ggml.tokens", GVal::array(8, {GVal::str("abc")}, 1ull << 62));
  const auto b = g.build();
  const size_t at = g.layout.kv_start[1] + 8 + 21 + 4 + 4;  // key length, key, value type, element type
  EXPECT_EQ(parse_error(b), "<memory>: byte " + std::to_string(at) +
                                ": metadata key #1 ('tokenizer.ggml.tokens'): array length 4611686018427387904 "
                                "exceeds the 11 bytes left");
}

TEST(GgufCorrupt, EveryTruncationFails) {
  auto g = small_valid();
  const auto full = g.build();
  ASSERT_NO_THROW(parse(full));
  // every prefix of the file (header, each KV, tensor infos, padding, data) is an error, never a crash
  for (size_t n = 0; n < full.size(); ++n) {
    SCOPED_TRACE("cut at " + std::to_string(n));
    const std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<ptrdiff_t>(n));
    const std::string err = parse_error(cut);
    EXPECT_NE(err, "(no error)");
    if (n < g.layout.kv_start[1]) {  // header and first KV: the message says what ran out
      EXPECT_TRUE(err.find("truncated") != std::string::npos || err.find("exceeds") != std::string::npos) << err;
    }
  }
  // section boundaries by name
  const std::vector<std::pair<const char*, size_t>> cuts = {
      {"after header", g.layout.header_end},
      {"at KV 2", g.layout.kv_start[2]},
      {"after metadata", g.layout.kv_end},
      {"at tensor info 1", g.layout.tensor_info_start[1]},
      {"after tensor infos", g.layout.infos_end},
      {"at data start", g.layout.data_start},
      {"at tensor 1 data", g.layout.tensor_data_start[1]},
  };
  for (const auto& [what, n] : cuts) {
    SCOPED_TRACE(what);
    const std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<ptrdiff_t>(n));
    EXPECT_NE(parse_error(cut), "(no error)");
  }
}

TEST(GgufCorrupt, EveryByteFlipIsHandled) {
  auto g = small_valid();
  const auto full = g.build();
  for (size_t i = 0; i < full.size(); ++i) {
    for (uint8_t x : {uint8_t{0xFF}, uint8_t{0x80}, uint8_t{0x01}}) {
      auto b = full;
      b[i] ^= x;
      try {
        const auto f = parse(b);
        for (const auto& t : f.tensors()) EXPECT_LE(f.tensor_data(t).size(), b.size());
      } catch (const ModelError&) {
      }
    }
  }
}

// Writes a few valid files into <build>/fuzz_seeds/ as a seed corpus for the fuzz target.
TEST(GgufSeeds, WritesFuzzCorpus) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::path(WGLLM_BINARY_DIR) / "fuzz_seeds";
  fs::create_directories(dir);
  std::vector<std::pair<std::string, std::vector<uint8_t>>> seeds;
  seeds.emplace_back("every_type_v3.gguf", every_type_builder(3).build());
  seeds.emplace_back("every_type_v2.gguf", every_type_builder(2).build());
  seeds.emplace_back("small.gguf", small_valid().build());
  for (const char* arch : {"llama", "qwen2", "qwen3"})
    seeds.emplace_back(std::string(arch) + ".gguf", tiny_model(arch).build());
  {
    GgufBuilder g;
    g.alignment = 64;
    g.kv("general.alignment", GVal::u32(64));
    g.tensor("q8", {64}, 8).tensor("q4", {32, 2}, 2).tensor("bf16", {3}, 30).tensor("f16", {5}, 1);
    seeds.emplace_back("types_align64.gguf", g.build());
  }
  for (const auto& [name, bytes] : seeds) {
    std::ofstream out(dir / name, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good());
    ASSERT_NO_THROW(parse(bytes)) << name;
  }
}

}  // namespace
}  // namespace wgllm::test
