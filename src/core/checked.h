#pragma once
// Overflow-checked arithmetic for sizes the input decides (config keys, file
// headers): a wrapped product passes every later range check with a wrong
// value (4611686018427387904 * 4 ranks "= 0"), so it must be an error naming
// what overflowed instead.
//
//   int64_t tokens = checked_mul(batch, seq, "per_device_batch_size * max_target_length");
#include <cstdint>
#include <string>

#include "core/error.h"

namespace longctx {

// a * b, or ConfigError("<what> overflows int64 (a * b)").
inline int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    throw ConfigError(what + " overflows int64 (" + std::to_string(a) + " * " + std::to_string(b) + ")");
  return r;
}

// a + b, or ConfigError("<what> overflows int64 (a + b)").
inline int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r;
  if (__builtin_add_overflow(a, b, &r))
    throw ConfigError(what + " overflows int64 (" + std::to_string(a) + " + " + std::to_string(b) + ")");
  return r;
}

}  // namespace longctx
