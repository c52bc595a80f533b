// Line protocol (one message per line, fields separated by one space; values hex or free text
// last):  HELLO rank pid | SET key hex | GET key | BAR name | BARTIMEOUT name seconds |
//         FAIL text | BYE       server -> client: VAL key hex | PASS name | ABORT rank text
#include "taxfree/runtime/coordinator.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <sstream>

#include "taxfree/runtime/error.h"

namespace taxfree {

namespace {
using Clock = std::chrono::steady_clock;

std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return s;
}

bool write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

// Split "CMD rest" at the first space.
std::pair<std::string, std::string> head(const std::string& line) {
  auto sp = line.find(' ');
  if (sp == std::string::npos) return {line, ""};
  return {line.substr(0, sp), line.substr(sp + 1)};
}

// Every connection of the protocol: no Nagle delay; a peer whose host vanished without closing
// (power, network) is declared gone ~11 s after it last answered: keepalive probes from 5 s idle,
// every 2 s, and TCP_USER_TIMEOUT (which, when set, decides for keepalive too, and bounds data
// left unacknowledged); a send to a peer that stopped reading gives up after 10 s.
void tune_socket(int fd) {
  const int one = 1, idle_s = 5, interval_s = 2;  // no TCP_KEEPCNT: TCP_USER_TIMEOUT decides
  const unsigned user_timeout_ms = 11000;
  const timeval send_timeout{10, 0};
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
  ::setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof user_timeout_ms);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &send_timeout, sizeof send_timeout);
}

// connect() that gives up at `deadline` (a blocking one waits out the kernel's SYN retries,
// ~2 min, when the host does not answer). Returns 0 or an errno.
int connect_until(int fd, const sockaddr* addr, socklen_t len, Clock::time_point deadline) {
  const int flags = ::fcntl(fd, F_GETFL);
  ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
  int err = ::connect(fd, addr, len) == 0 ? 0 : errno;
  while (err == EINPROGRESS || err == EINTR) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      err = ETIMEDOUT;
      break;
    }
    pollfd p{fd, POLLOUT, 0};
    const int n = ::poll(&p, 1, int(std::min<long long>(left, 1000)));
    if (n < 0 && errno != EINTR) err = errno;
    if (n <= 0) continue;
    socklen_t el = sizeof err;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) != 0) err = errno;
  }
  ::fcntl(fd, F_SETFL, flags);
  // A loopback connect to a port nobody listens on yet can meet itself (TCP simultaneous open,
  // when the kernel picks that port as the ephemeral one): not the coordinator, so try again.
  sockaddr_in self{}, peer{};
  socklen_t ls = sizeof self, lp = sizeof peer;
  if (err == 0 && ::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &ls) == 0 &&
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &lp) == 0 && self.sin_port == peer.sin_port &&
      self.sin_addr.s_addr == peer.sin_addr.s_addr)
    err = ECONNREFUSED;
  return err;
}

// Keys and barrier names are one protocol field each.
void require_name(const std::string& name, const char* what) {
  TF_REQUIRE(!name.empty() && name.find_first_of(" \t\r\n") == std::string::npos, Status::InvalidArgument,
             "coordinator " << what << " '" << name << "' must be non-empty and without spaces or line breaks");
}

std::string ranks_text(const std::set<int>& ranks) {
  std::ostringstream os;
  bool first = true;
  for (int r : ranks) os << (first ? "" : ", ") << r, first = false;
  return os.str();
}
}  // namespace

std::string to_hex(const void* data, size_t n) {
  static const char* kDigits = "0123456789abcdef";
  std::string out(2 * n, '0');
  auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) out[2 * i] = kDigits[p[i] >> 4], out[2 * i + 1] = kDigits[p[i] & 15];
  return out;
}

std::string from_hex(const std::string& hex) {
  // The value, shortened, in the message: a corrupt line is then recognisable.
  const auto shown = [&] { return hex.size() <= 40 ? hex : hex.substr(0, 40) + "..."; };
  TF_REQUIRE(hex.size() % 2 == 0, Status::Internal,
             "odd-length hex value '" << shown() << "' (" << hex.size() << " digits) on the coordinator protocol");
  auto nib = [&](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    TF_THROW(Status::Internal, "bad hex digit '" << c << "' in '" << shown() << "' on the coordinator protocol");
  };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) out[i] = char(nib(hex[2 * i]) << 4 | nib(hex[2 * i + 1]));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Server

struct CoordinatorServer::Conn {
  int fd = -1;
  int rank = -1;
  int generation = 0;  // how many connections of this rank came before (scopes keys and barriers)
  long pid = 0;
  bool finished = false;
  bool open = true;
  std::string inbuf;
  std::set<std::string> pending_gets;  // keys as the client named them
};

namespace {
// The name a key or barrier has on the server: a rank that joins again (a second Team, one after
// the other, under the launcher) starts a fresh set of keys and barriers, shared with the other
// ranks' connections of the same generation.
std::string scoped(int generation, const std::string& name) { return std::to_string(generation) + ":" + name; }
}  // namespace

CoordinatorServer::CoordinatorServer(const std::string& host, int port, int world) : world_(world) {
  TF_REQUIRE(world >= 1, Status::InvalidArgument, "coordinator world size " << world << " must be >= 1");
  TF_REQUIRE(port >= 0 && port <= 65535, Status::InvalidArgument,
             "coordinator port " << port << " must be in [0, 65535] (0: any free port)");
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TF_REQUIRE(listen_fd_ >= 0, Status::SystemError, "socket(): " << std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(uint16_t(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    ::close(listen_fd_);
    TF_THROW(Status::InvalidArgument, "coordinator address '" << host << "' is not an IPv4 address");
  }
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 256) != 0) {
    int e = errno;
    ::close(listen_fd_);
    TF_THROW(Status::SystemError, "cannot listen on " << host << ":" << port << ": " << std::strerror(e)
                                                      << " (set TAXFREE_COORDINATOR_PORT to another port)");
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  if (::pipe2(wake_pipe_, O_CLOEXEC) != 0) {
    const int e = errno;
    ::close(listen_fd_);
    TF_THROW(Status::SystemError, "pipe2(): " << std::strerror(e));
  }
  thread_ = std::thread([this] { serve(); });
}

CoordinatorServer::~CoordinatorServer() {
  // Under torchrun rank 0 hosts the server and may get here while the other ranks are between the
  // finish barrier and their BYE: losing the server then would abort them. So a job that has not
  // failed keeps serving until every rank said BYE or closed (bounded: a rank can hang).
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  const auto all_said_bye = [&] {
    std::lock_guard<std::mutex> lk(mu_);
    if (!first_failure_.empty()) return true;
    for (const auto& c : conns_)
      if (c->rank >= 0 && c->open && !c->finished) return false;
    return true;
  };
  while (!all_said_bye() && Clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  stop_ = true;
  if (wake_pipe_[1] >= 0) (void)!::write(wake_pipe_[1], "x", 1);
  if (thread_.joinable()) thread_.join();
  for (auto& c : conns_)
    if (c->fd >= 0) ::close(c->fd);
  if (listen_fd_ >= 0) ::close(listen_fd_);
  for (int fd : wake_pipe_)
    if (fd >= 0) ::close(fd);
}

std::string CoordinatorServer::first_failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return first_failure_;
}

void CoordinatorServer::rank_ended_abnormally(int rank, const std::string& how, bool exited) {
  std::lock_guard<std::mutex> lk(mu_);
  Conn* latest = nullptr;
  for (const auto& c : conns_)
    if (c->rank == rank && (!latest || c->generation >= latest->generation)) latest = c.get();
  if (exited && latest) {
    // The launcher can reap the process before this thread has read its last lines (its BYE).
    char buf[4096];
    ssize_t got;
    while (latest->open && !latest->finished && (got = ::recv(latest->fd, buf, sizeof buf, MSG_DONTWAIT)) > 0)
      take_bytes_locked(*latest, buf, size_t(got));
    if (latest->finished) {
      record_failure_locked(rank, how);
      return;
    }
  }
  fail_locked(rank, how, nullptr);
}

void CoordinatorServer::record_failure_locked(int rank, const std::string& message) {
  if (first_failure_.empty())
    first_failure_ = (rank >= 0 ? "rank " + std::to_string(rank) + ": " : "") + one_line(message);
}

void CoordinatorServer::close_locked(Conn& c) {
  c.open = false;
  if (c.fd >= 0) ::close(c.fd);
  c.fd = -1;
}

void CoordinatorServer::send_locked(Conn& c, const std::string& line) {
  if (!c.open || write_all(c.fd, line + "\n")) return;
  const int e = errno;
  close_locked(c);  // a rank that cannot be written to is as gone as one that closed
  if (c.rank >= 0 && !c.finished)
    fail_locked(c.rank, "the coordinator could not write to its process (pid " + std::to_string(c.pid) +
                            "): " + std::strerror(e), &c);
}

void CoordinatorServer::fail_locked(int rank, const std::string& message, const Conn* source) {
  if (abort_sent_) return;  // later failures are consequences of the first
  abort_sent_ = true;
  record_failure_locked(rank, message);
  for (auto& c : conns_)
    if (c.get() != source) send_locked(*c, "ABORT " + std::to_string(rank) + " " + one_line(message));
}

void CoordinatorServer::handle_line(Conn& c, const std::string& line) {
  auto [cmd, rest] = head(line);
  if (cmd == "HELLO") {
    std::istringstream is(rest);
    is >> c.rank >> c.pid;
    if (c.rank < 0 || c.rank >= world_) {
      const int claimed = c.rank;
      c.rank = -1;  // not a rank of this job: losing it fails nothing
      send_locked(c, "ABORT -1 coordinator: rank " + std::to_string(claimed) + " is outside world size " +
                         std::to_string(world_));
      close_locked(c);
      return;
    }
    // The same process again (a new Team, one after the other) starts a new generation, whether or
    // not its old connection's BYE has been read yet; another process claiming a live rank is a
    // misconfigured job.
    for (auto& o : conns_) {
      if (o.get() == &c || o->rank != c.rank) continue;
      if (o->open && !o->finished && o->pid != c.pid) {
        fail_locked(c.rank,
                    "two processes claim rank " + std::to_string(c.rank) + " (pids " + std::to_string(o->pid) +
                        " and " + std::to_string(c.pid) + ")",
                    nullptr);  // both claimants are told too
        return;
      }
      c.generation = std::max(c.generation, o->generation + 1);
    }
    if (!first_failure_.empty()) send_locked(c, "ABORT -1 " + first_failure_);
  } else if (cmd == "SET") {
    auto [key, value] = head(rest);
    const auto [it, inserted] = kv_.emplace(scoped(c.generation, key), value);
    if (!inserted) {
      // A rank that read the first value keeps it: a different one would split the job silently.
      if (it->second != value)
        fail_locked(c.rank, "set coordinator key '" + key + "' again with a different value (a key is set once per "
                            "job; CoordinatorClient::next_key names repeated exchanges)", nullptr);
      return;
    }
    for (auto& o : conns_)
      if (o->generation == c.generation && o->pending_gets.erase(key)) send_locked(*o, "VAL " + key + " " + value);
  } else if (cmd == "GET") {
    auto it = kv_.find(scoped(c.generation, rest));
    if (it != kv_.end()) send_locked(c, "VAL " + rest + " " + it->second);
    else c.pending_gets.insert(rest);
  } else if (cmd == "BAR") {
    const std::string name = scoped(c.generation, rest);
    auto& arrived = barriers_[name];
    arrived.insert(c.rank);
    if (int(arrived.size()) == world_) {
      for (auto& o : conns_)
        if (o->generation == c.generation && arrived.count(o->rank)) send_locked(*o, "PASS " + rest);
      barriers_.erase(name);
    }
  } else if (cmd == "BARTIMEOUT") {
    auto [name, seconds] = head(rest);
    const auto pending = barriers_.find(scoped(c.generation, name));
    if (pending == barriers_.end()) {  // it passed while the timeout was on its way: nobody is missing
      fail_locked(c.rank, "host barrier '" + name + "' timed out after " + seconds +
                              " s just as the last rank arrived (a slow host?)", &c);
      return;
    }
    std::set<int> missing;
    for (int r = 0; r < world_; ++r)
      if (!pending->second.count(r)) missing.insert(r);
    fail_locked(c.rank, "host barrier '" + name + "' timed out after " + seconds + " s; rank(s) " +
                            ranks_text(missing) + " never arrived", &c);
  } else if (cmd == "FAIL") {
    fail_locked(c.rank, rest, &c);
  } else if (cmd == "BYE") {
    c.finished = true;
  }
}

void CoordinatorServer::take_bytes_locked(Conn& c, const char* data, size_t n) {
  c.inbuf.append(data, n);
  size_t nl;
  while (c.open && (nl = c.inbuf.find('\n')) != std::string::npos) {
    std::string line = c.inbuf.substr(0, nl);
    c.inbuf.erase(0, nl + 1);
    handle_line(c, line);
  }
}

void CoordinatorServer::serve() {
  std::vector<pollfd> fds;
  while (!stop_) {
    fds.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    fds.push_back({wake_pipe_[0], POLLIN, 0});
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& c : conns_) fds.push_back({c->open ? c->fd : -1, POLLIN, 0});
    }
    int n = ::poll(fds.data(), fds.size(), 200);
    if (stop_) break;
    std::lock_guard<std::mutex> lk(mu_);
    if (n < 0 && errno != EINTR) {  // nobody could be served any more: end the job, do not go quiet
      fail_locked(-1, std::string("coordinator: poll() failed: ") + std::strerror(errno), nullptr);
      break;
    }
    if (fds[0].revents & POLLIN) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        tune_socket(fd);
        auto c = std::make_unique<Conn>();
        c->fd = fd;
        conns_.push_back(std::move(c));
      }
    }
    for (size_t i = 2; i < fds.size() && i - 2 < conns_.size(); ++i) {
      Conn& c = *conns_[i - 2];
      if (!c.open || fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buf[4096];
      // Not blocking: what poll() saw may have been read since by rank_ended_abnormally (the
      // launcher's thread), and a blocking read here would hold mu_ until the rank writes again.
      ssize_t got = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (got > 0) {
        take_bytes_locked(c, buf, size_t(got));
      } else if (got == 0 || (errno != EINTR && errno != EAGAIN)) {
        const std::string why = got == 0 ? std::string("it exited or was killed") : std::strerror(errno);
        close_locked(c);
        if (!c.finished && c.rank >= 0)
          fail_locked(c.rank,
                      "its process (pid " + std::to_string(c.pid) + ") disconnected before finishing (" + why + ")",
                      &c);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Client

CoordinatorClient::CoordinatorClient(const std::string& host, int port, int rank, int world,
                                     double connect_timeout_s)
    : rank_(rank), world_(world) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  TF_REQUIRE(gai == 0, Status::InvalidArgument,
             "cannot resolve coordinator host '" << host << "': " << ::gai_strerror(gai));
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(connect_timeout_s));
  int last_errno = 0;
  while (true) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    last_errno = fd_ >= 0 ? connect_until(fd_, res->ai_addr, res->ai_addrlen, deadline) : errno;
    if (last_errno == 0) break;
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
    if (Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::freeaddrinfo(res);
  TF_REQUIRE(fd_ >= 0, Status::Timeout,
             "rank " << rank << " could not reach the coordinator at " << host << ":" << port << " within "
                     << connect_timeout_s << " s (" << std::strerror(last_errno)
                     << "); is rank 0 / the launcher running?");
  tune_socket(fd_);
  send("HELLO " + std::to_string(rank) + " " + std::to_string(long(::getpid())));
  watchdog_ = std::thread([this] { watch(); });
}

CoordinatorClient::~CoordinatorClient() {
  closing_ = true;  // the watchdog sees its own end of the connection, not a lost coordinator
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  if (watchdog_.joinable()) watchdog_.join();
  if (fd_ >= 0) ::close(fd_);
}

void CoordinatorClient::send(const std::string& line) {
  std::lock_guard<std::mutex> lk(send_mu_);
  // A failed or timed-out send may have left half a line: the connection is unusable. Shutting it
  // down makes the watchdog report it as lost (unless this rank finished or is closing).
  if (!write_all(fd_, line + "\n")) ::shutdown(fd_, SHUT_RDWR);
}

std::string CoordinatorClient::abort_message() const {
  std::lock_guard<std::mutex> lk(mu_);
  return abort_message_;
}

void CoordinatorClient::throw_if_aborted() const {
  if (aborted_) TF_THROW(Status::RemoteError, abort_message());
}

void CoordinatorClient::on_abort(std::function<void()> callback) {
  bool late;
  {
    std::lock_guard<std::mutex> lk(mu_);
    on_abort_ = callback;
    late = aborting_;  // start_abort already took the old one
  }
  if (late && callback) callback();  // outside the lock, as start_abort runs it
}

void CoordinatorClient::start_abort(const std::string& message) {
  std::function<void()> cb;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborting_) return;
    aborting_ = true;
    abort_message_ = message;
    cb = on_abort_;
  }
  if (cb) cb();  // first: the waiters below wake to an abort the GPUs already know of
  {
    std::lock_guard<std::mutex> lk(mu_);
    aborted_ = true;
  }
  cv_.notify_all();
  const double grace = exit_grace_s_.load();
  if (grace > 0) {
    std::thread([rank = rank_, grace, message] {  // detached: may outlive this client
      std::this_thread::sleep_for(std::chrono::duration<double>(grace));
      std::fprintf(stderr, "[taxfree rank %d] stopping: %s\n", rank, message.c_str());
      std::fflush(stderr);
      ::_exit(kExitRemote);
    }).detach();
  }
}

void CoordinatorClient::watch() {
  std::string inbuf;
  char buf[4096];
  while (true) {
    ssize_t got = ::recv(fd_, buf, sizeof buf, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (!finished_ && !failed_sent_ && !closing_)
        start_abort(std::string("lost the connection to the coordinator (hosted by the launcher, or by rank 0 "
                                "under torchrun/mpirun): ") +
                    (got == 0 ? "it exited or was killed" : std::strerror(errno)));
      std::lock_guard<std::mutex> lk(mu_);
      cv_.notify_all();
      return;
    }
    inbuf.append(buf, size_t(got));
    size_t nl;
    while ((nl = inbuf.find('\n')) != std::string::npos) {
      std::string line = inbuf.substr(0, nl);
      inbuf.erase(0, nl + 1);
      auto [cmd, rest] = head(line);
      if (cmd == "VAL") {
        auto [key, value] = head(rest);
        std::lock_guard<std::mutex> lk(mu_);
        values_[key] = value;
        cv_.notify_all();
      } else if (cmd == "PASS") {
        std::lock_guard<std::mutex> lk(mu_);
        passed_.insert(rest);
        cv_.notify_all();
      } else if (cmd == "ABORT") {
        auto [who, text] = head(rest);
        start_abort(who == "-1" ? text : "rank " + who + " failed: " + text);
      }
    }
  }
}

void CoordinatorClient::set(const std::string& key, const std::string& value) {
  require_name(key, "key");
  send("SET " + key + " " + to_hex(value.data(), value.size()));
}

std::string CoordinatorClient::next_key(const std::string& stem) {
  require_name(stem, "key");
  return stem + "#" + std::to_string(keys_made_++);
}

std::string CoordinatorClient::get(const std::string& key, double timeout_s) {
  require_name(key, "key");
  send("GET " + key);
  std::unique_lock<std::mutex> lk(mu_);
  bool ok = cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                         [&] { return aborted_.load() || values_.count(key) > 0; });
  if (aborted_) TF_THROW(Status::RemoteError, abort_message_);
  TF_REQUIRE(ok, Status::Timeout, "no rank published '" << key << "' within " << timeout_s << " s");
  return from_hex(values_[key]);
}

std::vector<std::string> CoordinatorClient::all_gather(const std::string& key, const std::string& value,
                                                        double timeout_s) {
  set(key + "/" + std::to_string(rank_), value);
  std::vector<std::string> out;
  out.resize(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) out[size_t(r)] = get(key + "/" + std::to_string(r), timeout_s);
  return out;
}

void CoordinatorClient::barrier(const std::string& name, double timeout_s) {
  require_name(name, "barrier name");
  send("BAR " + name);
  std::unique_lock<std::mutex> lk(mu_);
  bool ok = cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                         [&] { return aborted_.load() || passed_.count(name) > 0; });
  if (aborted_) TF_THROW(Status::RemoteError, abort_message_);
  if (!ok) {
    lk.unlock();
    failed_sent_ = true;
    std::ostringstream secs;
    secs << timeout_s;
    send("BARTIMEOUT " + name + " " + secs.str());
    TF_THROW(Status::Timeout, "host barrier '" << name << "' timed out after " << timeout_s << " s");
  }
  passed_.erase(name);
}

void CoordinatorClient::fail(const std::string& message) {
  if (failed_sent_.exchange(true)) return;
  send("FAIL " + one_line(message));
}

void CoordinatorClient::finish() {
  if (finished_.exchange(true)) return;
  send("BYE");
}

void require_same_call(CoordinatorClient& c, const std::string& key, const std::string& kind, uint64_t index,
                       const std::string& what, double timeout_s) {
  const std::string k = key + "-" + std::to_string(index) + "/";
  c.set(k + std::to_string(c.rank()), what);
  std::string first;
  for (int r = 0; r < c.world(); ++r) {
    std::string theirs;
    try {
      theirs = c.get(k + std::to_string(r), timeout_s);
    } catch (const Error& e) {
      if (e.status() != Status::Timeout) throw;
      TF_THROW(Status::Timeout, kind << " #" << index << ": rank " << r << " made none within " << timeout_s
                                     << " s; rank " << c.rank() << " did " << what);
    }
    if (r == 0) first = theirs;
    TF_REQUIRE(theirs == first, Status::InvalidUsage,
               kind << " #" << index << " differs across ranks: rank 0 did " << first << ", rank " << r << " did "
                    << theirs);
  }
}

}  // namespace taxfree
