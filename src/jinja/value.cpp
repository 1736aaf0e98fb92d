// The Jinja value type (see value.h): Python's printing, comparison and JSON rules.
#include "jinja/value.h"

#include <charconv>
#include <cmath>
#include <stdexcept>

namespace wgllm::jinja {

const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(std::string_view key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(std::string(key), std::move(v));
}

namespace {
constexpr char kKeyTag = '\x1f';  // starts a stored key that is not a string (no JSON key starts so in practice)
}  // namespace

std::string Object::key_of(const Value& key) {
  switch (key.type()) {
    case Value::Type::String: return key.str();
    case Value::Type::Int: return std::string(1, kKeyTag) + "i" + std::to_string(key.as_int());
    case Value::Type::Float: return std::string(1, kKeyTag) + "f" + float_repr(key.as_double());
    case Value::Type::Bool: return std::string(1, kKeyTag) + (key.as_bool() ? "bT" : "bF");
    case Value::Type::None: return std::string(1, kKeyTag) + "n";
    default: throw std::runtime_error("unhashable type: '" + key.type_name() + "'");
  }
}

Value Object::key_value(const std::string& stored) {
  if (stored.size() < 2 || stored[0] != kKeyTag) return Value(stored);
  const std::string rest = stored.substr(2);
  switch (stored[1]) {
    case 'i': return Value(static_cast<int64_t>(std::stoll(rest)));
    case 'f': return Value(std::stod(rest));
    case 'b': return Value(rest == "T");
    case 'n': return Value::none();
    default: return Value(stored);
  }
}

Value Value::markup(std::string s) {
  Value v(std::move(s));
  v.markup_ = true;
  return v;
}

std::string html_escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

const Value* Args::get(size_t index, std::string_view name) const {
  if (index < pos.size()) return &pos[index];
  for (const auto& [k, v] : kw)
    if (k == name) return &v;
  return nullptr;
}

Value Value::array(std::vector<Value> items, bool tuple) {
  auto a = std::make_shared<Array>();
  a->items = std::move(items);
  a->tuple = tuple;
  return Value(std::move(a));
}

Value Value::object() { return Value(std::make_shared<Object>()); }

Value Value::function(std::string name, std::function<Value(Interpreter&, Args&)> fn) {
  return Value(std::make_shared<const Function>(Function{std::move(name), std::move(fn)}));
}

namespace {

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  // Requests are untrusted: nesting deeper than any conversation has would only exhaust the stack.
  if (depth > 256) throw std::invalid_argument("JSON nested too deeply (more than 256 levels)");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return Value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Value a = Value::array();
      for (const auto& e : j) a.arr().items.push_back(from_json_at(e, depth + 1));
      return a;
    }
    case nlohmann::ordered_json::value_t::object: {
      Value o = Value::object();
      for (const auto& [k, e] : j.items()) o.obj().items.emplace_back(k, from_json_at(e, depth + 1));
      return o;
    }
    default: return Value::none();
  }
}

}  // namespace

Value Value::from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

int64_t Value::as_int() const { return is_bool() ? int64_t{as_bool()} : std::get<int64_t>(v_); }

double Value::as_double() const { return is_float() ? std::get<double>(v_) : static_cast<double>(as_int()); }

bool Value::same_object(const Value& o) const {
  if (type() != o.type()) return false;
  if (is_array()) return &arr() == &o.arr();
  if (is_object()) return &obj() == &o.obj();
  if (is_function()) return &fn() == &o.fn();
  return equal(*this, o);
}

bool Value::truthy() const {
  switch (type()) {
    case Type::Undefined:
    case Type::None: return false;
    case Type::Bool: return as_bool();
    case Type::Int: return as_int() != 0;
    case Type::Float: return as_double() != 0.0;
    case Type::String: return !str().empty();
    case Type::Array: return arr().generator || !arr().items.empty();
    case Type::Object: return obj().is_namespace || !obj().items.empty();
    case Type::Function: return true;
  }
  return false;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string_view sci(buf, r.ptr - buf);  // [-]d[.ddd]e±XX, the shortest digits that round-trip
  const size_t e = sci.find('e');
  std::string sign, digits;
  for (char c : sci.substr(0, e)) {
    if (c == '-')
      sign = "-";
    else if (c != '.')
      digits += c;
  }
  int exp = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exp);
  const int n = static_cast<int>(digits.size());
  if (exp >= -4 && exp < 16) {
    if (exp < 0) return sign + "0." + std::string(-exp - 1, '0') + digits;
    if (exp >= n - 1) return sign + digits + std::string(exp - n + 1, '0') + ".0";
    return sign + digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
  }
  std::string out = sign + digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  const int a = std::abs(exp);
  return out + (exp < 0 ? "e-" : "e+") + (a < 10 ? "0" : "") + std::to_string(a);
}

namespace {

std::string repr_string(const std::string& s) {
  const char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == q)
      out += std::string("\\") + static_cast<char>(q);
    else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f) {
      static const char* hex = "0123456789abcdef";
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + static_cast<char>(q);
}

std::string repr_items(const Value& v) {
  std::string out;
  if (v.is_array()) {
    const Array& a = v.arr();
    out += a.tuple ? "(" : "[";
    for (size_t i = 0; i < a.items.size(); ++i) out += (i ? ", " : "") + a.items[i].repr();
    if (a.tuple && a.items.size() == 1) out += ",";
    return out + (a.tuple ? ")" : "]");
  }
  out += "{";
  bool first = true;
  for (const auto& [k, e] : v.obj().items) {
    out += (first ? "" : ", ") + Object::key_value(k).repr() + ": " + e.repr();
    first = false;
  }
  return out + "}";
}

}  // namespace

std::string Value::to_str() const {
  switch (type()) {
    case Type::Undefined: return "";
    case Type::None: return "None";
    case Type::Bool: return as_bool() ? "True" : "False";
    case Type::Int: return std::to_string(as_int());
    case Type::Float: return float_repr(as_double());
    case Type::String: return str();
    case Type::Array: return arr().generator ? "<generator object>" : repr_items(*this);
    case Type::Object: return obj().is_namespace ? "<Namespace " + repr_items(*this) + ">" : repr_items(*this);
    case Type::Function: return "<function " + fn().name + ">";
  }
  return "";
}

std::string Value::repr() const {
  if (is_string()) return repr_string(str());
  if (is_undefined()) return "Undefined";
  return to_str();
}

std::string Value::type_name() const {
  switch (type()) {
    case Type::Undefined: return "Undefined";
    case Type::None: return "NoneType";
    case Type::Bool: return "bool";
    case Type::Int: return "int";
    case Type::Float: return "float";
    case Type::String: return "str";
    case Type::Array: return arr().tuple ? "tuple" : "list";
    case Type::Object: return obj().is_namespace ? "Namespace" : "dict";
    case Type::Function: return "function";
  }
  return "";
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case Value::Type::Undefined:
    case Value::Type::None: return true;
    case Value::Type::String: return a.str() == b.str();
    case Value::Type::Array: {
      const auto &x = a.arr().items, &y = b.arr().items;
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i])) return false;
      return true;
    }
    case Value::Type::Object: {
      const Object &x = a.obj(), &y = b.obj();
      if (x.items.size() != y.items.size()) return false;
      for (const auto& [k, v] : x.items) {
        const Value* w = y.find(k);
        if (!w || !equal(v, *w)) return false;
      }
      return true;
    }
    default: return a.same_object(b);
  }
}

bool less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();
  if (a.is_array() && b.is_array()) {
    const auto &x = a.arr().items, &y = b.arr().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less(x[i], y[i])) return true;
      if (less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  throw std::invalid_argument("'<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() +
                              "'");
}

namespace {

// One character of a JSON string as Python's json.dumps writes it.
void json_char(std::string& out, std::string_view ch, bool ensure_ascii) {
  static const char* hex = "0123456789abcdef";
  const auto u = [&](uint32_t x) {
    out += "\\u";
    for (int sh = 12; sh >= 0; sh -= 4) out += hex[(x >> sh) & 15];
  };
  const unsigned char c = static_cast<unsigned char>(ch[0]);
  if (c >= 0x80) {
    if (!ensure_ascii) {
      out += ch;
      return;
    }
    uint32_t cp = ch.size() == 2 ? c & 0x1f : ch.size() == 3 ? c & 0x0f : c & 0x07;
    for (size_t i = 1; i < ch.size(); ++i) cp = (cp << 6) | (static_cast<unsigned char>(ch[i]) & 0x3f);
    if (cp >= 0x10000) {  // a surrogate pair
      u(0xd800 + ((cp - 0x10000) >> 10));
      u(0xdc00 + ((cp - 0x10000) & 0x3ff));
    } else {
      u(cp);
    }
    return;
  }
  switch (c) {
    case '"': out += "\\\""; break;
    case '\\': out += "\\\\"; break;
    case '\n': out += "\\n"; break;
    case '\r': out += "\\r"; break;
    case '\t': out += "\\t"; break;
    case '\b': out += "\\b"; break;
    case '\f': out += "\\f"; break;
    default:
      if (c < 0x20)
        u(c);
      else
        out += static_cast<char>(c);
  }
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (std::string_view ch : utf8_chars(s)) json_char(out, ch, ensure_ascii);
  out += '"';
}

void json_value(std::string& out, const Value& v, const std::string* indent, bool ascii, int level) {
  const auto newline = [&](int lv) {
    out += '\n';
    for (int i = 0; i < lv; ++i) out += *indent;
  };
  switch (v.type()) {
    case Value::Type::None: out += "null"; return;
    case Value::Type::Bool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Type::Int: out += std::to_string(v.as_int()); return;
    case Value::Type::Float: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : float_repr(d);
      return;
    }
    case Value::Type::String: json_string(out, v.str(), ascii); return;
    case Value::Type::Array: {
      if (v.arr().generator) throw std::invalid_argument("Object of type generator is not JSON serializable");
      const auto& items = v.arr().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += indent ? "," : ", ";
        if (indent) newline(level + 1);
        json_value(out, items[i], indent, ascii, level + 1);
      }
      if (indent) newline(level);
      out += ']';
      return;
    }
    case Value::Type::Object: {
      const auto& items = v.obj().items;
      if (items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += indent ? "," : ", ";
        if (indent) newline(level + 1);
        const Value key = Object::key_value(items[i].first);  // json.dumps writes 512 as "512", True as "true"
        json_string(out,
                    key.is_string() ? key.str()
                    : key.is_bool() ? (key.as_bool() ? "true" : "false")
                    : key.is_none() ? "null"
                                    : key.to_str(),
                    ascii);
        out += ": ";
        json_value(out, items[i].second, indent, ascii, level + 1);
      }
      if (indent) newline(level);
      out += '}';
      return;
    }
    default: throw std::invalid_argument("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string to_json(const Value& v, const std::string* indent, bool ensure_ascii) {
  std::string out;
  json_value(out, v, indent, ensure_ascii, 0);
  return out;
}

std::vector<std::string_view> utf8_chars(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (c >= 0x80 && c < 0xc0) n = 1;  // a stray continuation byte stands alone
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

size_t utf8_length(std::string_view s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

namespace {
[[noreturn]] void overflow() { throw std::runtime_error("integer overflow"); }
}  // namespace

int64_t add_int(int64_t x, int64_t y) {
  int64_t r;
  if (__builtin_add_overflow(x, y, &r)) overflow();
  return r;
}
int64_t sub_int(int64_t x, int64_t y) {
  int64_t r;
  if (__builtin_sub_overflow(x, y, &r)) overflow();
  return r;
}
int64_t mul_int(int64_t x, int64_t y) {
  int64_t r;
  if (__builtin_mul_overflow(x, y, &r)) overflow();
  return r;
}
int64_t floor_div(int64_t x, int64_t y) {
  if (x == INT64_MIN && y == -1) overflow();
  const int64_t q = x / y, r = x % y;
  return r != 0 && ((r < 0) != (y < 0)) ? q - 1 : q;
}
int64_t py_mod(int64_t x, int64_t y) {
  if (y == -1) return 0;  // INT64_MIN % -1 would trap
  const int64_t r = x % y;
  return r != 0 && ((r < 0) != (y < 0)) ? r + y : r;
}
int64_t power_int(int64_t x, int64_t y) {
  int64_t result = 1;
  for (int64_t base = x; y > 0; y >>= 1) {  // by squaring: at most 63 rounds
    if (y & 1) result = mul_int(result, base);
    if (y > 1) base = mul_int(base, base);
  }
  return result;
}

}  // namespace wgllm::jinja
