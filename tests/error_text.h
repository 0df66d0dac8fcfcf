#pragma once
// The message of the DataError that f throws, or "" when it throws none.
#include <string>

#include "core/error.h"

template <typename F>
std::string data_error(F f) {
  try {
    f();
  } catch (const longctx::DataError& e) {
    return e.what();
  }
  return "";
}
