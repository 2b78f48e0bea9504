/**
 * Loader and typed interface of the kiln_gloo addon (native/gloo/*.cc): gloo's collectives over a tcp transport and
 * the rendezvous stores. Built by `node-gyp rebuild` only where libgloo-dev is installed; otherwise loading throws
 * {@link GlooUnavailableError}. Every call but isend/irecv (ended by workWait) blocks the calling thread until done
 * or the group's timeout; failures are Errors whose `code` is KILN_DIST_TIMEOUT or KILN_DIST_BACKEND.
 */
import { createRequire } from "node:module";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { GlooUnavailableError } from "./errors.js";

/** An opaque native handle (a store or a connected group). */
export type NativeHandle = { readonly __native: unique symbol };

/** An isend/irecv in flight (torch's Work), waited for by its own native thread. */
export type NativeWork = { readonly __work: unique symbol };

/** Reduction codes of `allreduce` (band, bor, bxor: integer elements only); element codes: 0 f32, 1 i32, 2 i64, 3 f64. */
export const NativeReduce = { sum: 0, product: 1, min: 2, max: 3, band: 4, bor: 5, bxor: 6 } as const;
export type NativeElement = 0 | 1 | 2 | 3;

export interface GlooNative {
  /** rank 0 passes isServer (port 0: any free port, returned); every rank gets a client connection to it. */
  createTcpStore(host: string, port: number, isServer: boolean, timeoutMs: number): { handle: NativeHandle; port: number; localAddress: string };
  createFileStore(path: string, timeoutMs: number): NativeHandle;
  storeSet(store: NativeHandle, key: string, value: Uint8Array): void;
  storeGet(store: NativeHandle, key: string): Uint8Array;
  storeAdd(store: NativeHandle, key: string, delta: number): number;
  /** Full-mesh rendezvous of `size` ranks under `prefix`; `address` is this rank's IP/host, or "iface:<name>". */
  connect(store: NativeHandle, prefix: string, rank: number, size: number, address: string, timeoutMs: number): NativeHandle;
  allreduce(group: NativeHandle, data: ArrayBufferView, element: NativeElement, op: number): void;
  broadcast(group: NativeHandle, data: Uint8Array, root: number): void;
  /** out holds size x in bytes, rank order. */
  allgather(group: NativeHandle, input: Uint8Array, out: Uint8Array): void;
  barrier(group: NativeHandle): void;
  /** Posts a send of a copy of data (after header, when given) and returns at once, or when done if blocking (send). */
  isend(group: NativeHandle, header: Uint8Array | null, data: Uint8Array, dst: number, tag: number, blocking: boolean): NativeWork;
  /**
   * Posts a receive of byteLength bytes (blocking, for recv: returns when done); with expectedHeader, a message whose header differs
   * is taken into scratch. Receives from one (src, tag) take its messages in the order they were posted.
   */
  irecv(group: NativeHandle, expectedHeader: Uint8Array | null, byteLength: number, src: number, tag: number, blocking: boolean): NativeWork;
  /** Whether the op has ended (done or failed). */
  workDone(work: NativeWork): boolean;
  /** Blocks until the op ends and throws its failure; copies a received message whose header matched into out; returns the received header. */
  workWait(work: NativeWork, out: Uint8Array | null): Uint8Array | undefined;
  destroy(handle: NativeHandle, isGroup: boolean): void;
}

function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, "package.json")) && existsSync(join(dir, "binding.gyp"))) return dir;
    const parent = dirname(dir);
    if (parent === dir) return join(dirname(fileURLToPath(import.meta.url)), "..", "..", "..");
    dir = parent;
  }
}

let cached: GlooNative | undefined;

/** Loads the addon once per process; throws {@link GlooUnavailableError} when it is not built. */
export function loadGloo(): GlooNative {
  if (cached) return cached;
  const root = packageRoot();
  const path = join(root, "build", "Release", "kiln_gloo.node");
  if (!existsSync(path)) throw new GlooUnavailableError(`the kiln_gloo addon is not built (no ${path})`);
  try {
    cached = createRequire(join(root, "package.json"))(path) as GlooNative;
  } catch (err) {
    throw new GlooUnavailableError(`the kiln_gloo addon failed to load: ${err instanceof Error ? err.message : String(err)}`);
  }
  return cached;
}

/** Why the gloo back end is unavailable, or null when it loads (tests skip with this reason). */
export function glooUnavailableReason(): string | null {
  try {
    loadGloo();
    return null;
  } catch (err) {
    if (err instanceof GlooUnavailableError) return err.message;
    throw err;
  }
}
