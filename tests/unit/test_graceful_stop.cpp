// Graceful stop of a real 2-rank `mpiexec -n 2 longctx train` run: once the
// first step line is out, a stop signal reaches one rank (SIGTERM to rank 1
// alone, as when a scheduler signals ranks at different times) or every
// rank (SIGUSR1 to mpiexec, which Open MPI forwards as is). Each run must
// stop after a step, exit non-zero (128 + signal) with the message, leave a
// complete checkpoint at the step reached, and resume from it. A second
// signal ends the rank at once, without a checkpoint.
//
// Not SIGTERM to mpiexec: Open MPI 4.1's mpiexec passes SIGTERM on to the
// ranks and SIGKILLs them 1 s later (odls_base_sigkill_timeout), too soon to
// finish a step and write a checkpoint (README, "Stopping a run").
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "temp_dir.h"

namespace fs = std::filesystem;

namespace {

// The build directory's longctx and the source tree's root, found from this
// executable's location (build*/tests/<exe>, inside the source tree).
bool locate(fs::path& longctx, fs::path& root) {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return false;
  for (fs::path p = exe.parent_path(); !p.empty() && p != p.root_path(); p = p.parent_path()) {
    if (longctx.empty() && fs::is_regular_file(p / "longctx")) longctx = p / "longctx";
    if (fs::is_regular_file(p / "configs/base.yml")) {
      root = p;
      break;
    }
  }
  return !longctx.empty() && !root.empty();
}

// Process ids whose parent is `parent` (the ranks mpiexec forked).
std::vector<pid_t> children_of(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& e : fs::directory_iterator("/proc")) {
    const std::string name = e.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces, so parse after the last ')'.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(line.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
      out.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return out;
}

// `mpiexec -n 2 longctx train ...` in the background, its stdout and stderr
// read through a pipe.
class Job {
 public:
  Job(const fs::path& root, const std::string& command) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      if (::chdir(root.c_str()) != 0) ::_exit(127);
      ::execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    fd_ = fds[0];
  }
  ~Job() {
    if (pid_ > 0 && !reaped_) {  // a failed test: leave nothing behind
      for (pid_t rank : children_of(pid_)) ::kill(rank, SIGKILL);
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) ::close(fd_);
  }
  pid_t pid() const { return pid_; }
  const std::string& output() const { return output_; }

  // Reads until `pattern` appears in the output (true) or EOF / `seconds` pass.
  bool wait_for(const std::regex& pattern, double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (!std::regex_search(output_, pattern)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0 || !read_some(static_cast<int>(left.count()))) return false;
    }
    return true;
  }
  // Reads to EOF and returns the exit status (-1: still running after `seconds`).
  int finish(double seconds) {
    wait_for(std::regex("$^never"), seconds);
    int status = 0;
    for (int i = 0; i < 100; ++i) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        reaped_ = true;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      ::usleep(100 * 1000);
    }
    return -1;
  }

 private:
  bool read_some(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    const ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n <= 0) return false;
    output_.append(buf, static_cast<size_t>(n));
    return true;
  }
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string output_;
};

std::string train_command(const fs::path& longctx, const fs::path& out, int steps) {
  // Ring cp = 2 over a 4096-token sequence: a few tenths of a second a step,
  // so the signal lands mid-run.
  return "env OMP_NUM_THREADS=1 mpiexec --oversubscribe --allow-run-as-root --bind-to none -n 2 " +
         longctx.string() +
         " train configs/base.yml model_name=tiny dataset_type=synthetic max_target_length=4096 "
         "ici_context_parallelism=2 context_parallel_strategy=ring log_period=1 peak_tflops_per_device=1 "
         "num_threads=1 steps=" + std::to_string(steps) + " base_output_directory=" + out.string();
}

// Signals as `send` says once step 1 is out; checks the stop; returns the
// step the run stopped after (0 on failure).
int64_t stop_run(const fs::path& longctx, const fs::path& root, const fs::path& out, int sig,
                 bool to_mpiexec) {
  Job job(root, train_command(longctx, out, 1000));
  EXPECT_GT(job.pid(), 0);
  if (!job.wait_for(std::regex("\nstep 1 \\|"), 120)) {
    ADD_FAILURE() << "no first step line:\n" << job.output();
    return 0;
  }
  if (to_mpiexec) {
    ::kill(job.pid(), sig);
  } else {
    const std::vector<pid_t> ranks = children_of(job.pid());
    EXPECT_EQ(ranks.size(), 2u) << "mpiexec's children";
    if (ranks.empty()) return 0;
    ::kill(ranks.back(), sig);  // one rank only: the others learn it at the step's all-reduce
  }
  const int rc = job.finish(120);
  const std::string& text = job.output();
  SCOPED_TRACE(text);
  EXPECT_EQ(rc, 128 + sig);
  std::smatch m;
  const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGUSR1";
  if (!std::regex_search(text, m, std::regex("longctx: stopped by " + name + " after step (\\d+) of 1000: checkpoint (\\S+) written; run the same command again to resume"))) {
    ADD_FAILURE() << "no stop message";
    return 0;
  }
  const int64_t step = std::stoll(m[1]);
  EXPECT_GE(step, 1);
  EXPECT_LT(step, 1000);
  char dir[32];
  std::snprintf(dir, sizeof dir, "step_%08lld", static_cast<long long>(step));
  const fs::path ckpt = out / "run" / "checkpoints" / dir;
  EXPECT_EQ(fs::path(m[2].str()), ckpt);
  EXPECT_TRUE(fs::exists(ckpt / "MANIFEST.json")) << ckpt;
  EXPECT_NE(text.find("step " + std::to_string(step) + " |"), std::string::npos);
  EXPECT_EQ(text.find("step " + std::to_string(step + 1) + " |"), std::string::npos) << "a step after the stop";
  return step;
}

}  // namespace

TEST(GracefulStop, SigtermToOneRankStopsEveryRankWithACheckpointThenResumes) {
  fs::path longctx, root;
  ASSERT_TRUE(locate(longctx, root)) << "longctx binary or configs/base.yml not found";
  TempDir t;
  const int64_t step = stop_run(longctx, root, t.path, SIGTERM, false);
  ASSERT_GT(step, 0);
  // The same command (more steps would be the same run) resumes and goes on.
  Job again(root, train_command(longctx, t.path, static_cast<int>(step) + 2));
  const int rc = again.finish(120);
  SCOPED_TRACE(again.output());
  EXPECT_EQ(rc, 0);
  EXPECT_NE(again.output().find("resumed from " + (t.path / "run" / "checkpoints").string()), std::string::npos);
  EXPECT_NE(again.output().find("(step " + std::to_string(step) + ","), std::string::npos);
  EXPECT_NE(again.output().find("step " + std::to_string(step + 2) + " |"), std::string::npos);
  EXPECT_EQ(again.output().find("step 1 |"), std::string::npos) << "started over";
}

TEST(GracefulStop, SigusrOneToMpiexecIsForwardedAndStopsGracefully) {
  fs::path longctx, root;
  ASSERT_TRUE(locate(longctx, root)) << "longctx binary or configs/base.yml not found";
  TempDir t;
  EXPECT_GT(stop_run(longctx, root, t.path, SIGUSR1, true), 0);
}

TEST(GracefulStop, ASecondSignalExitsAtOnce) {
  fs::path longctx, root;
  ASSERT_TRUE(locate(longctx, root)) << "longctx binary or configs/base.yml not found";
  TempDir t;
  Job job(root, train_command(longctx, t.path, 1000));
  ASSERT_TRUE(job.wait_for(std::regex("\nstep 1 \\|"), 120)) << job.output();
  const std::vector<pid_t> ranks = children_of(job.pid());
  ASSERT_EQ(ranks.size(), 2u);
  // The other rank is frozen first, so the step (and the all-reduce that
  // agrees on the stop) cannot finish before the second signal: without it
  // a loaded machine may deliver that signal after the checkpoint is out.
  ::kill(ranks.front(), SIGSTOP);
  ::kill(ranks.back(), SIGTERM);
  // Two pending SIGTERMs would merge into one: the second after the first's line.
  const bool first_seen = job.wait_for(std::regex("longctx: stop signal: finishing this step"), 60);
  ::kill(ranks.back(), SIGTERM);
  const bool second_seen = job.wait_for(std::regex("longctx: second stop signal"), 60);
  ::kill(ranks.front(), SIGCONT);  // mpiexec ends it once the signalled rank has exited
  ASSERT_TRUE(first_seen && second_seen) << job.output();
  const int rc = job.finish(120);
  SCOPED_TRACE(job.output());
  EXPECT_NE(rc, 0);
  EXPECT_NE(job.output().find("longctx: second stop signal: exiting now, without a checkpoint"), std::string::npos);
  EXPECT_EQ(job.output().find("longctx: stopped by"), std::string::npos);
}
