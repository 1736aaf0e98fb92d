// The Jinja evaluator (see interpreter.h): statements write into the output string, expressions give Values with
// Python's semantics for the operators.
#include "jinja/interpreter.h"

#include <cmath>
#include <stdexcept>
#include <unordered_set>
#include <vector>

#include "jinja/parser.h"
#include "jinja/template.h"

namespace wgllm::jinja {

namespace {

// Whether v is the object o or holds it through lists, dicts and namespaces (walked without recursion, each container
// once). Lists and dicts cannot change once made, so storing v in namespace o closes a cycle of references, which
// would never be freed, exactly when this holds.
bool holds(const Value& v, const Object* o) {
  std::vector<const Value*> todo{&v};
  std::unordered_set<const void*> seen;
  while (!todo.empty()) {
    const Value* x = todo.back();
    todo.pop_back();
    if (x->is_array()) {
      if (!seen.insert(&x->arr()).second) continue;
      for (const Value& item : x->arr().items) todo.push_back(&item);
    } else if (x->is_object()) {
      if (&x->obj() == o) return true;
      if (!seen.insert(&x->obj()).second) continue;
      for (const auto& item : x->obj().items) todo.push_back(&item.second);
    }
  }
  return false;
}

std::runtime_error type_error(std::string_view op, const Value& a, const Value& b) {
  return std::runtime_error("unsupported operand type(s) for " + std::string(op) + ": '" + a.type_name() + "' and '" +
                            b.type_name() + "'");
}

// Undefined as an operand is an error naming what was undefined, as jinja2's Undefined raises.
void check_defined(const Value& v) {
  if (v.is_undefined()) throw std::runtime_error(v.undefined_name());
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  check_defined(a);
  check_defined(b);
  if (a.is_number() && b.is_number()) {
    const bool ints = !a.is_float() && !b.is_float();
    if (op == "/") {
      if (b.as_double() == 0) throw std::runtime_error("division by zero");
      return Value(a.as_double() / b.as_double());
    }
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (op == "+") return Value(add_int(x, y));
      if (op == "-") return Value(sub_int(x, y));
      if (op == "*") return Value(mul_int(x, y));
      if (op == "//" || op == "%") {
        if (y == 0) throw std::runtime_error("integer division or modulo by zero");
        return Value(op == "//" ? floor_div(x, y) : py_mod(x, y));
      }
      if (op == "**") {
        if (y < 0) return Value(std::pow(static_cast<double>(x), static_cast<double>(y)));
        return Value(power_int(x, y));
      }
    }
    const double x = a.as_double(), y = b.as_double();
    if (op == "+") return Value(x + y);
    if (op == "-") return Value(x - y);
    if (op == "*") return Value(x * y);
    if (op == "**") return Value(std::pow(x, y));
    if (y == 0) throw std::runtime_error("float division by zero");
    if (op == "//") return Value(std::floor(x / y));
    if (op == "%") {
      double r = std::fmod(x, y);
      if (r != 0 && ((r < 0) != (y < 0))) r += y;
      return Value(r);
    }
  }
  if (op == "+" && a.is_string() && b.is_string()) {
    if (a.is_markup() || b.is_markup())  // markupsafe: the plain side is escaped, the result is Markup
      return Value::markup((a.is_markup() ? a.str() : html_escape(a.str())) +
                           (b.is_markup() ? b.str() : html_escape(b.str())));
    return Value(a.str() + b.str());
  }
  if (op == "+" && a.is_array() && b.is_array()) {
    std::vector<Value> items = a.arr().items;
    items.insert(items.end(), b.arr().items.begin(), b.arr().items.end());
    return Value::array(std::move(items), a.arr().tuple);
  }
  if (op == "*" && a.is_int() && (b.is_string() || b.is_array())) return arithmetic(op, b, a);  // 3 * 'ab'
  if (op == "*" && (a.is_string() || a.is_array()) && b.is_int()) {
    const int64_t n = b.as_int();
    const size_t unit = a.is_string() ? a.str().size() : a.arr().items.size();
    if (n > 0 && unit > 0 && uint64_t(n) > (uint64_t{1} << 26) / unit)  // 64 Mi bytes or items: no prompt needs more
      throw std::runtime_error("repetition too large");
    if (a.is_string()) {
      std::string s;
      for (int64_t i = 0; i < n; ++i) s += a.str();
      return Value(std::move(s));
    }
    std::vector<Value> items;
    for (int64_t i = 0; i < n; ++i) items.insert(items.end(), a.arr().items.begin(), a.arr().items.end());
    return Value::array(std::move(items), a.arr().tuple);
  }
  throw type_error(op, a, b);
}

bool contains(const Value& container, const Value& needle) {
  if (container.is_undefined()) return false;
  if (container.is_string()) {
    if (!needle.is_string())
      throw std::runtime_error("'in <string>' requires string as left operand, not " + needle.type_name());
    return container.str().find(needle.str()) != std::string::npos;
  }
  if (container.is_array()) {
    for (const Value& v : container.arr().items)
      if (equal(v, needle)) return true;
    return false;
  }
  if (container.is_object()) {
    if (!needle.is_string() && !needle.is_number() && !needle.is_none()) return false;
    return container.obj().find(Object::key_of(needle)) != nullptr;
  }
  throw std::runtime_error("argument of type '" + container.type_name() + "' is not iterable");
}

// Python's slice of n items: the indices it takes.
std::vector<int64_t> slice_indices(int64_t n, const Value& start, const Value& stop, const Value& step_v) {
  const int64_t step = step_v.is_none() || step_v.is_undefined() ? 1 : step_v.as_int();
  if (step == 0) throw std::runtime_error("slice step cannot be zero");
  const auto clamp = [&](const Value& v, int64_t def) {
    if (v.is_none() || v.is_undefined()) return def;
    int64_t i = v.as_int();
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  const int64_t b = clamp(start, step > 0 ? 0 : n - 1), e = clamp(stop, step > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = b; step > 0 ? i < e : i > e; i += step) out.push_back(i);
  return out;
}

}  // namespace

void Interpreter::Scope::set(const std::string& name, Value v) {
  for (auto& [k, old] : vars)
    if (k == name) {
      old = std::move(v);
      return;
    }
  vars.emplace_back(name, std::move(v));
}

Interpreter::Interpreter(const SourceMap& map, const Value& vars, const std::tm& now)
    : map_(map), vars_(vars), now_(now) {}

void Interpreter::fail(size_t offset, const std::string& message) const {
  throw TemplateError(map_.where(offset, message));
}

void Interpreter::render(const Body& body, std::string& out) { exec(body, out); }

Interpreter::Flow Interpreter::exec(const Body& body, std::string& out) {
  for (const StmtPtr& s : body) {
    const Flow f = exec(*s, out);
    if (f != Flow::Normal) return f;
  }
  return Flow::Normal;
}

// Errors of a statement's own work (a set or for target that cannot be unpacked from a value that is not iterable)
// come out as TemplateError at the statement, as eval's do at an expression.
Interpreter::Flow Interpreter::exec(const Stmt& s, std::string& out) {
  try {
    return exec_stmt(s, out);
  } catch (const TemplateError&) {
    throw;
  } catch (const std::exception& ex) {
    fail(s.offset, ex.what());
  }
}

Interpreter::Flow Interpreter::exec_stmt(const Stmt& s, std::string& out) {
  switch (s.kind) {
    case Stmt::Kind::Text: out += s.text; break;
    case Stmt::Kind::Output: out += eval(*s.expr).to_str(); break;
    case Stmt::Kind::If:
      for (const auto& [cond, body] : s.branches)
        if (eval(*cond).truthy()) return exec(body, out);
      return exec(s.else_body, out);
    case Stmt::Kind::For: return exec_for(s, out);
    case Stmt::Kind::Set: exec_set(s); break;
    case Stmt::Kind::SetBlock: {
      std::string text;
      exec(s.body, text);
      Value v(std::move(text));
      for (const ExprPtr& f : s.filters) v = eval_filter(*f, v);
      scope_->set(s.targets[0], std::move(v));
      break;
    }
    case Stmt::Kind::Macro: scope_->set(s.targets[0], make_macro(s)); break;
    case Stmt::Kind::CallBlock: {
      const Expr& call_expr = *s.expr;
      Value fn = eval(*call_expr.args[0]);
      Args args;
      eval_args(call_expr, 1, args);
      Scope* caller_scope = scope_;
      args.kw.emplace_back("caller", Value::function("caller", [&s, caller_scope](Interpreter& in, Args& a) {
                             Scope scope{{}, caller_scope};
                             for (size_t i = 0; i < s.params.size(); ++i) {
                               const Value* v = a.get(i, s.params[i].first);
                               scope.vars.emplace_back(s.params[i].first, v ? *v
                                                                          : s.params[i].second
                                                                              ? in.eval(*s.params[i].second)
                                                                              : Value::undefined("caller"));
                             }
                             Scope* saved = in.scope_;
                             in.scope_ = &scope;
                             std::string text;
                             in.exec(s.body, text);
                             in.scope_ = saved;
                             return Value(std::move(text));
                           }));
      try {
        out += call(fn, args).to_str();
      } catch (const TemplateError&) {
        throw;
      } catch (const std::exception& e) {
        fail(call_expr.offset, e.what());
      }
      break;
    }
    case Stmt::Kind::FilterBlock: {
      std::string text;
      exec(s.body, text);
      Value v(std::move(text));
      for (const ExprPtr& f : s.filters) v = eval_filter(*f, v);
      out += v.to_str();
      break;
    }
    case Stmt::Kind::Break: return Flow::Break;
    case Stmt::Kind::Continue: return Flow::Continue;
    case Stmt::Kind::Scope: return exec(s.body, out);
  }
  return Flow::Normal;
}

Interpreter::Flow Interpreter::exec_for(const Stmt& s, std::string& out) {
  Value seq = eval(*s.expr);
  if (seq.is_none() || seq.is_number() || seq.is_function())
    fail(s.expr->offset, "'" + seq.type_name() + "' object is not iterable");
  std::vector<Value> items = iterate(seq);
  Scope scope{{}, scope_};
  const auto bind = [&](const Value& item) {
    if (s.targets.size() == 1) {
      scope.set(s.targets[0], item);
      return;
    }
    const std::vector<Value> parts = iterate(item);
    if (parts.size() != s.targets.size())
      fail(s.offset, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                         std::to_string(s.targets.size()) + " names");
    for (size_t k = 0; k < parts.size(); ++k) scope.set(s.targets[k], parts[k]);
  };
  if (s.cond) {  // {% for x in xs if cond %}: the loop sees only the items that pass
    std::vector<Value> kept;
    Scope* saved = scope_;
    scope_ = &scope;
    for (Value& item : items) {
      bind(item);
      if (eval(*s.cond).truthy()) kept.push_back(std::move(item));
    }
    scope_ = saved;
    items = std::move(kept);
  }
  const int64_t n = static_cast<int64_t>(items.size());
  Scope* saved = scope_;
  for (int64_t i = 0; i < n; ++i) {
    // A template's loops get a budget (far above any prompt's needs), so that none runs for hours.
    if (++iterations_ > 10'000'000) fail(s.offset, "too many loop iterations (more than 10 million)");
    scope.vars.clear();
    bind(items[i]);
    Value loop = Value::object();
    auto& f = loop.obj().items;
    f.reserve(12);
    f.emplace_back("index", Value(i + 1));
    f.emplace_back("index0", Value(i));
    f.emplace_back("revindex", Value(n - i));
    f.emplace_back("revindex0", Value(n - i - 1));
    f.emplace_back("first", Value(i == 0));
    f.emplace_back("last", Value(i == n - 1));
    f.emplace_back("length", Value(n));
    f.emplace_back("depth", Value(1));
    f.emplace_back("depth0", Value(0));
    if (i > 0) f.emplace_back("previtem", items[i - 1]);
    if (i + 1 < n) f.emplace_back("nextitem", items[i + 1]);
    f.emplace_back("cycle", Value::function("cycle", [i](Interpreter&, Args& a) {
                     if (a.pos.empty()) throw std::runtime_error("no items for cycling given");
                     return a.pos[i % a.pos.size()];
                   }));
    scope.set("loop", std::move(loop));
    scope_ = &scope;
    Flow flow;
    try {
      flow = exec(s.body, out);
    } catch (...) {
      scope_ = saved;
      throw;
    }
    scope_ = saved;
    if (out.size() > (size_t{256} << 20)) fail(s.offset, "rendered text too large (more than 256 MiB)");
    if (flow == Flow::Break) break;
  }
  if (n == 0) return exec(s.else_body, out);
  return Flow::Normal;
}

void Interpreter::exec_set(const Stmt& s) {
  Value v = eval(*s.expr);
  if (s.target_obj) {
    Value ns = eval(*s.target_obj);
    if (!ns.is_object() || !ns.obj().is_namespace)
      fail(s.target_obj->offset, "cannot assign attribute on non-namespace object");
    if (holds(v, &ns.obj())) fail(s.target_obj->offset, "cannot store a namespace inside itself");
    ns.obj().set(s.text, std::move(v));
    return;
  }
  if (s.targets.size() == 1) {
    scope_->set(s.targets[0], std::move(v));
    return;
  }
  const std::vector<Value> parts = iterate(v);
  if (parts.size() != s.targets.size())
    fail(s.offset, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                       std::to_string(s.targets.size()) + " names");
  for (size_t k = 0; k < parts.size(); ++k) scope_->set(s.targets[k], parts[k]);
}

Value Interpreter::make_macro(const Stmt& s) {
  return Value::function(s.targets[0], [&s](Interpreter& in, Args& a) {
    Scope scope{{}, &in.root_};
    size_t named = 0;
    for (size_t i = 0; i < s.params.size(); ++i) {
      const std::string& p = s.params[i].first;
      const Value* v = i < a.pos.size() ? &a.pos[i] : nullptr;
      for (const auto& [k, kv] : a.kw)
        if (k == p) v = &kv, ++named;
      Scope* saved = in.scope_;
      in.scope_ = &scope;
      Value value = v                    ? *v
                    : s.params[i].second ? in.eval(*s.params[i].second)
                                         : Value::undefined("'" + p + "' is undefined");
      in.scope_ = saved;
      scope.vars.emplace_back(p, std::move(value));
    }
    if (a.pos.size() > s.params.size())
      throw std::runtime_error("macro '" + s.targets[0] + "' takes not more than " + std::to_string(s.params.size()) +
                               " argument(s)");
    for (const auto& [k, kv] : a.kw)
      if (k == "caller") scope.vars.emplace_back(k, kv), ++named;
    if (named < a.kw.size()) throw std::runtime_error("macro '" + s.targets[0] + "' takes no keyword argument");
    Scope* saved = in.scope_;
    in.scope_ = &scope;
    std::string text;
    try {
      in.exec(s.body, text);
    } catch (...) {
      in.scope_ = saved;
      throw;
    }
    in.scope_ = saved;
    return Value(std::move(text));
  });
}

Value Interpreter::lookup(const std::string& name) const {
  for (const Scope* s = scope_; s; s = s->parent)
    for (const auto& [k, v] : s->vars)
      if (k == name) return v;
  if (vars_.is_object())
    if (const Value* v = vars_.obj().find(name)) return *v;
  Value g = global(name);
  if (!g.is_undefined()) return g;
  return Value::undefined("'" + name + "' is undefined");
}

Value Interpreter::call(const Value& fn, Args& args) {
  if (fn.is_undefined()) throw std::runtime_error(fn.undefined_name());
  if (!fn.is_function()) throw std::runtime_error("'" + fn.type_name() + "' object is not callable");
  constexpr int kMaxCallDepth = 64;
  if (call_depth_ >= kMaxCallDepth) throw std::runtime_error("maximum recursion depth exceeded");
  ++call_depth_;
  try {
    Value v = fn.fn().call(*this, args);
    --call_depth_;
    return v;
  } catch (...) {
    --call_depth_;
    throw;
  }
}

Value Interpreter::eval(const Expr& e) {
  try {
    return eval_node(e);
  } catch (const TemplateError&) {
    throw;
  } catch (const std::exception& ex) {
    fail(e.offset, ex.what());
  }
}

void Interpreter::eval_args(const Expr& e, size_t first, Args& args) {
  for (size_t i = first; i < e.args.size(); ++i) args.pos.push_back(eval(*e.args[i]));
  for (const auto& [k, v] : e.kwargs) args.kw.emplace_back(k, eval(*v));
}

Value Interpreter::eval_filter(const Expr& e, Value operand) {
  Args args;
  eval_args(e, 1, args);
  try {
    return apply_filter(*this, e.name, operand, args);
  } catch (const TemplateError&) {
    throw;
  } catch (const std::exception& ex) {
    fail(e.offset, ex.what());
  }
}

Value Interpreter::eval_call(const Expr& e) {
  const Expr& callee = *e.args[0];
  Args args;
  if (callee.kind == Expr::Kind::Attr) {  // obj.method(...): called without making a bound method
    Value obj = eval(*callee.args[0]);
    eval_args(e, 1, args);
    if (std::optional<Value> r = call_method(*this, obj, callee.name, args)) return *r;
    return call(get_attr(obj, callee.name), args);
  }
  Value fn = eval(callee);
  eval_args(e, 1, args);
  return call(fn, args);
}

Value Interpreter::eval_binary(const Expr& e) {
  const std::string& op = e.name;
  Value a = eval(*e.args[0]);
  Value b = eval(*e.args[1]);
  if (op == "~") return Value(a.to_str() + b.to_str());
  if (op == "==") return Value(equal(a, b));
  if (op == "!=") return Value(!equal(a, b));
  if (op == "in") return Value(contains(b, a));
  if (op == "not in") return Value(!contains(b, a));
  if (op == "<" || op == ">" || op == "<=" || op == ">=") {
    check_defined(a);
    check_defined(b);
    if (op == "<") return Value(less(a, b));
    if (op == ">") return Value(less(b, a));
    if (op == "<=") return Value(!less(b, a));
    return Value(!less(a, b));
  }
  return arithmetic(op, a, b);
}

Value Interpreter::eval_node(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::Literal: return e.value;
    case Expr::Kind::Name: return lookup(e.name);
    case Expr::Kind::List:
    case Expr::Kind::Tuple: {
      std::vector<Value> items;
      items.reserve(e.args.size());
      for (const ExprPtr& a : e.args) items.push_back(eval(*a));
      return Value::array(std::move(items), e.kind == Expr::Kind::Tuple);
    }
    case Expr::Kind::Dict: {
      Value d = Value::object();
      for (size_t i = 0; i < e.keys.size(); ++i) {
        Value k = eval(*e.keys[i]);
        d.obj().set(Object::key_of(k), eval(*e.args[i]));
      }
      return d;
    }
    case Expr::Kind::Attr: return get_attr(eval(*e.args[0]), e.name);
    case Expr::Kind::Index: return get_item(eval(*e.args[0]), eval(*e.args[1]));
    case Expr::Kind::Slice: {
      Value v = eval(*e.args[0]);
      Value parts[3];
      for (int k = 0; k < 3; ++k) parts[k] = e.args[k + 1] ? eval(*e.args[k + 1]) : Value::none();
      check_defined(v);
      if (v.is_string()) {
        const std::vector<std::string_view> chars = utf8_chars(v.str());
        std::string s;
        for (int64_t i : slice_indices(static_cast<int64_t>(chars.size()), parts[0], parts[1], parts[2])) s += chars[i];
        return Value(std::move(s));
      }
      if (v.is_array()) {
        const auto& items = v.arr().items;
        std::vector<Value> out;
        for (int64_t i : slice_indices(static_cast<int64_t>(items.size()), parts[0], parts[1], parts[2]))
          out.push_back(items[i]);
        return Value::array(std::move(out), v.arr().tuple);
      }
      fail(e.offset, "'" + v.type_name() + "' object is not subscriptable");
    }
    case Expr::Kind::Call: return eval_call(e);
    case Expr::Kind::Filter: return eval_filter(e, eval(*e.args[0]));
    case Expr::Kind::Test: {
      Value v = eval(*e.args[0]);
      Args args;
      eval_args(e, 1, args);
      return Value(apply_test(*this, e.name, v, args) != e.negated);
    }
    case Expr::Kind::Not: return Value(!eval(*e.args[0]).truthy());
    case Expr::Kind::Neg:
    case Expr::Kind::Pos: {
      Value v = eval(*e.args[0]);
      check_defined(v);
      if (!v.is_number())
        throw std::runtime_error("bad operand type for unary " + std::string(e.kind == Expr::Kind::Neg ? "-" : "+") +
                                 ": '" + v.type_name() + "'");
      if (e.kind == Expr::Kind::Pos) return v.is_bool() ? Value(v.as_int()) : v;
      return v.is_float() ? Value(-v.as_double()) : Value(sub_int(0, v.as_int()));
    }
    case Expr::Kind::Binary: return eval_binary(e);
    case Expr::Kind::And: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? eval(*e.args[1]) : a;
    }
    case Expr::Kind::Or: {
      Value a = eval(*e.args[0]);
      return a.truthy() ? a : eval(*e.args[1]);
    }
    case Expr::Kind::Cond:
      if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
      return e.args[2] ? eval(*e.args[2]) : Value::undefined("the conditional expression has no else");
  }
  return Value();
}

// ---- Template

struct Template::Parsed {
  std::string source;
  SourceMap map;
  Body body;
  explicit Parsed(std::string s) : source(std::move(s)), map(source) {}
};

Template::Template(std::string_view source) {
  std::string src(source);
  // jinja2 drops one trailing newline (keep_trailing_newline=False) and reads "\r\n" as "\n".
  for (size_t p = src.find("\r\n"); p != std::string::npos; p = src.find("\r\n", p)) src.erase(p, 1);
  if (!src.empty() && src.back() == '\n') src.pop_back();
  parsed_ = std::make_unique<Parsed>(std::move(src));
  parsed_->body = parse(tokenize(parsed_->source, parsed_->map), parsed_->map);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const Value& vars, const std::tm& now) const {
  Interpreter in(parsed_->map, vars, now);
  std::string out;
  in.render(parsed_->body, out);
  return out;
}

std::string Template::render(const Value& vars) const {
  const std::time_t t = std::time(nullptr);
  std::tm now{};
  localtime_r(&t, &now);
  return render(vars, now);
}

}  // namespace wgllm::jinja
