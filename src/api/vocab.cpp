// wgllm/vocab.h: a GGUF file's tokenizer from its metadata alone.
#include "wgllm/vocab.h"

#include "api/chat_input.h"
#include "gguf/file.h"
#include "tokenizer/chat.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace wgllm {

struct Vocab::Impl {
  explicit Impl(const GgufFile& f)
      : tok(read(f)), arch(f.find_string("general.architecture").value_or("")), chat(tok.data().chat_template, arch) {}
  Tokenizer tok;
  std::string arch;
  ChatFormat chat;  // the file's template, parsed once

  // The tokenizer's own checks do not know the file: their errors get its name.
  static Tokenizer read(const GgufFile& f) {
    try {
      return Tokenizer(tokenizer_data_from_gguf(f));
    } catch (const ModelError& e) {
      const std::string msg = e.what();
      if (msg.rfind(f.label(), 0) == 0) throw;
      throw ModelError(f.label() + ": " + msg);
    }
  }
};

Vocab::Vocab(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Vocab::~Vocab() = default;
Vocab::Vocab(Vocab&&) noexcept = default;
Vocab& Vocab::operator=(Vocab&&) noexcept = default;

Vocab Vocab::load(const std::string& path) {
  return Vocab(std::make_unique<Impl>(GgufFile::open(path, GgufFile::Parts::MetadataOnly)));
}

Vocab Vocab::load(std::span<const uint8_t> gguf, const std::string& label) {
  return Vocab(std::make_unique<Impl>(GgufFile::from_bytes(gguf, label)));
}

std::vector<int32_t> Vocab::encode(std::string_view text, bool add_special, bool parse_special) const {
  return impl_->tok.encode(text, add_special, parse_special);
}
std::string Vocab::decode(std::span<const int32_t> ids, bool skip_special) const {
  return impl_->tok.decode(ids, skip_special);
}
std::string Vocab::token_to_piece(int32_t id) const { return impl_->tok.token_to_piece(id); }
int32_t Vocab::n_vocab() const { return impl_->tok.n_vocab(); }
int32_t Vocab::bos() const { return impl_->tok.bos(); }
int32_t Vocab::eos() const { return impl_->tok.eos(); }
bool Vocab::add_bos() const { return impl_->tok.add_bos(); }
const std::string& Vocab::architecture() const { return impl_->arch; }

std::string Vocab::apply_chat_template(std::string_view user, std::string_view system) const {
  return render_user_turn(impl_->chat, impl_->tok, user, system).text;
}
std::vector<int32_t> Vocab::encode_chat(std::string_view user, std::string_view system) const {
  const ChatPrompt p = render_user_turn(impl_->chat, impl_->tok, user, system);
  return impl_->tok.encode(p.text, false, true, p.content);
}
std::string Vocab::render_chat(const ChatRequest& r, std::string_view jinja) const {
  const std::optional<ChatFormat> own =
      jinja.empty() ? std::nullopt : std::optional<ChatFormat>(std::in_place, jinja, impl_->arch);
  const ChatFormat& format = own ? *own : impl_->chat;
  return format
      .render(chat_input(r), r.bos_token ? *r.bos_token : bos_text(impl_->tok),
              r.eos_token ? *r.eos_token : eos_text(impl_->tok), false)
      .text;
}

}  // namespace wgllm
