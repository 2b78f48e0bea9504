// vLLM's --quantization argument, checked without loading the model machinery (the CLI's main thread checks it
// before it starts the engine worker).
import type { QuantScheme } from "../backends/backend.js";
import { UnsupportedError } from "../util/errors.js";

/** Methods `--quantization` takes on cpu (weight-only, applied on load). */
export const QUANT_SCHEMES: readonly QuantScheme[] = ["int8", "int4", "mxfp4", "fp8"];

/** Validates --quantization: null/undefined = none; int8, int4, mxfp4 and fp8 run on cpu; other vLLM methods throw. */
export function resolveQuantization(arg: string | null | undefined): QuantScheme | null {
  if (arg === null || arg === undefined || arg === "" || arg === "none") return null;
  if ((QUANT_SCHEMES as readonly string[]).includes(arg)) return arg as QuantScheme;
  throw new UnsupportedError("load", `--quantization ${arg} is not supported on cpu (supported: ${QUANT_SCHEMES.join(", ")})`);
}
