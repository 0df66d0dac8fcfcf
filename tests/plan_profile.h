#pragma once
// A made-up hardware profile for planner tests: fast enough that nothing is
// bound by a missing number, 1 TiB of device memory (tests set budgets below
// it), a host link (so the ladder's host rungs exist), 8 devices per node.
#include <string>

#include "plan/hardware.h"

namespace longctx::test {

inline HardwareProfile plan_test_profile(const std::string& name) {
  HardwareProfile h;
  h.name = name;
  h.peak_flops_fp32 = h.peak_flops_bf16 = 1e12;
  h.memory_bytes = int64_t{1} << 40;
  h.memory_bandwidth = 1e11;
  h.p2p_bandwidth = h.collective_bandwidth = h.all_to_all_bandwidth = 1e10;
  h.host_link_bandwidth = 1e10;
  h.devices_per_node = 8;
  h.threads_per_device = 1;
  return h;
}

}  // namespace longctx::test
