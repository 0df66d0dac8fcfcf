#include "train/progress.h"

#include <chrono>

namespace longctx {

std::string progress_line(int64_t step, int64_t steps, double seconds, StepPosition at, int64_t num_layers,
                          int rank) {
  char text[192];
  int n = std::snprintf(text, sizeof text, "longctx: step %lld/%lld, %.1f s in: rank %d in %s",
                        static_cast<long long>(step), static_cast<long long>(steps), seconds, rank,
                        step_pass_name(at.pass));
  if (at.layer >= 0 && n > 0 && n < static_cast<int>(sizeof text))
    std::snprintf(text + n, sizeof text - n, ", layer %lld of %lld", static_cast<long long>(at.layer + 1),
                  static_cast<long long>(num_layers));
  return text;
}

ProgressReporter::ProgressReporter(double interval_seconds, int64_t steps, int64_t num_layers, int rank,
                                   std::FILE* out)
    : interval_(interval_seconds), steps_(steps), num_layers_(num_layers), rank_(rank), out_(out) {
  if (interval_ > 0 && out_) thread_ = std::thread([this] { loop(); });
}

ProgressReporter::~ProgressReporter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

// A step's lines never say idle: its position is batch before the step
// counts as started, and idle only once it no longer does.
void ProgressReporter::step_started(int64_t step) {
  publish_step_position(StepPass::batch);
  std::lock_guard<std::mutex> lock(mutex_);
  step_ = step;
  since_start_.reset();
}

void ProgressReporter::step_finished() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    step_ = 0;
  }
  publish_step_position(StepPass::idle);
}

void ProgressReporter::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::duration<double>(interval_));
    if (stop_ || step_ == 0 || since_start_.seconds() < interval_) continue;
    const std::string line = progress_line(step_, steps_, since_start_.seconds(), step_position(), num_layers_, rank_);
    std::fprintf(out_, "%s\n", line.c_str());
    std::fflush(out_);
  }
}

}  // namespace longctx
