// Typed readers for JSON request fields: each names the offending param in a 400 when the value is wrong.
import { badRequest } from "./errors.js";

export type Json = Record<string, unknown>;

interface NumberRange {
  min?: number;
  max?: number;
  minExclusive?: boolean;
  int?: boolean;
}

function describeRange(r: NumberRange): string {
  const parts: string[] = [];
  if (r.min !== undefined) parts.push(`${r.minExclusive ? ">" : ">="} ${r.min}`);
  if (r.max !== undefined) parts.push(`<= ${r.max}`);
  return parts.join(" and ");
}

/** Reads an optional number (null and absent -> undefined). */
export function optNumber(body: Json, name: string, range: NumberRange = {}): number | undefined {
  const v = body[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "number" || !Number.isFinite(v)) throw badRequest(`'${name}' must be a number`, name);
  if (range.int && !Number.isInteger(v)) throw badRequest(`'${name}' must be an integer`, name);
  const low = range.min !== undefined && (range.minExclusive ? v <= range.min : v < range.min);
  const high = range.max !== undefined && v > range.max;
  if (low || high) throw badRequest(`'${name}' must be ${describeRange(range)}, got ${v}`, name);
  return v;
}

export function optInt(body: Json, name: string, range: Omit<NumberRange, "int"> = {}): number | undefined {
  return optNumber(body, name, { ...range, int: true });
}

export function optBool(body: Json, name: string): boolean | undefined {
  const v = body[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw badRequest(`'${name}' must be a boolean`, name);
  return v;
}

export function optString(body: Json, name: string, { nonEmpty = false } = {}): string | undefined {
  const v = body[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw badRequest(`'${name}' must be a string`, name);
  if (nonEmpty && v.length === 0) throw badRequest(`'${name}' must not be empty`, name);
  return v;
}

export function optObject(body: Json, name: string): Json | undefined {
  const v = body[name];
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "object" || Array.isArray(v)) throw badRequest(`'${name}' must be an object`, name);
  return v as Json;
}

export function optIntArray(body: Json, name: string): number[] | undefined {
  const v = body[name];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || !v.every((x) => Number.isInteger(x))) throw badRequest(`'${name}' must be a list of integers`, name);
  return v as number[];
}

export function optStringArray(body: Json, name: string): string[] | undefined {
  const v = body[name];
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v) || !v.every((x) => typeof x === "string")) throw badRequest(`'${name}' must be a list of strings`, name);
  return v as string[];
}

/** `stop`: a string or a list of strings. */
export function optStop(body: Json): string[] | undefined {
  const v = body.stop;
  if (v === undefined || v === null) return undefined;
  const stops = typeof v === "string" ? [v] : Array.isArray(v) && v.every((x) => typeof x === "string") ? (v as string[]) : null;
  if (stops === null) throw badRequest("'stop' must be a string or a list of strings", "stop");
  if (stops.some((s) => s.length === 0)) throw badRequest("stop cannot contain an empty string", "stop"); // as vLLM
  return stops;
}

/** `logit_bias`: {"token id": bias in [-100, 100]}. */
export function optLogitBias(body: Json, vocabSize: number): Record<number, number> | undefined {
  const obj = optObject(body, "logit_bias");
  if (!obj) return undefined;
  const out: Record<number, number> = {};
  for (const [key, value] of Object.entries(obj)) {
    // an integer's decimal digits, as Python's int() reads them (Number() reads "" and " " as 0, "0x10" as 16)
    const id = /^\s*[+-]?\d+\s*$/.test(key) ? Number(key) : NaN;
    if (!Number.isInteger(id) || id < 0 || id >= vocabSize) throw badRequest(`'logit_bias' has an invalid token id ${JSON.stringify(key)}`, "logit_bias");
    if (typeof value !== "number" || !Number.isFinite(value) || value < -100 || value > 100) {
      throw badRequest(`'logit_bias' values must be numbers in [-100, 100]`, "logit_bias");
    }
    out[id] = value;
  }
  return out;
}

/** `vllm_xargs` (vLLM's extra_args for custom logits processors): {key: string | number | boolean | list of those}. */
export function optExtraArgs(body: Json, name: string): Record<string, string | number | boolean | (string | number | boolean)[]> | undefined {
  const obj = optObject(body, name);
  if (!obj) return undefined;
  const scalar = (x: unknown): x is string | number | boolean =>
    typeof x === "string" || typeof x === "boolean" || (typeof x === "number" && Number.isFinite(x));
  for (const [key, value] of Object.entries(obj)) {
    if (!scalar(value) && !(Array.isArray(value) && value.every(scalar))) {
      throw badRequest(`'${name}.${key}' must be a string, number, boolean or a list of them`, name);
    }
  }
  return obj as Record<string, string | number | boolean | (string | number | boolean)[]>;
}
