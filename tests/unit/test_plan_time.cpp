// The planner's step-time model: what each profile table changes, checked
// against hand counts (no timing), and that datasheet profiles without the
// measured tables keep their old meaning.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "core/config.h"
#include "plan/hardware.h"
#include "plan/planner.h"
#include "temp_dir.h"

namespace longctx {
namespace {

// A one-device profile whose rates are round numbers.
HardwareProfile round_profile() {
  HardwareProfile h;
  h.name = "round";
  h.peak_flops_fp32 = 1e12;
  h.matmul_efficiency = 1.0;
  h.attention_efficiency = 0.5;
  h.memory_bytes = int64_t{1} << 40;
  h.memory_bandwidth = 1e9;
  h.p2p_bandwidth = h.collective_bandwidth = h.all_to_all_bandwidth = 1e9;
  return h;
}

RunConfig small_config(const std::string& attention, int64_t seq, const std::string& remat) {
  RunConfig c = config_from_values({});
  c.model.d_model = 64;
  c.model.num_heads = 4;
  c.model.num_kv_heads = 2;
  c.model.head_dim = 16;
  c.model.mlp_dim = 128;
  c.model.num_layers = 2;
  c.attention_type = parse_enum<MaskKind>(attention);
  c.sliding_window_size = attention == "local" ? 200 : 0;
  c.max_target_length = seq;
  c.remat_policy = parse_enum<RematPolicy>(remat);
  c.packing = false;
  c.dtype = DType::f32;
  return c;
}

StrategyPlan plan(const RunConfig& c, const HardwareProfile& h) { return plan_strategy(c, h, PlanOptions{}); }

TEST(PlanTime, ProfileTablesRoundTrip) {
  TempDir dir;
  HardwareProfile h = round_profile();
  h.matmul_efficiency_per_width = {{64, 0.6}, {1024, 0.95}};
  h.attention_efficiency_per_head_dim = {{32, 0.55}, {128, 0.7}};
  h.attention_forward_efficiency_per_head_dim = {{32, 0.45}, {128, 0.65}};
  h.attention_block = 128;
  h.attention_partial_tile_cost = {{"causal", {{32, 1.5}, {128, 1.3}}}, {"chunked", {{64, 2.5}}}};
  h.elementwise_bandwidth_per_kernel = {{"swiglu_forward", 1.8e9}, {"rope", 13e9}};
  const std::string path = (dir.path / "p.yml").string();
  save_hardware_profile(h, path);
  const HardwareProfile g = load_hardware_profile(path);
  EXPECT_EQ(g.matmul_efficiency_per_width, h.matmul_efficiency_per_width);
  EXPECT_EQ(g.attention_efficiency_per_head_dim, h.attention_efficiency_per_head_dim);
  EXPECT_EQ(g.attention_forward_efficiency_per_head_dim, h.attention_forward_efficiency_per_head_dim);
  EXPECT_EQ(g.attention_block, 128);
  EXPECT_EQ(g.attention_partial_tile_cost, h.attention_partial_tile_cost);
  EXPECT_DOUBLE_EQ(g.attention_partial_tile_cost_at("chunked", 16), 2.5);
  EXPECT_DOUBLE_EQ(g.attention_partial_tile_cost_at("local", 64), 1.0);  // not measured
  EXPECT_EQ(g.elementwise_bandwidth_per_kernel, h.elementwise_bandwidth_per_kernel);
  // Log-linear in the width between points, clamped at the ends.
  EXPECT_NEAR(g.matmul_efficiency_at(256), 0.6 + 0.35 * 2.0 / 4.0, 1e-12);
  EXPECT_DOUBLE_EQ(g.matmul_efficiency_at(16), 0.6);
  EXPECT_DOUBLE_EQ(g.matmul_efficiency_at(8192), 0.95);
  // A kernel missing from the table falls back to memory_bandwidth.
  EXPECT_DOUBLE_EQ(g.elementwise_bandwidth_of("swiglu_forward"), 1.8e9);
  EXPECT_DOUBLE_EQ(g.elementwise_bandwidth_of("residual_add"), 1e9);
}

// The bf16 section: saved and loaded with the same keys as the top level, an
// unknown key in it refused by name.
TEST(PlanTime, ProfileBf16SectionRoundTrip) {
  TempDir dir;
  HardwareProfile h = round_profile();
  h.matmul_efficiency_per_width = {{64, 0.6}, {1024, 0.95}};
  KernelTables& b = h.bf16.emplace();
  b.matmul_efficiency_per_width = {{64, 0.3}, {1024, 0.5}};
  b.attention_efficiency_per_head_dim = {{32, 0.25}};
  b.attention_forward_efficiency_per_head_dim = {{32, 0.2}};
  b.attention_partial_tile_cost = {{"causal", {{32, 1.25}}}};
  b.elementwise_bandwidth_per_kernel = {{"convert", 3e9}, {"rope", 7e9}};
  const std::string path = (dir.path / "p.yml").string();
  save_hardware_profile(h, path);
  const HardwareProfile g = load_hardware_profile(path);
  ASSERT_TRUE(g.bf16.has_value());
  EXPECT_EQ(g.matmul_efficiency_per_width, h.matmul_efficiency_per_width);
  EXPECT_EQ(g.bf16->matmul_efficiency_per_width, b.matmul_efficiency_per_width);
  EXPECT_EQ(g.bf16->attention_efficiency_per_head_dim, b.attention_efficiency_per_head_dim);
  EXPECT_EQ(g.bf16->attention_forward_efficiency_per_head_dim, b.attention_forward_efficiency_per_head_dim);
  EXPECT_EQ(g.bf16->attention_partial_tile_cost, b.attention_partial_tile_cost);
  EXPECT_EQ(g.bf16->elementwise_bandwidth_per_kernel, b.elementwise_bandwidth_per_kernel);
  // A bf16 plan's profile reads the section; an fp32 plan's the top level.
  EXPECT_DOUBLE_EQ(g.for_dtype(DType::bf16).matmul_efficiency_at(64), 0.3);
  EXPECT_DOUBLE_EQ(g.for_dtype(DType::bf16).elementwise_bandwidth_of("convert"), 3e9);
  EXPECT_DOUBLE_EQ(g.for_dtype(DType::f32).matmul_efficiency_at(64), 0.6);
  EXPECT_FALSE(g.for_dtype(DType::bf16).bf16.has_value());
  // Without a section every dtype reads the top level.
  EXPECT_DOUBLE_EQ(round_profile().for_dtype(DType::bf16).matmul_efficiency_at(64), 1.0);
  // A measured profile without the section (older plan --measure: GEMM and
  // elementwise tables at the top level) warns bf16 plans only; a datasheet
  // profile (no tables, or h200's GEMM table measured in bf16) never does.
  HardwareProfile old_measure = g;
  old_measure.bf16.reset();
  old_measure.elementwise_bandwidth_per_kernel = {{"convert", 5e9}};
  EXPECT_NE(old_measure.dtype_tables_warning(DType::bf16).find("no bf16 tables"), std::string::npos);
  EXPECT_EQ(old_measure.dtype_tables_warning(DType::f32), "");
  EXPECT_EQ(g.dtype_tables_warning(DType::bf16), "");
  EXPECT_EQ(round_profile().dtype_tables_warning(DType::bf16), "");

  const std::string bad = (dir.path / "bad.yml").string();
  {
    std::ofstream f(bad);
    f << "memory_bytes: 1\nmemory_bandwidth: 1\np2p_bandwidth: 1\ncollective_bandwidth: 1\n"
         "all_to_all_bandwidth: 1\nbf16:\n  peak_flops_fp32: 1\n";
  }
  try {
    load_hardware_profile(bad);
    FAIL() << "a number in the bf16 section was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("bf16.peak_flops_fp32"), std::string::npos) << e.what();
  }
}

// A profile with both sets of tables: each plan uses its dtype's, and the
// seconds follow from the tables and a hand count of the work. Flat tables,
// full mask, no tiles, remat none (every saved point kept), one rank.
TEST(PlanTime, Bf16PlansUseTheBf16Tables) {
  HardwareProfile h = round_profile();
  h.peak_flops_bf16 = 4e12;
  auto tables = [](double matmul, double attention, double forward, double swiglu_bw, double convert_bw) {
    KernelTables t;
    t.matmul_efficiency_per_width = {{16, matmul}, {4096, matmul}};
    t.attention_efficiency_per_head_dim = {{16, attention}};
    t.attention_forward_efficiency_per_head_dim = {{16, forward}};
    for (const ElementwiseKernel& k : elementwise_kernels()) t.elementwise_bandwidth_per_kernel[k.name()] = 1e30;
    t.elementwise_bandwidth_per_kernel["swiglu_forward"] = swiglu_bw;
    t.elementwise_bandwidth_per_kernel["convert"] = convert_bw;
    return t;
  };
  static_cast<KernelTables&>(h) = tables(0.8, 0.6, 0.5, 2.0, 5.0);
  h.bf16 = tables(0.4, 0.3, 0.2, 1.0, 0.5);
  RunConfig c = small_config("full", 1024, "none");
  const double N = 1024, d = 64, H = 4, D = 16, F = 128, L = 2, qkv = (4 + 2 * 2) * D, V = double(c.model.vocab_size);
  // Per layer q/k/v, output, gate/up and down projections, then the LM head; forward and two gradients.
  const double matmul_flops = 3 * 2 * N * (L * (d * qkv + H * D * d + d * 2 * F + F * d) + d * V);
  const double pairs = L * H * N * N;  // full mask, one batch row
  for (DType dtype : {DType::f32, DType::bf16}) {
    c.dtype = dtype;
    const bool low = dtype == DType::bf16;
    const KernelTables& t = low ? *h.bf16 : h;
    const double peak = low ? h.peak_flops_bf16 : h.peak_flops_fp32;
    const StrategyPlan p = plan(c, h);
    const std::string what = name_of(dtype);
    EXPECT_NEAR(p.matmul_seconds, matmul_flops / (peak * t.matmul_efficiency_per_width.at(16)), 1e-9 * p.matmul_seconds)
        << what;
    // Forward and backward once per layer: 14 D FLOPs per pair at the forward + backward rate.
    EXPECT_NEAR(p.attention_seconds, pairs * 14 * D / (peak * t.attention_efficiency_per_head_dim.at(16)),
                1e-9 * p.attention_seconds)
        << what;
    // SwiGLU forward twice per layer (forward, again in backward): fp32 reads
    // gate and up and writes the activation, 12 bytes; bf16 6. bf16 also
    // rounds q/k/v and gate/up after their GEMMs, per layer the gradient
    // operands dL/dx (twice), dO and dq/dk/dv, the dlogits and the weights:
    // 6 bytes each (read fp32, write bf16); fp32 rounds nothing.
    const double swiglu = N * F * 2 * L * (low ? 6 : 12) / t.elementwise_bandwidth_per_kernel.at("swiglu_forward");
    const double rounded = N * L * (qkv + 2 * F + 2 * d + H * D + qkv) + N * V + double(c.model.num_parameters());
    const double convert = low ? rounded * 6 / t.elementwise_bandwidth_per_kernel.at("convert") : 0.0;
    EXPECT_NEAR(p.elementwise_seconds, swiglu + convert, 1e-9 * p.elementwise_seconds) << what;
  }
}

// The TPU profiles are calibrated scalars; h100 and h200 carry GEMM widths
// and attention rates measured on an H200 (bench/results/h200_kernels.md).
TEST(PlanTime, DatasheetProfilesUseTheirCalibration) {
  for (const char* name : {"tpu-v5p", "tpu-v7", "h100", "h200"}) {
    const HardwareProfile h = load_hardware_profile(name, LONGCTX_SOURCE_DIR "/configs/hardware");
    const bool gpu = name[0] == 'h';
    EXPECT_FALSE(h.bf16.has_value()) << name << ": its efficiencies apply to bf16 already";
    EXPECT_EQ(h.dtype_tables_warning(DType::bf16), "") << name;
    // The calibrated numbers each say where they come from.
    for (const char* key : {"matmul_efficiency", "attention_efficiency", "attention_block",
                            "attention_partial_tile_cost", "attention_half_rate_tokens"})
      EXPECT_TRUE(h.sources.count(key)) << name << " has no source for " << key;
    if (gpu) {
      for (const char* key : {"matmul_efficiency_per_width", "attention_forward_efficiency_per_head_dim"})
        EXPECT_TRUE(h.sources.count(key)) << name << " has no source for " << key;
    }
    EXPECT_GT(h.attention_half_rate_tokens, 0) << name;
    EXPECT_GT(h.elementwise_bandwidth_of("rope"), 0) << name;
    // Matmul time: the FLOPs at the datasheet rate (TPU), or between the
    // rates of the narrowest and widest measured GEMMs (GPU, the small test
    // model's widths: all below 1024, so the narrow end).
    RunConfig c = small_config("causal", 1024, "full");
    c.dtype = DType::bf16;
    const StrategyPlan p = plan(c, h);
    const double mm_flops = p.hardware_flops - (4.0 * 2 + 10.0) * 16 * double(p.attention_pairs);
    const double eff = gpu ? h.matmul_efficiency_at(1024) : h.matmul_efficiency;
    EXPECT_NEAR(p.matmul_seconds, mm_flops / (h.peak_flops_bf16 * eff), 1e-9 * p.matmul_seconds) << name;
    if (gpu) {
      EXPECT_NEAR(h.matmul_efficiency_at(8192), 0.75, 1e-12);  // 8B's q/o, up, down: the measured 0.71-0.79
      EXPECT_LT(h.matmul_efficiency_at(2048), h.matmul_efficiency_at(4096));
    } else {
      EXPECT_DOUBLE_EQ(h.matmul_efficiency_at(512), h.matmul_efficiency) << name;
    }
  }
}

TEST(PlanTime, MatmulFollowsTheWidthTable) {
  HardwareProfile h = round_profile();
  const RunConfig c = small_config("causal", 1024, "full");
  const double flat = plan(c, h).matmul_seconds;
  h.matmul_efficiency_per_width = {{16, 0.5}, {4096, 0.5}};
  EXPECT_NEAR(plan(c, h).matmul_seconds, 2 * flat, 1e-12 * flat);
}

TEST(PlanTime, AttentionCostsTheTilesTheKernelComputes) {
  HardwareProfile h = round_profile();
  // A full mask over whole tiles: every computed pair is unmasked.
  const RunConfig full = small_config("full", 1024, "full");
  const double by_pairs = plan(full, h).attention_seconds;
  h.attention_block = 128;
  h.attention_partial_tile_cost["causal"] = {{16, 2.0}};
  EXPECT_NEAR(plan(full, h).attention_seconds, by_pairs, 1e-12 * by_pairs);
  // Causal over 8 x 8 tiles: 28 full and 8 partial (diagonal) ones, the
  // partial ones at twice the cost, against S (S + 1) / 2 unmasked pairs.
  const RunConfig causal = small_config("causal", 1024, "full");
  h.attention_block = 0;
  const double pairs_s = plan(causal, h).attention_seconds;
  h.attention_block = 128;
  const double tiles_s = plan(causal, h).attention_seconds;
  const double tile = 128.0 * 128.0, pairs = 1024.0 * 1025.0 / 2;
  EXPECT_NEAR(tiles_s / pairs_s, (28 * tile + 2.0 * 8 * tile) / pairs, 1e-12);
  EXPECT_EQ(plan(causal, h).attention_pairs, plan(small_config("causal", 1024, "full"), round_profile()).attention_pairs);
}

// The chunk fall-off: a ring step's kernel call of c query against c key
// tokens (full mask) costs c^2 + h c pairs for attention_half_rate_tokens h,
// i.e. it runs at attention_efficiency x c / (c + h). Doubling the sequence
// doubles the chunk, so the time grows by 2 (2c + h) / (c + h), not 4.
TEST(PlanTime, RingChunksFallOffAtTheHalfRateLength) {
  HardwareProfile h = round_profile();
  h.attention_half_rate_tokens = 256;
  const int64_t R = 4, heads = 4, D = 16;
  auto ring = [&](int64_t seq) {
    RunConfig c = small_config("full", seq, "none");
    c.cp = R;
    c.cp_strategy = CpStrategy::ring;
    c.cp_load_balance = false;
    c.model.num_layers = 1;
    return plan(c, h).attention_seconds;
  };
  // One layer, no remat: one forward (4 D FLOPs per pair) and one backward
  // (10 D) at half the 1e12 FLOP/s peak; every ring step is a full c x c call.
  auto expected = [&](double c) {
    const double per_pair = (4.0 + 10.0) * D / (0.5 * 1e12);
    return double(R) * heads * (c * c + 256.0 * c) * per_pair;
  };
  for (int64_t c : {256, 512}) EXPECT_NEAR(ring(R * c), expected(double(c)), 1e-9 * expected(double(c))) << c;
  EXPECT_NEAR(ring(2 * R * 256) / ring(R * 256), 2.0 * (512 + 256) / (256 + 256), 1e-9);
  // Without the fall-off the same steps cost their pairs only.
  h.attention_half_rate_tokens = 0;
  EXPECT_NEAR(ring(R * 256), expected(256) / 2, 1e-9 * expected(256));
}

TEST(PlanTime, ElementwiseCountsTheRecomputedKernels) {
  // At one byte per second per kernel, remat full minus none is the bytes of
  // what backward recomputes per layer: the attention norm (8 bytes per
  // element), RoPE on q and k (8), the out_proj residual add (12).
  HardwareProfile h = round_profile();
  for (const ElementwiseKernel& k : elementwise_kernels()) h.elementwise_bandwidth_per_kernel[k.name()] = 1.0;
  const RunConfig none = small_config("causal", 256, "none"), full = small_config("causal", 256, "full");
  const double N = 256, d = 64, qk = (4 + 2) * 16, L = 2;
  EXPECT_NEAR(plan(full, h).elementwise_seconds - plan(none, h).elementwise_seconds,
              L * N * (8 * d + 8 * qk + 12 * d), 1e-6);
  // The optimizer: 36 bytes per parameter.
  h.elementwise_bandwidth_per_kernel["optimizer"] = 1e30;
  const double without = plan(none, h).elementwise_seconds;
  h.elementwise_bandwidth_per_kernel["optimizer"] = 1.0;
  EXPECT_NEAR(plan(none, h).elementwise_seconds - without, 36.0 * double(none.model.num_parameters()), 1e-3);
}

}  // namespace
}  // namespace longctx

namespace longctx {
namespace {

// A torus profile times the ring's sends by bytes x hops. Full mask,
// contiguous layout, ring of 4: every rank sends its whole shard to the 3
// others, at ring distances 1, 2 and 1 (the rank 3 away is 1 the other way),
// so the sends cost (1 + 2 + 1) / 3 = 4/3 of a switch's; bytes sent and every
// other line stay the same.
TEST(PlanTime, TorusRingSendsCostBytesTimesHops) {
  RunConfig c = small_config("full", 1024, "full");
  c.cp = 4;
  c.cp_strategy = CpStrategy::ring;
  c.cp_load_balance = false;
  c.model.num_layers = 1;
  HardwareProfile h = round_profile();
  h.latency = 0;
  h.devices_per_node = 4;
  const StrategyPlan flat = plan(c, h);
  h.torus = 1;
  const StrategyPlan torus = plan(c, h);
  ASSERT_EQ(flat.comm.size(), torus.comm.size());
  int sends = 0;
  for (size_t i = 0; i < flat.comm.size(); ++i) {
    const CommLine &a = flat.comm[i], &b = torus.comm[i];
    EXPECT_EQ(a.bytes_sent, b.bytes_sent) << a.what;
    if (a.axis == MeshAxis::ring && a.op == CommOp::send) {
      ++sends;
      EXPECT_EQ(b.hop_bytes * 3, a.bytes_sent * 4) << a.what;
      EXPECT_NEAR(b.seconds, a.seconds * 4 / 3, 1e-12 * a.seconds) << a.what;
    } else {
      EXPECT_EQ(a.seconds, b.seconds) << a.what;
    }
  }
  EXPECT_EQ(sends, 2);  // forward (K,V) and backward (K,V, and dK,dV back), as counted per pass
}

// The optimizer state offloaded to the host moves its moments over the host
// link every step: those bytes are the config's, whatever the profile
// knows; the time is the bytes over the link's bandwidth, and none where
// the profile has no host link (then the report says the time is not
// counted).
TEST(PlanTime, OffloadedStateBytesDoNotDependOnTheProfilesBandwidth) {
  RunConfig c = small_config("causal", 512, "full");
  c.optimizer_memory_host_offload = true;
  HardwareProfile without = round_profile(), with = round_profile();
  with.host_link_bandwidth = 1e9;
  const StrategyPlan a = plan(c, without), b = plan(c, with);
  ASSERT_GT(b.state_offload_moved_bytes, 0);
  EXPECT_EQ(a.state_offload_moved_bytes, b.state_offload_moved_bytes);
  EXPECT_EQ(a.state_offload_seconds, 0.0);
  EXPECT_DOUBLE_EQ(b.state_offload_seconds, double(b.state_offload_moved_bytes) / 1e9);
}

}  // namespace
}  // namespace longctx
