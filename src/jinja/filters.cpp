// jinja2's built-in filters and tests that chat templates use, with transformers' tojson.
#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <unordered_map>

#include "jinja/interpreter.h"
#include "jinja/strings.h"

namespace wgllm::jinja {

namespace {

using Filter = Value (*)(Interpreter&, const Value&, Args&);

// The argument at `i` or keyword `name`, else `def`.
Value arg(const Args& a, size_t i, std::string_view name, Value def) {
  const Value* v = a.get(i, name);
  return v ? *v : def;
}

std::vector<Value> items_of(const Value& v) {
  if (v.is_none() || v.is_number() || v.is_function())
    throw std::runtime_error("'" + v.type_name() + "' object is not iterable");
  return iterate(v);
}

// jinja2's attribute getter for selectattr / map / sort: "a.b" looks up a then b, items before attributes.
Value attribute_path(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits =
        !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(cur, Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// The lazy sequences jinja2's map, select, unique, ... return: iterable once, always true, without len().
Value generator(std::vector<Value> items) {
  Value g = Value::array(std::move(items));
  g.arr().generator = true;
  return g;
}

// Sort / unique key: strings lowered unless case_sensitive.
Value fold(const Value& v, bool case_sensitive) {
  return !case_sensitive && v.is_string() ? Value(ascii_lower(v.str())) : v;
}

Value f_tojson(Interpreter&, const Value& v, Args& a) {
  const Value indent = arg(a, 0, "indent", Value::none());
  const bool ascii = arg(a, 1, "ensure_ascii", Value(false)).truthy();
  std::string unit;
  if (indent.is_int())
    unit = std::string(std::max<int64_t>(indent.as_int(), 0), ' ');
  else if (indent.is_string())
    unit = indent.str();
  else if (!indent.is_none())
    throw std::runtime_error("tojson: indent must be an integer or a string");
  return Value(to_json(v, indent.is_none() ? nullptr : &unit, ascii));
}

Value f_length(Interpreter&, const Value& v, Args&) {
  switch (v.type()) {
    case Value::Type::Undefined: return Value(0);
    case Value::Type::String: return Value(static_cast<int64_t>(utf8_length(v.str())));
    case Value::Type::Object: return Value(static_cast<int64_t>(v.obj().items.size()));
    case Value::Type::Array:
      if (!v.arr().generator) return Value(static_cast<int64_t>(v.arr().items.size()));
      [[fallthrough]];
    default: throw std::runtime_error("object of type '" + v.type_name() + "' has no len()");
  }
}

Value f_trim(Interpreter&, const Value& v, Args& a) {
  const Value chars = arg(a, 0, "chars", Value::none());
  return Value(py_strip(v.to_str(), chars.is_string() ? std::string_view(chars.str()) : kPyWhitespace, true, true));
}

Value f_string(Interpreter&, const Value& v, Args&) { return Value(v.to_str()); }
Value f_upper(Interpreter&, const Value& v, Args&) { return Value(ascii_upper(v.to_str())); }
Value f_lower(Interpreter&, const Value& v, Args&) { return Value(ascii_lower(v.to_str())); }
Value f_capitalize(Interpreter&, const Value& v, Args&) { return Value(py_capitalize(v.to_str())); }

// jinja2's title: each piece between runs of '-', whitespace and opening brackets gets its first letter upper.
Value f_title(Interpreter&, const Value& v, Args&) {
  const std::string s = v.to_str();
  std::string out;
  bool start = true;
  for (char c : s) {
    const bool sep =
        c == '-' || kPyWhitespace.find(c) != std::string_view::npos || c == '(' || c == '{' || c == '[' || c == '<';
    out += sep ? c : start ? ascii_upper(std::string(1, c))[0] : ascii_lower(std::string(1, c))[0];
    start = sep;
  }
  return Value(std::move(out));
}

Value f_default(Interpreter&, const Value& v, Args& a) {
  const Value def = arg(a, 0, "default_value", Value(""));
  if (v.is_undefined() || (arg(a, 1, "boolean", Value(false)).truthy() && !v.truthy())) return def;
  return v;
}

Value f_join(Interpreter&, const Value& v, Args& a) {
  const std::string sep = arg(a, 0, "d", Value("")).to_str();
  const Value attr = arg(a, 1, "attribute", Value::none());
  std::string out;
  bool first = true;
  for (const Value& item : items_of(v)) {
    out += (first ? "" : sep) + (attr.is_none() ? item : attribute_path(item, attr.to_str())).to_str();
    first = false;
  }
  return Value(std::move(out));
}

Value f_items(Interpreter&, const Value& v, Args&) {
  if (v.is_undefined()) return Value::array();
  if (!v.is_object()) throw std::runtime_error("Can only get item pairs from a mapping.");
  std::vector<Value> out;
  for (const auto& [k, e] : v.obj().items) out.push_back(Value::array({Object::key_value(k), e}, true));
  return generator(std::move(out));
}

Value f_dictsort(Interpreter&, const Value& v, Args& a) {
  if (!v.is_object()) throw std::runtime_error("You can only sort by either 'key' or 'value'");
  const bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
  const std::string by = arg(a, 1, "by", Value("key")).to_str();
  const bool rev = arg(a, 2, "reverse", Value(false)).truthy();
  std::vector<Value> out;
  for (const auto& [k, e] : v.obj().items) out.push_back(Value::array({Object::key_value(k), e}, true));
  const size_t idx = by == "value" ? 1 : 0;
  std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
    const Value a1 = fold(x.arr().items[idx], cs), b1 = fold(y.arr().items[idx], cs);
    return rev ? less(b1, a1) : less(a1, b1);
  });
  return Value::array(std::move(out));
}

Value f_list(Interpreter&, const Value& v, Args&) { return Value::array(items_of(v)); }
Value f_safe(Interpreter&, const Value& v, Args&) { return Value::markup(v.to_str()); }

Value f_replace(Interpreter&, const Value& v, Args& a) {
  if (a.pos.size() < 2) throw std::runtime_error("replace expects old and new");
  const Value count = arg(a, 2, "count", Value::none());
  return Value(py_replace(v.to_str(), a.pos[0].to_str(), a.pos[1].to_str(), count.is_none() ? -1 : count.as_int()));
}

// select / reject (attr empty) and selectattr / rejectattr: items whose value passes the test (or is truthy).
Value select(Interpreter& in, const Value& v, Args& a, bool by_attr, bool keep) {
  size_t i = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty()) throw std::runtime_error("selectattr needs an attribute name");
    attr = a.pos[i++].to_str();
  }
  std::string test;
  if (i < a.pos.size()) test = a.pos[i++].to_str();
  Args rest;
  rest.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(i), a.pos.end());
  std::vector<Value> out;
  if (!v.truthy()) return generator({});  // jinja2 walks the sequence only `if value`
  for (const Value& item : items_of(v)) {
    const Value x = by_attr ? attribute_path(item, attr) : item;
    const bool pass = test.empty() ? x.truthy() : apply_test(in, test, x, rest);
    if (pass == keep) out.push_back(item);
  }
  return generator(std::move(out));
}

Value f_select(Interpreter& in, const Value& v, Args& a) { return select(in, v, a, false, true); }
Value f_reject(Interpreter& in, const Value& v, Args& a) { return select(in, v, a, false, false); }
Value f_selectattr(Interpreter& in, const Value& v, Args& a) { return select(in, v, a, true, true); }
Value f_rejectattr(Interpreter& in, const Value& v, Args& a) { return select(in, v, a, true, false); }

Value f_map(Interpreter& in, const Value& v, Args& a) {
  std::vector<Value> out;
  if (!v.truthy()) return generator({});
  const Value* attr = a.get(static_cast<size_t>(-1), "attribute");
  if (attr) {
    const Value def = arg(a, static_cast<size_t>(-1), "default", Value());
    for (const Value& item : items_of(v)) {
      Value x = attribute_path(item, attr->to_str());
      out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
    }
    return generator(std::move(out));
  }
  if (a.pos.empty()) throw std::runtime_error("map needs a filter name or attribute=");
  const std::string name = a.pos[0].to_str();
  Args rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const Value& item : items_of(v)) out.push_back(apply_filter(in, name, item, rest));
  return generator(std::move(out));
}

Value f_indent(Interpreter&, const Value& v, Args& a) {
  const Value width = arg(a, 0, "width", Value(4));
  const std::string ind = width.is_string() ? width.str() : std::string(std::max<int64_t>(width.as_int(), 0), ' ');
  const bool first = arg(a, 1, "first", Value(false)).truthy();
  const bool blank = arg(a, 2, "blank", Value(false)).truthy();
  std::vector<std::string> lines = py_splitlines(v.to_str() + "\n");
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n" + ((blank || !lines[i].empty()) ? ind : "");
    out += lines[i];
  }
  return Value(first ? ind + out : out);
}

Value f_int(Interpreter&, const Value& v, Args& a) {
  const Value def = arg(a, 0, "default", Value(0));
  if (v.is_int() || v.is_bool()) return Value(v.as_int());
  if (v.is_float()) return std::isfinite(v.as_double()) ? Value(static_cast<int64_t>(v.as_double())) : def;
  if (v.is_string()) {
    const std::string s = py_strip(v.str(), kPyWhitespace, true, true);
    try {
      size_t used = 0;
      const long long i = std::stoll(s, &used, 10);
      if (used == s.size()) return Value(static_cast<int64_t>(i));
      const double d = std::stod(s, &used);
      if (used == s.size()) return Value(static_cast<int64_t>(d));
    } catch (const std::exception&) {
    }
  }
  return def;
}

Value f_float(Interpreter&, const Value& v, Args& a) {
  const Value def = arg(a, 0, "default", Value(0.0));
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    try {
      size_t used = 0;
      const std::string s = py_strip(v.str(), kPyWhitespace, true, true);
      const double d = std::stod(s, &used);
      if (used == s.size()) return Value(d);
    } catch (const std::exception&) {
    }
  }
  return def;
}

Value f_first(Interpreter&, const Value& v, Args&) {
  std::vector<Value> items = items_of(v);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
}

Value f_last(Interpreter&, const Value& v, Args&) {
  if (v.is_object()) throw std::runtime_error("'dict' object is not reversible");
  std::vector<Value> items = items_of(v);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

Value f_reverse(Interpreter&, const Value& v, Args&) {
  if (v.is_string()) {
    std::vector<std::string_view> chars = utf8_chars(v.str());
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += *it;
    return Value(std::move(out));
  }
  std::vector<Value> items = items_of(v);
  std::reverse(items.begin(), items.end());
  return generator(std::move(items));
}

Value f_sort(Interpreter&, const Value& v, Args& a) {
  const bool rev = arg(a, 0, "reverse", Value(false)).truthy();
  const bool cs = arg(a, 1, "case_sensitive", Value(false)).truthy();
  const Value attr = arg(a, 2, "attribute", Value::none());
  std::vector<Value> items = items_of(v);
  const auto key = [&](const Value& x) { return fold(attr.is_none() ? x : attribute_path(x, attr.to_str()), cs); };
  std::stable_sort(items.begin(), items.end(),
                   [&](const Value& x, const Value& y) { return rev ? less(key(y), key(x)) : less(key(x), key(y)); });
  return Value::array(std::move(items));
}

Value f_unique(Interpreter&, const Value& v, Args& a) {
  const bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
  const Value attr = arg(a, 1, "attribute", Value::none());
  std::vector<Value> out, seen;
  for (const Value& item : items_of(v)) {
    const Value k = fold(attr.is_none() ? item : attribute_path(item, attr.to_str()), cs);
    if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); })) {
      seen.push_back(k);
      out.push_back(item);
    }
  }
  return generator(std::move(out));
}

Value min_max(const Value& v, Args& a, bool want_max) {
  const bool cs = arg(a, 0, "case_sensitive", Value(false)).truthy();
  const Value attr = arg(a, 1, "attribute", Value::none());
  std::vector<Value> items = items_of(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const auto key = [&](const Value& x) { return fold(attr.is_none() ? x : attribute_path(x, attr.to_str()), cs); };
  Value best = items[0];
  for (const Value& x : items)
    if (want_max ? less(key(best), key(x)) : less(key(x), key(best))) best = x;
  return best;
}

Value f_min(Interpreter&, const Value& v, Args& a) { return min_max(v, a, false); }
Value f_max(Interpreter&, const Value& v, Args& a) { return min_max(v, a, true); }

Value f_sum(Interpreter&, const Value& v, Args& a) {
  const Value attr = arg(a, 0, "attribute", Value::none());
  Value total = arg(a, 1, "start", Value(0));
  for (const Value& x : items_of(v)) {
    const Value y = attr.is_none() ? x : attribute_path(x, attr.to_str());
    if (!total.is_number() || !y.is_number()) throw std::runtime_error("sum: items must be numbers");
    total = total.is_float() || y.is_float() ? Value(total.as_double() + y.as_double())
                                             : Value(add_int(total.as_int(), y.as_int()));
  }
  return total;
}

Value f_abs(Interpreter&, const Value& v, Args&) {
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (v.is_number()) return Value(v.as_int() < 0 ? sub_int(0, v.as_int()) : v.as_int());
  throw std::runtime_error("bad operand type for abs(): '" + v.type_name() + "'");
}

Value f_escape(Interpreter&, const Value& v, Args&) {
  return v.is_markup() ? v : Value::markup(html_escape(v.to_str()));
}

Value f_wordcount(Interpreter&, const Value& v, Args&) {
  return Value(static_cast<int64_t>(py_split_whitespace(v.to_str(), -1, false).size()));
}

Value f_center(Interpreter&, const Value& v, Args& a) {
  const std::string s = v.to_str();
  const int64_t width = arg(a, 0, "width", Value(80)).as_int(), n = static_cast<int64_t>(utf8_length(s));
  if (width <= n) return Value(s);
  const int64_t pad = width - n, left = pad / 2 + (pad & width & 1);
  return Value(std::string(left, ' ') + s + std::string(pad - left, ' '));
}

const std::unordered_map<std::string, Filter>& filters() {
  static const std::unordered_map<std::string, Filter> table = {
      {"tojson", f_tojson},
      {"length", f_length},
      {"count", f_length},
      {"trim", f_trim},
      {"string", f_string},
      {"upper", f_upper},
      {"lower", f_lower},
      {"capitalize", f_capitalize},
      {"title", f_title},
      {"default", f_default},
      {"d", f_default},
      {"join", f_join},
      {"items", f_items},
      {"dictsort", f_dictsort},
      {"list", f_list},
      {"safe", f_safe},
      {"replace", f_replace},
      {"select", f_select},
      {"reject", f_reject},
      {"selectattr", f_selectattr},
      {"rejectattr", f_rejectattr},
      {"map", f_map},
      {"indent", f_indent},
      {"int", f_int},
      {"float", f_float},
      {"first", f_first},
      {"last", f_last},
      {"reverse", f_reverse},
      {"sort", f_sort},
      {"unique", f_unique},
      {"min", f_min},
      {"max", f_max},
      {"sum", f_sum},
      {"abs", f_abs},
      {"escape", f_escape},
      {"e", f_escape},
      {"wordcount", f_wordcount},
      {"center", f_center},
  };
  return table;
}

}  // namespace

Value apply_filter(Interpreter& in, const std::string& name, const Value& v, Args& args) {
  const auto& table = filters();
  const auto it = table.find(name);
  if (it == table.end()) throw std::runtime_error("No filter named '" + name + "'.");
  return it->second(in, v, args);
}

bool apply_test(Interpreter&, const std::string& name, const Value& v, Args& a) {
  const auto other = [&]() -> const Value& {
    if (a.pos.empty()) throw std::runtime_error("test '" + name + "' needs an argument");
    return a.pos[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object() && !v.obj().is_namespace;
  if (name == "iterable" || name == "sequence")
    return v.is_string() || v.is_array() || (v.is_object() && !v.obj().is_namespace) || v.is_undefined();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "callable") return v.is_function();
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, other());
  if (name == "ne" || name == "!=") return !equal(v, other());
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, other());
  if (name == "gt" || name == "greaterthan" || name == ">") return less(other(), v);
  if (name == "le" || name == "<=") return !less(other(), v);
  if (name == "ge" || name == ">=") return !less(v, other());
  if (name == "in") {
    const Value& c = other();
    if (c.is_string()) return v.is_string() && c.str().find(v.str()) != std::string::npos;
    for (const Value& x : iterate(c))
      if (equal(x, v)) return true;
    return false;
  }
  if (name == "sameas") return v.same_object(other()) && v.type() == other().type();
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!v.is_number()) throw std::runtime_error("test '" + name + "' needs a number");
    const int64_t d = name == "divisibleby" ? other().as_int() : 2;
    if (d == 0) throw std::runtime_error("integer division or modulo by zero");
    const int64_t r = ((v.as_int() % d) + d) % d;
    return name == "odd" ? r == 1 : r == 0;
  }
  if (name == "lower") return v.to_str() == ascii_lower(v.to_str());
  if (name == "upper") return v.to_str() == ascii_upper(v.to_str());
  if (name == "escaped") return false;
  throw std::runtime_error("No test named '" + name + "'.");
}

}  // namespace wgllm::jinja
