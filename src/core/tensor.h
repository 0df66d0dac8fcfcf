#pragma once
// Tensor views (shape + strides over fp32 or bf16 storage) and owning tensors
// whose memory comes from the MemoryTracker.
#include <array>
#include <bit>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "core/memory.h"
#include "core/vocabulary.h"

namespace longctx {

// bf16 storage type: the high half of an IEEE float, rounded to nearest even.
struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  explicit bf16(float f) { bits = round_bits(std::bit_cast<uint32_t>(f)); }
  // fp32 bits -> bf16 bits, rounded to nearest even; NaN stays NaN (quieted).
  // The NaN case is a mask, not a branch, so that loops over arrays
  // vectorise (round_to_bf16; as a branch it was 4% of a bf16 step).
  static uint16_t round_bits(uint32_t u) {
    const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const uint32_t nan = 0u - static_cast<uint32_t>((u & 0x7fffffffu) > 0x7f800000u);
    return static_cast<uint16_t>((rounded & ~nan) | (((u >> 16) | 0x40u) & nan));
  }
  explicit operator float() const {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// n values widened (exact) / rounded to nearest even; vectorisable loops.
void widen_bf16(const bf16* src, float* dst, int64_t n);
void round_to_bf16(const float* src, bf16* dst, int64_t n);

constexpr int kMaxRank = 5;

// A non-owning view. Strides are in elements; the last dimension is usually
// contiguous (stride 1), which fast kernels require and check.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> stride{};
  // The device whose storage `data` is (core/device.h): a Tensor's view
  // carries its Buffer's; a view made over raw storage, device_of(data).
  // Null only in a view of nothing.
  Device* device = nullptr;

  TensorView() = default;
  // Contiguous row-major view.
  TensorView(void* data, DType dtype, std::initializer_list<int64_t> shape);
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> stride);

  int64_t dim(int i) const { return shape[i]; }
  int64_t numel() const;
  bool contiguous() const;
  std::string shape_string() const;

  float* f32() const;   // throws ShapeError unless dtype == f32
  // Address of element (i0, i1, ...) for the first `n` indices.
  template <typename T>
  T* at(std::initializer_list<int64_t> idx) const {
    int64_t off = 0;
    int d = 0;
    for (int64_t i : idx) off += i * stride[d++];
    return static_cast<T*>(data) + off;
  }
};

// An owning, contiguous tensor whose storage is a tracked Buffer.
class Tensor {
 public:
  Tensor() = default;
  Tensor(std::initializer_list<int64_t> shape, DType dtype, MemCategory category,
         const std::string& name);
  Tensor(const std::array<int64_t, kMaxRank>& shape, int rank, DType dtype, MemCategory category,
         const std::string& name);

  const TensorView& view() const { return view_; }
  TensorView& view() { return view_; }
  float* f32() const { return view_.f32(); }
  int64_t numel() const { return view_.numel(); }
  int64_t dim(int i) const { return view_.shape[i]; }
  size_t bytes() const { return buffer_.size(); }
  void zero();

 private:
  Buffer buffer_;
  TensorView view_;
};

}  // namespace longctx
