// On-disk cache of captured step graphs (next to the compile cache, in KILN_CACHE_DIR/compile/graphs-<key>/): a warm
// `kiln serve` re-creates every bucket's graph from its recorded native calls (Backend.replayCapture) instead of
// tracing the model forward again, which cost ~0.2 s of JavaScript per start for SmolLM-135M's 12 buckets; the
// fused programs those calls run load from the compile cache by name. The key covers everything a recording
// depends on: the caller's description of the model and buckets, the addon and the compiled JS (sizes and
// mtimes), and the thread count; a replay also checks every weight buffer's size and bytes at both ends, and
// falls back to tracing when anything does not fit. Files are written under temporary names and renamed, meta.json
// (with both files' sha256) last, so a torn or corrupt entry is detected and traced again.
import { mkdirSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { CaptureRecording } from "../backends/backend.js";
import { entryDir, sha256, sweep as sweepCompileCache, touchEntry, writeAtomic } from "../compile/cache.js";

/** One bucket's recording and how to rebuild its outputs as tensors. */
export interface BucketRecording {
  kind: "decode" | "mixed";
  tokens: number;
  rows: number;
  recording: CaptureRecording;
  /** Output tensors' views over the recording's output buffers, by output name. */
  views: Record<string, { dtype: string; shape: number[]; strides: number[]; offset: number }>;
}

interface StoredBucket extends Omit<BucketRecording, "recording"> {
  meta: unknown;
  /** [byte offset, byte length] of each blob in data.bin. */
  blobs: [number, number][];
}

let codeIdentity: string | undefined;
/** Sizes and mtimes of the compiled JS and the native addons: a rebuild changes the key. */
function codeStamp(): string {
  if (codeIdentity !== undefined) return codeIdentity;
  const src = join(dirname(fileURLToPath(import.meta.url)), ".."); // dist/src
  const parts: string[] = [];
  const walk = (dir: string): void => {
    for (const e of readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const p = join(dir, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith(".js")) {
        const st = statSync(p);
        parts.push(`${p}:${st.size}:${st.mtimeMs}`);
      }
    }
  };
  walk(src);
  const release = join(src, "..", "..", "build", "Release");
  for (const f of ["kiln_native.node", "kiln_jit.node"]) {
    const st = statSync(join(release, f), { throwIfNoEntry: false });
    parts.push(`${f}:${st?.size ?? 0}:${st?.mtimeMs ?? 0}`);
  }
  codeIdentity = sha256(parts.join("\n"));
  return codeIdentity;
}

/** The cache key for recordings of the captures `identity` describes (model, buckets, back end, threads). */
export function stepGraphCacheKey(identity: unknown): string {
  return sha256(JSON.stringify({ kind: "step-graphs", v: 1, identity, code: codeStamp() }));
}

const dirOf = (key: string) => entryDir(`graphs-${key}`);

/** The recordings stored under `key`, or null (absent, torn or corrupt: the caller traces and stores again). */
export function loadStepGraphRecordings(key: string): BucketRecording[] | null {
  const dir = dirOf(key);
  try {
    const meta = JSON.parse(readFileSync(join(dir, "meta.json"), "utf8")) as { key: string; json: string; data: string };
    if (meta.key !== key) return null;
    const json = readFileSync(join(dir, "recording.json"));
    const data = readFileSync(join(dir, "data.bin"));
    if (sha256(json) !== meta.json || sha256(data) !== meta.data) return null;
    const stored = JSON.parse(json.toString("utf8")) as { buckets: StoredBucket[] };
    touchEntry(dir);
    return stored.buckets.map(({ meta: m, blobs, ...rest }) => ({
      ...rest,
      recording: { meta: m, blobs: blobs.map(([o, n]) => new Uint8Array(data.buffer, data.byteOffset + o, n)) },
    }));
  } catch {
    return null;
  }
}

/** Stores recordings under `key` (a failure to write only costs the next start its replay). */
export function saveStepGraphRecordings(key: string, recordings: BucketRecording[]): void {
  const dir = dirOf(key);
  try {
    mkdirSync(dir, { recursive: true });
    const chunks: Uint8Array[] = [];
    let at = 0;
    const buckets: StoredBucket[] = recordings.map(({ recording, ...rest }) => ({
      ...rest,
      meta: recording.meta,
      blobs: recording.blobs.map((b) => {
        chunks.push(b);
        const slot: [number, number] = [at, b.byteLength];
        at += b.byteLength;
        return slot;
      }),
    }));
    const json = Buffer.from(JSON.stringify({ buckets }));
    const data = Buffer.concat(chunks);
    writeAtomic(join(dir, "recording.json"), json);
    writeAtomic(join(dir, "data.bin"), data);
    writeAtomic(join(dir, "meta.json"), JSON.stringify({ key, json: sha256(json), data: sha256(data) }));
    sweepCompileCache(); // the cache stays within KILN_CACHE_MAX_MB when entries come from recordings too
  } catch (e) {
    process.emitWarning(`Kiln: could not store the step graphs in the compile cache: ${(e as Error).message}`, "KilnWarning");
  }
}
