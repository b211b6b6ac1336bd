// ProcessSlot (process_slot.h): flock'd slot files, polled so that the wait is bounded.
#include "cases/process_slot.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace mlagate {

ProcessSlot::ProcessSlot(const std::string& folder, int slots, std::chrono::milliseconds patience) {
  if (folder.empty() || slots <= 0) return;
  // One descriptor a slot, opened once: flock locks belong to the open file,
  // so a slot this process holds is never taken twice through another one.
  std::vector<int> fds;
  for (int i = 0; i < slots; ++i) {
    const std::string path = folder + "/slot-" + std::to_string(i) + ".lock";
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd >= 0) fds.push_back(fd);
  }
  const auto give_up = std::chrono::steady_clock::now() + patience;
  for (;;) {
    for (int& fd : fds) {
      if (::flock(fd, LOCK_EX | LOCK_NB) == 0) {
        fd_ = fd;
        fd = -1;
        break;
      }
    }
    if (fd_ >= 0 || fds.empty() || std::chrono::steady_clock::now() >= give_up) break;
    // A start-up takes 0.2-0.4 s: a few ms of polling costs nothing beside it.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (int fd : fds)
    if (fd >= 0) ::close(fd);
}

ProcessSlot ProcessSlot::from_environment(std::chrono::milliseconds patience) {
  const char* folder = std::getenv(kProcessSlotFolderVariable);
  int slots = kDefaultProcessSlots;
  if (const char* n = std::getenv(kProcessSlotCountVariable); n && *n) slots = std::atoi(n);
  return ProcessSlot(folder ? folder : "", slots, patience);
}

ProcessSlot::~ProcessSlot() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace mlagate
