// ranks: 1 2 4 8
// The planner's communication prediction against the real byte counters:
// every strategy runs one attention forward + backward through
// make_cp_attention, and each rank's counters, per operation, must equal
// the planner's attention_call_comm for that rank exactly.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "comm/mesh.h"
#include "cp/cp_attention.h"
#include "cp/layout.h"
#include "plan/planner.h"

namespace longctx {
namespace {

int world_size() {
  int n = 1;
  n = comm_world_size();
  return n;
}

struct Case {
  std::string strategy;
  int ulysses;  // usp only
  std::string attention_type;
  int64_t window;  // local / chunked size
  bool zigzag;
  int64_t batch, seq;
};

// 8 query heads so that ulysses runs at 8 ranks; 2 KV heads so that it
// replicates them at 4 and 8 ranks and splits them at 2.
constexpr int64_t kHeads = 8, kKvHeads = 2, kHeadDim = 16;

RunConfig config_for(const Case& k, int cp) {
  RunConfig c = config_from_values({});
  c.model.num_heads = kHeads;
  c.model.num_kv_heads = kKvHeads;
  c.model.head_dim = kHeadDim;
  c.cp = cp;
  c.tp = 1;
  c.dp = 1;
  c.cp_strategy = parse_enum<CpStrategy>(k.strategy);
  c.cp_ulysses = k.strategy == "usp" ? k.ulysses : 1;
  c.cp_load_balance = k.zigzag;
  c.attention_type = parse_enum<MaskKind>(k.attention_type);
  c.sliding_window_size = k.attention_type == "local" ? k.window : 0;
  c.chunk_attn_window_size = k.attention_type == "chunked" ? k.window : 0;
  c.max_target_length = k.seq;
  c.per_device_batch_size = k.batch;
  c.packing = false;
  c.dtype = DType::f32;
  return c;
}

MaskSpec mask_for(const Case& k) {
  if (k.attention_type == "full") return MaskSpec::full();
  if (k.attention_type == "local") return MaskSpec::local(k.window - 1, 0);
  if (k.attention_type == "chunked") return MaskSpec::chunked(k.window);
  return MaskSpec::causal();
}

using ByOp = std::map<std::string, std::pair<int64_t, int64_t>>;  // op -> (sent, received)

void add(ByOp& m, const CommCounters& c) {
  for (int i = 0; i < kNumCommOps; ++i) {
    const CommOpCounters& o = c.op[i];
    if (o.bytes_sent == 0 && o.bytes_received == 0) continue;
    auto& e = m[comm_op_name(static_cast<CommOp>(i))];
    e.first += o.bytes_sent;
    e.second += o.bytes_received;
  }
}

void run_case(const Case& k) {
  const int P = world_size();
  const int U = k.strategy == "ulysses" ? P : k.strategy == "usp" ? k.ulysses : 1;
  if (P % U != 0) return;
  Mesh mesh(1, P, U, 1);
  const int64_t B = k.batch, S = k.seq, L = S / P, H = kHeads, G = kKvHeads, D = kHeadDim;
  CpLayout layout(k.zigzag ? LayoutKind::zigzag : LayoutKind::contiguous, S, P, U);
  std::vector<int64_t> pos(B * L);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < L; ++i) pos[b * L + i] = layout.token_indices(mesh.cp_rank())[i];
  std::mt19937 rng(1 + mesh.cp_rank());
  std::normal_distribution<float> normal;
  auto random = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  std::vector<float> q = random(B * L * H * D), kk = random(B * L * G * D), v = random(B * L * G * D);
  std::vector<float> o(B * L * H * D), dout = random(B * L * H * D), lse(B * L * H);
  std::vector<float> dq(q.size()), dk(kk.size()), dv(v.size());
  AttentionArgs a;
  a.q = TensorView(q.data(), DType::f32, {B, L, H, D});
  a.k = TensorView(kk.data(), DType::f32, {B, L, G, D});
  a.v = TensorView(v.data(), DType::f32, {B, L, G, D});
  a.q_pos = a.kv_pos = pos.data();
  a.mask = mask_for(k);
  auto attention = make_cp_attention(parse_enum<CpStrategy>(k.strategy), mesh);
  mesh.reset_counters();
  TensorView ov(o.data(), DType::f32, {B, L, H, D}), dov(dout.data(), DType::f32, {B, L, H, D});
  attention->forward(a, ov, lse.data());
  attention->backward(a, ov, lse.data(), dov, TensorView(dq.data(), DType::f32, {B, L, H, D}),
                      TensorView(dk.data(), DType::f32, {B, L, G, D}),
                      TensorView(dv.data(), DType::f32, {B, L, G, D}));
  ByOp measured;
  add(measured, mesh.total_counters());

  ByOp predicted;
  RunConfig c = config_for(k, P);
  for (bool backward : {false, true})
    for (const CommLine& l : attention_call_comm(c, backward, mesh.cp_rank())) {
      predicted[comm_op_name(l.op)].first += l.bytes_sent;
      predicted[comm_op_name(l.op)].second += l.bytes_received;
    }
  std::string what = k.strategy + (k.strategy == "usp" ? std::to_string(k.ulysses) : "") + " " +
                     k.attention_type + (k.zigzag ? " zigzag" : " contiguous") + " B=" +
                     std::to_string(B) + " S=" + std::to_string(S) + " rank " +
                     std::to_string(mesh.cp_rank()) + "/" + std::to_string(P);
  if (P > 1) {
    EXPECT_FALSE(measured.empty()) << what;
  }
  EXPECT_EQ(measured, predicted) << what;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* strategy : {"all_gather", "ulysses", "ring"})
    for (const char* mask : {"causal", "full", "local", "chunked"})
      for (bool zigzag : {false, true}) out.push_back({strategy, 1, mask, 300, zigzag, 1, 2048});
  out.push_back({"ring", 1, "causal", 0, true, 2, 2048});
  out.push_back({"ring", 1, "local", 100, false, 1, 8192});  // a window far shorter than a shard
  out.push_back({"usp", 2, "causal", 0, true, 1, 4096});
  out.push_back({"usp", 2, "local", 300, false, 2, 2048});
  return out;
}

TEST(PlanComm, PredictedBytesEqualTheCountersForEveryStrategy) {
  for (const Case& k : cases()) run_case(k);
}

}  // namespace
}  // namespace longctx
