// The tokenizer stored in a GGUF model: its tokenizer.ggml.* and tokenizer.chat_template metadata.
#pragma once
#include "tokenizer/tokenizer.h"

namespace wgllm {

class GgufFile;

// Reads tokenizer.ggml.{model, pre, tokens, scores, token_type, merges, bos_token_id, eos_token_id,
// unknown_token_id, padding_token_id, add_bos_token, add_eos_token, add_space_prefix} and tokenizer.chat_template.
// model and tokens are required; the rest are optional (absent pre stays empty, which means "default"). Throws
// ModelError naming the key for a missing required key, a key of the wrong type, scores / token_type whose count
// differs from the token count, or a special token id outside the vocabulary.
TokenizerData tokenizer_data_from_gguf(const GgufFile& f);

}  // namespace wgllm
