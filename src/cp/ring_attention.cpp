// ring: K, V travel between ranks while the previous piece computes.
//
// Each rank's K, V shard is cut into n chunks (cp_ring_chunks). At step s
// (1 <= s < P) rank r receives chunk c of the shard of rank r-s and sends
// its own chunk c to rank r+s. Sending to the rank at distance s directly
// (rather than forwarding around the ring) moves the same bytes, and lets any
// (step, chunk) whose mask is empty be skipped, with its communication,
// without breaking a chain of forwards. Both ends know which pieces are
// empty: every rank all-gathers the position/segment ranges of every chunk
// once per call (a few bytes).
//
// Overlap: the next piece is posted before the current one computes, and a
// ProgressPump thread drives MPI meanwhile; the time left waiting is the
// exposed communication (Communicator wait_seconds). Buffers: one chunk to
// send, two to receive (double buffering); backward adds one chunk of partial
// dK, dV being returned and two receiving the returns, so memory stays a few
// chunks above the local shard.
//
// Forward merges each piece into O, LSE in fp32 (attention_merge). Backward
// accumulates dQ locally and the chunk's partial dK, dV (fp32) that go back
// to the owner, which adds them to its own.
#include <algorithm>
#include <array>
#include <cstring>

#include "core/error.h"
#include "cp/strategies.h"

namespace longctx {

namespace {

struct Range {
  int64_t pos_min, pos_max, seg_min, seg_max;
};

// Whether any q in `q` may attend any kv in `kv` (conservative).
bool may_attend(const MaskSpec& m, const Range& q, const Range& kv) {
  if (m.same_segment && (q.seg_max < kv.seg_min || kv.seg_max < q.seg_min)) return false;
  switch (m.kind) {
    case MaskSpec::Kind::full: return true;
    case MaskSpec::Kind::causal: return kv.pos_min <= q.pos_max;
    case MaskSpec::Kind::local:
      return kv.pos_max >= q.pos_min - m.left && kv.pos_min <= q.pos_max + m.right;
    case MaskSpec::Kind::chunked:
      return kv.pos_min <= q.pos_max && kv.pos_min / m.chunk <= q.pos_max / m.chunk &&
             q.pos_min / m.chunk <= kv.pos_max / m.chunk;
  }
  return true;
}

struct Unit {
  int step, chunk;
  bool send, recv;  // own chunk to r+step; chunk of r-step from r-step
};

// Who sends what to whom, identical on every rank of the ring.
struct RingPlan {
  int P = 1, r = 0;
  int64_t B = 0, n = 0;
  std::vector<int64_t> begin;  // [n+1] chunk boundaries (local tokens)
  std::vector<Range> ranges;   // [P, B, n]
  std::vector<Unit> units;     // (step, chunk) order; pieces with nothing to do are absent

  int64_t len(int c) const { return begin[c + 1] - begin[c]; }
  int64_t max_len() const {
    int64_t m = 0;
    for (int c = 0; c < n; ++c) m = std::max(m, len(c));
    return m;
  }
  const Range& range(int rank, int64_t b, int c) const { return ranges[(rank * B + b) * n + c]; }
  bool needs(const MaskSpec& m, int q_rank, int kv_rank, int c) const {
    for (int64_t b = 0; b < B; ++b)
      for (int qc = 0; qc < n; ++qc)
        if (may_attend(m, range(q_rank, b, qc), range(kv_rank, b, c))) return true;
    return false;
  }
};

RingPlan make_plan(const Communicator& comm, const AttentionArgs& a, const LocalDims& d,
                   int64_t chunk_tokens) {
  RingPlan p;
  p.P = comm.size();
  p.r = comm.rank();
  p.B = d.B;
  p.n = cp_ring_chunks(d.L, chunk_tokens);
  if (p.P * p.n >= 16384)
    throw ConfigError("ring: cp x chunks per shard (" + std::to_string(p.P) + " x " +
                      std::to_string(p.n) + ") must stay below 16384; raise ring_chunk_tokens");
  for (int64_t c = 0; c <= p.n; ++c) p.begin.push_back(c * d.L / p.n);
  std::vector<Range> mine(d.B * p.n);  // [B, n]
  for (int64_t b = 0; b < d.B; ++b)
    for (int c = 0; c < p.n; ++c) {
      Range rg{INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN};
      for (int64_t s = p.begin[c]; s < p.begin[c + 1]; ++s) {
        int64_t pos = a.q_pos[b * d.L + s];
        int64_t seg = a.mask.same_segment ? a.q_seg[b * d.L + s] : 0;
        rg = {std::min(rg.pos_min, pos), std::max(rg.pos_max, pos), std::min(rg.seg_min, seg),
              std::max(rg.seg_max, seg)};
      }
      mine[b * p.n + c] = rg;
    }
  p.ranges.resize(p.P * d.B * p.n);
  comm.all_gather(mine.data(), p.ranges.data(), mine.size() * sizeof(Range));
  for (int s = 1; s < p.P; ++s)
    for (int c = 0; c < p.n; ++c) {
      Unit u{s, c, p.needs(a.mask, (p.r + s) % p.P, p.r, c),
             p.needs(a.mask, p.r, (p.r - s + p.P) % p.P, c)};
      if (u.send || u.recv) p.units.push_back(u);
    }
  return p;
}

// One chunk on the wire: K, V [B, len, 2, G, D] fp32, positions [B, len]
// int64, segments [B, len] int32 (only with segment masking).
struct ChunkFormat {
  LocalDims d;
  bool segments;
  size_t bytes(int64_t len) const {
    return d.B * len * (2 * d.G * d.D * 4 + 8 + (segments ? 4 : 0));
  }
  void pack(const AttentionArgs& a, int64_t begin, int64_t len, char* dst) const {
    const int64_t row = 2 * d.G * d.D;
    float* kv = reinterpret_cast<float*>(dst);
    int64_t* pos = reinterpret_cast<int64_t*>(kv + d.B * len * row);
    int32_t* seg = reinterpret_cast<int32_t*>(pos + d.B * len);
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t s = 0; s < len; ++s) {
        float* t = kv + (b * len + s) * row;
        for (int64_t g = 0; g < d.G; ++g) {
          std::memcpy(t + g * d.D, a.k.at<float>({b, begin + s, g}), d.D * 4);
          std::memcpy(t + (d.G + g) * d.D, a.v.at<float>({b, begin + s, g}), d.D * 4);
        }
        pos[b * len + s] = a.kv_pos[b * d.L + begin + s];
        if (segments) seg[b * len + s] = a.kv_seg[b * d.L + begin + s];
      }
  }
  // The local args with K, V, positions and segments replaced by a received chunk.
  AttentionArgs with_chunk(const AttentionArgs& a, int64_t len, char* src) const {
    const int64_t row = 2 * d.G * d.D;
    float* kv = reinterpret_cast<float*>(src);
    int64_t* pos = reinterpret_cast<int64_t*>(kv + d.B * len * row);
    AttentionArgs c = a;
    c.k = TensorView::strided(kv, DType::f32, {d.B, len, d.G, d.D}, {len * row, row, d.D, 1});
    c.v = TensorView::strided(kv + d.G * d.D, DType::f32, {d.B, len, d.G, d.D}, {len * row, row, d.D, 1});
    c.kv_pos = pos;
    c.kv_seg = segments ? reinterpret_cast<int32_t*>(pos + d.B * len) : nullptr;
    return c;
  }
};

int kv_tag(const RingPlan& p, const Unit& u) { return static_cast<int>(u.step * p.n + u.chunk); }
int grad_tag(const RingPlan& p, const Unit& u) { return 16384 + kv_tag(p, u); }

}  // namespace

void RingAttention::forward(const AttentionArgs& local, const TensorView& o, float* lse) {
  LocalDims d = check_local_args(local);
  RingPlan p = make_plan(comm_, local, d, chunk_tokens_);
  ChunkFormat f{d, local.mask.same_segment};
  const size_t cap = f.bytes(p.max_len());
  Buffer send_buf(MemCategory::communication, "ring kv send", cap);
  std::array<Buffer, 2> recv_buf{Buffer(MemCategory::communication, "ring kv recv", cap),
                                 Buffer(MemCategory::communication, "ring kv recv", cap)};
  Buffer o_part, lse_part;  // [B, L, H, D], [B, L, H]
  if (!p.units.empty()) {
    o_part = Buffer(MemCategory::scratch, "ring o partial", d.B * d.L * d.H * d.D * 4);
    lse_part = Buffer(MemCategory::scratch, "ring lse partial", d.B * d.L * d.H * 4);
  }
  Request send_req;
  std::array<Request, 2> recv_req;
  std::vector<int> slot(p.units.size(), -1);
  int recvs_posted = 0;
  auto post = [&](size_t i) {
    const Unit& u = p.units[i];
    const int64_t len = p.len(u.chunk);
    if (u.send) {
      comm_.wait(send_req);
      f.pack(local, p.begin[u.chunk], len, send_buf.as<char>());
      send_req = comm_.isend(send_buf.data(), f.bytes(len), (p.r + u.step) % p.P, kv_tag(p, u));
    }
    if (u.recv) {
      slot[i] = recvs_posted++ % 2;
      recv_req[slot[i]] = comm_.irecv(recv_buf[slot[i]].data(), f.bytes(len),
                                      (p.r - u.step + p.P) % p.P, kv_tag(p, u));
    }
  };

  ProgressPump pump;
  if (!p.units.empty()) post(0);
  attention_forward(local, o, lse);  // own shard, while the first piece travels
  const TensorView o_view(o_part.data(), DType::f32, {d.B, d.L, d.H, d.D});
  for (size_t i = 0; i < p.units.size(); ++i) {
    if (i + 1 < p.units.size()) post(i + 1);
    const Unit& u = p.units[i];
    if (!u.recv) continue;
    comm_.wait(recv_req[slot[i]]);
    attention_forward(f.with_chunk(local, p.len(u.chunk), recv_buf[slot[i]].as<char>()), o_view,
                      lse_part.as<float>());
    attention_merge(o, lse, o_view, lse_part.as<float>());
  }
  comm_.wait(send_req);
}

void RingAttention::backward_with_delta(const AttentionArgs& local, const TensorView& dout,
                                        const float* lse, const float* delta,
                                        const TensorView& dq, const TensorView& dk,
                                        const TensorView& dv) {
  LocalDims d = check_local_args(local);
  RingPlan p = make_plan(comm_, local, d, chunk_tokens_);
  ChunkFormat f{d, local.mask.same_segment};
  const int64_t row = 2 * d.G * d.D;  // dk, dv of one token
  const size_t cap = f.bytes(p.max_len());
  const size_t grad_cap = d.B * p.max_len() * row * 4;
  Buffer send_buf(MemCategory::communication, "ring kv send", cap);
  std::array<Buffer, 2> recv_buf{Buffer(MemCategory::communication, "ring kv recv", cap),
                                 Buffer(MemCategory::communication, "ring kv recv", cap)};
  // Partial dK, dV of a received chunk, going back to its owner: [B, len, 2, G, D].
  Buffer part(MemCategory::communication, "ring dkv send", grad_cap);
  // Partial dK, dV of my chunks, coming back: [B, len, 2, G, D] each.
  std::array<Buffer, 2> ret_buf{Buffer(MemCategory::communication, "ring dkv recv", grad_cap),
                                Buffer(MemCategory::communication, "ring dkv recv", grad_cap)};
  Request send_req, part_req;
  std::array<Request, 2> recv_req, ret_req;
  std::array<int, 2> ret_chunk{-1, -1};
  std::vector<int> slot(p.units.size(), -1);
  int recvs_posted = 0, sends_posted = 0;

  auto accumulate_return = [&](int s) {
    if (!ret_req[s].active()) return;
    comm_.wait(ret_req[s]);
    const int c = ret_chunk[s];
    const int64_t len = p.len(c);
    const float* g = ret_buf[s].as<float>();
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t t = 0; t < len; ++t)
        for (int64_t h = 0; h < d.G; ++h) {
          float* k = dk.at<float>({b, p.begin[c] + t, h});
          float* v = dv.at<float>({b, p.begin[c] + t, h});
          const float* gk = g + (b * len + t) * row + h * d.D;
          const float* gv = gk + d.G * d.D;
          for (int64_t x = 0; x < d.D; ++x) {
            k[x] += gk[x];
            v[x] += gv[x];
          }
        }
  };
  auto post = [&](size_t i) {
    const Unit& u = p.units[i];
    const int64_t len = p.len(u.chunk);
    if (u.send) {
      comm_.wait(send_req);
      f.pack(local, p.begin[u.chunk], len, send_buf.as<char>());
      const int to = (p.r + u.step) % p.P;
      send_req = comm_.isend(send_buf.data(), f.bytes(len), to, kv_tag(p, u));
      const int s = sends_posted++ % 2;
      accumulate_return(s);  // the return of two sends ago frees this slot
      ret_chunk[s] = u.chunk;
      ret_req[s] = comm_.irecv(ret_buf[s].data(), d.B * len * row * 4, to, grad_tag(p, u));
    }
    if (u.recv) {
      slot[i] = recvs_posted++ % 2;
      recv_req[slot[i]] = comm_.irecv(recv_buf[slot[i]].data(), f.bytes(len),
                                      (p.r - u.step + p.P) % p.P, kv_tag(p, u));
    }
  };

  zero_view(dq);
  zero_view(dk);
  zero_view(dv);
  ProgressPump pump;
  if (!p.units.empty()) post(0);
  attention_backward(local, dout, lse, delta, dq, dk, dv);  // own shard
  for (size_t i = 0; i < p.units.size(); ++i) {
    if (i + 1 < p.units.size()) post(i + 1);
    const Unit& u = p.units[i];
    if (!u.recv) continue;
    const int64_t len = p.len(u.chunk);
    comm_.wait(recv_req[slot[i]]);
    comm_.wait(part_req);
    float* g = part.as<float>();
    std::memset(g, 0, d.B * len * row * 4);
    attention_backward(
        f.with_chunk(local, len, recv_buf[slot[i]].as<char>()), dout, lse, delta, dq,
        TensorView::strided(g, DType::f32, {d.B, len, d.G, d.D}, {len * row, row, d.D, 1}),
        TensorView::strided(g + d.G * d.D, DType::f32, {d.B, len, d.G, d.D}, {len * row, row, d.D, 1}));
    part_req = comm_.isend(g, d.B * len * row * 4, (p.r - u.step + p.P) % p.P, grad_tag(p, u));
  }
  comm_.wait(send_req);
  comm_.wait(part_req);
  // Oldest outstanding return first, so that the summation order is fixed.
  accumulate_return(sends_posted % 2);
  accumulate_return((sends_posted + 1) % 2);
}

}  // namespace longctx
