// Child process of the cross-process cache test: compiles the fixture chain and prints cache stats.
import * as k from "../../src/tensor/index.js";
import { compile, compileCacheStats } from "../../src/compile/index.js";
import { chain } from "./fixtures.js";

const f = compile((x, y) => chain(x, y));
const x = k.tensor(Float32Array.from({ length: 96 }, (_, i) => Math.sin(i)), { shape: [8, 12] });
const y = k.tensor(Float32Array.from({ length: 12 }, (_, i) => Math.cos(i)), { shape: [12] });
const out = f(x, y) as k.Tensor;
process.stdout.write(JSON.stringify({ stats: f.stats, cache: compileCacheStats(), jit: f.lastInfo?.jit, sum: out.sum().item() }) + "\n");
