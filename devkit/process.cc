#include "devkit/process.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace idemsink::devkit {

Process::Process(std::vector<std::string> argv, std::filesystem::path out_file, std::filesystem::path err_file,
                 std::map<std::string, std::string> env)
    : out_file_(std::move(out_file)), err_file_(std::move(err_file)) {
  std::vector<std::string> envs;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    if (!env.count(kv.substr(0, kv.find('=')))) envs.push_back(kv);
  }
  for (const auto& [k, v] : env) envs.push_back(k + "=" + v);
  const pid_t parent = ::getpid();
  pid_ = ::fork();
  if (pid_ < 0) throw std::runtime_error("fork failed");
  if (pid_ == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    int out = ::open(out_file_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    int err = ::open(err_file_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(out, 1);
    ::dup2(err, 2);
    std::vector<char*> args, envp;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);
    for (auto& e : envs) envp.push_back(e.data());
    envp.push_back(nullptr);
    ::execve(args[0], args.data(), envp.data());
    ::dprintf(2, "exec %s failed\n", args[0]);
    ::_exit(127);
  }
}

Process::~Process() {
  if (running()) kill_now();
}

bool Process::running() {
  if (status_ || pid_ <= 0) return false;
  int st = 0;
  pid_t r = ::waitpid(pid_, &st, WNOHANG);
  if (r == pid_) {
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st);
    return false;
  }
  return true;
}

void Process::signal(int sig) {
  if (running()) ::kill(pid_, sig);
}

std::optional<int> Process::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (running()) {
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return status_;
}

void Process::kill_now() {
  if (!running()) return;
  ::kill(pid_, SIGKILL);
  int st = 0;
  ::waitpid(pid_, &st, 0);
  status_ = -SIGKILL;
}

std::string Process::out() const { return read_file(out_file_); }
std::string Process::err() const { return read_file(err_file_); }

int free_port() {
  // A server the tests start needs a fixed port (Kafka's voters name their
  // peers; a broker or MariaDB restarts on the port it had). The port comes
  // from below the kernel's ephemeral range, where no outgoing connection
  // takes it as its source port while its server is down, and never twice
  // in one process, so a stopped server's port is not handed to another.
  static std::mutex mu;
  static std::set<int> handed_out;
  static std::mt19937 pick{std::random_device{}()};
  std::lock_guard lk(mu);
  std::uniform_int_distribution<int> below_ephemeral(10000, 32000);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int port = below_ephemeral(pick);
    if (handed_out.count(port)) continue;
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("free_port: socket failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    if (!free) continue;
    handed_out.insert(port);
    return port;
  }
  throw std::runtime_error("free_port: no free port in 10000-32000 on 127.0.0.1 after 1000 tries");
}

ScratchDir::ScratchDir(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::filesystem::path base = tmp ? tmp : "/tmp";
  std::random_device rd;
  path_ = base / ("idemsink-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(rd() % 1000000));
  std::filesystem::create_directories(path_);
}

ScratchDir::~ScratchDir() {
  if (std::getenv("IDEMSINK_KEEP_SCRATCH")) return;
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string hex_of(std::string_view bytes) {
  static const char* d = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(d[c >> 4]);
    out.push_back(d[c & 15]);
  }
  return out;
}

std::string unhex(const std::string& h) {
  std::string bytes;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return bytes;
}

void write_file(const std::filesystem::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

std::string java_binary() {
  if (const char* home = std::getenv("JAVA_HOME"); home && *home) {
    const auto java = std::filesystem::path(home) / "bin" / "java";
    if (std::filesystem::exists(java)) return java.string();
  }
  std::istringstream path(std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin");
  std::string dir;
  while (std::getline(path, dir, ':'))
    if (!dir.empty() && ::access((std::filesystem::path(dir) / "java").c_str(), X_OK) == 0)
      return (std::filesystem::path(dir) / "java").string();
  throw std::runtime_error("no java on PATH (or in JAVA_HOME): install a JRE 17 (scripts/install-deps)");
}

}  // namespace idemsink::devkit
