// A job that stalls on purpose, for test_watchdog_abort: rank 0 waits for a
// message that rank 1 never sends (rank 1 sleeps far past the timeout, like a
// rank stuck in a hung kernel). The default watchdog must name the operation
// and abort the whole job, rank 1 included.
#include <chrono>
#include <thread>

#include "comm/communicator.h"

int main(int argc, char** argv) {
  longctx::comm_init(&argc, &argv);
  longctx::set_collective_timeout_seconds(1.0);
  longctx::Communicator world = longctx::Communicator::world("stall");
  if (world.rank() == 0) {
    int never = 0;
    world.recv(&never, sizeof never, 1, 7);
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(120));
  }
  longctx::comm_finalize();
  return 0;  // not reached on rank 0: the watchdog aborts
}
