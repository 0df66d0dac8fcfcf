// Fast (OpenMP, vectorisable) model ops. Memory-bound: one pass over the
// data where possible, rows split over threads, sums in fp32 per row.
// Every sum has a fixed order (per row, or per fixed chunk of rows added in
// index order), so results are bit-identical at any thread count.
// Floating-point exceptions are never inspected: without this GCC refuses to
// if-convert min/max and float->int conversions, and the exp loops stay scalar.
// Results are unchanged (no reassociation, no fast-math).
#pragma GCC optimize("no-trapping-math")

#include "kernels/ops.h"

#include "core/device.h"
#include "kernels/simd/convert.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

namespace longctx {

namespace {

void check_rows(const TensorView& t, int64_t rows, int64_t cols, const char* what) {
  if (t.rank == 2 && t.dim(0) == rows && t.dim(1) == cols && t.stride[1] == 1) return;  // the message only on failure
  check_shape(false, std::string(what) + ": expected [" + std::to_string(rows) + "," + std::to_string(cols) +
                         "] with contiguous columns, got " + t.shape_string());
}

float* row(const TensorView& t, int64_t r) { return t.f32() + r * t.stride[0]; }

// Rows of an fp32 or bf16 view, seen as fp32 by the math: an fp32 row is
// used in place; a bf16 row is widened into a per-thread row buffer, and
// written back rounded once, after the fp32 math (so bf16 activations cost
// one rounding per op, and statistics stay fp32).
class RowBuffers {
 public:
  RowBuffers(int64_t cols, int count) : cols_(cols), buf_(static_cast<size_t>(cols * count)) {}
  // Row r of t for reading, as fp32 (buffer `slot` when t is bf16).
  const float* read(const TensorView& t, int64_t r, int slot) {
    if (t.dtype == DType::f32) return row(t, r);
    float* b = buf_.data() + slot * cols_;
    widen_bf16(static_cast<const bf16*>(t.data) + r * t.stride[0], b, cols_);
    return b;
  }
  // Where to write row r of t: the row itself, or buffer `slot` until commit().
  float* write(const TensorView& t, int64_t r, int slot) {
    return t.dtype == DType::f32 ? row(t, r) : buf_.data() + slot * cols_;
  }
  void commit(const TensorView& t, int64_t r, int slot) {
    if (t.dtype == DType::bf16)
      round_to_bf16(buf_.data() + slot * cols_, static_cast<bf16*>(t.data) + r * t.stride[0], cols_);
  }

 private:
  int64_t cols_;
  std::vector<float> buf_;
};

// Reductions over rows use at most this many fixed chunks (enough to feed
// the threads; their partials cost chunks x row width).
constexpr int64_t kMaxRowChunks = 256;

void check_ids(const int32_t* ids, int64_t n, int64_t vocab, const char* what) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= vocab)
      throw DataError(std::string(what) + " id " + std::to_string(ids[i]) + " at index " +
                      std::to_string(i) + " is outside the vocabulary [0, " +
                      std::to_string(vocab) + ")");
}

// exp(x) in fp32 without a libm call, so that `omp simd` loops vectorise
// (glibc's expf is scalar without -ffast-math): Cephes' range reduction
// x = n ln2 + r and degree-6 polynomial, within ~2 ulp. Saturates: 0 below
// -87.3, about 1.7e38 above 88.
inline float exp_fast(float x) {
  x = std::min(std::max(x, -87.3f), 88.0f);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  const float r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * r * r + r + 1.0f;
  const int32_t e = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);  // == n
  return y * std::bit_cast<float>((e + 127) << 23);
}

// out = f(a, b) elementwise over [N, C] views, each fp32 or bf16; out may
// alias a or b (each row is read before it is written).
template <typename F>
void combine_rows(const TensorView& a, const TensorView& b, const TensorView& out, const char* what, F f) {
  const int64_t N = a.dim(0), C = a.dim(1);
  check_rows(a, N, C, (std::string(what) + " a").c_str());
  check_rows(b, N, C, (std::string(what) + " b").c_str());
  check_rows(out, N, C, (std::string(what) + " out").c_str());
#pragma omp parallel
  {
    RowBuffers io(C, 3);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N; ++r) {
      const float* ar = io.read(a, r, 0);
      const float* br = io.read(b, r, 1);
      float* o = io.write(out, r, 2);
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) o[c] = f(ar[c], br[c]);
      io.commit(out, r, 2);
    }
  }
}

}  // namespace

// ---- RMSNorm ----------------------------------------------------------------------

void rmsnorm_forward(const TensorView& x, const float* w, double eps, const TensorView& y) {
  const int64_t N = x.dim(0), C = x.dim(1);
  check_rows(x, N, C, "rmsnorm x");
  check_rows(y, N, C, "rmsnorm y");
  return launch(KernelId::rmsnorm_forward, device_of(y), double(y.numel()), [&](const KernelSet&) {
  #pragma omp parallel
    {
      RowBuffers io(C, 2);
  #pragma omp for schedule(static)
      for (int64_t r = 0; r < N; ++r) {
        const float* xr = io.read(x, r, 0);
        float* yr = io.write(y, r, 1);
        float ss = 0.0f;
  #pragma omp simd reduction(+ : ss)
        for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
        const float rstd = 1.0f / std::sqrt(ss / C + static_cast<float>(eps));
  #pragma omp simd
        for (int64_t c = 0; c < C; ++c) yr[c] = xr[c] * rstd * w[c];
        io.commit(y, r, 1);
      }
    }
  });
}

void rmsnorm_backward(const TensorView& x, const float* w, double eps, const TensorView& dy,
                      const TensorView& dx, float* dw) {
  const int64_t N = x.dim(0), C = x.dim(1);
  check_rows(x, N, C, "rmsnorm x");
  check_rows(dy, N, C, "rmsnorm dy");
  check_rows(dx, N, C, "rmsnorm dx");
  return launch(KernelId::rmsnorm_backward, device_of(dx), double(dx.numel()), [&](const KernelSet&) {
    dy.f32();  // gradients of the residual stream are fp32
    dx.f32();
    // dw partial sums per fixed chunk of rows (chunks depend on N only, never
    // on the thread count), each summed in row order, then added in chunk
    // order: bit-identical at any thread count.
    const int64_t rows_per_chunk = std::max<int64_t>(1, (N + kMaxRowChunks - 1) / kMaxRowChunks);
    const int64_t chunks = (N + rows_per_chunk - 1) / rows_per_chunk;
    std::vector<float> dw_part(static_cast<size_t>(chunks) * C, 0.0f);
  #pragma omp parallel
    {
    RowBuffers io(C, 1);
  #pragma omp for schedule(static)
    for (int64_t k = 0; k < chunks; ++k) {
      float* my_dw = dw_part.data() + static_cast<size_t>(k) * C;
      for (int64_t r = k * rows_per_chunk; r < std::min(N, (k + 1) * rows_per_chunk); ++r) {
        const float* xr = io.read(x, r, 0);
        const float* gr = row(dy, r);
        float* dxr = row(dx, r);
        float ss = 0.0f, gwx = 0.0f;
  #pragma omp simd reduction(+ : ss, gwx)
        for (int64_t c = 0; c < C; ++c) {
          ss += xr[c] * xr[c];
          gwx += gr[c] * w[c] * xr[c];
        }
        const float rstd = 1.0f / std::sqrt(ss / C + static_cast<float>(eps));
        // d/dx of x_c * rstd * w_c: rstd * g_c w_c - x_c rstd^3 * mean(g w x).
        const float k3 = rstd * rstd * rstd * gwx / C;
  #pragma omp simd
        for (int64_t c = 0; c < C; ++c) {
          dxr[c] += rstd * gr[c] * w[c] - k3 * xr[c];
          my_dw[c] += gr[c] * xr[c] * rstd;
        }
      }
    }
    }
  #pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < chunks; ++k) dw[c] += dw_part[static_cast<size_t>(k) * C + c];
  });
}

// ---- RoPE ---------------------------------------------------------------------------

std::vector<double> rope_inv_freq(const RopeParams& p, int64_t head_dim) {
  check_shape(head_dim % 2 == 0, "rope: head_dim must be even");
  const int64_t half = head_dim / 2;
  std::vector<double> inv(half);
  for (int64_t i = 0; i < half; ++i)
    inv[i] = 1.0 / std::pow(p.theta, static_cast<double>(2 * i) / head_dim);
  if (!p.llama3_scaling) return inv;
  const double old_len = static_cast<double>(p.original_max_position);
  const double low_wavelen = old_len / p.low_freq_factor;
  const double high_wavelen = old_len / p.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2.0 * M_PI / f;
    if (wavelen > low_wavelen) {
      f /= p.factor;  // low frequencies: fully scaled
    } else if (wavelen >= high_wavelen) {
      // medium: interpolate between scaled and unscaled
      const double smooth =
          (old_len / wavelen - p.low_freq_factor) / (p.high_freq_factor - p.low_freq_factor);
      f = (1.0 - smooth) * f / p.factor + smooth * f;
    }
  }
  return inv;
}

void rope_table(const RopeParams& p, int64_t head_dim, const int64_t* positions, int64_t n,
                float* cos, float* sin) {
  return launch(KernelId::rope, device_of(cos), 0.0, [&](const KernelSet&) {  // counted with the model's RoPE (core/device.h)
    const std::vector<double> inv = rope_inv_freq(p, head_dim);
    const int64_t half = head_dim / 2;
  #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; ++t)
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(positions[t]) * inv[i];
        cos[t * half + i] = static_cast<float>(std::cos(a));
        sin[t * half + i] = static_cast<float>(std::sin(a));
      }
  });
}

namespace {
// sign = +1 rotates forward, -1 applies the inverse (transpose) rotation.
void rope_apply(const TensorView& x, const float* cos, const float* sin, float sign) {
  check_shape(x.rank == 3 && x.stride[2] == 1 && x.dim(2) % 2 == 0,
              "rope: expected [N, H, D] with contiguous even D, got " + x.shape_string());
  const int64_t N = x.dim(0), H = x.dim(1), half = x.dim(2) / 2;
  float* base = x.f32();  // fp32: the model rotates GEMM outputs before any rounding
  return launch(KernelId::rope, device_of(base), double(x.numel()), [&](const KernelSet&) {
  #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < N; ++t) {
      const float* c = cos + t * half;
      const float* s = sin + t * half;
      for (int64_t h = 0; h < H; ++h) {
        float* x1 = base + t * x.stride[0] + h * x.stride[1];
        float* x2 = x1 + half;
  #pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float a = x1[i], b = x2[i], si = sign * s[i];
          x1[i] = a * c[i] - b * si;
          x2[i] = b * c[i] + a * si;
        }
      }
    }
  });
}
}  // namespace

void rope_forward(const TensorView& x, const float* cos, const float* sin) {
  rope_apply(x, cos, sin, 1.0f);
}
void rope_backward(const TensorView& dx, const float* cos, const float* sin) {
  rope_apply(dx, cos, sin, -1.0f);
}

// ---- SwiGLU -------------------------------------------------------------------------

void swiglu_forward(const TensorView& g, const TensorView& u, const TensorView& a) {
  return launch(KernelId::swiglu_forward, device_of(a), double(a.numel()), [&](const KernelSet&) {
    combine_rows(g, u, a, "swiglu", [](float x, float y) { return x / (1.0f + exp_fast(-x)) * y; });
  });
}

void swiglu_backward(const TensorView& g, const TensorView& u, const TensorView& da,
                     const TensorView& dg, const TensorView& du) {
  const int64_t N = g.dim(0), F = g.dim(1);
  check_rows(g, N, F, "swiglu g");
  check_rows(u, N, F, "swiglu u");
  check_rows(da, N, F, "swiglu da");
  check_rows(dg, N, F, "swiglu dg");
  check_rows(du, N, F, "swiglu du");
  return launch(KernelId::swiglu_backward, device_of(dg), double(dg.numel()), [&](const KernelSet&) {
  #pragma omp parallel
    {
      // bf16 rows are widened before any is written: dg, du may alias g, u.
      RowBuffers io(F, 5);
  #pragma omp for schedule(static)
      for (int64_t r = 0; r < N; ++r) {
        const float* gr = io.read(g, r, 0);
        const float* ur = io.read(u, r, 1);
        const float* dar = io.read(da, r, 2);
        float* dgr = io.write(dg, r, 3);
        float* dur = io.write(du, r, 4);
  #pragma omp simd
        for (int64_t f = 0; f < F; ++f) {
          const float x = gr[f], y = ur[f], d = dar[f];  // read all before writing (aliasing)
          const float sig = 1.0f / (1.0f + exp_fast(-x));
          dgr[f] = d * y * sig * (1.0f + x * (1.0f - sig));
          dur[f] = d * x * sig;
        }
        io.commit(dg, r, 3);
        io.commit(du, r, 4);
      }
    }
  });
}

// ---- Cross-entropy ------------------------------------------------------------------

double cross_entropy(const TensorView& logits, const int32_t* targets, const float* weights,
                     float grad_scale, const TensorView* dlogits, double* row_losses) {
  const int64_t R = logits.dim(0), V = logits.dim(1);
  check_rows(logits, R, V, "cross_entropy logits");
  if (dlogits) check_rows(*dlogits, R, V, "cross_entropy dlogits");
  logits.f32();  // the loss and its gradient are fp32 (logits come from an fp32-output GEMM)
  if (dlogits) dlogits->f32();
  return launch(KernelId::cross_entropy, device_of(logits), double(logits.numel()), [&](const KernelSet&) {
    check_ids(targets, R, V, "target");
    // Per-row losses summed in row order afterwards: an OpenMP reduction would
    // add per-thread partials, in an order that depends on the thread count.
    std::vector<double> row_loss(static_cast<size_t>(R));
  #pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      const float* z = row(logits, r);
      float mx = z[0];
      for (int64_t j = 1; j < V; ++j) mx = std::max(mx, z[j]);
      float sum = 0.0f;
  #pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < V; ++j) sum += exp_fast(z[j] - mx);
      const float lse = mx + std::log(sum);
      const float w = weights ? weights[r] : 1.0f;
      const float z_target = z[targets[r]];
      row_loss[r] = static_cast<double>(w) * (lse - z_target);
      if (dlogits) {
        float* dz = row(*dlogits, r);
        const float k = grad_scale * w;
  #pragma omp simd
        for (int64_t j = 0; j < V; ++j) dz[j] = k * exp_fast(z[j] - lse);
        dz[targets[r]] -= k;
      }
    }
    double total = 0.0;
    for (double l : row_loss) total += l;
    if (row_losses) std::copy(row_loss.begin(), row_loss.end(), row_losses);
    return total;
  });
}

// ---- Embedding ----------------------------------------------------------------------

void embedding_forward(const int32_t* tokens, int64_t n, const float* table, int64_t vocab,
                       const TensorView& out) {
  const int64_t C = out.dim(1);
  check_rows(out, n, C, "embedding out");
  return launch(KernelId::residual_add, device_of(out), double(out.numel()), [&](const KernelSet&) {  // priced as an add
    check_ids(tokens, n, vocab, "token");
  #pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < n; ++t) {
      const float* src = table + static_cast<int64_t>(tokens[t]) * C;
      if (out.dtype == DType::f32)
        std::copy_n(src, C, row(out, t));
      else
        round_to_bf16(src, static_cast<bf16*>(out.data) + t * out.stride[0], C);
    }
  });
}

void embedding_backward(const int32_t* tokens, int64_t n, const TensorView& dout, float* dtable,
                        int64_t vocab) {
  const int64_t C = dout.dim(1);
  check_rows(dout, n, C, "embedding dout");
  return launch(KernelId::residual_add, device_of(dout), double(dout.numel()), [&](const KernelSet&) {  // priced as an add
    dout.f32();
    check_ids(tokens, n, vocab, "token");
    // Each thread owns a slice of columns for every token: no races, and the
    // order of additions per element is the token order.
  #pragma omp parallel
    {
      const int nt = omp_get_num_threads(), me = omp_get_thread_num();
      const int64_t c0 = C * me / nt, c1 = C * (me + 1) / nt;
      for (int64_t t = 0; t < n; ++t) {
        const float* src = row(dout, t);
        float* dst = dtable + static_cast<int64_t>(tokens[t]) * C;
        for (int64_t c = c0; c < c1; ++c) dst[c] += src[c];
      }
    }
  });
}

// ---- Precision boundaries ---------------------------------------------------------

void convert(const TensorView& src, const TensorView& dst) {
  const int64_t N = src.dim(0), C = src.dim(1);
  check_rows(src, N, C, "convert src");
  check_rows(dst, N, C, "convert dst");
  return launch(KernelId::convert, device_of(dst), double(dst.numel()), [&](const KernelSet&) {
  #pragma omp parallel
    {
      RowBuffers io(C, 1);
  #pragma omp for schedule(static)
      for (int64_t r = 0; r < N; ++r) {
        const float* in = io.read(src, r, 0);
        if (dst.dtype == DType::f32)
          std::copy_n(in, C, row(dst, r));
        else
          round_to_bf16(in, static_cast<bf16*>(dst.data) + r * dst.stride[0], C);
      }
    }
  });
}

void residual_add(const TensorView& a, const TensorView& b, const TensorView& out) {
  return launch(KernelId::residual_add, device_of(out), double(out.numel()), [&](const KernelSet&) {
    combine_rows(a, b, out, "residual_add", [](float x, float y) { return x + y; });
  });
}

// ---- AdamW --------------------------------------------------------------------------

void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n,
                  const AdamWParams& h) {
  check_shape(h.step >= 1, "adamw: step is 1-based");
  return launch(KernelId::optimizer, device_of(param), double(n), [&](const KernelSet&) {
    const float bc1 = 1.0f - static_cast<float>(std::pow(h.beta1, h.step));
    const float bc2 = 1.0f - static_cast<float>(std::pow(h.beta2, h.step));
    const float step_size = h.lr / bc1, inv_sqrt_bc2 = 1.0f / std::sqrt(bc2);
    const float decay = 1.0f - h.lr * h.weight_decay;
  #pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      m[i] = h.beta1 * m[i] + (1.0f - h.beta1) * grad[i];
      v[i] = h.beta2 * v[i] + (1.0f - h.beta2) * grad[i] * grad[i];
      param[i] = param[i] * decay - step_size * m[i] / (std::sqrt(v[i]) * inv_sqrt_bc2 + h.eps);
    }
  });
}

// ---- Views ------------------------------------------------------------------------

namespace {

// f(src row, dst row, n) for every innermost row of two same-shaped views.
template <typename F>
void for_each_row(const TensorView& src, const TensorView& dst, const char* what, F&& f) {
  check_shape(src.rank == dst.rank && src.rank >= 1 && src.rank <= 4 && src.shape == dst.shape &&
                  src.stride[src.rank - 1] == 1 && dst.stride[dst.rank - 1] == 1,
              std::string(what) + ": views of one shape (rank 1-4, contiguous last dim), got " + src.shape_string() +
                  " and " + dst.shape_string());
  // The dims above the row (up to 3), right-aligned into three loops.
  std::array<int64_t, 3> n{1, 1, 1}, ss{0, 0, 0}, ds{0, 0, 0};
  const int lead = src.rank - 1;
  for (int i = 0; i < lead; ++i) {
    n[3 - lead + i] = src.shape[i];
    ss[3 - lead + i] = src.stride[i];
    ds[3 - lead + i] = dst.stride[i];
  }
  const int64_t es = int64_t(dtype_size(src.dtype)), ed = int64_t(dtype_size(dst.dtype)), len = src.shape[lead];
  for (int64_t i = 0; i < n[0]; ++i)
    for (int64_t j = 0; j < n[1]; ++j)
      for (int64_t k = 0; k < n[2]; ++k) {
        const int64_t so = i * ss[0] + j * ss[1] + k * ss[2], dof = i * ds[0] + j * ds[1] + k * ds[2];
        f(static_cast<const char*>(src.data) + so * es, static_cast<char*>(dst.data) + dof * ed, len);
      }
}

}  // namespace

void copy_view(const TensorView& src, const TensorView& dst) {
  return launch(KernelId::copy_view, device_of(dst), 0.0, [&](const KernelSet&) {
    for_each_row(src, dst, "copy_view", [&](const char* s, char* d, int64_t n) {
      if (src.dtype == dst.dtype)
        std::memcpy(d, s, size_t(n) * dtype_size(src.dtype));
      else if (dst.dtype == DType::f32)
        load_f32(s, src.dtype, reinterpret_cast<float*>(d), n);
      else
        store_f32(reinterpret_cast<const float*>(s), d, dst.dtype, n);
    });
  });
}

void add_view(const TensorView& src, const TensorView& dst) {
  check_shape(dst.dtype == DType::f32, "add_view: the destination accumulates in fp32");
  return launch(KernelId::add_view, device_of(dst), 0.0, [&](const KernelSet&) {
    std::vector<float> row;
    for_each_row(src, dst, "add_view", [&](const char* s, char* d, int64_t n) {
      const float* in = reinterpret_cast<const float*>(s);
      if (src.dtype != DType::f32) {
        row.resize(size_t(n));
        load_f32(s, src.dtype, row.data(), n);
        in = row.data();
      }
      float* out = reinterpret_cast<float*>(d);
      for (int64_t x = 0; x < n; ++x) out[x] += in[x];
    });
  });
}

void zero_view(const TensorView& dst) {
  check_shape(dst.dtype == DType::f32, "zero_view: fp32");
  return launch(KernelId::zero_view, device_of(dst), 0.0, [&](const KernelSet&) {
    for_each_row(dst, dst, "zero_view", [](const char*, char* d, int64_t n) { std::memset(d, 0, size_t(n) * 4); });
  });
}

void copy_rows(const void* src, int64_t src_stride, void* dst, int64_t dst_stride, int64_t rows, int64_t row_bytes) {
  return launch(KernelId::copy_rows, device_of(dst), 0.0, [&](const KernelSet&) {
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dst_stride, static_cast<const char*>(src) + r * src_stride,
                  size_t(row_bytes));
  });
}

// ---- fp32 vectors -----------------------------------------------------------------
// Not priced by the planner (its optimizer line covers the gradient's zeroing,
// norm and clipping): on a meta device they only return.

void fill_f32(float* dst, int64_t n, float value) {
  return launch(KernelId::fill_f32, device_of(dst), 0.0, [&](const KernelSet&) {
    std::fill_n(dst, n, value);
  });
}

void copy_f32(const float* src, int64_t n, float* dst) {
  return launch(KernelId::copy_f32, device_of(dst), 0.0, [&](const KernelSet&) {
    std::copy_n(src, n, dst);
  });
}

void add_f32(const float* src, int64_t n, float* dst) {
  return launch(KernelId::add_f32, device_of(dst), 0.0, [&](const KernelSet&) {
    for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
  });
}

void scale_f32(float* dst, int64_t n, float factor) {
  return launch(KernelId::scale_f32, device_of(dst), 0.0, [&](const KernelSet&) {
    for (int64_t i = 0; i < n; ++i) dst[i] *= factor;
  });
}

double sum_of_squares(const float* src, int64_t n) {
  return launch(KernelId::sum_of_squares, device_of(src), 0.0, [&](const KernelSet&) {
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += static_cast<double>(src[i]) * src[i];
    return s;
  });
}

}  // namespace longctx
