#include "kernels/cpu/select.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/timer.h"
#include "kernels/attention/attention.h"
#include "kernels/attention/dot/dot.h"
#include "kernels/attention/fused/fused.h"
#include "kernels/cpu/features.h"
#include "kernels/gemm.h"

namespace longctx {

std::optional<KernelId> kernel_id(std::string_view name) {
  for (std::size_t i = 0; i < kNumKernels; ++i)
    if (name == kKernelNames[i]) return static_cast<KernelId>(i);
  return std::nullopt;
}

namespace {

CpuIsaKernels isa_kernels_for_cpu() {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  // Each ISA file is asked for its kernels only after the CPU has said it
  // runs them (features.h: the CPU, the OS's saved state, oneDNN's cap).
  CpuIsaKernels k;
  if (f.runs_avx2_fma()) k.fused_avx2 = attn::fused_tile_kernels_avx2_built();
  if (f.runs_avx512()) k.fused_avx512 = attn::fused_tile_kernels_avx512_built();
  if (f.runs_avx512_bf16()) k.dot_avx512bf16 = attn::dot_tile_kernels_avx512bf16_built();
  if (f.runs_amx_bf16()) k.dot_amx = attn::dot_tile_kernels_amx_built();
  return k;
}

KernelSet choose_for_cpu() {
  const cpu::CpuFeatures& f = cpu::cpu_features();
  const CpuIsaKernels& isa = cpu_isa_kernels();
  KernelSet set;
  set.name = "cpu";
  set.fused = isa.fused_avx512 ? isa.fused_avx512 : isa.fused_avx2;  // the widest
  set.dot = isa.dot_amx ? isa.dot_amx : isa.dot_avx512bf16;
  // A build for another architecture compiles the ISA files empty (null).
  set.f32_attention = set.fused ? AttentionTilePath::f32_fused : AttentionTilePath::f32;
  set.bf16_attention = AttentionTilePath::automatic;
  set.gemm_bf16 = Bf16GemmPath::automatic;

  auto why = [&](KernelId id, std::string text) { set.why[static_cast<std::size_t>(id)] = std::move(text); };
  const std::string cap = f.onednn_cap.empty() ? "" : " (ONEDNN_MAX_CPU_ISA=" + f.onednn_cap + ")";
  const std::string fused_why =
      set.fused ? std::string("fused ") + set.fused->isa + " tiles: the widest vector ISA this CPU and oneDNN run" + cap
                : "fp32 tiles on oneDNN's sgemm: no AVX2/FMA here" + cap;
  why(KernelId::attention_forward, "fp32: " + fused_why);
  why(KernelId::attention_backward, "fp32: " + fused_why);
  why(KernelId::gemm, "fp32: dnnl_sgemm (" + f.onednn_isa + ")");
  return set;
}

// Times a forward and backward of a small causal problem on each bf16 path
// this CPU has (1 thread, best of three turns after a warm-up) and keeps
// the fastest. The dot products' speed is not the CPU's flags alone
// (AVX512-BF16 runs at half the fp32 FMA rate on the Intel Xeons without
// AMX, at twice it on Zen 4), so it is measured, like gemm_bf16's choice.
struct Bf16Choice {
  AttentionTilePath path;
  std::string how;
};
Bf16Choice measure_bf16_attention() {
  const KernelSet& cpu = cpu_kernel_set();
  std::vector<std::pair<AttentionTilePath, std::string>> candidates;
  if (cpu.dot) candidates.push_back({AttentionTilePath::bf16_dot, "dot"});
  if (cpu.fused) candidates.push_back({AttentionTilePath::bf16_fused, "fused"});
  if (measured_gemm_bf16_native()) candidates.push_back({AttentionTilePath::bf16_native, "native"});
  if (!cpu.fused) candidates.push_back({AttentionTilePath::bf16_widened, "widened"});
  if (const std::string& pinned = cpu::cpu_features().pin_bf16_attention; !pinned.empty()) {
    for (const auto& [path, name] : candidates)
      if (name == pinned) return {path, "pinned by LONGCTX_BF16_ATTENTION=" + pinned};
    std::string have;
    for (const auto& c : candidates) have += (have.empty() ? "" : ", ") + c.second;
    throw ConfigError("LONGCTX_BF16_ATTENTION=" + pinned + ": not a bf16 attention path this CPU runs (" + have + ")");
  }
  if (candidates.size() == 1) return {candidates[0].first, "the only bf16 path on this CPU"};
  constexpr int64_t S = 2048, H = 2, D = 64;  // 1024 tokens told dot from native by 7%, the model by 35%
  std::vector<bf16> q(S * H * D), k(S * H * D), v(S * H * D), o(S * H * D), dout(S * H * D);
  std::vector<float> lse(S * H), delta(S * H), dq(S * H * D), dk(S * H * D), dv(S * H * D);
  std::vector<int64_t> pos(S);
  std::iota(pos.begin(), pos.end(), 0);
  for (int64_t x = 0; x < S * H * D; ++x) {  // a fixed pattern in [-1, 1): no library RNG needed
    q[x] = bf16(float((x * 37) % 101) / 50.5f - 1.0f), k[x] = bf16(float((x * 53) % 97) / 48.5f - 1.0f);
    v[x] = bf16(float((x * 29) % 89) / 44.5f - 1.0f), dout[x] = bf16(float((x * 17) % 83) / 41.5f - 1.0f);
  }
  AttentionArgs args;
  args.q = TensorView(q.data(), DType::bf16, {1, S, H, D}), args.k = TensorView(k.data(), DType::bf16, {1, S, H, D});
  args.v = TensorView(v.data(), DType::bf16, {1, S, H, D});
  args.q_pos = args.kv_pos = pos.data();
  args.mask = MaskSpec::parse("causal");
  struct SingleThread {
    int threads = omp_get_max_threads();
    SingleThread() { omp_set_num_threads(1); }
    ~SingleThread() { omp_set_num_threads(threads); }
  } single;
  auto run = [&](AttentionTilePath path) {
    // On a CPU device of its own, whatever device the first caller is on
    // (the planner's first bf16 attention call runs on a meta device).
    KernelSet pinned = cpu;
    pinned.bf16_attention = path;
    const std::unique_ptr<Device> device = Device::make_cpu(pinned);
    const DeviceScope on(*device);
    const TensorView ov(o.data(), DType::bf16, {1, S, H, D}), dov(dout.data(), DType::bf16, {1, S, H, D});
    const TensorView dqv(dq.data(), DType::f32, {1, S, H, D}), dkv(dk.data(), DType::f32, {1, S, H, D});
    const TensorView dvv(dv.data(), DType::f32, {1, S, H, D});
    attention_forward(args, ov, lse.data());
    attention_backward(args, dov, lse.data(), delta.data(), dqv, dkv, dvv);
  };
  // Every candidate warmed up (page faults, oneDNN primitives), then timed in turns, best of three: a burst of
  // noise from another tenant of the machine lands on one turn of each, not on all of one candidate's (a
  // choice timed candidate after candidate once picked a path 1.35x slower at the model's shape).
  for (const auto& candidate : candidates) run(candidate.first);
  std::vector<double> ms(candidates.size(), 1e30);
  for (int turn = 0; turn < 3; ++turn)
    for (size_t c = 0; c < candidates.size(); ++c) {
      Timer timer;
      run(candidates[c].first);
      ms[c] = std::min(ms[c], timer.seconds() * 1e3);
    }
  const size_t fastest = std::min_element(ms.begin(), ms.end()) - ms.begin();
  Bf16Choice best{candidates[fastest].first, ""};
  for (size_t c = 0; c < candidates.size(); ++c) {
    char line[96];
    std::snprintf(line, sizeof line, "%s%s %.1f ms", c ? ", " : "", candidates[c].second.c_str(), ms[c]);
    best.how += line;
  }
  best.how = "fastest of " + best.how + " (forward + backward, 2048 tokens, 1 thread)";
  return best;
}

const Bf16Choice& bf16_attention() {
  static const Bf16Choice choice = measure_bf16_attention();
  return choice;
}

// Native only where oneDNN has a bf16 matmul for this CPU AND it beats
// widening plus dnnl_sgemm on a model-sized product: bf16 dot products are
// not faster everywhere. Measured (bench/results/attention_bf16_avx512.md):
// on an Intel Xeon with AVX512-BF16 but no AMX, vdpbf16ps retires about one
// per 2 cycles (32 FLOP/cycle) against two 16-wide FMAs (64 FLOP/cycle), so
// oneDNN's bf16 matmul ran at half the sgemm rate (82 vs 161 GFLOP/s a
// core); with AMX the native path wins by 6-8x; on Zen 4 by about 2x. A
// factor of ~2 or more either way. LONGCTX_BF16_GEMM=native|widened pins
// it (runs that must repeat bit for bit on a CPU where the two are close).
struct GemmChoice {
  bool native;
  std::string how;
};
GemmChoice measure_gemm_bf16() {
  const std::string& pinned = cpu::cpu_features().pin_bf16_gemm;
  if (!pinned.empty() && pinned != "native" && pinned != "widened")
    throw ConfigError("LONGCTX_BF16_GEMM must be native or widened, got '" + pinned + "'");
  const bool available = gemm_bf16_matmul_available();
  if (!pinned.empty())
    return {pinned == "native" && available,
            "pinned by LONGCTX_BF16_GEMM=" + pinned + (available ? "" : " (no bf16 matmul here: widened)")};
  if (!available) return {false, "no bf16 matmul in oneDNN for this CPU: widened"};
  const Bf16GemmRates rates = time_gemm_bf16_paths();
  char how[128];
  std::snprintf(how, sizeof how, "native %.0f vs widened %.0f GFLOP/s (512^3, 1 thread)", rates.native_gflops,
                rates.widened_gflops);
  return {rates.native_gflops > rates.widened_gflops, how};
}

const GemmChoice& gemm_bf16() {
  static const GemmChoice choice = measure_gemm_bf16();
  return choice;
}

}  // namespace

const CpuIsaKernels& cpu_isa_kernels() {
  static const CpuIsaKernels kernels = isa_kernels_for_cpu();
  return kernels;
}

const KernelSet& cpu_kernel_set() {
  static const KernelSet set = choose_for_cpu();
  return set;
}

AttentionTilePath measured_bf16_attention() { return bf16_attention().path; }
std::string bf16_attention_choice() { return bf16_attention().how; }
bool measured_gemm_bf16_native() { return gemm_bf16().native; }
std::string gemm_bf16_choice() { return gemm_bf16().how; }

AttentionTilePath KernelSet::attention_path(DType dtype) const {
  if (dtype == DType::f32) return f32_attention;
  return bf16_attention == AttentionTilePath::automatic ? measured_bf16_attention() : bf16_attention;
}

Bf16GemmPath KernelSet::gemm_bf16_path() const {
  if (gemm_bf16 != Bf16GemmPath::automatic) return gemm_bf16;
  return measured_gemm_bf16_native() ? Bf16GemmPath::native : Bf16GemmPath::widened;
}

const char* kernel_target_name(KernelTarget target) {
  return target == KernelTarget::cpu ? "cpu" : "accelerator";
}

KernelTarget kernel_target_of(const std::string& name) {
  if (name == "cpu") return KernelTarget::cpu;
  if (name == "accelerator") return KernelTarget::accelerator;
  throw ConfigError("kernels must be cpu or accelerator, got '" + name + "'");
}

KernelSet counting_kernel_set(KernelTarget target) {
  if (target == KernelTarget::cpu) {
    // The calling thread's CPU device's: the CPU's set, or one a test pinned.
    KernelSet set = device_of(static_cast<const void*>(nullptr)).kernels();
    set.name = "counting: this host's cpu kernels";
    set.counts = true;
    return set;
  }
  // An accelerator's fused flash kernel: its tiles live on chip, so its
  // device memory holds no per-thread tile scratch. Nothing of the host's
  // (its CPU, its measured choices) is asked.
  KernelSet set;
  set.name = "counting: an accelerator's fused kernels";
  set.counts = true;
  set.attention_tile_scratch = false;
  set.f32_attention = AttentionTilePath::f32;
  set.bf16_attention = AttentionTilePath::bf16_native;
  set.gemm_bf16 = Bf16GemmPath::native;
  return set;
}

std::string counting_key(KernelTarget target) {
  if (target == KernelTarget::accelerator) return kernel_target_name(target);
  // The choices as set (automatic stays automatic: the measured choice is
  // the process's, stable), so that keying an fp32 count never measures bf16.
  const KernelSet& set = device_of(static_cast<const void*>(nullptr)).kernels();
  return std::string("cpu ") + std::to_string(int(set.f32_attention)) + " " + std::to_string(int(set.bf16_attention)) + " " +
         (set.fused ? set.fused->isa : "-") + " " + (set.dot ? set.dot->isa : "-");
}

std::string describe_kernel_set(const KernelSet& set) {
  std::string out;
  auto line = [&](KernelId id, const std::string& text) {
    out += std::string("  ") + kernel_name(id) + std::string(20 - std::min<size_t>(19, std::string(kernel_name(id)).size()), ' ') + text + "\n";
  };
  const auto& why = set.why;
  auto at = [&](KernelId id) { return why[static_cast<std::size_t>(id)]; };
  for (KernelId id : {KernelId::attention_forward, KernelId::attention_backward}) {
    line(id, at(id));
    line(id, "bf16: " + attention_tile_path_name(set.attention_path(DType::bf16), set) + " (" +
                 (set.bf16_attention == AttentionTilePath::automatic ? bf16_attention_choice() : "pinned") + ")");
  }
  line(KernelId::gemm, at(KernelId::gemm));
  const std::string bf16_gemm_why = !gemm_bf16_matmul_available()                ? ""
                                    : set.gemm_bf16 == Bf16GemmPath::automatic ? " (" + gemm_bf16_choice() + ")"
                                                                               : " (pinned)";
  line(KernelId::gemm, "bf16: " + gemm_bf16_implementation(512) + bf16_gemm_why);
  for (std::size_t i = 0; i < kNumKernels; ++i) {
    const auto id = static_cast<KernelId>(i);
    if (id == KernelId::attention_forward || id == KernelId::attention_backward || id == KernelId::gemm) continue;
    line(id, at(id).empty() ? "C++ with OpenMP, compiled for the build's target: one kernel on every CPU" : at(id));
  }
  return out;
}

}  // namespace longctx
