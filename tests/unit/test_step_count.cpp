// count_step (src/plan/step_count.h): one training step run on a meta device
// over a counting mesh. Its collectives are held against real steps by
// tests/mpi/test_plan_memory.cpp; here its kernel counts are held against
// the calls the model documents (src/model/llama.h, the layer math), derived
// independently by hand from the shapes, and its counted loops
// (for_each_alike) against running every iteration.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "comm/mesh.h"
#include "core/device.h"
#include "model/llama.h"
#include "plan/step_count.h"

namespace longctx {
namespace {

RunConfig tiny(const std::string& dtype, const std::string& remat, int64_t tp, int64_t seq) {
  RunConfig c = config_from_values({{"base_emb_dim", int64_t(48)},
                                    {"base_num_query_heads", int64_t(4)},
                                    {"base_num_kv_heads", int64_t(2)},
                                    {"head_dim", int64_t(12)},
                                    {"base_mlp_dim", int64_t(80)},
                                    {"base_num_decoder_layers", int64_t(3)},
                                    {"vocab_size", int64_t(300)},
                                    {"max_target_length", seq},
                                    {"per_device_batch_size", int64_t(2)},
                                    {"ici_tensor_parallelism", tp},
                                    {"ici_context_parallelism", int64_t(1)},
                                    {"remat_policy", remat},
                                    {"dtype", dtype}});
  return c;
}

// The model's calls per step (no token chunks, no sequence parallelism), by
// hand from the layer math: per layer forward two norms, RoPE on q and k,
// two residual adds, SwiGLU; backward the norm and SwiGLU again (q/k/v's norm,
// RoPE and the out_proj add again when the policy recomputes them), SwiGLU's
// and both norms' gradients, RoPE's inverse, the attention norm once more;
// per step the embedding and its gradient (priced as adds), the final norm,
// the cross-entropy; per parameter the optimizer. bf16 also rounds q/k/v and
// gate/up after their GEMMs (again when recomputed), the gradient operands of
// backward's GEMMs (dL/dx twice, dO, dq/dk/dv), the loss's dlogits, the weights.
std::map<std::string, double> expected_kernels(const RunConfig& c) {
  const LlamaConfig& m = c.model;
  const double N = double(c.per_device_batch_size * c.max_target_length), L = double(m.num_layers), d = double(m.d_model);
  const double Hl = double(m.num_heads / c.tp), Gl = double(m.num_kv_heads / c.tp), D = double(m.head_dim);
  const double Fl = double(m.mlp_dim / c.tp), V = double(m.vocab_size), qkv_cols = (Hl + 2 * Gl) * D;
  const SaveSet save = c.save_set();
  const double qkv = save.qkv ? 0 : 1, out = save.out_proj ? 0 : 1, mlpwi = save.mlpwi ? 0 : 1;
  const double params = double(parameters_per_tp_rank(m, c.tp));
  std::map<std::string, double> k = {
      {"rmsnorm_forward", N * d * (L * (4 + qkv) + 1)},
      {"rmsnorm_backward", N * d * (2 * L + 1)},
      {"rope", N * (Hl + Gl) * D * L * (2 + qkv)},
      {"residual_add", N * d * (L * (2 + out) + 2)},
      {"swiglu_forward", N * Fl * 2 * L},
      {"swiglu_backward", N * Fl * L},
      {"cross_entropy", N * V},
      {"optimizer", params}};
  if (c.dtype == DType::bf16)
    k["convert"] = N * L * (qkv_cols * (1 + qkv) + 2 * Fl * (1 + mlpwi) + 2 * d + Hl * D + qkv_cols) + N * V + params;
  // GEMMs: each projection [N, in] -> [N, out] forward, its weight and input
  // gradients, and the forward again when recomputed; the LM head once.
  auto projection = [&](double in, double o, double recomputed) { return 2 * N * in * o * (3 + recomputed); };
  k["gemm"] = L * (projection(d, qkv_cols, qkv) + projection(Hl * D, d, out) + projection(d, 2 * Fl, mlpwi) +
                   projection(Fl, d, 0)) +
              projection(d, V, 0);
  return k;
}

TEST(StepCount, KernelCountsEqualTheModelsDocumentedCalls) {
  for (const char* dtype : {"float32", "bfloat16"})
    for (const char* remat : {"full", "none", "minimal", "save_context"})
      for (int64_t tp : {1, 2}) {
        const RunConfig c = tiny(dtype, remat, tp, 40);
        const StepCount counted = count_step(c, tp, 1, 0);
        const std::map<std::string, double> want = expected_kernels(c);
        EXPECT_EQ(counted.kernels.size(), want.size()) << dtype << " " << remat << " tp=" << tp;
        for (const auto& [kernel, amount] : want) {
          ASSERT_TRUE(counted.kernels.count(kernel)) << kernel << " " << dtype << " " << remat << " tp=" << tp;
          EXPECT_EQ(counted.kernels.at(kernel), amount) << kernel << " " << dtype << " " << remat << " tp=" << tp;
        }
      }
}

// Token chunks and the loss head's row chunks run one iteration counted n
// times on a meta device: the same totals as the whole sequence at once
// (what each elementwise kernel and GEMM touches does not depend on how the
// rows are cut), and the tp collectives n times as many calls, the same bytes.
TEST(StepCount, CountedChunksAddUpToTheWholeSequence) {
  for (int64_t chunk : {7, 16, 40}) {
    RunConfig whole = tiny("bfloat16", "full", 2, 40), chunked = whole;
    chunked.layer_token_chunk = chunk;
    whole.tp_sequence_parallel = chunked.tp_sequence_parallel = true;
    const StepCount a = count_step(whole, 2, 1, 1), b = count_step(chunked, 2, 1, 1);
    for (const auto& [kernel, amount] : a.kernels) EXPECT_EQ(b.kernels.at(kernel), amount) << kernel << " chunk " << chunk;
    for (CommOp op : {CommOp::all_gather, CommOp::reduce_scatter, CommOp::all_reduce})
      EXPECT_EQ(a[MeshAxis::tp][op].bytes_sent, b[MeshAxis::tp][op].bytes_sent) << comm_op_name(op) << " chunk " << chunk;
    EXPECT_GT(b[MeshAxis::tp][CommOp::all_gather].calls, a[MeshAxis::tp][CommOp::all_gather].calls) << chunk;
  }
}

TEST(StepCount, CountRepeatMultipliesKernelsAndCollectivesAndNests) {
  const std::unique_ptr<Device> meta = Device::make_meta(1);
  const DeviceScope on_meta(*meta);
  MeshShape shape;
  shape.tp = 4;
  const Mesh mesh = Mesh::counting(shape, 1);
  const Buffer out(MemCategory::scratch, "out", 64);
  int runs = 0;
  for_each_alike(3, [&](int64_t i) {
    EXPECT_EQ(i, 0);
    ++runs;
    for_each_alike(5, [&](int64_t) {
      ++runs;
      EXPECT_TRUE(counted_on_meta(out.data(), "k", 2.0));
      double x = 0;
      mesh.tp().all_reduce_sum(&x, 1);
    });
  });
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(count_repeat(), 1);
  EXPECT_EQ(meta->counted().at("k"), 2.0 * 15);
  EXPECT_EQ(mesh.tp().counters()[CommOp::all_reduce].calls, 15);
  EXPECT_EQ(mesh.tp().counters()[CommOp::all_reduce].bytes_sent, 15 * (2 * 8 * 3 / 4));
  // On the CPU every iteration runs.
  const DeviceScope on_cpu(Device::cpu());
  int cpu_runs = 0;
  for_each_alike(4, [&](int64_t i) { EXPECT_EQ(i, cpu_runs++); });
  EXPECT_EQ(cpu_runs, 4);
}

}  // namespace
}  // namespace longctx
