// A few processes at a time: one of `slots` slots of a folder held across
// processes (an flock'd file per slot, released when the holder closes it or
// dies). The workers of a run take one around their CUDA start-up
// (gpu/device.cpp): the driver serializes the start-ups of the
// processes on a host, so 16 workers starting together all had their device
// only after 3-4 s, where a few at a time have the first ones working after
// a fraction of that (PERFORMANCE.md, "The workers' CUDA start-up").
#pragma once

#include <chrono>
#include <string>

namespace mlagate {

// The variable that names the slots' folder to the workers, and the one that
// sets their number (a measurement aid; 0: no slots).
inline constexpr const char* kProcessSlotFolderVariable = "MLAGATE_DEVICE_START_SLOTS";
inline constexpr const char* kProcessSlotCountVariable = "MLAGATE_DEVICE_START_SLOT_COUNT";
// 4: in 3 pairs of runs on 2 H200s 4 slots were ahead of 2 (PERFORMANCE.md).
inline constexpr int kDefaultProcessSlots = 4;

class ProcessSlot {
 public:
  // Holds one of `slots` slots of `folder` ("<folder>/slot-<i>.lock"),
  // waiting at most `patience` for one (then goes on without: a slow or stuck
  // holder never stops the others for good). An empty folder, slots <= 0 or a
  // folder where no file can be made: holds nothing, at once.
  ProcessSlot(const std::string& folder, int slots, std::chrono::milliseconds patience);
  // From the environment: kProcessSlotFolderVariable's folder, with
  // kProcessSlotCountVariable's number of slots (else kDefaultProcessSlots).
  static ProcessSlot from_environment(std::chrono::milliseconds patience);
  ProcessSlot(const ProcessSlot&) = delete;
  ProcessSlot& operator=(const ProcessSlot&) = delete;
  ProcessSlot(ProcessSlot&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  ProcessSlot& operator=(ProcessSlot&&) = delete;
  ~ProcessSlot();

  bool held() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

}  // namespace mlagate
