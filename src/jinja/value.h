// The one value type of the Jinja interpreter: what a template computes with, modelled on the Python objects
// jinja2 hands a chat template (None, bool, int, float, str, list, dict) plus jinja2's Undefined and callables.
// Lists and dicts are shared by reference, as in Python; a dict keeps its keys in insertion order.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

namespace wgllm::jinja {

class Value;
class Interpreter;

struct Array {
  std::vector<Value> items;
  bool tuple = false;      // printed as (a, b) instead of [a, b]
  bool generator = false;  // what jinja2's map / select / ... give: iterable, always true, no len(), not JSON
};

struct Object {
  // Keys in insertion order. A key that is not a string (a dict literal's {512: ...}) is stored in the form
  // key_of gives it and read back as a Value with key_value.
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;  // namespace(): attributes may be assigned with {% set ns.x = ... %}
  const Value* find(std::string_view key) const;
  void set(std::string_view key, Value v);
  static std::string key_of(const Value& key);
  static Value key_value(const std::string& stored);
};

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // The argument at `index`, or the keyword `name`, or nullptr.
  const Value* get(size_t index, std::string_view name) const;
};

struct Function {
  std::string name;
  std::function<Value(Interpreter&, Args&)> call;
};

// jinja2's default Undefined: prints empty, is falsy, iterates as empty; most other uses are errors naming it.
struct Undefined {
  std::string name;
};

class Value {
 public:
  enum class Type { Undefined, None, Bool, Int, Float, String, Array, Object, Function };

  Value() : v_(Undefined{}) {}
  static Value undefined(std::string name) { return Value(Undefined{std::move(name)}); }
  static Value none() { return Value(nullptr); }
  Value(bool b) : v_(b) {}
  Value(int64_t i) : v_(i) {}
  Value(int i) : v_(int64_t{i}) {}
  Value(double d) : v_(d) {}
  Value(std::string s) : v_(std::move(s)) {}
  // A string jinja2 holds as Markup (the safe and escape filters): `+` HTML-escapes a plain string joined to it.
  static Value markup(std::string s);
  Value(std::string_view s) : v_(std::string(s)) {}
  Value(const char* s) : v_(std::string(s)) {}
  Value(std::shared_ptr<Array> a) : v_(std::move(a)) {}
  Value(std::shared_ptr<Object> o) : v_(std::move(o)) {}
  Value(std::shared_ptr<const Function> f) : v_(std::move(f)) {}
  static Value array(std::vector<Value> items = {}, bool tuple = false);
  static Value object();
  static Value function(std::string name, std::function<Value(Interpreter&, Args&)> fn);
  // JSON as Python's json.loads gives it (objects keep their key order). Throws std::invalid_argument past 256
  // levels of nesting.
  static Value from_json(const nlohmann::ordered_json& j);

  Type type() const { return static_cast<Type>(v_.index()); }
  bool is_undefined() const { return type() == Type::Undefined; }
  bool is_none() const { return type() == Type::None; }
  bool is_bool() const { return type() == Type::Bool; }
  bool is_int() const { return type() == Type::Int; }
  bool is_float() const { return type() == Type::Float; }
  bool is_number() const { return is_int() || is_float() || is_bool(); }  // Python: bool is an int
  bool is_string() const { return type() == Type::String; }
  bool is_array() const { return type() == Type::Array; }
  bool is_object() const { return type() == Type::Object; }
  bool is_function() const { return type() == Type::Function; }
  bool is_markup() const { return markup_; }

  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const;    // ints and bools
  double as_double() const;  // any number
  const std::string& str() const { return std::get<std::string>(v_); }
  Array& arr() const { return *std::get<std::shared_ptr<Array>>(v_); }
  Object& obj() const { return *std::get<std::shared_ptr<Object>>(v_); }
  const Function& fn() const { return *std::get<std::shared_ptr<const Function>>(v_); }
  const std::string& undefined_name() const { return std::get<Undefined>(v_).name; }
  // Same list or dict object (Python's `is`).
  bool same_object(const Value& o) const;

  bool truthy() const;
  // Python's str() (Undefined: empty) and repr().
  std::string to_str() const;
  std::string repr() const;
  // Python's type name: 'str', 'int', 'list', 'dict', 'NoneType', ...
  std::string type_name() const;

 private:
  using Variant = std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, std::shared_ptr<Array>,
                               std::shared_ptr<Object>, std::shared_ptr<const Function>>;
  explicit Value(Undefined u) : v_(std::move(u)) {}
  explicit Value(std::nullptr_t) : v_(nullptr) {}
  Variant v_;
  bool markup_ = false;
};

// Python's ==.
bool equal(const Value& a, const Value& b);
// Python's <: numbers, strings, lists; throws std::invalid_argument (the caller names the place) otherwise.
bool less(const Value& a, const Value& b);
// Python's float repr: shortest round-trip digits, "1.0", "1e-05", "1e+16", "inf", "nan".
std::string float_repr(double d);
// Integer arithmetic as Python's where the result fits 64 bits; past that an error ("integer overflow": Python's ints
// grow, but no template needs such numbers). floor_div and py_mod round toward negative infinity as Python's // and %
// (y != 0); power needs y >= 0.
int64_t add_int(int64_t x, int64_t y);
int64_t sub_int(int64_t x, int64_t y);
int64_t mul_int(int64_t x, int64_t y);
int64_t floor_div(int64_t x, int64_t y);
int64_t py_mod(int64_t x, int64_t y);
int64_t power_int(int64_t x, int64_t y);
// HTML escaping as markupsafe's escape(): & < > " '.
std::string html_escape(std::string_view s);
// Python's json.dumps(v, ensure_ascii=False, indent=indent, separators=None, sort_keys=False): compact (", ", ": ")
// without an indent, else each item on its own line after `indent` repeated per level. Throws std::invalid_argument
// for a value JSON cannot hold (Undefined, a function).
std::string to_json(const Value& v, const std::string* indent = nullptr, bool ensure_ascii = false);
// A UTF-8 string's characters (code points), each its bytes; Python indexes strings by these.
std::vector<std::string_view> utf8_chars(std::string_view s);
size_t utf8_length(std::string_view s);

}  // namespace wgllm::jinja
