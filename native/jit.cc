// kiln_jit: loads compiled-graph shared libraries (dlopen/dlsym) and calls their entries.
// Every entry has the one ABI `void entry(void** bufs, const int64_t* sizes)`; bufs are the data
// pointers of the JS typed arrays / ArrayBuffers passed in, sizes a BigInt64Array of loop bounds.
// Kept separate from kiln_native so the compiler never depends on the kernel addon's build.
#include <napi.h>
#include <dlfcn.h>
#include <cstdint>
#include <vector>

namespace {

typedef void (*Entry)(void** bufs, const int64_t* sizes);

std::vector<void*> g_libs;    // handles by id (never dlclosed: entries may be cached in JS or queued on the cpu stream)
std::vector<Entry> g_entries; // entries by id

// load(path) -> library id
Napi::Value Load(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = info[0].As<Napi::String>().Utf8Value();
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) throw Napi::Error::New(env, std::string("dlopen failed: ") + dlerror());
  g_libs.push_back(h);
  return Napi::Number::New(env, double(g_libs.size() - 1));
}

// entry(libId, name) -> entry id
Napi::Value Sym(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t lib = info[0].As<Napi::Number>().Uint32Value();
  std::string name = info[1].As<Napi::String>().Utf8Value();
  if (lib >= g_libs.size()) throw Napi::Error::New(env, "bad library id");
  dlerror();
  void* f = dlsym(g_libs[lib], name.c_str());
  if (!f) throw Napi::Error::New(env, "dlsym failed: " + name);
  g_entries.push_back(reinterpret_cast<Entry>(f));
  return Napi::Number::New(env, double(g_entries.size() - 1));
}

// call(entryId, bufs: (TypedArray|ArrayBuffer)[], sizes: BigInt64Array)
Napi::Value Call(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t id = info[0].As<Napi::Number>().Uint32Value();
  if (id >= g_entries.size()) throw Napi::Error::New(env, "bad entry id");
  Napi::Array arr = info[1].As<Napi::Array>();
  uint32_t n = arr.Length();
  void* stackBufs[32];
  std::vector<void*> heapBufs;
  void** bufs = stackBufs;
  if (n > 32) { heapBufs.resize(n); bufs = heapBufs.data(); }
  for (uint32_t i = 0; i < n; i++) {
    Napi::Value v = arr.Get(i);
    if (v.IsTypedArray()) {
      Napi::TypedArray ta = v.As<Napi::TypedArray>();
      bufs[i] = static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset();
    } else if (v.IsArrayBuffer()) {
      bufs[i] = v.As<Napi::ArrayBuffer>().Data();
    } else {
      throw Napi::TypeError::New(env, "call: buffers must be typed arrays or ArrayBuffers");
    }
  }
  const int64_t* sizes = nullptr;
  if (info.Length() > 2 && info[2].IsTypedArray()) {
    Napi::TypedArray ta = info[2].As<Napi::TypedArray>();
    sizes = reinterpret_cast<const int64_t*>(static_cast<uint8_t*>(ta.ArrayBuffer().Data()) + ta.ByteOffset());
  }
  g_entries[id](bufs, sizes);
  return env.Undefined();
}

// address(entryId) -> bigint: the entry's code address, for enqueueing calls on the cpu stream
// (kiln_native's streamCallFn). Valid for the process lifetime: libraries are never dlclosed.
Napi::Value Address(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  uint32_t id = info[0].As<Napi::Number>().Uint32Value();
  if (id >= g_entries.size()) throw Napi::Error::New(env, "bad entry id");
  return Napi::BigInt::New(env, static_cast<uint64_t>(reinterpret_cast<uintptr_t>(g_entries[id])));
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("load", Napi::Function::New(env, Load));
  exports.Set("entry", Napi::Function::New(env, Sym));
  exports.Set("call", Napi::Function::New(env, Call));
  exports.Set("address", Napi::Function::New(env, Address));
  return exports;
}

}  // namespace

NODE_API_MODULE(kiln_jit, Init)
