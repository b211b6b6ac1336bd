// CoreShare and take_spare_cores (core_share.h): the page of workers at work
// and a worker's team sized from it.
#include "harness/run/core_share.h"

#include <omp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace mlagate {

namespace {

constexpr std::uint64_t kMagic = 0x6572616873726f63ull;  // "corshare"

// Written by the parent alone; workers read `working` as it changes.
struct Page {
  std::uint64_t magic;
  std::uint32_t working;  // read and written atomically (__atomic builtins: the workers map it read-only)
  std::uint32_t cores;
};
constexpr std::size_t kPageBytes = 4096;
static_assert(sizeof(Page) <= kPageBytes);

}  // namespace

namespace core_share_detail {

const void* map_page(const char* v) {
  if (!v || !*v) return nullptr;
  int fd = -1;
  const char* end = v + std::strlen(v);
  if (auto [p, ec] = std::from_chars(v, end, fd); ec != std::errc{} || p != end || fd < 0) return nullptr;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < static_cast<off_t>(kPageBytes)) return nullptr;
  void* m = ::mmap(nullptr, kPageBytes, PROT_READ, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto* pg = static_cast<const Page*>(m);
  if (pg->magic != kMagic || pg->cores == 0) {
    // Not the page: a descriptor of something else, left as it is.
    ::munmap(m, kPageBytes);
    return nullptr;
  }
  ::close(fd);  // the page's: the mapping keeps it, and the worker's children need not inherit it
  return pg;
}

}  // namespace core_share_detail

namespace {

// The worker's view of the page, mapped on first use; null where there is none.
const Page* worker_page() {
  static const Page* const page =
      static_cast<const Page*>(core_share_detail::map_page(std::getenv(kCoreShareVariable)));
  return page;
}

}  // namespace

CoreShare::CoreShare(std::size_t workers, std::size_t cores) {
  const auto fail = [this](const char* what) {
    const int e = errno;
    if (fd_ >= 0) ::close(fd_);
    throw std::runtime_error(std::string("core share: ") + what + ": " + std::strerror(e));
  };
  // Close-on-exec: only the workers inherit it, their spawn dup2-ing it onto
  // itself (which clears the flag in the child alone).
  fd_ = ::memfd_create("mlagate-core-share", MFD_CLOEXEC);
  if (fd_ < 0) fail("memfd_create");
  if (::ftruncate(fd_, kPageBytes) != 0) fail("ftruncate");
  void* m = ::mmap(nullptr, kPageBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (m == MAP_FAILED) fail("mmap");
  page_ = m;
  auto* pg = static_cast<Page*>(page_);
  pg->cores = static_cast<std::uint32_t>(std::max<std::size_t>(1, cores));
  __atomic_store_n(&pg->working, static_cast<std::uint32_t>(std::max<std::size_t>(1, workers)), __ATOMIC_RELAXED);
  __atomic_store_n(&pg->magic, kMagic, __ATOMIC_RELEASE);
}

CoreShare::~CoreShare() {
  if (page_) ::munmap(page_, kPageBytes);
  if (fd_ >= 0) ::close(fd_);
}

std::string CoreShare::env() const { return std::string(kCoreShareVariable) + "=" + std::to_string(fd_); }

void CoreShare::worker_done() {
  auto* pg = static_cast<Page*>(page_);
  std::uint32_t n = __atomic_load_n(&pg->working, __ATOMIC_RELAXED);
  while (n > 1 && !__atomic_compare_exchange_n(&pg->working, &n, n - 1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
}

std::size_t CoreShare::working() const {
  return __atomic_load_n(&static_cast<const Page*>(page_)->working, __ATOMIC_RELAXED);
}

void take_spare_cores() {
  const Page* pg = worker_page();
  if (!pg) return;
  // Each thread's own team (OpenMP's nthreads is a thread's setting): the
  // size it had when it first asked is its floor.
  thread_local const int floor = omp_get_max_threads();
  const std::uint32_t working = std::max<std::uint32_t>(1, __atomic_load_n(&pg->working, __ATOMIC_RELAXED));
  const int want = std::max(floor, static_cast<int>(pg->cores / working));
  if (want != omp_get_max_threads()) omp_set_num_threads(want);
}

}  // namespace mlagate
