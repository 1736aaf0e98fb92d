// A tiny preprocessor for WGSL, applied to every shader before compilation:
//
//   //#unroll NAME COUNT
//   ...lines using $NAME...
//   //#end
//
// repeats the body COUNT times with $NAME replaced by 0, 1, ... COUNT-1, or, with
// unroll = false, emits `for (var unroll_NAME = 0u; unroll_NAME < COUNT; ...) { body }` with
// $NAME replaced by the loop variable. COUNT is a number or the name of a `const NAME: u32 = <n>u;`
// in the prelude or the source. Blocks nest. WGSL has no unroll attribute, and private arrays
// indexed in loops can end up in slow memory on GPU drivers: unrolled, every index is a constant.
// CPU drivers (lavapipe) compile huge straight-line shaders very slowly, so they get loops.
// `//#unroll! NAME COUNT` always unrolls (for pasting $NAME into identifiers, e.g. pool$P).
// An expanded block is emitted on its first line followed by blank lines, so compiler error
// line numbers elsewhere in the file stay right.
#pragma once
#include <string>
#include <string_view>

namespace wgllm::gpu {

std::string expand_shader(std::string_view source, std::string_view prelude = {}, bool unroll = true);

}  // namespace wgllm::gpu
