#include "kernels/cpu/features.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <tuple>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace longctx::cpu {

namespace {

#if defined(__x86_64__) || defined(__i386__)
struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};
Regs cpuid(unsigned leaf, unsigned sub = 0) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) r = {};
  return r;
}
bool bit(unsigned x, int n) { return (x >> n) & 1u; }

// XCR0: which register states the OS saves on a context switch. Read with
// the xgetbv instruction itself (no -mxsave needed), only where cpuid says
// the OS enabled it (OSXSAVE), so no CPU faults on it.
uint64_t xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t(hi) << 32) | lo;
}

// Linux hands out the AMX tile data only on request (arch_prctl, once per
// process; oneDNN asks too). Without it a tile instruction faults.
bool tile_data_granted() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

void read_cpuid(CpuFeatures& f) {
  const Regs id = cpuid(0);
  char vendor[13] = {};
  std::memcpy(vendor, &id.b, 4), std::memcpy(vendor + 4, &id.d, 4), std::memcpy(vendor + 8, &id.c, 4);
  f.vendor = vendor;
  if (cpuid(0x80000000).a >= 0x80000004) {
    char brand[49] = {};
    for (unsigned i = 0; i < 3; ++i) {
      const Regs r = cpuid(0x80000002 + i);
      std::memcpy(brand + 16 * i, &r, 16);
    }
    f.model = brand;
    while (!f.model.empty() && f.model.back() == ' ') f.model.pop_back();
    f.model.erase(0, f.model.find_first_not_of(' '));
  }
  const unsigned max_leaf = id.a;
  const Regs l1 = cpuid(1);
  const unsigned base_family = (l1.a >> 8) & 0xf, base_model = (l1.a >> 4) & 0xf;
  f.family = int(base_family == 0xf ? base_family + ((l1.a >> 20) & 0xff) : base_family);
  f.model_number = int(base_family == 0xf || base_family == 6 ? base_model | (((l1.a >> 16) & 0xf) << 4) : base_model);
  f.sse4_2 = bit(l1.c, 20);
  const bool osxsave = bit(l1.c, 27);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool ymm = (xcr & 0x6) == 0x6;             // SSE and AVX state
  const bool zmm = ymm && (xcr & 0xe0) == 0xe0;    // opmask, ZMM 0-15 high halves, ZMM 16-31
  const bool tiles = (xcr & 0x60000) == 0x60000;   // XTILECFG, XTILEDATA
  f.avx = ymm && bit(l1.c, 28);
  f.fma = f.avx && bit(l1.c, 12);
  f.f16c = f.avx && bit(l1.c, 29);
  if (max_leaf < 7) return;
  const Regs l7 = cpuid(7, 0), l7s1 = cpuid(7, 1);
  f.avx2 = f.avx && bit(l7.b, 5);
  f.avx512f = zmm && bit(l7.b, 16);
  f.avx512dq = f.avx512f && bit(l7.b, 17);
  f.avx512bw = f.avx512f && bit(l7.b, 30);
  f.avx512vl = f.avx512f && bit(l7.b, 31);
  f.avx512_bf16 = f.avx512f && bit(l7s1.a, 5);
  f.bmi1 = bit(l7.b, 3);
  f.bmi2 = bit(l7.b, 8);
  f.amx_cpu = bit(l7.d, 22) && bit(l7.d, 24);
  // The tile state in XCR0 says the OS supports AMX; Linux still wants the
  // request before the first tile instruction.
  f.amx_tile = f.amx_cpu && tiles && tile_data_granted();
  f.amx_bf16 = f.amx_tile;
}
#endif

const char* onednn_isa_name(unsigned isa) {
  struct Name {
    dnnl_cpu_isa_t isa;
    const char* name;
  };
  // Widest first: ISA values are nested bit sets.
  static const Name names[] = {{dnnl_cpu_isa_avx512_core_amx, "avx512_core_amx"},
                               {dnnl_cpu_isa_avx512_core_bf16, "avx512_core_bf16"},
                               {dnnl_cpu_isa_avx512_core_vnni, "avx512_core_vnni"},
                               {dnnl_cpu_isa_avx512_core, "avx512_core"},
                               {dnnl_cpu_isa_avx2, "avx2"},
                               {dnnl_cpu_isa_avx, "avx"},
                               {dnnl_cpu_isa_sse41, "sse41"}};
  for (const Name& n : names)
    if ((isa & unsigned(n.isa)) == unsigned(n.isa)) return n.name;
  return "none";
}

void read_onednn(CpuFeatures& f) {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto includes = [isa](dnnl_cpu_isa_t x) { return (isa & unsigned(x)) == unsigned(x); };
  f.onednn_isa = onednn_isa_name(isa);
  f.onednn_vector = includes(dnnl_cpu_isa_avx512_core) ? VectorIsa::avx512
                    : includes(dnnl_cpu_isa_avx2)      ? VectorIsa::avx2
                                                       : VectorIsa::none;
  f.onednn_bf16 = includes(dnnl_cpu_isa_avx512_core_amx)    ? Bf16Isa::amx
                  : includes(dnnl_cpu_isa_avx512_core_bf16) ? Bf16Isa::avx512_bf16
                                                            : Bf16Isa::none;
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

CpuFeatures read_features() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  read_cpuid(f);
#endif
  read_onednn(f);
  f.onednn_cap = env("ONEDNN_MAX_CPU_ISA");
  if (f.onednn_cap.empty()) f.onednn_cap = env("DNNL_MAX_CPU_ISA");
  f.pin_bf16_attention = env("LONGCTX_BF16_ATTENTION");
  f.pin_bf16_gemm = env("LONGCTX_BF16_GEMM");
  return f;
}

}  // namespace

std::string CpuFeatures::flags() const {
  std::string out;
  const std::pair<bool, const char*> all[] = {
      {sse4_2, "sse4.2"},         {avx, "avx"},           {avx2, "avx2"},         {fma, "fma"},
      {f16c, "f16c"},             {avx512f, "avx512f"},   {avx512bw, "avx512bw"}, {avx512dq, "avx512dq"},
      {avx512vl, "avx512vl"},     {avx512_bf16, "avx512_bf16"}, {amx_tile, "amx_tile"}, {amx_bf16, "amx_bf16"},
      {bmi1, "bmi1"},             {bmi2, "bmi2"}};
  for (const auto& [has, name] : all)
    if (has) out += (out.empty() ? "" : " ") + std::string(name);
  if (amx_cpu && !amx_tile) out += " (amx present, tile data not granted by the OS)";
  return out.empty() ? "none of the vector ISAs longctx uses" : out;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = read_features();
  return features;
}

std::string missing_build_isas(const CpuFeatures& cpu, const BuildTarget& build) {
  const std::tuple<bool, bool, const char*> all[] = {
      {build.sse4_2, cpu.sse4_2, "sse4.2"},        {build.avx, cpu.avx, "avx"},
      {build.avx2, cpu.avx2, "avx2"},              {build.fma, cpu.fma, "fma"},
      {build.f16c, cpu.f16c, "f16c"},              {build.bmi1, cpu.bmi1, "bmi1"},
      {build.bmi2, cpu.bmi2, "bmi2"},              {build.avx512f, cpu.avx512f, "avx512f"},
      {build.avx512bw, cpu.avx512bw, "avx512bw"},  {build.avx512dq, cpu.avx512dq, "avx512dq"},
      {build.avx512vl, cpu.avx512vl, "avx512vl"},  {build.avx512_bf16, cpu.avx512_bf16, "avx512_bf16"},
      {build.amx_tile, cpu.amx_tile, "amx_tile"}};
  std::string missing;
  for (const auto& [needed, has, name] : all)
    if (needed && !has) missing += (missing.empty() ? "" : " ") + std::string(name);
  return missing;
}

const char* build_kind() {
#if defined(LONGCTX_NATIVE_BUILD)
  return "native (-march=native on the build machine)";
#else
  return "portable (x86-64 baseline; vector kernels chosen at run time)";
#endif
}

namespace {
// Before every other static initializer of the program (priority 101, the
// first an application may use) and before main: this file alone is
// compiled for the x86-64 baseline whatever the build's flags
// (CMakeLists.txt), so the check itself runs on any x86-64 CPU.
#if defined(__x86_64__) || defined(__i386__)
__attribute__((constructor(101))) void check_cpu_runs_this_build() {
  CpuFeatures cpu;
  read_cpuid(cpu);
  const std::string missing = missing_build_isas(cpu, kBuildTarget);
  if (missing.empty()) return;
  std::fprintf(stderr,
               "longctx: this binary was built for another CPU (%s) and this one (%s) lacks: %s. Rebuild it here "
               "(scripts/setup.sh), or build it portable to run on any x86-64 CPU: "
               "LONGCTX_CMAKE_ARGS=-DLONGCTX_NATIVE=OFF scripts/setup.sh\n",
               build_kind(), cpu.model.empty() ? "unknown model" : cpu.model.c_str(), missing.c_str());
  std::_Exit(78);  // EX_CONFIG: nothing of the program has run
}
#endif
}  // namespace

}  // namespace longctx::cpu
