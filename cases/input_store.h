// Large drawn inputs shared by the workers of one run: drawn once per run,
// not once per worker. Workers side by side (--workers, --devices) draw the
// same big tensors again and again (a TP degree's weights for every batch
// spec, a batch spec's latent rows at every TP degree): 8 workers drew each
// up to 8 times, which made drawing the largest share of the host's CPU
// (PERFORMANCE.md, "Inputs drawn once per run"). The parent makes a private
// folder (InputStoreFolder) and names it to its workers in MLAGATE_INPUT_STORE;
// the first worker to need a tensor claims it, draws it and leaves its bytes
// there; the others wait for them and read them. The bytes are the drawn
// bytes, so every value is what drawing it again would give.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "cases/dtype.h"
#include "cases/tensor.h"

namespace mlagate {

// The variable that names the folder to the workers.
inline constexpr const char* kInputStoreVariable = "MLAGATE_INPUT_STORE";

// The parent's side: a folder only this user can read, removed with
// everything in it when this object goes (after the workers have ended).
// POSIX calls only, no std::filesystem: in a build whose libstdc++ is linked
// statically, libtorch's own copies of its functions take their place at run
// time, and remove_all crashed there (the GPU machine's build).
class InputStoreFolder {
 public:
  InputStoreFolder() = default;
  // Under /dev/shm where it is (memory, as the workers' own copies are), else
  // the temporary folder, named "mlagate-inputs-<pid>-XXXXXX". Folders of
  // this user's runs whose process is gone (killed before removing theirs)
  // are removed first. Throws std::runtime_error where none can be made.
  static InputStoreFolder create();
  InputStoreFolder(InputStoreFolder&& o) noexcept : path_(std::move(o.path_)) { o.path_.clear(); }
  InputStoreFolder& operator=(InputStoreFolder&& o) noexcept;
  InputStoreFolder(const InputStoreFolder&) = delete;
  InputStoreFolder& operator=(const InputStoreFolder&) = delete;
  ~InputStoreFolder();

  const std::string& path() const { return path_; }
  // "MLAGATE_INPUT_STORE=<folder>", for the workers' environment.
  std::string env() const { return std::string(kInputStoreVariable) + "=" + path_; }

 private:
  std::string path_;
};

// The workers' side. A tensor of key `key` (every property its values depend
// on, in words) is fetched from the store or claimed for drawing:
//   InputClaim claim(key, t);
//   if (!claim.loaded()) { draw into t; claim.publish(t); }
// Without a store (no MLAGATE_INPUT_STORE), for a tensor smaller than
// kMinSharedBytes, or whatever goes wrong with the folder (full, removed,
// a file that does not match), it loads nothing and publishes nothing: the
// caller draws, as it would alone.
class InputClaim {
 public:
  static constexpr std::size_t kMinSharedBytes = std::size_t{1} << 20;
  // What the store keeps at most, all workers together; past it they draw.
  static constexpr std::size_t kMaxStoreBytes = std::size_t{4} << 30;
  // How long a worker waits for another's claim before drawing itself.
  static constexpr double kWaitSeconds = 120;

  InputClaim(const std::string& key, Tensor& t);
  // Same, in the folder given (tests; the constructor above reads the variable).
  InputClaim(const std::string& folder, const std::string& key, Tensor& t);
  InputClaim(const InputClaim&) = delete;
  InputClaim& operator=(const InputClaim&) = delete;
  ~InputClaim();  // an unpublished claim is given up: a waiting worker draws

  // t holds the stored bytes.
  bool loaded() const { return loaded_; }
  // Leaves t's bytes in the store (a claimed tensor only; best effort).
  void publish(const Tensor& t);

 private:
  void acquire(Tensor& t);
  std::string folder_;
  std::string key_;
  std::string file_, claim_;
  bool loaded_ = false, claimed_ = false;
};

// The key of a tensor of normals drawn by fill_normal (cases/case.cpp): every
// property its bytes depend on.
std::string normal_tensor_key(std::uint64_t seed, const std::string& name, double factor, DType dtype,
                              const Shape& shape);

}  // namespace mlagate
