# Kiln native CPU kernels (Node-API addon). The same kernel source (native/kernels-impl.inc)
# is compiled once per ISA as a static library with its own flags; native/addon.cc picks one
# at run time with __builtin_cpu_supports (override: KILN_NATIVE_ISA=avx512-bf16|avx512|avx2|scalar).
# Never -march=native: the build must run on any x86-64 machine.
# -z nodelete: a worker_threads Worker that loads the addon dlclose()s it at exit; the process-wide
# thread pool's workers (and their code) must outlive that, so the library is never unmapped.
# NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS: a Worker terminated while it calls into the addon makes every JS call fail;
# without it, the error that cannot be thrown into the dying thread escapes as a C++ exception and aborts the whole
# process (seen: Worker.terminate() during a loop of matmul calls).
{
  # kiln_gloo (src/distributed's back end) is built only where libgloo-dev's headers are installed, so
  # `npm install` still works without them; src/distributed then raises a typed error naming the package.
  "variables": {
    "kiln_have_gloo": "<!(test -f /usr/include/gloo/rendezvous/store.h && echo 1 || echo 0)"
  },
  "target_defaults": {
    "cflags_cc": ["-O3", "-std=c++17", "-fPIC", "-fno-math-errno"],
    "cflags_cc!": ["-fno-exceptions", "-O2"],
    "cflags!": ["-fno-exceptions", "-O2"],
    "include_dirs": ["<!(node -p \"require('node-addon-api').include_dir\")"],
    "defines": ["NAPI_VERSION=8", "NAPI_CPP_EXCEPTIONS", "NODE_API_SWALLOW_UNTHROWABLE_EXCEPTIONS"]
  },
  "conditions": [
    ["kiln_have_gloo==1", {
      "targets": [
        {
          "target_name": "kiln_gloo",
          "sources": ["native/gloo/gloo-addon.cc", "native/gloo/tcp-store.cc"],
          "libraries": ["-lgloo", "-lpthread"]
        }
      ]
    }],
    ["target_arch=='x64'", {
      "targets": [
        {
          "target_name": "kiln_kernels_avx512",
          "type": "static_library",
          "sources": ["native/kernels-avx512.cc", "native/quant-avx512.cc"],
          "cflags_cc": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq",
                        "-mavx512vnni", "-mfma", "-mavx2", "-mf16c", "-mprefer-vector-width=512",
                        "-mamx-tile", "-mamx-int8", "-mamx-bf16"]
        },
        {
          "target_name": "kiln_kernels_avx512_bf16",
          "type": "static_library",
          "sources": ["native/kernels-avx512-bf16.cc"],
          "cflags_cc": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512bf16",
                        "-mfma", "-mavx2", "-mf16c", "-mprefer-vector-width=512", "-mamx-tile", "-mamx-bf16"]
        },
        {
          "target_name": "kiln_kernels_avx2",
          "type": "static_library",
          "sources": ["native/kernels-avx2.cc", "native/quant-avx2.cc"],
          "cflags_cc": ["-mavx2", "-mfma", "-mf16c"]
        },
        {
          "target_name": "kiln_jit",
          "sources": ["native/jit.cc"],
          "libraries": ["-ldl"]
        },
        {
          "target_name": "kiln_native",
          "sources": ["native/addon.cc", "native/stream.cc", "native/thread-pool.cc", "native/kernels-scalar.cc", "native/quant-scalar.cc", "native/sampling.cc", "native/moe.cc"],
          "dependencies": ["kiln_kernels_avx512", "kiln_kernels_avx512_bf16", "kiln_kernels_avx2"],
          "libraries": ["-lpthread"],
          "ldflags": ["-Wl,-z,nodelete"]
        }
      ]
    }, {
      "targets": [
        {
          "target_name": "kiln_jit",
          "sources": ["native/jit.cc"],
          "libraries": ["-ldl"]
        },
        {
          "target_name": "kiln_native",
          "sources": ["native/addon.cc", "native/stream.cc", "native/thread-pool.cc", "native/kernels-scalar.cc", "native/quant-scalar.cc", "native/sampling.cc", "native/moe.cc"],
          "libraries": ["-lpthread"],
          "ldflags": ["-Wl,-z,nodelete"]
        }
      ]
    }]
  ]
}
