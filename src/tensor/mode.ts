// Eager execution modes (TorchTPU's): strict (default) dispatches to the device stream and returns;
// debug runs synchronously with bounds, shape and NaN/Inf checks that name the failing op;
// defer-and-fuse records ops and fuses them at the next sync point (arrives with the compiler).
import { env } from "../util/env.js";
import { KilnError } from "../util/errors.js";

export type EagerMode = "strict" | "debug" | "defer-and-fuse";
const MODES: readonly EagerMode[] = ["strict", "debug", "defer-and-fuse"];

function parse(name: string): EagerMode {
  if (!(MODES as readonly string[]).includes(name)) throw new KilnError(`unknown eager mode "${name}" (expected ${MODES.join(", ")})`);
  return name as EagerMode;
}

let current: EagerMode = parse(env.eagerMode ?? "strict");

export function eagerMode(): EagerMode {
  return current;
}

/** Sets the mode for the process. */
export function setEagerMode(mode: EagerMode): void {
  current = parse(mode);
}

/** Runs fn with the mode set for its (synchronous) extent, then restores the previous mode. */
export function withEagerMode<T>(mode: EagerMode, fn: () => T): T {
  const prev = current;
  current = parse(mode);
  try {
    return fn();
  } finally {
    current = prev;
  }
}
