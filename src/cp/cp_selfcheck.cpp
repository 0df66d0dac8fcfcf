#include "cp/cp_selfcheck.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <type_traits>

#include "core/cp_strategy.h"
#include "kernels/simd/convert.h"

namespace longctx {

double CpCheckResult::max_error() const {
  return std::max({err_o, err_lse, err_dq, err_dk, err_dv});
}

CpProblem make_cp_problem(const CpCheckCase& c) {
  CpProblem p{c.batch, c.seq_len, c.heads, c.kv_heads, c.head_dim, {}, {}, {}, {}, {}, {}};
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](std::vector<float>& x, int64_t n) {
    x.resize(n);
    for (auto& e : x) e = u(rng);
  };
  fill(p.q, p.B * p.S * p.H * p.D);
  fill(p.k, p.B * p.S * p.G * p.D);
  fill(p.v, p.B * p.S * p.G * p.D);
  fill(p.dout, p.B * p.S * p.H * p.D);
  p.pos.resize(p.B * p.S);
  p.seg.assign(p.B * p.S, 0);
  std::uniform_int_distribution<int64_t> doc_len(1, std::max<int64_t>(1, p.S / 3));
  for (int64_t b = 0; b < p.B; ++b) {
    int32_t id = 0;
    int64_t start = 0, end = c.mask.same_segment ? doc_len(rng) : p.S;
    for (int64_t i = 0; i < p.S; ++i) {
      if (i == end) {
        ++id;
        start = i;
        end = i + doc_len(rng);
      }
      p.pos[b * p.S + i] = i - start;
      p.seg[b * p.S + i] = id;
    }
  }
  return p;
}

namespace {

// max |x - ref| and max |ref| over the rows of this rank; -inf == -inf is exact.
void accumulate_error(const float* x, const float* ref, int64_t n, double& err, double& scale) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::isinf(ref[i]) && x[i] == ref[i]) continue;
    err = std::max(err, std::fabs(static_cast<double>(x[i]) - ref[i]));
    if (!std::isinf(ref[i])) scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
}

// max |x - ref| / bound(i) over n elements (an infinity must match exactly).
template <class Bound>
double bounded_error(const float* x, const float* ref, int64_t n, Bound bound) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (x[i] == ref[i]) continue;
    const double err = std::fabs(static_cast<double>(x[i]) - ref[i]), b = bound(i);
    worst = std::max(worst, std::isfinite(err) && b > 0 ? err / b : INFINITY);
  }
  return worst;
}

double max_abs(const std::vector<float>& x) {
  double m = 0;
  for (float e : x)
    if (std::isfinite(e)) m = std::max(m, std::fabs(double(e)));
  return m;
}

std::vector<float> widen(const std::vector<bf16>& x) {
  std::vector<float> out(x.size());
  convert(x.data(), out.data(), int64_t(x.size()));
  return out;
}

std::vector<bf16> round_to_bf16(std::vector<float>& x) {  // x keeps the rounded values
  std::vector<bf16> out(x.size());
  convert(x.data(), out.data(), int64_t(x.size()));
  convert(out.data(), x.data(), int64_t(x.size()));
  return out;
}

// The fp32 strategies' tested error, max |x - ref| / max |ref| against the
// float64 reference (tests/mpi/test_cp_attention.cpp): the fp32 term of the
// bf16 bounds.
constexpr double kFp32Error = 2e-5;
constexpr double kBf16Roundoff = 1.0 / 256;  // u = 2^-8

}  // namespace

// bf16 bounds, per element, for a strategy's x against the single-rank bf16
// kernel's x1 on the same (bf16) inputs. Each is within the fp32 term
// f = kFp32Error max|ref| of the exact result, plus its roundings (u = 2^-8):
//   O    both rounded to bf16 once: |x - x1| <= 2 e + u (|x| + |x1|), where
//        e = f, plus u o_abs on the native tile path (P rounded to bf16,
//        attention_tile_path);
//   LSE  no rounding: 2 f;
//   dQ   2 f, plus 2 u dq_abs on the native path (dS rounded);
//   dK, dV  2 f, plus 2 u dk_abs (dv_abs) on the native path, plus u dk_abs
//        (dv_abs) when a ring returns bf16 partial dK, dV (each piece rounded
//        once; a piece sums a subset of the terms of dk_abs).
// Backward runs both on the single-rank O and LSE, so delta is the same bits
// and only the backward's own error is measured. o_abs .. dv_abs:
// attention_abs_terms_reference. Second-order terms (u^2) are left out.
CpCheckResult check_cp_strategy(const Mesh& mesh, const CpCheckCase& c) {
  CpProblem p = make_cp_problem(c);
  const int64_t B = p.B, S = p.S, H = p.H, G = p.G, D = p.D;
  const bool bf16_run = c.dtype == DType::bf16;
  std::vector<bf16> q16, k16, v16, dout16;  // bf16 runs: the inputs, which p holds widened
  if (bf16_run) q16 = round_to_bf16(p.q), k16 = round_to_bf16(p.k), v16 = round_to_bf16(p.v),
                dout16 = round_to_bf16(p.dout);

  // Reference over the whole sequence, float64 inside.
  std::vector<float> o_ref(B * S * H * D), lse_ref(B * S * H), delta_ref(B * S * H);
  std::vector<float> dq_ref(B * S * H * D, 0.f), dk_ref(B * S * G * D, 0.f), dv_ref(B * S * G * D, 0.f);
  AttentionArgs g;
  g.q = TensorView(p.q.data(), DType::f32, {B, S, H, D});
  g.k = TensorView(p.k.data(), DType::f32, {B, S, G, D});
  g.v = TensorView(p.v.data(), DType::f32, {B, S, G, D});
  g.q_pos = g.kv_pos = p.pos.data();
  g.q_seg = g.kv_seg = p.seg.data();
  g.mask = c.mask;
  g.impl = KernelImpl::reference;
  TensorView o_ref_v(o_ref.data(), DType::f32, {B, S, H, D});
  TensorView dout_v(p.dout.data(), DType::f32, {B, S, H, D});
  attention_forward_reference(g, o_ref_v, lse_ref.data());
  attention_delta(o_ref_v, dout_v, delta_ref.data());
  attention_backward_reference(g, dout_v, lse_ref.data(), delta_ref.data(),
                               TensorView(dq_ref.data(), DType::f32, {B, S, H, D}),
                               TensorView(dk_ref.data(), DType::f32, {B, S, G, D}),
                               TensorView(dv_ref.data(), DType::f32, {B, S, G, D}));

  // bf16: the single-rank bf16 kernel over the whole sequence (what the
  // strategies are held to), and the bound terms.
  std::vector<bf16> o1(B * S * H * D);
  std::vector<float> lse1(B * S * H), delta1(B * S * H), dq1(dq_ref.size(), 0.f), dk1(dk_ref.size(), 0.f),
      dv1(dv_ref.size(), 0.f), o_abs(o_ref.size()), dq_abs(dq_ref.size()), dk_abs(dk_ref.size()),
      dv_abs(dv_ref.size());
  if (bf16_run) {
    AttentionArgs g1 = g;
    g1.impl = KernelImpl::fast;
    g1.q = TensorView(q16.data(), DType::bf16, {B, S, H, D});
    g1.k = TensorView(k16.data(), DType::bf16, {B, S, G, D});
    g1.v = TensorView(v16.data(), DType::bf16, {B, S, G, D});
    const TensorView o1_v(o1.data(), DType::bf16, {B, S, H, D}), dout1_v(dout16.data(), DType::bf16, {B, S, H, D});
    attention_forward(g1, o1_v, lse1.data());
    attention_delta(o1_v, dout1_v, delta1.data());
    attention_backward(g1, dout1_v, lse1.data(), delta1.data(), TensorView(dq1.data(), DType::f32, {B, S, H, D}),
                       TensorView(dk1.data(), DType::f32, {B, S, G, D}),
                       TensorView(dv1.data(), DType::f32, {B, S, G, D}));
    attention_abs_terms_reference(g, dout_v, lse_ref.data(), delta_ref.data(),
                                  TensorView(o_abs.data(), DType::f32, {B, S, H, D}),
                                  TensorView(dq_abs.data(), DType::f32, {B, S, H, D}),
                                  TensorView(dk_abs.data(), DType::f32, {B, S, G, D}),
                                  TensorView(dv_abs.data(), DType::f32, {B, S, G, D}));
  }

  // This rank's shard.
  CpLayout layout(c.layout, S, mesh.shape().cp, mesh.shape().ulysses);
  const int rank = mesh.cp_rank();
  const int64_t L = layout.local_len();
  auto local_of = [&](const auto& global, int64_t row) {
    std::vector<typename std::decay_t<decltype(global)>::value_type> out(B * L * row);
    layout.shard(rank, global.data(), out.data(), B, row);
    return out;
  };
  std::vector<int64_t> pos = local_of(p.pos, 1);
  std::vector<int32_t> seg = local_of(p.seg, 1);
  std::vector<float> q = local_of(p.q, H * D), k = local_of(p.k, G * D), v = local_of(p.v, G * D),
                     dout = local_of(p.dout, H * D);
  std::vector<bf16> q_16, k_16, v_16, dout_16;
  if (bf16_run) q_16 = local_of(q16, H * D), k_16 = local_of(k16, G * D), v_16 = local_of(v16, G * D),
                dout_16 = local_of(dout16, H * D);
  const DType dt = c.dtype;
  auto view = [&](std::vector<float>& f32, std::vector<bf16>& b16, int64_t heads) {
    return bf16_run ? TensorView(b16.data(), dt, {B, L, heads, D}) : TensorView(f32.data(), dt, {B, L, heads, D});
  };

  AttentionArgs a;
  a.q = view(q, q_16, H);
  a.k = view(k, k_16, G);
  a.v = view(v, v_16, G);
  a.q_pos = a.kv_pos = pos.data();
  a.q_seg = a.kv_seg = seg.data();
  a.mask = c.mask;
  std::vector<float> o(B * L * H * D), lse(B * L * H), dq(B * L * H * D), dk(B * L * G * D),
      dv(B * L * G * D);
  std::vector<bf16> o_16(bf16_run ? o.size() : 0);
  auto attention = make_cp_attention(c.strategy, mesh, c.options);
  mesh.reset_counters();
  const TensorView o_v = view(o, o_16, H);
  attention->forward(a, o_v, lse.data());
  // bf16: backward on the single-rank O and LSE (see above).
  std::vector<bf16> o1_local = bf16_run ? local_of(o1, H * D) : std::vector<bf16>();
  std::vector<float> lse1_local = bf16_run ? local_of(lse1, H) : lse;
  attention->backward(a, bf16_run ? TensorView(o1_local.data(), dt, {B, L, H, D}) : o_v, lse1_local.data(),
                      view(dout, dout_16, H), TensorView(dq.data(), DType::f32, {B, L, H, D}),
                      TensorView(dk.data(), DType::f32, {B, L, G, D}),
                      TensorView(dv.data(), DType::f32, {B, L, G, D}));
  CpCheckResult r;
  for (const Communicator* cm : {&mesh.cp(), &mesh.ulysses(), &mesh.ring()}) r.counters += cm->counters();

  if (bf16_run) {
    o = widen(o_16);
    const double u = kBf16Roundoff;
    const double u_p = attention_path_rounds_p_and_ds(attention_tile_path(DType::bf16)) ? u : 0.0;
    // Ring steps merge bf16 partial results: one more rounding on the wire.
    const bool ring = cp_strategy_info(c.strategy).ring_steps(mesh.cp().size(), mesh.ulysses().size());
    const double wire = ring ? u : 0.0;
    const double f_o = kFp32Error * max_abs(o_ref), f_lse = kFp32Error * max_abs(lse_ref);
    const double f_dq = kFp32Error * max_abs(dq_ref), f_dk = kFp32Error * max_abs(dk_ref);
    const double f_dv = kFp32Error * max_abs(dv_ref);
    const std::vector<float> o1_l = widen(o1_local), oa = local_of(o_abs, H * D), dqa = local_of(dq_abs, H * D),
                             dka = local_of(dk_abs, G * D), dva = local_of(dv_abs, G * D);
    const std::vector<float> dq1_l = local_of(dq1, H * D), dk1_l = local_of(dk1, G * D), dv1_l = local_of(dv1, G * D);
    double worst[5] = {
        bounded_error(o.data(), o1_l.data(), int64_t(o.size()),
                      [&](int64_t i) { return 2 * (f_o + u_p * oa[i]) + u * (std::fabs(o[i]) + std::fabs(o1_l[i])); }),
        bounded_error(lse.data(), lse1_local.data(), int64_t(lse.size()), [&](int64_t) { return 2 * f_lse; }),
        bounded_error(dq.data(), dq1_l.data(), int64_t(dq.size()), [&](int64_t i) { return 2 * f_dq + 2 * u_p * dqa[i]; }),
        bounded_error(dk.data(), dk1_l.data(), int64_t(dk.size()),
                      [&](int64_t i) { return 2 * f_dk + (2 * u_p + wire) * dka[i]; }),
        bounded_error(dv.data(), dv1_l.data(), int64_t(dv.size()),
                      [&](int64_t i) { return 2 * f_dv + (2 * u_p + wire) * dva[i]; })};
    mesh.world().all_reduce_max(worst, 5);
    r.err_o = worst[0], r.err_lse = worst[1], r.err_dq = worst[2], r.err_dk = worst[3], r.err_dv = worst[4];
    return r;
  }

  // Reference rows of this rank's tokens, then the error ratios over all ranks.
  double stats[10] = {0};  // err, scale for o, lse, dq, dk, dv
  auto o_l = local_of(o_ref, H * D), lse_l = local_of(lse_ref, H), dq_l = local_of(dq_ref, H * D),
       dk_l = local_of(dk_ref, G * D), dv_l = local_of(dv_ref, G * D);
  accumulate_error(o.data(), o_l.data(), o.size(), stats[0], stats[1]);
  accumulate_error(lse.data(), lse_l.data(), lse.size(), stats[2], stats[3]);
  accumulate_error(dq.data(), dq_l.data(), dq.size(), stats[4], stats[5]);
  accumulate_error(dk.data(), dk_l.data(), dk.size(), stats[6], stats[7]);
  accumulate_error(dv.data(), dv_l.data(), dv.size(), stats[8], stats[9]);
  mesh.world().all_reduce_max(stats, 10);
  auto ratio = [&](int i) { return stats[2 * i + 1] > 0 ? stats[2 * i] / stats[2 * i + 1] : stats[2 * i]; };
  r.err_o = ratio(0);
  r.err_lse = ratio(1);
  r.err_dq = ratio(2);
  r.err_dk = ratio(3);
  r.err_dv = ratio(4);
  return r;
}

}  // namespace longctx
