#include "core/tensor.h"

#include "core/device.h"

namespace longctx {

void widen_bf16(const bf16* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

void round_to_bf16(const float* src, bf16* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i].bits = bf16::round_bits(std::bit_cast<uint32_t>(src[i]));
}

TensorView::TensorView(void* d, DType t, std::initializer_list<int64_t> shp)
    : data(d), dtype(t), device(&device_of(d)) {
  check_shape(shp.size() <= kMaxRank, "tensor rank above kMaxRank");
  rank = static_cast<int>(shp.size());
  int i = 0;
  for (int64_t s : shp) shape[i++] = s;
  int64_t st = 1;
  for (int d2 = rank - 1; d2 >= 0; --d2) {
    stride[d2] = st;
    st *= shape[d2];
  }
}

TensorView TensorView::strided(void* d, DType t, std::initializer_list<int64_t> shp,
                               std::initializer_list<int64_t> str) {
  check_shape(shp.size() == str.size(), "strided view: shape and stride ranks differ");
  TensorView v(d, t, shp);
  int i = 0;
  for (int64_t s : str) v.stride[i++] = s;
  return v;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank; ++i) n *= shape[i];
  return n;
}

bool TensorView::contiguous() const {
  int64_t st = 1;
  for (int d = rank - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != st) return false;
    st *= shape[d];
  }
  return true;
}

std::string TensorView::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < rank; ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

float* TensorView::f32() const {
  if (dtype != DType::f32) check_shape(false, "expected an fp32 tensor, got " + std::string(name_of(dtype)));
  return static_cast<float*>(data);
}

Tensor::Tensor(std::initializer_list<int64_t> shape, DType dtype, MemCategory category,
               const std::string& name) {
  view_ = TensorView(nullptr, dtype, shape);
  buffer_ = Buffer(category, name, static_cast<size_t>(view_.numel()) * dtype_size(dtype));
  view_.data = buffer_.data();
  view_.device = &buffer_.device();
}

Tensor::Tensor(const std::array<int64_t, kMaxRank>& shape, int rank, DType dtype,
               MemCategory category, const std::string& name) {
  view_.dtype = dtype;
  view_.rank = rank;
  int64_t st = 1;
  for (int d = rank - 1; d >= 0; --d) {
    view_.shape[d] = shape[d];
    view_.stride[d] = st;
    st *= shape[d];
  }
  buffer_ = Buffer(category, name, static_cast<size_t>(st) * dtype_size(dtype));
  view_.data = buffer_.data();
  view_.device = &buffer_.device();
}

void Tensor::zero() {
  if (buffer_.data()) std::memset(buffer_.data(), 0, buffer_.size());
}

}  // namespace longctx
