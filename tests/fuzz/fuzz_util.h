#pragma once
// Shared by the libFuzzer targets: the outcomes allowed, the input split into
// files, and a private scratch directory.
//
// A reader given any bytes must return or throw one of the project's errors
// (ConfigError, DataError, ShapeError: src/core/error.h). Anything else (an
// other exception, which reaches std::terminate, a crash, a sanitizer report)
// is a finding.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/error.h"

namespace fuzz {

// FUZZ_VERBOSE=1 prints each error caught (to see what a seed reaches).
template <typename F>
void allow_project_errors(F&& f) {
  auto show = [](const char* kind, const std::exception& e) {
    if (std::getenv("FUZZ_VERBOSE")) std::fprintf(stderr, "fuzz: %s: %s\n", kind, e.what());
  };
  try {
    f();
  } catch (const longctx::ConfigError& e) {
    show("ConfigError", e);
  } catch (const longctx::DataError& e) {
    show("DataError", e);
  } catch (const longctx::ShapeError& e) {
    show("ShapeError", e);
  }
}

// The input's parts between separator lines "\n#~~\n" (a YAML comment, so a
// config seed stays valid YAML).
inline std::vector<std::string> split_files(const std::string& input) {
  static const std::string sep = "\n#~~\n";
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t at; (at = input.find(sep, start)) != std::string::npos; start = at + sep.size())
    parts.push_back(input.substr(start, at - start));
  parts.push_back(input.substr(start));
  return parts;
}

// A directory of this process, emptied on each call.
inline std::filesystem::path scratch_dir() {
  static const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("longctx_fuzz_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

inline std::filesystem::path write_file(const std::filesystem::path& p, const std::string& bytes) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << bytes;
  return p;
}

// A property the reader promises was broken: report it as a crash.
inline void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz: property broken: %s\n", what);
    std::abort();
  }
}

}  // namespace fuzz
