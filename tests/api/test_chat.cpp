// wgllm/chat.h: ReasoningSplitter and ToolCallStream give the same results however the reply is cut into pieces,
// parse_tool_calls reads the families' formats, ChatTemplate renders (the templates themselves are checked against
// jinja2 in tests/jinja/).
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "external.h"
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

// Replies as models write tool calls (Qwen 2.5 / Hermes, Mistral Small 3 and Nemo, Llama 3.x), and ones that do not
// parse, which stay content.
struct CallCase {
  const char* reply;
  const char* content;
  std::vector<ToolCall> calls;
};

const CallCase kCalls[] = {
    {"<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>",
     "",
     {{"get_weather", R"({"city":"Paris","days":2})"}}},
    {"Let me check both.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n"
     "{\"name\": \"b\", \"arguments\": \"{\\\"q\\\": 1}\"}\n</tool_call>",
     "Let me check both.",
     {{"a", "{}"}, {"b", R"({"q": 1})"}}},
    {"<tool_call>\n{\"name\": \"cut\", \"arguments\": {\"x\": 1}}", "", {{"cut", R"({"x":1})"}}},  // no closing tag
    {"[TOOL_CALLS][{\"name\": \"search\", \"arguments\": {\"query\": \"wgllm\"}, \"id\": \"abc123XYZ\"}]",
     "",
     {{"search", R"({"query":"wgllm"})"}}},
    {"[TOOL_CALLS]search[ARGS]{\"query\": \"a}b\"}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}",
     "",
     {{"search", R"({"query":"a}b"})"}, {"get_weather", R"({"city":"Oslo"})"}}},
    {"{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", "", {{"get_weather", R"({"city":"Rome"})"}}},
    {"<|python_tag|>{\"name\": \"f\", \"parameters\": {}}", "", {{"f", "{}"}}},
    {"<|tool_call_start|>[get_weather(city=\"Paris\", days=2), search(query='it\\'s', deep=True, tags=['a', 1.5], "
     "opts={'k': None})]<|tool_call_end|>Checking.",
     "Checking.",
     {{"get_weather", R"({"city":"Paris","days":2})"},
      {"search", R"({"query":"it's","deep":true,"tags":["a",1.5],"opts":{"k":null}})"}}},
    {"<|tool_call_start|>[broken(city=]<|tool_call_end|>", "<|tool_call_start|>[broken(city=]<|tool_call_end|>", {}},
    // not calls, or not parsable: all content
    {"The weather is fine.", "The weather is fine.", {}},
    {"<tool_call>\n{\"name\": \"broken\", \"arguments\": {\n</tool_call>",
     "<tool_call>\n{\"name\": \"broken\", \"arguments\": {\n</tool_call>",
     {}},
    {"{\"answer\": 42}", "{\"answer\": 42}", {}},
    {"[TOOL_CALLS]oops", "[TOOL_CALLS]oops", {}},
};

bool same_calls(const std::vector<ToolCall>& a, const std::vector<ToolCall>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].arguments != b[i].arguments) return false;
  return true;
}

TEST(ToolCalls, ParsesTheFamiliesFormats) {
  for (const CallCase& c : kCalls) {
    const ParsedReply p = parse_tool_calls(c.reply);
    EXPECT_EQ(p.content, c.content) << c.reply;
    EXPECT_TRUE(same_calls(p.tool_calls, c.calls)) << c.reply << ": " << p.tool_calls.size() << " calls";
  }
}

// Streamed in any pieces, the content that passes plus finish() give the same calls, and the text before a call
// marker is not held back.
// A call as the family's own template writes it into the conversation parses back to the same call (the templates of
// llama.cpp's collection; skipped without it).
TEST(ToolCalls, TemplatesWrittenCallsParseBack) {
  const auto src = test::llamacpp_src();
  WGLLM_REQUIRE_EXTERNAL(src, "the llama.cpp source");
  const std::string calls_json =
      R"([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Paris \"x\"", "days": 2, "o": {"a": [1, true, null]}}}}]}])";
  for (const auto& [file, open, close] :
       {std::tuple{"Qwen-Qwen2.5-7B-Instruct.jinja", "<tool_call>", "</tool_call>"},
        std::tuple{"LFM2.5-8B-A1B.jinja", "<|tool_call_start|>", "<|tool_call_end|>"}}) {
    std::ifstream in(*src + "/models/templates/" + file);
    ASSERT_TRUE(in) << file;
    const std::string jinja((std::istreambuf_iterator<char>(in)), {});
    ChatRequest r;
    r.messages = calls_json;
    r.add_generation_prompt = false;
    const std::string text = ChatTemplate(jinja).render(r);
    const size_t b = text.find(open), e = text.find(close);
    ASSERT_TRUE(b != std::string::npos && e != std::string::npos) << file << ":\n" << text;
    const ParsedReply p = parse_tool_calls(text.substr(b, e + std::string(close).size() - b));
    ASSERT_EQ(p.tool_calls.size(), 1u) << file;
    EXPECT_EQ(p.tool_calls[0].name, "get_weather");
    EXPECT_EQ(p.tool_calls[0].arguments, R"({"city":"Paris \"x\"","days":2,"o":{"a":[1,true,null]}})") << file;
  }
}

// gpt-oss replies (special tokens kept): analysis as reasoning, final as content, calls to functions.*, in any pieces.
TEST(Harmony, ChannelsAndCallsInAnyPieces) {
  struct Case {
    const char* reply;
    const char* reasoning;
    const char* content;
    std::vector<ToolCall> calls;
  };
  const Case cases[] = {
      {"<|channel|>analysis<|message|>User greets.<|end|><|start|>assistant<|channel|>final<|message|>Hello <there>!",
       "User greets.",
       "Hello <there>!",
       {}},
      {"<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
       "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
       "Need weather.",
       "",
       {{"get_weather", R"({"city":"Paris"})"}}},
      {"<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}", "", "", {{"f", "{}"}}},
      {"<|channel|>commentary to=functions.f <|constrain|>json<|message|>{not json", "", "{not json", {}},
      {"Plain reply, no channels.", "", "Plain reply, no channels.", {}},
  };
  for (const Case& c : cases)
    for (size_t piece : {size_t(1), size_t(4), size_t(1000)}) {
      HarmonyStream h;
      const std::string reply = c.reply;
      ReasoningSplitter::Parts all;
      for (size_t i = 0; i < reply.size(); i += piece) {
        const ReasoningSplitter::Parts p = h.push(reply.substr(i, piece));
        all.reasoning += p.reasoning, all.content += p.content;
      }
      const HarmonyStream::End end = h.finish();
      all.reasoning += end.rest.reasoning, all.content += end.rest.content;
      EXPECT_EQ(all.reasoning, c.reasoning) << c.reply << " in pieces of " << piece;
      EXPECT_EQ(all.content, c.content) << c.reply << " in pieces of " << piece;
      EXPECT_TRUE(same_calls(end.tool_calls, c.calls)) << c.reply << " in pieces of " << piece;
    }
  EXPECT_TRUE(prompt_expects_harmony("<|start|>user<|message|>hi<|end|><|start|>assistant"));
  EXPECT_FALSE(prompt_expects_harmony("<|im_start|>assistant\n"));
}

TEST(ToolCalls, StreamHoldsOnlyTheCalls) {
  for (const CallCase& c : kCalls)
    for (size_t piece : {size_t(1), size_t(3), size_t(1000)}) {
      ToolCallStream s;
      const std::string reply = c.reply;
      std::string passed;
      for (size_t i = 0; i < reply.size(); i += piece) passed += s.push(reply.substr(i, piece));
      const ParsedReply p = s.finish();
      EXPECT_TRUE(same_calls(p.tool_calls, c.calls)) << c.reply << " in pieces of " << piece;
      if (c.calls.empty()) {
        EXPECT_EQ(passed + p.content, reply) << "in pieces of " << piece;
      }
    }
  ToolCallStream s;
  EXPECT_EQ(s.push("Let me check.\n<tool"), "Let me check.\n");
  EXPECT_EQ(s.push("_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>"), "");
  EXPECT_EQ(s.finish().tool_calls.size(), 1u);
}

}  // namespace
}  // namespace wgllm
