#pragma once
// The fused kernels' vector type (attention/fused/fused_impl.h) on plain C++
// lanes: their template at any width on any CPU, for the tests' bit
// comparisons and for the portable twins of the bf16 dot kernels
// (attention/dot/dot.h). Bits match the ISAs only where nothing contracts a
// multiply and an add the lanes keep apart (-ffp-contract=off).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/simd/exp2_poly.h"

namespace longctx::attn {

// Lanes with the vector instructions' rounding and x86's max/min on NaN (the
// second operand). Every operation rounds once (std::fma for the FMAs; the
// files that include this are compiled with -ffp-contract=off).
template <int Width, int Rows>
struct PortableLanes {
  struct R {
    float v[Width];
  };
  static constexpr int W = Width;
  static constexpr int kRows = Rows;
  template <class F>
  static R each(F f) {
    R r;
    for (int i = 0; i < W; ++i) r.v[i] = f(i);
    return r;
  }
  static R load(const float* p) { return each([&](int i) { return p[i]; }); }
  static void store(float* p, R x) { std::copy(x.v, x.v + W, p); }
  static R set1(float x) { return each([&](int) { return x; }); }
  static R zero() { return set1(0.0f); }
  static R add(R a, R b) { return each([&](int i) { return a.v[i] + b.v[i]; }); }
  static R sub(R a, R b) { return each([&](int i) { return a.v[i] - b.v[i]; }); }
  static R mul(R a, R b) { return each([&](int i) { return a.v[i] * b.v[i]; }); }
  static R fmadd(R a, R b, R c) { return each([&](int i) { return std::fma(a.v[i], b.v[i], c.v[i]); }); }
  static R max(R a, R b) { return each([&](int i) { return a.v[i] > b.v[i] ? a.v[i] : b.v[i]; }); }
  // Whether a < b in any lane (false where either is NaN).
  static bool any_less(R a, R b) {
    for (int i = 0; i < W; ++i)
      if (a.v[i] < b.v[i]) return true;
    return false;
  }
  static R exp2(R x) {  // avx2::exp2_ps, lane by lane
    return each([&](int i) {
      const float lo = -126.0f, c = x.v[i];
      if (std::isnan(c)) return c;
      if (!(c >= lo)) return 0.0f;  // also -inf
      float xc = c > lo ? c : lo;
      xc = xc < 127.0f ? xc : 127.0f;
      const float n = std::nearbyint(xc);  // to nearest, ties to even
      const float p = exp2_poly(
          xc - n, [](float a, float b, float d) { return std::fma(a, b, d); }, [](float k) { return k; });
      return p * std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
    });
  }
  static R exp2_bf16(R x) {  // Avx512::exp2_bf16, lane by lane (scalef as ldexp)
    return each([&](int i) {
      const float c = x.v[i];
      if (std::isnan(c)) return c;
      if (std::isinf(c)) return c > 0 ? c : 0.0f;
      const float n = std::floor(c);
      // vreduceps rounds x - floor(x) as it rounds floor (toward -inf). It
      // is exact but for -1 < x < 0, where 1 + x may not be: to nearest,
      // then down one step where that rounded up (the error c - (f - 1) is
      // exact, as f - 1 is).
      float f = c - n;
      if (c < 0 && c > -1 && c - (f - 1.0f) < 0) f = std::nextafter(f, 0.0f);
      const float p = exp2_poly_bf16(
          f, [](float a, float b, float d) { return std::fma(a, b, d); }, [](float k) { return k; });
      return std::ldexp(p, static_cast<int>(std::clamp(n, -400.0f, 400.0f)));
    });
  }
  static R zero_where_neg_inf(R x) {
    return each([&](int i) { return x.v[i] == -std::numeric_limits<float>::infinity() ? 0.0f : x.v[i]; });
  }
};


}  // namespace longctx::attn
