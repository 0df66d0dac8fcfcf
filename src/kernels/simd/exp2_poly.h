#pragma once
// The polynomial of the attention kernels' exp2 (avx2_math.h exp2_ps, the
// AVX-512 fused kernels, and the tests' portable lanes), written once so
// that every vector width runs the same operations and gets the same bits.
#include <initializer_list>

namespace longctx::attn {

// 2^f on f in [-0.5, 0.5]: Taylor series of e^(f ln 2) to degree 6
// (relative error < 2e-7, below fp32 rounding of the products that follow),
// by Horner's rule on any vector type R given its fmadd and set1.
template <class R, class Fmadd, class Set1>
inline R exp2_poly(R f, Fmadd fmadd, Set1 set1) {
  R p = set1(0.00015404f);
  for (float c : {0.00133336f, 0.00961813f, 0.05550411f, 0.24022651f, 0.69314718f, 1.0f}) p = fmadd(p, f, set1(c));
  return p;
}

// 2^f on f in [0, 1] to degree 4, for the bf16 dot kernels' softmax, whose
// P and dS are rounded to bf16 next: minimax for relative error (Remez's
// exchange, coefficients rounded to fp32 and the error taken over every fp32
// f in [0, 1] evaluated in fp32), |error| < kExp2Bf16Error, about u/1400 of
// bf16's unit roundoff u = 2^-8. Two FMAs fewer than exp2_poly. On [0, 1]
// rather than [-0.5, 0.5] (the same error at the same degree) so that the
// reduction is f = x - floor(x), one instruction, and 2^floor(x) scalef's own.
constexpr double kExp2Bf16Error = 2.7e-6;
template <class R, class Fmadd, class Set1>
inline R exp2_poly_bf16(R f, Fmadd fmadd, Set1 set1) {
  R p = set1(0.0135341678f);
  for (float c : {0.0520114601f, 0.241442755f, 0.693003714f, 1.00000262f}) p = fmadd(p, f, set1(c));
  return p;
}

}  // namespace longctx::attn
