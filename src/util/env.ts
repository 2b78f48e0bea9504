// Every environment variable Kiln reads, in one place (STYLE.md 15).
import { homedir } from "node:os";
import { join } from "node:path";

function str(name: string): string | undefined {
  const v = process.env[name];
  return v === undefined || v === "" ? undefined : v;
}

function int(name: string): number | undefined {
  const v = str(name);
  if (v === undefined) return undefined;
  const n = Number.parseInt(v, 10);
  if (!Number.isFinite(n)) throw new Error(`environment variable ${name}=${v} is not an integer`);
  return n;
}

export const env = {
  /** Default device name ("cpu", "reference"). */
  get device(): string | undefined {
    return str("KILN_DEVICE");
  },
  /** Eager mode for the process: strict (default), debug, defer-and-fuse. */
  get eagerMode(): string | undefined {
    return str("KILN_EAGER_MODE");
  },
  /** Native kernel threads (default: all cores). */
  get numThreads(): number | undefined {
    return int("KILN_NUM_THREADS");
  },
  /** Bytes of freed host memory the caching allocator keeps for reuse (0 disables it; default an eighth of the machine's memory). */
  get hostCacheBytes(): number | undefined {
    return int("KILN_HOST_CACHE_BYTES");
  },
  /** Compile cache directory. */
  get cacheDir(): string {
    return str("KILN_CACHE_DIR") ?? join(homedir(), ".cache", "kiln");
  },
  /** C compiler for compile()'s generated kernels (default "cc"); a missing one falls back to op-by-op. */
  get cc(): string {
    return str("KILN_CC") ?? "cc";
  },
  /** Upper bound of the on-disk compile cache in MiB (LRU clean-up above it). */
  get cacheMaxMb(): number {
    return int("KILN_CACHE_MAX_MB") ?? 1024;
  },
  /** Forces the native kernels' instruction set (avx512-bf16, avx512, avx2, scalar; read by the addon itself at load). */
  get nativeIsa(): string | undefined {
    return str("KILN_NATIVE_ISA");
  },
  /** Prints a line for every compile() recompile (guard failure or new bucket). */
  get logRecompiles(): boolean {
    return str("KILN_LOG_RECOMPILES") === "1";
  },
  /** `kiln serve` runs the engine on the server's thread (AsyncLLM) instead of a worker (WorkerEngine). */
  get engineInProcess(): boolean {
    return str("KILN_ENGINE_IN_PROCESS") === "1";
  },
  /** Read weights into fresh memory instead of memory-mapping checkpoint files (llama.cpp's --no-mmap). */
  get noMmap(): boolean {
    return str("KILN_NO_MMAP") === "1";
  },
  /** vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING: `kiln serve` serves /v1/load_lora_adapter and /v1/unload_lora_adapter. */
  get allowRuntimeLoraUpdating(): boolean {
    const v = str("VLLM_ALLOW_RUNTIME_LORA_UPDATING")?.toLowerCase();
    return v === "1" || v === "true";
  },
  /**
   * vLLM's VLLM_ALLOW_LONG_MAX_MODEL_LEN ("1" or "true"): --max-model-len may exceed the model's
   * max_position_embeddings (the rotary tables are extended; the model never saw such positions).
   */
  get allowLongMaxModelLen(): boolean {
    const v = str("VLLM_ALLOW_LONG_MAX_MODEL_LEN")?.trim().toLowerCase();
    return v === "1" || v === "true";
  },
  /**
   * vLLM's VLLM_SERVER_DEV_MODE (an integer, non-zero = on, as vLLM reads it): `kiln serve` adds the development
   * endpoints POST /reset_prefix_cache and GET /server_info.
   */
  get serverDevMode(): boolean {
    return (int("VLLM_SERVER_DEV_MODE") ?? 0) !== 0;
  },
  get apiKey(): string | undefined {
    return str("KILN_API_KEY");
  },
  get hfHome(): string {
    return str("HF_HOME") ?? join(homedir(), ".cache", "huggingface");
  },
  /**
   * torch.distributed's launcher variables (set by `kiln run`, as torchrun sets them): read by initProcessGroup's
   * env:// method and by the training recipe. Undefined outside a launched job.
   */
  get dist(): { rank?: number; worldSize?: number; localRank?: number; localWorldSize?: number; masterAddr?: string; masterPort?: number; socketIfname?: string } {
    return {
      rank: int("RANK"),
      worldSize: int("WORLD_SIZE"),
      localRank: int("LOCAL_RANK"),
      localWorldSize: int("LOCAL_WORLD_SIZE"),
      masterAddr: str("MASTER_ADDR"),
      masterPort: int("MASTER_PORT"),
      /** gloo's network interface for collectives (GLOO_SOCKET_IFNAME, as torch); default: the one that reaches MASTER_ADDR. */
      socketIfname: str("GLOO_SOCKET_IFNAME"),
    };
  },
};
