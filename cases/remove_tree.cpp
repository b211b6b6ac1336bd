// remove_tree: nftw depth first, without following links.
#include "cases/remove_tree.h"

#include <ftw.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace mlagate {

namespace {

// One entry, children before their folder (FTW_DEPTH). A failure does not
// stop the walk: what can be removed is; remove_tree reports whether the
// path is gone at the end.
int remove_one(const char* path, const struct stat*, int type, struct FTW*) {
  if (type == FTW_DP) {
    ::rmdir(path);
  } else {
    ::unlink(path);
  }
  return 0;
}

}  // namespace

bool remove_tree(const std::string& path) noexcept {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  if (!S_ISDIR(st.st_mode)) return ::unlink(path.c_str()) == 0;
  ::nftw(path.c_str(), remove_one, 32, FTW_DEPTH | FTW_PHYS);
  return ::lstat(path.c_str(), &st) != 0 && errno == ENOENT;
}

}  // namespace mlagate
