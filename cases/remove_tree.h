// Removing a folder with everything under it, with POSIX calls only. In the
// GPU machine's build (libstdc++ linked statically, libtorch beside it)
// std::filesystem::remove_all ran libtorch's own copy, which crashed the
// process (a null call inside it: PERFORMANCE.md, "Inputs drawn once per
// run"); every folder the harness removes goes through here instead.
#pragma once

#include <string>

namespace mlagate {

// Removes path (a folder and its tree, or a file); links are removed, never
// followed. False where something could not be removed (what could, is); a
// path that does not exist is true.
bool remove_tree(const std::string& path) noexcept;

}  // namespace mlagate
