// Wire format (little-endian, one request then one reply per round trip on a persistent connection):
//   request: u8 cmd | u32 keyLen | key | u32 valueLen | value
//   reply:   u8 status (0 ok, 1 missing after the wait) | u32 valueLen | value
// cmd 1 SET(value); 2 GET(value = u32 wait ms: the server blocks until the key exists or the wait ends);
// 3 ADD(value = i64 delta, reply = i64 new value, stored as its decimal text like torch's TCPStore).
#include "tcp-store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kiln::dist {
namespace {

constexpr uint8_t kSet = 1, kGet = 2, kAdd = 3;
using Clock = std::chrono::steady_clock;

std::runtime_error sysError(const std::string& what) {
  return std::runtime_error(what + ": " + std::strerror(errno));
}

// false on EOF or error (the peer went away)
bool readAll(int fd, void* p, size_t n) {
  auto* b = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::recv(fd, b, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool writeAll(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const char*>(p);
  while (n > 0) {
    ssize_t r = ::send(fd, b, n, MSG_NOSIGNAL);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool writeFrame(int fd, uint8_t head, const std::string& key, const std::vector<char>& value, bool withKey) {
  std::vector<char> buf;
  buf.push_back(static_cast<char>(head));
  auto put32 = [&](uint32_t v) { buf.insert(buf.end(), reinterpret_cast<char*>(&v), reinterpret_cast<char*>(&v) + 4); };
  if (withKey) {
    put32(static_cast<uint32_t>(key.size()));
    buf.insert(buf.end(), key.begin(), key.end());
  }
  put32(static_cast<uint32_t>(value.size()));
  buf.insert(buf.end(), value.begin(), value.end());
  return writeAll(fd, buf.data(), buf.size());
}

bool readBlob(int fd, std::vector<char>& out) {
  uint32_t n = 0;
  if (!readAll(fd, &n, 4)) return false;
  if (n > (1u << 30)) return false;  // a garbled frame, not a store value
  out.resize(n);
  return n == 0 || readAll(fd, out.data(), n);
}

bool isLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

addrinfo* resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;  // IPv4 and IPv6 (torch's TCPStore takes either)
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  std::string portStr = std::to_string(port);
  int rc = getaddrinfo(passive && !isLoopback(host) ? nullptr : host.c_str(), portStr.c_str(), &hints, &res);
  if (rc != 0) throw std::runtime_error("cannot resolve " + host + ": " + gai_strerror(rc));
  return res;
}

/** host:port, with an IPv6 host in brackets ([::1]:29500). */
std::string hostPort(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

/** A listening socket on a, or -1 (errno set). An IPv6 wildcard also takes IPv4 (dual stack, as torch's TCPStore). */
int listenOn(const addrinfo* a) {
  int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
  if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) return fd;
  int err = errno;
  ::close(fd);
  errno = err;
  return -1;
}

}  // namespace

// ---- server ----

TcpStoreServer::TcpStoreServer(const std::string& host, int port) {
  // A loopback host binds its first address that works; any other binds every interface, IPv6's first (dual stack).
  addrinfo* res = resolve(host, port, true);
  for (int family : {AF_INET6, AF_INET}) {
    for (addrinfo* a = res; a != nullptr && listenFd_ < 0; a = a->ai_next)
      if (isLoopback(host) || a->ai_family == family) listenFd_ = listenOn(a);
    if (listenFd_ >= 0) break;
  }
  freeaddrinfo(res);
  if (listenFd_ < 0) throw sysError("store server cannot listen on " + hostPort(host, port));
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(listenFd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  acceptThread_ = std::thread([this] { acceptLoop(); });
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  ::shutdown(listenFd_, SHUT_RDWR);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : conns_) ::shutdown(fd, SHUT_RDWR);  // wakes the connection threads' reads
  }
  changed_.notify_all();
  if (acceptThread_.joinable()) acceptThread_.join();
  for (auto& t : threads_) t.join();
  for (int fd : conns_) ::close(fd);
  ::close(listenFd_);
}

void TcpStoreServer::acceptLoop() {
  while (!stop_) {
    pollfd p{listenFd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;  // 100 ms: re-check stop_
    int fd = ::accept4(listenFd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      ::close(fd);
      break;
    }
    conns_.push_back(fd);
    threads_.emplace_back([this, fd] { serve(fd); });
  }
}

void TcpStoreServer::serve(int fd) {
  while (!stop_) {
    uint8_t cmd = 0;
    std::vector<char> keyBytes, value;
    if (!readAll(fd, &cmd, 1) || !readBlob(fd, keyBytes) || !readBlob(fd, value)) break;
    std::string key(keyBytes.begin(), keyBytes.end());
    std::vector<char> reply;
    uint8_t status = 0;
    std::unique_lock<std::mutex> lock(mu_);
    if (cmd == kSet) {
      data_[key] = value;
      changed_.notify_all();
    } else if (cmd == kGet && value.size() == 4) {
      uint32_t waitMs = 0;
      std::memcpy(&waitMs, value.data(), 4);
      auto deadline = Clock::now() + std::chrono::milliseconds(waitMs);
      changed_.wait_until(lock, deadline, [&] { return stop_ || data_.count(key) > 0; });
      auto it = data_.find(key);
      if (it == data_.end()) status = 1;
      else reply = it->second;
    } else if (cmd == kAdd && value.size() == 8) {
      int64_t delta = 0;
      std::memcpy(&delta, value.data(), 8);
      auto it = data_.find(key);
      int64_t now = (it == data_.end() ? 0 : std::stoll(std::string(it->second.begin(), it->second.end()))) + delta;
      std::string text = std::to_string(now);
      data_[key] = std::vector<char>(text.begin(), text.end());
      changed_.notify_all();
      reply.resize(8);
      std::memcpy(reply.data(), &now, 8);
    } else {
      break;  // unknown command: drop the connection
    }
    lock.unlock();
    if (!writeFrame(fd, status, "", reply, false)) break;
  }
  ::shutdown(fd, SHUT_RDWR);
}

// ---- client ----

TcpStoreClient::TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout)
    : where_(hostPort(host, port)), timeout_(timeout) {
  auto deadline = Clock::now() + timeout;
  auto pause = std::chrono::milliseconds(10);
  std::string lastError;
  while (true) {
    addrinfo* res = resolve(host, port, false);
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      int fd = ::socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (fd < 0) continue;
      if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        fd_ = fd;
        break;
      }
      lastError = std::strerror(errno);
      ::close(fd);
    }
    freeaddrinfo(res);
    if (fd_ >= 0) break;
    if (Clock::now() + pause > deadline)
      throw StoreTimeout("could not reach the store at " + where_ + " within " + std::to_string(timeout.count()) +
                         " ms (" + lastError + ")");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(200));  // the server may still be starting
  }
  int one = 1;
  setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::vector<char> TcpStoreClient::request(uint8_t cmd, const std::string& key, const std::vector<char>& value, bool* found) {
  std::lock_guard<std::mutex> lock(mu_);
  uint8_t status = 0;
  std::vector<char> reply;
  if (!writeFrame(fd_, cmd, key, value, true) || !readAll(fd_, &status, 1) || !readBlob(fd_, reply))
    throw std::runtime_error("lost the connection to the store at " + where_ + " (did rank 0 exit?)");
  if (found != nullptr) *found = status == 0;
  return reply;
}

void TcpStoreClient::set(const std::string& key, const std::vector<char>& data) { request(kSet, key, data, nullptr); }

std::vector<char> TcpStoreClient::get(const std::string& key) {
  uint32_t waitMs = static_cast<uint32_t>(timeout_.count());
  std::vector<char> arg(reinterpret_cast<char*>(&waitMs), reinterpret_cast<char*>(&waitMs) + 4);
  bool found = false;
  auto value = request(kGet, key, arg, &found);
  if (!found)
    throw StoreTimeout("key \"" + key + "\" did not appear in the store at " + where_ + " within " +
                       std::to_string(timeout_.count()) + " ms (a rank that never joined?)");
  return value;
}

void TcpStoreClient::wait(const std::vector<std::string>& keys) { wait(keys, timeout_); }

void TcpStoreClient::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  auto deadline = Clock::now() + std::min(timeout, timeout_);
  for (const auto& key : keys) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    uint32_t waitMs = static_cast<uint32_t>(std::max<int64_t>(0, left.count()));
    std::vector<char> arg(reinterpret_cast<char*>(&waitMs), reinterpret_cast<char*>(&waitMs) + 4);
    bool found = false;
    request(kGet, key, arg, &found);
    if (!found)
      throw StoreTimeout("key \"" + key + "\" did not appear in the store at " + where_ + " within " +
                         std::to_string(std::min(timeout, timeout_).count()) + " ms (a rank that never joined?)");
  }
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  std::vector<char> arg(reinterpret_cast<char*>(&delta), reinterpret_cast<char*>(&delta) + 8);
  auto reply = request(kAdd, key, arg, nullptr);
  int64_t now = 0;
  if (reply.size() == 8) std::memcpy(&now, reply.data(), 8);
  return now;
}

std::string TcpStoreClient::localAddress() const {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  char text[NI_MAXHOST] = {0};
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0)
    return "127.0.0.1";
  return text;  // IPv4 or IPv6 (with %scope for a link-local one): gloo's device resolves either
}

}  // namespace kiln::dist
