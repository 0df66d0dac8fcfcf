#pragma once
// The progress line of long steps. While a step runs, a thread prints every
// `interval_seconds` (not sooner) where this rank's model is, e.g.
//   longctx: step 3/20, 40.1 s in: rank 0 in backward, layer 5 of 32
// reading the position the model publishes (src/model/step_position.h). Only
// this rank's position: the other ranks' would need communication. A step
// shorter than the interval prints nothing.
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>

#include "core/timer.h"
#include "model/step_position.h"

namespace longctx {

// One progress line (no newline).
std::string progress_line(int64_t step, int64_t steps, double seconds, StepPosition at, int64_t num_layers,
                          int rank);

class ProgressReporter {
 public:
  // interval_seconds <= 0: no thread, nothing printed.
  ProgressReporter(double interval_seconds, int64_t steps, int64_t num_layers, int rank, std::FILE* out);
  ~ProgressReporter();  // stops and joins the thread
  void step_started(int64_t step);
  void step_finished();

 private:
  void loop();
  const double interval_;
  const int64_t steps_, num_layers_;
  const int rank_;
  std::FILE* out_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  int64_t step_ = 0;  // the step running, 0 = none
  Timer since_start_;
  std::thread thread_;
};

}  // namespace longctx
