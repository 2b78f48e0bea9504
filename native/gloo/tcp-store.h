// A TCP key-value store for gloo's rendezvous (torch's TCPStore role): rank 0 hosts a TcpStoreServer (one thread
// accepting, one per connection), every rank (0 included) talks to it through a TcpStoreClient that implements
// gloo::rendezvous::Store. Works across machines; every blocking call ends by its deadline with StoreTimeout.
#pragma once

#include <gloo/rendezvous/store.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace kiln::dist {

/** A store operation (connect, get, wait) that passed its deadline. */
struct StoreTimeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class TcpStoreServer {
 public:
  /** Listens on host:port (port 0 picks a free one, see port()); loopback hosts bind loopback only, others all
   *  interfaces (IPv6 and IPv4 on one dual-stack socket, IPv4 alone without IPv6). */
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();
  int port() const { return port_; }

 private:
  void acceptLoop();
  void serve(int fd);

  int listenFd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // guards data_, conns_
  std::condition_variable changed_;
  std::map<std::string, std::vector<char>> data_;
  std::vector<int> conns_;
  std::vector<std::thread> threads_;
  std::thread acceptThread_;
};

class TcpStoreClient : public gloo::rendezvous::Store {
 public:
  /** Connects to host:port, retrying until timeout (the server may start after this rank). */
  TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds timeout);
  ~TcpStoreClient() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  /** Atomically adds delta to the integer at key (0 when absent) and returns the new value. */
  int64_t add(const std::string& key, int64_t delta);
  /** The local IP address of the connection to the server: the address peers can reach this rank at. */
  std::string localAddress() const;

 private:
  std::vector<char> request(uint8_t cmd, const std::string& key, const std::vector<char>& value, bool* found);

  int fd_ = -1;
  std::string where_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
};

}  // namespace kiln::dist
