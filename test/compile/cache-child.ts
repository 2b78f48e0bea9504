// Child process of the cross-process cache tests: compiles the fixture chain and prints cache stats.
// KILN_TEST_START_AT (epoch ms, optional): wait until then before compiling, so sibling children race.
import * as k from "../../src/tensor/index.js";
import { compile, compileCacheStats } from "../../src/compile/index.js";
import { chain } from "./fixtures.js";

const startAt = Number(process.env.KILN_TEST_START_AT ?? 0);
while (Date.now() < startAt) {
  /* spin: both racers leave this loop within a millisecond of each other */
}
const f = compile((x, y) => chain(x, y));
const x = k.tensor(Float32Array.from({ length: 96 }, (_, i) => Math.sin(i)), { shape: [8, 12] });
const y = k.tensor(Float32Array.from({ length: 12 }, (_, i) => Math.cos(i)), { shape: [12] });
const out = f(x, y) as k.Tensor;
const values = out.toList();
process.stdout.write(JSON.stringify({ stats: f.stats, cache: compileCacheStats(), jit: f.lastInfo?.jit, sum: out.sum().item(), values }) + "\n");
