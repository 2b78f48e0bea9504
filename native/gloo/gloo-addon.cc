// kiln_gloo: Node-API glue over gloo (the library torch.distributed's CPU back end uses). Built only where
// libgloo-dev's headers exist (binding.gyp). Every call is blocking (torch's async_op=False) but isend / irecv, whose
// works end when waited for; all end by the group's timeout: a missing peer raises an Error whose code is
// KILN_DIST_TIMEOUT, any other transport failure KILN_DIST_BACKEND. Collectives use typed arrays in place and move raw
// bytes unless they reduce; point-to-point messages are copied.
#include <napi.h>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

#include "tcp-store.h"

namespace kiln::dist {
namespace {

using ms = std::chrono::milliseconds;

/** gloo's FileStore waits a fixed 30 s in get(); this bounds every read by the group's timeout instead. */
class TimedFileStore : public gloo::rendezvous::Store {
 public:
  TimedFileStore(const std::string& path, ms timeout) : inner_(path), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { inner_.set(key, data); }
  std::vector<char> get(const std::string& key) override {
    wait({key}, timeout_);
    return inner_.get(key);
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const ms& timeout) override {
    try {
      inner_.wait(keys, std::min(timeout, timeout_));
    } catch (const gloo::Exception& e) {
      throw StoreTimeout(std::string("file store: ") + e.what() + " (a rank that never joined?)");
    }
  }

 private:
  gloo::rendezvous::FileStore inner_;
  ms timeout_;
};

struct StoreHandle {
  std::unique_ptr<TcpStoreServer> server;  // rank 0 of a tcp store only
  std::shared_ptr<gloo::rendezvous::Store> store;
  TcpStoreClient* tcp = nullptr;  // the same object as store when it is a tcp store
};

/**
 * The order of a group's receives from each (src, tag). A checked receive posts its header at once and its data only
 * once the header has arrived (on its own slot), so data receives are posted in the receives' order through tickets:
 * otherwise two pending irecvs from one rank could take each other's messages.
 */
struct RecvOrder {
  std::mutex mu;
  std::condition_variable turn;
  std::map<std::pair<int, uint32_t>, std::pair<uint64_t, uint64_t>> tickets;  // (src, tag) -> (issued, data posted)
};

struct GroupHandle {
  std::shared_ptr<gloo::transport::Device> device;
  std::shared_ptr<gloo::Context> context;
  std::shared_ptr<RecvOrder> order = std::make_shared<RecvOrder>();
  ms timeout{30000};
};

[[noreturn]] void throwCoded(Napi::Env env, const std::string& code, const std::string& message) {
  Napi::Error err = Napi::Error::New(env, message);
  err.Set("code", Napi::String::New(env, code));
  throw err;
}

struct CodedFailure {
  std::string code, message;
};

/** KILN_DIST_TIMEOUT for a missing peer, KILN_DIST_BACKEND for any other failure. */
CodedFailure classify(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const StoreTimeout& e) {
    return {"KILN_DIST_TIMEOUT", e.what()};
  } catch (const gloo::IoException& e) {
    std::string what = e.what();
    bool timedOut = what.find("Timed out") != std::string::npos || what.find("timed out") != std::string::npos;
    return {timedOut ? "KILN_DIST_TIMEOUT" : "KILN_DIST_BACKEND", what};
  } catch (const std::exception& e) {
    return {"KILN_DIST_BACKEND", e.what()};
  } catch (...) {
    return {"KILN_DIST_BACKEND", "unknown failure"};
  }
}

/** Runs fn, translating C++ failures into coded JS errors. */
template <typename F>
auto guarded(Napi::Env env, F&& fn) -> decltype(fn()) {
  try {
    return fn();
  } catch (const Napi::Error&) {
    throw;
  } catch (...) {
    CodedFailure f = classify(std::current_exception());
    throwCoded(env, f.code, f.message);
  }
}

bool live(const StoreHandle* h) { return h->store != nullptr; }
bool live(const GroupHandle* h) { return h->context != nullptr; }

template <typename T>
T* unwrap(const Napi::Value& v, const char* what) {
  if (!v.IsExternal()) throw Napi::TypeError::New(v.Env(), std::string("expected a ") + what + " handle");
  T* h = v.As<Napi::External<T>>().Data();
  if (h == nullptr || !live(h)) throw Napi::Error::New(v.Env(), std::string(what) + " handle was destroyed");
  return h;
}

/** (data pointer, byte length) of any typed array, honouring its byteOffset. */
std::pair<uint8_t*, size_t> bytesOf(const Napi::Value& v) {
  if (!v.IsTypedArray()) throw Napi::TypeError::New(v.Env(), "expected a typed array");
  auto ta = v.As<Napi::TypedArray>();
  auto* base = static_cast<uint8_t*>(ta.ArrayBuffer().Data());
  return {base + ta.ByteOffset(), ta.ByteLength()};
}

// createTcpStore(host, port, isServer, timeoutMs) -> { handle, port, localAddress }
Napi::Value CreateTcpStore(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string host = info[0].As<Napi::String>();
  int port = info[1].As<Napi::Number>().Int32Value();
  bool isServer = info[2].As<Napi::Boolean>();
  ms timeout(info[3].As<Napi::Number>().Int64Value());
  auto* h = new StoreHandle();
  try {
    guarded(env, [&] {
      if (isServer) {
        h->server = std::make_unique<TcpStoreServer>(host, port);
        port = h->server->port();
      }
      auto client = std::make_shared<TcpStoreClient>(host, port, timeout);
      h->tcp = client.get();
      h->store = client;
    });
  } catch (...) {
    delete h;
    throw;
  }
  Napi::Object out = Napi::Object::New(env);
  std::string local = h->tcp->localAddress();
  out.Set("handle", Napi::External<StoreHandle>::New(env, h, [](Napi::Env, StoreHandle* p) { delete p; }));
  out.Set("port", Napi::Number::New(env, port));
  out.Set("localAddress", Napi::String::New(env, local));
  return out;
}

// createFileStore(path, timeoutMs) -> handle
Napi::Value CreateFileStore(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = info[0].As<Napi::String>();
  ms timeout(info[1].As<Napi::Number>().Int64Value());
  auto* h = new StoreHandle();
  guarded(env, [&] { h->store = std::make_shared<TimedFileStore>(path, timeout); });
  return Napi::External<StoreHandle>::New(env, h, [](Napi::Env, StoreHandle* p) { delete p; });
}

// storeSet(store, key, bytes)
Napi::Value StoreSet(const Napi::CallbackInfo& info) {
  auto* h = unwrap<StoreHandle>(info[0], "store");
  std::string key = info[1].As<Napi::String>();
  auto [p, n] = bytesOf(info[2]);
  std::vector<char> value(reinterpret_cast<char*>(p), reinterpret_cast<char*>(p) + n);
  guarded(info.Env(), [&] { h->store->set(key, value); });
  return info.Env().Undefined();
}

// storeGet(store, key) -> Uint8Array (waits for the key up to the store's timeout)
Napi::Value StoreGet(const Napi::CallbackInfo& info) {
  auto* h = unwrap<StoreHandle>(info[0], "store");
  std::string key = info[1].As<Napi::String>();
  std::vector<char> value = guarded(info.Env(), [&] { return h->store->get(key); });
  auto out = Napi::Uint8Array::New(info.Env(), value.size());
  if (!value.empty()) std::memcpy(out.Data(), value.data(), value.size());
  return out;
}

// storeAdd(store, key, delta) -> new value (tcp stores only)
Napi::Value StoreAdd(const Napi::CallbackInfo& info) {
  auto* h = unwrap<StoreHandle>(info[0], "store");
  if (h->tcp == nullptr) throw Napi::Error::New(info.Env(), "add() needs a tcp store");
  std::string key = info[1].As<Napi::String>();
  int64_t delta = info[2].As<Napi::Number>().Int64Value();
  int64_t now = guarded(info.Env(), [&] { return h->tcp->add(key, delta); });
  return Napi::Number::New(info.Env(), static_cast<double>(now));
}

// connect(store, prefix, rank, size, address (a host, or iface:<name>), timeoutMs) -> group handle (a full mesh of tcp pairs)
Napi::Value Connect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto* s = unwrap<StoreHandle>(info[0], "store");
  std::string prefix = info[1].As<Napi::String>();
  int rank = info[2].As<Napi::Number>().Int32Value();
  int size = info[3].As<Napi::Number>().Int32Value();
  std::string hostname = info[4].As<Napi::String>();
  ms timeout(info[5].As<Napi::Number>().Int64Value());
  auto* g = new GroupHandle();
  g->timeout = timeout;
  try {
    guarded(env, [&] {
      gloo::transport::tcp::attr attr;
      if (hostname.rfind("iface:", 0) == 0) attr.iface = hostname.substr(6);  // GLOO_SOCKET_IFNAME
      else attr.hostname = hostname;
      g->device = gloo::transport::tcp::CreateDevice(attr);
      auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
      ctx->setTimeout(timeout);
      gloo::rendezvous::PrefixStore store(prefix, *s->store);
      ctx->connectFullMesh(store, g->device);
      g->context = ctx;
    });
  } catch (...) {
    delete g;
    throw;
  }
  return Napi::External<GroupHandle>::New(env, g, [](Napi::Env, GroupHandle* p) { delete p; });
}

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

/** torch's BAND / BOR / BXOR: c = a op b elementwise (integer elements). */
template <typename T, typename Op>
void bitwise(void* c, const void* a, const void* b, size_t n) {
  auto* out = static_cast<T*>(c);
  const auto* x = static_cast<const T*>(a);
  const auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; i++) out[i] = Op()(x[i], y[i]);
}

template <typename T>
ReduceFn reduceFn(int op) {
  if (op >= 4 && !std::is_integral_v<T>) throw std::invalid_argument("bitwise reductions take integer elements");
  if constexpr (std::is_integral_v<T>) {
    if (op == 4) return &bitwise<T, std::bit_and<T>>;
    if (op == 5) return &bitwise<T, std::bit_or<T>>;
    if (op == 6) return &bitwise<T, std::bit_xor<T>>;
  }
  switch (op) {
    case 0: return &gloo::sum<T>;
    case 1: return &gloo::product<T>;
    case 2: return &gloo::min<T>;
    default: return &gloo::max<T>;
  }
}

template <typename T>
void allreduceTyped(GroupHandle* g, uint8_t* p, size_t bytes, int op) {
  gloo::AllreduceOptions opts(g->context);
  opts.setOutput(reinterpret_cast<T*>(p), bytes / sizeof(T));
  opts.setReduceFunction(reduceFn<T>(op));
  opts.setTimeout(g->timeout);
  gloo::allreduce(opts);
}

// allreduce(group, data, dtype (0 f32, 1 i32, 2 i64, 3 f64), op (0 sum, 1 product, 2 min, 3 max, 4 band, 5 bor,
// 6 bxor: integer dtypes only)): in place
Napi::Value Allreduce(const Napi::CallbackInfo& info) {
  auto* g = unwrap<GroupHandle>(info[0], "group");
  auto [p, n] = bytesOf(info[1]);
  int dtype = info[2].As<Napi::Number>().Int32Value();
  int op = info[3].As<Napi::Number>().Int32Value();
  if (n == 0) return info.Env().Undefined();
  guarded(info.Env(), [&] {
    switch (dtype) {
      case 0: allreduceTyped<float>(g, p, n, op); break;
      case 1: allreduceTyped<int32_t>(g, p, n, op); break;
      case 2: allreduceTyped<int64_t>(g, p, n, op); break;
      default: allreduceTyped<double>(g, p, n, op); break;
    }
  });
  return info.Env().Undefined();
}

// broadcast(group, bytes, root): in place
Napi::Value Broadcast(const Napi::CallbackInfo& info) {
  auto* g = unwrap<GroupHandle>(info[0], "group");
  auto [p, n] = bytesOf(info[1]);
  int root = info[2].As<Napi::Number>().Int32Value();
  if (n == 0) return info.Env().Undefined();
  guarded(info.Env(), [&] {
    gloo::BroadcastOptions opts(g->context);
    opts.setOutput(p, n);
    opts.setRoot(root);
    opts.setTimeout(g->timeout);
    gloo::broadcast(opts);
  });
  return info.Env().Undefined();
}

// allgather(group, inBytes, outBytes): out = rank 0's bytes, rank 1's, ... (out is size x in)
Napi::Value Allgather(const Napi::CallbackInfo& info) {
  auto* g = unwrap<GroupHandle>(info[0], "group");
  auto [in, n] = bytesOf(info[1]);
  auto [out, m] = bytesOf(info[2]);
  if (m != n * static_cast<size_t>(g->context->size))
    throw Napi::RangeError::New(info.Env(), "allgather output must be size x input bytes");
  if (n == 0) return info.Env().Undefined();
  guarded(info.Env(), [&] {
    gloo::AllgatherOptions opts(g->context);
    opts.setInput(in, n);
    opts.setOutput(out, m);
    opts.setTimeout(g->timeout);
    gloo::allgather(opts);
  });
  return info.Env().Undefined();
}

Napi::Value Barrier(const Napi::CallbackInfo& info) {
  auto* g = unwrap<GroupHandle>(info[0], "group");
  guarded(info.Env(), [&] {
    gloo::BarrierOptions opts(g->context);
    opts.setTimeout(g->timeout);
    gloo::barrier(opts);
  });
  return info.Env().Undefined();
}

// ---- isend / irecv (torch's Work); send / recv are these waited for ----

// Point-to-point slots live above every collective's slot prefix (gloo's Slot::build puts a prefix byte in the top
// bits): a message's checked header and its data travel on two slots of the tag.
uint64_t headerSlot(uint32_t tag) { return (uint64_t{0xF0} << 56) | tag; }
uint64_t dataSlot(uint32_t tag) { return (uint64_t{0xF1} << 56) | tag; }

/**
 * The shared state of one isend/irecv: posted at once on the calling thread, then waited for by its own thread so that
 * the JS thread goes on until wait(). It owns its bytes (a send's are copied in, a received message is copied out at
 * wait) and a reference to the context, so it outlives the JS buffer and destroy() of the group.
 */
struct P2pState {
  std::shared_ptr<gloo::Context> context;
  std::shared_ptr<RecvOrder> order;
  ms timeout{30000};
  int peer = 0;
  uint32_t tag = 0;
  uint64_t ticket = 0;  // a checked receive's place among the receives from (peer, tag)
  /** The consistency check's (dtype, byte length) header: sent ahead of the data, or received and compared with expected. */
  std::vector<char> header, expected;
  std::vector<char> data;
  bool matched = true;  // a recv whose header differed from expected took the message into a scratch buffer instead
  std::unique_ptr<gloo::transport::UnboundBuffer> headerBuf, dataBuf;
  std::atomic<bool> done{false};
  std::exception_ptr error;  // set before done
};

struct WorkHandle {
  std::shared_ptr<P2pState> state;
  std::thread waiter;
  ~WorkHandle() {
    if (waiter.joinable()) waiter.detach();  // a pending op ends by its timeout; the thread holds the state
  }
};

/**
 * The waiter of an irecv: with a header, the data is received (into scratch when the header is not the one expected:
 * taken off the wire so that the sender and the pair go on) once every earlier receive from (peer, tag) has posted its own.
 */
void receive(P2pState& s) {
  if (!s.header.empty()) {
    s.headerBuf->waitRecv(s.timeout);
    if (s.header != s.expected) {
      double sent[2];
      std::memcpy(sent, s.header.data(), sizeof(sent));
      s.matched = false;
      s.data.assign(static_cast<size_t>(sent[1]), 0);
    }
    RecvOrder& order = *s.order;
    std::unique_lock<std::mutex> lock(order.mu);
    auto& [issued, posted] = order.tickets[{s.peer, s.tag}];
    if (!order.turn.wait_for(lock, s.timeout, [&] { return posted == s.ticket; }))
      throw gloo::IoException("Timed out waiting for an earlier receive from rank " + std::to_string(s.peer));
    s.dataBuf = s.context->createUnboundBuffer(s.data.data(), s.data.size());
    s.dataBuf->recv(s.peer, dataSlot(s.tag));
    posted++;
    order.turn.notify_all();
  }
  s.dataBuf->waitRecv(s.timeout);
}

// isend(group, header | null, bytes, dst, tag, blocking) / irecv(group, expectedHeader | null, byteLength, src, tag,
// blocking) -> work; blocking (send / recv) waits on this thread before returning the (ended) work
Napi::Value StartP2p(const Napi::CallbackInfo& info, bool isSend) {
  Napi::Env env = info.Env();
  auto* g = unwrap<GroupHandle>(info[0], "group");
  auto s = std::make_shared<P2pState>();
  s->context = g->context;
  s->order = g->order;
  s->timeout = g->timeout;
  s->peer = info[3].As<Napi::Number>().Int32Value();
  s->tag = info[4].As<Napi::Number>().Uint32Value();
  if (!info[1].IsNull()) {
    auto [h, hn] = bytesOf(info[1]);
    (isSend ? s->header : s->expected).assign(h, h + hn);
    if (!isSend) s->header.assign(hn, 0);
  }
  if (isSend) {
    auto [p, n] = bytesOf(info[2]);
    s->data.assign(p, p + n);
  } else {
    s->data.assign(static_cast<size_t>(info[2].As<Napi::Number>().Int64Value()), 0);
  }
  auto* w = new WorkHandle();
  w->state = s;
  try {
    guarded(env, [&] {
      if (!s->header.empty()) s->headerBuf = s->context->createUnboundBuffer(s->header.data(), s->header.size());
      if (isSend) {
        s->dataBuf = s->context->createUnboundBuffer(s->data.data(), s->data.size());
        if (s->headerBuf) s->headerBuf->send(s->peer, headerSlot(s->tag));
        s->dataBuf->send(s->peer, dataSlot(s->tag));
      } else if (s->headerBuf) {
        std::lock_guard<std::mutex> lock(s->order->mu);
        s->ticket = s->order->tickets[{s->peer, s->tag}].first++;
        s->headerBuf->recv(s->peer, headerSlot(s->tag));
      } else {
        s->dataBuf = s->context->createUnboundBuffer(s->data.data(), s->data.size());
        s->dataBuf->recv(s->peer, dataSlot(s->tag));
      }
    });
  } catch (...) {
    delete w;
    throw;
  }
  auto finish = [s, isSend] {
    try {
      if (isSend) {
        if (s->headerBuf) s->headerBuf->waitSend(s->timeout);
        s->dataBuf->waitSend(s->timeout);
      } else {
        receive(*s);
      }
    } catch (...) {
      s->error = std::current_exception();
    }
    s->done = true;
  };
  if (info[5].ToBoolean()) finish();  // send / recv: waited for here, no thread
  else w->waiter = std::thread(finish);
  return Napi::External<WorkHandle>::New(env, w, [](Napi::Env, WorkHandle* p) { delete p; });
}

Napi::Value Isend(const Napi::CallbackInfo& info) { return StartP2p(info, true); }
Napi::Value Irecv(const Napi::CallbackInfo& info) { return StartP2p(info, false); }

WorkHandle* unwrapWork(const Napi::Value& v) {
  if (!v.IsExternal()) throw Napi::TypeError::New(v.Env(), "expected a work handle");
  return v.As<Napi::External<WorkHandle>>().Data();
}

// workDone(work) -> whether the op has ended (completed or failed): torch's Work.is_completed
Napi::Value WorkDone(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), unwrapWork(info[0])->state->done.load());
}

// workWait(work, out | null) -> the received header (irecv with one) or undefined. Blocks until the op ends, rethrows
// its failure; an irecv whose header matched copies the message into out.
Napi::Value WorkWait(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto* w = unwrapWork(info[0]);
  if (w->waiter.joinable()) w->waiter.join();
  P2pState& s = *w->state;
  if (s.error) {
    CodedFailure f = classify(s.error);
    throwCoded(env, f.code, f.message);
  }
  if (!info[1].IsNull() && s.matched) {
    auto [p, n] = bytesOf(info[1]);
    if (n != s.data.size()) throw Napi::RangeError::New(env, "workWait output must hold the received bytes");
    if (n > 0) std::memcpy(p, s.data.data(), n);
  }
  if (s.expected.empty()) return env.Undefined();
  auto out = Napi::Uint8Array::New(env, s.header.size());
  std::memcpy(out.Data(), s.header.data(), s.header.size());
  return out;
}

// destroy(handle): frees a group's pairs or a store (a store server stops serving) now, not at GC
Napi::Value Destroy(const Napi::CallbackInfo& info) {
  if (!info[0].IsExternal()) return info.Env().Undefined();
  // the External keeps its finalizer; emptying the object makes the later finalizer a no-op delete of an empty shell
  void* data = info[0].As<Napi::External<void>>().Data();
  bool isGroup = info[1].As<Napi::Boolean>();
  if (isGroup) {
    auto* g = static_cast<GroupHandle*>(data);
    g->context.reset();
    g->device.reset();
  } else {
    auto* s = static_cast<StoreHandle*>(data);
    s->tcp = nullptr;
    s->store.reset();
    s->server.reset();
  }
  return info.Env().Undefined();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("createTcpStore", Napi::Function::New(env, CreateTcpStore));
  exports.Set("createFileStore", Napi::Function::New(env, CreateFileStore));
  exports.Set("storeSet", Napi::Function::New(env, StoreSet));
  exports.Set("storeGet", Napi::Function::New(env, StoreGet));
  exports.Set("storeAdd", Napi::Function::New(env, StoreAdd));
  exports.Set("connect", Napi::Function::New(env, Connect));
  exports.Set("allreduce", Napi::Function::New(env, Allreduce));
  exports.Set("broadcast", Napi::Function::New(env, Broadcast));
  exports.Set("allgather", Napi::Function::New(env, Allgather));
  exports.Set("barrier", Napi::Function::New(env, Barrier));
  exports.Set("isend", Napi::Function::New(env, Isend));
  exports.Set("irecv", Napi::Function::New(env, Irecv));
  exports.Set("workDone", Napi::Function::New(env, WorkDone));
  exports.Set("workWait", Napi::Function::New(env, WorkWait));
  exports.Set("destroy", Napi::Function::New(env, Destroy));
  return exports;
}

}  // namespace
}  // namespace kiln::dist

static Napi::Object InitGloo(Napi::Env env, Napi::Object exports) { return kiln::dist::Init(env, exports); }
NODE_API_MODULE(kiln_gloo, InitGloo)
