// defer-and-fuse as a scope: inside withDeferAndFuse(), lazy(t) wraps a Tensor as a deferred value whose
// ops are only recorded; reading one (toTensor/dataSync/toArray/item) cuts the graph it needs, compiles
// it (fusing elementwise chains; programs cached by graph text) and runs it, and the value is rebound
// to its result so later reads reuse it. The global mode (setEagerMode("defer-and-fuse")) is defer.ts.
import { isGradEnabled, type Tensor } from "../tensor/index.js";
import { UnsupportedError } from "../util/errors.js";
import { mapOperands, serialize, operands, type Graph, type Node, type NodeId } from "./ir.js";
import { jitUnavailableReason } from "./jit.js";
import { buildProgram, type Program } from "./program.js";
import { GraphBuilder, Sym } from "./trace.js";

const programs = new Map<string, Program>();
const flushStats = { flushes: 0, programBuilds: 0 };

export function deferStats(): { flushes: number; programBuilds: number } {
  return { ...flushStats };
}

/** The subgraph `out` depends on, with its params renumbered densely (so equal work gets an equal key). */
function extract(b: GraphBuilder, out: NodeId): { graph: Graph; params: Tensor[] } {
  const need = new Set<NodeId>([out]);
  for (let i = out; i >= 0; i--) if (need.has(i)) for (const o of operands(b.nodes[i]!.op)) need.add(o);
  const ids = [...need].sort((x, y) => x - y);
  const remap = new Map<NodeId, NodeId>();
  const params: Tensor[] = [];
  const nodes: Node[] = ids.map((id, j) => {
    remap.set(id, j);
    const n = b.nodes[id]!;
    if (n.op.kind === "param") {
      params.push(b.params[n.op.index]!);
      return { ...n, id: j, op: { kind: "param", index: params.length - 1 } };
    }
    return { ...n, id: j, op: mapOperands(n.op, (x) => remap.get(x)!) };
  });
  return { graph: { nodes, outputs: [remap.get(out)!], numInputs: 0, numParams: params.length }, params };
}

function realize(b: GraphBuilder, s: Sym): Tensor {
  const node = b.nodes[s.id]!;
  if (node.op.kind === "param") return b.params[node.op.index]!;
  const { graph, params } = extract(b, s.id);
  // whether generated code can run is in the key: a program built op by op is not reused once a compiler exists
  const jitReason = jitUnavailableReason();
  const key = serialize(graph) + "\n" + params.map((p) => p.device.name).join(",") + "\n" + (jitReason === null ? "jit" : "op-by-op");
  let program = programs.get(key);
  if (!program) {
    const device = params[0]!.device;
    program = buildProgram(graph, device, jitReason, "lazy").program;
    programs.set(key, program);
    flushStats.programBuilds++;
  }
  flushStats.flushes++;
  const [out] = program.run([], params);
  b.rebind(s.id, out!);
  return out!;
}

/**
 * Runs fn with deferred execution: wrap tensors with `lazy`, use Tensor-named methods, read results with
 * toTensor()/dataSync()/item(). Results read inside the scope stay valid after it.
 * @example
 * const y = withDeferAndFuse((lazy) => lazy(x).mul(2).add(1).silu().toTensor()); // one fused kernel
 */
export function withDeferAndFuse<T>(fn: (lazy: (t: Tensor) => Sym) => T): T {
  const b = new GraphBuilder();
  b.realize = (s) => realize(b, s);
  return fn((t) => {
    // deferred values record no autograd: a gradient through them would be silently missing
    if (t.requiresGrad && isGradEnabled())
      throw new UnsupportedError("lazy", "withDeferAndFuse() records no autograd, and this tensor requires grad; wrap the scope in noGrad(), or compute it eagerly to train through it");
    return b.param(t);
  });
}
