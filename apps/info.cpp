// longctx info (and --version): what this binary is, what CPU it found,
// and which kernel each op will run here and why. scripts/test.sh prints it
// first, so every CI log says which CPU and kernels it tested.
#include <omp.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>
#include <string>

#include "apps/commands.h"
#include "kernels/cpu/features.h"
#include "kernels/cpu/select.h"

namespace longctx {

const char* const kInfoUsage =
    "  info                                 version, build, this CPU's features and each op's kernel\n";

int run_info(const Args& args) {
  if (!args.empty()) throw ConfigError("info takes no arguments, got '" + args[0] + "'\n" + kInfoUsage);
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const dnnl_version_t* dnnl = dnnl_version();
  std::printf("longctx %s (%s build)\n", LONGCTX_VERSION, LONGCTX_BUILD_TYPE);
  std::printf("build:    %s\n", cpu::build_kind());
  std::printf("cpu:      %s (%s, family %d model %d), %d OpenMP threads\n",
              f.model.empty() ? "unknown model" : f.model.c_str(), f.vendor.c_str(), f.family, f.model_number,
              omp_get_max_threads());
  std::printf("features: %s\n", f.flags().c_str());
  std::printf("oneDNN:   %d.%d.%d, effective ISA %s%s\n", dnnl->major, dnnl->minor, dnnl->patch, f.onednn_isa.c_str(),
              f.onednn_cap.empty() ? "" : (" (ONEDNN_MAX_CPU_ISA=" + f.onednn_cap + ")").c_str());
  if (!f.pin_bf16_attention.empty() || !f.pin_bf16_gemm.empty())
    std::printf("pins:     LONGCTX_BF16_ATTENTION=%s LONGCTX_BF16_GEMM=%s\n", f.pin_bf16_attention.c_str(),
                f.pin_bf16_gemm.c_str());
  std::printf("kernels (op, what runs here and why):\n%s", describe_kernel_set(cpu_kernel_set()).c_str());
  return 0;
}

}  // namespace longctx
