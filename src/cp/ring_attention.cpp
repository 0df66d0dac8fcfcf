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
// Overlap: two threads, so that no rank's progress waits on another rank's
// compute. The caller's thread receives pieces (the next one is posted
// before the current one computes: double buffering) and computes them. The
// owner's persistent CommWorker thread streams this rank's chunks out, and in
// backward receives their partial dK, dV back and adds them; it also drives
// MPI progress meanwhile. Only the caller's waits count as exposed
// communication (Communicator wait_seconds), the worker's are hidden.
// Buffers: one chunk to send, two to receive; forward adds the partial O, LSE
// of one q chunk, backward one chunk of partial dK, dV going back and one
// coming back. Memory stays a few chunks above the local shard.
//
// Forward computes each received chunk against only the local q chunks it
// can reach, one q chunk at a time, and merges that into O, LSE in fp32
// (attention_merge; with a bf16 O, into an fp32 copy rounded to bf16 once at
// the end). Backward accumulates dQ locally and the chunk's partial dK, dV
// (fp32) that go back to the owner, which adds them to its own.
//
// Dtypes on the wire: K, V chunks and the returning partial dK, dV in the
// dtype of k, v (bf16: half the bytes; a bf16 piece is rounded once before
// the owner adds it in fp32); positions int64, segments int32.
#include <algorithm>
#include <array>
#include <atomic>
#include <functional>

#include "comm/mesh.h"
#include "core/cp_strategy.h"
#include "core/device.h"
#include "core/error.h"
#include "cp/layout.h"
#include "cp/strategies.h"
#include "kernels/simd/convert.h"

namespace longctx {

namespace {

// Position and segment bounds of one ring chunk of one batch row.
struct RingChunkBounds {
  int64_t pos_min, pos_max, seg_min, seg_max;
};

// Whether any q in `q` may attend any kv in `kv` (conservative).
bool may_attend(const MaskSpec& m, const RingChunkBounds& q, const RingChunkBounds& kv) {
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

// The chunk plan: each of the P shards of `local_tokens` tokens cut into
// n = cp_ring_chunks(local_tokens, chunk_tokens) chunks, and, given every
// rank's chunk bounds, which chunks a q rank needs from a kv rank.
struct RingChunks {
  RingChunks(int64_t ranks, int64_t batch, int64_t local_tokens, int64_t chunk_tokens)
      : P(ranks), B(batch), n(cp_ring_chunks(local_tokens, chunk_tokens)) {
    for (int64_t c = 0; c <= n; ++c) begin.push_back(c * local_tokens / n);
    bounds.resize(P * B * n);
  }
  int64_t P = 1, B = 0, n = 0;
  std::vector<int64_t> begin;           // [n + 1] chunk boundaries (local tokens)
  std::vector<RingChunkBounds> bounds;  // [P, B, n]
  int64_t len(int64_t c) const { return begin[c + 1] - begin[c]; }
  int64_t max_len() const {
    int64_t m = 0;
    for (int64_t c = 0; c < n; ++c) m = std::max(m, len(c));
    return m;
  }
  const RingChunkBounds& at(int64_t rank, int64_t b, int64_t c) const { return bounds[(rank * B + b) * n + c]; }
  // Whether any q of q_rank may attend chunk c of kv_rank, judged from the
  // bounds (conservative); a piece nobody needs moves nothing.
  bool needs(const MaskSpec& m, int64_t q_rank, int64_t kv_rank, int64_t c) const {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t qc = 0; qc < n; ++qc)
        if (may_attend(m, at(q_rank, b, qc), at(kv_rank, b, c))) return true;
    return false;
  }
};

// Bytes of one K,V chunk of `len` tokens on the wire: positions (int64),
// with segment masking segment ids (int32), and K, V in their dtype.
int64_t ring_chunk_bytes(int64_t B, int64_t len, int64_t G, int64_t D, bool segments, int64_t element_bytes) {
  return B * len * (2 * G * D * element_bytes + 8 + (segments ? 4 : 0));
}

struct Unit {
  int step, chunk;
  bool send, recv;  // own chunk to r+step; chunk of r-step from r-step
};

// Who sends what to whom, identical on every rank of the ring.
struct RingPlan : RingChunks {
  using RingChunks::RingChunks;
  int r = 0;
  std::vector<Unit> units;  // (step, chunk) order; pieces with nothing to do are absent
};

RingPlan make_plan(const Communicator& comm, const AttentionArgs& a, const LocalDims& d, const CpOptions& options) {
  RingPlan p(comm.size(), d.B, d.L, options.ring_chunk_tokens);
  p.r = comm.rank();
  if (p.P * p.n >= 16384)
    throw ConfigError("ring: cp x chunks per shard (" + std::to_string(p.P) + " x " +
                      std::to_string(p.n) + ") must stay below 16384; raise ring_chunk_tokens");
  std::vector<RingChunkBounds> mine(d.B * p.n);  // [B, n]
  if (is_meta(a.q_pos)) {
    // Counted (core/device.h): no positions to read, and the counting
    // communicator's all-gather below brings nobody's. Every rank's bounds
    // from the layout instead (CpOptions::counted_layout): positions increase
    // along a shard in both layouts, so a chunk's first and last token bound it.
    const int64_t S = d.L * p.P;
    for (int64_t r = 0; r < p.P; ++r)
      for (int64_t b = 0; b < d.B; ++b)
        for (int64_t c = 0; c < p.n; ++c)
          p.bounds[(r * d.B + b) * p.n + c] = {ring_shard_index(options.counted_layout, S, p.P, r, p.begin[c]),
                                               ring_shard_index(options.counted_layout, S, p.P, r, p.begin[c + 1] - 1),
                                               0, 0};
  }
  for (int64_t b = 0; b < d.B && !is_meta(a.q_pos); ++b)
    for (int c = 0; c < p.n; ++c) {
      RingChunkBounds rg{INT64_MAX, INT64_MIN, INT64_MAX, INT64_MIN};
      for (int64_t s = p.begin[c]; s < p.begin[c + 1]; ++s) {
        int64_t pos = a.q_pos[b * d.L + s];
        int64_t seg = a.mask.same_segment ? a.q_seg[b * d.L + s] : 0;
        rg = {std::min(rg.pos_min, pos), std::max(rg.pos_max, pos), std::min(rg.seg_min, seg),
              std::max(rg.seg_max, seg)};
      }
      mine[b * p.n + c] = rg;
    }
  comm.all_gather(mine.data(), p.bounds.data(), mine.size() * sizeof(RingChunkBounds));
  for (int s = 1; s < p.P; ++s)
    for (int c = 0; c < p.n; ++c) {
      Unit u{s, c, p.needs(a.mask, (p.r + s) % p.P, p.r, c),
             p.needs(a.mask, p.r, (p.r - s + p.P) % p.P, c)};
      if (u.send || u.recv) p.units.push_back(u);
    }
  return p;
}

// One chunk on the wire: positions [B, len] int64, segments [B, len] int32
// (only with segment masking), then K, V [B, len, 2, G, D] in their dtype
// (after the 8- and 4-byte fields, so every field stays aligned).
struct ChunkFormat {
  LocalDims d;
  bool segments;
  size_t bytes(int64_t len) const { return ring_chunk_bytes(d.B, len, d.G, d.D, segments, d.e); }
  int64_t kv_row() const { return 2 * d.G * d.D * d.e; }  // bytes of one token's K, V
  char* kv_at(char* chunk, int64_t len) const { return chunk + d.B * len * (8 + (segments ? 4 : 0)); }
  void pack(const AttentionArgs& a, int64_t begin, int64_t len, char* dst) const {
    char* kv = kv_at(dst, len);
    copy_view(token_slice(a.k, begin, len), record_view(kv, d.dtype, d.B, len, d.G, d.D, kv_row()));
    copy_view(token_slice(a.v, begin, len), record_view(kv + kv_row() / 2, d.dtype, d.B, len, d.G, d.D, kv_row()));
    // Each batch row's positions (and segment ids) of the chunk, rows of len tokens.
    copy_rows(a.kv_pos + begin, d.L * 8, dst, len * 8, d.B, len * 8);
    if (segments) copy_rows(a.kv_seg + begin, d.L * 4, dst + d.B * len * 8, len * 4, d.B, len * 4);
  }
  // The local args with K, V, positions and segments replaced by a received chunk.
  AttentionArgs with_chunk(const AttentionArgs& a, int64_t len, char* src) const {
    int64_t* pos = reinterpret_cast<int64_t*>(src);
    char* kv = kv_at(src, len);
    AttentionArgs c = a;
    c.k = record_view(kv, d.dtype, d.B, len, d.G, d.D, kv_row());
    c.v = record_view(kv + kv_row() / 2, d.dtype, d.B, len, d.G, d.D, kv_row());
    c.kv_pos = pos;
    c.kv_seg = segments ? reinterpret_cast<int32_t*>(pos + d.B * len) : nullptr;
    return c;
  }
};

int kv_tag(const RingPlan& p, const Unit& u) { return static_cast<int>(u.step * p.n + u.chunk); }
int grad_tag(const RingPlan& p, const Unit& u) { return 16384 + kv_tag(p, u); }

// The outgoing K,V stream, run by the worker thread: my chunks go out in
// unit order through one send buffer, each packed once the previous one has
// been taken by its receiver. The stream never waits for this rank's own
// compute, so a receiver that works through its pieces faster than this
// rank works through its own is never held up (with zigzag at P = 2 one
// rank receives n half-height pieces while the other receives n/2 full ones).
struct SendStream {
  const Communicator& comm;
  const RingPlan& p;
  const ChunkFormat& f;
  const AttentionArgs& a;
  char* buf;
  size_t next = 0;  // next unit to look at
  Request req;
  ~SendStream() { comm.cancel(req); }  // only an error leaves it active
  bool poll() {
    if (!comm.test(req)) return false;
    while (next < p.units.size() && !p.units[next].send) ++next;
    if (next == p.units.size()) return true;
    const Unit& u = p.units[next++];
    const int64_t len = p.len(u.chunk);
    f.pack(a, p.begin[u.chunk], len, buf);
    req = comm.isend(buf, f.bytes(len), (p.r + u.step) % p.P, kv_tag(p, u));
    return false;
  }
};

// The returning partial dK, dV of my chunks (backward, worker thread): one
// receive slot, posted in unit order, added to dk, dv as soon as it lands
// (once the own-shard backward, which also writes dk, dv, is done). The
// order of the additions is fixed: own shard, then pieces in unit order.
struct ReturnStream {
  const Communicator& comm;
  const RingPlan& p;
  const LocalDims& d;
  const TensorView& dk;
  const TensorView& dv;
  const std::atomic<bool>& own_done;
  char* buf;  // [B, len, 2, G, D] in the dtype of k, v
  size_t next = 0;
  int chunk = -1;
  Request req;
  ~ReturnStream() { comm.cancel(req); }  // only an error leaves it active
  bool poll() {
    if (req.active() || chunk >= 0) {
      if (!comm.test(req) || !own_done.load(std::memory_order_acquire)) return false;
      add(chunk);
      chunk = -1;
    }
    while (next < p.units.size() && !p.units[next].send) ++next;
    if (next == p.units.size()) return true;
    const Unit& u = p.units[next++];
    chunk = u.chunk;
    req = comm.irecv(buf, d.B * p.len(u.chunk) * 2 * d.G * d.D * d.e, (p.r + u.step) % p.P, grad_tag(p, u));
    return false;
  }
  void add(int c) const {
    const int64_t len = p.len(c), row = 2 * d.G * d.D * d.e;  // [B, len, 2, G, D] in the dtype of k, v
    add_view(record_view(buf, d.dtype, d.B, len, d.G, d.D, row), token_slice(dk, p.begin[c], len));
    add_view(record_view(buf + row / 2, d.dtype, d.B, len, d.G, d.D, row), token_slice(dv, p.begin[c], len));
  }
};

// A call's streams: polled on the worker thread, overlapped with compute;
// counted on a meta device (core/device.h: nothing moves, every request is
// done at once) run to the end on the caller's thread at finish, with no
// thread and no polling sleeps. On any exit the worker lets go of the
// call's state before it is freed.
class Streams {
 public:
  Streams(CommWorker* worker, std::function<bool()> job) : worker_(worker), job_(std::move(job)) {
    if (worker_) worker_->start(job_);
  }
  ~Streams() {
    if (worker_) worker_->abandon();
  }
  void finish(const Communicator& comm, CommOp op) {
    if (worker_) return worker_->finish(comm, op);
    while (!job_()) {
    }
  }

 private:
  CommWorker* worker_;  // null when counted
  std::function<bool()> job_;
};

// Cancels what an exception left in flight (normal exits leave nothing).
struct CancelGuard {
  const Communicator& comm;
  std::vector<Request*> requests;
  ~CancelGuard() {
    for (Request* r : requests) comm.cancel(*r);
  }
};

// The K,V pieces this rank computes on, received double buffered: the next
// piece's receive is posted before the current piece is used.
struct PieceReceiver {
  const Communicator& comm;
  const RingPlan& p;
  const ChunkFormat& f;
  std::array<Buffer, 2> buf;
  std::array<Request, 2> req;
  std::vector<int> slot;  // unit -> buffer
  int posted = 0;
  PieceReceiver(const Communicator& c, const RingPlan& plan, const ChunkFormat& format, size_t cap)
      : comm(c), p(plan), f(format),
        buf{Buffer(MemCategory::communication, "ring kv recv", cap),
            Buffer(MemCategory::communication, "ring kv recv", cap)},
        slot(plan.units.size(), -1) {}
  ~PieceReceiver() {  // only an error leaves a receive in flight
    for (Request& r : req) comm.cancel(r);
  }
  // Posts the receive of the first receiving unit at or after i; returns its index.
  size_t post_from(size_t i) {
    while (i < p.units.size() && !p.units[i].recv) ++i;
    if (i == p.units.size()) return i;
    const Unit& u = p.units[i];
    slot[i] = posted++ % 2;
    req[slot[i]] = comm.irecv(buf[slot[i]].data(), f.bytes(p.len(u.chunk)),
                              (p.r - u.step + p.P) % p.P, kv_tag(p, u));
    return i;
  }
  // Unit i's piece, once it has arrived.
  char* wait(size_t i) {
    comm.wait(req[slot[i]]);
    return buf[slot[i]].as<char>();
  }
};

// Tokens [t0, t0 + len) of batch row b of a [B, S, heads, D] view, as a
// [1, len, heads, D] view.
TensorView row_tokens(const TensorView& t, int64_t b, int64_t t0, int64_t len) {
  return TensorView::strided(element_ptr(t, {b, t0}), t.dtype, {1, len, t.dim(2), t.dim(3)},
                             {t.stride[0], t.stride[1], t.stride[2], 1});
}

// Batch row b, local q tokens [q0, q0 + q_len) of `a` against batch row b of
// kv chunk `c` (B = 1 views).
AttentionArgs slice(const AttentionArgs& c, const LocalDims& d, int64_t b, int64_t q0, int64_t q_len,
                    int64_t kv_len) {
  AttentionArgs s = c;
  s.q = row_tokens(c.q, b, q0, q_len);
  s.k = row_tokens(c.k, b, 0, kv_len);
  s.v = row_tokens(c.v, b, 0, kv_len);
  s.q_pos = c.q_pos + b * d.L + q0;
  s.kv_pos = c.kv_pos + b * kv_len;
  if (c.mask.same_segment) {
    s.q_seg = c.q_seg + b * d.L + q0;
    s.kv_seg = c.kv_seg + b * kv_len;
  }
  return s;
}

}  // namespace

CommWorker& RingAttention::worker() {
  if (!worker_) worker_ = std::make_unique<CommWorker>();
  return *worker_;
}

RingAttention::~RingAttention() = default;

void RingAttention::forward(const AttentionArgs& local, const TensorView& o_out, float* lse) {
  LocalDims d = check_local_args(local);
  RingPlan p = make_plan(comm_, local, d, options_);
  ChunkFormat f{d, local.mask.same_segment};
  const size_t cap = f.bytes(p.max_len());
  Buffer send_buf(MemCategory::communication, "ring kv send", cap);
  PieceReceiver in{comm_, p, f, cap};
  if (p.units.empty()) return attention_forward(local, o_out, lse);
  // O is merged in fp32: in the caller's O, or in an fp32 copy when O is bf16.
  Buffer o_f32;
  TensorView o = o_out;
  if (o_out.dtype != DType::f32) {
    o_f32 = Buffer(MemCategory::scratch, "ring o fp32", d.B * d.L * d.H * d.D * 4);
    o = TensorView(o_f32.data(), DType::f32, {d.B, d.L, d.H, d.D});
  }
  // The partial result of one local q chunk against one received kv chunk:
  // [1, len, H, D] and [1, len, H]. Only q chunks the kv chunk can reach are
  // computed and merged, a chunk at a time, so this stays one chunk big.
  Buffer o_part(MemCategory::scratch, "ring o partial", p.max_len() * d.H * d.D * 4);
  Buffer lse_part(MemCategory::scratch, "ring lse partial", p.max_len() * d.H * 4);

  SendStream out{comm_, p, f, local, send_buf.as<char>(), 0, {}};
  Streams streams(is_meta(send_buf.data()) ? nullptr : &worker(), [&out] { return out.poll(); });
  size_t i = in.post_from(0);
  attention_forward(local, o, lse);  // own shard, while the first pieces travel
  while (i < p.units.size()) {
    const size_t next = in.post_from(i + 1);
    const Unit& u = p.units[i];
    const int src = (p.r - u.step + p.P) % p.P;
    const int64_t len = p.len(u.chunk);
    const AttentionArgs piece = f.with_chunk(local, len, in.wait(i));
    // Counted (core/device.h): one q chunk stands for the piece's others
    // (each kernel call takes the same scratch; nothing else is counted here).
    bool counted = false;
    for (int64_t b = 0; b < d.B && !counted; ++b)
      for (int qc = 0; qc < p.n && !counted; ++qc) {
        if (!may_attend(local.mask, p.at(p.r, b, qc), p.at(src, b, u.chunk))) continue;
        const int64_t q0 = p.begin[qc], q_len = p.len(qc);
        const TensorView part(o_part.data(), DType::f32, {1, q_len, d.H, d.D});
        attention_forward(slice(piece, d, b, q0, q_len, len), part, lse_part.as<float>());
        attention_merge(row_tokens(o, b, q0, q_len), lse + (b * d.L + q0) * d.H, part, lse_part.as<float>());
        counted = is_meta(o);
      }
    i = next;
  }
  streams.finish(comm_, CommOp::send);
  if (o_out.dtype != DType::f32) copy_view(o, o_out);  // rounded to O's dtype once
}

void RingAttention::backward_with_delta(const AttentionArgs& local, const TensorView& dout,
                                        const float* lse, const float* delta,
                                        const TensorView& dq, const TensorView& dk,
                                        const TensorView& dv) {
  LocalDims d = check_local_args(local);
  RingPlan p = make_plan(comm_, local, d, options_);
  ChunkFormat f{d, local.mask.same_segment};
  const int64_t row = 2 * d.G * d.D;  // dk, dv of one token (elements)
  const size_t cap = f.bytes(p.max_len());
  const size_t grad_cap = d.B * p.max_len() * row * 4, wire_cap = d.B * p.max_len() * row * d.e;
  Buffer send_buf(MemCategory::communication, "ring kv send", cap);
  PieceReceiver in{comm_, p, f, cap};
  // Partial dK, dV (fp32) of a received chunk, going back to its owner:
  // [B, len, 2, G, D]; sent as they are, or rounded into `part_wire` when
  // K, V are bf16.
  Buffer part(MemCategory::communication, "ring dkv send", grad_cap);
  Buffer part_wire;
  if (d.e != 4) part_wire = Buffer(MemCategory::communication, "ring dkv send bf16", wire_cap);
  // Partial dK, dV of one of my chunks, coming back: [B, len, 2, G, D] in the dtype of k, v.
  Buffer ret_buf(MemCategory::communication, "ring dkv recv", wire_cap);
  zero_view(dq);
  zero_view(dk);
  zero_view(dv);
  if (p.units.empty()) return attention_backward(local, dout, lse, delta, dq, dk, dv);
  Request part_req;
  CancelGuard cancel{comm_, {&part_req}};
  std::atomic<bool> own_done{false};
  SendStream out{comm_, p, f, local, send_buf.as<char>(), 0, {}};
  ReturnStream back{comm_, p, d, dk, dv, own_done, ret_buf.as<char>(), 0, -1, {}};
  Streams streams(is_meta(send_buf.data()) ? nullptr : &worker(), [&out, &back] {
    const bool sent = out.poll();
    return back.poll() && sent;
  });
  size_t i = in.post_from(0);
  attention_backward(local, dout, lse, delta, dq, dk, dv);  // own shard
  own_done.store(true, std::memory_order_release);
  while (i < p.units.size()) {
    const size_t next = in.post_from(i + 1);
    const Unit& u = p.units[i];
    const int64_t len = p.len(u.chunk);
    char* piece = in.wait(i);
    comm_.wait(part_req);
    float* g = part.as<float>();
    fill_f32(g, d.B * len * row, 0.0f);
    attention_backward(
        f.with_chunk(local, len, piece), dout, lse, delta, dq,
        TensorView::strided(g, DType::f32, {d.B, len, d.G, d.D}, {len * row, row, d.D, 1}),
        TensorView::strided(g + d.G * d.D, DType::f32, {d.B, len, d.G, d.D}, {len * row, row, d.D, 1}));
    void* wire = g;
    if (d.e != 4) {
      wire = part_wire.data();
      copy_view(TensorView(g, DType::f32, {d.B * len * row}), TensorView(wire, d.dtype, {d.B * len * row}));
    }
    part_req = comm_.isend(wire, d.B * len * row * d.e, (p.r - u.step + p.P) % p.P, grad_tag(p, u));
    i = next;
  }
  comm_.wait(part_req);
  streams.finish(comm_, CommOp::recv);
}

}  // namespace longctx
