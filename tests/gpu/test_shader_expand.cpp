#include <gtest/gtest.h>

#include "gpu/shader_expand.h"
#include "wgllm/error.h"

namespace wgllm::gpu {
namespace {

size_t count_lines(const std::string& s) { return std::count(s.begin(), s.end(), '\n'); }

TEST(ShaderExpand, RepeatsWithIndexAndKeepsLineCount) {
  const std::string src = "a\n//#unroll i 3\nx$i = y$i; // note\n//#end\nb\n";
  const std::string out = expand_shader(src);
  EXPECT_NE(out.find("x0 = y0;"), std::string::npos) << out;
  EXPECT_NE(out.find("x2 = y2;"), std::string::npos) << out;
  EXPECT_EQ(out.find("x3"), std::string::npos) << out;
  EXPECT_EQ(out.find("note"), std::string::npos) << "comments inside a block are dropped: " << out;
  EXPECT_EQ(count_lines(out), count_lines(src));
  EXPECT_EQ(out.substr(out.rfind('b')), "b\n");
}

TEST(ShaderExpand, NestedBlocksAndPreludeConstants) {
  const std::string out =
      expand_shader("//#unroll i N\n//#unroll j 2\nf($i, $j);\n//#end\n//#end\n", "const N: u32 = 2u;\n");
  for (const char* call : {"f(0, 0);", "f(0, 1);", "f(1, 0);", "f(1, 1);"})
    EXPECT_NE(out.find(call), std::string::npos) << out;
  EXPECT_EQ(out.find("f(2"), std::string::npos);
}

TEST(ShaderExpand, LoopModeKeepsTheBodyOnce) {
  const std::string src = "a\n//#unroll i N\nx[$i] = 1;\n//#end\n";
  const std::string out = expand_shader(src, "const N: u32 = 5u;\n", false);
  EXPECT_NE(out.find("for (var unroll_i = 0u; unroll_i < 5u; unroll_i += 1u) {"), std::string::npos) << out;
  EXPECT_NE(out.find("x[unroll_i] = 1;"), std::string::npos) << out;
  EXPECT_EQ(count_lines(out), count_lines(src));
  const std::string forced = expand_shader("//#unroll! p 2\npool$p[0];\n//#end\n", "", false);
  EXPECT_NE(forced.find("pool1[0];"), std::string::npos) << forced;
}

TEST(ShaderExpand, Errors) {
  EXPECT_THROW(expand_shader("//#unroll i 2\nx;\n"), ShaderError);
  EXPECT_THROW(expand_shader("//#unroll i MISSING\nx;\n//#end\n"), ShaderError);
  EXPECT_EQ(expand_shader("no directives\n"), "no directives\n");
}

}  // namespace
}  // namespace wgllm::gpu
