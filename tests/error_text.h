#pragma once
// The message of the E that f throws, or "" when it throws none.
#include <string>

#include "core/error.h"

template <typename E, typename F>
std::string error_text(F f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

template <typename F>
std::string data_error(F f) {
  return error_text<longctx::DataError>(f);
}
