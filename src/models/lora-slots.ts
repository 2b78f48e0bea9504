// The device side of LoRA serving: every adaptable projection of a model gets `maxLoras` slots (vLLM's
// --max-loras: adapters resident at once) of rank maxLoraRank, stacked: A of every slot as one [slots * rank, in]
// matrix, B as one [out, slots * rank]. A step's tokens each name a slot (or none) through one mask [T, slots *
// rank] holding the slot's scaling on its rank columns (mask()), and Linear.withLora adds b ((a x) * mask): two
// small products per projection that the step graphs capture like any other. Which adapter sits in which slot is
// the engine's choice (engine/lora-manager.ts); this file only writes them.
import type { AsyncWrite } from "../backends/backend.js";
import { Linear } from "../nn/index.js";
import { tensor, type Tensor } from "../tensor/index.js";
import type { CausalLM } from "./causal-lm.js";
import { LoraError, type LoraAdapter } from "./lora.js";

/** Module names that take LoRA: the attention projections and the dense (not MoE) MLP's. */
const ADAPTABLE = /^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj)$/;

export class LoraSlots {
  /** The adaptable projections by module name, with a host copy of their B (a slot's columns are rewritten in it). */
  private readonly layers = new Map<string, { linear: Linear; bHost: Float32Array }>();
  /** Each slot's scaling (0: empty). */
  private readonly scalings: number[];
  /** Device bytes the slots take. */
  readonly bytes: number;

  /**
   * Allocates zeroed slots on every adaptable projection of `model` (their `lora` field is set).
   * @example const slots = new LoraSlots(model, 4, 16); slots.load(0, readLoraAdapter("sql", dir, { maxRank: 16 }));
   */
  constructor(
    readonly model: CausalLM,
    readonly maxLoras: number,
    readonly maxRank: number,
  ) {
    if (!Number.isInteger(maxLoras) || maxLoras < 1) throw new RangeError(`[lora] max_loras must be a positive integer, got ${maxLoras}`);
    if (!Number.isInteger(maxRank) || maxRank < 1) throw new RangeError(`[lora] max_lora_rank must be a positive integer, got ${maxRank}`);
    const device = model.device;
    const SR = maxLoras * maxRank;
    let bytes = 0;
    for (const [name, m] of model.namedModules()) {
      if (!(m instanceof Linear) || !ADAPTABLE.test(name)) continue;
      const bHost = new Float32Array(m.outFeatures * SR);
      m.lora = {
        a: tensor(new Float32Array(SR * m.inFeatures), { device, shape: [SR, m.inFeatures] }),
        b: tensor(bHost, { device, shape: [m.outFeatures, SR] }),
      };
      bytes += 4 * SR * (m.inFeatures + m.outFeatures);
      this.layers.set(name, { linear: m, bHost });
    }
    if (this.layers.size === 0) throw new LoraError("[lora] this model has no projections that take LoRA (q/k/v/o_proj, dense gate/up/down_proj)");
    this.scalings = Array.from({ length: maxLoras }, () => 0);
    this.bytes = bytes;
  }

  /** Columns of the mask (Linear.withLora): slots x rank. */
  get width(): number {
    return this.maxLoras * this.maxRank;
  }

  /**
   * The step's LoRA mask [T, width] (PagedContext.loraMask) into `out` (zeroed here): token t's row holds its
   * slot's scaling on that slot's rank columns; slot -1 (or one out of range) leaves the row zero.
   */
  fillMask(slots: Int32Array, out: Float32Array): void {
    const W = this.width, R = this.maxRank;
    out.fill(0, 0, slots.length * W);
    for (let t = 0; t < slots.length; t++) {
      const s = slots[t]!;
      if (s < 0 || s >= this.maxLoras) continue;
      out.fill(this.scalings[s]!, t * W + s * R, t * W + (s + 1) * R);
    }
  }

  /** Throws LoraError when `adapter` does not fit this model (unknown modules, other shapes, rank over the slots'). */
  check(adapter: LoraAdapter): void {
    const where = `LoRA adapter "${adapter.name}" (${adapter.path})`;
    if (adapter.rank > this.maxRank) throw new LoraError(`${where}: LoRA rank ${adapter.rank} is greater than max_lora_rank ${this.maxRank}`);
    for (const [name, w] of adapter.modules) {
      const layer = this.layers.get(name)?.linear;
      if (layer === undefined) throw new LoraError(`${where}: the model has no adaptable module "${name}"`);
      if (w.inFeatures !== layer.inFeatures || w.outFeatures !== layer.outFeatures)
        throw new LoraError(`${where}: module "${name}" is [${w.outFeatures}, ${w.inFeatures}] in the adapter, [${layer.outFeatures}, ${layer.inFeatures}] in the model`);
    }
  }

  /**
   * Puts `adapter` (or nothing) into `slot` of every projection. The writes are ordered on the device stream behind
   * the work already queued, so a step in flight still reads what the slot held when it was queued.
   */
  load(slot: number, adapter: LoraAdapter | null): void {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.maxLoras) throw new RangeError(`[lora] slot ${slot} outside 0..${this.maxLoras - 1}`);
    if (adapter !== null) this.check(adapter);
    const R = this.maxRank, SR = this.width;
    const writes: AsyncWrite[] = [];
    const put = (t: Tensor, at: number, values: Float32Array): void => {
      writes.push({ buffer: t.storage.buffer, byteOffset: (t.offset + at) * 4, src: new Uint8Array(values.buffer, values.byteOffset, values.byteLength) });
    };
    for (const [name, { linear, bHost }] of this.layers) {
      const K = linear.inFeatures, N = linear.outFeatures;
      const w = adapter?.modules.get(name);
      const r = w === undefined ? 0 : adapter!.rank;
      const a = new Float32Array(R * K);
      if (w !== undefined) a.set(w.a.subarray(0, r * K)); // A [r, K]; rows r..R-1 stay zero
      for (let n = 0; n < N; n++) {
        const row = n * SR + slot * R;
        bHost.fill(0, row, row + R);
        for (let j = 0; j < r; j++) bHost[row + j] = w!.b[n * r + j]!; // B [N, r] into the slot's columns
      }
      put(linear.lora!.a, slot * R * K, a);
      put(linear.lora!.b, 0, bHost); // the whole B (the slot's columns are strided); the bytes are copied now
    }
    this.scalings[slot] = adapter === null ? 0 : adapter.scaling;
    const backend = this.model.device.backend;
    if (backend.writeAsyncMany !== undefined) backend.writeAsyncMany(writes);
    else for (const w of writes) backend.write(w.buffer, w.byteOffset, w.src);
  }

  /** Frees the slots and takes them off the model's projections. */
  dispose(): void {
    for (const { linear } of this.layers.values()) {
      if (linear.lora === null) continue;
      linear.lora.a.dispose();
      linear.lora.b.dispose();
      linear.lora = null;
    }
    this.layers.clear();
  }
}
