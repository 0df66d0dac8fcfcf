// The fast block-sparse attention kernel against the float64 reference, the
// reference against finite differences, KV sharding + merge against the
// unsplit result, and the tile counters against a brute-force count.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <type_traits>
#include <vector>

#include "kernels/attention/attention.h"
#include "kernels/attention/dot/dot.h"
#include "kernels/attention/fused/fused.h"
#include "kernels/attention/fused/fused_impl.h"
#include "kernels/simd/exp2_poly.h"
#include "kernels/simd/portable_lanes.h"
#include "pinned_kernels.h"
#include "random_data.h"
#include "run_command.h"

using namespace longctx;

namespace {

// max |a - b| / max |b| over finite entries; an infinity must match exactly.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i])) return INFINITY;
    if (std::isinf(b[i]) || std::isinf(a[i])) {
      if (a[i] != b[i]) return INFINITY;
      continue;
    }
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / den;
}

// Zigzag order of S positions over `ranks` ranks: rank r holds chunks r and
// 2 ranks - 1 - r (src/cp/layout.h); the ranks' pieces are concatenated.
std::vector<int64_t> zigzag_positions(int64_t S, int64_t ranks) {
  const int64_t chunk = S / (2 * ranks);
  std::vector<int64_t> pos;
  for (int64_t r = 0; r < ranks; ++r)
    for (int64_t c : {r, 2 * ranks - 1 - r})
      for (int64_t t = 0; t < chunk; ++t) pos.push_back(c * chunk + t);
  return pos;
}

std::vector<int64_t> iota_positions(int64_t n, int64_t start = 0) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), start);
  return p;
}

// Segment ids of `docs` equal documents over positions in [0, total).
std::vector<int32_t> document_ids(const std::vector<int64_t>& pos, int64_t total, int64_t docs) {
  std::vector<int32_t> seg;
  for (int64_t p : pos) seg.push_back(static_cast<int32_t>(p * docs / total));
  return seg;
}

// One attention problem: B = 1 or more batch rows sharing positions.
// Q, dO are [B, Sq, H, D] and K, V [B, Skv, G, D] inside rows padded by
// `pad` floats per token, so every view is strided.
struct Problem {
  int64_t B = 1, Sq = 0, Skv = 0, H = 1, G = 1, D = 64, pad = 0;
  MaskSpec mask = MaskSpec::causal();
  std::vector<int64_t> q_pos, kv_pos;  // [Sq], [Skv] (same for every batch row)
  std::vector<int32_t> q_seg, kv_seg;  // empty unless mask.same_segment
  uint32_t seed = 1;
  // Nonzero: q . k rises by about this much (base 2, scaled) per 128 kv
  // rows (kAttentionTile), through d = 0 of q (all 32) and k (growing with
  // the kv row), so that a row's max moves from kv block to kv block.
  float score_rise = 0.0f;

  // Filled by init().
  std::vector<int64_t> q_pos_b, kv_pos_b;
  std::vector<int32_t> q_seg_b, kv_seg_b;
  std::vector<float> q, k, v, dout;

  int64_t q_row() const { return H * D + pad; }
  int64_t kv_row() const { return G * D + pad; }
  template <class T>  // float or bf16 storage
  static constexpr DType dtype_of() { return std::is_same_v<T, bf16> ? DType::bf16 : DType::f32; }
  template <class T>
  TensorView qview(std::vector<T>& d) const {
    return TensorView::strided(d.data(), dtype_of<T>(), {B, Sq, H, D}, {Sq * q_row(), q_row(), D, 1});
  }
  template <class T>
  TensorView kvview(std::vector<T>& d) const {
    return TensorView::strided(d.data(), dtype_of<T>(), {B, Skv, G, D},
                               {Skv * kv_row(), kv_row(), D, 1});
  }
  void init() {
    if (q_pos.empty()) q_pos = iota_positions(Sq, Skv - Sq);  // end-aligned
    if (kv_pos.empty()) kv_pos = iota_positions(Skv);
    for (int64_t b = 0; b < B; ++b) {
      q_pos_b.insert(q_pos_b.end(), q_pos.begin(), q_pos.end());
      kv_pos_b.insert(kv_pos_b.end(), kv_pos.begin(), kv_pos.end());
      q_seg_b.insert(q_seg_b.end(), q_seg.begin(), q_seg.end());
      kv_seg_b.insert(kv_seg_b.end(), kv_seg.begin(), kv_seg.end());
    }
    q = random_vec(B * Sq * q_row(), seed, 1.5f);
    k = random_vec(B * Skv * kv_row(), seed + 1, 1.5f);
    v = random_vec(B * Skv * kv_row(), seed + 2);
    dout = random_vec(B * Sq * q_row(), seed + 3);
    if (score_rise != 0.0f) {
      const double per_row = score_rise / (kAttentionTile * 32.0 * std::log2(std::exp(1.0)) / std::sqrt(double(D)));
      for (int64_t b = 0; b < B; ++b) {
        for (int64_t i = 0; i < Sq * H; ++i) q[b * Sq * q_row() + (i / H) * q_row() + (i % H) * D] = 32.0f;
        for (int64_t j = 0; j < Skv * G; ++j)
          k[b * Skv * kv_row() + (j / G) * kv_row() + (j % G) * D] = float(per_row * double(j / G));
      }
    }
  }
  AttentionArgs args(KernelImpl impl = KernelImpl::fast) {
    AttentionArgs a;
    a.q = qview(q);
    a.k = kvview(k);
    a.v = kvview(v);
    a.q_pos = q_pos_b.data();
    a.kv_pos = kv_pos_b.data();
    a.q_seg = mask.same_segment ? q_seg_b.data() : nullptr;
    a.kv_seg = mask.same_segment ? kv_seg_b.data() : nullptr;
    a.mask = mask;
    a.impl = impl;
    return a;
  }
};

struct Outputs {
  std::vector<float> o, lse, dq, dk, dv;
};

// Forward, then backward with the REFERENCE lse and delta (so that each
// kernel's backward is compared on the same inputs).
Outputs run(Problem& p, KernelImpl impl, const std::vector<float>* lse_in = nullptr,
            const std::vector<float>* delta_in = nullptr, AttentionStats* fwd_stats = nullptr,
            AttentionStats* bwd_stats = nullptr) {
  Outputs out;
  out.o.assign(p.B * p.Sq * p.q_row(), 0.0f);
  out.lse.assign(p.B * p.Sq * p.H, 0.0f);
  AttentionArgs a = p.args(impl);
  if (impl == KernelImpl::fast) attention_forward(a, p.qview(out.o), out.lse.data(), fwd_stats);
  else attention_forward_reference(a, p.qview(out.o), out.lse.data());
  std::vector<float> delta(p.B * p.Sq * p.H);
  attention_delta(p.qview(out.o), p.qview(p.dout), delta.data());
  out.dq.assign(p.B * p.Sq * p.q_row(), 0.0f);
  out.dk.assign(p.B * p.Skv * p.kv_row(), 0.0f);
  out.dv.assign(p.B * p.Skv * p.kv_row(), 0.0f);
  const float* lse = lse_in ? lse_in->data() : out.lse.data();
  const float* dl = delta_in ? delta_in->data() : delta.data();
  if (impl == KernelImpl::fast)
    attention_backward(a, p.qview(p.dout), lse, dl, p.qview(out.dq), p.kvview(out.dk),
                       p.kvview(out.dv), bwd_stats);
  else
    attention_backward_reference(a, p.qview(p.dout), lse, dl, p.qview(out.dq), p.kvview(out.dk),
                                 p.kvview(out.dv));
  return out;
}

std::vector<float> reference_delta(Problem& p, Outputs& ref) {
  std::vector<float> delta(p.B * p.Sq * p.H);
  attention_delta(p.qview(ref.o), p.qview(p.dout), delta.data());
  return delta;
}

constexpr double kTol = 2e-5;

// One key (Skv = 1): P = 1 and dS = P (dP - delta) = 0 in exact arithmetic,
// so dQ and dK are rounding alone. Their bound per element, from fp32's unit
// roundoff u and gamma_D = D u / (1 - D u) (a D-term dot product's relative
// error), for a row r of head h that sees the key (q, k, dO, v of the row):
//   dP = dO.v and delta = dO.o are D-term dots; o = v exactly (the
//     reference's O of one key, rounded to fp32, is v), so both paths get
//     the same fp32 delta, off by at most gamma_D a, a = sum_d |dO_d v_d|,
//     and the fast path's dP is off by at most gamma_D a too. So
//     |dS_fast| <= P 2 gamma_D a and |dS_ref| <= gamma_D a (float64 dP).
//   P = 2^(s - lse2) is 1 up to the rounding of the exponent: s = scale
//     log2e q.k off by gamma_D scale log2e sum|q k| + 3u |s| (the scale,
//     the constant, their product), lse2 by 3u |lse| log2e; 4u more for
//     exp2's own error and the subtraction. The test checks that this puts
//     P within 1.01 and bounds P by 1.01.
//   dK_d = scale sum_r dS_r q_rd and dQ_rd = scale dS_r k_d.
// Second-order terms (the rounding of those products and of the sum over at
// most a few hundred rows: relative < 1e-4) are covered by 10%. Rows that do
// not see the key have P = 0, so their dQ is exactly 0 on every path.
void expect_one_key_gradients_within_rounding(const Problem& p, const Outputs& fast, const Outputs& ref) {
  const double u = std::ldexp(1.0, -24), gamma = p.D * u / (1 - p.D * u), log2e = 1.4426950408889634;
  const double scale = 1.0 / std::sqrt(double(p.D));
  std::vector<double> dk_bound(p.B * p.kv_row(), 0.0);
  for (int64_t b = 0; b < p.B; ++b)
    for (int64_t r = 0; r < p.Sq; ++r)
      for (int64_t h = 0; h < p.H; ++h) {
        const double lse = ref.lse[(b * p.Sq + r) * p.H + h];
        if (std::isinf(lse)) {  // the row does not see the key: P = 0, dQ exactly 0
          for (int64_t d = 0; d < p.D; ++d) EXPECT_EQ(fast.dq[(b * p.Sq + r) * p.q_row() + h * p.D + d], 0.0f);
          continue;
        }
        const float* q = &p.q[(b * p.Sq + r) * p.q_row() + h * p.D];
        const float* dout = &p.dout[(b * p.Sq + r) * p.q_row() + h * p.D];
        const int64_t kv = b * p.kv_row() + (h / (p.H / p.G)) * p.D;
        double qk = 0.0, qk_abs = 0.0, a = 0.0;
        for (int64_t d = 0; d < p.D; ++d) {
          qk += double(q[d]) * p.k[kv + d];
          qk_abs += std::abs(double(q[d]) * p.k[kv + d]);
          a += std::abs(double(dout[d]) * p.v[kv + d]);
        }
        const double exponent_err = gamma * scale * log2e * qk_abs + 3 * u * std::abs(scale * log2e * qk) +
                                    3 * u * std::abs(lse) * log2e + 4 * u;
        ASSERT_LT(std::exp2(exponent_err), 1.01) << "P within 1.01 of 1, as the bound assumes";
        const double ds = 1.01 * 2 * gamma * a + gamma * a;  // fast's and the reference's
        for (int64_t d = 0; d < p.D; ++d) {
          const int64_t qi = (b * p.Sq + r) * p.q_row() + h * p.D + d;
          EXPECT_LE(std::abs(double(fast.dq[qi]) - ref.dq[qi]), 1.1 * scale * ds * std::abs(p.k[kv + d]) + 1e-30)
              << "dQ of row " << r << ", head " << h;
          dk_bound[kv + d] += scale * ds * std::abs(q[d]);
        }
      }
  for (size_t x = 0; x < dk_bound.size(); ++x)
    EXPECT_LE(std::abs(double(fast.dk[x]) - ref.dk[x]), 1.1 * dk_bound[x] + 1e-30) << "dK element " << x;
}

// O, LSE, dQ, dK, dV of the fast kernel within the fp32 tolerance of the reference.
void expect_within_tolerance(const Problem& p, const Outputs& fast, const Outputs& ref) {
  EXPECT_LE(rel_err(fast.o, ref.o), kTol) << "O";
  EXPECT_LE(rel_err(fast.lse, ref.lse), kTol) << "LSE";
  if (p.Skv > 1) {
    EXPECT_LE(rel_err(fast.dq, ref.dq), kTol) << "dQ";
    EXPECT_LE(rel_err(fast.dk, ref.dk), kTol) << "dK";
  } else {  // one key: P = 1, so dQ = dK = 0 exactly and only rounding is left
    expect_one_key_gradients_within_rounding(p, fast, ref);
  }
  EXPECT_LE(rel_err(fast.dv, ref.dv), kTol) << "dV";
}

// A tile path, and for bf16_dot the kernels it runs (null: the CPU's; a
// portable twin on any CPU).
struct PathVariant {
  AttentionTilePath path;
  const attn::DotTileKernels* dot = nullptr;
  int64_t kv_blocks = 0, q_blocks = 0;  // the backward's kv blocks, bf16_dot forward's q blocks per unit (0: automatic)
};
std::string name_of(const PathVariant& v) {
  return v.dot ? std::string("bf16 tiles, ") + v.dot->isa : attention_tile_path_name(v.path);
}
// The kernel set that runs `v` (for a PinnedKernels scope).
KernelPin pin_of(const PathVariant& v) { return {v.path, v.dot, v.kv_blocks, v.q_blocks}; }

// The backward's kv blocks per unit to test on a path: f32_fused's
// backward runs 1 and 4 (forced: these shapes are too small for the
// automatic 4); bf16_fused, whose arithmetic is f32_fused's on widened
// tiles, runs 4 (CI time); the gemm paths' always 1.
std::vector<int64_t> backward_kv_blocks_of(AttentionTilePath path) {
  if (path == AttentionTilePath::f32_fused) return {1, 4};
  if (path == AttentionTilePath::bf16_fused) return {4};
  if (path == AttentionTilePath::bf16_dot) return {1, 8};
  return {1};
}

// Every fp32 path this CPU runs: f32_fused where it has the fused kernels.
std::vector<AttentionTilePath> f32_paths() {
  std::vector<AttentionTilePath> paths = {AttentionTilePath::f32};
  if (attention_fused_tiles_supported()) paths.push_back(AttentionTilePath::f32_fused);
  return paths;
}

// Fast (each fp32 path) vs reference for O, LSE, dQ, dK, dV.
void expect_matches_reference(Problem p, const std::string& what) {
  p.init();
  Outputs ref = run(p, KernelImpl::reference);
  std::vector<float> delta = reference_delta(p, ref);
  for (AttentionTilePath path : f32_paths())
    for (int64_t kv_blocks : backward_kv_blocks_of(path)) {
      SCOPED_TRACE(what + " " + attention_tile_path_name(path) + ", backward units of " +
                   std::to_string(kv_blocks) + " kv blocks");
      const PinnedKernels pinned(KernelPin{path, nullptr, kv_blocks});
      Outputs fast = run(p, KernelImpl::fast, &ref.lse, &delta);
      expect_within_tolerance(p, fast, ref);
    }
}

Problem self_attention(int64_t S, int64_t H, int64_t G, int64_t D, MaskSpec mask,
                       int64_t docs = 3) {
  Problem p;
  p.Sq = p.Skv = S, p.H = H, p.G = G, p.D = D, p.mask = mask;
  if (mask.same_segment) {
    p.q_pos = p.kv_pos = iota_positions(S);
    p.q_seg = p.kv_seg = document_ids(p.q_pos, S, docs);
  }
  return p;
}

std::vector<MaskSpec> all_masks() {
  std::vector<MaskSpec> masks;
  for (const char* m : {"full", "causal", "local:37:5", "local:100", "chunked:96"})
    for (const char* suffix : {"", "+segments"}) masks.push_back(MaskSpec::parse(std::string(m) + suffix));
  return masks;
}

}  // namespace

TEST(Attention, EveryMaskWithAndWithoutSegmentsMatchesReference) {
  for (const MaskSpec& m : all_masks()) {
    Problem p = self_attention(267, 2, 1, 64, m);
    p.pad = 5;
    expect_matches_reference(p, m.to_string());
  }
}

TEST(Attention, GroupedQueryAttentionMatchesReference) {
  for (int64_t G : {8, 2, 1})  // 1:1, 4:1, 8:1
    expect_matches_reference(self_attention(130, 8, G, 32, MaskSpec::causal()),
                             "H=8 G=" + std::to_string(G));
}

TEST(Attention, SequenceLengthsNotMultiplesOfTheBlocksMatchReference) {
  for (int64_t S : {1, 7, 129, 267, 300})
    expect_matches_reference(self_attention(S, 2, 2, 64, MaskSpec::parse("causal+segments")),
                             "S=" + std::to_string(S));
  Problem p = self_attention(1030, 1, 1, 64, MaskSpec::parse("local:300+segments"), 2);
  p.B = 2;
  expect_matches_reference(p, "S=1030 B=2");
}

TEST(Attention, HeadDimsMatchReference) {
  for (int64_t D : {1, 3, 100, 128, 256}) {
    Problem p = self_attention(150, 2, 1, D, MaskSpec::causal());
    p.pad = 3;
    expect_matches_reference(p, "D=" + std::to_string(D));
  }
}

TEST(Attention, QueryAndKvLengthsDifferMatchReference) {
  for (auto [Sq, Skv] : {std::pair<int64_t, int64_t>{200, 333}, {333, 200}, {1, 150}, {150, 1}})
    for (const char* m : {"causal", "local:50:20", "full"}) {
      Problem p;
      p.Sq = Sq, p.Skv = Skv, p.H = 4, p.G = 2, p.D = 64, p.mask = MaskSpec::parse(m);
      expect_matches_reference(p, std::to_string(Sq) + "x" + std::to_string(Skv) + " " + m);
    }
}

TEST(Attention, ZigzagPositionsMatchReference) {
  const int64_t S = 640;  // 8 chunks of 80: block edges do not line up with chunk edges
  for (const char* m : {"causal", "local:100", "chunked:160", "causal+segments"}) {
    Problem p = self_attention(S, 2, 1, 64, MaskSpec::parse(m));
    p.q_pos = p.kv_pos = zigzag_positions(S, 4);
    if (p.mask.same_segment) p.q_seg = p.kv_seg = document_ids(p.q_pos, S, 3);
    expect_matches_reference(p, std::string("zigzag ") + m);
  }
}

TEST(Attention, FullyMaskedRowsGiveZeroOutputAndNoNaN) {
  // Segments that never match for the first half of the q rows.
  Problem seg = self_attention(200, 2, 1, 64, MaskSpec::parse("causal+segments"));
  for (int64_t i = 0; i < 100; ++i) seg.q_seg[i] = 99;
  // A local window that is away from every kv position for most q rows.
  Problem far;
  far.Sq = 300, far.Skv = 150, far.H = 2, far.G = 2, far.mask = MaskSpec::local(10, 0);
  far.q_pos = iota_positions(300, 100);  // rows at positions >= 160 see nothing
  for (Problem* p : {&seg, &far}) {
    expect_matches_reference(*p, "fully masked rows");
    p->init();
    for (AttentionTilePath path : f32_paths()) {
      SCOPED_TRACE(attention_tile_path_name(path));
      const PinnedKernels pinned(KernelPin{path});
      Outputs fast = run(*p, KernelImpl::fast);
      int64_t masked_rows = 0;
      for (int64_t r = 0; r < p->Sq * p->H; ++r) {
        if (fast.lse[r] != kNegInf) continue;
        ++masked_rows;
        const float* o = fast.o.data() + (r / p->H) * p->q_row() + (r % p->H) * p->D;
        for (int64_t x = 0; x < p->D; ++x) ASSERT_EQ(o[x], 0.0f);
      }
      EXPECT_GT(masked_rows, 0);
      for (const auto* t : {&fast.o, &fast.dq, &fast.dk, &fast.dv})
        for (float x : *t) ASSERT_TRUE(std::isfinite(x));
    }
  }
}

TEST(Attention, BackwardAccumulatesIntoGradients) {
  Problem p = self_attention(150, 2, 1, 64, MaskSpec::causal());
  p.init();
  Outputs once = run(p, KernelImpl::fast);
  std::vector<float> delta(p.B * p.Sq * p.H);
  attention_delta(p.qview(once.o), p.qview(p.dout), delta.data());
  AttentionArgs a = p.args();
  Outputs twice = once;  // add a second backward on top of the first
  attention_backward(a, p.qview(p.dout), once.lse.data(), delta.data(), p.qview(twice.dq),
                     p.kvview(twice.dk), p.kvview(twice.dv));
  for (auto [t, o] : {std::pair{&twice.dq, &once.dq}, {&twice.dk, &once.dk}, {&twice.dv, &once.dv}}) {
    std::vector<float> doubled(*o);
    for (float& x : doubled) x *= 2;
    EXPECT_LE(rel_err(*t, doubled), 1e-6);
  }
}

TEST(Attention, ReferenceImplDispatchesToTheReference) {
  Problem p = self_attention(70, 2, 1, 16, MaskSpec::causal());
  p.init();
  Outputs ref = run(p, KernelImpl::reference);
  Outputs via;
  via.o.assign(ref.o.size(), 0.0f);
  via.lse.assign(ref.lse.size(), 0.0f);
  AttentionStats stats;
  attention_forward(p.args(KernelImpl::reference), p.qview(via.o), via.lse.data(), &stats);
  EXPECT_EQ(via.o, ref.o);  // bitwise: the same code ran
  EXPECT_EQ(via.lse, ref.lse);
  EXPECT_EQ(stats.blocks_total, 0);
}

// Reference gradients against central differences of the reference forward,
// loss = sum(O * W) in float64, so dout = W.
TEST(Attention, ReferenceGradientsMatchFiniteDifferences) {
  for (const char* m : {"causal", "local:1:1+segments", "full"}) {
    SCOPED_TRACE(m);
    Problem p = self_attention(5, 2, 1, 3, MaskSpec::parse(m), 2);
    p.init();
    auto loss = [&]() {
      std::vector<float> o(p.B * p.Sq * p.q_row()), lse(p.B * p.Sq * p.H);
      attention_forward_reference(p.args(), p.qview(o), lse.data());
      double s = 0;
      for (size_t i = 0; i < o.size(); ++i) s += static_cast<double>(o[i]) * p.dout[i];
      return s;
    };
    Outputs ref = run(p, KernelImpl::reference);
    const double eps = 1e-2;
    for (auto [x, grad] : {std::pair{&p.q, &ref.dq}, {&p.k, &ref.dk}, {&p.v, &ref.dv}}) {
      double err = 0, mag = 1e-30;
      for (size_t i = 0; i < x->size(); ++i) {
        const float keep = (*x)[i];
        (*x)[i] = keep + eps;
        double up = loss();
        (*x)[i] = keep - eps;
        double down = loss();
        (*x)[i] = keep;
        double fd = (up - down) / (2 * eps);
        err = std::max(err, std::abs(fd - (*grad)[i]));
        mag = std::max(mag, std::abs(fd));
      }
      EXPECT_LE(err / mag, 2e-3);
    }
  }
}

// Ring attention: forward on each kv shard and merge; backward on each shard
// with the final lse and delta, summed. Both equal the unsplit result.
TEST(Attention, KvShardsMergeToTheUnsplitResult) {
  for (const char* m : {"causal", "local:200+segments", "full"})
    for (int shards : {2, 3, 5, 8}) {
      SCOPED_TRACE(std::string(m) + " shards=" + std::to_string(shards));
      const int64_t S = 400;
      Problem p = self_attention(S, 2, 1, 32, MaskSpec::parse(m));
      p.q_pos = p.kv_pos = zigzag_positions(S, 2);
      if (p.mask.same_segment) p.q_seg = p.kv_seg = document_ids(p.q_pos, S, 3);
      p.init();
      Outputs whole = run(p, KernelImpl::fast);
      std::vector<float> delta(p.Sq * p.H);
      attention_delta(p.qview(whole.o), p.qview(p.dout), delta.data());

      std::vector<float> o(whole.o.size(), 0.0f), lse(whole.lse.size(), kNegInf);
      std::vector<float> dq(whole.dq.size(), 0.0f), dk(whole.dk.size(), 0.0f),
          dv(whole.dv.size(), 0.0f);
      for (int s = 0; s < shards; ++s) {
        const int64_t j0 = S * s / shards, j1 = S * (s + 1) / shards;
        AttentionArgs a = p.args();
        auto shard = [&](const TensorView& t, std::vector<float>& d) {
          return TensorView::strided(d.data() + j0 * p.kv_row(), DType::f32, {1, j1 - j0, p.G, p.D},
                                     {t.stride[0], t.stride[1], t.stride[2], 1});
        };
        a.k = shard(a.k, p.k);
        a.v = shard(a.v, p.v);
        a.kv_pos = p.kv_pos_b.data() + j0;
        if (a.kv_seg) a.kv_seg = p.kv_seg_b.data() + j0;
        std::vector<float> o_part(o.size()), lse_part(lse.size());
        attention_forward(a, p.qview(o_part), lse_part.data());
        attention_merge(p.qview(o), lse.data(), p.qview(o_part), lse_part.data());
        attention_backward(a, p.qview(p.dout), whole.lse.data(), delta.data(), p.qview(dq),
                           shard(a.k, dk), shard(a.v, dv));
      }
      EXPECT_LE(rel_err(o, whole.o), 1e-5);
      EXPECT_LE(rel_err(lse, whole.lse), 1e-6);
      EXPECT_LE(rel_err(dq, whole.dq), 1e-5);
      EXPECT_LE(rel_err(dk, whole.dk), 1e-5);
      EXPECT_LE(rel_err(dv, whole.dv), 1e-5);
    }
}

TEST(Attention, MergeOfTwoEmptyPartsStaysEmpty) {
  std::vector<float> oa(4, 0.0f), ob(4, 0.0f), la(1, kNegInf), lb(1, kNegInf);
  TensorView va(oa.data(), DType::f32, {1, 1, 1, 4}), vb(ob.data(), DType::f32, {1, 1, 1, 4});
  attention_merge(va, la.data(), vb, lb.data());
  EXPECT_EQ(la[0], kNegInf);
  for (float x : oa) EXPECT_EQ(x, 0.0f);
}

namespace {

// Non-empty tiles of one (batch, head) by brute force over every pair.
int64_t nonempty_tiles(Problem& p) {
  const int64_t tile = kAttentionTile;
  int64_t count = 0;
  for (int64_t i0 = 0; i0 < p.Sq; i0 += tile)
    for (int64_t j0 = 0; j0 < p.Skv; j0 += tile) {
      bool any = false;
      for (int64_t i = i0; i < std::min(p.Sq, i0 + tile) && !any; ++i)
        for (int64_t j = j0; j < std::min(p.Skv, j0 + tile) && !any; ++j)
          any = p.mask.same_segment ? p.mask.allows(p.q_pos[i], p.kv_pos[j], p.q_seg[i], p.kv_seg[j])
                                    : p.mask.allows(p.q_pos[i], p.kv_pos[j]);
      count += any;
    }
  return count;
}

}  // namespace

TEST(Attention, ComputedBlocksAreExactlyTheNonEmptyTiles) {
  const int64_t S = 1100;
  for (const char* m : {"causal", "local:200", "local:64:64", "chunked:300", "causal+segments",
                        "full"}) {
    SCOPED_TRACE(m);
    Problem p = self_attention(S, 2, 1, 32, MaskSpec::parse(m), 4);  // 4 documents
    p.init();
    AttentionStats fwd, bwd;
    run(p, KernelImpl::fast, nullptr, nullptr, &fwd, &bwd);
    const int64_t tile = kAttentionTile;
    const int64_t tiles = ((S + tile - 1) / tile) * ((S + tile - 1) / tile);
    EXPECT_EQ(fwd.blocks_total, tiles * p.H);
    EXPECT_EQ(fwd.blocks_computed(), nonempty_tiles(p) * p.H);
    EXPECT_EQ(bwd.blocks_computed(), fwd.blocks_computed());
    EXPECT_EQ(bwd.blocks_full, fwd.blocks_full);
    if (std::string(m) == "full") {
      EXPECT_EQ(fwd.blocks_partial, 0);
    }
    if (std::string(m) == "causal") {
      EXPECT_EQ(fwd.blocks_partial, ((S + tile - 1) / tile) * p.H);
    }
  }
}

TEST(Attention, ZigzagBlocksAreConservativeNeverWrong) {
  const int64_t S = 1280;
  Problem p = self_attention(S, 1, 1, 32, MaskSpec::causal());
  p.q_pos = p.kv_pos = zigzag_positions(S, 4);
  p.init();
  AttentionStats stats;
  run(p, KernelImpl::fast, nullptr, nullptr, &stats);
  EXPECT_GE(stats.blocks_computed(), nonempty_tiles(p));
  EXPECT_LT(stats.blocks_computed(), stats.blocks_total);  // still skips most empty tiles
}

TEST(Attention, BlockedPairCountEqualsTheNaiveCount) {
  for (const char* m : {"causal", "local:100:7", "chunked:300", "causal+segments", "full"}) {
    Problem p = self_attention(777, 3, 1, 16, MaskSpec::parse(m));
    p.q_pos = p.kv_pos = zigzag_positions(776, 2);
    p.q_pos.push_back(776), p.kv_pos.push_back(776);
    if (p.mask.same_segment) p.q_seg = p.kv_seg = document_ids(p.q_pos, 777, 3);
    p.init();
    EXPECT_EQ(attention_unmasked_pairs_blocked(p.args()), attention_unmasked_pairs(p.args())) << m;
  }
}

TEST(MaskSpec, ParsesEveryFormAndRoundTrips) {
  EXPECT_EQ(MaskSpec::parse("local:128").left, 127);
  EXPECT_EQ(MaskSpec::parse("local:128").right, 0);
  EXPECT_EQ(MaskSpec::parse("local:3:4").right, 4);
  EXPECT_EQ(MaskSpec::parse("chunked:64").chunk, 64);
  EXPECT_TRUE(MaskSpec::parse("causal+segments").same_segment);
  for (const char* m : {"full", "causal", "local:3:4", "chunked:64+segments"})
    EXPECT_EQ(MaskSpec::parse(m).to_string(), m);
}

TEST(MaskSpec, RejectsMalformedMasks) {
  for (const char* bad : {"", "causl", "local:", "local:0", "local:x", "local:-1:3", "local:2:3:4",
                          "chunked:0", "chunked:-5", "chunked:1.5", "causal+segment",
                          "+segments", "full+segments+segments"})
    EXPECT_THROW(MaskSpec::parse(bad), ConfigError) << bad;
}

TEST(Attention, RejectsShapesItCannotRun) {
  Problem p = self_attention(10, 3, 2, 8, MaskSpec::causal());  // 3 % 2 != 0
  p.init();
  std::vector<float> o(p.q.size()), lse(p.Sq * p.H);
  EXPECT_THROW(attention_forward(p.args(), p.qview(o), lse.data()), ShapeError);

  Problem s = self_attention(10, 2, 1, 8, MaskSpec::parse("causal+segments"));
  s.init();
  AttentionArgs no_segments = s.args();
  no_segments.q_seg = no_segments.kv_seg = nullptr;
  std::vector<float> o2(s.q.size()), lse2(s.Sq * s.H);
  EXPECT_THROW(attention_forward(no_segments, s.qview(o2), lse2.data()), ShapeError);

  for (float scale : {-0.5f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    AttentionArgs scaled = s.args();
    scaled.mask = MaskSpec::causal(), scaled.scale = scale;
    EXPECT_THROW(attention_forward(scaled, s.qview(o2), lse2.data()), ShapeError) << scale;
  }

  AttentionArgs strided_head = s.args();  // head dim with stride 2
  strided_head.q.stride[3] = 2;
  EXPECT_THROW(attention_forward(strided_head, s.qview(o2), lse2.data()), ShapeError);
}

// ---- bf16 inputs ----------------------------------------------------------
//
// q, k, v, dO are rounded to bf16 once; the float64 reference reads the same
// bf16 values (exact when widened), so every difference is the kernel's.
// Error bounds, per element, from bf16's unit roundoff u = 2^-8 (8 significand
// bits, round to nearest: |bf16(x) - x| <= u |x|) and the fp32 kernel's own
// tolerance f = kTol * max|ref| (the fp32 accumulation term, held at these
// shapes by the tests above):
//   bf16_widened: the tiles are the exact fp32 values of the bf16 inputs and
//     every operation is the fp32 path, so the only new error is O rounded to
//     bf16 once: |O - O*| <= f + u (|O*| + f), with |O*| <= max|V| (O is a
//     convex combination of V rows). LSE, dQ, dK, dV (fp32) within f.
//   bf16_native: products of bf16 operands are exact in fp32, accumulation
//     is fp32, so the products of the inputs add nothing beyond f. P is
//     rounded to bf16 before P V and P^T dO: P~ = P (1 + d), |d| <= u, and the
//     softmax sum l uses the fp32 P, so O gains at most u sum_j P_j |V_j| / l
//     (<= u max|V|) before its own rounding, and dV gains u sum_i P_ij |dO_i|.
//     dS is rounded to bf16 before dS K and dS^T Q: dQ gains
//     u scale sum_j |dS_ij| |K_j| and dK gains u scale sum_i |dS_ij| |Q_i|.
//     LSE does not see either rounding (within f).
//     The dot kernels' exp2 (exp2_poly_bf16) is within e = kExp2Bf16Error
//     (relative) of 2^x: P gains e in both P V and l, so O gains at most
//     2 e sum_j P_j |V_j| / l, and each sum above 2 e of its own terms; the
//     rounding terms use u + 2 e (u/700 more), LSE f + e.
//   Every path: the scores are fp32 sums of D exact products, off by at
//     most g_D sum_d |q_d k_d| (g_D = D u32 / (1 - D u32), u32 = 2^-24), so
//     scale s is off by at most scale g_D M, with M the largest
//     sum_d |q_d k_d| of the problem (bounded by sum_d max|q_d| max|k_d|);
//     forming P's exponent from it (the scale's constant, its product, less
//     the max or the LSE) rounds three times more, u32 each of at most
//     scale M + max|LSE|. Their sum p_s is P's relative error, which f alone
//     does not cover where scores are large (|K| of 20: p_s about 4e-4). O
//     gains 2 p_s o_abs, dQ, dK, dV p_s times their sums, LSE p_s. (dP's own
//     fp32 sums move dS by P g_D sum_d |dO_d| |V_d|, which f covers here: no
//     test makes V or dO large.)
// The sums are computed in float64 from the reference's P and dS
// (attention_abs_terms_reference); BoundsCatchADroppedTileAndAWrongHead shows the bounds are tight
// enough to fail on real bugs.
namespace {

constexpr double kU = 1.0 / 256;  // bf16 unit roundoff, 2^-8

// Rounds the problem's inputs to bf16 in place and returns their bf16 copies.
struct Bf16Inputs {
  std::vector<bf16> q, k, v, dout;
};
Bf16Inputs round_to_bf16(Problem& p) {
  Bf16Inputs in;
  for (auto [x, y] : {std::pair{&p.q, &in.q}, {&p.k, &in.k}, {&p.v, &in.v}, {&p.dout, &in.dout}})
    for (float& e : *x) {
      y->push_back(bf16(e));
      e = float(y->back());
    }
  return in;
}

// Per element: the float64 sums the roundings are bounded by (attention_abs_terms_reference).
struct AbsTerms {
  std::vector<float> o, dq, dk, dv;
};
AbsTerms abs_terms(Problem& p, const std::vector<float>& lse, const std::vector<float>& delta) {
  AbsTerms t;
  t.o.assign(p.B * p.Sq * p.q_row(), 0.0f), t.dq.assign(t.o.size(), 0.0f);
  t.dk.assign(p.B * p.Skv * p.kv_row(), 0.0f), t.dv.assign(t.dk.size(), 0.0f);
  attention_abs_terms_reference(p.args(), p.qview(p.dout), lse.data(), delta.data(), p.qview(t.o),
                                p.qview(t.dq), p.kvview(t.dk), p.kvview(t.dv));
  return t;
}

double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float e : x)
    if (std::isfinite(e)) m = std::max(m, std::abs(double(e)));
  return m;
}

// Elements of x outside ref +- bound(i) (an infinity must match exactly).
template <class Bound>
int64_t violations(const std::vector<float>& x, const std::vector<float>& ref, Bound bound) {
  int64_t n = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isinf(ref[i]) || !std::isfinite(x[i])) n += x[i] != ref[i];
    else n += std::abs(double(x[i]) - ref[i]) > bound(i);
  }
  return n;
}

struct Bf16Check {
  Problem p;          // initialised, inputs rounded to bf16
  Outputs ref, fast;  // fast: O as stored (bf16) widened back
  AbsTerms abs;
  double f_o, f_lse, f_dq, f_dk, f_dv;  // fp32 terms
  double p_s;                           // P's relative error from the scores' fp32 sums
  bool native;
  // Violations of each bound by `out` (O, LSE, dQ, dK, dV).
  std::array<int64_t, 5> violations_of(const Outputs& out) const {
    const double e = native ? attn::kExp2Bf16Error : 0.0;  // the short exp2's error
    const double u_p = (native ? kU + 2 * e : 0.0) + p_s;  // P and dS rounding (native paths), the scores' sums
    return {violations(out.o, ref.o,
                       [&](size_t i) {
                         const double before = f_o + (u_p + p_s) * abs.o[i];  // error before O is rounded
                         return before + kU * (std::abs(ref.o[i]) + before);
                       }),
            violations(out.lse, ref.lse, [&](size_t) { return f_lse + e + p_s; }),
            violations(out.dq, ref.dq, [&](size_t i) { return f_dq + u_p * abs.dq[i]; }),
            violations(out.dk, ref.dk, [&](size_t i) { return f_dk + u_p * abs.dk[i]; }),
            violations(out.dv, ref.dv, [&](size_t i) { return f_dv + u_p * abs.dv[i]; })};
  }
};

// The fast kernel on bf16 q, k, v, dO (bf16 O) on `path`, against the
// reference on the same values; backward with the reference LSE and delta.
Bf16Check run_bf16(Problem problem, PathVariant variant) {
  const AttentionTilePath path = variant.path;
  Bf16Check c;
  c.p = problem;
  Problem& p = c.p;
  p.init();
  Bf16Inputs in = round_to_bf16(p);
  c.native = attention_path_rounds_p_and_ds(path);
  c.ref = run(p, KernelImpl::reference);
  std::vector<float> delta = reference_delta(p, c.ref);
  // The reference reads bf16 views as their exact values: bitwise the same.
  {
    AttentionArgs a = p.args(KernelImpl::reference);
    a.q = p.qview(in.q), a.k = p.kvview(in.k), a.v = p.kvview(in.v);
    std::vector<float> o(c.ref.o.size(), 0.0f), lse(c.ref.lse.size());
    attention_forward_reference(a, p.qview(o), lse.data());
    EXPECT_EQ(o, c.ref.o);
    EXPECT_EQ(lse, c.ref.lse);
  }
  c.abs = abs_terms(p, c.ref.lse, delta);
  c.f_o = kTol * max_abs(c.ref.o), c.f_lse = kTol * max_abs(c.ref.lse), c.f_dq = kTol * max_abs(c.ref.dq);
  c.f_dk = kTol * max_abs(c.ref.dk), c.f_dv = kTol * max_abs(c.ref.dv);
  {  // p_s = scale g_D M, M <= sum_d max|q_d| max|k_d| over every row and head
    std::vector<double> q_top(p.D, 0.0), k_top(p.D, 0.0);
    const auto tops = [&](const std::vector<float>& x, int64_t rows, int64_t heads, int64_t row, std::vector<double>& top) {
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < heads * p.D; ++i) top[i % p.D] = std::max(top[i % p.D], std::abs(double(x[r * row + i])));
    };
    tops(p.q, p.B * p.Sq, p.H, p.q_row(), q_top);
    tops(p.k, p.B * p.Skv, p.G, p.kv_row(), k_top);
    double M = 0;
    for (int64_t d = 0; d < p.D; ++d) M += q_top[d] * k_top[d];
    const double u32 = 0x1p-24, g_D = double(p.D) * u32 / (1 - double(p.D) * u32);
    const double scale = p.args().scale > 0 ? p.args().scale : 1 / std::sqrt(double(p.D));
    c.p_s = scale * g_D * M + 3 * u32 * (scale * M + max_abs(c.ref.lse));
  }

  const PinnedKernels pinned(pin_of(variant));
  EXPECT_EQ(attention_tile_path(DType::bf16), path);
  AttentionArgs a = p.args();
  a.q = p.qview(in.q), a.k = p.kvview(in.k), a.v = p.kvview(in.v);
  std::vector<bf16> o16(c.ref.o.size());
  c.fast.lse.assign(c.ref.lse.size(), 0.0f);
  attention_forward(a, p.qview(o16), c.fast.lse.data());
  for (bf16 x : o16) c.fast.o.push_back(float(x));
  c.fast.dq.assign(c.ref.dq.size(), 0.0f), c.fast.dk.assign(c.ref.dk.size(), 0.0f);
  c.fast.dv.assign(c.ref.dv.size(), 0.0f);
  attention_backward(a, p.qview(in.dout), c.ref.lse.data(), delta.data(), p.qview(c.fast.dq),
                     p.kvview(c.fast.dk), p.kvview(c.fast.dv));
  return c;
}

// The dot kernel sets: both portable twins everywhere, then the CPU's own
// where it has them.
std::vector<const attn::DotTileKernels*> dot_kernel_sets() {
  std::vector<const attn::DotTileKernels*> sets = {attn::dot_tile_kernels_portable_lanes(),
                                                   attn::dot_tile_kernels_portable_tiles()};
  for (const attn::DotTileKernels* k : {cpu_isa_kernels().dot_avx512bf16, cpu_isa_kernels().dot_amx})
    if (k) sets.push_back(k);
  return sets;
}

// Every bf16 path this CPU runs: bf16_fused only where it has the fused
// kernels (its arithmetic is bf16_widened's, so the same bounds hold);
// bf16_dot on both portable twins everywhere, and on the CPU's own
// kernels where it has them (their arithmetic is bf16_native's).
std::vector<PathVariant> bf16_paths() {
  std::vector<PathVariant> paths = {{AttentionTilePath::bf16_widened}, {AttentionTilePath::bf16_native}};
  if (attention_fused_tiles_supported()) paths.push_back({AttentionTilePath::bf16_fused});
  for (const attn::DotTileKernels* k : dot_kernel_sets()) paths.push_back({AttentionTilePath::bf16_dot, k});
  return paths;
}

void expect_bf16_within_bounds(Problem p, const std::string& what) {
  for (const PathVariant& path : bf16_paths())
    for (int64_t kv_blocks : backward_kv_blocks_of(path.path)) {
      // bf16_dot: forward units of 8 q blocks with the backward's 8 kv blocks
      // (what long sequences run), else 4 (what these short ones would).
      const int64_t q_blocks = path.path == AttentionTilePath::bf16_dot ? (kv_blocks == 8 ? 8 : 4) : 0;
      SCOPED_TRACE(what + " " + name_of(path) + ", backward units of " + std::to_string(kv_blocks) +
                   " kv blocks" + (q_blocks ? ", forward units of " + std::to_string(q_blocks) + " q blocks" : ""));
      PathVariant pinned = path;
      pinned.kv_blocks = kv_blocks, pinned.q_blocks = q_blocks;
      Bf16Check c = run_bf16(p, pinned);
      const auto v = c.violations_of(c.fast);
      EXPECT_EQ(v[0], 0) << "O";
      EXPECT_EQ(v[1], 0) << "LSE";
      EXPECT_EQ(v[2], 0) << "dQ";
      EXPECT_EQ(v[3], 0) << "dK";
      EXPECT_EQ(v[4], 0) << "dV";
    }
}

}  // namespace

TEST(AttentionBf16, EveryMaskWithinTheDerivedBounds) {
  for (const MaskSpec& m : all_masks()) {
    Problem p = self_attention(267, 2, 1, 64, m);
    p.pad = 5;
    expect_bf16_within_bounds(p, m.to_string());
  }
}

TEST(AttentionBf16, GroupedQueryAttentionWithinTheDerivedBounds) {
  for (int64_t G : {4, 2, 1})  // 1, 2, 4 q heads per kv head
    expect_bf16_within_bounds(self_attention(300, 4, G, 32, MaskSpec::parse("local:100")),
                              "H=4 G=" + std::to_string(G));
}

TEST(AttentionBf16, QueryAndKvLengthsDifferWithinTheDerivedBounds) {
  for (auto [Sq, Skv] : {std::pair<int64_t, int64_t>{200, 333}, {333, 200}, {1, 150}})
    for (const char* m : {"causal", "chunked:96"}) {
      Problem p;
      p.Sq = Sq, p.Skv = Skv, p.H = 4, p.G = 2, p.D = 64, p.mask = MaskSpec::parse(m);
      expect_bf16_within_bounds(p, std::to_string(Sq) + "x" + std::to_string(Skv) + " " + m);
    }
}

// The dot path's forward keeps a row's running max until a tile's P sums
// past 2^kLazyMax (2^16): scores that rise by 3 per kv block (P above 1, one
// pass), by 12 (the max moves, two passes), and fall (the first block's max
// holds), across blocks and lengths off them.
TEST(AttentionBf16, ScoresRisingAndFallingAcrossKvBlocksWithinTheDerivedBounds) {
  for (float rise : {3.0f, 12.0f, -12.0f})
    for (const char* m : {"causal", "full"}) {
      Problem p = self_attention(300, 2, 1, 64, MaskSpec::parse(m));
      p.score_rise = rise;
      expect_bf16_within_bounds(p, std::string(m) + ", scores rising by " + std::to_string(rise) + " per kv block");
    }
}

// Large scores: K's first component grows to 19.5 against Q's 32 (scores
// rising by 24 per kv block, to about 110 at the end), so the scores' own
// fp32 rounding may move P by up to p_s, about 4e-4, of itself: the term of the
// bounds the fp32 tolerance alone missed (without it the widened paths' dQ
// breaks them in 293 places).
TEST(AttentionBf16, LargeScoresWithinTheDerivedBounds) {
  Problem p = self_attention(600, 2, 1, 64, MaskSpec::parse("full"));
  p.score_rise = 24.0f;
  expect_bf16_within_bounds(p, "scores rising by 24 per kv block");
}

// The fused kernels' blocking: q rows in panels of 16 (AVX2) or 32
// (AVX-512), the last one padded; kv rows and head dims in register blocks
// of 6 or 8, the last one shorter; so lengths and head dims that are
// multiples of none of them, a single row, and GQA (each path runs;
// bf16_fused where the CPU has the fused kernels).
TEST(AttentionBf16, OddLengthsAndHeadDimsWithinTheDerivedBounds) {
  // 300 x 300 at D = 72: whole tiles of four panels (AMX's forward_run) with a head dim off 32.
  for (auto [Sq, Skv, D] :
       {std::array<int64_t, 3>{131, 131, 20}, {1, 37, 8}, {17, 259, 72}, {145, 7, 13}, {300, 300, 72}}) {
    Problem p;
    p.B = 2, p.Sq = Sq, p.Skv = Skv, p.H = 6, p.G = 2, p.D = D, p.mask = MaskSpec::causal();
    expect_bf16_within_bounds(p, std::to_string(Sq) + "x" + std::to_string(Skv) + " D=" + std::to_string(D));
  }
}

// Six q blocks: the bf16_dot forward's units of 8 q blocks (forced on the
// run with the backward's 8 kv blocks) hold more than the 4 the shorter
// problems fill, so the scratch slots of blocks 4 and 5 are used.
TEST(AttentionBf16, ForwardUnitsOfMoreThanFourQBlocksWithinTheDerivedBounds) {
  Problem p;
  p.B = 1, p.Sq = p.Skv = 700, p.H = 2, p.G = 1, p.D = 16, p.mask = MaskSpec::causal();
  expect_bf16_within_bounds(p, "700x700 D=16");
}

TEST(AttentionBf16, FullyMaskedRowsGiveZeroOutputMinusInfinityAndZeroGradients) {
  Problem seg = self_attention(200, 2, 1, 64, MaskSpec::parse("causal+segments"));
  for (int64_t i = 0; i < 100; ++i) seg.q_seg[i] = 99;  // the first 100 q rows see nothing
  for (const PathVariant& path : bf16_paths()) {
    SCOPED_TRACE(name_of(path));
    Bf16Check c = run_bf16(seg, path);
    const auto v = c.violations_of(c.fast);
    EXPECT_EQ(v[0] + v[1] + v[2] + v[3] + v[4], 0);
    for (int64_t r = 0; r < 100 * seg.H; ++r) {
      ASSERT_EQ(c.fast.lse[r], kNegInf);
      for (int64_t x = 0; x < seg.D; ++x) {
        const int64_t e = (r / seg.H) * seg.q_row() + (r % seg.H) * seg.D + x;
        ASSERT_EQ(c.fast.o[e], 0.0f);
        ASSERT_EQ(c.fast.dq[e], 0.0f);
      }
    }
  }
}

// The bounds are tight enough to fail on the bugs a kernel could have: the
// reference itself with one kv tile dropped (its keys masked out), and the
// right outputs with two q heads swapped.
TEST(AttentionBf16, BoundsCatchADroppedTileAndAWrongHead) {
  for (const PathVariant& path : bf16_paths()) {
    SCOPED_TRACE(name_of(path));
    Bf16Check c = run_bf16(self_attention(300, 2, 1, 64, MaskSpec::causal()), path);
    const Problem& p = c.p;
    const auto ok = c.violations_of(c.fast);
    EXPECT_EQ(ok[0] + ok[1] + ok[2] + ok[3] + ok[4], 0);

    Problem dropped = p;  // kv tile 1 (keys 128..255) never attended
    dropped.mask = MaskSpec::parse("causal+segments");
    dropped.q_seg_b.assign(p.Sq, 0);
    dropped.kv_seg_b.assign(p.Skv, 0);
    for (int64_t j = kAttentionTile; j < 2 * kAttentionTile; ++j) dropped.kv_seg_b[j] = 1;
    Outputs bug = run(dropped, KernelImpl::reference, &c.ref.lse, nullptr);
    const auto v = c.violations_of(bug);
    EXPECT_GT(v[0], p.D * p.H * 10) << "O with a dropped tile";
    EXPECT_GT(v[1], 10) << "LSE with a dropped tile";
    EXPECT_GT(v[3], p.D * 10) << "dK with a dropped tile";

    Outputs swapped = c.fast;  // heads 0 and 1 of O and dQ exchanged
    for (int64_t i = 0; i < p.Sq; ++i)
      for (int64_t x = 0; x < p.D; ++x)
        for (auto* t : {&swapped.o, &swapped.dq})
          std::swap((*t)[i * p.q_row() + x], (*t)[i * p.q_row() + p.D + x]);
    const auto w = c.violations_of(swapped);
    EXPECT_GT(w[0], p.Sq * p.D) << "O of the wrong head";
    EXPECT_GT(w[2], p.Sq * p.D) << "dQ of the wrong head";
  }
}

// A NaN in q or k makes O and LSE NaN in every row that attends to it (and
// a NaN in v makes O NaN there), on every path: never the zeros of a masked
// row. Rows that cannot see it stay finite (rows of q tile 0, which never
// meets kv tile 1, where the NaNs are), and the backward's gradients carry
// it on. Causal, S = 300, one head: q row 150, k row 200, v row 250.
TEST(AttentionBf16, NaNInputsReachTheOutputNeverLookMasked) {
  Problem p = self_attention(300, 1, 1, 32, MaskSpec::causal());
  p.init();
  Bf16Inputs in = round_to_bf16(p);  // p now holds the bf16 values: both dtypes see the same inputs
  const float nan = std::numeric_limits<float>::quiet_NaN();
  p.q[150 * p.q_row() + 3] = nan, p.k[200 * p.kv_row() + 5] = nan, p.v[250 * p.kv_row() + 7] = nan;
  in.q[150 * p.q_row() + 3] = bf16(nan), in.k[200 * p.kv_row() + 5] = bf16(nan), in.v[250 * p.kv_row() + 7] = bf16(nan);
  std::vector<PathVariant> paths;
  for (AttentionTilePath path : f32_paths()) paths.push_back({path});
  for (const PathVariant& path : bf16_paths()) paths.push_back(path);
  for (const PathVariant& variant : paths) {
    SCOPED_TRACE(name_of(variant));
    const AttentionTilePath path = variant.path;
    const bool f32 = path == AttentionTilePath::f32 || path == AttentionTilePath::f32_fused;
    const PinnedKernels pinned(pin_of(variant));
    AttentionArgs a = p.args();
    if (!f32) a.q = p.qview(in.q), a.k = p.kvview(in.k), a.v = p.kvview(in.v);
    std::vector<float> o(p.Sq * p.q_row(), 0.0f), lse(p.Sq);
    std::vector<bf16> o16(o.size());
    if (f32) attention_forward(a, p.qview(o), lse.data());
    else attention_forward(a, p.qview(o16), lse.data());
    if (!f32)
      for (size_t i = 0; i < o.size(); ++i) o[i] = float(o16[i]);
    auto row_all_nan = [&](int64_t r) {
      for (int64_t x = 0; x < p.D; ++x)
        if (!std::isnan(o[r * p.q_row() + x])) return false;
      return true;
    };
    for (int64_t r = 0; r < p.Sq; ++r) {
      SCOPED_TRACE("row " + std::to_string(r));
      if (r == 150 || r >= 200) {  // its q is NaN, or it sees key 200
        EXPECT_TRUE(std::isnan(lse[r]));
        EXPECT_TRUE(row_all_nan(r));
      } else if (r < kAttentionTile) {
        EXPECT_TRUE(std::isfinite(lse[r]));
        for (int64_t x = 0; x < p.D; ++x) ASSERT_TRUE(std::isfinite(o[r * p.q_row() + x]));
      }
    }
    // The backward, from this forward's LSE: a row whose LSE is NaN gives NaN gradients.
    std::vector<float> delta(p.Sq, 0.0f), dq(p.q.size(), 0.0f), dk(p.k.size(), 0.0f), dv(p.v.size(), 0.0f);
    attention_backward(a, f32 ? p.qview(p.dout) : p.qview(in.dout), lse.data(), delta.data(), p.qview(dq),
                       p.kvview(dk), p.kvview(dv));
    EXPECT_TRUE(std::isnan(dq[150 * p.q_row()]));
    EXPECT_TRUE(std::isfinite(dq[10 * p.q_row()]));
  }
}

TEST(AttentionBf16, DeltaReadsBf16AndFp32RowsAlike) {
  Problem p = self_attention(50, 3, 1, 24, MaskSpec::causal());
  p.init();
  Bf16Inputs in = round_to_bf16(p);
  std::vector<float> o32(p.q.size()), from32(p.Sq * p.H), mixed(p.Sq * p.H);
  for (size_t i = 0; i < o32.size(); ++i) o32[i] = float(in.q[i]);  // any bf16 values will do
  attention_delta(p.qview(o32), p.qview(p.dout), from32.data());
  attention_delta(p.qview(in.q), p.qview(in.dout), mixed.data());
  EXPECT_EQ(from32, mixed);  // the same fp32 sums of the same (exact) values
}

TEST(AttentionBf16, RejectsMixedInputDtypesAndBf16Gradients) {
  Problem p = self_attention(20, 2, 1, 8, MaskSpec::causal());
  p.init();
  Bf16Inputs in = round_to_bf16(p);
  std::vector<float> o(p.q.size()), lse(p.Sq * p.H);
  AttentionArgs a = p.args();
  a.k = p.kvview(in.k);  // q fp32, k bf16
  EXPECT_THROW(attention_forward(a, p.qview(o), lse.data()), ShapeError);
  a = p.args();
  a.q = p.qview(in.q), a.k = p.kvview(in.k), a.v = p.kvview(in.v);
  std::vector<bf16> dq(p.q.size());
  std::vector<float> dk(p.k.size()), dv(p.v.size()), delta(p.Sq * p.H);
  EXPECT_THROW(attention_backward(a, p.qview(in.dout), lse.data(), delta.data(), p.qview(dq), p.kvview(dk),
                                  p.kvview(dv)),
               ShapeError);
}

TEST(AttentionBf16, ScratchBytesFollowTheTilePath) {
  const int64_t b = kAttentionTile, D = 64;
  auto set_for = [](AttentionTilePath path) { return pinned_set({path}); };
  // fp32: s, then for each of 4 q blocks acc, m, l and a Q copy, then K, V copies.
  const int64_t f32 = attention_forward_scratch_bytes(D, 1, DType::f32, set_for(AttentionTilePath::f32));
  EXPECT_EQ(f32, (b * b + 4 * (b * D + 2 * b) + 6 * b * D) * 4);
  const int64_t f32_backward = attention_backward_scratch_bytes(D, 1, DType::f32, set_for(AttentionTilePath::f32));
  const KernelSet widened = set_for(AttentionTilePath::bf16_widened);
  EXPECT_EQ(attention_forward_scratch_bytes(D, 2, DType::bf16, widened), 2 * f32);
  EXPECT_EQ(attention_backward_scratch_bytes(D, 1, DType::bf16, widened), f32_backward);
  const KernelSet native = set_for(AttentionTilePath::bf16_native);  // bf16 tile copies plus one bf16 P/dS tile
  EXPECT_EQ(attention_forward_scratch_bytes(D, 1, DType::bf16, native),
            (b * b + 4 * (b * D + 2 * b)) * 4 + (6 * b * D + b * b) * 2);
  EXPECT_EQ(attention_backward_scratch_bytes(D, 1, DType::bf16, native),
            (2 * b * b + 3 * b * D) * 4 + (4 * b * D + b * b) * 2);
  // An accelerator's kernels keep their tiles on chip: no scratch, whatever the host has.
  const KernelSet accelerator = counting_kernel_set(KernelTarget::accelerator);
  for (DType dt : {DType::f32, DType::bf16}) {
    EXPECT_EQ(attention_forward_scratch_bytes(D, 4, dt, accelerator), 0);
    EXPECT_EQ(attention_backward_scratch_bytes(D, 4, dt, accelerator), 0);
  }
  if (attention_fused_tiles_supported()) {
    // Forward: fp32 tile copies plus alpha [b]. Backward, for units of 4 kv
    // blocks: s, dp; per kv block dK, dV accumulators, and row-major Q, dO,
    // with rows padded to the panel; dQ; per kv block K, V; Q, dO panels;
    // lse2, delta and ones [b].
    const int64_t panel = cpu_kernel_set().fused->panel;
    for (AttentionTilePath fused : {AttentionTilePath::f32_fused, AttentionTilePath::bf16_fused}) {
      const KernelSet set = set_for(fused);
      const DType dt = fused == AttentionTilePath::f32_fused ? DType::f32 : DType::bf16;
      EXPECT_EQ(attention_forward_scratch_bytes(D, 1, dt, set), f32 + b * 4);
      for (int64_t d : {D, int64_t{72}}) {
        const int64_t padded = (d + panel - 1) / panel * panel;
        EXPECT_EQ(attention_backward_scratch_bytes(d, 1, dt, set),
                  (2 * b * b + 8 * b * padded + b * d + 2 * b * padded + 8 * b * d + 2 * b * d + 3 * b) * 4);
      }
    }
  }
}

// ---- the fused kernels, AVX2 against AVX-512 ------------------------------

namespace {

// One tile through one ISA's fused kernels, from row-major Q [rows, D] and
// K, V [cols, D]: scores (with the pairs in `masked` set to -inf, as the
// mask would), the online softmax from the running m, l, then P V into the
// running output acc0 [rows, D]. Returns P [rows, cols], alpha, m, l and
// the output, row-major, whatever the ISA's panel width.
struct TileState {
  std::vector<float> p, alpha, m, l, acc;
};
TileState run_fused_tile(const attn::FusedTileKernels& f, const std::vector<float>& q, const std::vector<float>& k,
                         const std::vector<float>& v, int64_t rows, int64_t cols, int64_t D,
                         const std::vector<char>& masked, const std::vector<float>& m0, const std::vector<float>& l0,
                         const std::vector<float>& acc0) {
  const int64_t P = f.panel, panels = (rows + P - 1) / P, s_panel = cols * P;
  std::vector<float> qp(panels * D * P, 0.0f), s(panels * s_panel), acc(panels * D * P, 0.0f);
  std::vector<float> m(panels * P, -std::numeric_limits<float>::infinity()), l(panels * P, 0.0f), alpha(panels * P);
  auto at = [P, D](int64_t r, int64_t d) { return (r / P) * D * P + d * P + r % P; };  // [panels][D][P]
  for (int64_t r = 0; r < rows; ++r) {
    m[r] = m0[r], l[r] = l0[r];
    for (int64_t d = 0; d < D; ++d) qp[at(r, d)] = q[r * D + d], acc[at(r, d)] = acc0[r * D + d];
  }
  f.scores(qp.data(), panels, k.data(), cols, D, 0.7f, s.data(), s_panel);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (masked[r * cols + c]) s[(r / P) * s_panel + c * P + r % P] = -std::numeric_limits<float>::infinity();
  f.softmax(s.data(), panels, cols, s_panel, m.data(), l.data(), alpha.data());
  f.pv(s.data(), panels, cols, s_panel, v.data(), D, alpha.data(), acc.data());
  TileState out;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) out.p.push_back(s[(r / P) * s_panel + c * P + r % P]);
    out.alpha.push_back(alpha[r]), out.m.push_back(m[r]), out.l.push_back(l[r]);
    for (int64_t d = 0; d < D; ++d) out.acc.push_back(acc[at(r, d)]);
  }
  return out;
}

constexpr attn::FusedTileKernels kPortable8 = attn::fused_impl::kernels_of<attn::PortableLanes<8, 6>>("portable, 8 lanes");
constexpr attn::FusedTileKernels kPortable16 =
    attn::fused_impl::kernels_of<attn::PortableLanes<16, 8>>("portable, 16 lanes");

// One backward tile through one ISA's fused kernels, from row-major Q, dO
// [rows, D], K, V [cols, D], the rows' LSE (natural units; -inf: nothing
// allowed) and delta: the scores (pairs in `masked` -inf), P and dS, then
// dV += P^T dO and dK += dS^T Q onto dk0, dv0 [cols, D], and dQ = dS K.
// Returns P, dS [rows, cols], dK, dV [cols, D] and dQ [rows, D], row-major,
// whatever the ISA's panel width.
struct BackwardTileState {
  std::vector<float> p, ds, dk, dv, dq;
};
BackwardTileState run_fused_backward_tile(const attn::FusedTileKernels& f, const std::vector<float>& q,
                                          const std::vector<float>& dout, const std::vector<float>& k,
                                          const std::vector<float>& v, int64_t rows, int64_t cols, int64_t D,
                                          const std::vector<char>& masked, const std::vector<float>& lse,
                                          const std::vector<float>& delta, const std::vector<float>& dk0,
                                          const std::vector<float>& dv0) {
  const int64_t P = f.panel, panels = (rows + P - 1) / P, s_panel = cols * P, ld = (D + P - 1) / P * P;
  const float scale = 0.7f, log2e = 1.4426950408889634f;
  std::vector<float> qp(panels * D * P, 0.0f), dop(panels * D * P, 0.0f), qr(rows * ld, 0.0f), dor(rows * ld, 0.0f);
  std::vector<float> lse2(panels * P, std::numeric_limits<float>::infinity()), delta_p(panels * P, 0.0f);
  std::vector<float> s(panels * s_panel), ds(panels * s_panel), dk(cols * ld, 0.0f), dv(cols * ld, 0.0f);
  std::vector<float> dqp(panels * D * P, 0.0f), ones(panels * P, 1.0f);
  auto at = [P, D](int64_t r, int64_t d) { return (r / P) * D * P + d * P + r % P; };  // [panels][D][P]
  for (int64_t r = 0; r < rows; ++r) {
    if (lse[r] != -std::numeric_limits<float>::infinity()) lse2[r] = lse[r] * log2e;
    delta_p[r] = delta[r];
    for (int64_t d = 0; d < D; ++d) {
      qp[at(r, d)] = qr[r * ld + d] = q[r * D + d];
      dop[at(r, d)] = dor[r * ld + d] = dout[r * D + d];
    }
  }
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t d = 0; d < D; ++d) dk[c * ld + d] = dk0[c * D + d], dv[c * ld + d] = dv0[c * D + d];
  f.scores(qp.data(), panels, k.data(), cols, D, scale * log2e, s.data(), s_panel);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (masked[r * cols + c]) s[(r / P) * s_panel + c * P + r % P] = -std::numeric_limits<float>::infinity();
  f.scores(dop.data(), panels, v.data(), cols, D, 1.0f, ds.data(), s_panel);
  f.softmax_grad(s.data(), ds.data(), panels, cols, s_panel, lse2.data(), delta_p.data(), scale);
  f.panel_t_times(s.data(), rows, cols, s_panel, dor.data(), ld, dv.data());
  f.panel_t_times(ds.data(), rows, cols, s_panel, qr.data(), ld, dk.data());
  f.pv(ds.data(), panels, cols, s_panel, k.data(), D, ones.data(), dqp.data());
  BackwardTileState out;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      out.p.push_back(s[(r / P) * s_panel + c * P + r % P]);
      out.ds.push_back(ds[(r / P) * s_panel + c * P + r % P]);
    }
    for (int64_t d = 0; d < D; ++d) out.dq.push_back(dqp[at(r, d)]);
  }
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t d = 0; d < D; ++d) out.dk.push_back(dk[c * ld + d]), out.dv.push_back(dv[c * ld + d]);
  return out;
}

// The kernels that must agree bit for bit: plain lanes of 8 against 16 on
// any CPU, and each ISA this CPU runs against the plain lanes of its width.
std::vector<std::pair<const attn::FusedTileKernels*, const attn::FusedTileKernels*>> widths_to_compare() {
  std::vector<std::pair<const attn::FusedTileKernels*, const attn::FusedTileKernels*>> pairs = {
      {&kPortable8, &kPortable16}};
  if (const auto* avx2 = cpu_isa_kernels().fused_avx2) pairs.push_back({avx2, &kPortable8});
  if (const auto* avx512 = cpu_isa_kernels().fused_avx512) pairs.push_back({avx512, &kPortable16});
  return pairs;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

// Each lane of the fused kernels is one q row, and every sum runs over d or
// kv in the same order at every width, so f32_fused (and bf16_fused) give
// the same bits on an AVX2 and an AVX-512 machine. Checked without either:
// the template on plain C++ lanes of 8 and of 16 must agree, and each ISA
// this CPU runs must match the lanes of its width; on shapes off every
// blocking, with masked pairs, rows masked whole, rows that have seen
// nothing yet (m = -inf), rows carried over from an earlier tile, and scores
// far enough below the row max that exp2's argument falls under -126.
TEST(FusedTiles, EveryWidthGivesTheSameBits) {
  const auto pairs = widths_to_compare();
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto [rows, cols, D] : {std::array<int64_t, 3>{128, 128, 128}, {45, 37, 13}, {1, 1, 8}, {33, 129, 72}}) {
    std::vector<float> q(rows * D), k(cols * D), v(cols * D), acc0(rows * D), m0(rows), l0(rows);
    for (auto* x : {&q, &k, &v, &acc0})
      for (float& e : *x) e = normal(gen);
    for (int64_t d = 0; d < D; ++d) k[d] *= 60.0f;  // key 0 scores far above the others: exp2 below -126
    std::vector<char> masked(rows * cols);
    for (int64_t r = 0; r < rows; ++r) {
      m0[r] = r % 3 == 0 ? -std::numeric_limits<float>::infinity() : 4.0f * normal(gen);  // -inf: nothing seen yet
      l0[r] = r % 3 == 0 ? 0.0f : 1.0f + std::abs(normal(gen));
      for (int64_t c = 0; c < cols; ++c) masked[r * cols + c] = r % 5 == 1 || (r * 7 + c * 3) % 11 == 0;
    }
    for (auto [x, y] : pairs) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " D=" + std::to_string(D) + ": " + x->isa +
                   " against " + y->isa);
      const TileState a = run_fused_tile(*x, q, k, v, rows, cols, D, masked, m0, l0, acc0);
      const TileState b = run_fused_tile(*y, q, k, v, rows, cols, D, masked, m0, l0, acc0);
      EXPECT_TRUE(same_bits(a.p, b.p));
      EXPECT_TRUE(same_bits(a.alpha, b.alpha));
      EXPECT_TRUE(same_bits(a.m, b.m));
      EXPECT_TRUE(same_bits(a.l, b.l));
      EXPECT_TRUE(same_bits(a.acc, b.acc));
      // Not vacuous: the tile moved the state, masked pairs got P = 0, and
      // some unmasked pairs underflowed to exactly 0 (exp2 below -126).
      EXPECT_FALSE(same_bits(a.acc, acc0));
      if (rows > 1) {
        EXPECT_EQ(a.p[1 * cols], 0.0f);  // row 1 is masked whole
      }
      if (cols > 1 && D > 8) {
        int64_t underflowed = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 1; c < cols; ++c) underflowed += !masked[r * cols + c] && a.p[r * cols + c] == 0.0f;
        EXPECT_GT(underflowed, 0);
      }
    }
  }
}

// The backward's kernels on the same terms: every lane is one q row (P, dS,
// dQ) or one column of d (dK, dV, summed over q in order), so every width
// gives the same bits. Each row's true LSE, rows with nothing allowed (LSE
// -inf: P = 0), masked pairs and pairs whose P underflows; shapes off every
// blocking, D off the panel (padded columns).
TEST(FusedTiles, TheBackwardGivesTheSameBitsAtEveryWidth) {
  const auto pairs = widths_to_compare();
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto [rows, cols, D] : {std::array<int64_t, 3>{128, 128, 128}, {45, 37, 13}, {1, 1, 8}, {33, 129, 72}}) {
    std::vector<float> q(rows * D), dout(rows * D), k(cols * D), v(cols * D), dk0(cols * D), dv0(cols * D);
    for (auto* x : {&q, &dout, &k, &v, &dk0, &dv0})
      for (float& e : *x) e = normal(gen);
    // Key 0 scores far from the others (above or below), so that either it
    // or the rest have P far below 2^-126: exp2 underflows to 0.
    for (int64_t d = 0; d < D; ++d) k[d] *= 60.0f;
    std::vector<char> masked(rows * cols);
    std::vector<float> lse(rows), delta(rows);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) masked[r * cols + c] = r % 5 == 1 || (r * 7 + c * 3) % 11 == 0;
      // The row's LSE over its allowed scores (float64; -inf when none), so that P <= 1 as in a real backward.
      std::vector<double> scores;
      for (int64_t c = 0; c < cols; ++c) {
        if (masked[r * cols + c]) continue;
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += double(q[r * D + d]) * k[c * D + d];
        scores.push_back(0.7 * dot);
      }
      double mx = -std::numeric_limits<double>::infinity(), sum = 0.0;
      for (double x : scores) mx = std::max(mx, x);
      for (double x : scores) sum += std::exp(x - mx);
      lse[r] = scores.empty() ? -std::numeric_limits<float>::infinity() : float(mx + std::log(sum));
      delta[r] = normal(gen);
    }
    for (auto [x, y] : pairs) {
      SCOPED_TRACE(std::to_string(rows) + "x" + std::to_string(cols) + " D=" + std::to_string(D) + ": " + x->isa +
                   " against " + y->isa);
      const BackwardTileState a = run_fused_backward_tile(*x, q, dout, k, v, rows, cols, D, masked, lse, delta, dk0, dv0);
      const BackwardTileState b = run_fused_backward_tile(*y, q, dout, k, v, rows, cols, D, masked, lse, delta, dk0, dv0);
      EXPECT_TRUE(same_bits(a.p, b.p));
      EXPECT_TRUE(same_bits(a.ds, b.ds));
      EXPECT_TRUE(same_bits(a.dk, b.dk));
      EXPECT_TRUE(same_bits(a.dv, b.dv));
      EXPECT_TRUE(same_bits(a.dq, b.dq));
      // Not vacuous: everything finite, the tile moved dK and dV (where some
      // pair is allowed), masked rows got P = dS = 0, and some allowed
      // pairs' P underflowed to exactly 0.
      for (const std::vector<float>* x : {&a.p, &a.ds, &a.dk, &a.dv, &a.dq})
        EXPECT_TRUE(std::all_of(x->begin(), x->end(), [](float e) { return std::isfinite(e); }));
      if (rows * cols > 1) {
        EXPECT_FALSE(same_bits(a.dk, dk0));
        EXPECT_FALSE(same_bits(a.dv, dv0));
      }
      if (rows > 1) {
        EXPECT_EQ(a.p[1 * cols], 0.0f);  // row 1: masked whole, LSE -inf
        EXPECT_EQ(a.ds[1 * cols], 0.0f);
      }
      if (cols > 1 && D > 8) {
        int64_t underflowed = 0;
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) underflowed += !masked[r * cols + c] && a.p[r * cols + c] == 0.0f;
        EXPECT_GT(underflowed, 0);
      }
    }
  }
}

// A bf16 path the CPU lacks is refused by name, never run on something
// else: `--tile-path dot` and LONGCTX_BF16_ATTENTION=dot with oneDNN capped
// to AVX2 (no bf16 instructions then, on any x86 CPU), and a pin that names
// no path. Each exits non-zero with the rule in its message.
TEST(AttentionBf16, PathsTheCpuLacksAreRefusedByName) {
  const std::string exe = shell_quote(LONGCTX_BINARY) + " bench attention --dtype bf16 --seq 128 --reps 1";
  const CommandResult capped = run_command("ONEDNN_MAX_CPU_ISA=AVX2 " + exe + " --tile-path dot");
  EXPECT_NE(capped.status, 0);
  EXPECT_NE(capped.output.find("--tile-path dot needs a CPU with AVX512-BF16 or AMX-BF16"), std::string::npos)
      << capped.output;
  const CommandResult pinned = run_command("ONEDNN_MAX_CPU_ISA=AVX2 LONGCTX_BF16_ATTENTION=dot " + exe);
  EXPECT_NE(pinned.status, 0);
  EXPECT_NE(pinned.output.find("LONGCTX_BF16_ATTENTION=dot: not a bf16 attention path this CPU runs"),
            std::string::npos)
      << pinned.output;
  const CommandResult bogus = run_command("LONGCTX_BF16_ATTENTION=bogus " + exe);
  EXPECT_NE(bogus.status, 0);
  EXPECT_NE(bogus.output.find("LONGCTX_BF16_ATTENTION=bogus: not a bf16 attention path"), std::string::npos)
      << bogus.output;
  if (!attention_dot_tiles_supported()) {  // in process too, where this CPU lacks them: a ShapeError when it runs
    Problem p = self_attention(130, 1, 1, 16, MaskSpec::causal());
    p.init();
    Bf16Inputs in = round_to_bf16(p);
    AttentionArgs a = p.args();
    a.q = p.qview(in.q), a.k = p.kvview(in.k), a.v = p.kvview(in.v);
    std::vector<bf16> o(p.q.size());
    std::vector<float> lse(p.Sq * p.H);
    const PinnedKernels pinned(KernelPin{AttentionTilePath::bf16_dot});
    EXPECT_THROW(attention_forward(a, p.qview(o), lse.data()), ShapeError);
  }
}

// The dot kernels' short exp2 (PortableLanes::exp2_bf16, the twin of
// Avx512::exp2_bf16, run by the bounds tests above on CPUs with AVX512-BF16)
// within the error the bf16 bounds are derived with, against float64's exp2,
// and exact at what the softmax feeds it besides scores: -inf (masked, and
// the first block's m_old) gives 0, NaN stays NaN, far below range gives 0,
// and just below 0 (f = x - floor(x), rounded down as vreduceps does, is
// just below 1) gives 1 to within it.
TEST(DotSoftmax, ShortExp2IsWithinItsStatedErrorAndExactAtTheEdges) {
  using L = attn::PortableLanes<16, 8>;
  double worst = 0;
  for (int64_t i = 0; i <= 400000; ++i) {
    L::R x = L::set1(-100.0f + 120.0f * float(i) / 400000);  // every spacing of f = x - floor(x), to P's 2^kLazyMax
    const float got = L::exp2_bf16(x).v[0];
    const double want = std::exp2(double(x.v[0]));
    if (want < 0x1p-126) continue;  // subnormal results: no relative bound
    worst = std::max(worst, std::abs(got / want - 1));
  }
  EXPECT_LE(worst, attn::kExp2Bf16Error);
  EXPECT_GT(worst, attn::kExp2Bf16Error / 4) << "the stated error is far from the polynomial's";
  EXPECT_EQ(L::exp2_bf16(L::set1(-std::numeric_limits<float>::infinity())).v[0], 0.0f);
  EXPECT_EQ(L::exp2_bf16(L::set1(-1e30f)).v[0], 0.0f);
  EXPECT_EQ(L::exp2_bf16(L::set1(0.0f)).v[0], 1.00000262f);  // the polynomial's constant term
  EXPECT_TRUE(std::isnan(L::exp2_bf16(L::set1(std::numeric_limits<float>::quiet_NaN())).v[0]));
  EXPECT_NEAR(L::exp2_bf16(L::set1(-1e-30f)).v[0], 1.0, attn::kExp2Bf16Error);
}

// The CPU's own softmax kernels (AVX-512's exp2_bf16: reduce and scalef)
// write their portable twins' bits, which the bounds tests hold to float64
// on every CPU: the forward's across tiles that start empty, rise within and
// past the lazy margin and fall, with masked (-inf) scores and scores far
// below range; and the backward's P and dS. A scale off every power of 2
// puts arguments at full precision in (-1, 0), where vreduceps rounds
// 1 + x down and a twin that rounded to nearest would differ.
TEST(DotSoftmax, TheCpusSoftmaxWritesItsTwinsBits) {
  const std::pair<const attn::DotTileKernels*, const attn::DotTileKernels*> pairs[] = {
      {cpu_isa_kernels().dot_avx512bf16, attn::dot_tile_kernels_portable_lanes()},
      {cpu_isa_kernels().dot_amx, attn::dot_tile_kernels_portable_tiles()}};
  if (!pairs[0].first && !pairs[1].first) GTEST_SKIP() << "SKIPPED LOUDLY: this CPU runs no dot kernels of its own";
  constexpr int64_t P = attn::kDotPanel, panels = 2, cols = 77;  // odd, off every alignment
  constexpr float ninf = -std::numeric_limits<float>::infinity(), scale = 0.18033688f;
  for (auto [native, twin] : pairs) {
    if (!native) continue;
    SCOPED_TRACE(native->isa);
    const int64_t s_panel = attn::round_up(cols, native->kv_align) * P;
    std::mt19937 gen(11);
    std::normal_distribution<float> noise(0.0f, 4.0f);
    struct Run {
      std::vector<float> m, l, alpha;
      std::vector<bf16> p2;
    };
    Run runs[2];
    for (Run& r : runs) r = {std::vector<float>(panels * P, ninf), std::vector<float>(panels * P, 0.0f),
                             std::vector<float>(panels * P), std::vector<bf16>(panels * s_panel)};
    std::vector<float> s(panels * s_panel);
    for (float base : {0.0f, 5.0f, 40.0f, -30.0f}) {
      for (int64_t i = 0; i < panels * s_panel; ++i) {
        const int64_t row = i % P;
        s[i] = base == 0.0f && row == 3 ? ninf : base + noise(gen);
        if (i % 13 == 0) s[i] = ninf;                                  // masked
        if (i % 29 == 0) s[i] = -300.0f;                               // far below range
      }
      for (Run& r : runs) {
        const attn::DotTileKernels* k = &r == &runs[0] ? native : twin;
        k->softmax_to_pairs(s.data(), panels, cols, s_panel, scale, k->kv_align, r.m.data(), r.l.data(),
                            r.alpha.data(), r.p2.data());
      }
      SCOPED_TRACE("tile at " + std::to_string(base));
      EXPECT_EQ(0, std::memcmp(runs[0].m.data(), runs[1].m.data(), panels * P * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(runs[0].l.data(), runs[1].l.data(), panels * P * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(runs[0].alpha.data(), runs[1].alpha.data(), panels * P * sizeof(float)));
      EXPECT_EQ(0, std::memcmp(runs[0].p2.data(), runs[1].p2.data(), panels * s_panel * sizeof(bf16)));
    }
    std::vector<float> dp(panels * s_panel), lse2(panels * P), delta(panels * P);
    for (float& x : dp) x = noise(gen);
    for (int64_t j = 0; j < panels * P; ++j) {  // LSE just above the row's top: P near 1 for its largest scores
      float top = ninf;
      for (int64_t c = 0; c < cols; ++c) top = std::max(top, s[(j / P) * s_panel + c * P + j % P] * scale);
      lse2[j] = top + 0.25f, delta[j] = noise(gen);
    }
    std::vector<bf16> out[2][3];
    for (int x = 0; x < 2; ++x) {
      for (auto& o : out[x]) o.assign(panels * s_panel, bf16{});
      const attn::DotTileKernels* k = x == 0 ? native : twin;
      k->softmax_grad_to_bf16(s.data(), dp.data(), panels, cols, s_panel, scale, lse2.data(), delta.data(), 0.125f,
                              k->kv_align, out[x][0].data(), out[x][1].data(), out[x][2].data());
    }
    for (int o = 0; o < 3; ++o) EXPECT_EQ(0, std::memcmp(out[0][o].data(), out[1][o].data(), panels * s_panel * 2)) << o;
  }
}

// The AMX kernels pack V^T and K^T with AVX-512 shuffles (pack_kv_avx512,
// attention/dot/amx.cpp); the portable tile twin writes the same layout
// with plain loops. Byte for byte, padding included, at head dims and
// lengths off every block size. Each buffer starts from a different fill,
// so a byte either one leaves unwritten shows. Runs only where the CPU has
// AMX (the bounds tests run the kernels through it there too).
TEST(DotTiles, TheAmxPackWritesThePortableTwinsBytes) {
  const attn::DotTileKernels* amx = cpu_isa_kernels().dot_amx;
  if (!amx) GTEST_SKIP() << "SKIPPED LOUDLY: this CPU has no AMX-BF16; the portable twin's pack is tested everywhere";
  const attn::DotTileKernels* twin = attn::dot_tile_kernels_portable_tiles();
  std::mt19937 gen(13);
  std::uniform_int_distribution<uint16_t> bits(0, 0xffff);
  for (int64_t cols : {1, 2, 31, 33, 64, 130})
    for (int64_t D : {8, 17, 64, 72, 128}) {
      SCOPED_TRACE("cols " + std::to_string(cols) + ", D " + std::to_string(D));
      const int64_t ld = D + 3;  // rows wider than D: the pack reads only D of each
      std::vector<bf16> x(size_t(cols * ld));
      for (bf16& v : x) v = std::bit_cast<bf16>(bits(gen));
      ASSERT_EQ(amx->packed_elements(cols, D), twin->packed_elements(cols, D));
      std::vector<bf16> got(size_t(amx->packed_elements(cols, D)), std::bit_cast<bf16>(uint16_t(0x7fc1)));
      std::vector<bf16> want(got.size(), std::bit_cast<bf16>(uint16_t(0x7fc2)));
      amx->pack_kv(x.data(), ld, cols, D, got.data());
      twin->pack_kv(x.data(), ld, cols, D, want.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(bf16)), 0);
    }
}

// The bf16_dot forward packs V one kv block at a time and hands a run of
// consecutive blocks to one pv call (attention.cpp, kDotKvRun): the packs of
// consecutive row blocks, placed one after the other, must be the pack of all
// their rows. On every dot kernel set this CPU runs and the twins: blocks of
// 128 (a tile) and 32 rows, then a short last block, against the pack of all
// rows at once, padding included; a layout whose blocks interleave (the tile
// layout before its kv groups went outermost) fails it.
TEST(DotTiles, PacksOfConsecutiveKvBlocksAreThePackOfAllTheirRows) {
  const std::vector<const attn::DotTileKernels*> sets = dot_kernel_sets();
  std::mt19937 gen(17);
  std::uniform_int_distribution<uint16_t> bits(0, 0xffff);
  for (const attn::DotTileKernels* k : sets)
    for (int64_t block : {int64_t{128}, int64_t{32}})
      for (int64_t D : {8, 64, 72, 128}) {
        SCOPED_TRACE(std::string(k->isa) + ", blocks of " + std::to_string(block) + ", D " + std::to_string(D));
        const int64_t cols = 2 * block + 45, ld = D + 3;
        std::vector<bf16> x(size_t(cols * ld));
        for (bf16& v : x) v = std::bit_cast<bf16>(bits(gen));
        std::vector<bf16> whole(size_t(k->packed_elements(cols, D)), std::bit_cast<bf16>(uint16_t(0x7fc1)));
        std::vector<bf16> blocks(whole.size(), std::bit_cast<bf16>(uint16_t(0x7fc2)));
        k->pack_kv(x.data(), ld, cols, D, whole.data());
        for (int64_t c0 = 0; c0 < cols; c0 += block)
          k->pack_kv(x.data() + c0 * ld, ld, std::min(block, cols - c0), D,
                     blocks.data() + (c0 / block) * k->packed_elements(block, D));
        EXPECT_EQ(std::memcmp(whole.data(), blocks.data(), whole.size() * sizeof(bf16)), 0);
      }
}

// The dot forward's softmax (softmax_to_pairs) across tiles whose scores
// jump far past the running max, and by less than kLazyMax, with a row that
// has nothing allowed in the first tile, on every dot kernel set this CPU
// runs and the portable twins. After each tile, against float64: the max
// never above the scores seen and at most kLazyMax below them; l 2^m is
// the mass of every score seen; P = 2^(s - m), at most 2^kLazyMax (a max
// that never moved would pass 2^100 here); alpha = 2^(m_before - m_after),
// and exactly 1 with the max unmoved where the scores rose by less than the
// margin (the one pass ran).
TEST(DotSoftmax, TheRunningMaxTrailsByAtMostTheLazyMarginAndPNeverOverflows) {
  const std::vector<const attn::DotTileKernels*> sets = dot_kernel_sets();
  constexpr int64_t P = attn::kDotPanel, cols = 45;  // an odd count, off every alignment
  const double inf = std::numeric_limits<double>::infinity();
  // The bounds, from the precisions: 2^x from an fp32 argument x (one
  // rounding, u32 = 2^-24 of |x|, so ln 2 u32 |x| relative in 2^x) by the
  // short polynomial (kExp2Bf16Error relative); P rounded to bf16 (u_bf16);
  // a tile's sum of at most cols fp32 terms (cols u32) and each tile's
  // rescale of l by alpha, over every tile so far.
  constexpr double u32 = 0x1p-24, u_bf16 = 0x1p-8;  // unit roundoffs: 24 and 8 significant bits
  const auto exp2_error = [&](double x) { return attn::kExp2Bf16Error + std::log(2.0) * u32 * std::abs(x); };
  int tiles = 0;
  for (const attn::DotTileKernels* k : sets) {
    SCOPED_TRACE(k->isa);
    const int64_t s_panel = attn::round_up(cols, k->kv_align) * P;
    std::vector<float> s(s_panel), m(P, -std::numeric_limits<float>::infinity()), l(P, 0.0f), alpha(P);
    std::vector<bf16> p2(s_panel);
    std::vector<double> top(P, -inf), mass(P, 0.0);  // mass: sum of 2^(score - top)
    std::mt19937 gen(5);
    std::normal_distribution<float> noise(0.0f, 1.0f);
    tiles = 0;
    for (double base : {0.0, 100.0, 103.0, 203.0, 150.0}) {  // +100, +3 (within the margin), +100, -53
      ++tiles;
      for (int64_t c = 0; c < cols; ++c)
        for (int64_t j = 0; j < P; ++j)
          s[c * P + j] = base == 0.0 && j == 0 ? -std::numeric_limits<float>::infinity()
                                               : float(base + 0.25 * double(j)) + noise(gen);
      const std::vector<float> m_before = m;
      k->softmax_to_pairs(s.data(), 1, cols, s_panel, 1.0f, k->kv_align, m.data(), l.data(), alpha.data(),
                          p2.data());
      for (int64_t j = 0; j < P; ++j) {
        SCOPED_TRACE("tiles to " + std::to_string(base) + ", row " + std::to_string(j));
        double tile_top = -inf;
        for (int64_t c = 0; c < cols; ++c) tile_top = std::max(tile_top, double(s[c * P + j]));
        const double new_top = std::max(top[j], tile_top);
        if (new_top == -inf) {  // nothing allowed yet: the row stays empty
          EXPECT_EQ(m[j], -std::numeric_limits<float>::infinity());
          EXPECT_EQ(l[j], 0.0f);
          continue;
        }
        mass[j] = (top[j] == -inf ? 0.0 : mass[j] * std::exp2(top[j] - new_top));
        for (int64_t c = 0; c < cols; ++c) mass[j] += std::exp2(double(s[c * P + j]) - new_top);
        top[j] = new_top;
        EXPECT_LE(m[j], top[j]);
        EXPECT_GE(m[j], top[j] - attn::kLazyMax);
        double widest = 0;  // the largest |argument| of 2^x in this row so far: P's and alpha's
        for (int64_t c = 0; c < cols; ++c) widest = std::max(widest, std::abs(double(s[c * P + j]) - m[j]));
        if (m_before[j] != -std::numeric_limits<float>::infinity()) {
          const double rescale = std::exp2(double(m_before[j]) - m[j]);
          EXPECT_NEAR(alpha[j], rescale, rescale * (exp2_error(double(m_before[j]) - m[j]) + u32));
          widest = std::max(widest, std::abs(double(m_before[j]) - m[j]));
        }
        EXPECT_NEAR(double(l[j]) * std::exp2(double(m[j]) - top[j]) / mass[j], 1.0,
                    tiles * (cols * u32 + 2 * exp2_error(widest) + 2 * u32));
        if (base == 103.0) {  // +3 over the tile before: within the margin, one pass
          EXPECT_EQ(alpha[j], 1.0f);
          EXPECT_EQ(m[j], m_before[j]);
        }
        for (int64_t c = 0; c < cols; ++c) {
          const double want = std::exp2(double(s[c * P + j]) - m[j]);
          const double got = double(float(p2[(c / 2) * 2 * P + 2 * j + c % 2]));
          EXPECT_LE(got, std::exp2(attn::kLazyMax));
          const double x = double(s[c * P + j]) - m[j];
          EXPECT_NEAR(got, want, want * (u_bf16 + exp2_error(x)) * (1 + u_bf16)) << "kv row " << c;
        }
      }
    }
  }
}


