// Journal file handling (journal.h): header check, torn-line recovery,
// append per record, fdatasync on a thread of its own.
#include "harness/reliability/journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "cases/errors.h"
#include "reports/record_json.h"

namespace mlagate {

namespace {

constexpr const char* kMagic = "mlagate.journal";

void write_all(int fd, const std::string& s, const std::string& path) {
  std::size_t done = 0;
  while (done < s.size()) {
    const ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::runtime_error("journal " + path + ": write: " + std::strerror(errno));
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

Journal::Journal(std::string path, const std::string& fingerprint, bool resume) : path_(std::move(path)) {
  const std::string header =
      nlohmann::json{{"schema", kMagic}, {"version", 1}, {"fingerprint", fingerprint}}.dump() + "\n";
  std::uint64_t keep_bytes = 0;  // resume: the length of the well-formed prefix
  if (resume) {
    std::ifstream in(path_, std::ios::binary);
    if (!in)
      throw InputError("--resume: no journal at " + path_ +
                       " (a run keeps it next to its first report file, or at --journal, until it finishes)");
    std::string line;
    std::uint64_t offset = 0;
    bool first = true;
    while (std::getline(in, line)) {
      const bool complete = !in.eof();  // a line without its newline was cut by a kill
      if (!complete) break;
      if (first) {
        nlohmann::json h;
        try {
          h = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception&) {
          throw InputError("--resume: " + path_ + " is not an mlagate journal");
        }
        if (!h.is_object() || h.value("schema", "") != kMagic) throw InputError("--resume: " + path_ + " is not an mlagate journal");
        if (h.value("fingerprint", "") != fingerprint)
          throw InputError("--resume: " + path_ + " was written by a different run:\n  journal: " +
                           h.value("fingerprint", "") + "\n  this run: " + fingerprint);
        first = false;
      } else {
        try {
          previous_.push_back(record_from_json_line(line));
        } catch (const std::exception&) {
          break;  // torn or corrupt: everything from here on is rerun
        }
      }
      offset += line.size() + 1;
    }
    if (first) throw InputError("--resume: " + path_ + " is empty");
    keep_bytes = offset;
  }
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | (resume ? 0 : O_TRUNC), 0644);
  if (fd_ < 0) throw InputError("journal " + path_ + ": " + std::strerror(errno));
  if (resume) {
    if (::ftruncate(fd_, static_cast<off_t>(keep_bytes)) != 0 || ::lseek(fd_, 0, SEEK_END) < 0)
      throw std::runtime_error("journal " + path_ + ": " + std::strerror(errno));
  } else {
    write_all(fd_, header, path_);
    ::fsync(fd_);
  }
  try {
    syncer_ = std::thread([this] { sync_lines(); });
  } catch (...) {
    ::close(fd_);  // no destructor runs for a constructor that throws
    throw;
  }
}

Journal::~Journal() {
  {
    const std::lock_guard lock(mutex_);
    closing_ = true;
  }
  wake_.notify_one();
  if (syncer_.joinable()) syncer_.join();  // the last lines synced first
  if (fd_ >= 0) ::close(fd_);
}

void Journal::sync_lines() {
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return unsynced_ || closing_; });
    if (!unsynced_) return;  // closing, nothing left
    unsynced_ = false;
    lock.unlock();
    const bool ok = ::fdatasync(fd_) == 0;
    const int err = errno;
    lock.lock();
    if (!ok && sync_error_.empty()) sync_error_ = "journal " + path_ + ": fdatasync: " + std::strerror(err);
  }
}

void Journal::append(const Record& r) {
  const std::string line = record_to_json_line(r) + "\n";
  {
    const std::lock_guard lock(mutex_);
    if (!sync_error_.empty()) throw std::runtime_error(sync_error_);
    write_all(fd_, line, path_);
    unsynced_ = true;
  }
  wake_.notify_one();
}

}  // namespace mlagate
