// The C renderer: each fused step becomes a loop nest over its kernel shape; consecutive fused steps form
// one segment function `void seg_k(void** b, const int64_t* s)` so the whole run between two back-end
// kernels is one native call. Buffers are addressed by slot (b[slot]); every materialized buffer is
// dense row-major. Row ops (softmax, rms_norm, reductions) compute their per-row statistics in extra
// passes over the last dim before the output pass. Written to be vectorised by gcc -O3.
import { contiguousStrides } from "../tensor/index.js";
import { operands, type DType, type Graph, type Node, type NodeId } from "./ir.js";
import type { Schedule, Step } from "./passes/fusion.js";
import { baseOf } from "./passes/memory-plan.js";
import { isComparison, promoteTypes } from "../backends/dtype.js";

const CTYPE: Partial<Record<DType, string>> = { float32: "float", int32: "int32_t", int64: "int64_t", int8: "int8_t", uint8: "uint8_t", bool: "uint8_t" };

/** Dtypes the renderer handles; graphs with others run op by op. */
export function renderable(dtype: DType): boolean {
  return CTYPE[dtype] !== undefined;
}

const PRELUDE = `#include <stdint.h>
#include <math.h>
#include <string.h>
/* Cephes' exp (~1 ulp) as straight-line float code that gcc vectorises, unlike libm's expf: e^c for c = n ln2 + r
   (|r| <= ln2/2) is this polynomial in r times 2^n. */
static inline float k_exp_poly(float c, float n) {
  float r = c - n * 0.693359375f + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f; p = p * r + 8.3334519073e-3f; p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f; p = p * r + 5.0000001201e-1f;
  return p * r * r + r + 1.0f;
}
static inline float k_pow2i(int32_t n) { int32_t bits = (n + 127) << 23; float s; memcpy(&s, &bits, 4); return s; }
/* the hot kernels' exp (native expFast): inf above 88.38, 0 below -87.34 (not the clamp's exp, ~FLT_MIN) */
static inline float k_exp(float x) {
  float c = x > 88.3762626647949f ? 88.3762626647949f : (x < -87.3365447504f ? -87.3365447504f : x);
  float n = floorf(c * 1.44269504088896341f + 0.5f);
  float out = k_exp_poly(c, n) * k_pow2i((int32_t)n);
  return x > 88.3762626647949f ? INFINITY : (x < -87.3365447504f ? 0.0f : out);
}
/* the exp op over float32's whole range (native expFull): finite to ln(FLT_MAX), subnormal to ~-103.97; 2^n is
   applied in two halves, neither of which leaves the normal range */
static inline float k_expf(float x) {
  float c = x > 88.72283935546875f ? 88.72283935546875f : (x < -104.0f ? -104.0f : x);
  float n = floorf(c * 1.44269504088896341f + 0.5f);
  int32_t n1 = ((int32_t)n) >> 1;
  float out = (k_exp_poly(c, n) * k_pow2i(n1)) * k_pow2i((int32_t)n - n1);
  return x != x ? x : (x > 88.72283935546875f ? INFINITY : (x < -104.0f ? 0.0f : out));
}
static inline float k_tanh(float x) {
  float big = 1.0f - 2.0f / (k_exp(2.0f * x) + 1.0f);
  float x2 = x * x;
  float small = x * (1.0f + x2 * (-0.333333333f + x2 * (0.133333333f + x2 * -0.0539682540f)));
  return fabsf(x) < 0.0625f ? small : big;
}
static inline float k_sigmoid(float x) { return 1.0f / (1.0f + k_exp(-x)); }
static inline float k_gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
static inline float k_gelu_tanh(float x) { return 0.5f * x * (1.0f + k_tanh(0.79788456080286536f * (x + 0.044715f * x * x * x))); }
static inline float k_remf(float a, float b) { float r = fmodf(a, b); return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r; }
static inline int64_t k_remi(int64_t a, int64_t b) { int64_t r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r; }
/* float -> integer as torch on x86 (cvttss2si) without C's undefined behaviour: NaN and out of range give the minimum */
static inline int32_t k_f2i32(float x) { return (x >= -2147483648.0f && x < 2147483648.0f) ? (int32_t)x : INT32_MIN; }
static inline int64_t k_f2i64(float x) { return (x >= -9223372036854775808.0f && x < 9223372036854775808.0f) ? (int64_t)x : INT64_MIN; }
/* ATen's powi, wrapping modulo 2^64 (and so modulo 2^32 once narrowed): a negative exponent gives 0 but for 1 and -1 */
static inline int64_t k_powi(int64_t a, int64_t b) {
  if (b < 0) return a == 1 ? 1 : (a == -1 ? ((b & 1) ? -1 : 1) : 0);
  uint64_t r = 1, x = (uint64_t)a;
  for (uint64_t e = (uint64_t)b; e; e >>= 1) { if (e & 1) r *= x; x *= x; }
  return (int64_t)r;
}
`;

function conv(v: string, from: DType, to: DType): string {
  if (from === to) return v;
  if (to === "bool") return `(uint8_t)(${v} != 0)`;
  if (isFloat(from) && !isFloat(to)) return `(${CTYPE[to]})${to === "int64" ? "k_f2i64" : "k_f2i32"}(${v})`;
  return `(${CTYPE[to]})(${v})`;
}

/** `a op b` in int32 / int64 arithmetic that wraps (through unsigned: signed overflow is undefined in C). */
function wrapping(op: "+" | "-" | "*", a: string, b: string, t: DType): string {
  if (t !== "int32" && t !== "int64") return `${a} ${op} ${b}`; // 8-bit operands compute in int, narrowed by conv
  const u = t === "int32" ? "uint32_t" : "uint64_t";
  return `(${CTYPE[t]})((${u})${a} ${op} (${u})${b})`;
}

function isFloat(d: DType): boolean {
  return d === "float32";
}

function unaryExpr(fn: string, x: string, t: DType): string {
  if (!isFloat(t)) {
    switch (fn) {
      case "neg": return wrapping("-", "0", x, t);
      case "abs": return `(${x} < 0 ? ${wrapping("-", "0", x, t)} : ${x})`;
      case "square": return wrapping("*", x, x, t);
      case "relu": return `(${x} > 0 ? ${x} : 0)`;
      case "sign": return `((${x} > 0) - (${x} < 0))`;
      case "logical_not": return `(${x} == 0)`;
    }
  }
  switch (fn) {
    case "neg": return `-${x}`;
    case "exp": return `k_expf(${x})`;
    case "log": return `logf(${x})`;
    case "sqrt": return `sqrtf(${x})`;
    case "rsqrt": return `1.0f / sqrtf(${x})`;
    case "tanh": return `k_tanh(${x})`;
    case "sigmoid": return `k_sigmoid(${x})`;
    case "silu": return `${x} * k_sigmoid(${x})`;
    case "gelu": return `k_gelu(${x})`;
    case "gelu_tanh": return `k_gelu_tanh(${x})`;
    case "abs": return `fabsf(${x})`;
    case "reciprocal": return `1.0f / ${x}`;
    case "sin": return `sinf(${x})`;
    case "cos": return `cosf(${x})`;
    case "square": return `${x} * ${x}`;
    case "relu": return `(${x} <= 0.0f ? 0.0f : ${x})`; // NaN stays NaN, as torch
    case "floor": return `floorf(${x})`;
    case "ceil": return `ceilf(${x})`;
    case "round": return `nearbyintf(${x})`;
    case "sign": return `(float)((${x} > 0.0f) - (${x} < 0.0f))`;
    case "logical_not": return `(${x} == 0)`;
  }
  throw new Error(`no C for unary ${fn}`);
}

function binaryExpr(fn: string, a: string, b: string, t: DType): string {
  const f = isFloat(t);
  switch (fn) {
    case "add": return f ? `${a} + ${b}` : wrapping("+", a, b, t);
    case "sub": return f ? `${a} - ${b}` : wrapping("-", a, b, t);
    case "mul": return f ? `${a} * ${b}` : wrapping("*", a, b, t);
    case "div": return `${a} / ${b}`;
    case "pow": return f ? `powf(${a}, ${b})` : `(${CTYPE[t]})k_powi(${a}, ${b})`;
    // NaN propagates from either side, as torch and the eager kernels (a NaN `a` is picked by a != a)
    case "maximum": return `((${a} != ${a} || ${a} > ${b}) ? ${a} : ${b})`;
    case "minimum": return `((${a} != ${a} || ${a} < ${b}) ? ${a} : ${b})`;
    case "remainder": return f ? `k_remf(${a}, ${b})` : `(${CTYPE[t]})k_remi(${a}, ${b})`;
    case "eq": return `(${a} == ${b})`;
    case "ne": return `(${a} != ${b})`;
    case "lt": return `(${a} < ${b})`;
    case "le": return `(${a} <= ${b})`;
    case "gt": return `(${a} > ${b})`;
    case "ge": return `(${a} >= ${b})`;
    case "logical_and": return `(${a} != 0 && ${b} != 0)`;
    case "logical_or": return `(${a} != 0 || ${b} != 0)`;
  }
  throw new Error(`no C for binary ${fn}`);
}

function literal(v: number, t: DType): string {
  if (isFloat(t)) {
    if (Number.isNaN(v)) return "NAN";
    if (!Number.isFinite(v)) return v > 0 ? "INFINITY" : "-INFINITY";
    if (Object.is(v, -0)) return "-0.0f"; // toPrecision drops the sign: x / -0 is -inf
    return `${Math.fround(v).toPrecision(9)}f`;
  }
  return `(${CTYPE[t]})${Math.trunc(v)}`;
}

export interface RenderContext {
  g: Graph;
  s: Schedule;
  /** Buffer slot of a materialized node (its base). */
  slot: (base: NodeId) => number;
}

/**
 * Renders the fused steps grouped into segments; returns the C source, each segment's step indices and the
 * buffer slots each segment reads or writes: segment k's b[j] is slot `slots[k][j]` (a call passes only those).
 */
export function renderProgram(ctx: RenderContext): { source: string; segments: number[][]; slots: number[][] } {
  const segments: number[][] = [];
  let cur: number[] | null = null;
  ctx.s.steps.forEach((step, i) => {
    if (step.kind === "fused") {
      if (!cur) segments.push((cur = []));
      cur.push(i);
    } else cur = null;
  });
  const slots: number[][] = [];
  const fns = segments.map((seg, k) => {
    const local = new Map<number, number>(); // program slot -> this segment's b[] index, by first use
    const segCtx: RenderContext = {
      ...ctx,
      slot: (base) => {
        const global = ctx.slot(base);
        let j = local.get(global);
        if (j === undefined) local.set(global, (j = local.size));
        return j;
      },
    };
    const body = seg.map((i) => renderStep(segCtx, ctx.s.steps[i] as Extract<Step, { kind: "fused" }>)).join("\n");
    slots.push([...local.keys()]);
    return `void seg_${k}(void** b, const int64_t* s) {\n  (void)s;\n${body}}\n`;
  });
  return { source: PRELUDE + "\n" + fns.join("\n"), segments, slots };
}

function renderStep(ctx: RenderContext, step: Extract<Step, { kind: "fused" }>): string {
  const { g } = ctx;
  const root = g.nodes[step.root]!;
  const members = new Set(step.members);
  const K = root.op.kind === "reduce" ? g.nodes[root.op.x]!.shape : root.shape;
  const r = K.length;
  const iv = (d: number) => `i${d}`;
  const lines: string[] = [];
  let indent = "  ";
  const emit = (l: string) => lines.push(indent + l);
  let tmp = 0;

  /** Index into a materialized buffer read as logical `shape`/`strides`, broadcast into K. */
  const indexExpr = (shape: readonly number[], strides: readonly number[]) => {
    const terms: string[] = [];
    shape.forEach((dim, d) => {
      const kd = d + r - shape.length;
      if (dim !== 1 && strides[d] !== 0) terms.push(strides[d] === 1 ? iv(kd) : `${iv(kd)} * ${strides[d]}`);
    });
    return terms.length ? terms.join(" + ") : "0";
  };
  // buffer pointers hoisted into restrict locals: without them gcc reloads b[k] after every store and
  // does not vectorise
  const ptrs = new Map<string, string>();
  const ptr = (base: NodeId, dtype: DType): string => {
    const key = `${ctx.slot(base)}:${dtype}`;
    let name = ptrs.get(key);
    if (!name) {
      name = `p${ctx.slot(base)}_${CTYPE[dtype]!.replace("_t", "")}`;
      ptrs.set(key, name);
    }
    return name;
  };
  /** C expression reading leaf `id` (materialized, alias or permute accessor) at the current indices. */
  const readLeaf = (id: NodeId): string => {
    const n = g.nodes[id]!;
    if (n.op.kind === "const") return literal(n.op.value, n.dtype);
    if (n.op.kind === "permute" && (ctx.s.home[id] === "inline" || members.has(id))) {
      // a strided read of the permute's (materialized) input
      const src = g.nodes[n.op.x]!;
      const cs = contiguousStrides(src.shape);
      const strides = n.op.dims.map((d) => cs[d]!);
      return `${ptr(baseOf(ctx.s, g, n.op.x), n.dtype)}[${indexExpr(n.shape, strides)}]`;
    }
    return `${ptr(baseOf(ctx.s, g, id), n.dtype)}[${indexExpr(n.shape, contiguousStrides(n.shape))}]`;
  };

  // value of node id inside the current loop body; memo maps node -> C variable
  let memo = new Map<NodeId, string>();
  const value = (id: NodeId): string => {
    const known = memo.get(id);
    if (known) return known;
    if (!members.has(id)) return readLeaf(id);
    const n: Node = g.nodes[id]!;
    const t = n.dtype;
    const ct = CTYPE[t]!;
    const dt = (x: NodeId) => g.nodes[x]!.dtype;
    let e: string;
    switch (n.op.kind) {
      case "unary": {
        const keepInt = !isFloat(t) && n.op.fn !== "logical_not";
        e = unaryExpr(n.op.fn, conv(value(n.op.x), dt(n.op.x), keepInt ? t : n.op.fn === "logical_not" ? dt(n.op.x) : "float32"), keepInt ? t : n.op.fn === "logical_not" ? "bool" : "float32");
        e = conv(`(${e})`, n.op.fn === "logical_not" ? "bool" : keepInt ? t : "float32", t);
        break;
      }
      case "binary": {
        // comparisons compute in the operands' common dtype; arithmetic on bools (bool + bool) in int32, then
        // back to 0/1 as eager stores it (true + true is true, not 2)
        const cmp = isComparison(n.op.fn);
        const ctyp = cmp ? promoteTypes(dt(n.op.a), dt(n.op.b)) : t === "bool" ? "int32" : t;
        e = binaryExpr(n.op.fn, conv(value(n.op.a), dt(n.op.a), ctyp), conv(value(n.op.b), dt(n.op.b), ctyp), ctyp);
        if (!cmp) e = conv(`(${e})`, ctyp, t);
        break;
      }
      case "where": {
        // both operands loaded unconditionally first: gcc 12 -O3 -march=x86-64-v3 miscompiles the masked
        // loads it makes of `c[i] ? a[i] : b[i]` with a uint8 condition (wrong lanes; found by defer-and-fuse)
        const wa = `w${id}a_${tmp++}`;
        const wb = `w${id}b_${tmp++}`;
        emit(`${ct} ${wa} = ${conv(value(n.op.a), dt(n.op.a), t)};`);
        emit(`${ct} ${wb} = ${conv(value(n.op.b), dt(n.op.b), t)};`);
        e = `(${value(n.op.cond)} ? ${wa} : ${wb})`;
        break;
      }
      case "cast":
        e = conv(value(n.op.x), dt(n.op.x), t);
        break;
      case "rms_norm":
        e = `${conv(value(n.op.x), dt(n.op.x), "float32")} * r${id} * ${conv(value(n.op.weight), dt(n.op.weight), "float32")}`;
        break;
      case "softmax": {
        const x = conv(value(n.op.x), dt(n.op.x), "float32");
        e = n.op.log ? `${x} - m${id} - logf(s${id})` : `k_exp(${x} - m${id}) * inv${id}`;
        break;
      }
      case "const":
        return literal(n.op.value, t);
      case "permute":
        return readLeaf(id);
      default:
        throw new Error(`cannot render ${n.op.kind} inside a fused kernel`);
    }
    const v = `v${id}_${tmp++}`;
    emit(`${ct} ${v} = ${e};`);
    memo.set(id, v);
    return v;
  };

  const last = r - 1;
  const loop = (d: number) => {
    emit(`for (int64_t ${iv(d)} = 0; ${iv(d)} < ${K[d]}; ${iv(d)}++) {`);
    indent += "  ";
  };
  const close = () => {
    indent = indent.slice(2);
    emit("}");
  };
  const innerLoop = (bodyFn: () => void) => {
    emit("#pragma GCC ivdep");
    loop(last);
    memo = new Map();
    bodyFn();
    close();
  };

  emit(`{ /* %${root.id} ${root.op.kind} -> ${root.dtype}[${root.shape.join(",")}] */`);
  indent += "  ";
  emit(`${CTYPE[root.dtype]}* restrict out = (${CTYPE[root.dtype]}*)b[${ctx.slot(root.id)}];`);
  const declAt = lines.length;
  for (let d = 0; d < last; d++) loop(d);
  // per-row statistics of the row ops computed inside this kernel, inner ones first
  for (const m of step.members) {
    const op = g.nodes[m]!.op;
    if (m === step.root && op.kind === "reduce") continue;
    if (op.kind === "rms_norm") {
      emit(`float ss${m} = 0.0f;`);
      innerLoop(() => {
        const x = conv(value(op.x), g.nodes[op.x]!.dtype, "float32");
        emit(`ss${m} += ${x} * ${x};`);
      });
      emit(`float r${m} = 1.0f / sqrtf(ss${m} / ${K[last]} + ${literal(op.eps, "float32")});`);
    } else if (op.kind === "softmax") {
      emit(`float m${m} = -INFINITY, s${m} = 0.0f;`);
      innerLoop(() => {
        const x = conv(value(op.x), g.nodes[op.x]!.dtype, "float32");
        emit(`m${m} = ${x} > m${m} ? ${x} : m${m};`);
      });
      innerLoop(() => emit(`s${m} += k_exp(${conv(value(op.x), g.nodes[op.x]!.dtype, "float32")} - m${m});`));
      emit(`float inv${m} = 1.0f / s${m};`);
    }
  }
  const rowIndex = () => {
    const cs = contiguousStrides(K.slice(0, last));
    return K.slice(0, last).map((_, d) => `${iv(d)} * ${cs[d]}`).join(" + ") || "0";
  };
  if (root.op.kind === "reduce") {
    const rop = root.op;
    const at = isFloat(root.dtype) ? "float" : "int64_t";
    const init = rop.fn === "max" ? (at === "float" ? "-INFINITY" : "INT64_MIN") : rop.fn === "min" ? (at === "float" ? "INFINITY" : "INT64_MAX") : "0";
    emit(`${at} acc = ${init};`);
    innerLoop(() => {
      const x = conv(value(rop.x), g.nodes[rop.x]!.dtype, isFloat(root.dtype) ? "float32" : "int64");
      // a NaN is kept once met (x != x), as eager's max / min propagate it
      const nan = at === "float" ? ` || ${x} != ${x}` : "";
      if (rop.fn === "max") emit(`acc = (${x} > acc${nan}) ? ${x} : acc;`);
      else if (rop.fn === "min") emit(`acc = (${x} < acc${nan}) ? ${x} : acc;`);
      else emit(`acc += ${x};`);
    });
    emit(`out[${rowIndex()}] = (${CTYPE[root.dtype]})(acc${rop.fn === "mean" ? ` / ${K[last]}.0f` : ""});`);
  } else if (r === 0) {
    memo = new Map();
    emit(`out[0] = ${value(root.id)};`);
  } else {
    innerLoop(() => {
      const cs = contiguousStrides(K);
      emit(`out[${K.map((_, d) => `${iv(d)} * ${cs[d]}`).join(" + ")}] = ${value(root.id)};`);
    });
  }
  for (let d = 0; d < last; d++) close();
  indent = indent.slice(2);
  emit("}");
  const decls = [...ptrs].map(([key, name]) => {
    const [slot, ctype] = key.split(":") as [string, string];
    const t = CTYPE[ctype as DType]!;
    return `    const ${t}* restrict ${name} = (const ${t}*)b[${slot}];`;
  });
  lines.splice(declAt, 0, ...decls);
  return lines.join("\n") + "\n";
}

/** Operands read by a fused step from outside it (for liveness and binding). */
export function stepReads(g: Graph, step: Extract<Step, { kind: "fused" }>): NodeId[] {
  const mem = new Set(step.members);
  const out: NodeId[] = [];
  for (const m of step.members) for (const o of operands(g.nodes[m]!.op)) if (!mem.has(o)) out.push(o);
  return out;
}
