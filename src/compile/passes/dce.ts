// Dead-code elimination: drops nodes no output depends on. Leaves (inputs, params) always stay so that
// argument and param indices keep their meaning; so do ops with side effects (paged attention's cache writes).
import { compact, operands, SIDE_EFFECTS, type Graph } from "../ir.js";

export function eliminateDeadCode(g: Graph): Graph {
  const live = new Set<number>(g.outputs);
  for (const n of g.nodes) if (SIDE_EFFECTS.has(n.op.kind)) live.add(n.id);
  for (let i = g.nodes.length - 1; i >= 0; i--) {
    if (!live.has(i)) continue;
    for (const o of operands(g.nodes[i]!.op)) live.add(o);
  }
  return compact(g, (n) => live.has(n.id) || n.op.kind === "input" || n.op.kind === "param");
}
