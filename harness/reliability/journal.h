// The run journal: every record appended as one JSON line the moment it is
// made, so a run killed at any point (SIGINT, SIGTERM, kill -9) keeps what it
// finished; `mlagate run --resume` reads it back and runs only what is
// missing. A thread of the journal's own makes the lines durable
// (fdatasync) as they come, several at once when they come faster than the
// disk syncs, so that no record waits for the disk: power loss costs at most
// the records of the last sync's interval, which a resume runs again. The
// first line says which run wrote it. The CLI removes it once a run has
// finished and written its reports.
#pragma once

#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "reports/record.h"

namespace mlagate {

class Journal {
 public:
  // Opens `path`. fresh: starts a new journal (an old one is replaced).
  // resume: reads the records already there (a torn last line, from a kill in
  // the middle of a write, is dropped) and appends after them. `fingerprint`
  // describes the run (selection, backends, ops, policy, execution flags);
  // resuming a journal written by a different run is an InputError.
  Journal(std::string path, const std::string& fingerprint, bool resume);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  const std::vector<Record>& previous() const { return previous_; }
  const std::string& path() const { return path_; }
  // Written (in the file, whatever becomes of this process) before it returns,
  // made durable by the sync thread; throws on I/O errors, a failed sync's too.
  void append(const Record& r);

  static std::string key(const std::string& case_id, const std::string& backend, const std::string& op) {
    return case_id + '\x1f' + backend + '\x1f' + op;
  }
  static std::string key(const Record& r) { return key(r.case_id, r.backend, r.op); }

 private:
  void sync_lines();  // the sync thread's loop

  std::string path_;
  int fd_ = -1;
  std::vector<Record> previous_;
  std::mutex mutex_;  // whole lines, and the sync thread's state
  std::condition_variable wake_;
  bool unsynced_ = false, closing_ = false;
  std::string sync_error_;  // the first failed sync, thrown by the next append
  std::thread syncer_;      // last: started once the rest is set up
};

}  // namespace mlagate
