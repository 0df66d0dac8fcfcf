#pragma once
// Runs a shell command for tests (python oracles, `mpiexec longctx ...`):
// its exit status and its stdout and stderr together.
#include <sys/wait.h>

#include <cstdio>
#include <string>

struct CommandResult {
  int status = -1;
  std::string output;  // stdout and stderr
};

inline CommandResult run_command(const std::string& command) {
  CommandResult r;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  const int raw = ::pclose(p);
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  return r;
}

// 'text' for a POSIX shell.
inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return q + "'";
}

// The first interpreter with numpy: `python3` on PATH, else Debian's own
// (python3-numpy installs for /usr/bin/python3; a pyenv or venv python3 on
// PATH may not see it). "" if none.
inline const std::string& numpy_python() {
  static const std::string found = [] {
    for (std::string py : {"python3", "/usr/bin/python3"})
      if (run_command(py + " -c 'import numpy'").status == 0) return py;
    return std::string();
  }();
  return found;
}
