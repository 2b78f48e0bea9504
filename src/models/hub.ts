// Resolves a model id or path to local files: a local directory / .gguf file as is, else the
// Hugging Face cache (HF_HUB_CACHE, or HF_HOME/hub, default ~/.cache/huggingface/hub), else a
// download through @huggingface/hub into that cache. Offline or failed -> ModelNotFoundError.

import * as fs from "node:fs";
import * as os from "node:os";
import * as path from "node:path";

export class ModelNotFoundError extends Error {
  constructor(
    message: string,
    readonly lookedIn: string,
  ) {
    super(message);
    this.name = "ModelNotFoundError";
  }
}

export interface ResolveOptions {
  revision?: string;
  /** The hub cache directory (the one holding models--org--name). */
  cacheDir?: string;
  /** Never download (also when HF_HUB_OFFLINE=1). */
  offline?: boolean;
  token?: string;
}

export interface ResolvedModel {
  /** A directory, or a .gguf file. */
  path: string;
  kind: "dir" | "gguf";
  source: "local" | "cache" | "download";
}

/** Hub cache directory from the environment (read here only). */
export function defaultHubCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  if (env.HF_HUB_CACHE) return env.HF_HUB_CACHE;
  const home = env.HF_HOME ?? path.join(os.homedir(), ".cache", "huggingface");
  return path.join(home, "hub");
}

/** The snapshot directory the cache would hold for `repoId` at `revision` (a branch, tag or commit). */
export function cachedSnapshotDir(repoId: string, revision: string, cacheDir: string): string {
  const repoDir = path.join(cacheDir, `models--${repoId.replace(/\//g, "--")}`);
  let commit = revision;
  if (!/^[0-9a-f]{40}$/.test(revision)) {
    const ref = path.join(repoDir, "refs", revision);
    if (fs.existsSync(ref)) commit = fs.readFileSync(ref, "utf8").trim();
  }
  return path.join(repoDir, "snapshots", commit);
}

function looksLikeRepoId(s: string): boolean {
  return /^[A-Za-z0-9][\w.-]*\/[\w.-]+$/.test(s) && !s.startsWith(".");
}

function usable(dir: string): boolean {
  if (!fs.existsSync(dir)) return false;
  const names = fs.readdirSync(dir);
  return names.includes("config.json") || names.some((n) => n.endsWith(".gguf"));
}

/** Whether `m` names a GGUF model: a .gguf file, or a directory holding one (vLLM's quantization "gguf" needs one). */
export function isGgufModel(m: string): boolean {
  return m.endsWith(".gguf") || (fs.existsSync(m) && fs.statSync(m).isDirectory() && fs.readdirSync(m).some((f) => f.endsWith(".gguf")));
}

/**
 * @example
 *   const m = await resolveModel("Qwen/Qwen3-0.6B");        // from ~/.cache/huggingface/hub
 *   const g = await resolveModel("./tiny.gguf");              // local file as is
 */
export async function resolveModel(idOrPath: string, options: ResolveOptions = {}): Promise<ResolvedModel> {
  const local = fs.statSync(idOrPath, { throwIfNoEntry: false });
  if (local) {
    if (local.isDirectory()) return { path: path.resolve(idOrPath), kind: "dir", source: "local" };
    if (idOrPath.endsWith(".gguf")) return { path: path.resolve(idOrPath), kind: "gguf", source: "local" };
    throw new ModelNotFoundError(`model path ${idOrPath} is a file but not a .gguf file`, path.resolve(idOrPath));
  }
  if (!looksLikeRepoId(idOrPath)) {
    throw new ModelNotFoundError(`model ${idOrPath} not found: no such local path ${path.resolve(idOrPath)}`, path.resolve(idOrPath));
  }
  const revision = options.revision ?? "main";
  const cacheDir = options.cacheDir ?? defaultHubCacheDir();
  const snapshot = cachedSnapshotDir(idOrPath, revision, cacheDir);
  if (usable(snapshot)) return { path: snapshot, kind: "dir", source: "cache" };

  const offline = options.offline ?? (process.env.HF_HUB_OFFLINE === "1" || process.env.HF_HUB_OFFLINE === "true");
  const notCached = (why: string) =>
    new ModelNotFoundError(`model ${idOrPath} (revision ${revision}) is not cached: looked in ${snapshot}; ${why}`, snapshot);
  if (offline) throw notCached("offline mode, not downloading");
  try {
    const { snapshotDownload } = await import("@huggingface/hub");
    const token = options.token ?? process.env.HF_TOKEN;
    const dir = await snapshotDownload({ repo: { type: "model", name: idOrPath }, revision, cacheDir, ...(token ? { accessToken: token } : {}) });
    if (usable(dir)) return { path: dir, kind: "dir", source: "download" };
    throw new Error(`downloaded snapshot ${dir} has no config.json or .gguf`);
  } catch (e) {
    throw notCached(`download failed: ${(e as Error).message}`);
  }
}
