// Small deterministic generators for sampling. A seeded request owns one, advanced only by that request, so its
// tokens do not depend on what else is in the batch (vLLM's per-request torch.Generator).

/** SplitMix32 step, used to expand a seed into generator state. */
function splitmix32(state: { s: number }): number {
  state.s = (state.s + 0x9e3779b9) | 0;
  let z = state.s;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return (z ^ (z >>> 16)) >>> 0;
}

/** xoshiro128** (Blackman & Vigna): 128-bit state, 32-bit outputs, period 2^128-1. */
export class Rng {
  private a: number;
  private b: number;
  private c: number;
  private d: number;

  /** @param seed any safe integer (negative and > 2^32 seeds are folded in). */
  constructor(seed: number) {
    const lo = seed >>> 0;
    const hi = Math.floor(seed / 4294967296) >>> 0;
    const st = { s: lo ^ Math.imul(hi, 0x27d4eb2f) };
    this.a = splitmix32(st);
    this.b = splitmix32(st) ^ hi;
    this.c = splitmix32(st);
    this.d = splitmix32(st);
    if ((this.a | this.b | this.c | this.d) === 0) this.d = 1;
  }

  /** Next uniform 32-bit unsigned integer. */
  nextU32(): number {
    const r = Math.imul(rotl(Math.imul(this.b, 5), 7), 9) >>> 0;
    const t = this.b << 9;
    this.c ^= this.a;
    this.d ^= this.b;
    this.b ^= this.c;
    this.a ^= this.d;
    this.c ^= t;
    this.d = rotl(this.d, 11);
    return r;
  }

  /** Uniform double in [0, 1) with 53 random bits. */
  nextFloat(): number {
    const hi = this.nextU32() >>> 5; // 27 bits
    const lo = this.nextU32() >>> 6; // 26 bits
    return (hi * 67108864 + lo) / 9007199254740992;
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}
