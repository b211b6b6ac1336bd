// posix_spawn of /bin/sh -c with a new process group, polled with a deadline;
// on timeout the whole group is killed, so a program's own children go too.
#include "backends/exec/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace mlagate::exec {

namespace {

// posix_spawn's attribute and file-action objects as RAII.
struct SpawnSetup {
  posix_spawnattr_t attr;
  posix_spawn_file_actions_t files;
  SpawnSetup() {
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_init(&files);
  }
  ~SpawnSetup() {
    posix_spawn_file_actions_destroy(&files);
    posix_spawnattr_destroy(&attr);
  }
  SpawnSetup(const SpawnSetup&) = delete;
  SpawnSetup& operator=(const SpawnSetup&) = delete;
};

void check(int rc, const char* what) {
  if (rc != 0) throw std::runtime_error(std::string("exec: ") + what + ": " + std::strerror(rc));
}

}  // namespace

CommandResult run_command(const std::string& command, double timeout_s, const std::string& stdout_path,
                          const std::string& stderr_path) {
  SpawnSetup s;
  check(posix_spawnattr_setflags(&s.attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK),
        "posix_spawnattr_setflags");
  check(posix_spawnattr_setpgroup(&s.attr, 0), "posix_spawnattr_setpgroup");
  sigset_t def, none;
  sigemptyset(&def);
  sigaddset(&def, SIGPIPE);
  sigaddset(&def, SIGINT);
  sigaddset(&def, SIGTERM);
  sigemptyset(&none);
  check(posix_spawnattr_setsigdefault(&s.attr, &def), "posix_spawnattr_setsigdefault");
  check(posix_spawnattr_setsigmask(&s.attr, &none), "posix_spawnattr_setsigmask");
  check(posix_spawn_file_actions_addopen(&s.files, 0, "/dev/null", O_RDONLY, 0), "stdin");
  check(posix_spawn_file_actions_addopen(&s.files, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), "stdout");
  check(posix_spawn_file_actions_addopen(&s.files, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644), "stderr");
  const std::string sh = "/bin/sh";
  std::string arg0 = "sh", arg1 = "-c", arg2 = command;
  char* argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};

  const auto t0 = std::chrono::steady_clock::now();
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, sh.c_str(), &s.files, &s.attr, argv, environ);
  if (rc != 0) throw std::runtime_error("exec: cannot start /bin/sh: " + std::string(std::strerror(rc)));

  CommandResult r;
  const auto deadline = t0 + std::chrono::duration<double>(timeout_s);
  auto nap = std::chrono::microseconds(200);
  for (;;) {
    // WNOWAIT: the exited leader stays a zombie, so its process group id cannot
    // be reused before the group is killed below.
    siginfo_t info{};
    const int w = waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
    if (w == 0 && info.si_pid == pid) break;
    if (w < 0 && errno != EINTR) throw std::runtime_error("exec: waitid: " + std::string(std::strerror(errno)));
    if (std::chrono::steady_clock::now() >= deadline) {
      r.timed_out = true;
      break;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(20000));
  }
  // The whole group: on timeout the program, otherwise stragglers it left behind.
  kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!r.timed_out) {
    if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
  }
  return r;
}

std::string tail_of_file(const std::string& path, std::size_t max_bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = size > static_cast<std::streamoff>(max_bytes) ? size - static_cast<std::streamoff>(max_bytes) : 0;
  in.seekg(from);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (from > 0) {
    const std::size_t nl = text.find('\n');
    text = "..." + (nl == std::string::npos ? text : text.substr(nl + 1));
  }
  std::string out;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (line.empty()) continue;
    for (char& ch : line)
      if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = ' ';
    out += (out.empty() ? "" : " | ") + line;
  }
  return out;
}

std::string shell_quote(const std::string& s) {
  std::string r = "'";
  for (char ch : s) r += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return r + "'";
}

std::string shell_word(const std::string& s) {
  if (!s.empty() &&
      s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./=,:") == std::string::npos)
    return s;
  return shell_quote(s);
}

}  // namespace mlagate::exec
