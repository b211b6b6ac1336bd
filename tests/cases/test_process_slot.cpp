// ProcessSlot (cases/process_slot.h): no more than `slots` processes hold one
// at a time, every waiting process gets one, a killed holder's slot is free
// again, and the wait is bounded.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "cases/process_slot.h"
#include "cases/remove_tree.h"

namespace mlagate {
namespace {

using namespace std::chrono_literals;

struct Folder {
  std::string path;
  Folder() {
    char tmpl[] = "/tmp/mlagate-slot-test-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~Folder() { remove_tree(path); }
};

// Counters in memory shared with forked children.
struct Shared {
  std::atomic<int> inside{0}, most{0}, done{0}, held{0};
};

TEST(ProcessSlot, AtMostSlotsProcessesHoldOneAndEveryOneGetsOne) {
  const Folder f;
  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* sh = new (mem) Shared;
  constexpr int kProcesses = 6, kSlots = 2;
  std::vector<pid_t> kids;
  for (int i = 0; i < kProcesses; ++i) {
    const pid_t p = ::fork();
    ASSERT_GE(p, 0);
    if (p == 0) {
      {
        const ProcessSlot s(f.path, kSlots, 20s);
        if (s.held()) ++sh->held;
        const int now = ++sh->inside;
        for (int m = sh->most.load(); now > m && !sh->most.compare_exchange_weak(m, now);) {
        }
        std::this_thread::sleep_for(150ms);
        --sh->inside;
      }
      ++sh->done;
      ::_exit(0);
    }
    kids.push_back(p);
  }
  for (pid_t p : kids) ::waitpid(p, nullptr, 0);
  EXPECT_EQ(sh->done.load(), kProcesses);
  EXPECT_EQ(sh->held.load(), kProcesses) << "every process got a slot";
  EXPECT_EQ(sh->most.load(), kSlots) << "never more holders than slots, and the slots were used side by side";
  ::munmap(mem, sizeof(Shared));
}

TEST(ProcessSlot, AKilledHoldersSlotIsFreeAgain) {
  const Folder f;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t p = ::fork();
  ASSERT_GE(p, 0);
  if (p == 0) {
    const ProcessSlot s(f.path, 1, 1s);
    const char c = s.held() ? 'y' : 'n';
    (void)!::write(ready[1], &c, 1);
    ::pause();  // holds it until killed
    ::_exit(0);
  }
  char c = 0;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  {
    // Held by the child: this process waits its 50 ms and goes on without one.
    const auto t0 = std::chrono::steady_clock::now();
    const ProcessSlot s(f.path, 1, 50ms);
    EXPECT_FALSE(s.held());
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 50ms);
  }
  ::kill(p, SIGKILL);
  ::waitpid(p, nullptr, 0);
  const ProcessSlot s(f.path, 1, 5s);
  EXPECT_TRUE(s.held()) << "the killed holder's slot";
  ::close(ready[0]);
  ::close(ready[1]);
}

TEST(ProcessSlot, NoFolderOrNoSlotsHoldsNothingAtOnce) {
  EXPECT_FALSE(ProcessSlot("", 2, 10s).held());
  const Folder f;
  EXPECT_FALSE(ProcessSlot(f.path, 0, 10s).held());
  EXPECT_FALSE(ProcessSlot(f.path + "/missing", 2, 10s).held());
  ::unsetenv(kProcessSlotFolderVariable);
  EXPECT_FALSE(ProcessSlot::from_environment(10s).held());
  ::setenv(kProcessSlotFolderVariable, f.path.c_str(), 1);
  EXPECT_TRUE(ProcessSlot::from_environment(10s).held());
  ::setenv(kProcessSlotCountVariable, "0", 1);
  EXPECT_FALSE(ProcessSlot::from_environment(10s).held());
  ::unsetenv(kProcessSlotCountVariable);
  ::unsetenv(kProcessSlotFolderVariable);
}

}  // namespace
}  // namespace mlagate
