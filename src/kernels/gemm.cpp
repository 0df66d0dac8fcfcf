#include "kernels/gemm.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "core/timer.h"

namespace longctx {

namespace {

void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  if (st != dnnl_success) throw ShapeError("dnnl_sgemm failed (bad sizes or leading dims)");
}

// A product is cut into about kPieces pieces (enough for the 2-4 threads of
// a CPU rank), never smaller than kMinRows rows of C or kMinDepth of K: the
// larger a single-threaded piece, the closer it runs to oneDNN's own
// threading (measured: 256-row pieces of 2048^3 lost 19%, 512-row ones 3%).
constexpr int64_t kPieces = 4, kMinRows = 256, kMinDepth = 1024;

int64_t piece_size(int64_t n, int64_t minimum) {
  return std::max(minimum, (n + kPieces - 1) / kPieces + 63) / 64 * 64;
}


// oneDNN splits a product over its threads by their number, so its last bits
// depend on the thread count. Outside a parallel region the product is
// instead cut into pieces that depend only on its shape, each run by one
// thread (nested calls are single-threaded): rows of C in blocks, or, for a
// short C over a long K (the weight gradients: K = tokens), partial products
// over K chunks added to C in chunk order. The result is then bit-identical
// at any thread count, at 5-16% of a training step here, hence opt-in
// (KernelSet::gemm_thread_count_independent). Inside a parallel region (the
// attention kernel's tiles) a call is one piece already.
// `product` computes one piece: product(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc)
// with operands of type T (float or bf16).
template <typename T, typename Product>
void gemm_in_pieces(bool independent, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const T* A, int64_t lda,
                    const T* B, int64_t ldb, float beta, float* C, int64_t ldc, Product product) {
  if (!independent || omp_in_parallel())
    return product(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  // A's rows r0.. (stored transposed: its columns) and K offset k0.
  auto a_at = [&](int64_t r0, int64_t k0) { return ta ? A + k0 * lda + r0 : A + r0 * lda + k0; };
  auto b_at = [&](int64_t k0) { return tb ? B + k0 : B + k0 * ldb; };
  const int64_t row_block = piece_size(M, kMinRows), depth_chunk = piece_size(K, kMinDepth);
  const int64_t blocks = (M + row_block - 1) / row_block, chunks = (K + depth_chunk - 1) / depth_chunk;
  if (blocks >= 2 || chunks < 2) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < blocks; ++i) {
      const int64_t r0 = i * row_block, rows = std::min(row_block, M - r0);
      product(ta, tb, rows, N, K, alpha, a_at(r0, 0), lda, B, ldb, beta, C + r0 * ldc, ldc);
    }
    return;
  }
  // C = beta C + sum over chunks, in chunk order; a wave of chunks at a time
  // (as many as threads: the wave only bounds the scratch, not the order).
  const int64_t wave = std::min<int64_t>(chunks, omp_get_max_threads());
  std::vector<float> partial(wave * M * N);  // oneDNN's own packing scratch is untracked too
  if (beta != 1.0f) {
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < N; ++j) C[r * ldc + j] = beta == 0.0f ? 0.0f : beta * C[r * ldc + j];
  }
  for (int64_t first = 0; first < chunks; first += wave) {
    const int64_t count = std::min(wave, chunks - first);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t w = 0; w < count; ++w) {
      const int64_t k0 = (first + w) * depth_chunk, depth = std::min(depth_chunk, K - k0);
      product(ta, tb, M, N, depth, alpha, a_at(0, k0), lda, b_at(k0), ldb, 0.0f, partial.data() + w * M * N, N);
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < M; ++r)
      for (int64_t w = 0; w < count; ++w)
        for (int64_t j = 0; j < N; ++j) C[r * ldc + j] += partial[(w * M + r) * N + j];
  }
}

}  // namespace

void gemm_f32_on(const KernelSet& set, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                 const float* A, int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  gemm_in_pieces(set.gemm_thread_count_independent, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, sgemm);
}

void gemm_f32(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  launch(KernelId::gemm, device_of(C), 2.0 * double(M) * double(N) * double(K), [&](const KernelSet& set) {
    gemm_f32_on(set, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  });
}

namespace {

const dnnl::engine& cpu_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// Everything that makes a matmul primitive differ.
using GemmKey = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, float>;

struct CachedGemm {
  dnnl::memory::desc a, b, c, scratchpad;
  dnnl::matmul primitive;
  bool widen = false;  // no bf16 matmul on this CPU: widen to fp32, then dnnl_sgemm
  std::string implementation;
};

// Row-major [rows, cols] with leading dimension ld, or its transpose.
dnnl::memory::desc matrix(int64_t rows, int64_t cols, int64_t ld, bool transposed, dnnl::memory::data_type t) {
  return transposed ? dnnl::memory::desc({rows, cols}, t, {1, ld}) : dnnl::memory::desc({rows, cols}, t, {ld, 1});
}

// Creating a primitive costs far more than running a small one: once per
// shape, shared by every thread.
const CachedGemm& bf16_gemm_for(const GemmKey& key) {
  static std::mutex mu;
  static std::map<GemmKey, std::unique_ptr<CachedGemm>> cache;
  std::lock_guard<std::mutex> lock(mu);
  std::unique_ptr<CachedGemm>& slot = cache[key];
  if (!slot) {
    const auto [ta, tb, M, N, K, lda, ldb, ldc, alpha, beta] = key;
    using dt = dnnl::memory::data_type;
    auto g = std::make_unique<CachedGemm>();
    g->a = matrix(M, K, lda, ta, dt::bf16);
    g->b = matrix(K, N, ldb, tb, dt::bf16);
    g->c = matrix(M, N, ldc, false, dt::f32);
    dnnl::primitive_attr attr;
    // The caller's scratchpad, not oneDNN's: one primitive runs on several
    // threads at once (a product's pieces, the attention kernel's tiles),
    // and with the library's own scratchpad (Debian's oneDNN 2.6.3 is not
    // built for concurrent execution) two pieces at once corrupted each
    // other: errors of 50 in a 1100 x 96 x 64 product, brg:avx512_core_bf16.
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);  // C = alpha A B + beta C
      attr.set_post_ops(ops);
    }
    try {
      dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(g->a, g->b, g->c), attr, cpu_engine());
      g->implementation = pd.impl_info_str();
      g->scratchpad = pd.scratchpad_desc();
      g->primitive = dnnl::matmul(pd);
    } catch (const dnnl::error&) {
      // oneDNN 2.6 implements bf16 only where the CPU has AVX512 (or AMX):
      // elsewhere the inputs are widened (exactly) and multiplied in fp32.
      g->widen = true;
      g->implementation = "bf16 widened to fp32, dnnl_sgemm (no bf16 matmul on this CPU)";
    }
    slot = std::move(g);
  }
  return *slot;
}

}  // namespace

namespace {

// One bf16 matmul, run by the calling thread's oneDNN stream.
void bf16_matmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
                 const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const CachedGemm& g = bf16_gemm_for({ta, tb, M, N, K, lda, ldb, ldc, alpha, beta});
  const dnnl::engine& engine = cpu_engine();
  thread_local dnnl::stream stream(engine);
  thread_local std::vector<uint8_t> pad;  // this thread's scratchpad, kept at the largest size used
  if (pad.size() < g.scratchpad.get_size()) pad.resize(g.scratchpad.get_size());
  dnnl::memory a(g.a, engine, const_cast<bf16*>(A)), b(g.b, engine, const_cast<bf16*>(B)), c(g.c, engine, C);
  dnnl::memory scratch(g.scratchpad, engine, pad.data());
  g.primitive.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}, {DNNL_ARG_SCRATCHPAD, scratch}});
  stream.wait();
}

// The same product with the operands widened (exactly) to fp32 and
// multiplied by dnnl_sgemm: where the CPU has no bf16 matmul, or widening
// is faster (native_is_faster). Widened a block at a time so the fp32
// copies stay within the set's gemm_widen_floats (2^24 floats, 64 MiB: half for each
// operand) however long the sequence or wide the vocabulary: op(B) in
// blocks of kc x nb, op(A) in blocks of mb x kc. K is cut only past
// half / 256 (32768 by default: weight gradients over long sequences,
// whose C is small), since each K chunk is another pass over C; the chunks
// are added to C in K order. Every cut depends only on the shape and the
// budget, so the result does not depend on the thread count when gemm_f32
// does not. Blocks are at least 256 (fewer, larger oneDNN calls), so a
// budget under 2 x 256 x 256 floats (tests) is exceeded. The copies are
// untracked scratch, like oneDNN's own packing buffers (the planner does
// not model them).
struct WidenBlocks {
  int64_t kc, nb, mb;
};
WidenBlocks widen_blocks(int64_t budget_floats, int64_t M, int64_t N, int64_t K) {
  const int64_t half = budget_floats / 2, floor = 256;
  const int64_t kc = std::min(K, std::max(floor, half / floor));
  return {kc, std::min(N, std::max(floor, half / kc)), std::min(M, std::max(floor, half / kc))};
}

// Per calling thread, kept at the largest size used (at most the budget
// above): a fresh allocation each call costs its page faults, a third of a
// 4096 x 512 x 512 product here (plan --measure's projection rate).
thread_local std::vector<float> t_widen_scratch;

void widened_bf16_gemm(const KernelSet& set, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  const auto [kc, nb, mb] = widen_blocks(set.gemm_widen_floats, M, N, K);
  std::vector<float>& scratch = t_widen_scratch;
  if (int64_t(scratch.size()) < kc * nb + mb * kc) scratch.resize(kc * nb + mb * kc);
  float* wb = scratch.data();
  float* wa = wb + kc * nb;
  // rows x cols of src (leading dimension ld) into dst [rows, cols]; by all
  // threads for a model-sized block, by the calling one inside a parallel region.
  auto widen = [](const bf16* src, int64_t rows, int64_t cols, int64_t ld, float* dst) {
#pragma omp parallel for schedule(static) if (!omp_in_parallel() && rows * cols > (1 << 16))
    for (int64_t r = 0; r < rows; ++r) widen_bf16(src + r * ld, dst + r * cols, cols);
  };
  for (int64_t k0 = 0; k0 < K; k0 += kc) {
    const int64_t kn = std::min(kc, K - k0);
    const float chunk_beta = k0 == 0 ? beta : 1.0f;
    for (int64_t n0 = 0; n0 < N; n0 += nb) {
      const int64_t nn = std::min(nb, N - n0);
      if (tb) widen(B + n0 * ldb + k0, nn, kn, ldb, wb);  // B stored [N, K]: wb [nn, kn]
      else widen(B + k0 * ldb + n0, kn, nn, ldb, wb);  // B stored [K, N]: wb [kn, nn]
      for (int64_t m0 = 0; m0 < M; m0 += mb) {
        const int64_t mn = std::min(mb, M - m0);
        if (ta) widen(A + k0 * lda + m0, kn, mn, lda, wa);  // A stored [K, M]: wa [kn, mn]
        else widen(A + m0 * lda + k0, mn, kn, lda, wa);  // A stored [M, K]: wa [mn, kn]
        gemm_f32_on(set, ta, tb, mn, nn, kn, alpha, wa, ta ? mn : kn, wb, tb ? kn : nn, chunk_beta, C + m0 * ldc + n0,
                    ldc);
      }
    }
  }
}

}  // namespace

namespace {

// Best GFLOP/s of a few n^3 products of one kind (after one warm-up call),
// on this thread's CPU clock: a rank sharing its cores with others (an
// oversubscribed mpiexec) is not charged for the time it waits, so every
// rank sees the same rates and makes the same choice.
template <typename Product>
double best_gflops(int64_t n, Product product) {
  auto thread_seconds = [] {
    timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  };
  product();
  double best = 0.0;
  for (int rep = 0; rep < 5; ++rep) {
    const double start = thread_seconds();
    product();
    best = std::max(best, 2.0 * n * n * n / (thread_seconds() - start) / 1e9);
  }
  return best;
}

constexpr int64_t kTimedN = 512;

}  // namespace

bool gemm_bf16_matmul_available() {
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const unsigned bf16_isa = dnnl_cpu_isa_avx512_core_bf16;  // ISA values are nested bit sets
  constexpr int64_t n = kTimedN;
  // Created before any thread count drops: oneDNN keeps a primitive's
  // thread count from its creation (later calls at this shape use them all).
  return (isa & bf16_isa) == bf16_isa && !bf16_gemm_for({false, false, n, n, n, n, n, n, 1.0f, 0.0f}).widen;
}

Bf16GemmRates time_gemm_bf16_paths() {
  constexpr int64_t n = kTimedN;
  if (!gemm_bf16_matmul_available()) return {};
  std::vector<bf16> a(n * n, bf16(0.5f)), b(n * n, bf16(0.25f));
  std::vector<float> c(n * n);
  // On the calling thread alone (oneDNN threads a call by
  // omp_get_max_threads(); inside a parallel region it runs single anyway),
  // the thread count restored however the timing ends.
  struct SingleThread {
    int threads = omp_get_max_threads();
    SingleThread() { omp_set_num_threads(1); }
    ~SingleThread() { omp_set_num_threads(threads); }
  } single;
  const KernelSet plain{};  // the widened path's defaults
  Bf16GemmRates rates;
  rates.native_gflops = best_gflops(n, [&] {
    bf16_matmul(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  rates.widened_gflops = best_gflops(n, [&] {
    widened_bf16_gemm(plain, false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
  return rates;
}

void gemm_bf16_on(const KernelSet& set, Bf16GemmPath path, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                  float alpha, const bf16* A, int64_t lda, const bf16* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) {
  if (M == 0 || N == 0) return;
  if (path != Bf16GemmPath::native || bf16_gemm_for({ta, tb, M, N, K, lda, ldb, ldc, alpha, beta}).widen)
    return widened_bf16_gemm(set, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  gemm_in_pieces(set.gemm_thread_count_independent, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
                 bf16_matmul);
}

void gemm_bf16(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const bf16* A, int64_t lda,
               const bf16* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  check_shape(K > 0 && lda >= (ta ? M : K) && ldb >= (tb ? K : N) && ldc >= N,
              "gemm_bf16: leading dimensions smaller than the rows they hold");
  launch(KernelId::gemm, device_of(C), 2.0 * double(M) * double(N) * double(K), [&](const KernelSet& set) {
    gemm_bf16_on(set, set.gemm_bf16_path(), ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  });
}

void gemm(DType dtype, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A, int64_t lda,
          const void* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (dtype == DType::bf16)
    gemm_bf16(ta, tb, M, N, K, alpha, static_cast<const bf16*>(A), lda, static_cast<const bf16*>(B), ldb, beta, C,
              ldc);
  else
    gemm_f32(ta, tb, M, N, K, alpha, static_cast<const float*>(A), lda, static_cast<const float*>(B), ldb, beta, C,
             ldc);
}

std::string gemm_bf16_implementation(int64_t n) {
  const CachedGemm& g = bf16_gemm_for({false, false, n, n, n, n, n, n, 1.0f, 0.0f});
  if (g.widen) return "bf16 widened to fp32, dnnl_sgemm (no bf16 matmul on this CPU)";
  const KernelSet& set = device_of(static_cast<const void*>(nullptr)).kernels();
  if (set.gemm_bf16_path() != Bf16GemmPath::native)
    return "bf16 widened to fp32, dnnl_sgemm (" + std::string(set.gemm_bf16 == Bf16GemmPath::automatic ? "faster here than " : "pinned instead of ") +
           g.implementation + ")";
  return g.implementation;
}

int64_t gemm_bf16_widen_scratch_floats() { return int64_t(t_widen_scratch.size()); }

double measure_gemm_gflops(DType dtype, int64_t n, double min_seconds) {
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  std::vector<bf16> a16(n * n, bf16(0.5f)), b16(n * n, bf16(0.25f));
  const bool low = dtype == DType::bf16;
  auto once = [&] {
    gemm(dtype, false, false, n, n, n, 1.0f, low ? (const void*)a16.data() : a.data(), n,
         low ? (const void*)b16.data() : b.data(), n, 0.0f, c.data(), n);
  };
  once();  // warm-up: page faults, oneDNN dispatch
  double best = 0.0;
  Timer total;
  int reps = 0;
  while (total.seconds() < min_seconds || reps < 3) {
    Timer t;
    once();
    best = std::max(best, 2.0 * n * n * n / t.seconds() / 1e9);
    ++reps;
  }
  return best;
}

}  // namespace longctx
