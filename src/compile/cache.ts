// On-disk compile cache (STYLE.md 8: a kernel is data with a cache key). One directory per key under
// <cacheDir>/compile/<key>/ holding source.c, lib-<sha>.so and meta.json (written last: its presence
// marks a complete entry). Writes go to a temp name and rename() into place, so concurrent processes
// never see partial files; the compiler runs in a private build directory on fixed relative names, so
// racing builds of one key produce byte-identical libraries under one lib-<sha>.so name; the library's sha256 is stored in meta.json and verified before loading, so
// a truncated or corrupt entry is rebuilt. The library file name carries its checksum because dlopen()
// returns an already-loaded library by name. An LRU sweep (by mtime, touched on every hit) bounds size.
import { createHash, randomBytes } from "node:crypto";
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, utimesSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { env } from "../util/env.js";
import { compileC, compilerFlags, JitLibrary, kilnVersion, probeCompiler } from "./jit.js";

export interface CacheStats {
  /** Libraries found on disk (or already loaded in this process). */
  hits: number;
  /** Libraries compiled by this process. */
  misses: number;
  /** Entries found corrupt and rebuilt. */
  corrupt: number;
  /** Milliseconds spent in the C compiler. */
  compileMs: number;
}

const stats: CacheStats = { hits: 0, misses: 0, corrupt: 0, compileMs: 0 };
const loaded = new Map<string, JitLibrary>();

export function compileCacheStats(): CacheStats {
  return { ...stats };
}

interface Meta {
  key: string;
  lib: string;
  sha256: string;
  bytes: number;
  flags: string[];
  cc: string;
  version: string;
}

export function sha256(data: string | Buffer): string {
  return createHash("sha256").update(data).digest("hex");
}

function cacheRoot(): string {
  return join(env.cacheDir, "compile");
}

/** The cache key: the program's identity (IR, shapes, dtypes, buckets) plus back end, compiler, flags and version. */
export function cacheKey(identity: string, backend: string): string {
  const cc = probeCompiler();
  return sha256(JSON.stringify({ identity, backend, cc: cc.version, flags: compilerFlags(), version: kilnVersion() }));
}

/** Writes under a temporary name and renames into place: concurrent readers never see a partial file. */
export function writeAtomic(path: string, data: string | Buffer): void {
  const tmp = `${path}.tmp-${process.pid}-${randomBytes(4).toString("hex")}`;
  writeFileSync(tmp, data);
  renameSync(tmp, path);
}

function readEntry(dir: string, key: string): Meta | null {
  let meta: Meta;
  try {
    meta = JSON.parse(readFileSync(join(dir, "meta.json"), "utf8")) as Meta;
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return null;
    stats.corrupt++;
    return null; // unreadable metadata: rebuild
  }
  try {
    if (meta.key !== key || typeof meta.lib !== "string") throw new Error("mismatch");
    const bytes = readFileSync(join(dir, meta.lib));
    if (bytes.length !== meta.bytes || sha256(bytes) !== meta.sha256) throw new Error("checksum");
    return meta;
  } catch {
    stats.corrupt++;
    return null;
  }
}

/** Marks the entry in `dir` recently used, for the LRU sweep (a racing clean-up or a read-only cache: still valid). */
export function touchEntry(dir: string): void {
  const now = new Date();
  try {
    utimesSync(join(dir, "meta.json"), now, now);
  } catch {
    /* the entry or the copy already loaded stays valid */
  }
}

/** The library stored valid under `key`, loaded (and marked recently used); null when there is none. */
function loadStored(key: string): JitLibrary | null {
  const dir = entryDir(key);
  const meta = readEntry(dir, key);
  if (!meta) return null;
  const lib = JitLibrary.load(join(dir, meta.lib)); // needs the kiln_jit addon, not the C compiler
  touchEntry(dir);
  lib.cacheKey = key;
  loaded.set(key, lib);
  stats.hits++;
  return lib;
}

/**
 * The loaded library for `source` under `key`: from this process, from disk, or compiled now.
 * `onCompile` is told when a compile happens (compile()'s recompile accounting).
 */
export function getLibrary(key: string, source: string): { lib: JitLibrary; hit: boolean } {
  const mem = loaded.get(key);
  if (mem) {
    stats.hits++;
    return { lib: mem, hit: true };
  }
  const stored = loadStored(key);
  if (stored) return { lib: stored, hit: true };
  const dir = entryDir(key);
  // Build in a private directory under fixed relative names so the library's bytes depend only on the
  // source: processes racing on one key then produce the same lib-<sha>.so and rename onto each other.
  const build = join(dir, `build-${process.pid}-${randomBytes(4).toString("hex")}`);
  mkdirSync(build, { recursive: true });
  const flags = compilerFlags();
  writeFileSync(join(build, "source.c"), source);
  const t0 = performance.now();
  let bytes: Buffer;
  let libName: string;
  try {
    try {
      compileC("source.c", "lib.so", flags, build);
    } finally {
      stats.compileMs += performance.now() - t0;
    }
    bytes = readFileSync(join(build, "lib.so"));
    libName = `lib-${sha256(bytes).slice(0, 16)}.so`;
    renameSync(join(build, "lib.so"), join(dir, libName));
    renameSync(join(build, "source.c"), join(dir, "source.c"));
  } finally {
    rmSync(build, { recursive: true, force: true });
  }
  const sum = sha256(bytes);
  const m: Meta = { key, lib: libName, sha256: sum, bytes: bytes.length, flags, cc: probeCompiler().version, version: kilnVersion() };
  writeAtomic(join(dir, "meta.json"), JSON.stringify(m, null, 1));
  stats.misses++;
  const lib = JitLibrary.load(join(dir, libName));
  lib.cacheKey = key;
  loaded.set(key, lib);
  sweep();
  return { lib, hit: false };
}

/**
 * The code address of `name` ("<cache key>#<entry>", as codeName() gives it) from a library already loaded or
 * valid on disk; null when it is neither (nothing is compiled: the caller traces and compiles instead).
 */
export function resolveCodeName(name: string): bigint | null {
  const at = name.lastIndexOf("#");
  if (at <= 0) return null;
  const key = name.slice(0, at);
  try {
    // stored libraries are marked used: replayed graphs use them as much as a trace would
    const lib = loaded.get(key) ?? loadStored(key);
    return lib ? lib.address(name.slice(at + 1)) : null;
  } catch {
    return null;
  }
}

/** Deletes least recently used entries until the cache fits in maxBytes (default KILN_CACHE_MAX_MB). */
export function sweep(maxBytes = env.cacheMaxMb * 1024 * 1024): number {
  let entries: { dir: string; bytes: number; used: number }[];
  try {
    entries = readdirSync(cacheRoot()).map((name) => {
      const dir = join(cacheRoot(), name);
      let bytes = 0;
      let used = 0;
      for (const f of readdirSync(dir)) {
        const st = statSync(join(dir, f), { throwIfNoEntry: false });
        if (!st) continue; // a racing build directory or temp file just went away
        bytes += st.size;
        if (f === "meta.json") used = st.mtimeMs;
      }
      return { dir, bytes, used };
    });
  } catch {
    return 0;
  }
  let total = entries.reduce((s, e) => s + e.bytes, 0);
  let removed = 0;
  entries.sort((a, b) => a.used - b.used);
  for (const e of entries) {
    if (total <= maxBytes) break;
    if (e.used === 0) continue; // being written by someone
    rmSync(e.dir, { recursive: true, force: true });
    total -= e.bytes;
    removed++;
  }
  return removed;
}

/** The entry directory of a key (the step-graph cache keeps its entries there too; tests corrupt entries through it). */
export function entryDir(key: string): string {
  return join(cacheRoot(), key);
}

/** Forgets libraries loaded by this process (tests: force the next lookup to go to disk). */
export function forgetLoaded(): void {
  loaded.clear();
}
