// The run journal: every record appended as one JSON line the moment it is
// made, and fsync'd, so a run killed at any point (SIGINT, SIGTERM, kill -9,
// power loss) keeps what it finished; `mlagate run --resume` reads it back and
// runs only what is missing. The first line says which run wrote it. The CLI
// removes it once a run has finished and written its reports.
#pragma once

#include <cstdio>
#include <string>
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
  void append(const Record& r);  // written and fsync'd before it returns; throws on I/O errors

  static std::string key(const std::string& case_id, const std::string& backend, const std::string& op) {
    return case_id + '\x1f' + backend + '\x1f' + op;
  }
  static std::string key(const Record& r) { return key(r.case_id, r.backend, r.op); }

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<Record> previous_;
};

}  // namespace mlagate
