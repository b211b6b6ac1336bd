// The run's shared store of drawn inputs (input_store.h): one file a tensor,
// "<hash of its key>", holding a header (magic, the key in words, the byte
// count) and the bytes; a claim file beside it while one worker draws it.
#include "cases/input_store.h"

#include "cases/remove_tree.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <thread>

namespace mlagate {

namespace {

constexpr char kMagic[8] = {'M', 'L', 'A', 'G', 'I', 'N', '0', '1'};

// Closes on every way out.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

bool read_all(int fd, void* p, std::size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, b, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<std::size_t>(r);
  }
  return true;
}

bool write_all(int fd, const void* p, std::size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, b, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    b += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

std::string hex_name(const std::string& key) {
  std::uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a, then mixed: a name, not a check (the key is compared)
  for (unsigned char ch : key) h = (h ^ ch) * 0x100000001B3ull;
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// t's bytes from the file when it is whole and of this key and size.
bool try_load(const std::string& file, const std::string& key, Tensor& t) {
  Fd f(::open(file.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) return false;
  char magic[8];
  std::uint64_t key_len = 0, nbytes = 0;
  if (!read_all(f.fd, magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof magic) != 0) return false;
  if (!read_all(f.fd, &key_len, sizeof key_len) || key_len != key.size()) return false;
  std::string stored(key_len, '\0');
  if (!read_all(f.fd, stored.data(), key_len) || stored != key) return false;
  if (!read_all(f.fd, &nbytes, sizeof nbytes) || nbytes != t.nbytes()) return false;
  if (!read_all(f.fd, t.bytes(), t.nbytes())) return false;
  char extra;
  return ::read(f.fd, &extra, 1) == 0;  // nothing past the bytes: not some other file's
}

std::size_t stored_bytes(const std::string& folder) {
  std::size_t total = 0;
  DIR* d = ::opendir(folder.c_str());
  if (!d) return total;
  while (const dirent* e = ::readdir(d)) {
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      total += static_cast<std::size_t>(st.st_size);
  }
  ::closedir(d);
  return total;
}

// The pid a claim file names, 0 while its writer has not written it yet.
long claimer(const std::string& claim) {
  Fd f(::open(claim.c_str(), O_RDONLY | O_CLOEXEC));
  if (f.fd < 0) return 0;
  char buf[32] = {};
  const ssize_t r = ::read(f.fd, buf, sizeof buf - 1);
  return r > 0 ? std::strtol(buf, nullptr, 10) : 0;
}

constexpr char kFolderPrefix[] = "mlagate-inputs-";

// Folders of this user's runs whose parent is gone without removing them
// (killed: SIGKILL, a CI timeout), whose memory would otherwise stay taken
// until the machine restarts. A folder names its parent's pid; a live
// process of that pid (the run, or one that reused its number) keeps it.
void sweep_orphans(const std::string& base) {
  DIR* d = ::opendir(base.c_str());
  if (!d) return;
  const std::size_t prefix = std::strlen(kFolderPrefix);
  while (const dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, kFolderPrefix, prefix) != 0) continue;
    char* end = nullptr;
    const long pid = std::strtol(e->d_name + prefix, &end, 10);
    if (pid <= 0 || !end || *end != '-') continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != ::getuid())
      continue;
    remove_tree(base + "/" + e->d_name);
  }
  ::closedir(d);
}

}  // namespace

std::string normal_tensor_key(std::uint64_t seed, const std::string& name, double factor, DType dtype,
                              const Shape& shape) {
  char factor_str[40];
  std::snprintf(factor_str, sizeof factor_str, "%a", factor);
  return "normal seed=" + std::to_string(seed) + " name=" + name + " factor=" + factor_str +
         " dtype=" + std::string(dtype_name(dtype)) + " shape=" + shape_str(shape);
}

InputStoreFolder InputStoreFolder::create() {
  std::string base = "/dev/shm";
  struct stat st {};
  if (::stat(base.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || ::access(base.c_str(), W_OK | X_OK) != 0) {
    const char* tmp = std::getenv("TMPDIR");
    base = tmp && *tmp ? tmp : "/tmp";
  }
  sweep_orphans(base);
  std::string templ = base + "/" + kFolderPrefix + std::to_string(static_cast<long>(::getpid())) + "-XXXXXX";
  if (!::mkdtemp(templ.data()))  // mode 0700: this user's alone
    throw std::runtime_error("input store: cannot make a folder under " + base + ": " + std::strerror(errno));
  InputStoreFolder f;
  f.path_ = templ;
  return f;
}

InputStoreFolder& InputStoreFolder::operator=(InputStoreFolder&& o) noexcept {
  if (this != &o) {
    InputStoreFolder gone(std::move(*this));
    path_ = std::move(o.path_);
    o.path_.clear();
  }
  return *this;
}

InputStoreFolder::~InputStoreFolder() {
  // Nothing to report at the end of a run: a folder left behind is only
  // memory, and the next run's create() sweeps it once this process is gone.
  if (!path_.empty()) remove_tree(path_);
}

InputClaim::InputClaim(const std::string& key, Tensor& t) : key_(key) {
  const char* folder = std::getenv(kInputStoreVariable);
  if (!folder || !*folder) return;
  folder_ = folder;
  acquire(t);
}

InputClaim::InputClaim(const std::string& folder, const std::string& key, Tensor& t) : folder_(folder), key_(key) {
  if (!folder_.empty()) acquire(t);
}

void InputClaim::acquire(Tensor& t) {
  if (t.nbytes() < kMinSharedBytes) return;
  file_ = folder_ + "/" + hex_name(key_);
  claim_ = file_ + ".claim";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(kWaitSeconds);
  for (;;) {
    if (try_load(file_, key_, t)) {
      loaded_ = true;
      return;
    }
    {
      Fd f(::open(claim_.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600));
      if (f.fd >= 0) {
        const std::string pid = std::to_string(static_cast<long>(::getpid()));
        claimed_ = write_all(f.fd, pid.data(), pid.size());
        if (!claimed_) {
          ::unlink(claim_.c_str());
          return;
        }
      } else if (errno != EEXIST) {
        return;  // the folder is gone or not writable: draw alone
      }
    }
    if (claimed_) {
      // Published between the load above and the claim: read it after all.
      if (try_load(file_, key_, t)) {
        ::unlink(claim_.c_str());
        claimed_ = false;
        loaded_ = true;
      }
      return;
    }
    // Another worker draws it. One that died doing so leaves its claim behind.
    if (const long pid = claimer(claim_); pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ::unlink(claim_.c_str());
      continue;
    }
    if (std::chrono::steady_clock::now() > deadline) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

void InputClaim::publish(const Tensor& t) {
  if (!claimed_) return;
  const std::size_t size = sizeof kMagic + 2 * sizeof(std::uint64_t) + key_.size() + t.nbytes();
  struct statvfs vfs {};
  const bool room = stored_bytes(folder_) + size <= kMaxStoreBytes && ::statvfs(folder_.c_str(), &vfs) == 0 &&
                    static_cast<double>(vfs.f_bavail) * static_cast<double>(vfs.f_frsize) >=
                        static_cast<double>(size) + static_cast<double>(std::size_t{256} << 20);
  if (room) {
    const std::string tmp = file_ + ".tmp." + std::to_string(static_cast<long>(::getpid()));
    bool ok = false;
    {
      Fd f(::open(tmp.c_str(), O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600));
      const std::uint64_t key_len = key_.size(), nbytes = t.nbytes();
      ok = f.fd >= 0 && write_all(f.fd, kMagic, sizeof kMagic) && write_all(f.fd, &key_len, sizeof key_len) &&
           write_all(f.fd, key_.data(), key_.size()) && write_all(f.fd, &nbytes, sizeof nbytes) &&
           write_all(f.fd, t.bytes(), t.nbytes());
    }
    // Whole or not at all: readers see the file only once it is renamed there.
    if (!ok || ::rename(tmp.c_str(), file_.c_str()) != 0) ::unlink(tmp.c_str());
  }
  ::unlink(claim_.c_str());
  claimed_ = false;
}

InputClaim::~InputClaim() {
  if (claimed_) ::unlink(claim_.c_str());
}

}  // namespace mlagate
