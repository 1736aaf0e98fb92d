// The syntax tree of a Jinja template: expressions and statements, each with its offset in the source for errors.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace wgllm::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Expr {
  enum class Kind {
    Literal,  // value
    Name,     // name
    List,     // [args...]
    Tuple,    // (args...)
    Dict,     // {kwargs keys... : args values...}; keys in `keys`
    Attr,     // args[0].name
    Index,    // args[0][args[1]]
    Slice,    // args[0][args[1]:args[2]:args[3]] (null where left out)
    Call,     // args[0](args[1:]..., kwargs...)
    Filter,   // args[0] | name(args[1:]..., kwargs...)
    Test,     // args[0] is [not] name(args[1:]...)
    Not,      // not args[0]
    Neg,      // -args[0]
    Pos,      // +args[0]
    Binary,   // args[0] op args[1]: + - * / // % ** ~ == != < > <= >= in "not in"
    And,      // args[0] and args[1]
    Or,       // args[0] or args[1]
    Cond,     // args[0] if args[1] else args[2] (args[2] null: undefined)
  };
  Kind kind;
  size_t offset = 0;
  Value value;
  std::string name;      // Name, Attr, Filter, Test; Binary: the operator
  bool negated = false;  // Test: "is not"
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // Call, Filter, Test keyword arguments
  std::vector<ExprPtr> keys;                            // Dict
};

struct Stmt {
  enum class Kind {
    Text,         // text
    Output,       // {{ expr }}
    If,           // branches: (cond, body)...; else_body
    For,          // for targets in expr [if cond]: body; else_body
    Set,          // set targets = expr, or set expr.attr = value (target_attr)
    SetBlock,     // set targets[0] %}body{% endset; filters applied in `filters`
    Macro,        // macro name(params) body
    CallBlock,    // call(params) expr %}body{% endcall
    FilterBlock,  // filter filters %}body{% endfilter
    Break,
    Continue,
    Scope,  // a body rendered as is (transformers' {% generation %})
  };
  Kind kind;
  size_t offset = 0;
  std::string text;
  ExprPtr expr;                      // Output, For iterable, Set value, CallBlock call
  ExprPtr cond;                      // For filter
  ExprPtr target_obj;                // Set ns.attr: the namespace expression; text: the attribute
  std::vector<std::string> targets;  // For, Set, SetBlock, Macro name (targets[0])
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro, CallBlock: name and default (may be null)
  std::vector<ExprPtr> filters;  // SetBlock, FilterBlock: Filter expressions whose args[0] is null (the body)
};

}  // namespace wgllm::jinja
