#pragma once
// Per-step metrics: the printed step line and the JSON line (metrics_file).
//
// FLOPs of one training step (model FLOPs, recomputation not credited):
//   6 * N * tokens + 12 * head_dim * num_heads * num_layers * unmasked_pairs
// where N = the parameters a token's matmuls touch (everything but the
// embedding lookup; the LM head counts even when tied) and unmasked_pairs the
// (q, kv) pairs the mask allows (per head, summed over the global batch):
// attention forward is 4 * head_dim per pair and head, backward 8 * head_dim.
#include <cstdint>
#include <string>

#include "core/model_shape.h"

namespace longctx {

struct StepMetrics {
  int64_t step = 0;                    // 1-based: the step just completed
  double seconds = 0;                  // wall time of the step
  double loss = 0;                     // mean cross-entropy (nats) over the global batch
  double grad_norm = 0;                // global gradient norm before clipping
  double learning_rate = 0;
  int64_t tokens = 0;                  // token slots in the global batch (B * dp * S)
  double flops = 0;                    // model FLOPs of the step (all devices)
  double tokens_per_second_per_device = 0;
  double tflops_per_device = 0;        // TFLOP/s per device
  double mfu = 0;                      // tflops_per_device / peak (fraction)
  int64_t peak_memory_bytes = 0;       // max over ranks of the tracker's peak
};

double step_flops(const LlamaConfig& model, int64_t tokens, int64_t unmasked_pairs);

// Fills the rates from seconds, flops, tokens, devices and the peak (TFLOP/s).
void fill_rates(StepMetrics& m, int64_t devices, double peak_tflops_per_device);

// "step 12 | 1.234 s | loss 3.2100 | lr 2.9e-04 | gnorm 1.02 | 5.1e+03 tok/s/dev | 0.250 TFLOP/s/dev | MFU 21.3% | peak 1.20 GiB"
std::string step_line(const StepMetrics& m);
std::string step_json(const StepMetrics& m);  // one JSON object, no newline

}  // namespace longctx
