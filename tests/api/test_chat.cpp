// wgllm/chat.h: ReasoningSplitter gives the same reasoning and content however the reply is cut into pieces, and
// ChatTemplate renders (the templates themselves are checked against jinja2 in tests/jinja/).
#include <gtest/gtest.h>

#include <string>

#include "wgllm/chat.h"

namespace wgllm {
namespace {

struct SplitCase {
  bool open;
  const char* reply;
  const char* reasoning;
  const char* content;
};

const SplitCase kSplits[] = {
    {false, "<think>\nLet me see.\n</think>\n\nThe answer is 4.", "\nLet me see.\n", "The answer is 4."},
    {false, "  \n<think>x</think>y", "x", "y"},
    {false, "Hello <think>not reasoning</think>", "", "Hello <think>not reasoning</think>"},
    {false, "<thi", "", "<thi"},
    {false, "<think>unfinished </thi", "unfinished </thi", ""},
    {false, "<think></think>", "", ""},
    {false, "plain text", "", "plain text"},
    {true, "thinking already</think>\n\nanswer", "thinking already", "answer"},
    {true, "all thought", "all thought", ""},
};

ReasoningSplitter::Parts split_in_pieces(const SplitCase& c, size_t piece) {
  ReasoningSplitter s(c.open);
  ReasoningSplitter::Parts all;
  const std::string reply = c.reply;
  for (size_t i = 0; i < reply.size(); i += piece) {
    const ReasoningSplitter::Parts p = s.push(reply.substr(i, piece));
    all.reasoning += p.reasoning, all.content += p.content;
  }
  const ReasoningSplitter::Parts p = s.flush();
  all.reasoning += p.reasoning, all.content += p.content;
  return all;
}

TEST(ReasoningSplitter, SameWhateverThePieces) {
  for (const SplitCase& c : kSplits)
    for (size_t piece : {size_t(1), size_t(2), size_t(3), size_t(7), size_t(1000)}) {
      const ReasoningSplitter::Parts p = split_in_pieces(c, piece);
      EXPECT_EQ(p.reasoning, c.reasoning) << c.reply << " in pieces of " << piece;
      EXPECT_EQ(p.content, c.content) << c.reply << " in pieces of " << piece;
    }
}

TEST(ReasoningSplitter, PromptOpensThinking) {
  EXPECT_TRUE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n"));
  EXPECT_TRUE(prompt_opens_thinking("<think>"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  EXPECT_FALSE(prompt_opens_thinking("<|im_start|>assistant\n"));
  EXPECT_FALSE(prompt_opens_thinking(""));
}

TEST(ChatTemplateApi, RendersAndRefuses) {
  const ChatTemplate t("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{{ bos_token }}");
  ChatRequest r;
  r.messages = R"([{"role": "user", "content": "hi"}])";
  r.bos_token = "<s>";
  EXPECT_EQ(t.render(r), "user: hi\n<s>");
  r.messages = "[{\"role\":";  // not JSON
  EXPECT_THROW(t.render(r), InvalidArgument);
  r.messages = "[]";
  r.date = "2025-02-30";
  EXPECT_THROW(t.render(r), InvalidArgument);
  EXPECT_THROW(ChatTemplate("{% for %}"), Error);
}

}  // namespace
}  // namespace wgllm
