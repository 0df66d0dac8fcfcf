// Reductions in a fixed order: the attention kernel (forward and backward),
// RMSNorm, cross-entropy and the embedding backward give bit-identical
// results at 1, 2, 3 and 4 OpenMP threads, on shapes that are not multiples
// of the attention tile or of the row chunks. (GEMMs outside the kernels are
// oneDNN's threaded sgemm, bit-exact only at a fixed thread count: see
// README "Determinism"; test_train checks whole runs.)
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pinned_kernels.h"
#include "kernels/attention/attention.h"
#include "kernels/ops.h"
#include "random_data.h"

using namespace longctx;

namespace {

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Runs `f` at each thread count and expects every result to equal the
// 1-thread one bit for bit. Restores the thread count.
template <class F>
void expect_same_at_every_thread_count(F f, const std::string& what) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<std::vector<float>> one = f();
  for (int threads : {2, 3, 4, 1, 2}) {
    omp_set_num_threads(threads);
    const std::vector<std::vector<float>> got = f();
    for (size_t i = 0; i < one.size(); ++i)
      EXPECT_TRUE(same_bits(got[i], one[i])) << what << ": output " << i << " at " << threads << " threads";
  }
  omp_set_num_threads(saved);
}

struct AttentionProblem {
  int64_t S, H, G, D;
  MaskSpec mask;
  std::vector<int64_t> pos;
  std::vector<int32_t> seg;
  std::vector<float> q, k, v, dout, dq0;
};

AttentionProblem attention_problem(int64_t S, int64_t H, int64_t G, int64_t D, MaskSpec mask) {
  AttentionProblem p{S, H, G, D, mask, {}, {}, {}, {}, {}, {}, {}};
  p.pos.resize(S);
  std::iota(p.pos.begin(), p.pos.end(), 0);
  for (int64_t t = 0; t < S; ++t) p.seg.push_back(static_cast<int32_t>(t * 3 / S));
  p.q = random_vec(S * H * D, 1, 1.5f);
  p.k = random_vec(S * G * D, 2, 1.5f);
  p.v = random_vec(S * G * D, 3);
  p.dout = random_vec(S * H * D, 4);
  p.dq0 = random_vec(S * H * D, 5, 0.1f);  // dQ accumulates: start from nonzero
  return p;
}

// o, lse, dq, dk, dv of one forward + backward.
std::vector<std::vector<float>> run_attention(AttentionProblem& p) {
  const int64_t S = p.S, H = p.H, G = p.G, D = p.D;
  auto view = [&](std::vector<float>& d, int64_t heads) {
    return TensorView::strided(d.data(), DType::f32, {1, S, heads, D}, {S * heads * D, heads * D, D, 1});
  };
  AttentionArgs a;
  a.q = view(p.q, H), a.k = view(p.k, G), a.v = view(p.v, G);
  a.q_pos = a.kv_pos = p.pos.data();
  if (p.mask.same_segment) a.q_seg = a.kv_seg = p.seg.data();
  a.mask = p.mask;
  std::vector<float> o(S * H * D), lse(S * H), delta(S * H), dq = p.dq0, dk(S * G * D, 0.0f),
      dv(S * G * D, 0.0f);
  attention_forward(a, view(o, H), lse.data());
  attention_delta(view(o, H), view(p.dout, H), delta.data());
  attention_backward(a, view(p.dout, H), lse.data(), delta.data(), view(dq, H), view(dk, G), view(dv, G));
  return {o, lse, dq, dk, dv};
}

// The same in bf16 (q, k, v, dO and O bf16; lse, dQ, dK, dV fp32).
std::vector<std::vector<float>> run_attention_bf16(const AttentionProblem& p) {
  const int64_t S = p.S, H = p.H, G = p.G, D = p.D;
  auto rounded = [](const std::vector<float>& x) {
    std::vector<bf16> y;
    for (float e : x) y.push_back(bf16(e));
    return y;
  };
  std::vector<bf16> q = rounded(p.q), k = rounded(p.k), v = rounded(p.v), dout = rounded(p.dout), o(S * H * D);
  auto view = [&](void* d, DType t, int64_t heads) {
    return TensorView::strided(d, t, {1, S, heads, D}, {S * heads * D, heads * D, D, 1});
  };
  AttentionArgs a;
  a.q = view(q.data(), DType::bf16, H), a.k = view(k.data(), DType::bf16, G), a.v = view(v.data(), DType::bf16, G);
  a.q_pos = a.kv_pos = p.pos.data();
  if (p.mask.same_segment) a.q_seg = a.kv_seg = p.seg.data();
  a.mask = p.mask;
  std::vector<float> lse(S * H), delta(S * H), dq = p.dq0, dk(S * G * D, 0.0f), dv(S * G * D, 0.0f);
  attention_forward(a, view(o.data(), DType::bf16, H), lse.data());
  attention_delta(view(o.data(), DType::bf16, H), view(dout.data(), DType::bf16, H), delta.data());
  attention_backward(a, view(dout.data(), DType::bf16, H), lse.data(), delta.data(), view(dq.data(), DType::f32, H),
                     view(dk.data(), DType::f32, G), view(dv.data(), DType::f32, G));
  std::vector<float> o32;
  for (bf16 e : o) o32.push_back(float(e));
  return {o32, lse, dq, dk, dv};
}

}  // namespace

// bf16_dot, where the CPU has its kernels, on the same terms: its backward
// shares the fused paths' units and dQ order (units of 8 kv blocks forced).
TEST(Determinism, Bf16DotAttentionIsBitIdenticalAtAnyThreadCount) {
  if (!attention_dot_tiles_supported()) GTEST_SKIP() << "no AVX512-BF16 or AMX-BF16 on this CPU";
  const PinnedKernels pinned(KernelPin{AttentionTilePath::bf16_dot, nullptr, 8});
  for (const char* mask : {"causal", "local:300"}) {
    const AttentionProblem p = attention_problem(1000, 4, 2, 64, MaskSpec::parse(mask));
    expect_same_at_every_thread_count([&] { return run_attention_bf16(p); },
                                      mask + (" " + attention_tile_path_name(AttentionTilePath::bf16_dot)));
  }
}

TEST(Determinism, AttentionIsBitIdenticalAtAnyThreadCount) {
  // 1000 = 7 full tiles + 104 rows; GQA so that a unit covers two heads.
  // Both fp32 tile paths: sgemm tiles, and the fused kernels where the CPU
  // has them, their backward in units of 4 kv blocks (dQ summed per unit,
  // in unit order; local:300 has rows whose first unit with a tile is not
  // the first). Units of 1 run the same schedule with groups of one, as
  // the sgemm tiles do (CI time: the fused kernels are slow under ASan).
  std::vector<std::pair<AttentionTilePath, int64_t>> cases = {{AttentionTilePath::f32, 0}};
  if (attention_fused_tiles_supported()) cases.push_back({AttentionTilePath::f32_fused, 4});
  for (auto [path, kv_blocks] : cases)
    for (const char* mask : {"full", "causal", "local:300", "causal+segments"}) {
      AttentionProblem p = attention_problem(1000, 4, 2, 64, MaskSpec::parse(mask));
      const PinnedKernels pinned(KernelPin{path, nullptr, kv_blocks});
      expect_same_at_every_thread_count([&] { return run_attention(p); },
                                        mask + (" " + attention_tile_path_name(path)) + ", backward units of " +
                                            std::to_string(kv_blocks) + " kv blocks");
    }
}

TEST(Determinism, RmsnormIsBitIdenticalAtAnyThreadCount) {
  // More rows than the fixed chunks (so chunks hold several rows) and an
  // odd row count and width.
  for (int64_t N : {1, 7, 1001, 3001}) {
    const int64_t C = 333;
    const std::vector<float> x = random_vec(N * C, 11), dy = random_vec(N * C, 12), w = random_vec(C, 13),
                             dx0 = random_vec(N * C, 14, 0.1f), dw0 = random_vec(C, 15, 0.1f);
    expect_same_at_every_thread_count(
        [&] {
          std::vector<float> xs = x, dys = dy, y(N * C), dx = dx0, dw = dw0;
          auto v = [&](std::vector<float>& d) { return TensorView::strided(d.data(), DType::f32, {N, C}, {C, 1}); };
          rmsnorm_forward(v(xs), w.data(), 1e-5, v(y));
          rmsnorm_backward(v(xs), w.data(), 1e-5, v(dys), v(dx), dw.data());
          return std::vector<std::vector<float>>{y, dx, dw};
        },
        "rmsnorm N=" + std::to_string(N));
  }
}

TEST(Determinism, CrossEntropyIsBitIdenticalAtAnyThreadCount) {
  const int64_t R = 1001, V = 259;
  const std::vector<float> logits = random_vec(R * V, 21, 3.0f), weights = random_vec(R, 22);
  std::vector<int32_t> targets(R);
  for (int64_t r = 0; r < R; ++r) targets[r] = static_cast<int32_t>((r * 97) % V);
  expect_same_at_every_thread_count(
      [&] {
        std::vector<float> z = logits, dz(R * V);
        const TensorView zv = TensorView::strided(z.data(), DType::f32, {R, V}, {V, 1});
        const TensorView dzv = TensorView::strided(dz.data(), DType::f32, {R, V}, {V, 1});
        const double loss = cross_entropy(zv, targets.data(), weights.data(), 0.5f, &dzv);
        std::vector<float> loss_bits(2);
        std::memcpy(loss_bits.data(), &loss, sizeof loss);  // the double's bits
        return std::vector<std::vector<float>>{loss_bits, dz};
      },
      "cross_entropy");
}

TEST(Determinism, EmbeddingBackwardIsBitIdenticalAtAnyThreadCount) {
  const int64_t n = 1001, C = 333, vocab = 50;
  const std::vector<float> dout = random_vec(n * C, 31), table0 = random_vec(vocab * C, 32, 0.1f);
  std::vector<int32_t> tokens(n);
  for (int64_t t = 0; t < n; ++t) tokens[t] = static_cast<int32_t>((t * 7) % vocab);
  expect_same_at_every_thread_count(
      [&] {
        std::vector<float> d = dout, table = table0;
        embedding_backward(tokens.data(), n, TensorView::strided(d.data(), DType::f32, {n, C}, {C, 1}),
                           table.data(), vocab);
        return std::vector<std::vector<float>>{table};
      },
      "embedding_backward");
}
