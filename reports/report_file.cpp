// Atomic report files: a CI step or a person tailing the report directory never sees a
// half-written report, and a failed write leaves the previous report in place.
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <streambuf>

#include "reports/report.h"

namespace mlagate {
namespace {

[[noreturn]] void throw_errno(const std::string& what, const std::string& path, int err) {
  throw std::runtime_error(what + " " + path + ": " + std::strerror(err));
}

// A buffered std::streambuf over a file descriptor, so the descriptor stays ours to fsync.
// It remembers the first write error; the stream then goes bad.
class FdOutBuf : public std::streambuf {
 public:
  explicit FdOutBuf(int fd) : fd_(fd) { setp(buf_, buf_ + sizeof buf_); }
  int error() const { return error_; }

 protected:
  int_type overflow(int_type c) override {
    if (!flush_buffer()) return traits_type::eof();
    if (!traits_type::eq_int_type(c, traits_type::eof())) {
      *pptr() = traits_type::to_char_type(c);
      pbump(1);
    }
    return traits_type::not_eof(c);
  }
  int sync() override { return flush_buffer() ? 0 : -1; }

 private:
  bool flush_buffer() {
    const char* p = pbase();
    while (p < pptr()) {
      const ssize_t n = ::write(fd_, p, static_cast<std::size_t>(pptr() - p));
      if (n < 0) {
        if (errno == EINTR) continue;
        error_ = errno;
        return false;
      }
      p += n;
    }
    setp(buf_, buf_ + sizeof buf_);
    return true;
  }

  int fd_;
  int error_ = 0;
  char buf_[1 << 16];
};

// Owns the temporary file until commit(): closes the descriptor and removes the file on
// any early exit, including an exception from the report writer.
class TempFile {
 public:
  explicit TempFile(const std::string& target) {
    namespace fs = std::filesystem;
    const fs::path target_path(target);
    const fs::path dir = target_path.has_parent_path() ? target_path.parent_path() : ".";
    // A dot name, so that globs over the report directory skip it; pid and a counter keep
    // concurrent writers (threads or processes) apart, and O_EXCL guards the rest.
    static std::atomic<unsigned> counter{0};
    for (int attempt = 0; attempt < 100; ++attempt) {
      std::string name = ".";
      name += target_path.filename().string();
      name += ".tmp.";
      name += std::to_string(::getpid());
      name += '.';
      name += std::to_string(counter++);
      path_ = (dir / name).string();
      // 0666 filtered by the umask: the permissions a plain new file would get.
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
      if (fd_ >= 0) return;
      if (errno != EEXIST) throw_errno("cannot create a temporary file for report", target, errno);
    }
    throw std::runtime_error("cannot create a temporary file for report " + target +
                             ": too many leftover temporary files");
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  ~TempFile() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_) ::unlink(path_.c_str());
  }

  int fd() const { return fd_; }

  // Durable contents first, then the rename: after a crash the target is old or new, never empty.
  void commit(const std::string& target) {
    if (::fsync(fd_) != 0) throw_errno("cannot flush report", target, errno);
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) throw_errno("cannot close report", target, errno);
    if (::rename(path_.c_str(), target.c_str()) != 0) {
      throw_errno("cannot rename a temporary file onto report", target, errno);
    }
    committed_ = true;
  }

 private:
  std::string path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace

void write_report_file(const std::string& path,
                       const std::function<void(std::ostream&)>& writer) {
  TempFile temp(path);
  FdOutBuf buf(temp.fd());
  std::ostream os(&buf);
  writer(os);
  os.flush();
  if (!os) {
    const int err = buf.error();
    if (err != 0) throw_errno("cannot write report", path, err);
    throw std::runtime_error("cannot write report " + path + ": the stream failed");
  }
  temp.commit(path);
}

}  // namespace mlagate
