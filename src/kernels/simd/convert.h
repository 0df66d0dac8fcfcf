#pragma once
// Rows of activations in either storage dtype (fp32 or bf16): the one place
// the attention kernel, its reference and the context-parallel strategies
// widen bf16 to fp32 (exact) or round fp32 to bf16 (to nearest even, the
// bf16 constructor of core/tensor.h).
#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "core/tensor.h"

namespace longctx {

// dst[i] = src[i] for n elements, converting between fp32 and bf16.
inline void convert(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(float)); }
inline void convert(const bf16* src, bf16* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(bf16)); }
inline void convert(const float* src, bf16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16(src[i]);
}
inline void convert(const bf16* src, float* dst, int64_t n) {
  // The bits shifted into the high half (a loop the compiler vectorises).
  const uint16_t* in = reinterpret_cast<const uint16_t*>(src);
  uint32_t* out = reinterpret_cast<uint32_t*>(dst);
  for (int64_t i = 0; i < n; ++i) out[i] = uint32_t(in[i]) << 16;
}

// A head's rows in a [B, S, heads, D] view lie heads * D elements apart (2 KiB
// at 8 heads of 128 bf16): the hardware prefetchers, which stay within a 4 KiB
// page, miss them, and a loop over such rows waits one memory latency per row
// (the bf16 forward's Q, K, V copies and output stores were a third of its
// time on an AMX Xeon; asking ahead made it 1.1x). Loops ask for the row
// kPrefetchRows ahead.
constexpr int64_t kPrefetchRows = 8;
template <bool for_write = false>
inline void prefetch_row(const void* row, int64_t bytes) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(row), end = begin + uintptr_t(bytes);
  for (uintptr_t line = begin & ~uintptr_t(63); line < end; line += 64)  // every line the row touches
    __builtin_prefetch(reinterpret_cast<const void*>(line), for_write ? 1 : 0);
}

// Address of element (i0, i1, ...) of a view of either dtype.
inline char* element_ptr(const TensorView& t, std::initializer_list<int64_t> idx) {
  int64_t off = 0;
  int d = 0;
  for (int64_t i : idx) off += i * t.stride[d++];
  return static_cast<char*>(t.data) + off * int64_t(dtype_size(t.dtype));
}

// n elements at `src`, stored as `dtype`, widened to fp32 at dst.
inline void load_f32(const void* src, DType dtype, float* dst, int64_t n) {
  if (dtype == DType::bf16) convert(static_cast<const bf16*>(src), dst, n);
  else convert(static_cast<const float*>(src), dst, n);
}

// n fp32 values stored at dst as `dtype`.
inline void store_f32(const float* src, void* dst, DType dtype, int64_t n) {
  if (dtype == DType::bf16) convert(src, static_cast<bf16*>(dst), n);
  else convert(src, static_cast<float*>(dst), n);
}

}  // namespace longctx
