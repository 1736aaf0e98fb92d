// wgllm/adapter.h: the enumeration and the description of the adapter a model would get.
#include <gtest/gtest.h>

#include <algorithm>

#include "wgllm/adapter.h"

namespace wgllm {
namespace {

TEST(Adapters, ListIsConsistentWithDescribe) {
  const std::vector<AdapterInfo> all = list_adapters("all");
  ASSERT_FALSE(all.empty());
  for (size_t i = 0; i < all.size(); ++i) {
    EXPECT_EQ(all[i].index, i);
    EXPECT_FALSE(all[i].name.empty());
    EXPECT_EQ(all[i].is_cpu, all[i].type == "CPU") << all[i].name;
  }
  // describe_adapter("") opens the best adapter of the primary backends: one of their list, same index and name.
  const AdapterDetails d = describe_adapter("");
  const std::vector<AdapterInfo> primary = list_adapters("primary");
  ASSERT_LT(d.adapter.index, primary.size());
  const AdapterInfo& listed = primary[d.adapter.index];
  EXPECT_EQ(listed.name, d.adapter.name);
  EXPECT_EQ(listed.backend, d.adapter.backend);
  EXPECT_EQ(listed.type, d.adapter.type);
  EXPECT_EQ(listed.driver, d.adapter.driver);
  EXPECT_GE(d.limits.max_storage_buffer_binding_size, 128ull << 20);
  EXPECT_GE(d.limits.max_buffer_size, d.limits.max_storage_buffer_binding_size / 2);
  EXPECT_GE(d.limits.max_compute_invocations_per_workgroup, 256u);
  EXPECT_GE(d.limits.max_compute_workgroups_per_dimension, 65535u);
  // By index and by a part of the name, the same adapter.
  EXPECT_EQ(describe_adapter(std::to_string(d.adapter.index)).adapter.name, d.adapter.name);
}

TEST(Adapters, BadChoicesThrowOneLine) {
  EXPECT_THROW(list_adapters("metal-please"), InvalidArgument);
  try {
    describe_adapter("999");
    FAIL() << "adapter 999 was described";
  } catch (const GpuError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
  }
  EXPECT_THROW(describe_adapter("no adapter is called this"), GpuError);
}

}  // namespace
}  // namespace wgllm
