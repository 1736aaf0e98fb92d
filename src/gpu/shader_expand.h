// A tiny preprocessor for WGSL, applied to every shader before compilation:
//
//   //#unroll NAME COUNT
//   ...lines using $NAME...
//   //#end
//
// repeats the body COUNT times with $NAME replaced by 0, 1, ... COUNT-1. COUNT is a number
// or the name of a `const NAME: u32 = <n>u;` declared in the prelude or the source. Blocks
// nest. WGSL has no loop-unrolling attribute, and private arrays indexed in loops can end up
// in slow memory on some drivers; unrolled straight-line code over named registers avoids that.
// An expanded block is emitted on its first line followed by blank lines, so compiler error
// line numbers elsewhere in the file stay right.
#pragma once
#include <string>
#include <string_view>

namespace wgllm::gpu {

std::string expand_shader(std::string_view source, std::string_view prelude = {});

}  // namespace wgllm::gpu
