// gemm_bf16 against a float64 reference of the same bf16 inputs: every
// transpose, odd shapes, alpha and beta (accumulate), leading dimensions wider
// than the rows, and concurrent calls from OpenMP threads.
#include <gtest/gtest.h>

#include <optional>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/gemm.h"
#include "pinned_kernels.h"

using namespace longctx;

namespace {

struct Problem {
  int64_t M, N, K;
  bool ta, tb;
  float alpha, beta;
};

// Row-major storage of an op()-ed matrix: [rows, cols] or, transposed, [cols, rows]; ld adds padding.
std::vector<bf16> random_bf16(int64_t elements, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<bf16> v(elements);
  for (bf16& x : v) x = bf16(normal(rng));
  return v;
}

// Runs one problem; returns the largest error over its bound (<= 1 passes).
double worst_error_over_bound(const Problem& p, uint32_t seed) {
  std::mt19937 rng(seed);
  const int64_t lda = (p.ta ? p.M : p.K) + 3, ldb = (p.tb ? p.K : p.N) + 1, ldc = p.N + 2;
  const std::vector<bf16> A = random_bf16((p.ta ? p.K : p.M) * lda, rng), B = random_bf16((p.tb ? p.N : p.K) * ldb, rng);
  // beta = 0: C holds NaN, which must not reach the result (C is not read).
  std::vector<float> C(p.M * ldc);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& x : C) x = p.beta == 0.0f ? std::nanf("") : normal(rng);
  const std::vector<float> C0 = C;
  gemm_bf16(p.ta, p.tb, p.M, p.N, p.K, p.alpha, A.data(), lda, B.data(), ldb, p.beta, C.data(), ldc);
  // op(A) [M, K] and op(B)^T [N, K] in float64, so the reference reads both along K.
  std::vector<double> a(p.M * p.K), bt(p.N * p.K);
  for (int64_t i = 0; i < p.M; ++i)
    for (int64_t k = 0; k < p.K; ++k) a[i * p.K + k] = float(p.ta ? A[k * lda + i] : A[i * lda + k]);
  for (int64_t j = 0; j < p.N; ++j)
    for (int64_t k = 0; k < p.K; ++k) bt[j * p.K + k] = float(p.tb ? B[j * ldb + k] : B[k * ldb + j]);
  double worst = 0;
  for (int64_t i = 0; i < p.M; ++i)
    for (int64_t j = 0; j < p.N; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t k = 0; k < p.K; ++k) {
        const double product = a[i * p.K + k] * bt[j * p.K + k];
        exact += product, magnitude += std::fabs(product);
      }
      const double c0 = p.beta == 0.0f ? 0.0 : C0[i * ldc + j];
      exact = p.alpha * exact + p.beta * c0;
      // bf16 x bf16 products are exact in fp32; fp32 accumulation of K terms
      // (any order) errs by at most K ulps of the magnitude, plus the scaling
      // and the sum with beta C.
      const double bound = (p.K + 4) * std::ldexp(1.0, -23) * (std::fabs(p.alpha) * magnitude + std::fabs(p.beta * c0)) + 1e-30;
      const double error = std::fabs(double(C[i * ldc + j]) - exact) / bound;
      worst = std::isnan(error) ? INFINITY : std::max(worst, error);
    }
  // Padding between rows is never written (bit for bit: it may hold NaN).
  for (int64_t i = 0; i < p.M; ++i)
    EXPECT_EQ(std::memcmp(&C[i * ldc + p.N], &C0[i * ldc + p.N], (ldc - p.N) * sizeof(float)), 0) << "row " << i;
  return worst;
}

}  // namespace

// Both paths on every CPU: native (oneDNN's bf16 matmul, or widened where
// oneDNN has none for this CPU) and widened. The blocked cases, under a
// 2^14-float widening budget (blocks of 256: gemm.cpp, widen_blocks), cut
// K = 600 into 3 chunks, M = 700 rows of op(A) into 3 blocks and N = 700
// columns of op(B) into 3 blocks, for every transpose, beta 0 (C NaN) and
// accumulating, and one row.
// The CPU's kernel set with gemm_bf16 on `path`, widening within `widen_floats`.
KernelSet gemm_set(Bf16GemmPath path, int64_t widen_floats = int64_t(1) << 24, bool independent = false) {
  KernelSet set = cpu_kernel_set();
  set.gemm_bf16 = path;
  set.gemm_widen_floats = widen_floats;
  set.gemm_thread_count_independent = independent;
  return set;
}

TEST(GemmBf16, MatchesFloat64ReferenceForEveryTransposeAndScale) {
  std::printf("gemm_bf16 here: %s\n", gemm_bf16_implementation(64).c_str());
  for (Bf16GemmPath path : {Bf16GemmPath::native, Bf16GemmPath::widened}) {
    std::optional<PinnedKernels> pinned(std::in_place, gemm_set(path));
    SCOPED_TRACE(gemm_bf16_implementation(64));
    uint32_t seed = 1;
    for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1}, {7, 13, 5}, {33, 17, 129}, {96, 64, 200}})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, {0.5f, 1.0f}, {-2.0f, 1.5f}}) {
            const Problem p{M, N, K, ta, tb, alpha, beta};
            SCOPED_TRACE(testing::Message() << M << "x" << N << "x" << K << " ta=" << ta << " tb=" << tb
                                            << " alpha=" << alpha << " beta=" << beta);
            EXPECT_LE(worst_error_over_bound(p, seed++), 1.0);
          }
    pinned.emplace(gemm_set(path, 1 << 14));
    for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{700, 40, 600}, {40, 700, 600}, {1, 700, 600}})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const Problem p{M, N, K, ta, tb, 0.5f, ta == tb ? 0.0f : 1.5f};
          SCOPED_TRACE(testing::Message() << M << "x" << N << "x" << K << " ta=" << ta << " tb=" << tb);
          EXPECT_LE(worst_error_over_bound(p, seed++), 1.0);
        }
  }
}

// The widened path's copies stay within its budget however wide the product
// (a vocabulary-wide output: N cut into blocks) or deep (K cut into chunks).
TEST(GemmBf16, WidenedCopiesStayWithinTheirBudget) {
  const PinnedKernels pinned(gemm_set(Bf16GemmPath::widened, 1 << 20));
  EXPECT_LE(worst_error_over_bound({2, 40000, 64, false, true, 1.0f, 0.0f}, 11), 1.0);
  EXPECT_LE(worst_error_over_bound({3, 5, 9000, true, false, 1.0f, 1.0f}, 12), 1.0);
  EXPECT_GT(gemm_bf16_widen_scratch_floats(), 0);
  EXPECT_LE(gemm_bf16_widen_scratch_floats(), 1 << 20);
}

// The primitive cache is shared: threads running different shapes at once
// give what the same calls give one at a time on one thread (a GEMM's
// summation order may depend on its thread count, so both use one).
TEST(GemmBf16, ConcurrentCallsMatchSerialOnes) {
  // The last two: a product's piece and an attention tile, shapes at which
  // brg:avx512_core_bf16 packs B in its scratchpad (shared by concurrent
  // calls before gemm.cpp gave each thread its own: errors of 50).
  const std::vector<Problem> problems = {{17, 9, 31, false, true, 1, 0}, {8, 40, 16, true, false, 1, 1},
                                         {64, 64, 64, false, false, 0.5f, 0}, {5, 3, 300, true, true, 1, 0},
                                         {320, 96, 64, false, true, 1, 0}, {128, 128, 128, true, false, 1, 1}};
  // On the worker threads too: the set is passed, as the attention tiles pass theirs.
  auto run = [&](const KernelSet& set, const Problem& p, std::vector<float>& C) {
    std::mt19937 rng(7);
    const int64_t lda = p.ta ? p.M : p.K, ldb = p.tb ? p.K : p.N;
    const std::vector<bf16> A = random_bf16(p.M * p.K, rng), B = random_bf16(p.K * p.N, rng);
    C.assign(p.M * p.N, 1.0f);
    gemm_bf16_on(set, set.gemm_bf16, p.ta, p.tb, p.M, p.N, p.K, p.alpha, A.data(), lda, B.data(), ldb, p.beta,
                 C.data(), p.N);
  };
  for (Bf16GemmPath path : {Bf16GemmPath::native, Bf16GemmPath::widened}) {
    const KernelSet set = gemm_set(path);
    const PinnedKernels pinned(set);
    SCOPED_TRACE(gemm_bf16_implementation(64));
    std::vector<std::vector<float>> serial(problems.size()), parallel(problems.size() * 8);
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    for (size_t i = 0; i < problems.size(); ++i) run(set, problems[i], serial[i]);
    omp_set_num_threads(threads);
#pragma omp parallel for schedule(dynamic, 1) num_threads(4)
    for (int64_t t = 0; t < int64_t(parallel.size()); ++t) run(set, problems[t % problems.size()], parallel[t]);
    for (size_t t = 0; t < parallel.size(); ++t) EXPECT_EQ(parallel[t], serial[t % problems.size()]) << t;
  }
}

// gemm_f32 outside a parallel region, thread-count independent: the same bits at 1, 2 and 3 threads,
// for both ways it cuts a product (rows of C; K chunks for a short C over a
// long K, as the weight gradients are), and correct against float64.
TEST(GemmF32, BitIdenticalAtAnyThreadCountAndCorrect) {
  struct Shape { bool ta, tb; int64_t M, N, K; float beta; };
  const std::vector<Shape> shapes = {{false, true, 1100, 96, 64, 0.0f},   // forward: rows of C
                                     {false, false, 700, 64, 160, 1.0f},  // input gradient
                                     {true, false, 96, 80, 5000, 1.0f},   // weight gradient: K chunks
                                     {true, false, 300, 40, 4500, 0.5f},  // K chunks, beta scales C
                                     {false, false, 3, 5, 7, 0.0f}};      // one piece
  const int threads = omp_get_max_threads();
  for (const Shape& s : shapes) {
    SCOPED_TRACE(testing::Message() << "ta=" << s.ta << " tb=" << s.tb << " " << s.M << "x" << s.N << "x" << s.K);
    const int64_t lda = s.ta ? s.M : s.K, ldb = s.tb ? s.K : s.N;
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> A(s.M * s.K), B(s.K * s.N), C0(s.M * s.N);
    for (auto* v : {&A, &B, &C0})
      for (float& x : *v) x = normal(rng);
    // C after `product` at 1, 2 and 3 threads, each from C0.
    auto at_1_2_3_threads = [&](auto product) {
      std::vector<std::vector<float>> results;
      for (int t : {1, 2, 3}) {
        omp_set_num_threads(t);
        std::vector<float> C = C0;
        product(C.data());
        results.push_back(C);
      }
      return results;
    };
    std::optional<PinnedKernels> pinned(std::in_place, gemm_set(Bf16GemmPath::automatic, 1 << 24, true));
    const std::vector<std::vector<float>> out = at_1_2_3_threads([&](float* C) {
      gemm_f32(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), lda, B.data(), ldb, s.beta, C, s.N);
    });
    // gemm_bf16 on the same values rounded to bf16 (native pieces, or
    // widened then gemm_f32's pieces): bit-identical across threads too.
    std::vector<bf16> A16(A.size()), B16(B.size());
    round_to_bf16(A.data(), A16.data(), int64_t(A.size()));
    round_to_bf16(B.data(), B16.data(), int64_t(B.size()));
    // Both paths; widened under a small budget, so its cuts are in play too.
    for (Bf16GemmPath path : {Bf16GemmPath::native, Bf16GemmPath::widened}) {
      pinned.emplace(gemm_set(path, path == Bf16GemmPath::widened ? 1 << 14 : 1 << 24, true));
      const std::vector<std::vector<float>> out16 = at_1_2_3_threads([&](float* C) {
        gemm_bf16(s.ta, s.tb, s.M, s.N, s.K, 1.0f, A16.data(), lda, B16.data(), ldb, s.beta, C, s.N);
      });
      EXPECT_TRUE(out16[1] == out16[0]) << gemm_bf16_implementation(64) << ": 2 threads differ from 1";
      EXPECT_TRUE(out16[2] == out16[0]) << gemm_bf16_implementation(64) << ": 3 threads differ from 1";
    }
    pinned.reset();
    omp_set_num_threads(threads);
    EXPECT_TRUE(out[1] == out[0]) << "2 threads differ from 1";
    EXPECT_TRUE(out[2] == out[0]) << "3 threads differ from 1";
    double worst = 0;
    for (int64_t i = 0; i < s.M; ++i)
      for (int64_t j = 0; j < s.N; ++j) {
        double exact = s.beta * double(C0[i * s.N + j]), magnitude = std::fabs(exact);
        for (int64_t k = 0; k < s.K; ++k) {
          const double p = double(s.ta ? A[k * lda + i] : A[i * lda + k]) * double(s.tb ? B[j * ldb + k] : B[k * ldb + j]);
          exact += p, magnitude += std::fabs(p);
        }
        worst = std::max(worst, std::fabs(out[0][i * s.N + j] - exact) / ((s.K + 4) * std::ldexp(1.0, -23) * magnitude));
      }
    EXPECT_LE(worst, 1.0);
  }
}
