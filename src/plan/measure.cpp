// The cpu-local profile's measurements (src/plan/measure.h). Every
// collective goes through the world communicator that the caller passes.
#include "plan/measure.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "core/memory.h"
#include "core/offload_store.h"
#include "core/timer.h"
#include "kernels/cpu/select.h"
#include "kernels/attention/attention.h"
#include "kernels/gemm.h"
#include "kernels/ops.h"
#include "plan/planner.h"
#include "train/optimizer.h"

namespace longctx {

namespace {

// Every size and repeat count of a measurement, per MeasureSize (measure.h).
struct Sizes {
  bool quick, smoke;
  int64_t gemm_n;
  double gemm_seconds;
  int64_t stream_floats, stream_reps;                      // memory bandwidth
  int64_t matmul_tokens, matmul_min_bytes;                 // projections
  std::vector<int64_t> matmul_widths;
  int64_t attention_tokens, attention_reps;
  double elementwise_footprint;
  int64_t elementwise_min_tokens;
  int elementwise_reps;
  int pingpongs;
  int64_t exchange_bytes, exchange_reps, collective_bytes;  // links
};
Sizes sizes_of(MeasureSize size) {
  switch (size) {
    case MeasureSize::full:
      return {false, false, 2048, 0.5, int64_t{32} << 20, 5, 4096, int64_t{64} << 20, {64, 128, 256, 512, 1024},
              1024, 3, double(int64_t{256} << 20), 1024, 3, 2000, int64_t{32} << 20, 6, int64_t{64} << 20};
    case MeasureSize::quick:
      return {true, false, 1024, 0.2, int64_t{8} << 20, 3, 1024, int64_t{16} << 20, {128, 512},
              512, 1, double(int64_t{128} << 20), 1024, 2, 300, int64_t{4} << 20, 3, int64_t{8} << 20};
    case MeasureSize::smoke: break;
  }
  return {true, true, 128, 0.0, int64_t{1} << 16, 1, 256, int64_t{1} << 20, {128},
          256, 1, double(int64_t{4} << 20), 64, 1, 20, int64_t{1} << 16, 1, int64_t{1} << 18};
}

// ---- measuring the cpu-local profile ---------------------------------------------------

// Streaming triad a = b + s c over arrays far larger than the caches: bytes/s.
// Bytes per second one way through each offload tier, as the model uses it:
// put then get of 8 blocks of 16 MiB through an OffloadStore. Not in the
// quick profile train makes on the fly (it picks a strategy, and must not
// take host_memory_budget for itself).
struct OffloadRates {
  double host = 0, disk = 0;
  std::string what, dir;
};
OffloadRates measure_offload() {
  const size_t block = size_t{16} << 20;
  const int blocks = 8;
  OffloadRates r;
  r.what = "8 blocks of 16 MiB";
  r.dir = (std::filesystem::temp_directory_path() / "longctx-measure-offload").string();
  std::vector<char> data(block, 1), back(block);
  auto rate = [&](OffloadTarget target) {
    OffloadStore store(target, r.dir);
    Timer t;
    for (int i = 0; i < blocks; ++i) store.put(i, "measure", data.data(), block);
    for (int i = 0; i < blocks; ++i) store.get(i, back.data());
    store.wait_all();
    return 2.0 * double(block) * blocks / t.seconds();
  };
  r.host = rate(OffloadTarget::host);
  r.disk = rate(OffloadTarget::disk);
  std::error_code ec;
  std::filesystem::remove(r.dir, ec);
  return r;
}

double measure_memory_bandwidth(const Sizes& z) {
  const int64_t n = z.stream_floats;  // 3 x 128 MiB, or 3 x 32 MiB quick
  std::vector<float> a(n), b(n, 1.0f), c(n, 2.0f);
  double best = 0;
  for (int rep = 0; rep < z.stream_reps; ++rep) {
    Timer t;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
    best = std::max(best, 3.0 * 4.0 * double(n) / t.seconds());
  }
  return best + 0 * a[n / 2];
}

// Normal random floats: the kernels' speed depends on the values (subnormal
// intermediates are slow), so they are timed on data like a model's, never
// on constants. Drawing hundreds of MiB one by one would take most of the
// measurement, so 64 Ki normal draws are read in an order scrambled by a
// hash of the index (no period a kernel could cache), in parallel.
void fill_normal(std::vector<float>& v, float sigma, uint32_t seed) {
  constexpr size_t kDraws = size_t{1} << 16;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  if (v.size() <= kDraws) {
    for (float& x : v) x = normal(rng);
    return;
  }
  std::vector<float> draws(kDraws);
  for (float& x : draws) x = normal(rng);
  const int64_t n = static_cast<int64_t>(v.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    uint64_t z = (uint64_t(i) + uint64_t(seed) * kDraws) * 0x9E3779B97F4A7C15ull;  // splitmix64's mix
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z ^= z >> 31;
    v[size_t(i)] = draws[z & (kDraws - 1)];
  }
}

// n normal random values stored as `dtype` (bf16: rounded once, as the model
// rounds its activations): a kernel operand of either dtype.
class Values {
 public:
  Values(DType dtype, int64_t n, float sigma, uint32_t seed) : dtype_(dtype) {
    std::vector<float> v(static_cast<size_t>(n));  // sigma 0: zeros (an output)
    if (sigma > 0) fill_normal(v, sigma, seed);
    if (dtype == DType::bf16) {
      b16_.resize(v.size());
      round_to_bf16(v.data(), b16_.data(), n);
    } else {
      f32_ = std::move(v);
    }
  }
  void* data() { return dtype_ == DType::bf16 ? static_cast<void*>(b16_.data()) : f32_.data(); }
  TensorView view(std::initializer_list<int64_t> shape) { return TensorView(data(), dtype_, shape); }
  // [rows, cols] columns [first, first + cols) of rows `ld` long (a half of a fused projection).
  TensorView columns(int64_t rows, int64_t cols, int64_t first, int64_t ld) {
    char* base = static_cast<char*>(data()) + first * static_cast<int64_t>(dtype_size(dtype_));
    return TensorView::strided(base, dtype_, {rows, cols}, {ld, 1});
  }

 private:
  DType dtype_;
  std::vector<float> f32_;
  std::vector<bf16> b16_;
};

// GEMM efficiency (of `gemm_flops`, the same-run GEMM rate in `dtype`) of one
// projection [T, w] -> [T, w] as the model runs it in `dtype`: forward, weight
// gradient, input gradient, operands in `dtype` and outputs fp32 (bf16: the
// gradient operand is the fp32 gradient's bf16 copy, fp32: the gradient
// itself), cycling over enough distinct activation buffers that they come
// from memory, not cache, as in a training step.
std::map<int64_t, double> measure_matmul_efficiency(DType dtype, double gemm_flops, const Sizes& z) {
  const int64_t T = z.matmul_tokens, min_bytes = z.matmul_min_bytes;
  const bool low = dtype == DType::bf16;
  std::map<int64_t, double> out;
  for (int64_t w : z.matmul_widths) {
    const int64_t sets = std::max<int64_t>(2, min_bytes / (3 * T * w * 4) + 1);
    std::vector<Values> x, g;
    std::vector<std::vector<float>> y(sets), dx(sets);
    for (int64_t i = 0; i < sets; ++i) {
      x.emplace_back(dtype, T * w, 1.0f, uint32_t(i));
      if (low) g.emplace_back(dtype, T * w, 1.0f, uint32_t(i + sets));
      y[i].resize(T * w), dx[i].resize(T * w);
      fill_normal(y[i], 1.0f, uint32_t(i + sets));
    }
    Values W(dtype, w * w, 0.02f, 7);
    std::vector<float> dW(w * w, 0.0f);
    auto pass = [&] {
      for (int64_t i = 0; i < sets; ++i) {
        const void* grad = low ? g[i].data() : y[i].data();
        gemm(dtype, false, true, T, w, w, 1.0f, x[i].data(), w, W.data(), w, 0.0f, y[i].data(), w);
        gemm(dtype, true, false, w, w, T, 1.0f, grad, w, x[i].data(), w, 1.0f, dW.data(), w);
        gemm(dtype, false, false, T, w, w, 1.0f, grad, w, W.data(), w, 0.0f, dx[i].data(), w);
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
// partial under causal, local and chunked masks alike. Q, K, V, O and dO in
// `dtype` (the model's context and its gradient operand), LSE and the
// gradients fp32, as the model calls it.
AttentionNumbers measure_attention(DType dtype, double gemm_flops, int64_t S, int64_t D, int reps) {
  const int64_t H = 4, G = 2;
  // {seconds forward + backward, seconds forward, tiles computed}
  auto run = [&](int64_t n, const MaskSpec& mask, bool strided) {
    Values q(dtype, n * H * D, 1.0f, 1), k(dtype, n * G * D, 1.0f, 2), v(dtype, n * G * D, 1.0f, 3),
        dout(dtype, n * H * D, 1.0f, 4), o(dtype, n * H * D, 0.0f, 5);
    std::vector<float> dq(n * H * D), dk(n * G * D), dv(n * G * D), lse(n * H), delta(n * H);
    const int64_t block = kAttentionTile, stride = std::max<int64_t>(1, n / block);
    std::vector<int64_t> q_pos(n), kv_pos(n);
    for (int64_t i = 0; i < n; ++i) q_pos[i] = i, kv_pos[i] = strided ? (i % block) * stride + i / block : i;
    AttentionArgs a;
    a.q = q.view({1, n, H, D});
    a.k = k.view({1, n, G, D});
    a.v = v.view({1, n, G, D});
    a.q_pos = q_pos.data();
    a.kv_pos = kv_pos.data();
    a.mask = mask;
    const TensorView ov = o.view({1, n, H, D}), dov = dout.view({1, n, H, D});
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

// Each elementwise kernel of a training step in `dtype` (planner.h
// elementwise_kernels; those with no bytes in `dtype` do not run) as
// src/model and src/train run it: views in `dtype` where the model's are
// (activations), fp32 where its are (gradients, GEMM outputs, RoPE's
// operand, logits), on random data of a model's widths (d = 512, F = 1536,
// 10 rotated heads of 64 in rows of 12, V = 259) and on enough tokens that one
// call moves `footprint` bytes in fp32 (about half that in bf16; the rounding
// kernel, bf16 only, all of it): a step touches more memory (activations,
// gradients, optimizer state) than the caches hold, so its kernels stream
// from memory. bytes/s per kernel, bytes as the planner counts them for
// `dtype`, over the best time.
std::map<std::string, double> measure_elementwise(DType dtype, const Sizes& z) {
  const double footprint = z.elementwise_footprint;
  const int reps = z.elementwise_reps;
  const int64_t d = 512, heads = 10, row = 12 * 64, F = 1536, V = 259;
  auto bytes = [&](KernelId kernel) { return elementwise_kernel(kernel).bytes_per_element(dtype); };
  // The same tokens in both dtypes: the dtype that moves more moves `footprint`.
  auto tokens = [&](KernelId kernel, int64_t width) {
    const ElementwiseKernel& k = elementwise_kernel(kernel);
    return std::max<int64_t>(z.elementwise_min_tokens,
                             int64_t(footprint / double(width * std::max(k.bytes_fp32, k.bytes_bf16))));
  };
  auto f32 = [](int64_t n, float sigma, uint32_t seed) { return Values(DType::f32, n, sigma, seed); };
  auto act = [&](int64_t n, float sigma, uint32_t seed) { return Values(dtype, n, sigma, seed); };
  std::map<std::string, double> out;
  // Best of reps; `setup` restores (untimed) data a kernel overwrote, so every rep sees model-like values.
  auto time = [&](KernelId kernel, int64_t elements, auto&& setup, auto&& run) {
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      setup();
      Timer t;
      run();
      best = std::min(best, t.seconds());
    }
    out[kernel_name(kernel)] = double(elements) * double(bytes(kernel)) / best;
  };
  auto none = [] {};
  std::vector<float> w(d), dw(d, 0.0f);
  fill_normal(w, 1.0f, 1);
  {
    const int64_t N = tokens(KernelId::rmsnorm_forward, d);
    Values x = act(N * d, 1.0f, 2), y = act(N * d, 0.0f, 0);
    time(KernelId::rmsnorm_forward, N * d, none, [&] { rmsnorm_forward(x.view({N, d}), w.data(), 1e-5, y.view({N, d})); });
  }
  {
    const int64_t N = tokens(KernelId::rmsnorm_backward, d);
    Values x = act(N * d, 1.0f, 3), dy = f32(N * d, 1e-3f, 4), dx = f32(N * d, 1e-3f, 5);
    time(KernelId::rmsnorm_backward, N * d, none, [&] {
      rmsnorm_backward(x.view({N, d}), w.data(), 1e-5, dy.view({N, d}), dx.view({N, d}), dw.data());
    });
  }
  {
    const int64_t N = tokens(KernelId::rope, heads * 64);  // the fp32 GEMM output, rotated before any rounding
    std::vector<float> qkv(N * row), cs(N * 32), sn(N * 32);
    fill_normal(qkv, 1.0f, 6), fill_normal(cs, 1.0f, 7), fill_normal(sn, 1.0f, 8);
    const TensorView rot = TensorView::strided(qkv.data(), DType::f32, {N, heads, 64}, {row, 64, 1});
    time(KernelId::rope, N * heads * 64, none, [&] { rope_forward(rot, cs.data(), sn.data()); });
  }
  {
    const int64_t N = tokens(KernelId::residual_add, d);  // the residual + the fp32 GEMM output
    Values x = act(N * d, 1.0f, 9), o = f32(N * d, 1.0f, 10), y = act(N * d, 0.0f, 0);
    time(KernelId::residual_add, N * d, none, [&] { residual_add(x.view({N, d}), o.view({N, d}), y.view({N, d})); });
  }
  {
    const int64_t N = tokens(KernelId::swiglu_backward, F);
    Values gu = act(N * 2 * F, 0.5f, 11), a = act(N * F, 0.0f, 0), da = f32(N * F, 1e-3f, 12),
           dgu = act(N * 2 * F, 0.0f, 0);
    time(KernelId::swiglu_forward, N * F, none,
         [&] { swiglu_forward(gu.columns(N, F, 0, 2 * F), gu.columns(N, F, F, 2 * F), a.view({N, F})); });
    time(KernelId::swiglu_backward, N * F, none, [&] {
      swiglu_backward(gu.columns(N, F, 0, 2 * F), gu.columns(N, F, F, 2 * F), da.view({N, F}),
                      dgu.columns(N, F, 0, 2 * F), dgu.columns(N, F, F, 2 * F));
    });
  }
  {
    const int64_t N = tokens(KernelId::cross_entropy, V);
    std::vector<float> logits(N * V);
    std::vector<int32_t> targets(N);
    for (int64_t i = 0; i < N; ++i) targets[i] = int32_t(i * 7 % V);
    time(KernelId::cross_entropy, N * V, [&] { fill_normal(logits, 1.0f, 13); },
         [&] {
           const TensorView z(logits.data(), DType::f32, {N, V});  // the gradient overwrites the logits, as in the model
           cross_entropy(z, targets.data(), nullptr, 1.0f / N, &z);
         });
  }
  if (bytes(KernelId::convert) > 0) {  // an fp32 GEMM output rounded to its bf16 copy (qkv_proj's width)
    const int64_t N = tokens(KernelId::convert, row);
    Values src = f32(N * row, 1.0f, 16), dst = act(N * row, 0.0f, 0);
    time(KernelId::convert, N * row, none, [&] { convert(src.view({N, row}), dst.view({N, row})); });
  }
  {
    // The trainer's step around backward: zero the gradients, their global
    // norm, AdamW (fp32 in both dtypes). The gradients are refilled (untimed)
    // after zeroing.
    const int64_t P = tokens(KernelId::optimizer, 1);
    std::vector<float> p(P), g(P), m(P, 0.0f), v(P, 0.0f);
    fill_normal(p, 0.02f, 14);
    AdamWParams h;
    h.weight_decay = 0.1f;
    double best = 1e30;
    for (int rep = 0; rep < reps; ++rep) {
      Timer zero;
      std::memset(g.data(), 0, P * sizeof(float));
      const double z = zero.seconds();
      fill_normal(g, 1e-3f, uint32_t(15 + rep));
      Timer t;
      // What AdamW::step runs on its piece: the norm's sum of squares, then the update.
      volatile double norm = sum_of_squares(g.data(), P);
      (void)norm;
      adamw_update(p.data(), g.data(), m.data(), v.data(), P, h);
      best = std::min(best, z + t.seconds());
    }
    out[kernel_name(KernelId::optimizer)] = double(P) * double(bytes(KernelId::optimizer)) / best;
  }
  return out;
}

struct LinkNumbers {
  double p2p_bandwidth, latency, all_to_all_bandwidth, collective_bandwidth;
  double all_reduce_bandwidth = 0;
};

// Ping-pong between ranks 0 and 1, then all-to-all and all-gather over the world.
// Completes `r` by polling without pause, as a blocking MPI call does: the
// watched wait's back-off sleeps (each tens of microseconds of timer slack)
// would be timed as latency.
void spin(const Communicator& comm, Request&& r) {
  while (!comm.test(r)) {
  }
}

// One-way seconds of a `bytes` message between ranks a and b of comm (the
// others wait), as every rank learns it.
double pingpong(const Communicator& comm, int a, int b, int64_t bytes, int reps) {
  std::vector<char> buf(bytes);
  spin(comm, comm.ibarrier());
  Timer t;
  for (int i = 0; i < reps; ++i) {
    if (comm.rank() == a) {
      spin(comm, comm.isend(buf.data(), size_t(bytes), b, 0));
      spin(comm, comm.irecv(buf.data(), size_t(bytes), b, 0));
    } else if (comm.rank() == b) {
      spin(comm, comm.irecv(buf.data(), size_t(bytes), a, 0));
      spin(comm, comm.isend(buf.data(), size_t(bytes), a, 0));
    }
  }
  double one_way = t.seconds() / (2.0 * reps);
  comm.broadcast(&one_way, sizeof one_way, a);
  return one_way;
}

// Seconds for ranks a and b to send each other `bytes` at once, as a ring
// step and an all-reduce do (both directions share what acknowledges them).
double exchange(const Communicator& comm, int a, int b, int64_t bytes, int reps) {
  std::vector<char> out(bytes), in(bytes);
  spin(comm, comm.ibarrier());
  Timer t;
  if (comm.rank() == a || comm.rank() == b)
    for (int i = 0; i < reps; ++i) {
      const int peer = comm.rank() == a ? b : a;
      Request r = comm.irecv(in.data(), size_t(bytes), peer, 1);
      spin(comm, comm.isend(out.data(), size_t(bytes), peer, 1));
      spin(comm, std::move(r));
    }
  double seconds = t.seconds() / reps;
  comm.broadcast(&seconds, sizeof seconds, a);
  return seconds;
}

// Latency (8 bytes, one way) and bandwidth (a big message each way at once) between ranks a and b.
std::pair<double, double> latency_and_bandwidth(const Communicator& comm, int a, int b, const Sizes& z) {
  pingpong(comm, a, b, 8, std::min(100, z.pingpongs));  // warm-up
  const double latency = pingpong(comm, a, b, 8, z.pingpongs);
  const int64_t big = z.exchange_bytes;
  exchange(comm, a, b, big, 1);
  return {latency, double(big) / exchange(comm, a, b, big, z.exchange_reps)};
}

LinkNumbers measure_links(const Communicator& comm, const Sizes& z) {
  const int P = comm.size();
  LinkNumbers r{};
  std::tie(r.latency, r.p2p_bandwidth) = latency_and_bandwidth(comm, 0, 1, z);

  // Per-device bandwidth as the counters count it: bytes sent to others / time.
  const int64_t block = z.collective_bytes / P;
  std::vector<char> send(block * P), recv(block * P);
  auto timed = [&](auto&& op) {
    op();
    spin(comm, comm.ibarrier());
    Timer t;
    for (int i = 0; i < 5; ++i) op();
    double s = t.seconds() / 5;
    comm.all_reduce_max(&s, 1);
    return s;
  };
  double a2a = timed([&] { spin(comm, comm.iall_to_all(send.data(), recv.data(), size_t(block))); });
  r.all_to_all_bandwidth = double(block) * (P - 1) / a2a;
  double ag = timed([&] { spin(comm, comm.iall_gather(send.data(), recv.data(), size_t(block))); });
  r.collective_bandwidth = double(block) * (P - 1) / ag;
  // The gradients' all-reduce, as the counters count it: 2 n (P-1)/P per rank.
  std::vector<float> grads(size_t(block * P) / sizeof(float), 1.0f);
  double ar = timed([&] { comm.all_reduce_sum(grads.data(), grads.size()); });
  r.all_reduce_bandwidth = 2.0 * double(block * P) * (P - 1) / P / ar;
  return r;
}

// The kernel tables of a step in `dtype` (each number the slowest rank's):
// efficiencies over `gemm_flops`, the same-run GEMM rate in `dtype`.
KernelTables measure_kernel_tables(const Communicator& world, DType dtype, double gemm_flops, const Sizes& z) {
  auto slowest = [&](std::map<int64_t, double>& m) {  // the minimum of rates
    for (auto& [key, value] : m) world.all_reduce_min(&value, 1);
  };
  KernelTables t;
  t.matmul_efficiency_per_width = measure_matmul_efficiency(dtype, gemm_flops, z);
  slowest(t.matmul_efficiency_per_width);
  for (int64_t D : {16, 32, 64, 128}) {
    const AttentionNumbers a = measure_attention(dtype, gemm_flops, z.attention_tokens, D, int(z.attention_reps));
    t.attention_efficiency_per_head_dim[D] = a.both, t.attention_forward_efficiency_per_head_dim[D] = a.forward;
    for (const auto& [kind, cost] : a.partial_cost)
      t.attention_partial_tile_cost[kind][D] = 1.0 / cost;  // a rate: the minimum is the slowest
  }
  slowest(t.attention_efficiency_per_head_dim), slowest(t.attention_forward_efficiency_per_head_dim);
  for (auto& [kind, by_dim] : t.attention_partial_tile_cost) {
    slowest(by_dim);
    for (auto& [D, rate] : by_dim) rate = 1.0 / rate;
  }
  t.elementwise_bandwidth_per_kernel = measure_elementwise(dtype, z);
  for (auto& [kernel, bw] : t.elementwise_bandwidth_per_kernel) world.all_reduce_min(&bw, 1);
  return t;
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

HardwareProfile measure_cpu_local_profile(const Communicator& world, MeasureSize size) {
  const Sizes z = sizes_of(size);
  const bool quick = z.quick;
  const int P = world.size();
  // Every rank measures at once, so shared cores and memory are shared as in training.
  world.barrier();
  const int64_t gemm_n = z.gemm_n;
  double gemm = measure_gemm_gflops(DType::f32, gemm_n, z.gemm_seconds) * 1e9;
  world.all_reduce_min(&gemm, 1);
  double gemm_bf16 = measure_gemm_gflops(DType::bf16, gemm_n, z.gemm_seconds) * 1e9;
  world.all_reduce_min(&gemm_bf16, 1);
  KernelTables fp32_tables = measure_kernel_tables(world, DType::f32, gemm, z);
  KernelTables bf16_tables = measure_kernel_tables(world, DType::bf16, gemm_bf16, z);
  double bw = measure_memory_bandwidth(z);
  world.all_reduce_min(&bw, 1);
  // Hosts: ranks on one host measure their links among themselves (each
  // host at once); rank 0 and the first rank on another host, the link
  // between hosts. A host is a host name and a network namespace
  // (scripts/cluster.sh's hosts share this machine's name, not its network).
  char host_name[256] = {};
  gethostname(host_name, sizeof host_name - 1);
  std::error_code ec;
  const uint64_t mine = std::hash<std::string>{}(std::string(host_name) + "/" +
                                                 std::filesystem::read_symlink("/proc/self/ns/net", ec).string());
  std::vector<uint64_t> hosts(P);
  world.all_gather(&mine, hosts.data(), sizeof mine);
  const int my_host = static_cast<int>(std::find(hosts.begin(), hosts.end(), mine) - hosts.begin());
  const int64_t per_host = std::count(hosts.begin(), hosts.end(), hosts[0]);
  const int other_host = static_cast<int>(std::find_if(hosts.begin(), hosts.end(), [&](uint64_t h) { return h != hosts[0]; }) - hosts.begin());
  const int64_t n_hosts = static_cast<int64_t>(std::set<uint64_t>(hosts.begin(), hosts.end()).size());
  const Communicator local = world.split(my_host, world.rank(), "host");
  LinkNumbers links{bw, 1e-6, bw, bw};
  if (local.size() > 1) links = measure_links(local, z);
  std::pair<double, double> inter{0, 0};
  if (other_host < P) inter = latency_and_bandwidth(world, 0, other_host, z);
  // The collectives across hosts: the ranks of one local index, one per
  // host, every such group at once (as a step's dp or ring groups run).
  LinkNumbers across{};
  if (n_hosts > 1) {
    const Communicator cross = world.split(local.rank(), world.rank(), "across hosts");
    if (cross.size() > 1) across = measure_links(cross, z);
    world.broadcast(&across, sizeof across, 0);
  }

  const OffloadRates offload = quick ? OffloadRates{} : measure_offload();

  HardwareProfile h;
  h.name = "cpu-local";
  const int threads = omp_get_max_threads();
  h.description = "this machine: " + std::to_string(P) + " MPI ranks x " + std::to_string(threads) +
                  " OpenMP threads, measured by `longctx plan --measure`" +
                  (z.smoke ? " (smoke sizes: proves the measurements run; not a profile to plan with)"
                   : quick ? " (quick, on the fly by train)"
                           : "");
  h.topology = "shared memory (MPI ranks on one host)";
  h.peak_flops_fp32 = gemm;
  h.peak_flops_bf16 = gemm_bf16;
  h.matmul_efficiency = 1.0;
  static_cast<KernelTables&>(h) = fp32_tables;  // every elementwise kernel measured: elementwise_bandwidth stays 0
  h.bf16 = bf16_tables;
  h.attention_efficiency = fp32_tables.attention_efficiency_per_head_dim.at(128);
  h.attention_block = kAttentionTile;  // square tiles, the same for every head dim today
  h.threads_per_device = threads;
  h.memory_bytes = physical_memory_bytes() / P;
  h.memory_bandwidth = bw;
  h.devices_per_node = per_host;
  h.inter_node_latency = inter.first;
  h.inter_node_bandwidth = inter.second;
  h.inter_node_all_reduce_bandwidth = across.all_reduce_bandwidth;
  h.inter_node_collective_bandwidth = across.collective_bandwidth;
  h.inter_node_all_to_all_bandwidth = across.all_to_all_bandwidth;
  if (n_hosts > 1)
    h.topology = std::to_string(n_hosts) + " hosts of " + std::to_string(per_host) +
                 " rank(s) (host name and network namespace), the network between them";
  h.p2p_bandwidth = links.p2p_bandwidth;
  h.collective_bandwidth = links.collective_bandwidth;
  h.all_to_all_bandwidth = links.all_to_all_bandwidth;
  h.latency = links.latency;
  h.host_link_bandwidth = offload.host;
  h.disk_bandwidth = offload.disk;
  const std::string how = " (" + std::to_string(P) + " ranks x " + std::to_string(threads) + " threads)";
  const std::string n = std::to_string(gemm_n);
  h.sources = {
      {"peak_flops_fp32", "measured: oneDNN sgemm " + n + "^3, all ranks at once, slowest rank" + how},
      {"peak_flops_bf16", "measured: gemm_bf16 " + n + "^3 (" + gemm_bf16_implementation(gemm_n) +
                              "), all ranks at once, slowest rank" + how},
      {"bf16", "measured: the same tables with the kernels run as a bf16 step runs them (GEMM operands, "
               "attention Q, K, V, O, dO and the activations in bf16; gradients, GEMM outputs, RoPE, logits "
               "fp32), efficiencies over the bf16 GEMM rate, elementwise bytes as the planner counts bf16 "
               "bytes; bf16 plans use them (HardwareProfile::for_dtype)"},
      {"matmul_efficiency", "1: the peak above is a measured GEMM rate"},
      {"matmul_efficiency_per_width",
       "measured: projection [T, w] -> [T, w] forward + weight and input gradients, T = " +
           std::to_string(z.matmul_tokens) + ", activations cycled through >= " +
           std::to_string(z.matmul_min_bytes >> 20) + " MiB of buffers (from memory, as in a step), over the GEMM rate" + how},
      {"attention_efficiency", "measured: attention fwd+bwd on full tiles (full mask, S=" +
                                   std::to_string(z.attention_tokens) +
                                   ", H=4 G=2 D=128, random data), 14 D FLOPs per pair, over the GEMM rate" + how},
      {"attention_efficiency_per_head_dim", "measured as attention_efficiency, at D = 16, 32, 64, 128"},
      {"attention_tile_path", "measured on the kernels a step runs: fp32 " +
                                  attention_tile_path_name(attention_tile_path(DType::f32)) + "; bf16 " +
                                  attention_tile_path_name(attention_tile_path(DType::bf16)) + " (" +
                                  bf16_attention_choice() + ")"},
      {"attention_forward_efficiency_per_head_dim", "measured: the forward alone (4 D FLOPs per pair), same runs"},
      {"attention_block", "the attention kernel's tile (kAttentionTile in src/kernels/attention/attention.h)"},
      {"attention_partial_tile_cost",
       "measured per mask kind: fwd+bwd time per tile with kv positions strided over the sequence (every tile "
       "partial, about half masked) over that of full tiles"},
      {"threads_per_device", "OpenMP threads per rank while measuring"},
      {"memory_bytes", "/proc/meminfo MemTotal / ranks"},
      {"memory_bandwidth", "measured: streaming triad, per rank, all ranks at once" + how},
      {"elementwise_bandwidth_per_kernel",
       "measured: each kernel alone on random data (d=512, F=1536), each call moving " +
           std::to_string(int64_t(z.elementwise_footprint) >> 20) + " MiB (from memory, as in a step), bytes as the planner "
           "counts them (elementwise_kernels), per second" + how},
      {"host_link_bandwidth", quick ? "not measured in the quick profile" : "measured: the host offload tier (src/core/offload_store.h, a memcpy into the host "
                              "pool on its thread), bytes one way per second, put + get of " + offload.what + how},
      {"disk_bandwidth", quick ? "not measured in the quick profile" : "measured: the disk offload tier, spill files with CRC-32 written and read back in " +
                             offload.dir + " (the page cache included, as in a run), " + offload.what + how},
      {"p2p_bandwidth", per_host > 1 ? "measured: ranks 0 and 1 of a host sending each other 32 MiB at once, bytes one way per second" : "placeholder (one rank per host)"},
      {"latency", per_host > 1 ? "measured: 8-byte MPI ping-pong, one way, within a host" : "placeholder (one rank per host)"},
      {"inter_node_bandwidth", n_hosts > 1 ? "measured: rank 0 and rank " + std::to_string(other_host) + " (another host) sending each other 32 MiB at once, bytes one way per second" : "one host"},
      {"inter_node_latency", n_hosts > 1 ? "measured: 8-byte MPI ping-pong, one way, between hosts" : "one host"},
      {"inter_node_all_reduce_bandwidth", n_hosts > 1 ? "measured: MPI all-reduce over one rank per host (every such group at once), bytes per second per rank as counted (2 n (P-1)/P)" : "one host"},
      {"inter_node_collective_bandwidth", n_hosts > 1 ? "measured: MPI all-gather over one rank per host (every such group at once), bytes sent to others per second per rank" : "one host"},
      {"inter_node_all_to_all_bandwidth", n_hosts > 1 ? "measured: MPI all-to-all over one rank per host (every such group at once), bytes sent to others per second per rank" : "one host"},
      {"all_to_all_bandwidth", per_host > 1 ? "measured: MPI all-to-all within a host, bytes sent to others per second per rank"
                                            : "placeholder (one rank per host)"},
      {"collective_bandwidth", per_host > 1 ? "measured: MPI all-gather within a host, bytes sent to others per second per rank"
                                            : "placeholder (one rank per host)"},
  };
  return h;
}

void require_memory_fits(const RunConfig& c, const Communicator& world) {
  const int64_t threads = c.num_threads > 0 ? c.num_threads : omp_get_max_threads();
  int64_t host_pool = 0;  // on a CPU the host offload pool is this host's memory too
  const int64_t need = predicted_memory_bytes(c, threads, &host_pool);
  // Ranks on this host share its memory: count them by host name.
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  const uint64_t mine = std::hash<std::string>{}(host);
  std::vector<uint64_t> hosts(world.size());
  world.all_gather(&mine, hosts.data(), sizeof mine);
  const int64_t local_ranks = std::count(hosts.begin(), hosts.end(), mine);
  const int64_t host_memory = physical_memory_bytes();
  auto gib = [](int64_t b) { return format_bytes(static_cast<size_t>(b)); };
  if (c.device_memory_budget > 0 && need > c.device_memory_budget)
    throw ConfigError("the run needs " + gib(need) + " per rank (predicted by the planner) but device_memory_budget is " +
                      gib(c.device_memory_budget) + ": see `longctx plan` for what fits");
  if (host_memory > 0 && need + host_pool > host_memory / local_ranks)
    throw ConfigError("the run needs " + gib(need + host_pool) + " per rank (predicted by the planner) but this host has " +
                      gib(host_memory) + " for " + std::to_string(local_ranks) +
                      " rank(s): lower max_target_length or per_device_batch_size, raise ici_context_parallelism "
                      "or add hosts (`longctx plan` shows what fits)");
}

}  // namespace longctx
