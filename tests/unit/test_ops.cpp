// Each model op against its float64 reference on odd shapes and strided views.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "kernels/ops.h"
#include "random_data.h"

using namespace longctx;

namespace {

// max |a - b| / max |b|
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(static_cast<double>(b[i])));
  }
  return num / den;
}

// A [rows, cols] view with row stride `ld` >= cols into `storage`.
TensorView view2(std::vector<float>& storage, int64_t rows, int64_t cols, int64_t ld,
                 int64_t offset = 0) {
  return TensorView::strided(storage.data() + offset, DType::f32, {rows, cols}, {ld, 1});
}

}  // namespace

TEST(Ops, RmsnormForwardBackwardMatchReference) {
  const int64_t N = 37, C = 53, ld = 61;  // strided rows
  auto x = random_vec(N * ld, 1), w = random_vec(C, 2), dy = random_vec(N * ld, 3);
  std::vector<float> y(N * ld), y_ref(N * ld);
  rmsnorm_forward(view2(x, N, C, ld), w.data(), 1e-5, view2(y, N, C, ld));
  rmsnorm_forward_reference(view2(x, N, C, ld), w.data(), 1e-5, view2(y_ref, N, C, ld));
  EXPECT_LT(rel_err(y, y_ref), 1e-6);

  // dx and dw accumulate: start both from the same non-zero values.
  auto dx = random_vec(N * ld, 4), dw = random_vec(C, 5);
  auto dx_ref = dx, dw_ref = dw;
  rmsnorm_backward(view2(x, N, C, ld), w.data(), 1e-5, view2(dy, N, C, ld), view2(dx, N, C, ld),
                   dw.data());
  rmsnorm_backward_reference(view2(x, N, C, ld), w.data(), 1e-5, view2(dy, N, C, ld),
                             view2(dx_ref, N, C, ld), dw_ref.data());
  EXPECT_LT(rel_err(dx, dx_ref), 1e-5);
  EXPECT_LT(rel_err(dw, dw_ref), 1e-5);
}

TEST(Ops, RopeMatchesReferenceOnStridedHeads) {
  // Like q inside a fused qkv row: [N, H, D] with row stride > H * D.
  const int64_t N = 19, H = 3, D = 10, ld = H * D + 14;
  for (bool scaling : {false, true}) {
    RopeParams p;
    p.theta = 10000.0;
    p.llama3_scaling = scaling;
    p.original_max_position = 64;  // small, so the test positions hit all three bands
    std::vector<int64_t> pos(N);
    for (int64_t t = 0; t < N; ++t) pos[t] = (t * 7919) % 5000;  // any permutation of global positions
    auto x = random_vec(N * ld, 6);
    auto x_ref = x;
    auto view = [&](std::vector<float>& s) {
      return TensorView::strided(s.data() + 5, DType::f32, {N, H, D}, {ld, D, 1});
    };
    std::vector<float> cos(N * D / 2), sin(N * D / 2);
    rope_table(p, D, pos.data(), N, cos.data(), sin.data());
    rope_forward(view(x), cos.data(), sin.data());
    rope_reference(p, view(x_ref), pos.data(), false);
    EXPECT_LT(rel_err(x, x_ref), 1e-5) << "scaling " << scaling;
    rope_backward(view(x), cos.data(), sin.data());
    rope_reference(p, view(x_ref), pos.data(), true);
    EXPECT_LT(rel_err(x, x_ref), 1e-5) << "scaling " << scaling;
  }
}

TEST(Ops, RopeBackwardIsTransposeOfForward) {
  // <R x, y> == <x, R^T y>: checks the backward is the gradient, not just an inverse.
  const int64_t N = 5, H = 2, D = 8;
  std::vector<int64_t> pos = {0, 3, 100, 7, 4096};
  RopeParams p;
  auto x = random_vec(N * H * D, 7), y = random_vec(N * H * D, 8);
  auto rx = x, rty = y;
  std::vector<float> cos(N * D / 2), sin(N * D / 2);
  rope_table(p, D, pos.data(), N, cos.data(), sin.data());
  rope_forward(TensorView(rx.data(), DType::f32, {N, H, D}), cos.data(), sin.data());
  rope_backward(TensorView(rty.data(), DType::f32, {N, H, D}), cos.data(), sin.data());
  double a = 0, b = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    a += static_cast<double>(rx[i]) * y[i];
    b += static_cast<double>(x[i]) * rty[i];
  }
  EXPECT_NEAR(a, b, 1e-4 * std::abs(a) + 1e-5);
}

TEST(Ops, RopeLlama3ScalingBands) {
  RopeParams p;  // Llama 3.1: theta 5e5, factor 8, low 1, high 4, original 8192
  p.llama3_scaling = true;
  RopeParams plain = p;
  plain.llama3_scaling = false;
  auto s = rope_inv_freq(p, 128), u = rope_inv_freq(plain, 128);
  EXPECT_DOUBLE_EQ(s[0], u[0]);              // wavelength 2*pi < 2048: unchanged
  EXPECT_NEAR(s[63], u[63] / 8.0, 1e-18);    // longest wavelength: divided by the factor
  for (size_t i = 0; i < s.size(); ++i) {    // always between the two
    EXPECT_LE(s[i], u[i] * (1 + 1e-12));
    EXPECT_GE(s[i], u[i] / 8.0 * (1 - 1e-12));
  }
}

TEST(Ops, SwigluForwardBackwardMatchReferenceInPlace) {
  // g and u are the two halves of one [N, 2F] row, like the fused gate/up output.
  const int64_t N = 23, F = 41, ld = 2 * F;
  auto gu = random_vec(N * ld, 9, 3.0f), da = random_vec(N * F, 10);
  std::vector<float> a(N * F), a_ref(N * F);
  auto g = view2(gu, N, F, ld, 0), u = view2(gu, N, F, ld, F);
  swiglu_forward(g, u, view2(a, N, F, F));
  swiglu_forward_reference(g, u, view2(a_ref, N, F, F));
  EXPECT_LT(rel_err(a, a_ref), 1e-6);

  std::vector<float> dgu_ref(N * ld);
  swiglu_backward_reference(g, u, view2(da, N, F, F), view2(dgu_ref, N, F, ld, 0),
                            view2(dgu_ref, N, F, ld, F));
  swiglu_backward(g, u, view2(da, N, F, F), g, u);  // in place, as the model does
  EXPECT_LT(rel_err(gu, dgu_ref), 1e-6);
}

TEST(Ops, CrossEntropyMatchesReference) {
  const int64_t R = 29, V = 259, ld = 263;
  auto z = random_vec(R * ld, 11, 4.0f), w = random_vec(R, 12);
  std::vector<int32_t> t(R);
  for (int64_t r = 0; r < R; ++r) t[r] = static_cast<int32_t>((r * 37) % V);
  w[3] = 0.0f;  // padding
  for (int64_t r = 0; r < R; ++r)  // columns past V are outside the view: keep them equal to dz_ref's
    for (int64_t j = V; j < ld; ++j) z[r * ld + j] = 0.0f;
  std::vector<float> dz(R * ld), dz_ref(R * ld);
  TensorView dzv = view2(dz, R, V, ld), dzv_ref = view2(dz_ref, R, V, ld);
  const double loss = cross_entropy(view2(z, R, V, ld), t.data(), w.data(), 0.37f, &dzv);
  const double loss_ref =
      cross_entropy_reference(view2(z, R, V, ld), t.data(), w.data(), 0.37f, &dzv_ref);
  EXPECT_NEAR(loss, loss_ref, 1e-5 * std::abs(loss_ref));
  EXPECT_LT(rel_err(dz, dz_ref), 1e-5);
  // Without weights, in place (dlogits aliases logits), loss only matches too.
  const double plain_ref = cross_entropy_reference(view2(z, R, V, ld), t.data(), nullptr, 1.0f, &dzv_ref);
  EXPECT_NEAR(cross_entropy(view2(z, R, V, ld), t.data(), nullptr, 1.0f, nullptr), plain_ref,
              1e-5 * plain_ref);
  TensorView zv = view2(z, R, V, ld);
  EXPECT_NEAR(cross_entropy(zv, t.data(), nullptr, 1.0f, &zv), plain_ref, 1e-5 * plain_ref);
  EXPECT_LT(rel_err(z, dz_ref), 1e-5);
}

TEST(Ops, CrossEntropyRejectsTargetOutsideVocab) {
  std::vector<float> z(2 * 5, 0.0f);
  std::vector<int32_t> t = {1, 5};
  EXPECT_THROW(cross_entropy(TensorView(z.data(), DType::f32, {2, 5}), t.data(), nullptr, 1.0f,
                             nullptr),
               DataError);
}

TEST(Ops, EmbeddingForwardBackward) {
  const int64_t V = 17, C = 13, n = 31;
  auto table = random_vec(V * C, 13), dout = random_vec(n * C, 14);
  std::vector<int32_t> tok(n);
  for (int64_t i = 0; i < n; ++i) tok[i] = static_cast<int32_t>((i * i) % V);  // repeats
  std::vector<float> out(n * C);
  embedding_forward(tok.data(), n, table.data(), V, TensorView(out.data(), DType::f32, {n, C}));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(out[i * C + c], table[tok[i] * C + c]);
  auto dt = random_vec(V * C, 15);
  auto dt_ref = dt;
  embedding_backward(tok.data(), n, TensorView(dout.data(), DType::f32, {n, C}), dt.data(), V);
  embedding_backward_reference(tok.data(), n, TensorView(dout.data(), DType::f32, {n, C}),
                               dt_ref.data(), V);
  EXPECT_LT(rel_err(dt, dt_ref), 1e-6);
  tok[4] = V;
  EXPECT_THROW(embedding_forward(tok.data(), n, table.data(), V,
                                 TensorView(out.data(), DType::f32, {n, C})),
               DataError);
}

TEST(Ops, AdamWMatchesReferenceOverSteps) {
  const int64_t n = 1001;
  auto p = random_vec(n, 16), p_ref = p;
  std::vector<float> m(n), v(n), m_ref(n), v_ref(n);
  AdamWParams h;
  h.lr = 1e-2f;
  h.weight_decay = 0.1f;
  for (int64_t step = 1; step <= 5; ++step) {
    auto g = random_vec(n, 100 + step);
    h.step = step;
    adamw_update(p.data(), g.data(), m.data(), v.data(), n, h);
    adamw_update_reference(p_ref.data(), g.data(), m_ref.data(), v_ref.data(), n, h);
  }
  EXPECT_LT(rel_err(p, p_ref), 1e-6);
  EXPECT_LT(rel_err(m, m_ref), 1e-6);
  EXPECT_LT(rel_err(v, v_ref), 1e-6);
}

// ---- bf16 activations ----------------------------------------------------------
// The reference runs in float64 on the exact values the bf16 inputs hold
// (widened), so the only differences allowed are the fast op's fp32 math
// (relative ~1e-6 of the row's scale) and ONE rounding of each bf16 output
// to nearest even: |round(y) - y| <= u |y| with u = 2^-8 (bf16 keeps 8
// significant bits). Bound per element: u |ref| + 1e-5 max|ref|. Truncating
// instead of rounding (error up to 2u |y|), rounding twice, or rounding an
// intermediate (the norm's statistics) breaks it on these sizes.
namespace {
constexpr double kBf16Unit = 1.0 / 256;

struct Bf16Data {
  std::vector<bf16> bits;
  std::vector<float> widened;  // the exact values the bf16 tensor holds
};
Bf16Data random_bf16(size_t n, uint32_t seed, float scale = 1.0f) {
  Bf16Data d;
  for (float x : random_vec(n, seed, scale)) {
    d.bits.push_back(bf16(x));
    d.widened.push_back(static_cast<float>(d.bits.back()));
  }
  return d;
}
std::vector<float> widened(const std::vector<bf16>& v) {
  std::vector<float> out(v.size());
  widen_bf16(v.data(), out.data(), static_cast<int64_t>(v.size()));
  return out;
}
// Count of elements outside u |ref| + 1e-5 max|ref| (0 expected).
int outside_bf16_bound(const std::vector<float>& got, const std::vector<float>& ref) {
  double scale = 0.0;
  for (float r : ref) scale = std::max(scale, std::abs(static_cast<double>(r)));
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::abs(static_cast<double>(got[i]) - ref[i]) > kBf16Unit * std::abs(ref[i]) + 1e-5 * scale) ++bad;
  return bad;
}
TensorView bf16_view(std::vector<bf16>& v, int64_t rows, int64_t cols, int64_t ld) {
  return TensorView::strided(v.data(), DType::bf16, {rows, cols}, {ld, 1});
}
}  // namespace

TEST(OpsBf16, RmsnormBf16InOutMatchesReferenceWithinOneRounding) {
  const int64_t N = 37, C = 53, ld = 61;
  Bf16Data x = random_bf16(N * ld, 11, 3.0f);
  auto w = random_vec(C, 12);
  std::vector<bf16> y(N * ld);
  std::vector<float> y_ref(N * ld);
  rmsnorm_forward(bf16_view(x.bits, N, C, ld), w.data(), 1e-5, bf16_view(y, N, C, ld));
  rmsnorm_forward_reference(view2(x.widened, N, C, ld), w.data(), 1e-5, view2(y_ref, N, C, ld));
  std::vector<float> got = widened(y);
  for (int64_t r = 0; r < N; ++r)  // padding columns are untouched: compare the [N, C] part
    for (int64_t c = C; c < ld; ++c) got[r * ld + c] = y_ref[r * ld + c] = 0.0f;
  EXPECT_EQ(outside_bf16_bound(got, y_ref), 0);

  // Backward from a bf16 x: dx, dw are fp32 and only see fp32 rounding.
  auto dy = random_vec(N * ld, 13), dx = random_vec(N * ld, 14), dw = random_vec(C, 15);
  auto dx_ref = dx, dw_ref = dw;
  rmsnorm_backward(bf16_view(x.bits, N, C, ld), w.data(), 1e-5, view2(dy, N, C, ld), view2(dx, N, C, ld), dw.data());
  rmsnorm_backward_reference(view2(x.widened, N, C, ld), w.data(), 1e-5, view2(dy, N, C, ld),
                             view2(dx_ref, N, C, ld), dw_ref.data());
  EXPECT_LT(rel_err(dx, dx_ref), 1e-5);
  EXPECT_LT(rel_err(dw, dw_ref), 1e-5);
}

TEST(OpsBf16, SwigluBf16InPlaceMatchesReferenceWithinOneRounding) {
  const int64_t N = 29, F = 45, ld = 2 * F;  // gate | up halves of one bf16 buffer, as in the model
  Bf16Data gu = random_bf16(N * ld, 21, 2.0f);
  TensorView g = bf16_view(gu.bits, N, F, ld), u = TensorView::strided(gu.bits.data() + F, DType::bf16, {N, F}, {ld, 1});
  std::vector<bf16> a(N * F);
  std::vector<float> a_ref(N * F);
  swiglu_forward(g, u, bf16_view(a, N, F, F));
  swiglu_forward_reference(view2(gu.widened, N, F, ld), view2(gu.widened, N, F, ld, F), view2(a_ref, N, F, F));
  EXPECT_EQ(outside_bf16_bound(widened(a), a_ref), 0);

  // da fp32 (a GEMM output); dg, du written over g, u in bf16.
  auto da = random_vec(N * F, 22);
  std::vector<float> dgu_ref(N * ld);
  swiglu_backward_reference(view2(gu.widened, N, F, ld), view2(gu.widened, N, F, ld, F), view2(da, N, F, F),
                            view2(dgu_ref, N, F, ld, 0), view2(dgu_ref, N, F, ld, F));
  swiglu_backward(g, u, view2(da, N, F, F), g, u);
  EXPECT_EQ(outside_bf16_bound(widened(gu.bits), dgu_ref), 0);
}

// round_to_bf16 against float64: every bf16 value's interval, probed at its
// ends, its midpoint (ties go to the even pattern), just around the midpoint
// and at random, both signs, subnormals and the overflow to infinity; NaN
// stays NaN, infinity stays infinity.
TEST(OpsBf16, RoundToBf16IsNearestEvenAndKeepsNaN) {
  std::mt19937 gen(77);
  std::vector<float> in;
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu, static_cast<uint32_t>(gen() & 0xffffu)})
      in.push_back(std::bit_cast<float>(hi << 16 | lo));
  std::vector<bf16> out(in.size());
  round_to_bf16(in.data(), out.data(), static_cast<int64_t>(in.size()));
  for (size_t i = 0; i < in.size(); ++i) {
    const float x = in[i];
    const float y = static_cast<float>(out[i]);
    if (std::isnan(x)) {
      ASSERT_TRUE(std::isnan(y)) << i;
      continue;
    }
    if (std::isinf(x)) {
      ASSERT_EQ(y, x) << i;
      continue;
    }
    // The bf16 below |x| (truncation) and the next one up, as reals (2^128 past the largest).
    const uint32_t down = std::bit_cast<uint32_t>(std::fabs(x)) >> 16;
    const int exponent = static_cast<int>(down >> 7);
    const double ulp = std::ldexp(1.0, (exponent == 0 ? 1 : exponent) - 127 - 7);
    const double lo = static_cast<double>(std::bit_cast<float>(down << 16)), hi = lo + ulp;
    const double ax = std::fabs(static_cast<double>(x));
    const bool up = ax - lo > hi - ax || (ax - lo == hi - ax && (down & 1u));
    const double want = std::copysign(up ? hi : lo, static_cast<double>(x));
    const double got = std::isinf(y) ? std::copysign(std::ldexp(1.0, 128), static_cast<double>(y)) : y;
    ASSERT_EQ(got, want) << "x = " << x << " (bits " << std::hex << std::bit_cast<uint32_t>(x) << ")";
  }
}

TEST(OpsBf16, ConvertResidualAddAndEmbeddingRoundOnce) {
  const int64_t N = 23, C = 37, ld = 41;
  auto src = random_vec(N * ld, 31, 5.0f);
  std::vector<bf16> dst(N * ld);
  convert(view2(src, N, C, ld), bf16_view(dst, N, C, ld));
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < C; ++c) {
      const float x = src[r * ld + c], y = static_cast<float>(dst[r * ld + c]);
      ASSERT_LE(std::abs(y - x), kBf16Unit * std::abs(x)) << r << "," << c;
      // Nearest: neither bf16 neighbour of y (the adjacent bit patterns) is closer to x.
      bf16 up = dst[r * ld + c], down = up;
      ++up.bits;
      --down.bits;
      ASSERT_LE(std::abs(y - x), std::abs(static_cast<float>(up) - x));
      ASSERT_LE(std::abs(y - x), std::abs(static_cast<float>(down) - x));
    }
  std::vector<float> back(N * ld, 0.0f);
  convert(bf16_view(dst, N, C, ld), view2(back, N, C, ld));  // widening is exact
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(back[r * ld + c], static_cast<float>(dst[r * ld + c]));

  // x2 = x (bf16) + o (fp32), stored bf16: one rounding of the exact fp32 sum.
  Bf16Data x = random_bf16(N * C, 32);
  auto o = random_vec(N * C, 33, 0.1f);
  std::vector<bf16> x2(N * C);
  std::vector<float> sum(N * C);
  for (int64_t i = 0; i < N * C; ++i) sum[i] = x.widened[i] + o[i];
  residual_add(bf16_view(x.bits, N, C, C), view2(o, N, C, C), bf16_view(x2, N, C, C));
  EXPECT_EQ(outside_bf16_bound(widened(x2), sum), 0);
  for (int64_t i = 0; i < N * C; ++i) ASSERT_EQ(x2[i].bits, bf16(sum[i]).bits);

  const int64_t V = 11;
  auto table = random_vec(V * C, 34);
  std::vector<int32_t> tok(N);
  for (int64_t t = 0; t < N; ++t) tok[t] = static_cast<int32_t>((t * 7) % V);
  std::vector<bf16> emb(N * C);
  embedding_forward(tok.data(), N, table.data(), V, bf16_view(emb, N, C, C));
  for (int64_t t = 0; t < N; ++t)
    for (int64_t c = 0; c < C; ++c) ASSERT_EQ(emb[t * C + c].bits, bf16(table[tok[t] * C + c]).bits);
}

TEST(OpsBf16, Fp32OnlyOperandsRejectBf16) {
  std::vector<bf16> x(6);
  std::vector<float> w(3, 1.0f), y(6);
  // rmsnorm's dy/dx are gradients of the fp32 residual stream.
  EXPECT_THROW(rmsnorm_backward(TensorView(y.data(), DType::f32, {2, 3}), w.data(), 1e-5,
                                TensorView(x.data(), DType::bf16, {2, 3}), TensorView(y.data(), DType::f32, {2, 3}),
                                w.data()),
               ShapeError);
  std::vector<int32_t> t = {0, 1};
  EXPECT_THROW(cross_entropy(TensorView(x.data(), DType::bf16, {2, 3}), t.data(), nullptr, 1.0f, nullptr),
               ShapeError);
}

TEST(Ops, SwigluAndCrossEntropySaturateWithoutNaN) {
  std::vector<float> g = {-200.0f, -90.0f, 0.0f, 90.0f, 200.0f}, u(5, 2.0f), a(5);
  swiglu_forward(TensorView(g.data(), DType::f32, {1, 5}), TensorView(u.data(), DType::f32, {1, 5}),
                 TensorView(a.data(), DType::f32, {1, 5}));
  std::vector<float> want = {0.0f, 0.0f, 0.0f, 180.0f, 400.0f};
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(a[i], want[i], 1e-4f * std::abs(want[i]) + 1e-30f);
  std::vector<float> z = {1000.0f, -1000.0f, 0.0f};
  std::vector<int32_t> t = {1};
  const double loss = cross_entropy(TensorView(z.data(), DType::f32, {1, 3}), t.data(), nullptr,
                                    1.0f, nullptr);
  EXPECT_NEAR(loss, 2000.0, 1e-3);
}
