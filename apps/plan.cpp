// `longctx plan CONFIG.yml [key=value ...] [--hardware NAME] [--devices N]
//               [--device-memory BYTES] [--json]`
// `mpiexec -n 2 longctx plan --measure [--output PATH]`
// `mpiexec -n N longctx plan CONFIG.yml [key=value ...] --validate [--steps N] [--markdown FILE]`
//    runs real train steps and compares the predicted step time with them
//
// The planning itself is src/plan (pure arithmetic). Measuring the cpu-local
// profile runs real kernels and MPI, so it lives here, in the app layer.
#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "apps/commands.h"
#include "core/config.h"
#include "core/error.h"
#include "core/timer.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "train/optimizer.h"
#include "train/trainer.h"
#include "plan/hardware.h"
#include "plan/planner.h"

namespace longctx {

namespace {

using nlohmann::json;

// ---- measuring the cpu-local profile ---------------------------------------------------

// Streaming triad a = b + s c over arrays far larger than the caches: bytes/s.
double measure_memory_bandwidth(bool quick) {
  const int64_t n = int64_t{quick ? 8 : 32} << 20;  // 3 x 32 or 3 x 128 MiB
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  double best = 0;
  for (int rep = 0; rep < (quick ? 3 : 5); ++rep) {
    Timer t;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    best = std::max(best, 3.0 * 4.0 * double(n) / t.seconds());
  }
  return best + 0 * a[n / 2];
}

// Normal random floats: the kernels' speed depends on the values (subnormal
// intermediates are slow), so they are timed on data like a model's, never
// on constants.
void fill_normal(std::vector<float>& v, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  for (float& x : v) x = normal(rng);
}

// GEMM efficiency (of `gemm_flops`) of one projection [T, w] -> [T, w] as the
// model runs it: forward, weight gradient, input gradient, cycling over
// enough distinct activation buffers that they come from memory, not cache,
// as in a training step.
std::map<int64_t, double> measure_matmul_efficiency(double gemm_flops, bool quick) {
  const int64_t T = quick ? 1024 : 4096, min_bytes = int64_t{quick ? 16 : 64} << 20;
  std::map<int64_t, double> out;
  for (int64_t w : quick ? std::vector<int64_t>{128, 512} : std::vector<int64_t>{64, 128, 256, 512, 1024}) {
    const int64_t sets = std::max<int64_t>(2, min_bytes / (3 * T * w * 4) + 1);
    std::vector<std::vector<float>> x(sets), y(sets), dx(sets);
    for (int64_t i = 0; i < sets; ++i) {
      x[i].resize(T * w), y[i].resize(T * w), dx[i].resize(T * w);
      fill_normal(x[i], 1.0f, uint32_t(i)), fill_normal(y[i], 1.0f, uint32_t(i + sets));
    }
    std::vector<float> W(w * w), dW(w * w, 0.0f);
    fill_normal(W, 0.02f, 7);
    auto pass = [&] {
      for (int64_t i = 0; i < sets; ++i) {
        gemm_f32(false, true, T, w, w, 1.0f, x[i].data(), w, W.data(), w, 0.0f, y[i].data(), w);
        gemm_f32(true, false, w, w, T, 1.0f, y[i].data(), w, x[i].data(), w, 1.0f, dW.data(), w);
        gemm_f32(false, false, T, w, w, 1.0f, y[i].data(), w, W.data(), w, 0.0f, dx[i].data(), w);
      }
    };
    pass();  // warm-up
    double best = 1e30;
    for (int rep = 0; rep < 2; ++rep) {
      Timer t;
      pass();
      best = std::min(best, t.seconds());
    }
    out[w] = 3.0 * 2.0 * double(T) * w * w * sets / best / gemm_flops;
  }
  return out;
}

struct AttentionNumbers {
  double both, forward;  // efficiency per pair of a full tile: forward + backward, forward alone
  std::map<std::string, double> partial_cost;  // by mask kind: a partial tile's time over a full one's
};

// The attention kernel's rate on full tiles (full mask, 14 D FLOPs per pair
// forward + backward, 4 D forward) as a fraction of `gemm_flops`, and what a
// partial tile costs per mask kind (forward + backward): kv positions strided
// so that every kv block spans the whole sequence, which leaves every tile
// partial under causal, local and chunked masks alike.
AttentionNumbers measure_attention(double gemm_flops, int64_t S, int64_t D, int reps) {
  const int64_t H = 4, G = 2;
  // {seconds forward + backward, seconds forward, tiles computed}
  auto run = [&](int64_t n, const MaskSpec& mask, bool strided) {
    std::vector<float> q(n * H * D), k(n * G * D), v(n * G * D), o(n * H * D), dout(n * H * D), dq(q), dk(k),
        dv(k), lse(n * H), delta(n * H);
    fill_normal(q, 1.0f, 1), fill_normal(k, 1.0f, 2), fill_normal(v, 1.0f, 3), fill_normal(dout, 1.0f, 4);
    const int64_t block = kAttentionTile, stride = std::max<int64_t>(1, n / block);
    std::vector<int64_t> q_pos(n), kv_pos(n);
    for (int64_t i = 0; i < n; ++i) q_pos[i] = i, kv_pos[i] = strided ? (i % block) * stride + i / block : i;
    AttentionArgs a;
    a.q = TensorView(q.data(), DType::f32, {1, n, H, D});
    a.k = TensorView(k.data(), DType::f32, {1, n, G, D});
    a.v = TensorView(v.data(), DType::f32, {1, n, G, D});
    a.q_pos = q_pos.data();
    a.kv_pos = kv_pos.data();
    a.mask = mask;
    TensorView ov(o.data(), DType::f32, {1, n, H, D}), dov(dout.data(), DType::f32, {1, n, H, D});
    TensorView dqv(dq.data(), DType::f32, {1, n, H, D}), dkv(dk.data(), DType::f32, {1, n, G, D}),
        dvv(dv.data(), DType::f32, {1, n, G, D});
    double both = 1e30, fwd = 1e30;
    AttentionStats stats;
    for (int rep = 0; rep < reps; ++rep) {
      Timer t;
      attention_forward(a, ov, lse.data(), rep == 0 ? &stats : nullptr);
      const double f = t.seconds();
      attention_delta(ov, dov, delta.data());
      attention_backward(a, dov, lse.data(), delta.data(), dqv, dkv, dvv);
      both = std::min(both, t.seconds());
      fwd = std::min(fwd, f);
    }
    return std::tuple{both, fwd, double(stats.blocks_computed())};
  };
  const auto [both, fwd, tiles] = run(S, MaskSpec::full(), false);
  const double pairs = double(S) * S * H;
  AttentionNumbers out{pairs * 14.0 * D / both / gemm_flops, pairs * 4.0 * D / fwd / gemm_flops, {}};
  const int64_t n = S / 2;  // about half of each partial tile masked:
  for (const auto& [kind, mask] : {std::pair{"causal", MaskSpec::causal()}, std::pair{"local", MaskSpec::local(n / 2, 0)},
                                   std::pair{"chunked", MaskSpec::chunked(n / 2)}}) {
    const auto [t, t_fwd, partial_tiles] = run(n, mask, true);
    (void)t_fwd;
    out.partial_cost[kind] = (t / partial_tiles) / (both / tiles);
  }
  return out;
}

// Each elementwise kernel of a training step (planner.h elementwise_kernels)
// as src/model and src/train run it, on random data of a model's widths
// (d = 512, F = 1536, 10 rotated heads of 64 in rows of 12, V = 259) and on
// enough tokens that one call moves `footprint` bytes: a step touches more
// memory (activations, gradients, optimizer state) than the caches hold, so
// its kernels stream from memory. bytes/s per kernel, bytes as the planner
// counts them, over the best time.
std::map<std::string, double> measure_elementwise(bool quick) {
  const double footprint = double(int64_t{quick ? 128 : 256} << 20);
  const int reps = quick ? 2 : 3;
  const int64_t d = 512, heads = 10, row = 12 * 64, F = 1536, V = 259;
  auto tokens = [&](const char* kernel, int64_t width) {
    return std::max<int64_t>(1024, int64_t(footprint / double(width * elementwise_kernel(kernel).bytes_per_element)));
  };
  auto normal = [](int64_t n, float sigma, uint32_t seed) {
    std::vector<float> v(n);
    fill_normal(v, sigma, seed);
    return v;
  };
  auto mat = [](std::vector<float>& b, int64_t r, int64_t c) { return TensorView(b.data(), DType::f32, {r, c}); };
  std::map<std::string, double> out;
  // Best of reps; `setup` restores (untimed) data a kernel overwrote, so every rep sees model-like values.
  auto time = [&](const char* kernel, int64_t elements, auto&& setup, auto&& run) {
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      setup();
      Timer t;
      run();
      best = std::min(best, t.seconds());
    }
    out[kernel] = double(elements) * double(elementwise_kernel(kernel).bytes_per_element) / best;
  };
  auto none = [] {};
  std::vector<float> w = normal(d, 1.0f, 1), dw(d, 0.0f);
  {
    const int64_t N = tokens("rmsnorm_forward", d);
    std::vector<float> x = normal(N * d, 1.0f, 2), y(N * d);
    time("rmsnorm_forward", N * d, none, [&] { rmsnorm_forward(mat(x, N, d), w.data(), 1e-5, mat(y, N, d)); });
  }
  {
    const int64_t N = tokens("rmsnorm_backward", d);
    std::vector<float> x = normal(N * d, 1.0f, 3), dy = normal(N * d, 1e-3f, 4), dx = normal(N * d, 1e-3f, 5);
    time("rmsnorm_backward", N * d, none,
         [&] { rmsnorm_backward(mat(x, N, d), w.data(), 1e-5, mat(dy, N, d), mat(dx, N, d), dw.data()); });
  }
  {
    const int64_t N = tokens("rope", heads * 64);
    std::vector<float> qkv = normal(N * row, 1.0f, 6), cs = normal(N * 32, 1.0f, 7), sn = normal(N * 32, 1.0f, 8);
    const TensorView rot = TensorView::strided(qkv.data(), DType::f32, {N, heads, 64}, {row, 64, 1});
    time("rope", N * heads * 64, none, [&] { rope_forward(rot, cs.data(), sn.data()); });
  }
  {
    const int64_t n = tokens("residual_add", d) * d;
    std::vector<float> x = normal(n, 1.0f, 9), y = normal(n, 1.0f, 10);
    time("residual_add", n, none, [&] {  // LlamaModel's add_into
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) y[i] += x[i];
    });
  }
  {
    const int64_t N = tokens("swiglu_backward", F);
    std::vector<float> gu = normal(N * 2 * F, 0.5f, 11), act = normal(N * F, 1e-3f, 12), dgu(N * 2 * F);
    auto half = [&](std::vector<float>& b, int64_t off) {  // gate or up: [N, F] of [N, 2F]
      return TensorView::strided(b.data() + off, DType::f32, {N, F}, {2 * F, 1});
    };
    time("swiglu_forward", N * F, none, [&] { swiglu_forward(half(gu, 0), half(gu, F), mat(act, N, F)); });
    time("swiglu_backward", N * F, none,
         [&] { swiglu_backward(half(gu, 0), half(gu, F), mat(act, N, F), half(dgu, 0), half(dgu, F)); });
  }
  {
    const int64_t N = tokens("cross_entropy", V);
    std::vector<float> logits(N * V);
    std::vector<int32_t> targets(N);
    for (int64_t i = 0; i < N; ++i) targets[i] = int32_t(i * 7 % V);
    time("cross_entropy", N * V, [&] { fill_normal(logits, 1.0f, 13); },
         [&] {
           const TensorView z = mat(logits, N, V);  // the gradient overwrites the logits, as in the model
           cross_entropy(z, targets.data(), nullptr, 1.0f / N, &z);
         });
  }
  {
    // The trainer's step around backward: zero the gradients, their global
    // norm, AdamW. The gradients are refilled (untimed) after zeroing.
    const int64_t P = tokens("optimizer", 1);
    std::vector<float> p = normal(P, 0.02f, 14), g(P), m(P, 0.0f), v(P, 0.0f);
    std::vector<NamedTensor> grads(1);
    grads[0].local = TensorView(g.data(), DType::f32, {P});
    AdamWParams h;
    h.weight_decay = 0.1f;
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      Timer zero;
      std::memset(g.data(), 0, P * sizeof(float));
      const double z = zero.seconds();
      fill_normal(g, 1e-3f, uint32_t(15 + rep));
      Timer t;
      volatile double norm = global_gradient_norm(grads, nullptr);
      (void)norm;
      adamw_update(p.data(), g.data(), m.data(), v.data(), P, h);
      best = std::min(best, z + t.seconds());
    }
    out["optimizer"] = double(P) * double(elementwise_kernel("optimizer").bytes_per_element) / best;
  }
  return out;
}

struct LinkNumbers {
  double p2p_bandwidth, latency, all_to_all_bandwidth, collective_bandwidth;
};

// Ping-pong between ranks 0 and 1, then all-to-all and all-gather over the world.
LinkNumbers measure_links(MPI_Comm comm, bool quick) {
  int rank, P;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &P);
  LinkNumbers r{};
  auto pingpong = [&](int64_t bytes, int reps) {
    std::vector<char> buf(bytes);
    MPI_Barrier(comm);
    Timer t;
    for (int i = 0; i < reps; ++i) {
      if (rank == 0) {
        MPI_Send(buf.data(), int(bytes), MPI_BYTE, 1, 0, comm);
        MPI_Recv(buf.data(), int(bytes), MPI_BYTE, 1, 0, comm, MPI_STATUS_IGNORE);
      } else if (rank == 1) {
        MPI_Recv(buf.data(), int(bytes), MPI_BYTE, 0, 0, comm, MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), int(bytes), MPI_BYTE, 0, 0, comm);
      }
    }
    double one_way = t.seconds() / (2.0 * reps);
    MPI_Bcast(&one_way, 1, MPI_DOUBLE, 0, comm);
    return one_way;
  };
  pingpong(8, 100);  // warm-up
  r.latency = pingpong(8, quick ? 300 : 2000);
  const int64_t big = int64_t{quick ? 4 : 32} << 20;
  pingpong(big, 2);
  r.p2p_bandwidth = double(big) / pingpong(big, quick ? 4 : 10);

  // Per-device bandwidth as the counters count it: bytes sent to others / time.
  const int64_t block = (int64_t{quick ? 8 : 64} << 20) / P;
  std::vector<char> send(block * P), recv(block * P);
  auto timed = [&](auto&& op) {
    op();
    MPI_Barrier(comm);
    Timer t;
    for (int i = 0; i < 5; ++i) op();
    double s = t.seconds() / 5;
    MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, comm);
    return s;
  };
  double a2a = timed([&] {
    MPI_Alltoall(send.data(), int(block), MPI_BYTE, recv.data(), int(block), MPI_BYTE, comm);
  });
  r.all_to_all_bandwidth = double(block) * (P - 1) / a2a;
  double ag = timed([&] {
    MPI_Allgather(send.data(), int(block), MPI_BYTE, recv.data(), int(block), MPI_BYTE, comm);
  });
  r.collective_bandwidth = double(block) * (P - 1) / ag;
  return r;
}

int64_t physical_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  while (f >> key >> kib)
    if (key == "MemTotal:") return kib * 1024;
  return 0;
}

}  // namespace

// Collective over MPI_COMM_WORLD; every rank returns the same profile. With
// one rank there is nothing to time between ranks: the link numbers are
// placeholders (a one-rank plan has no communication).
HardwareProfile measure_cpu_local_profile(bool quick) {
  int rank, P;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  // Every rank measures at once, so shared cores and memory are shared as in training.
  MPI_Barrier(MPI_COMM_WORLD);
  const int64_t gemm_n = quick ? 1024 : 2048;
  double gemm = measure_gemm_gflops(DType::f32, gemm_n, quick ? 0.2 : 0.5) * 1e9;
  MPI_Allreduce(MPI_IN_PLACE, &gemm, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  // Each number is the slowest rank's (MPI_MIN of rates).
  auto slowest = [](std::map<int64_t, double>& m) {
    for (auto& [key, value] : m) MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  };
  std::map<int64_t, double> matmul = measure_matmul_efficiency(gemm, quick);
  slowest(matmul);
  std::map<int64_t, double> attention, attention_fwd;
  std::map<std::string, std::map<int64_t, double>> partial;
  for (int64_t D : {16, 32, 64, 128}) {
    const AttentionNumbers a = measure_attention(gemm, quick ? 512 : 1024, D, quick ? 1 : 3);
    attention[D] = a.both, attention_fwd[D] = a.forward;
    for (const auto& [kind, cost] : a.partial_cost) partial[kind][D] = 1.0 / cost;  // a rate: MPI_MIN is the slowest
  }
  slowest(attention), slowest(attention_fwd);
  for (auto& [kind, by_dim] : partial) {
    slowest(by_dim);
    for (auto& [D, rate] : by_dim) rate = 1.0 / rate;
  }
  std::map<std::string, double> elementwise = measure_elementwise(quick);
  for (auto& [kernel, bw] : elementwise) MPI_Allreduce(MPI_IN_PLACE, &bw, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  double bw = measure_memory_bandwidth(quick);
  MPI_Allreduce(MPI_IN_PLACE, &bw, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  LinkNumbers links{bw, 1e-6, bw, bw};
  if (P > 1) links = measure_links(MPI_COMM_WORLD, quick);

  HardwareProfile h;
  h.name = "cpu-local";
  const int threads = omp_get_max_threads();
  h.description = "this machine: " + std::to_string(P) + " MPI ranks x " + std::to_string(threads) +
                  " OpenMP threads, measured by `longctx plan --measure`" +
                  (quick ? " (quick, on the fly by train)" : "");
  h.topology = "shared memory (MPI ranks on one host)";
  h.peak_flops_fp32 = gemm;
  h.peak_flops_bf16 = 0;
  h.matmul_efficiency = 1.0;
  h.matmul_efficiency_per_width = matmul;
  h.attention_efficiency = attention[128];
  h.attention_efficiency_per_head_dim = attention;
  h.attention_forward_efficiency_per_head_dim = attention_fwd;
  h.attention_block = kAttentionTile;  // square tiles, the same for every head dim today
  h.attention_partial_tile_cost = partial;
  h.threads_per_device = threads;
  h.memory_bytes = physical_memory_bytes() / P;
  h.memory_bandwidth = bw;
  h.elementwise_bandwidth_per_kernel = elementwise;  // every kernel: elementwise_bandwidth stays 0
  h.devices_per_node = P;
  h.p2p_bandwidth = links.p2p_bandwidth;
  h.collective_bandwidth = links.collective_bandwidth;
  h.all_to_all_bandwidth = links.all_to_all_bandwidth;
  h.latency = links.latency;
  const std::string how = " (" + std::to_string(P) + " ranks x " + std::to_string(threads) + " threads)";
  const std::string n = std::to_string(gemm_n);
  h.sources = {
      {"peak_flops_fp32", "measured: oneDNN sgemm " + n + "^3, all ranks at once, slowest rank" + how},
      {"peak_flops_bf16", "0: this build has no bf16 GEMM (oneDNN 2.6 sgemm only)"},
      {"matmul_efficiency", "1: the peak above is a measured GEMM rate"},
      {"matmul_efficiency_per_width",
       "measured: projection [T, w] -> [T, w] forward + weight and input gradients, T = " +
           std::string(quick ? "1024" : "4096") + ", activations cycled through >= " + (quick ? "16" : "64") +
           " MiB of buffers (from memory, as in a step), over the GEMM rate" + how},
      {"attention_efficiency", "measured: attention fwd+bwd on full tiles (full mask, S=" +
                                   std::string(quick ? "512" : "1024") +
                                   ", H=4 G=2 D=128, random data), 14 D FLOPs per pair, over the GEMM rate" + how},
      {"attention_efficiency_per_head_dim", "measured as attention_efficiency, at D = 16, 32, 64, 128"},
      {"attention_forward_efficiency_per_head_dim", "measured: the forward alone (4 D FLOPs per pair), same runs"},
      {"attention_block", "the attention kernel's tile (kAttentionTile in src/kernels/attention.h)"},
      {"attention_partial_tile_cost",
       "measured per mask kind: fwd+bwd time per tile with kv positions strided over the sequence (every tile "
       "partial, about half masked) over that of full tiles"},
      {"threads_per_device", "OpenMP threads per rank while measuring"},
      {"memory_bytes", "/proc/meminfo MemTotal / ranks"},
      {"memory_bandwidth", "measured: streaming triad, per rank, all ranks at once" + how},
      {"elementwise_bandwidth_per_kernel",
       "measured: each kernel alone on random data (d=512, F=1536), each call moving " +
           std::string(quick ? "128" : "256") + " MiB (from memory, as in a step), bytes as the planner "
           "counts them (elementwise_kernels), per second" + how},
      {"p2p_bandwidth", P > 1 ? "measured: MPI ping-pong between ranks 0 and 1" : "placeholder (one rank)"},
      {"latency", P > 1 ? "measured: 8-byte MPI ping-pong, one way" : "placeholder (one rank)"},
      {"all_to_all_bandwidth", P > 1 ? "measured: MPI_Alltoall, bytes sent to others per second per rank"
                                     : "placeholder (one rank)"},
      {"collective_bandwidth", P > 1 ? "measured: MPI_Allgather, bytes sent to others per second per rank"
                                     : "placeholder (one rank)"},
  };
  return h;
}

namespace {

int run_measure(const std::string& output) {
  int rank, P;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &P);
  if (P < 2 && rank == 0)
    std::fprintf(stderr, "warning: plan --measure on one rank: no links to time (placeholders); the compute "
                         "numbers describe one-rank runs. Measure under `mpiexec -n N` for N-rank runs.\n");
  HardwareProfile h = measure_cpu_local_profile(false);
  if (rank == 0) {
    std::string path = output.empty() ? default_hardware_dir() + "/cpu-local.yml" : output;
    save_hardware_profile(h, path);
    std::printf("cpu-local profile written to %s\n", path.c_str());
    std::printf("  GEMM fp32 %.1f GFLOP/s per rank; projections of width", h.peak_flops_fp32 / 1e9);
    for (const auto& [w, e] : h.matmul_efficiency_per_width) std::printf(" %lld: %.0f%%", (long long)w, e * 100);
    std::printf("\n  attention at");
    for (const auto& [D, e] : h.attention_efficiency_per_head_dim) std::printf(" %.0f%% (D=%lld)", e * 100, (long long)D);
    std::printf(" of it (forward alone:");
    for (const auto& [D, e] : h.attention_forward_efficiency_per_head_dim) std::printf(" %.0f%%", e * 100);
    std::printf(")\n  partial %lldx%lld tiles cost, in full ones:", (long long)h.attention_block,
                (long long)h.attention_block);
    for (const auto& [kind, by_dim] : h.attention_partial_tile_cost) {
      std::printf(" %s", kind.c_str());
      for (const auto& [D, c] : by_dim) std::printf(" %.2f", c);
    }
    std::printf("\n  memory %.1f GB/s; elementwise kernels (GB/s):", h.memory_bandwidth / 1e9);
    for (const auto& [k, bw] : h.elementwise_bandwidth_per_kernel) std::printf(" %s %.1f", k.c_str(), bw / 1e9);
    std::printf("\n");
    std::printf("  p2p %.2f GB/s, latency %.1f us, all-to-all %.2f GB/s, all-gather %.2f GB/s per rank\n",
                h.p2p_bandwidth / 1e9, h.latency * 1e6, h.all_to_all_bandwidth / 1e9,
                h.collective_bandwidth / 1e9);
  }
  return 0;
}

// ---- printing -----------------------------------------------------------------------

std::string human_bytes(double b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (b >= 1024 && u < 5) b /= 1024, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", b, unit[u]);
  return buf;
}

std::string seconds(double s) {
  char buf[32];
  if (s < 1e-3) std::snprintf(buf, sizeof buf, "%.1f us", s * 1e6);
  else if (s < 1) std::snprintf(buf, sizeof buf, "%.1f ms", s * 1e3);
  else std::snprintf(buf, sizeof buf, "%.2f s", s);
  return buf;
}

json to_json(const StrategyPlan& p) {
  json j = {{"strategy", name_of(p.strategy)}, {"dp", p.dp}, {"cp", p.cp}, {"ulysses", p.ulysses},
            {"ring", p.ring}, {"tp", p.tp}, {"remat_policy", name_of(p.remat_policy)}, {"valid", p.valid}};
  if (!p.valid) {
    j["invalid_reason"] = p.invalid_reason;
    return j;
  }
  json mem = json::array();
  for (const MemoryLine& m : p.memory)
    mem.push_back({{"category", m.category}, {"name", m.name}, {"bytes", m.bytes}});
  json comm = json::array();
  for (const CommLine& c : p.comm)
    comm.push_back({{"op", c.op}, {"axis", c.axis}, {"what", c.what}, {"calls", c.calls},
                    {"bytes_sent", c.bytes_sent}, {"bytes_received", c.bytes_received},
                    {"seconds", c.seconds}, {"hidden_seconds", c.hidden_seconds}});
  j.update({{"memory", mem}, {"memory_total_bytes", p.memory_total},
            {"device_memory_bytes", p.device_memory}, {"fits", p.fits}, {"communication", comm},
            {"comm_bytes_sent", p.comm_bytes_sent}, {"model_flops", p.model_flops},
            {"hardware_flops", p.hardware_flops}, {"attention_pairs", p.attention_pairs},
            {"load_imbalance", p.load_imbalance}, {"compute_seconds", p.compute_seconds},
            {"matmul_seconds", p.matmul_seconds}, {"attention_seconds", p.attention_seconds},
            {"elementwise_seconds", p.elementwise_seconds},
            {"comm_seconds", p.comm_seconds}, {"hidden_comm_seconds", p.hidden_comm_seconds},
            {"step_seconds", p.step_seconds}, {"tokens_per_second_per_device", p.tokens_per_second},
            {"mfu", p.mfu}});
  if (!p.advice.empty()) j["advice"] = p.advice;
  return j;
}

std::string plan_label(const StrategyPlan& p) {
  return p.strategy == CpStrategy::usp ? "usp " + std::to_string(p.ulysses) + "x" + std::to_string(p.ring)
                                       : name_of(p.strategy);
}

void print_text(const RunConfig& c, const PlanReport& r, double plan_seconds) {
  const StrategyPlan* any = nullptr;
  for (const StrategyPlan& p : r.candidates)
    if (p.valid) any = &p;
  std::printf("plan: %s, S=%lld x batch %lld, %s mask, %s layout, dtype %s, remat %s%s\n",
              c.model_name.empty() ? "model" : c.model_name.c_str(),
              (long long)c.max_target_length, (long long)c.per_device_batch_size,
              name_of(c.attention_type), name_of(c.layout()), name_of(c.dtype), name_of(c.remat_policy),
              c.shard_optimizer_over_data ? ", optimizer sharded over dp x cp (ZeRO-1)" : "");
  if (any)
    std::printf("      %lld x %s (%s each): dp %lld x cp %lld x tp %lld\n\n", (long long)r.devices,
                r.hardware.c_str(), human_bytes(double(any->device_memory)).c_str(),
                (long long)any->dp, (long long)any->cp, (long long)any->tp);
  std::printf("%-12s %10s %6s %12s %10s %10s %10s %10s %8s %12s %6s\n", "strategy", "memory", "fits",
              "comm sent", "compute", "comm", "hidden", "step", "imbal.", "tok/s/dev", "MFU");
  for (const StrategyPlan& p : r.candidates) {
    if (!p.valid) {
      std::printf("%-12s invalid: %s\n", plan_label(p).c_str(), p.invalid_reason.c_str());
      continue;
    }
    std::printf("%-12s %10s %6s %12s %10s %10s %10s %10s %8.3f %12.1f %5.1f%%\n", plan_label(p).c_str(),
                human_bytes(double(p.memory_total)).c_str(), p.fits ? "yes" : "NO",
                human_bytes(double(p.comm_bytes_sent)).c_str(), seconds(p.compute_seconds).c_str(),
                seconds(p.comm_seconds).c_str(), seconds(p.hidden_comm_seconds).c_str(),
                seconds(p.step_seconds).c_str(), p.load_imbalance, p.tokens_per_second, p.mfu * 100);
  }
  for (const StrategyPlan& p : r.candidates) {
    if (!p.valid) continue;
    std::printf("\n-- %s: memory per device %s of %s%s\n", plan_label(p).c_str(),
                human_bytes(double(p.memory_total)).c_str(), human_bytes(double(p.device_memory)).c_str(),
                p.fits ? "" : (" -- does NOT fit; " + p.advice).c_str());
    for (const MemoryLine& m : p.memory)
      std::printf("   %-14s %-58s %12s\n", m.category.c_str(), m.name.c_str(),
                  human_bytes(double(m.bytes)).c_str());
    std::printf("   communication per device per step:\n");
    for (const CommLine& l : p.comm)
      std::printf("   %-14s %-8s %-38s %6lld calls  sent %10s  recv %10s  %9s%s\n", l.op.c_str(),
                  l.axis.c_str(), l.what.c_str(), (long long)l.calls,
                  human_bytes(double(l.bytes_sent)).c_str(), human_bytes(double(l.bytes_received)).c_str(),
                  seconds(l.seconds).c_str(), l.hidden_seconds > 0 ? " (overlapped)" : "");
    std::printf("   FLOPs per device: %.3g model, %.3g with remat; %lld attention pairs, imbalance %.3f\n",
                p.model_flops, p.hardware_flops, (long long)p.attention_pairs, p.load_imbalance);
  }
  const PlanRecommendation& rec = r.recommendation;
  std::printf("\nrecommendation: ");
  if (rec.found)
    std::printf("context_parallel_strategy=%s ici_context_parallelism=%lld%s remat_policy=%s%s\n  why: %s\n",
                name_of(rec.strategy), (long long)rec.cp,
                rec.strategy == CpStrategy::usp
                    ? (" ici_context_usp_ulysses_parallelism=" + std::to_string(rec.ulysses)).c_str()
                    : "",
                name_of(rec.remat_policy), rec.shard_optimizer_over_data ? " shard_optimizer_over_data=true" : "",
                rec.reason.c_str());
  else
    std::printf("none: %s\n", rec.reason.c_str());
  std::printf("(planned in %.3f s)\n", plan_seconds);
}

// ---- validating the time model against real steps --------------------------------

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Runs `steps` real training steps (after one warm-up) of the config on this
// launch's ranks and prints the planner's predicted step time beside the
// measured median (the slowest rank's), with both breakdowns. With
// `markdown`, rank 0 appends one table row to that file.
int run_validate(RunConfig config, const HardwareProfile& hw, int64_t steps, const std::string& markdown) {
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  config.steps = steps + 1;
  config.enable_checkpointing = false;
  config.metrics_file = "";
  if (config.peak_tflops_per_device <= 0) config.peak_tflops_per_device = hw.peak_flops_fp32 / 1e12;
  validate_config(config, world);
  PlanOptions options;
  options.devices = world;
  const StrategyPlan plan = plan_strategy(config, hw, options);
  if (!plan.valid) throw ConfigError("plan --validate: " + plan.invalid_reason);
  Mesh mesh(mesh_shape_from_config(config));
  Trainer trainer(config, &mesh);
  trainer.train_step();  // warm-up: workspace allocation, first touch
  std::vector<double> seconds;
  StepProfile sum;
  for (int64_t i = 0; i < steps; ++i) {
    seconds.push_back(trainer.train_step().seconds);
    const StepProfile& p = trainer.model().last_step_profile();
    sum.matmul += p.matmul, sum.attention += p.attention, sum.loss += p.loss;
    sum.elementwise += p.elementwise, sum.tp_comm += p.tp_comm;
  }
  const double measured = median(seconds), n = double(steps);
  const double err = (plan.step_seconds - measured) / measured;
  if (rank != 0) return 0;
  char name[64];
  std::snprintf(name, sizeof name, "%s%s", name_of(plan.strategy),
                plan.strategy == CpStrategy::usp ? (" " + std::to_string(plan.ulysses) + "x" + std::to_string(plan.ring)).c_str() : "");
  std::printf("validate: %d rank(s), %s cp=%lld, S=%lld B=%lld, remat %s, %s mask\n", world, name,
              (long long)plan.cp, (long long)config.max_target_length, (long long)config.per_device_batch_size,
              name_of(config.remat_policy), name_of(config.attention_type));
  std::printf("  predicted %.3f s/step: matmul %.3f, attention %.3f, elementwise %.3f, exposed comm %.3f\n",
              plan.step_seconds, plan.matmul_seconds, plan.attention_seconds, plan.elementwise_seconds,
              plan.comm_seconds - plan.hidden_comm_seconds);
  // The rest of the step: the optimizer, gradient all-reduce, data, waiting for the slowest rank.
  double mean = 0;
  for (double t : seconds) mean += t / n;
  const double rest = mean - sum.total() / n;
  std::printf("  measured  %.3f s/step (median of %lld; rank 0 means: matmul %.3f, attention+its comm %.3f, "
              "loss head %.3f, elementwise %.3f, tp %.3f, rest of the step %.3f)\n",
              measured, (long long)steps, sum.matmul / n, sum.attention / n, sum.loss / n, sum.elementwise / n,
              sum.tp_comm / n, rest);
  std::printf("  predicted / measured - 1 = %+.1f%%\n", err * 100);
  if (!markdown.empty()) {
    std::ofstream f(markdown, std::ios::app);
    if (!f) throw ConfigError("plan --validate: cannot append to " + markdown);
    char row[512];
    std::snprintf(row, sizeof row,
                  "| %d | %s | %lldx%lldx%lld | %s | %lld | %lld | %s | %s | %.3f | %.3f | %+.1f%% | %.2f / %.2f / %.2f / %.2f | %.2f / %.2f / %.2f / %.2f |\n",
                  world, config.model_name.c_str(), (long long)plan.dp, (long long)plan.cp, (long long)plan.tp, name,
                  (long long)config.max_target_length, (long long)config.per_device_batch_size,
                  name_of(config.remat_policy),
                  (name_of(config.attention_type) + (config.attention_type == MaskKind::local ? " " + std::to_string(config.sliding_window_size) : "")).c_str(),
                  plan.step_seconds, measured,
                  err * 100, plan.matmul_seconds, plan.attention_seconds, plan.elementwise_seconds,
                  plan.comm_seconds - plan.hidden_comm_seconds, (sum.matmul + sum.loss) / n, sum.attention / n,
                  sum.elementwise / n, sum.tp_comm / n + rest);
    f << row;
  }
  return 0;
}

}  // namespace

const char* const kPlanUsage =
    "usage: longctx plan CONFIG.yml [key=value ...] [--hardware NAME] [--devices N]\n"
    "         [--device-memory BYTES] [--json]\n"
    "       mpiexec -n N longctx plan CONFIG.yml [key=value ...] --validate [--steps N] [--markdown FILE]\n"
    "       mpiexec -n N longctx plan --measure [--output FILE]\n"
    "  --hardware NAME   configs/hardware/NAME.yml (default cpu-local; tpu-v5p, tpu-v7, h100, h200)\n"
    "  --devices N       devices to plan for (default: the config's mesh)\n"
    "  --validate        run real training steps and compare them with the prediction\n"
    "  --measure         measure this machine's profile (GEMM, bandwidths, MPI links)\n";

int run_plan(const Args& args) {
  std::string config_path, hardware = "cpu-local", output;
  std::vector<std::string> overrides;
  PlanOptions options;
  bool as_json = false, measure = false, validate = false;
  int64_t steps = 3;
  std::string markdown;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&]() -> const std::string& {
      if (i + 1 >= args.size()) throw ConfigError("plan: " + a + " needs a value");
      return args[++i];
    };
    if (a == "--json") as_json = true;
    else if (a == "--measure") measure = true;
    else if (a == "--output") output = value();
    else if (a == "--validate") validate = true;
    else if (a == "--steps") steps = std::stoll(value());
    else if (a == "--markdown") markdown = value();
    else if (a == "--hardware") hardware = value();
    else if (a == "--devices") options.devices = std::stoll(value());
    else if (a == "--device-memory") options.device_memory = parse_bytes(value());
    else if (a.rfind("--", 0) == 0)
      throw ConfigError("plan: unknown flag '" + a + "'\n" + kPlanUsage);
    else if (a.find('=') != std::string::npos) overrides.push_back(a);
    else if (config_path.empty()) config_path = a;
    else throw ConfigError("plan: unexpected argument '" + a + "'");
  }
  if (measure) return run_measure(output);
  if (config_path.empty())
    throw ConfigError(std::string("plan needs a config file\n") + kPlanUsage);
  if (validate)
    return run_validate(load_config(config_path, overrides), load_hardware_profile(hardware), steps, markdown);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) return 0;  // pure arithmetic: one rank prints
  Timer t;
  RunConfig config = load_config(config_path, overrides);
  HardwareProfile hw = load_hardware_profile(hardware);
  PlanReport report = make_plan(config, hw, options);
  double elapsed = t.seconds();
  if (as_json) {
    json j;
    j["hardware"] = report.hardware;
    j["devices"] = report.devices;
    j["max_target_length"] = config.max_target_length;
    j["per_device_batch_size"] = config.per_device_batch_size;
    j["candidates"] = json::array();
    for (const StrategyPlan& p : report.candidates) j["candidates"].push_back(to_json(p));
    const PlanRecommendation& rec = report.recommendation;
    j["recommendation"] = {{"found", rec.found}, {"reason", rec.reason}};
    if (rec.found)
      j["recommendation"].update({{"strategy", name_of(rec.strategy)}, {"cp", rec.cp}, {"ulysses", rec.ulysses},
                                  {"remat_policy", name_of(rec.remat_policy)},
                                  {"shard_optimizer_over_data", rec.shard_optimizer_over_data},
                                  {"plan", to_json(rec.plan)}});
    j["plan_seconds"] = elapsed;
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    print_text(config, report, elapsed);
  }
  return 0;
}

}  // namespace longctx
