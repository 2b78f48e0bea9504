// The device side of LoRA serving: every adaptable projection of a model gets `maxLoras` slots (vLLM's
// --max-loras: adapters resident at once) of rank maxLoraRank, a step's tokens each name a slot (or none), and
// Linear.withLora adds scales[s] * B_s (A_s x) for it (one loraApply kernel per projection, captured in the step
// graphs like any kernel; a token without an adapter costs nothing there). Which adapter sits in which slot is the
// engine's choice (engine/lora-manager.ts); this file only writes them.
import type { AsyncWrite } from "../backends/backend.js";
import { Linear } from "../nn/index.js";
import { tensor, type Tensor } from "../tensor/index.js";
import type { CausalLM } from "./causal-lm.js";
import { LoraError, type LoraAdapter, type LoraModuleWeights } from "./lora.js";

/** Module names that take LoRA: the attention projections and the dense MLP's (Qwen2-MoE's shared expert too; not routed experts). */
const ADAPTABLE = /^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(shared_expert\.)?(gate|up|down)_proj)$/;

/** Fused modules an adapter may name (Phi-3's checkpoints', fused-weights.ts) and their parts, in row order. */
const FUSED_PARTS: Record<string, string[]> = {
  "self_attn.qkv_proj": ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"],
  "mlp.gate_up_proj": ["mlp.gate_proj", "mlp.up_proj"],
};

export class LoraSlots {
  /** The adaptable projections by module name. */
  private readonly layers = new Map<string, Linear>();
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
    const zeros = (shape: number[]): Tensor => tensor(new Float32Array(shape.reduce((a, b) => a * b, 1)), { device, shape });
    let bytes = 0;
    for (const [name, m] of model.namedModules()) {
      if (!(m instanceof Linear) || !ADAPTABLE.test(name)) continue;
      m.lora = { a: zeros([maxLoras, maxRank, m.inFeatures]), b: zeros([maxLoras, maxRank, m.outFeatures]), scales: zeros([maxLoras]) };
      bytes += 4 * (maxLoras * maxRank * (m.inFeatures + m.outFeatures) + maxLoras);
      this.layers.set(name, m);
    }
    if (this.layers.size === 0) throw new LoraError("[lora] this model has no projections that take LoRA (q/k/v/o_proj, dense gate/up/down_proj)");
    this.bytes = bytes;
  }

  /** Throws LoraError when `adapter` does not fit this model (unknown modules, other shapes, rank over the slots'). */
  check(adapter: LoraAdapter): void {
    this.fit(adapter);
  }

  /**
   * The adapter's A and B per adaptable projection, checked against the model. A fused module (Phi-3's qkv_proj,
   * gate_up_proj, which Kiln holds as its parts) gives each part the same A and its run of B's rows: B A's rows split
   * as the fused weight's are, so each part's W + scaling * B A is the fused one's rows.
   */
  private fit(adapter: LoraAdapter): Map<string, LoraModuleWeights> {
    const where = `LoRA adapter "${adapter.name}" (${adapter.path})`;
    if (adapter.rank > this.maxRank) throw new LoraError(`${where}: LoRA rank ${adapter.rank} is greater than max_lora_rank ${this.maxRank}`);
    const out = new Map<string, LoraModuleWeights>();
    const put = (name: string, w: LoraModuleWeights, layer: Linear): void => {
      if (w.inFeatures !== layer.inFeatures || w.outFeatures !== layer.outFeatures)
        throw new LoraError(`${where}: module "${name}" is [${w.outFeatures}, ${w.inFeatures}] in the adapter, [${layer.outFeatures}, ${layer.inFeatures}] in the model`);
      if (out.has(name)) throw new LoraError(`${where}: module "${name}" is adapted twice (on its own and within a fused module)`);
      out.set(name, w);
    };
    for (const [name, w] of adapter.modules) {
      const fused = Object.keys(FUSED_PARTS).find((f) => name.endsWith(`.${f}`));
      const prefix = fused === undefined ? "" : name.slice(0, name.length - fused.length);
      const parts = fused === undefined ? [name] : FUSED_PARTS[fused]!.map((p) => prefix + p);
      const layers = parts.map((p) => this.layers.get(p));
      if (layers.some((l) => l === undefined)) throw new LoraError(`${where}: the model has no adaptable module "${name}"`);
      if (fused === undefined) {
        put(name, w, layers[0]!);
        continue;
      }
      const rows = layers.reduce((n, l) => n + l!.outFeatures, 0);
      if (w.inFeatures !== layers[0]!.inFeatures || w.outFeatures !== rows)
        throw new LoraError(`${where}: module "${name}" is [${w.outFeatures}, ${w.inFeatures}] in the adapter, [${rows}, ${layers[0]!.inFeatures}] in the model`);
      let row = 0;
      parts.forEach((p, i) => {
        const n = layers[i]!.outFeatures;
        put(p, { a: w.a, b: w.b.subarray(row * adapter.rank, (row + n) * adapter.rank), inFeatures: w.inFeatures, outFeatures: n }, layers[i]!);
        row += n;
      });
    }
    return out;
  }

  /**
   * Puts `adapter` (or nothing) into `slot` of every projection. The writes are ordered on the device stream behind
   * the work already queued, so a step in flight still reads what the slot held when it was queued.
   */
  load(slot: number, adapter: LoraAdapter | null): void {
    if (!Number.isInteger(slot) || slot < 0 || slot >= this.maxLoras) throw new RangeError(`[lora] slot ${slot} outside 0..${this.maxLoras - 1}`);
    const modules = adapter === null ? null : this.fit(adapter);
    const R = this.maxRank;
    const writes: AsyncWrite[] = [];
    const put = (t: Tensor, at: number, values: Float32Array): void => {
      writes.push({ buffer: t.storage.buffer, byteOffset: (t.offset + at) * 4, src: new Uint8Array(values.buffer, values.byteOffset, values.byteLength) });
    };
    for (const [name, layer] of this.layers) {
      const lora = layer.lora!;
      const K = layer.inFeatures, N = layer.outFeatures;
      const w = modules?.get(name);
      const a = new Float32Array(R * K);
      const bt = new Float32Array(R * N);
      if (w !== undefined) {
        const r = adapter!.rank;
        a.set(w.a.subarray(0, r * K)); // A [r, K]: rows r..R-1 stay zero
        for (let n = 0; n < N; n++) for (let j = 0; j < r; j++) bt[j * N + n] = w.b[n * r + j]!; // B [N, r] -> [r, N]
      }
      put(lora.a, slot * R * K, a);
      put(lora.b, slot * R * N, bt);
      put(lora.scales, slot, Float32Array.of(w === undefined ? 0 : adapter!.scaling));
    }
    const backend = this.model.device.backend;
    if (backend.writeAsyncMany !== undefined) backend.writeAsyncMany(writes);
    else for (const w of writes) backend.write(w.buffer, w.byteOffset, w.src);
  }

  /** Frees the slots and takes them off the model's projections. */
  dispose(): void {
    for (const layer of this.layers.values()) {
      if (layer.lora === null) continue;
      for (const t of [layer.lora.a, layer.lora.b, layer.lora.scales]) t.dispose();
      layer.lora = null;
    }
    this.layers.clear();
  }
}
