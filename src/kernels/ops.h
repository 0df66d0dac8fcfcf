#pragma once
// The model's elementwise and memory-bound ops, each forward and backward,
// each with a float64 naive reference beside it (ops_reference.cpp) that the
// tests compare against on odd shapes.
//
// Activations are TensorViews, fp32 or bf16 (dtype: bfloat16): a bf16 input
// is widened, the math runs in fp32 (norm statistics, SwiGLU, sums), and a
// bf16 output is rounded once. Which views may be bf16 is said per op; the
// others must be fp32 (ShapeError otherwise). 2-D views are
// [rows, cols] with any row stride and contiguous columns, so the halves of a
// fused projection output can be passed without copies.
//
// Gradients of parameters (dw, dtable) and of inputs that feed a residual
// (rmsnorm dx) are ACCUMULATED (+=); everything else is written.
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace longctx {

// ---- RMSNorm: y = x / sqrt(mean(x^2) + eps) * w -------------------------------
// x, y, dy, dx [N, C]; w, dw [C]. x and y may be bf16; dy, dx are fp32.
void rmsnorm_forward(const TensorView& x, const float* w, double eps, const TensorView& y);
// dx += d/dx, dw += d/dw.
void rmsnorm_backward(const TensorView& x, const float* w, double eps, const TensorView& dy,
                      const TensorView& dx, float* dw);
void rmsnorm_forward_reference(const TensorView& x, const float* w, double eps,
                               const TensorView& y);
void rmsnorm_backward_reference(const TensorView& x, const float* w, double eps,
                                const TensorView& dy, const TensorView& dx, float* dw);

// ---- RoPE, Hugging Face rotate-half convention -------------------------------
// For head vector x = [x1, x2] (halves of D) and frequency i < D/2 at angle
// a = pos * inv_freq[i]:  y1 = x1 cos a - x2 sin a,  y2 = x2 cos a + x1 sin a.
struct RopeParams {
  double theta = 500000.0;
  bool llama3_scaling = false;  // Llama 3.1 frequency scaling
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};
// inv_freq [D/2] (Hugging Face's _compute_llama3_parameters when scaling is on).
std::vector<double> rope_inv_freq(const RopeParams& p, int64_t head_dim);
// cos, sin [n, D/2] for the given GLOBAL positions, angles computed in float64.
void rope_table(const RopeParams& p, int64_t head_dim, const int64_t* positions, int64_t n,
                float* cos, float* sin);
// x [N, H, D] (strided rows and heads, contiguous D, fp32), rotated in place with
// the table of its N rows. Backward applies the inverse rotation to dx in place.
void rope_forward(const TensorView& x, const float* cos, const float* sin);
void rope_backward(const TensorView& dx, const float* cos, const float* sin);
// Reference: angles straight from positions, in float64; inverse = backward.
void rope_reference(const RopeParams& p, const TensorView& x, const int64_t* positions,
                    bool inverse);

// ---- SwiGLU: a = silu(g) * u ---------------------------------------------------
// g, u, a, da, dg, du [N, F], each fp32 or bf16. dg, du are written and may alias g, u.
void swiglu_forward(const TensorView& g, const TensorView& u, const TensorView& a);
void swiglu_backward(const TensorView& g, const TensorView& u, const TensorView& da,
                     const TensorView& dg, const TensorView& du);
void swiglu_forward_reference(const TensorView& g, const TensorView& u, const TensorView& a);
void swiglu_backward_reference(const TensorView& g, const TensorView& u, const TensorView& da,
                               const TensorView& dg, const TensorView& du);

// ---- Cross-entropy over one chunk of logits, softmax and gradient fused -----
// logits [R, V]; targets [R] in [0, V) (DataError otherwise); weights [R] or
// nullptr (all 1). Returns sum_r w_r * (lse_r - logits[r, t_r]). When dlogits
// is non-null it is WRITTEN (it may alias logits) with
// grad_scale * w_r * (softmax_r - onehot(t_r)).
// row_losses (optional, [R]): each row's weighted loss, as summed.
double cross_entropy(const TensorView& logits, const int32_t* targets, const float* weights,
                     float grad_scale, const TensorView* dlogits, double* row_losses = nullptr);
double cross_entropy_reference(const TensorView& logits, const int32_t* targets,
                               const float* weights, float grad_scale, const TensorView* dlogits);

// ---- Precision boundaries (fp32 <-> bf16) ---------------------------------------
// dst = src, [N, C] each fp32 or bf16 (bf16 dst: rounded to nearest even).
void convert(const TensorView& src, const TensorView& dst);
// out = a + b in fp32, each [N, C] fp32 or bf16; out may alias a or b.
void residual_add(const TensorView& a, const TensorView& b, const TensorView& out);

// ---- Token embedding --------------------------------------------------------------
// table, dtable [V, C]; out, dout [n, C]; tokens in [0, V) (DataError otherwise).
// out may be bf16 (rounded from the fp32 table); dout is fp32.
void embedding_forward(const int32_t* tokens, int64_t n, const float* table, int64_t vocab,
                       const TensorView& out);
// dtable += scatter of dout rows (deterministic: no atomics).
void embedding_backward(const int32_t* tokens, int64_t n, const TensorView& dout, float* dtable,
                        int64_t vocab);
void embedding_backward_reference(const int32_t* tokens, int64_t n, const TensorView& dout,
                                  float* dtable, int64_t vocab);

// ---- AdamW (PyTorch semantics, decoupled weight decay) ----------------------
struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // 1-based, for bias correction
};
// p = p (1 - lr wd) - lr mhat / (sqrt(vhat) + eps), with m, v updated first.
void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWParams& h);
void adamw_update_reference(float* param, const float* grad, float* m, float* v, int64_t n,
                            const AdamWParams& h);

// ---- Views: the moves between kernels --------------------------------------------
// (cp/'s wire records, head slices and token reorders.) Views of rank 1 to 4
// with a contiguous last dim, any other strides. Named kernels rather than
// host loops in cp/: a meta device (core/device.h) skips them, and a device
// backend implements them once.
// dst = src, same shape; fp32 or bf16 each (fp32 -> bf16 rounds, bf16 -> fp32 widens).
void copy_view(const TensorView& src, const TensorView& dst);
// dst += src; dst fp32, src fp32 or bf16 (widened).
void add_view(const TensorView& src, const TensorView& dst);
// dst = 0 (fp32).
void zero_view(const TensorView& dst);
// `rows` rows of `row_bytes` bytes, `src_stride` and `dst_stride` bytes
// apart: what is not fp32 or bf16 (positions, segment ids) or whole records.
void copy_rows(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows, int64_t row_bytes);

// ---- fp32 vectors: the bookkeeping between kernels ----------------------------
// (zeroed gradients, gathered pieces, sums of squares). Named kernels rather
// than host loops so that a meta device (core/device.h) skips them like the rest.
void fill_f32(float* dst, int64_t n, float value);
void copy_f32(const float* src, int64_t n, float* dst);
void add_f32(const float* src, int64_t n, float* dst);  // dst += src
void scale_f32(float* dst, int64_t n, float factor);
// sum of src[i]^2 in double, in index order (0 on a meta device).
double sum_of_squares(const float* src, int64_t n);

}  // namespace longctx
