#include "train/metrics.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/memory.h"

namespace longctx {

double step_flops(const LlamaConfig& c, int64_t tokens, int64_t unmasked_pairs) {
  const double matmul_params = static_cast<double>(c.num_parameters()) -
                               (c.tie_embeddings ? 0.0 : static_cast<double>(c.vocab_size * c.d_model));
  return 6.0 * matmul_params * static_cast<double>(tokens) +
         12.0 * static_cast<double>(c.head_dim * c.num_heads * c.num_layers) * static_cast<double>(unmasked_pairs);
}

void fill_rates(StepMetrics& m, int64_t devices, double peak_tflops_per_device) {
  const double per_device_seconds = m.seconds * static_cast<double>(devices);
  m.tokens_per_second_per_device = static_cast<double>(m.tokens) / per_device_seconds;
  m.tflops_per_device = m.flops / per_device_seconds / 1e12;
  m.mfu = peak_tflops_per_device > 0 ? m.tflops_per_device / peak_tflops_per_device : 0.0;
}

std::string step_line(const StepMetrics& m) {
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "step %lld | %.3f s | loss %.4f | lr %.2e | gnorm %.3f | %.4g tok/s/dev | %.4f TFLOP/s/dev | "
                "MFU %.1f%% | peak %s",
                static_cast<long long>(m.step), m.seconds, m.loss, m.learning_rate, m.grad_norm,
                m.tokens_per_second_per_device, m.tflops_per_device, 100.0 * m.mfu,
                format_bytes(static_cast<size_t>(m.peak_memory_bytes)).c_str());
  return buf;
}

std::string step_json(const StepMetrics& m) {
  nlohmann::ordered_json j = {{"step", m.step},
                              {"seconds", m.seconds},
                              {"loss", m.loss},
                              {"learning_rate", m.learning_rate},
                              {"grad_norm", m.grad_norm},
                              {"tokens", m.tokens},
                              {"flops", m.flops},
                              {"tokens_per_second_per_device", m.tokens_per_second_per_device},
                              {"tflops_per_device", m.tflops_per_device},
                              {"mfu", m.mfu},
                              {"peak_memory_bytes", m.peak_memory_bytes}};
  return j.dump();
}

}  // namespace longctx
