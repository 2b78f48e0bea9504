// Which LoRA adapters the engine holds and where (vLLM's LRUCacheWorkerLoRAManager): adapters named by requests
// are read once and kept in host memory (up to max_cpu_loras not in use; those of live requests stay), and each
// step puts the adapters its requests use into the model's max_loras device slots, taking the least recently
// used slot whose adapter the step does not need. The scheduler keeps a step to max_loras distinct adapters.
import { LoraError, readLoraAdapter, type LoraAdapter } from "../models/lora.js";
import type { LoraSlots } from "../models/lora-slots.js";

/** vLLM's LoRARequest: an adapter's served name, its integer id (unique per adapter) and directory. */
export interface LoraRequest {
  name: string;
  id: number;
  path: string;
}

/** vLLM's LoRA engine arguments (--max-loras, --max-lora-rank, --max-cpu-loras). */
export interface LoraConfig {
  maxLoras: number;
  maxLoraRank: number;
  /** Adapters kept in host memory while no request uses them; default maxLoras. */
  maxCpuLoras?: number | null;
}

interface HeldAdapter {
  request: LoraRequest;
  adapter: LoraAdapter;
  /** Live requests using it (they keep it in host memory). */
  refs: number;
  lastUsed: number;
}

export class LoraManager {
  private readonly held = new Map<number, HeldAdapter>();
  /** slot -> adapter id held there (null: empty), and the step that last used it. */
  private readonly slotHolder: (number | null)[];
  private readonly slotUsed: number[];
  private clock = 0;
  readonly maxCpuLoras: number;

  constructor(
    private readonly slots: LoraSlots,
    readonly config: LoraConfig,
  ) {
    this.maxCpuLoras = config.maxCpuLoras ?? config.maxLoras;
    this.slotHolder = Array.from({ length: slots.maxLoras }, () => null);
    this.slotUsed = Array.from({ length: slots.maxLoras }, () => -1);
  }

  /** Reads and checks an adapter (once per id); throws LoraError when it cannot be served. */
  add(request: LoraRequest): LoraAdapter {
    return this.hold(request, 0).adapter;
  }

  /** add(), and holds the adapter in host memory until release(). */
  acquire(request: LoraRequest): void {
    this.hold(request, 1);
  }

  /** The adapter's entry (read and checked on first use) with `refs` more references, then the host cache trimmed. */
  private hold(request: LoraRequest, refs: number): HeldAdapter {
    checkLoraRequest(request);
    let h = this.held.get(request.id);
    if (h !== undefined) {
      if (h.request.name !== request.name || h.request.path !== request.path)
        throw new LoraError(`LoRA id ${request.id} is "${h.request.name}" (${h.request.path}), not "${request.name}" (${request.path})`);
    } else {
      const adapter = readLoraAdapter(request.name, request.path, { maxRank: this.slots.maxRank });
      this.slots.check(adapter);
      h = { request: { ...request }, adapter, refs: 0, lastUsed: 0 };
      this.held.set(request.id, h);
    }
    h.lastUsed = ++this.clock;
    h.refs += refs;
    this.trim();
    return h;
  }

  release(id: number): void {
    const h = this.held.get(id);
    if (h === undefined || h.refs === 0) return;
    h.refs--;
    this.trim();
  }

  /** Drops an adapter no live request uses (vLLM's remove_lora); false when it is unknown or in use. */
  remove(id: number): boolean {
    const h = this.held.get(id);
    if (h === undefined || h.refs > 0) return false;
    this.held.delete(id);
    const slot = this.slotHolder.indexOf(id);
    if (slot >= 0) this.slotHolder[slot] = null; // its weights stay until another adapter takes the slot
    return true;
  }

  /** Ids of the adapters in host memory. */
  get heldIds(): number[] {
    return [...this.held.keys()];
  }

  /**
   * The device slot of each adapter id a step uses, loading those not resident into slots the step does not need
   * (empty ones first, then the least recently used). At most maxLoras ids (the scheduler's limit).
   */
  slotsFor(ids: ReadonlySet<number>): Map<number, number> {
    if (ids.size > this.slotHolder.length) throw new Error(`[lora] a step uses ${ids.size} adapters, max_loras is ${this.slotHolder.length}`);
    const step = ++this.clock;
    const out = new Map<number, number>();
    for (const id of ids) {
      const slot = this.slotHolder.indexOf(id);
      if (slot >= 0) out.set(id, slot);
    }
    for (const id of ids) {
      if (out.has(id)) continue;
      const h = this.held.get(id);
      if (h === undefined) throw new Error(`[lora] adapter ${id} is used by a request but was never added`);
      const taken = new Set(out.values());
      let slot = this.slotHolder.indexOf(null);
      if (slot < 0 || taken.has(slot)) {
        slot = -1;
        for (let s = 0; s < this.slotHolder.length; s++) if (!taken.has(s) && (slot < 0 || this.slotUsed[s]! < this.slotUsed[slot]!)) slot = s;
      }
      this.slots.load(slot, h.adapter);
      this.slotHolder[slot] = id;
      out.set(id, slot);
    }
    for (const [id, slot] of out) {
      this.slotUsed[slot] = step;
      const h = this.held.get(id);
      if (h !== undefined) h.lastUsed = step;
    }
    return out;
  }

  /** Drops the least recently used adapters nobody uses beyond maxCpuLoras (their slots keep their weights). */
  private trim(): void {
    while (this.held.size > this.maxCpuLoras) {
      let victim: HeldAdapter | null = null;
      for (const h of this.held.values()) if (h.refs === 0 && (victim === null || h.lastUsed < victim.lastUsed)) victim = h;
      if (victim === null) return;
      this.remove(victim.request.id);
    }
  }
}

/** Throws LoraError for a malformed LoRARequest. */
export function checkLoraRequest(r: LoraRequest): void {
  if (typeof r !== "object" || r === null) throw new LoraError("lora_request must be an object { name, id, path }");
  if (typeof r.name !== "string" || r.name === "") throw new LoraError("lora_request.name must be a non-empty string");
  if (!Number.isInteger(r.id) || r.id < 1) throw new LoraError(`lora_request.id must be an integer >= 1, got ${String(r.id)}`);
  if (typeof r.path !== "string" || r.path === "") throw new LoraError("lora_request.path must be a non-empty string");
}
