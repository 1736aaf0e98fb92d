#include "gpu/pipelines.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "gpu/context.h"
#include "gpu/shader_expand.h"
#include "gpu/shaders.h"
#include "wgllm/error.h"

namespace wgllm::gpu {

namespace {

// A pipeline's WGSL: "a.wgsl+b.wgsl" names files compiled as one module, in that order.
struct ShaderFiles {
  std::string text;
  std::vector<std::pair<std::string, int>> files;  // name, lines
};

// Kernel development aid: with ContextOptions::kernel_dir set, a file of that name there replaces the embedded
// source (edit a kernel and rerun without rebuilding). Empty when there is none.
std::string kernel_override(const std::string& dir, const std::string& name) {
  if (dir.empty()) return {};
  std::ifstream in(dir + "/" + name);
  if (!in) return {};
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The override, else the context's extra shaders, else the library's.
std::string source_of(const ContextOptions& o, const std::string& name) {
  std::string src = kernel_override(o.kernel_dir, name);
  if (!src.empty()) return src;
  for (const EmbeddedShader& s : o.extra_shaders)
    if (s.name == name) return std::string(s.source);
  return std::string(shader_source(name));
}

ShaderFiles shader_files(const ContextOptions& o, const std::string& names) {
  ShaderFiles out;
  size_t pos = 0;
  while (pos <= names.size()) {
    const size_t plus = std::min(names.find('+', pos), names.size());
    const std::string name = names.substr(pos, plus - pos);
    std::string src = source_of(o, name);
    if (!src.empty() && src.back() != '\n') src += '\n';
    out.files.emplace_back(name, int(std::count(src.begin(), src.end(), '\n')));
    out.text += src;
    pos = plus + 1;
  }
  return out;
}

// naga reports positions as "wgsl:LINE:COL"; rewrite them as "file.wgsl:LINE:COL" in the
// file's own numbering (the prelude shifts lines).
// "file:line:col: message" from a naga diagnostic on the module made of `files` after `prelude_lines`.
std::string shader_message(const std::string& message, const std::vector<std::pair<std::string, int>>& files,
                           int prelude_lines) {
  std::string where;
  for (const auto& f : files) where += (where.empty() ? "" : "+") + f.first;
  // The first "wgsl:<digits>:<digits>" in the message.
  for (size_t at = message.find("wgsl:"); at != std::string::npos; at = message.find("wgsl:", at + 1)) {
    unsigned line = 0, col = 0;
    int used = 0;
    if (std::sscanf(message.c_str() + at, "wgsl:%u:%u%n", &line, &col, &used) == 2 && used > 0) {
      int l = int(line) - prelude_lines;
      std::string file = files.front().first;
      for (const auto& f : files) {
        file = f.first;
        if (l <= f.second || &f == &files.back()) break;
        l -= f.second;
      }
      where = file + ":" + std::to_string(l) + ":" + std::to_string(col);
      break;
    }
  }
  // Keep the whole diagnostic (naga's own explanation spans several lines) on one line.
  std::string flat;
  for (char c : message) flat += (c == '\n') ? ' ' : c;
  flat.erase(std::unique(flat.begin(), flat.end(), [](char a, char b) { return a == ' ' && b == ' '; }), flat.end());
  return where + ": " + flat;
}

}  // namespace

std::string PipelineKey::to_string() const {
  std::string s = shader;  // (appends: a cache hit builds this string, so no stream)
  s += ':';
  s += entry_point;
  if (!overrides.empty()) {
    std::ostringstream o;
    o << "{";
    for (size_t i = 0; i < overrides.size(); ++i)
      o << (i ? "," : "") << overrides[i].first << "=" << overrides[i].second;
    o << "}";
    s += o.str();
  }
  if (!prelude.empty()) {
    s += '[';
    s += std::to_string(std::hash<std::string>{}(prelude));
    s += ']';
  }
  return s;
}

WGPUComputePipeline PipelineCache::get(const PipelineKey& key) {
  std::lock_guard lock(mutex_);
  return get_locked(key);
}

size_t PipelineCache::ArgsHash::operator()(const ArgsKey& k) const {
  uint64_t h = std::hash<const void*>{}(k.site) ^ (uint64_t(k.n) << 32);
  for (uint32_t i = 0; i < k.n; ++i) h = (h ^ k.args[i]) * 0x100000001b3ull;  // FNV-1a over the words
  return size_t(h);
}

PipelineCache::ArgsKey PipelineCache::args_key(const char* site, std::span<const uint32_t> args) {
  if (args.size() > kMaxArgs)
    throw InvalidArgument(std::string("pipeline arguments of ") + site + ": " + std::to_string(args.size()) +
                          ", more than " + std::to_string(kMaxArgs));
  ArgsKey k{site, uint32_t(args.size()), {}};
  std::copy(args.begin(), args.end(), k.args.begin());
  return k;
}

WGPUComputePipeline PipelineCache::find(const char* site, std::span<const uint32_t> args) {
  const ArgsKey k = args_key(site, args);
  std::lock_guard lock(mutex_);
  const auto it = by_args_.find(k);
  return it == by_args_.end() ? nullptr : it->second;
}

WGPUComputePipeline PipelineCache::insert(const char* site, std::span<const uint32_t> args, const PipelineKey& key) {
  const ArgsKey k = args_key(site, args);
  std::lock_guard lock(mutex_);
  WGPUComputePipeline pipe = get_locked(key);  // (one already made by its key string is found there)
  by_args_.emplace(k, pipe);
  return pipe;
}

WGPUComputePipeline PipelineCache::get_locked(const PipelineKey& key) {
  const std::string name = key.to_string();
  if (auto it = pipelines_.find(name); it != pipelines_.end()) return it->second.get();

  const ContextOptions& options = ctx_.options();
  const ShaderFiles source = shader_files(options, key.shader);
  const std::string code = key.prelude + expand_shader(source.text, key.prelude, !ctx_.adapter().is_cpu());
  if (!options.dump_shaders_dir.empty()) {  // debugging aid: the exact WGSL compiled
    std::ofstream(options.dump_shaders_dir + "/" + name.substr(0, name.find('[')) + "." +
                  std::to_string(std::hash<std::string>{}(key.prelude)) + ".wgsl")
        << code;
  }
  const int prelude_lines = static_cast<int>(std::count(key.prelude.begin(), key.prelude.end(), '\n'));
  ctx_.push_error_scope(WGPUErrorFilter_Validation);
  WGPUShaderSourceWGSL wgsl{};
  wgsl.chain.sType = WGPUSType_ShaderSourceWGSL;
  wgsl.code = sv(code);
  WGPUShaderModuleDescriptor md{};
  md.nextInChain = &wgsl.chain;
  md.label = sv(key.shader);
  ShaderModuleHandle module(native::create_shader_module(ctx_.device(), md, options.shader_checks));

  std::vector<WGPUConstantEntry> constants;
  for (const auto& [k, v] : key.overrides) {
    WGPUConstantEntry c{};
    c.key = sv(k);
    c.value = v;
    constants.push_back(c);
  }
  WGPUComputePipelineDescriptor pd{};
  pd.label = sv(name);
  pd.compute.module = module.get();
  pd.compute.entryPoint = sv(key.entry_point);
  pd.compute.constantCount = constants.size();
  pd.compute.constants = constants.data();
  ComputePipelineHandle pipe(wgpuDeviceCreateComputePipeline(ctx_.device(), &pd));

  const std::string error = ctx_.pop_error_scope("shader compilation");
  if (!error.empty()) throw ShaderError(shader_message(error, source.files, prelude_lines));
  if (!pipe) throw ShaderError(key.shader + ": pipeline creation failed for entry point " + key.entry_point);
  WGPUComputePipeline raw = pipe.get();
  pipelines_.emplace(name, std::move(pipe));
  names_.emplace(raw, key.shader + ":" + key.entry_point);
  if (!key.detail.empty()) details_.emplace(raw, key.detail);
  return raw;
}

std::string PipelineCache::name(WGPUComputePipeline pipeline) {
  std::lock_guard lock(mutex_);
  const auto it = names_.find(pipeline);
  return it == names_.end() ? "?" : it->second;
}

std::string PipelineCache::detail(WGPUComputePipeline pipeline) {
  std::lock_guard lock(mutex_);
  const auto it = details_.find(pipeline);
  return it == details_.end() ? "" : it->second;
}

WGPUBindGroupLayout PipelineCache::layout(WGPUComputePipeline pipeline) {
  std::lock_guard lock(mutex_);
  auto it = layouts_.find(pipeline);
  if (it == layouts_.end())
    it = layouts_.emplace(pipeline, BindGroupLayoutHandle(wgpuComputePipelineGetBindGroupLayout(pipeline, 0))).first;
  return it->second.get();
}

}  // namespace wgllm::gpu
