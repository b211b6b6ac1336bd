// The run's shared store of drawn inputs (cases/input_store.h): what one
// worker publishes another reads byte for byte; what does not match (another
// key, another size, a file cut short) is never read; a worker waits for
// another's claim and takes over a dead one's; small tensors and runs
// without a folder share nothing; the case generator reads and fills it; a
// killed run's folder is swept by the next; remove_tree removes a tree.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cases/case.h"
#include "cases/encoding.h"
#include "cases/generator.h"
#include "cases/input_store.h"
#include "cases/remove_tree.h"
#include "cases/suite.h"

namespace mlagate {
namespace {

namespace fs = std::filesystem;

Tensor pattern(std::int64_t n, std::uint16_t salt) {
  Tensor t(DType::kBF16, {n});
  auto* p = t.data<std::uint16_t>();
  for (std::int64_t i = 0; i < n; ++i) p[i] = static_cast<std::uint16_t>(i * 2654435761u + salt);
  return t;
}

bool same(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.bytes(), b.bytes(), a.nbytes()) == 0;
}

std::vector<fs::path> files_in(const fs::path& d) {
  std::vector<fs::path> v;
  for (const auto& e : fs::directory_iterator(d)) v.push_back(e.path());
  return v;
}

constexpr std::int64_t kBig = 1 << 20;  // 2 MiB of bf16: shared

TEST(InputStore, WhatOneWorkerPublishesTheNextReadsByteForByte) {
  fs::path where;
  {
    const InputStoreFolder folder = InputStoreFolder::create();
    where = folder.path();
    ASSERT_TRUE(fs::is_directory(where));
    EXPECT_EQ(folder.env(), "MLAGATE_INPUT_STORE=" + where.string());
    const Tensor drawn = pattern(kBig, 7);
    Tensor t(DType::kBF16, {kBig});
    {
      InputClaim first(where, "k1", t);
      EXPECT_FALSE(first.loaded());  // claimed: the caller draws
      t = drawn;
      first.publish(t);
    }
    EXPECT_EQ(files_in(where).size(), 1u);  // the tensor's file; no claim left behind
    Tensor u(DType::kBF16, {kBig});
    InputClaim second(where, "k1", u);
    EXPECT_TRUE(second.loaded());
    EXPECT_TRUE(same(u, drawn));
    // Another size under the same key is another tensor: not read.
    Tensor shorter(DType::kBF16, {kBig - 1});
    InputClaim third(where, "k1", shorter);
    EXPECT_FALSE(third.loaded());
  }
  EXPECT_FALSE(fs::exists(where));  // the folder goes with its owner
}

TEST(InputStore, NothingIsSharedWithoutAFolderOrForSmallTensors) {
  Tensor t = pattern(kBig, 1);
  {
    InputClaim none(fs::path(), "k", t);
    EXPECT_FALSE(none.loaded());
    none.publish(t);  // nothing to publish to
  }
  ::unsetenv(kInputStoreVariable);
  {
    InputClaim none("k", t);
    EXPECT_FALSE(none.loaded());
    none.publish(t);
  }
  const InputStoreFolder folder = InputStoreFolder::create();
  Tensor small = pattern(1000, 2);
  {
    InputClaim c(folder.path(), "small", small);
    EXPECT_FALSE(c.loaded());
    c.publish(small);
  }
  EXPECT_TRUE(files_in(folder.path()).empty());
  InputClaim again(folder.path(), "small", small);
  EXPECT_FALSE(again.loaded());
}

TEST(InputStore, AFileCutShortOrOfAnotherKeyIsNeverRead) {
  const InputStoreFolder folder = InputStoreFolder::create();
  const Tensor a = pattern(kBig, 3), b = pattern(kBig, 4);
  Tensor t(DType::kBF16, {kBig});
  auto publish = [&](const std::string& key, const Tensor& v) {
    InputClaim c(folder.path(), key, t);
    ASSERT_FALSE(c.loaded());
    c.publish(v);
  };
  publish("a", a);
  const fs::path file_a = files_in(folder.path()).at(0);
  publish("b", b);
  fs::path file_b;
  for (const fs::path& f : files_in(folder.path()))
    if (f != file_a) file_b = f;
  ASSERT_FALSE(file_b.empty());
  // a's file under b's name: the key inside is a's, so b's claim draws.
  fs::copy_file(file_a, file_b, fs::copy_options::overwrite_existing);
  {
    Tensor u(DType::kBF16, {kBig});
    InputClaim c(folder.path(), "b", u);
    EXPECT_FALSE(c.loaded());
    c.publish(b);  // and puts b's bytes back
  }
  // a's file cut short by a byte, then one byte too long.
  const auto size = fs::file_size(file_a);
  fs::resize_file(file_a, size - 1);
  {
    Tensor u(DType::kBF16, {kBig});
    InputClaim c(folder.path(), "a", u);
    EXPECT_FALSE(c.loaded());
  }
  fs::resize_file(file_a, size + 1);
  {
    Tensor u(DType::kBF16, {kBig});
    InputClaim c(folder.path(), "a", u);
    EXPECT_FALSE(c.loaded());
    c.publish(a);
  }
  for (const auto& [key, want] : {std::pair{"a", &a}, std::pair{"b", &b}}) {
    Tensor u(DType::kBF16, {kBig});
    InputClaim c(folder.path(), key, u);
    EXPECT_TRUE(c.loaded()) << key;
    EXPECT_TRUE(same(u, *want)) << key;
  }
}

TEST(InputStore, AWorkerWaitsForAnothersClaimAndTakesOverADeadOnes) {
  const InputStoreFolder folder = InputStoreFolder::create();
  const Tensor drawn = pattern(kBig, 5);
  // A live claimer: the second waits and reads what the first publishes.
  {
    Tensor t(DType::kBF16, {kBig});
    auto first = std::make_unique<InputClaim>(folder.path(), "live", t);
    ASSERT_FALSE(first->loaded());
    std::thread publisher([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      first->publish(drawn);
    });
    Tensor u(DType::kBF16, {kBig});
    InputClaim second(folder.path(), "live", u);
    publisher.join();
    EXPECT_TRUE(second.loaded());
    EXPECT_TRUE(same(u, drawn));
  }
  // A claim given up unpublished (the claimer threw): the next one claims.
  {
    Tensor t(DType::kBF16, {kBig});
    { InputClaim gone(folder.path(), "given up", t); }
    InputClaim next(folder.path(), "given up", t);
    EXPECT_FALSE(next.loaded());
    next.publish(drawn);
  }
  // A claim file left by a worker that died: taken over at once (not after
  // InputClaim::kWaitSeconds; ctest's timeout would end a wait that long).
  fs::path claim_file;
  {
    Tensor t(DType::kBF16, {kBig});
    InputClaim c(folder.path(), "dead", t);
    ASSERT_FALSE(c.loaded());
    for (const fs::path& f : files_in(folder.path()))
      if (f.extension() == ".claim") claim_file = f;
  }  // given up: its claim file is gone
  ASSERT_FALSE(claim_file.empty());
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);  // reaped: its pid names no process
  std::ofstream(claim_file) << child;
  Tensor t(DType::kBF16, {kBig});
  InputClaim c(folder.path(), "dead", t);
  EXPECT_FALSE(c.loaded());
  c.publish(drawn);
  Tensor u(DType::kBF16, {kBig});
  InputClaim d(folder.path(), "dead", u);
  EXPECT_TRUE(d.loaded());
  EXPECT_TRUE(same(u, drawn));
}

// A folder left by a run that was killed (its pid names no process) goes
// when the next run makes its own; a live run's folder stays.
TEST(InputStore, AKilledRunsFolderIsSweptByTheNext) {
  const InputStoreFolder live = InputStoreFolder::create();
  const std::string base = fs::path(live.path()).parent_path().string();
  EXPECT_EQ(fs::path(live.path()).filename().string().rfind("mlagate-inputs-" + std::to_string(::getpid()) + "-", 0), 0u)
      << live.path();
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int st = 0;
  ASSERT_EQ(::waitpid(child, &st, 0), child);
  const fs::path orphan = fs::path(base) / ("mlagate-inputs-" + std::to_string(child) + "-abcdef");
  fs::create_directory(orphan);
  std::ofstream(orphan / "0123456789abcdef") << "bytes of a tensor";
  std::ofstream(orphan / "0123456789abcdef.claim") << child;
  const fs::path other = fs::path(base) / ("mlagate-inputs-x" + std::to_string(child));  // not a run's name: kept
  fs::create_directory(other);
  {
    const InputStoreFolder next = InputStoreFolder::create();
    EXPECT_TRUE(fs::is_directory(next.path()));
  }
  EXPECT_FALSE(fs::exists(orphan));
  EXPECT_TRUE(fs::is_directory(live.path()));  // this process lives
  EXPECT_TRUE(fs::is_directory(other));
  fs::remove(other);
}

// remove_tree: a tree of folders, files and links goes, and what a link
// points to outside it stays; a missing path is removed already; a file alone goes.
TEST(RemoveTree, RemovesATreeNotWhatItsLinksPointTo) {
  const InputStoreFolder scratch = InputStoreFolder::create();
  const fs::path root = fs::path(scratch.path()) / "tree", outside = fs::path(scratch.path()) / "outside";
  fs::create_directories(root / "a" / "b" / "c");
  std::ofstream(root / "a" / "f1") << "x";
  std::ofstream(root / "a" / "b" / "c" / "f2") << "y";
  fs::create_directories(outside);
  std::ofstream(outside / "kept") << "z";
  fs::create_directory_symlink(outside, root / "a" / "link");
  EXPECT_TRUE(remove_tree(root.string()));
  EXPECT_FALSE(fs::exists(root));
  EXPECT_TRUE(fs::exists(outside / "kept"));
  EXPECT_TRUE(remove_tree((fs::path(scratch.path()) / "never made").string()));
  EXPECT_TRUE(remove_tree((outside / "kept").string()));
  EXPECT_FALSE(fs::exists(outside / "kept"));
}

// The generator reads the store (a planted tensor comes back as the case's
// weights) and fills it (what it drew is there under its key, and those are
// the bytes of drawing without a store).
TEST(InputStore, TheCaseGeneratorReadsAndFillsTheStore) {
  const InputStoreFolder folder = InputStoreFolder::create();
  ::setenv(kInputStoreVariable, folder.path().c_str(), 1);
  struct Unset {
    ~Unset() { ::unsetenv(kInputStoreVariable); }
  } unset;
  CaseSpec spec;
  spec.batch = find_batch_spec("small_decode");
  spec.tp = 1;
  const Dims& d = spec.dims;
  const Shape w_shape{d.kv_lora_rank, spec.num_heads(), d.nope_dim};
  const double factor = 1.0 / std::sqrt(static_cast<double>(d.kv_lora_rank));
  // Seeds no other test of this process draws (the generator keeps what it drew).
  spec.seed = 0x5eed0001;
  const Tensor planted = pattern(shape_numel(w_shape), 9);
  {
    Tensor t(DType::kBF16, w_shape);
    InputClaim c(folder.path(), normal_tensor_key(spec.seed, "w_uk", factor, DType::kBF16, w_shape), t);
    ASSERT_FALSE(c.loaded());
    c.publish(planted);
  }
  const Case read = generate_case(spec);
  EXPECT_TRUE(same(read.w_uk, planted));
  spec.seed = 0x5eed0002;
  const Case drawn = generate_case(spec);
  Tensor stored(DType::kBF16, w_shape);
  InputClaim c(folder.path(), normal_tensor_key(spec.seed, "w_uk", factor, DType::kBF16, w_shape), stored);
  ASSERT_TRUE(c.loaded());
  EXPECT_TRUE(same(stored, drawn.w_uk));
  // And they are the generator's values: normal(seed, "w_uk", i) x factor, rounded.
  const std::uint64_t key = gen::tensor_key("w_uk");
  for (std::int64_t i = 0; i < stored.numel(); i += 997)
    ASSERT_EQ(stored.data<std::uint16_t>()[i], f32_to_bf16(static_cast<float>(gen::normal(spec.seed, key, i) * factor)))
        << i;
}

}  // namespace
}  // namespace mlagate
