#pragma once
// Errors a user can act on. Each names the rule that was broken; `main`
// prints what() as one line on stderr and exits non-zero (comm_abort in
// multi-rank runs, so peers never hang).
#include <stdexcept>
#include <string>

namespace longctx {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Invalid configuration, command-line flag or mesh.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// Invalid input data or checkpoint.
class DataError : public Error {
 public:
  using Error::Error;
};

// A tracked allocation would exceed device_memory_budget.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// Shapes or dtypes passed to a kernel do not fit together (a programming error
// or an unsupported combination).
class ShapeError : public Error {
 public:
  using Error::Error;
};

// Throws ShapeError(message) when cond is false.
inline void check_shape(bool cond, const std::string& message) {
  if (!cond) throw ShapeError(message);
}
// A literal message: no string is built unless it fails (hot paths).
inline void check_shape(bool cond, const char* message) {
  if (!cond) throw ShapeError(message);
}

}  // namespace longctx
