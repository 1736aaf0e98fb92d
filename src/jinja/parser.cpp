// The Jinja parser (see parser.h). Precedence, lowest first, as jinja2's Parser: conditional expression, or, and,
// not, comparisons (== != < > <= >= in, not in), + -, ~, * / // %, **, unary - +, then a primary with its
// postfixes (.attr, [index], [a:b:c], (call)) and filters / tests (| f(args), is [not] t(args)).
#include "jinja/parser.h"

#include <initializer_list>
#include <string_view>

namespace wgllm::jinja {

namespace {

using T = Token::Type;

class Parser {
 public:
  Parser(const std::vector<Token>& tokens, const SourceMap& map) : t_(tokens), map_(map) {}

  Body parse_template() {
    Body body;
    const std::string stop = parse_body(body, {});
    if (!stop.empty()) fail(peek().offset, "unexpected '" + stop + "'");
    return body;
  }

 private:
  const Token& peek(size_t ahead = 0) const { return t_[std::min(i_ + ahead, t_.size() - 1)]; }
  const Token& next() { return t_[i_ < t_.size() - 1 ? i_++ : i_]; }
  bool is_op(std::string_view s, size_t ahead = 0) const { return peek(ahead).type == T::Op && peek(ahead).text == s; }
  bool is_name(std::string_view s, size_t ahead = 0) const {
    return peek(ahead).type == T::Name && peek(ahead).text == s;
  }
  bool skip_op(std::string_view s) {
    if (!is_op(s)) return false;
    ++i_;
    return true;
  }
  bool skip_name(std::string_view s) {
    if (!is_name(s)) return false;
    ++i_;
    return true;
  }
  [[noreturn]] void fail(size_t offset, const std::string& message) const {
    throw TemplateError(map_.where(offset, message));
  }
  std::string describe(const Token& t) const {
    switch (t.type) {
      case T::End: return "end of template";
      case T::BlockEnd: return "end of statement block";
      case T::VarEnd: return "end of print statement";
      case T::Text: return "template text";
      case T::String: return "string";
      default: return "'" + t.text + "'";
    }
  }
  void expect_op(std::string_view s) {
    if (!skip_op(s)) fail(peek().offset, "expected '" + std::string(s) + "', got " + describe(peek()));
  }
  std::string expect_name() {
    if (peek().type != T::Name) fail(peek().offset, "expected a name, got " + describe(peek()));
    return next().text;
  }
  void expect(T type) {
    if (peek().type != type) {
      const char* want = type == T::BlockEnd ? "end of statement block" : "end of print statement";
      fail(peek().offset, std::string("expected ") + want + ", got " + describe(peek()));
    }
    ++i_;
  }

  ExprPtr make(Expr::Kind kind, size_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }
  StmtPtr make_stmt(Stmt::Kind kind, size_t offset) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->offset = offset;
    return s;
  }

  // Statements until a tag whose keyword is one of `stops`; returns that keyword (the parser is just past it), or
  // "" at the end of the template (an error when stops were expected).
  std::string parse_body(Body& body, std::initializer_list<std::string_view> stops) {
    while (true) {
      const Token& tok = peek();
      if (tok.type == T::End) {
        if (stops.size() == 0) return "";
        std::string want;
        for (std::string_view s : stops) want += (want.empty() ? "'" : " or '") + std::string(s) + "'";
        fail(tok.offset, "unexpected end of template, expected " + want);
      }
      if (tok.type == T::Text) {
        auto s = make_stmt(Stmt::Kind::Text, tok.offset);
        s->text = next().text;
        body.push_back(std::move(s));
      } else if (tok.type == T::VarBegin) {
        next();
        auto s = make_stmt(Stmt::Kind::Output, tok.offset);
        s->expr = parse_expression();
        expect(T::VarEnd);
        body.push_back(std::move(s));
      } else if (tok.type == T::BlockBegin) {
        next();
        const Token& kw = peek();
        if (kw.type != T::Name) fail(kw.offset, "expected a statement name, got " + describe(kw));
        for (std::string_view s : stops)
          if (kw.text == s) {
            next();
            return kw.text;
          }
        body.push_back(parse_statement());
      } else {
        fail(tok.offset, "unexpected " + describe(tok));
      }
    }
  }

  // The end of an end tag: {% endfor %} (a name after it, as jinja2 allows for endmacro, is skipped).
  void end_tag() {
    if (peek().type == T::Name) next();
    expect(T::BlockEnd);
  }

  StmtPtr parse_statement() {
    const Nest nest(*this, peek().offset);
    const Token& kw = next();
    const std::string& k = kw.text;
    if (k == "if") return parse_if(kw.offset);
    if (k == "for") return parse_for(kw.offset);
    if (k == "set") return parse_set(kw.offset);
    if (k == "macro") return parse_macro(kw.offset);
    if (k == "call") return parse_call_block(kw.offset);
    if (k == "filter") return parse_filter_block(kw.offset);
    if (k == "break" || k == "continue") {
      if (loop_depth_ == 0) fail(kw.offset, "'" + k + "' outside a loop");
      expect(T::BlockEnd);
      return make_stmt(k == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, kw.offset);
    }
    if (k == "generation") {
      expect(T::BlockEnd);
      auto s = make_stmt(Stmt::Kind::Scope, kw.offset);
      parse_body(s->body, {"endgeneration"});
      end_tag();
      return s;
    }
    fail(kw.offset, "unknown statement '" + k + "'");
  }

  StmtPtr parse_if(size_t offset) {
    auto s = make_stmt(Stmt::Kind::If, offset);
    ExprPtr cond = parse_expression();
    expect(T::BlockEnd);
    while (true) {
      Body body;
      const std::string stop = parse_body(body, {"elif", "else", "endif"});
      s->branches.emplace_back(std::move(cond), std::move(body));
      if (stop == "elif") {
        cond = parse_expression();
        expect(T::BlockEnd);
        continue;
      }
      if (stop == "else") {
        expect(T::BlockEnd);
        parse_body(s->else_body, {"endif"});
      }
      end_tag();
      return s;
    }
  }

  void parse_targets(std::vector<std::string>& targets) {
    const bool paren = skip_op("(");
    do {
      targets.push_back(expect_name());
    } while (skip_op(",") && peek().type == T::Name);
    if (paren) expect_op(")");
  }

  StmtPtr parse_for(size_t offset) {
    auto s = make_stmt(Stmt::Kind::For, offset);
    parse_targets(s->targets);
    if (!skip_name("in")) fail(peek().offset, "expected 'in', got " + describe(peek()));
    s->expr = parse_or();
    if (skip_name("if")) s->cond = parse_or();
    if (is_name("recursive")) fail(peek().offset, "recursive loops are not supported");
    expect(T::BlockEnd);
    ++loop_depth_;
    const std::string stop = parse_body(s->body, {"else", "endfor"});
    --loop_depth_;
    if (stop == "else") {
      expect(T::BlockEnd);
      parse_body(s->else_body, {"endfor"});
    }
    end_tag();
    return s;
  }

  StmtPtr parse_set(size_t offset) {
    const size_t at = peek().offset;
    std::string first = expect_name();
    if (skip_op(".")) {  // set ns.attr = value
      auto s = make_stmt(Stmt::Kind::Set, offset);
      s->target_obj = make(Expr::Kind::Name, at);
      s->target_obj->name = std::move(first);
      s->text = expect_name();
      expect_op("=");
      s->expr = parse_tuple_expression();
      expect(T::BlockEnd);
      return s;
    }
    if (peek().type == T::BlockEnd || is_op("|")) {  // set x %}...{% endset
      auto s = make_stmt(Stmt::Kind::SetBlock, offset);
      s->targets.push_back(std::move(first));
      while (skip_op("|")) s->filters.push_back(parse_filter(nullptr));
      expect(T::BlockEnd);
      parse_body(s->body, {"endset"});
      end_tag();
      return s;
    }
    auto s = make_stmt(Stmt::Kind::Set, offset);
    s->targets.push_back(std::move(first));
    while (skip_op(",")) s->targets.push_back(expect_name());
    expect_op("=");
    s->expr = parse_tuple_expression();
    expect(T::BlockEnd);
    return s;
  }

  void parse_params(std::vector<std::pair<std::string, ExprPtr>>& params) {
    expect_op("(");
    while (!skip_op(")")) {
      if (!params.empty()) expect_op(",");
      if (skip_op(")")) break;
      std::string name = expect_name();
      ExprPtr def = skip_op("=") ? parse_expression() : nullptr;
      params.emplace_back(std::move(name), std::move(def));
    }
  }

  StmtPtr parse_macro(size_t offset) {
    auto s = make_stmt(Stmt::Kind::Macro, offset);
    s->targets.push_back(expect_name());
    parse_params(s->params);
    expect(T::BlockEnd);
    const int saved = loop_depth_;
    loop_depth_ = 0;
    parse_body(s->body, {"endmacro"});
    loop_depth_ = saved;
    end_tag();
    return s;
  }

  StmtPtr parse_call_block(size_t offset) {
    auto s = make_stmt(Stmt::Kind::CallBlock, offset);
    if (is_op("(")) parse_params(s->params);
    s->expr = parse_expression();
    if (s->expr->kind != Expr::Kind::Call) fail(s->expr->offset, "expected a call after 'call'");
    expect(T::BlockEnd);
    parse_body(s->body, {"endcall"});
    end_tag();
    return s;
  }

  StmtPtr parse_filter_block(size_t offset) {
    auto s = make_stmt(Stmt::Kind::FilterBlock, offset);
    do {
      s->filters.push_back(parse_filter(nullptr));
    } while (skip_op("|"));
    expect(T::BlockEnd);
    parse_body(s->body, {"endfilter"});
    end_tag();
    return s;
  }

  // ---- expressions

  // An expression, or a tuple of them without parentheses (the right side of set).
  ExprPtr parse_tuple_expression() {
    ExprPtr e = parse_expression();
    if (!is_op(",")) return e;
    auto t = make(Expr::Kind::Tuple, e->offset);
    t->args.push_back(std::move(e));
    while (skip_op(",")) {
      if (peek().type == T::BlockEnd) break;
      t->args.push_back(parse_expression());
    }
    return t;
  }

  // Nesting (brackets, blocks, `not not ...`) is bounded: a template is untrusted input, and each level is a
  // recursion of the parser and of the evaluator.
  struct Nest {
    Parser& p;
    Nest(Parser& parser, size_t offset) : p(parser) {
      if (++p.depth_ > kMaxDepth)
        p.fail(offset, "nested too deeply (more than " + std::to_string(kMaxDepth) + " levels)");
    }
    ~Nest() { --p.depth_; }
  };
  static constexpr int kMaxDepth = 100;

  ExprPtr parse_expression() {
    const Nest nest(*this, peek().offset);
    ExprPtr e = parse_or();
    while (is_name("if")) {
      const size_t at = next().offset;
      auto c = make(Expr::Kind::Cond, at);
      ExprPtr cond = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_expression() : nullptr;
      c->args.push_back(std::move(e));
      c->args.push_back(std::move(cond));
      c->args.push_back(std::move(otherwise));
      e = std::move(c);
    }
    return e;
  }

  ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr l, ExprPtr r, size_t offset) {
    auto e = make(kind, offset);
    e->name = std::move(op);
    e->args.push_back(std::move(l));
    e->args.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr e = parse_and();
    while (is_name("or")) {
      const size_t at = next().offset;
      e = binary(Expr::Kind::Or, "or", std::move(e), parse_and(), at);
    }
    return e;
  }

  ExprPtr parse_and() {
    ExprPtr e = parse_not();
    while (is_name("and")) {
      const size_t at = next().offset;
      e = binary(Expr::Kind::And, "and", std::move(e), parse_not(), at);
    }
    return e;
  }

  ExprPtr parse_not() {
    if (is_name("not")) {
      const Nest nest(*this, peek().offset);
      auto e = make(Expr::Kind::Not, next().offset);
      e->args.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    ExprPtr e = parse_math1();
    while (true) {
      const size_t at = peek().offset;
      std::string op;
      if (peek().type == T::Op && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                   peek().text == ">" || peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (skip_name("in")) {
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        i_ += 2;
        op = "not in";
      } else {
        return e;
      }
      e = binary(Expr::Kind::Binary, op, std::move(e), parse_math1(), at);
    }
  }

  ExprPtr parse_math1() {
    ExprPtr e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, op.text, std::move(e), parse_concat(), op.offset);
    }
    return e;
  }

  ExprPtr parse_concat() {
    ExprPtr e = parse_math2();
    while (is_op("~")) {
      const size_t at = next().offset;
      e = binary(Expr::Kind::Binary, "~", std::move(e), parse_math2(), at);
    }
    return e;
  }

  ExprPtr parse_math2() {
    ExprPtr e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      e = binary(Expr::Kind::Binary, op.text, std::move(e), parse_pow(), op.offset);
    }
    return e;
  }

  ExprPtr parse_pow() {
    ExprPtr e = parse_unary(true);
    while (is_op("**")) {
      const size_t at = next().offset;
      e = binary(Expr::Kind::Binary, "**", std::move(e), parse_unary(true), at);
    }
    return e;
  }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Nest nest(*this, peek().offset);
      const Token& op = next();
      e = make(op.text == "-" ? Expr::Kind::Neg : Expr::Kind::Pos, op.offset);
      e->args.push_back(parse_unary(false));
    } else {
      e = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(std::move(e)) : std::move(e);
  }

  ExprPtr parse_primary() {
    const Token& tok = peek();
    switch (tok.type) {
      case T::Name: {
        next();
        auto e = make(Expr::Kind::Literal, tok.offset);
        if (tok.text == "true" || tok.text == "True")
          e->value = Value(true);
        else if (tok.text == "false" || tok.text == "False")
          e->value = Value(false);
        else if (tok.text == "none" || tok.text == "None")
          e->value = Value::none();
        else {
          e->kind = Expr::Kind::Name;
          e->name = tok.text;
        }
        return e;
      }
      case T::String: {
        std::string s;
        while (peek().type == T::String) s += next().text;  // adjacent literals join
        auto e = make(Expr::Kind::Literal, tok.offset);
        e->value = Value(std::move(s));
        return e;
      }
      case T::Int:
      case T::Float: {
        next();
        auto e = make(Expr::Kind::Literal, tok.offset);
        e->value = tok.type == T::Int ? Value(tok.int_value) : Value(tok.float_value);
        return e;
      }
      case T::Op:
        if (tok.text == "(") {
          next();
          if (skip_op(")")) return make(Expr::Kind::Tuple, tok.offset);
          ExprPtr e = parse_expression();
          if (!is_op(",")) {
            expect_op(")");
            return e;
          }
          auto t = make(Expr::Kind::Tuple, tok.offset);
          t->args.push_back(std::move(e));
          while (skip_op(",") && !is_op(")")) t->args.push_back(parse_expression());
          expect_op(")");
          return t;
        }
        if (tok.text == "[") {
          next();
          auto e = make(Expr::Kind::List, tok.offset);
          while (!skip_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (skip_op("]")) break;
            e->args.push_back(parse_expression());
          }
          return e;
        }
        if (tok.text == "{") {
          next();
          auto e = make(Expr::Kind::Dict, tok.offset);
          while (!skip_op("}")) {
            if (!e->keys.empty()) expect_op(",");
            if (skip_op("}")) break;
            e->keys.push_back(parse_expression());
            expect_op(":");
            e->args.push_back(parse_expression());
          }
          return e;
        }
        break;
      default: break;
    }
    fail(tok.offset, "unexpected " + describe(tok));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      const size_t at = e->offset;  // errors of a.b[c] point at its start
      if (skip_op(".")) {
        if (peek().type == T::Int) {
          auto idx = make(Expr::Kind::Index, at);
          auto key = make(Expr::Kind::Literal, at);
          key->value = Value(next().int_value);
          idx->args.push_back(std::move(e));
          idx->args.push_back(std::move(key));
          e = std::move(idx);
          continue;
        }
        auto a = make(Expr::Kind::Attr, at);
        a->name = expect_name();
        a->args.push_back(std::move(e));
        e = std::move(a);
      } else if (skip_op("[")) {
        e = parse_subscript(std::move(e), at);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, size_t at) {
    ExprPtr parts[3];
    bool slice = false;
    for (int k = 0; k < 3; ++k) {
      if (!is_op(":") && !is_op("]")) parts[k] = parse_expression();
      if (k < 2 && skip_op(":")) {
        slice = true;
        continue;
      }
      break;
    }
    expect_op("]");
    auto e = make(slice ? Expr::Kind::Slice : Expr::Kind::Index, at);
    e->args.push_back(std::move(target));
    if (!slice && !parts[0]) fail(at, "expected a subscript");
    for (int k = 0; k < (slice ? 3 : 1); ++k) e->args.push_back(std::move(parts[k]));
    return e;
  }

  // ( args, name=value ) into e->args (after what is there) and e->kwargs.
  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!skip_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (skip_op(")")) break;
      if (peek().type == T::Name && is_op("=", 1)) {
        std::string name = next().text;
        next();
        e.kwargs.emplace_back(std::move(name), parse_expression());
      } else {
        if (!e.kwargs.empty()) fail(peek().offset, "positional argument after a keyword argument");
        e.args.push_back(parse_expression());
      }
    }
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Kind::Call, callee->offset);  // errors point at what is called
    e->args.push_back(std::move(callee));
    parse_call_args(*e);
    return e;
  }

  // A filter after '|': name[.name...][(args)], applied to `operand` (null: a filter block's body).
  ExprPtr parse_filter(ExprPtr operand) {
    auto e = make(Expr::Kind::Filter, peek().offset);
    e->name = expect_name();
    while (is_op(".") && peek(1).type == T::Name) {
      next();
      e->name += "." + next().text;
    }
    e->args.push_back(std::move(operand));
    if (is_op("(")) parse_call_args(*e);
    return e;
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      if (skip_op("|")) {
        e = parse_filter(std::move(e));
      } else if (is_name("is")) {
        auto t = make(Expr::Kind::Test, next().offset);
        t->negated = skip_name("not");
        t->name = expect_name();
        t->args.push_back(std::move(e));
        const Token& n = peek();
        if (is_op("(")) {
          parse_call_args(*t);
        } else if ((n.type == T::Name || n.type == T::String || n.type == T::Int || n.type == T::Float || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          t->args.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  const std::vector<Token>& t_;
  const SourceMap& map_;
  size_t i_ = 0;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace

Body parse(const std::vector<Token>& tokens, const SourceMap& map) { return Parser(tokens, map).parse_template(); }

}  // namespace wgllm::jinja
