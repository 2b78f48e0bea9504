// Static memory planning: every materialized intermediate gets an offset in one arena. A value is live
// from the step that writes it to the last step that reads it (through aliases and strided reads);
// freed blocks are reused best-fit. Inputs, params and graph outputs are bound, not planned.
import { DTYPE_BYTES } from "../../backends/dtype.js";
import { numelOf, operands, type Graph, type NodeId } from "../ir.js";
import type { Schedule } from "./fusion.js";

export interface MemoryPlan {
  arenaBytes: number;
  /** Byte offset in the arena of each planned node. */
  offsets: Map<NodeId, number>;
  /** Sum of planned buffer sizes without reuse (to report the saving). */
  naiveBytes: number;
}

const ALIGN = 64;

/** The materialized node a read of `id` touches (alias base, or the input of a strided permute read). */
export function baseOf(s: Schedule, g: Graph, id: NodeId): NodeId {
  const h = s.home[id]!;
  if (typeof h === "object") return h.alias;
  const op = g.nodes[id]!.op;
  if (h === "inline" && op.kind === "permute") return baseOf(s, g, op.x);
  return id;
}

export function planMemory(g: Graph, s: Schedule, planned: (id: NodeId) => boolean): MemoryPlan {
  const lastUse = new Map<NodeId, number>();
  const defStep = new Map<NodeId, number>();
  s.steps.forEach((step, i) => {
    const root = step.kind === "fused" ? step.root : step.node;
    defStep.set(root, i);
    const members = step.kind === "fused" ? step.members : [step.node];
    for (const m of members) {
      for (const o of operands(g.nodes[m]!.op)) {
        if (s.home[o] === "inline" && g.nodes[o]!.op.kind !== "permute") continue;
        lastUse.set(baseOf(s, g, o), i);
      }
    }
  });
  for (const o of g.outputs) lastUse.set(baseOf(s, g, o), s.steps.length);
  const bytes = (id: NodeId) => Math.ceil((numelOf(g.nodes[id]!.shape) * DTYPE_BYTES[g.nodes[id]!.dtype]) / ALIGN) * ALIGN || ALIGN;
  // staged inputs (planned but defined before step 0)
  const order = [...g.nodes.filter((n) => planned(n.id)).map((n) => n.id)].sort((a, b) => (defStep.get(a) ?? -1) - (defStep.get(b) ?? -1));
  const free: { off: number; size: number }[] = [];
  const offsets = new Map<NodeId, number>();
  let top = 0;
  let naive = 0;
  const live: { id: NodeId; end: number }[] = [];
  for (const id of order) {
    const start = defStep.get(id) ?? -1;
    // release blocks whose last use is before this definition
    for (let i = live.length - 1; i >= 0; i--) {
      if (live[i]!.end < start) {
        free.push({ off: offsets.get(live[i]!.id)!, size: bytes(live[i]!.id) });
        live.splice(i, 1);
      }
    }
    const size = bytes(id);
    naive += size;
    let best = -1;
    for (let i = 0; i < free.length; i++) if (free[i]!.size >= size && (best < 0 || free[i]!.size < free[best]!.size)) best = i;
    if (best >= 0) {
      const blk = free[best]!;
      offsets.set(id, blk.off);
      if (blk.size > size) free[best] = { off: blk.off + size, size: blk.size - size };
      else free.splice(best, 1);
    } else {
      offsets.set(id, top);
      top += size;
    }
    live.push({ id, end: lastUse.get(id) ?? start });
  }
  return { arenaBytes: Math.max(top, ALIGN), offsets, naiveBytes: naive };
}
