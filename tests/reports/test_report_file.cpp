// write_report_file: the target holds the old report or the whole new one, never a partial
// one, and no temporary file is left behind on success or on failure.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "reports/report.h"

namespace mlagate {
namespace {

namespace fs = std::filesystem;

class ReportFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "mlagate_reports_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> entries() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
    std::sort(names.begin(), names.end());
    return names;
  }

  static std::string read(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  static ino_t inode(const fs::path& p) {
    struct stat st {};
    EXPECT_EQ(::stat(p.c_str(), &st), 0);
    return st.st_ino;
  }

  fs::path dir_;
};

TEST_F(ReportFileTest, WritesTheWholeReport) {
  const fs::path target = dir_ / "report.json";
  // Larger than the writer's buffer, so it is flushed more than once.
  std::string big;
  for (int i = 0; i < 100000; ++i) big += "line " + std::to_string(i) + "\n";
  write_report_file(target.string(), [&](std::ostream& os) { os << big; });
  EXPECT_EQ(read(target), big);
  EXPECT_EQ(entries(), std::vector<std::string>{"report.json"});
}

TEST_F(ReportFileTest, ReplacesAtomically) {
  const fs::path target = dir_ / "report.xml";
  write_report_file(target.string(), [](std::ostream& os) { os << "old report\n"; });
  const ino_t old_inode = inode(target);

  write_report_file(target.string(), [&](std::ostream& os) {
    os << "new ";
    os.flush();
    // Mid-write, readers still see the complete old report.
    EXPECT_EQ(read(target), "old report\n");
    os << "report\n";
  });
  EXPECT_EQ(read(target), "new report\n");
  // A rename swaps in a new file; truncating in place would keep the inode.
  EXPECT_NE(inode(target), old_inode);
  EXPECT_EQ(entries(), std::vector<std::string>{"report.xml"});
}

TEST_F(ReportFileTest, WriterExceptionKeepsTheOldReport) {
  const fs::path target = dir_ / "report.md";
  write_report_file(target.string(), [](std::ostream& os) { os << "old report\n"; });
  EXPECT_THROW(write_report_file(target.string(),
                                 [](std::ostream& os) {
                                   os << "partial";
                                   throw std::logic_error("writer failed");
                                 }),
               std::logic_error);
  EXPECT_EQ(read(target), "old report\n");
  EXPECT_EQ(entries(), std::vector<std::string>{"report.md"});
}

TEST_F(ReportFileTest, MissingDirectoryThrowsWithThePath) {
  const std::string target = (dir_ / "no_such_dir" / "report.json").string();
  try {
    write_report_file(target, [](std::ostream& os) { os << "x"; });
    FAIL() << "expected std::runtime_error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(target), std::string::npos) << e.what();
  }
  EXPECT_TRUE(entries().empty());
}

TEST_F(ReportFileTest, DirectoryTargetThrowsAndLeavesNothing) {
  fs::create_directory(dir_ / "taken");
  EXPECT_THROW(write_report_file((dir_ / "taken").string(), [](std::ostream& os) { os << "x"; }),
               std::runtime_error);
  EXPECT_EQ(entries(), std::vector<std::string>{"taken"});
}

TEST_F(ReportFileTest, RelativePathWritesInTheCurrentDirectory) {
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_);
  write_report_file("plain.txt", [](std::ostream& os) { os << "here\n"; });
  fs::current_path(cwd);
  EXPECT_EQ(read(dir_ / "plain.txt"), "here\n");
  EXPECT_EQ(entries(), std::vector<std::string>{"plain.txt"});
}

}  // namespace
}  // namespace mlagate
