// Attribute and item access, the str / dict / list methods templates call (Python's semantics; the ones that would
// modify a list or dict are refused, as jinja2's ImmutableSandboxedEnvironment refuses them) and the globals.
#include <algorithm>
#include <stdexcept>

#include "jinja/interpreter.h"
#include "jinja/strings.h"

namespace wgllm::jinja {

namespace {

const Value& need_string(const Args& a, size_t i, std::string_view method) {
  if (i >= a.pos.size() || !a.pos[i].is_string())
    throw std::runtime_error(std::string(method) + "() argument " + std::to_string(i + 1) + " must be str");
  return a.pos[i];
}

// The optional chars argument of strip / lstrip / rstrip: None or missing means whitespace.
std::string_view strip_chars(const Args& a) {
  if (a.pos.empty() || a.pos[0].is_none()) return kPyWhitespace;
  if (!a.pos[0].is_string()) throw std::runtime_error("strip arg must be None or str");
  return a.pos[0].str();
}

// Python's str.startswith / endswith: a prefix or a tuple of them.
bool affix(const Value& s, const Args& a, bool start) {
  if (a.pos.empty()) throw std::runtime_error("startswith() takes at least 1 argument");
  std::vector<Value> options = a.pos[0].is_array() ? a.pos[0].arr().items : std::vector<Value>{a.pos[0]};
  for (const Value& o : options) {
    if (!o.is_string()) throw std::runtime_error("startswith first arg must be str or a tuple of str");
    if (start ? s.str().starts_with(o.str()) : s.str().ends_with(o.str())) return true;
  }
  return false;
}

// Python's str.format for {} / {0} / {name} fields (format specs are not supported).
std::string format(const std::string& f, const Args& a) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == '}' && i + 1 < f.size() && f[i + 1] == '}') {
      out += '}';
      ++i;
    } else if (f[i] == '{') {
      if (i + 1 < f.size() && f[i + 1] == '{') {
        out += '{';
        ++i;
        continue;
      }
      const size_t close = f.find('}', i);
      if (close == std::string::npos) throw std::runtime_error("Single '{' encountered in format string");
      const std::string field = f.substr(i + 1, close - i - 1);
      const Value* v = nullptr;
      if (field.empty()) {
        v = auto_index < a.pos.size() ? &a.pos[auto_index++] : nullptr;
      } else if (std::all_of(field.begin(), field.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        const size_t k = std::stoul(field);
        v = k < a.pos.size() ? &a.pos[k] : nullptr;
      } else {
        for (const auto& [k, kv] : a.kw)
          if (k == field) v = &kv;
      }
      if (!v) throw std::runtime_error("format: no argument for field '{" + field + "}'");
      out += v->to_str();
      i = close;
    } else {
      out += f[i];
    }
  }
  return out;
}

std::optional<Value> string_method(const Value& s, const std::string& name, const Args& a) {
  const std::string& str = s.str();
  if (name == "strip") return Value(py_strip(str, strip_chars(a), true, true));
  if (name == "lstrip") return Value(py_strip(str, strip_chars(a), true, false));
  if (name == "rstrip") return Value(py_strip(str, strip_chars(a), false, true));
  if (name == "upper") return Value(ascii_upper(str));
  if (name == "lower") return Value(ascii_lower(str));
  if (name == "title") return Value(py_title(str));
  if (name == "capitalize") return Value(py_capitalize(str));
  if (name == "startswith") return Value(affix(s, a, true));
  if (name == "endswith") return Value(affix(s, a, false));
  if (name == "split" || name == "rsplit") {
    const Value* sep = a.get(0, "sep");
    const Value* max = a.get(1, "maxsplit");
    const int64_t maxsplit = max && !max->is_none() ? max->as_int() : -1;
    std::vector<std::string> parts;
    if (sep && !sep->is_none()) {
      if (!sep->is_string()) throw std::runtime_error("must be str or None, not " + sep->type_name());
      if (sep->str().empty()) throw std::runtime_error("empty separator");
      parts = py_split(str, sep->str(), maxsplit, name == "rsplit");
    } else {
      parts = py_split_whitespace(str, maxsplit, name == "rsplit");
    }
    std::vector<Value> items(parts.begin(), parts.end());
    return Value::array(std::move(items));
  }
  if (name == "replace") {
    const int64_t count = a.pos.size() > 2 ? a.pos[2].as_int() : -1;
    return Value(py_replace(str, need_string(a, 0, name).str(), need_string(a, 1, name).str(), count));
  }
  if (name == "format") return Value(format(str, a));
  if (name == "join") {
    if (a.pos.empty()) throw std::runtime_error("join() takes exactly one argument");
    std::string out;
    bool first = true;
    for (const Value& v : iterate(a.pos[0])) {
      if (!v.is_string()) throw std::runtime_error("sequence item: expected str instance, " + v.type_name() + " found");
      out += (first ? "" : str) + v.str();
      first = false;
    }
    return Value(std::move(out));
  }
  if (name == "find" || name == "count" || name == "index") {
    const std::string& sub = need_string(a, 0, name).str();
    if (name == "count") {
      if (sub.empty()) return Value(static_cast<int64_t>(utf8_length(str) + 1));
      int64_t n = 0;
      for (size_t p = str.find(sub); p != std::string::npos; p = str.find(sub, p + sub.size())) ++n;
      return Value(n);
    }
    const size_t p = str.find(sub);
    if (p == std::string::npos && name == "index") throw std::runtime_error("substring not found");
    return Value(p == std::string::npos ? int64_t{-1} : static_cast<int64_t>(utf8_length(str.substr(0, p))));
  }
  if (name == "removeprefix" || name == "removesuffix") {
    const std::string& x = need_string(a, 0, name).str();
    if (name == "removeprefix") return Value(str.starts_with(x) ? str.substr(x.size()) : str);
    return Value(str.ends_with(x) ? str.substr(0, str.size() - x.size()) : str);
  }
  if (name == "splitlines") {
    std::vector<Value> items;
    for (std::string& l : py_splitlines(str)) items.emplace_back(std::move(l));
    return Value::array(std::move(items));
  }
  if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "isupper" ||
      name == "islower")
    return Value(py_is(str, name));
  return std::nullopt;
}

// jinja2's undefined for a missing attribute: "'dict object' has no attribute 'x'" (built by appends: GCC 12 warns
// falsely about chains of std::string + here).
Value no_attribute(const Value& obj, const std::string& what) {
  std::string m = "'";
  m += obj.type_name();
  m += " object' has no attribute ";
  m += what;
  return Value::undefined(std::move(m));
}

bool is_unsafe(const Value& obj, std::string_view name) {
  static constexpr std::string_view list_mut[] = {"append", "clear", "pop",    "reverse",
                                                  "insert", "sort",  "extend", "remove"};
  static constexpr std::string_view dict_mut[] = {"clear", "pop", "popitem", "setdefault", "update"};
  if (obj.is_array() && !obj.arr().tuple)
    return std::find(std::begin(list_mut), std::end(list_mut), name) != std::end(list_mut);
  if (obj.is_object() && !obj.obj().is_namespace)
    return std::find(std::begin(dict_mut), std::end(dict_mut), name) != std::end(dict_mut);
  return false;
}

}  // namespace

bool has_method(const Value& obj, std::string_view name) {
  static constexpr std::string_view str_methods[] = {
      "strip",      "lstrip",   "rstrip",  "upper",        "lower",        "title",      "capitalize",
      "startswith", "endswith", "split",   "rsplit",       "replace",      "format",     "join",
      "find",       "count",    "index",   "removeprefix", "removesuffix", "splitlines", "isdigit",
      "isalpha",    "isspace",  "isalnum", "isupper",      "islower"};
  static constexpr std::string_view dict_methods[] = {"get", "items", "keys", "values"};
  static constexpr std::string_view list_methods[] = {"index", "count"};
  const auto in = [&](const auto& list) { return std::find(std::begin(list), std::end(list), name) != std::end(list); };
  if (obj.is_string()) return in(str_methods);
  if (obj.is_object() && !obj.obj().is_namespace) return in(dict_methods) || is_unsafe(obj, name);
  if (obj.is_array()) return in(list_methods) || is_unsafe(obj, name);
  return false;
}

std::optional<Value> call_method(Interpreter&, const Value& obj, const std::string& name, Args& a) {
  if (!has_method(obj, name)) return std::nullopt;
  if (is_unsafe(obj, name))
    throw std::runtime_error("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe.");
  if (obj.is_string()) return string_method(obj, name, a);
  if (obj.is_object()) {
    const Object& o = obj.obj();
    if (name == "get") {
      if (a.pos.empty()) throw std::runtime_error("get expected at least 1 argument, got 0");
      const Value* v = o.find(Object::key_of(a.pos[0]));
      return v ? *v : a.pos.size() > 1 ? a.pos[1] : Value::none();
    }
    std::vector<Value> items;
    for (const auto& [k, v] : o.items) {
      if (name == "items")
        items.push_back(Value::array({Object::key_value(k), v}, true));
      else
        items.push_back(name == "keys" ? Object::key_value(k) : v);
    }
    return Value::array(std::move(items));
  }
  // list.index / list.count
  if (a.pos.empty()) throw std::runtime_error(name + "() takes exactly one argument");
  int64_t count = 0;
  const auto& items = obj.arr().items;
  for (size_t i = 0; i < items.size(); ++i)
    if (equal(items[i], a.pos[0])) {
      if (name == "index") return Value(static_cast<int64_t>(i));
      ++count;
    }
  if (name == "index") throw std::runtime_error(a.pos[0].repr() + " is not in list");
  return Value(count);
}

Value get_attr(const Value& obj, const std::string& name) {
  if (obj.is_undefined()) throw std::runtime_error(obj.undefined_name());
  if (obj.is_object() && obj.obj().is_namespace) {
    if (const Value* v = obj.obj().find(name)) return *v;
  } else if (has_method(obj, name)) {
    if (is_unsafe(obj, name))
      return Value::undefined("access to attribute '" + name + "' of '" + obj.type_name() + "' object is unsafe.");
    return Value::function(name, [obj, name](Interpreter& in, Args& a) { return *call_method(in, obj, name, a); });
  } else if (obj.is_object()) {
    if (const Value* v = obj.obj().find(name)) return *v;
  }
  return no_attribute(obj, "'" + name + "'");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_undefined()) throw std::runtime_error(obj.undefined_name());
  if (obj.is_object() && !key.is_string() && (key.is_number() || key.is_none())) {
    if (const Value* v = obj.obj().find(Object::key_of(key))) return *v;
  }
  if (obj.is_object() && key.is_string()) {
    if (const Value* v = obj.obj().find(key.str())) return *v;
    return get_attr(obj, key.str());
  }
  if (obj.is_array() && obj.arr().generator) return Value::undefined("'generator object' is not subscriptable");
  if ((obj.is_array() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_array()) {
      const auto& items = obj.arr().items;
      if (i < 0) i += static_cast<int64_t>(items.size());
      if (i >= 0 && i < static_cast<int64_t>(items.size())) return items[i];
    } else {
      const std::vector<std::string_view> chars = utf8_chars(obj.str());
      if (i < 0) i += static_cast<int64_t>(chars.size());
      if (i >= 0 && i < static_cast<int64_t>(chars.size())) return Value(chars[i]);
    }
    return Value::undefined(obj.type_name() + " object has no element " + std::to_string(key.as_int()));
  }
  return no_attribute(obj, key.repr());
}

std::vector<Value> iterate(const Value& v) {
  switch (v.type()) {
    case Value::Type::Undefined: return {};
    case Value::Type::Array: return v.arr().items;
    case Value::Type::Object: {
      std::vector<Value> keys;
      for (const auto& [k, e] : v.obj().items) keys.push_back(Object::key_value(k));
      return keys;
    }
    case Value::Type::String: {
      std::vector<Value> chars;
      for (std::string_view c : utf8_chars(v.str())) chars.emplace_back(c);
      return chars;
    }
    default: throw std::runtime_error("'" + v.type_name() + "' object is not iterable");
  }
}

Value global(const std::string& name) {
  static const Value range = Value::function("range", [](Interpreter&, Args& a) {
    if (a.pos.empty() || a.pos.size() > 3) throw std::runtime_error("range expected 1 to 3 arguments");
    for (const Value& v : a.pos)
      if (!v.is_int() && !v.is_bool())
        throw std::runtime_error("range() integer argument expected, got " + v.type_name());
    const int64_t start = a.pos.size() > 1 ? a.pos[0].as_int() : 0;
    const int64_t stop = a.pos.size() > 1 ? a.pos[1].as_int() : a.pos[0].as_int();
    const int64_t step = a.pos.size() > 2 ? a.pos[2].as_int() : 1;
    if (step == 0) throw std::runtime_error("range() arg 3 must not be zero");
    // jinja2's sandbox refuses ranges of more than MAX_RANGE items
    const int64_t span = step > 0 ? stop - start : start - stop, n = span <= 0 ? 0 : (span - 1) / std::abs(step) + 1;
    if (n > 100000)
      throw std::runtime_error("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    std::vector<Value> items;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) items.emplace_back(i);
    return Value::array(std::move(items));
  });
  static const Value ns = Value::function("namespace", [](Interpreter&, Args& a) {
    Value o = Value::object();
    o.obj().is_namespace = true;
    for (const Value& p : a.pos)
      if (p.is_object())
        for (const auto& [k, v] : p.obj().items) o.obj().set(k, v);
    for (const auto& [k, v] : a.kw) o.obj().set(k, v);
    return o;
  });
  static const Value dict = Value::function("dict", [](Interpreter&, Args& a) {
    Value o = Value::object();
    for (const Value& p : a.pos)
      if (p.is_object())
        for (const auto& [k, v] : p.obj().items) o.obj().set(k, v);
    for (const auto& [k, v] : a.kw) o.obj().set(k, v);
    return o;
  });
  static const Value raise = Value::function("raise_exception", [](Interpreter&, Args& a) -> Value {
    throw std::runtime_error(a.pos.empty() ? "" : a.pos[0].to_str());
  });
  static const Value strftime = Value::function("strftime_now", [](Interpreter& in, Args& a) {
    if (a.pos.empty() || !a.pos[0].is_string()) throw std::runtime_error("strftime_now expects a format string");
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, a.pos[0].str().c_str(), &in.now());
    return Value(std::string(buf, n));
  });
  if (name == "range") return range;
  if (name == "namespace") return ns;
  if (name == "dict") return dict;
  if (name == "raise_exception") return raise;
  if (name == "strftime_now") return strftime;
  return Value::undefined("'" + name + "' is undefined");
}

}  // namespace wgllm::jinja
