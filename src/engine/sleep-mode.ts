// vLLM's sleep mode (--enable-sleep-mode; LLM.sleep / wake_up, POST /sleep and /wake_up): the engine stops scheduling
// and lets go of device memory without exiting. Level 0 only pauses scheduling; level 1 also discards the KV cache
// (vLLM offloads the weights to host memory: on cpu they are there already and stay); level 2 also discards the
// weights, which wake_up reads again from the checkpoint they were loaded from. What is asleep is tracked as vLLM's
// executor tracks it: the tags "weights" and "kv_cache" (both after level 1 or 2), plus "scheduling" (any level).
import { KilnError } from "../util/errors.js";
import { EngineInputError } from "./errors.js";

export const SLEEP_LEVELS = [0, 1, 2] as const;
export type SleepLevel = (typeof SLEEP_LEVELS)[number];

/**
 * vLLM's PauseMode, what happens to the requests in the engine when it falls asleep: "abort" ends them (finish reason
 * abort), "wait" refuses new ones and sleeps once the others have finished, "keep" keeps them and resumes them on
 * wake_up (after level 1 or 2 they compute their KV again, as a preempted request does).
 */
export const PAUSE_MODES = ["abort", "wait", "keep"] as const;
export type PauseMode = (typeof PAUSE_MODES)[number];

/** What wake_up can wake, by vLLM's tag names ("scheduling" is level 0's). */
export const WAKE_TAGS = ["weights", "kv_cache", "scheduling"] as const;
export type WakeTag = (typeof WAKE_TAGS)[number];
export type MemoryTag = Exclude<WakeTag, "scheduling">;

/** A generation request that reached an engine asleep (or falling asleep): the server answers 503. */
export class EngineSleepingError extends KilnError {
  override name = "EngineSleepingError";
  constructor(message = "The engine is sleeping (wake it with wakeUp(), or POST /wake_up on a server); it serves no requests until then") {
    super(`[engine] ${message}`);
  }
}

/** A level given as a string (a query parameter) or number: 0, 1 or 2; EngineInputError (level) otherwise. */
export function parseSleepLevel(value: unknown): SleepLevel {
  const n = typeof value === "string" && /^\s*[+-]?\d+\s*$/.test(value) ? Number(value) : value;
  if (!(SLEEP_LEVELS as readonly unknown[]).includes(n)) throw new EngineInputError("level", `must be 0, 1 or 2, got ${JSON.stringify(value)}`);
  return n as SleepLevel;
}

export function parsePauseMode(value: unknown): PauseMode {
  if (!(PAUSE_MODES as readonly unknown[]).includes(value))
    throw new EngineInputError("mode", `must be one of ${PAUSE_MODES.join(", ")}, got ${JSON.stringify(value)}`);
  return value as PauseMode;
}

/** Wake tags (null/undefined/empty: everything asleep), each one of WAKE_TAGS; EngineInputError (tags) otherwise. */
export function parseWakeTags(tags: readonly unknown[] | null | undefined): WakeTag[] | null {
  if (tags == null || tags.length === 0) return null;
  for (const t of tags)
    if (!(WAKE_TAGS as readonly unknown[]).includes(t)) throw new EngineInputError("tags", `each tag must be one of ${WAKE_TAGS.join(", ")}, got ${JSON.stringify(t)}`);
  return [...new Set(tags as WakeTag[])];
}

/** vLLM's vllm:engine_sleep_state labels: awake, weights_offloaded (level 1), discard_all (level 2). */
export type SleepStateLabel = "awake" | "weights_offloaded" | "discard_all";

/** The sleep state an engine reports (EngineStats.sleep). */
export interface SleepStatus {
  isSleeping: boolean;
  /** The level it fell asleep at, or null when awake. */
  level: SleepLevel | null;
  /** The memory still asleep (a partial wake_up wakes some). */
  sleepingTags: MemoryTag[];
}

/** The bookkeeping: what is asleep, and whether new requests are refused (also while a "wait" sleep drains). */
export class SleepState {
  private level: SleepLevel | null = null;
  private readonly tags = new Set<MemoryTag>();
  private paused = false;
  /** A "wait" sleep is draining: new requests are refused, the others run to their end. */
  draining = false;

  get isSleeping(): boolean {
    return this.paused || this.tags.size > 0;
  }

  /** Nothing is scheduled: asleep at any level, or partly woken. */
  get schedulingPaused(): boolean {
    return this.isSleeping;
  }

  get refusesRequests(): boolean {
    return this.isSleeping || this.draining;
  }

  has(tag: MemoryTag): boolean {
    return this.tags.has(tag);
  }

  fallAsleep(level: SleepLevel): void {
    this.level = level;
    this.paused = true;
    this.draining = false;
    if (level >= 1) for (const t of ["weights", "kv_cache"] as const) this.tags.add(t);
  }

  /** Marks tags awake; scheduling resumes once no memory is asleep. */
  wake(tags: readonly MemoryTag[]): void {
    for (const t of tags) this.tags.delete(t);
    if (this.tags.size === 0) {
      this.paused = false;
      this.level = null;
    }
  }

  status(): SleepStatus {
    return { isSleeping: this.isSleeping, level: this.isSleeping ? this.level : null, sleepingTags: [...this.tags] };
  }
}

/** vllm:engine_sleep_state's three series: awake is 0 at any level, weights_offloaded 1 at level 1, discard_all at 2. */
export function sleepStateGauge(s: SleepStatus | undefined): Record<SleepStateLabel, 0 | 1> {
  const asleep = s?.isSleeping === true;
  return { awake: asleep ? 0 : 1, weights_offloaded: asleep && s.level === 1 ? 1 : 0, discard_all: asleep && s.level === 2 ? 1 : 0 };
}
