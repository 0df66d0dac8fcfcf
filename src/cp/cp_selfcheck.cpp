#include "cp/cp_selfcheck.h"

#include <algorithm>
#include <cmath>
#include <random>

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

}  // namespace

CpCheckResult check_cp_strategy(const Mesh& mesh, const CpCheckCase& c) {
  CpProblem p = make_cp_problem(c);
  const int64_t B = p.B, S = p.S, H = p.H, G = p.G, D = p.D;

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

  // This rank's shard.
  CpLayout layout(c.layout, S, mesh.shape().cp, mesh.shape().ulysses);
  const int rank = mesh.cp_rank();
  const int64_t L = layout.local_len();
  std::vector<float> q(B * L * H * D), k(B * L * G * D), v(B * L * G * D), dout(B * L * H * D);
  std::vector<int64_t> pos(B * L);
  std::vector<int32_t> seg(B * L);
  layout.shard(rank, p.q.data(), q.data(), B, H * D);
  layout.shard(rank, p.k.data(), k.data(), B, G * D);
  layout.shard(rank, p.v.data(), v.data(), B, G * D);
  layout.shard(rank, p.dout.data(), dout.data(), B, H * D);
  layout.shard(rank, p.pos.data(), pos.data(), B);
  layout.shard(rank, p.seg.data(), seg.data(), B);

  AttentionArgs a;
  a.q = TensorView(q.data(), DType::f32, {B, L, H, D});
  a.k = TensorView(k.data(), DType::f32, {B, L, G, D});
  a.v = TensorView(v.data(), DType::f32, {B, L, G, D});
  a.q_pos = a.kv_pos = pos.data();
  a.q_seg = a.kv_seg = seg.data();
  a.mask = c.mask;
  std::vector<float> o(B * L * H * D), lse(B * L * H), dq(B * L * H * D), dk(B * L * G * D),
      dv(B * L * G * D);
  auto attention = make_cp_attention(c.strategy, mesh, c.options);
  mesh.reset_counters();
  TensorView o_v(o.data(), DType::f32, {B, L, H, D});
  attention->forward(a, o_v, lse.data());
  attention->backward(a, o_v, lse.data(), TensorView(dout.data(), DType::f32, {B, L, H, D}),
                      TensorView(dq.data(), DType::f32, {B, L, H, D}),
                      TensorView(dk.data(), DType::f32, {B, L, G, D}),
                      TensorView(dv.data(), DType::f32, {B, L, G, D}));
  CpCheckResult r;
  for (const Communicator* cm : {&mesh.cp(), &mesh.ulysses(), &mesh.ring()}) r.counters += cm->counters();

  // Reference rows of this rank's tokens, then the error ratios over all ranks.
  auto local_of = [&](const std::vector<float>& global, int64_t row) {
    std::vector<float> out(B * L * row);
    layout.shard(rank, global.data(), out.data(), B, row);
    return out;
  };
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
