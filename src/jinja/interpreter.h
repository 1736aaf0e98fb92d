// The evaluator of a parsed template (ast.h) and the built-in filters, tests, methods and globals it calls.
#pragma once
#include <ctime>
#include <optional>
#include <string>
#include <string_view>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace wgllm::jinja {

// Renders one template once: variables live in a chain of scopes (a loop iteration and a macro call open one; if
// does not, as in jinja2), under the caller's variables and the globals.
class Interpreter {
 public:
  Interpreter(const SourceMap& map, const Value& vars, const std::tm& now);

  void render(const Body& body, std::string& out);
  Value eval(const Expr& e);
  // Calls a function value (a built-in, a macro, caller()).
  Value call(const Value& fn, Args& args);
  const std::tm& now() const { return now_; }
  [[noreturn]] void fail(size_t offset, const std::string& message) const;

 private:
  struct Scope {
    std::vector<std::pair<std::string, Value>> vars;
    Scope* parent = nullptr;
    void set(const std::string& name, Value v);
  };
  enum class Flow { Normal, Break, Continue };

  Flow exec(const Body& body, std::string& out);
  Flow exec(const Stmt& s, std::string& out);  // exec_stmt, its errors as TemplateError at the statement
  Flow exec_stmt(const Stmt& s, std::string& out);
  Flow exec_for(const Stmt& s, std::string& out);
  void exec_set(const Stmt& s);
  Value eval_node(const Expr& e);
  Value eval_binary(const Expr& e);
  Value eval_call(const Expr& e);
  Value eval_filter(const Expr& e, Value operand);
  void eval_args(const Expr& e, size_t first, Args& args);
  Value lookup(const std::string& name) const;
  Value make_macro(const Stmt& s);

  const SourceMap& map_;
  const Value& vars_;
  std::tm now_;
  Scope root_;
  Scope* scope_ = &root_;
  int call_depth_ = 0;      // macro and caller() calls in progress (bounded, as Python's recursion is)
  int64_t iterations_ = 0;  // loop iterations so far: a render has a budget of them
};

// Attribute and item access with jinja2's rules: obj.name tries the Python attribute (a method) first, then the
// item; obj[key] the item first. Missing: Undefined (whose own attributes are errors).
Value get_attr(const Value& obj, const std::string& name);
Value get_item(const Value& obj, const Value& key);
// The items a for loop walks: a list's items, a dict's keys, a string's characters, nothing for Undefined.
std::vector<Value> iterate(const Value& v);

// Built-ins; each throws std::exception with a message where Python would raise (the caller adds the place).
Value apply_filter(Interpreter& in, const std::string& name, const Value& v, Args& args);
bool apply_test(Interpreter& in, const std::string& name, const Value& v, Args& args);
// A str / list / dict method call, or nullopt when `obj` has no method `name`.
std::optional<Value> call_method(Interpreter& in, const Value& obj, const std::string& name, Args& args);
bool has_method(const Value& obj, std::string_view name);
// range, namespace, dict, raise_exception, strftime_now; Undefined for any other name.
Value global(const std::string& name);

}  // namespace wgllm::jinja
