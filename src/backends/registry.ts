// Back ends by name (STYLE.md 5). The tensor layer asks for a name; it never imports a concrete back end.
import type { Backend } from "./backend.js";
import { BackendUnavailableError } from "../util/errors.js";
import { ReferenceBackend } from "./reference/reference-backend.js";
import { CpuBackend } from "./cpu/cpu-backend.js";

type Loader = () => Backend;

const loaders = new Map<string, Loader>([
  ["reference", () => new ReferenceBackend()],
  ["cpu", () => new CpuBackend()],
]);
const loaded = new Map<string, Backend>();

/** Registers a back end under a name (plug-ins: webgpu, pjrt). Loaded lazily on first use. */
export function registerBackend(name: string, loader: Loader): void {
  loaders.set(name, loader);
  loaded.delete(name);
}

/** Returns the back end for a name, loading it on first use; throws BackendUnavailableError. */
export function getBackend(name: string): Backend {
  const existing = loaded.get(name);
  if (existing) return existing;
  const loader = loaders.get(name);
  if (!loader) throw new BackendUnavailableError(name, `no such back end (known: ${[...loaders.keys()].join(", ")})`);
  const backend = loader();
  loaded.set(name, backend);
  return backend;
}

export function backendNames(): string[] {
  return [...loaders.keys()];
}

/** True when the back end loads on this machine. */
export function isBackendAvailable(name: string): boolean {
  try {
    getBackend(name);
    return true;
  } catch (e) {
    // (a setting it cannot take, as a misspelled KILN_NATIVE_ISA, is the user's to fix, not a reason to fall back)
    if (e instanceof BackendUnavailableError) return false;
    throw e;
  }
}
