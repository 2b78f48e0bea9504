// Value parsers shared by the `kiln serve` flag modules: commander hands every value over as a string (or a list of
// them); each parser names its flag in the CliUsageError it throws.
import { CliUsageError } from "./usage-error.js";

/** An integer >= min. */
export function int(value: unknown, flag: string, min: number): number {
  const n = Number(value);
  if (typeof value !== "string" || !/^-?\d+$/.test(value.trim()) || n < min) {
    throw new CliUsageError(`${flag} must be an integer >= ${min}, got ${JSON.stringify(value)}`);
  }
  return n;
}

/** int(), or null when the flag was not given. */
export const optInt = (value: unknown, flag: string, min: number): number | null => (value === undefined ? null : int(value, flag, min));

/**
 * vLLM's human_readable_int (--max-model-len): an integer, or a number with a suffix, k/m/g/t decimal (25.6k = 25600)
 * or K/M/G/T binary (1K = 1024, whole numbers only).
 */
export function humanInt(value: unknown, flag: string, min: number): number | null {
  if (value === undefined) return null;
  const m = typeof value === "string" ? /^(\d+(?:\.\d+)?)([kmgtKMGT])$/.exec(value.trim()) : null;
  if (!m) return int(value, flag, min);
  const [, digits, suffix] = m as unknown as [string, string, string];
  const binary = suffix === suffix.toUpperCase();
  if (binary && digits.includes(".")) throw new CliUsageError(`${flag}: decimals are not allowed with binary suffixes like ${suffix}; did you mean ${digits}${suffix.toLowerCase()}?`);
  const n = Math.floor(Number(digits) * (binary ? 1024 : 1000) ** ("kmgt".indexOf(suffix.toLowerCase()) + 1));
  if (n < min) throw new CliUsageError(`${flag} must be an integer >= ${min}, got ${JSON.stringify(value)}`);
  return n;
}

/** A finite number >= min (vLLM's float flags: --swap-space, --cpu-offload-gb). */
export function num(value: unknown, flag: string, min: number): number {
  const n = Number(value);
  if (typeof value !== "string" || value.trim() === "" || !Number.isFinite(n) || n < min)
    throw new CliUsageError(`${flag} must be a number >= ${min}, got ${JSON.stringify(value)}`);
  return n;
}

/** One of `choices` (flags declared without commander's .choices(), or values read from a --config file). */
export function oneOf<T extends string>(value: unknown, flag: string, choices: readonly T[]): T {
  if (!(choices as readonly unknown[]).includes(value)) throw new CliUsageError(`${flag} must be one of ${choices.join(", ")}, got ${JSON.stringify(value)}`);
  return value as T;
}

const SIZE_UNITS: Record<string, number> = { "": 1, k: 1e3, m: 1e6, g: 1e9, t: 1e12, kib: 2 ** 10, mib: 2 ** 20, gib: 2 ** 30, tib: 2 ** 40 };

/** A byte count: 4294967296, 4G (decimal) or 4GiB (binary). */
export function parseBytes(value: string, flag: string): number {
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$/i.exec(value);
  const unit = m ? SIZE_UNITS[m[2]!.toLowerCase().replace(/b$/, "").replace(/^(.)i$/, "$1ib")] : undefined;
  if (!m || unit === undefined) throw new CliUsageError(`${flag} must be a byte count such as 4294967296, 4G or 4GiB, got ${JSON.stringify(value)}`);
  return Math.floor(Number(m[1]) * unit);
}

/** A flag whose value is a JSON object (vLLM's --*-config flags). */
export function jsonObjectFlag(value: unknown, flag: string, example: string): Record<string, unknown> {
  let c: unknown;
  try {
    c = JSON.parse(String(value));
  } catch {
    c = undefined;
  }
  if (typeof c !== "object" || c === null || Array.isArray(c)) throw new CliUsageError(`${flag} must be a JSON object such as '${example}', got ${String(value)}`);
  return c as Record<string, unknown>;
}
