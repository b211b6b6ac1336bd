// Two streams taking every group of a GroupQueue on threads, as the run's
// streams do (a group's work is a short sleep), for the tests of streams
// that wait for memory (host or device): a circular wait would hang, so a
// timer gives up after 5 s and the counts then fall short. Each stream's
// first group is held until the other stream holds its first too, as the
// run's workers start side by side (the tests' first two groups fit beside
// each other): without that a thread started late on a loaded machine found
// the other stream had taken every group alone, and no worker ended (seen
// once under ctest -j8).
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <thread>
#include <utility>

#include "harness/reliability/isolate.h"

namespace mlagate::test {

struct Drained {
  int taken = 0;  // groups taken
  int ended = 0;  // workers ended by a stream before it waited
};

inline Drained drain_with_two_streams(GroupQueue& q, std::size_t s0, std::size_t s1, int groups) {
  std::atomic<int> taken{0}, ended{0}, started{0};
  std::atomic<bool> give_up{false};
  auto stream = [&](std::size_t s) {
    bool first = true;
    while (q.take(s, [&] { return give_up.load(); }, [&] { ++ended; })) {
      ++taken;
      if (std::exchange(first, false)) {
        ++started;
        while (started < 2 && !give_up) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the group's work
    }
  };
  {
    std::jthread a(stream, s0), b(stream, s1);
    std::jthread timer([&](std::stop_token st) {
      for (int i = 0; i < 100 && !st.stop_requested() && taken < groups; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      give_up = true;  // a hang ends here, and fails the caller's counts
    });
    a.join();
    b.join();
    timer.request_stop();
  }
  return {taken.load(), ended.load()};
}

}  // namespace mlagate::test
