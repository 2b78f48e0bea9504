// Typed error for every problem found while reading or writing a weight file (safetensors, GGUF).

/** A malformed, truncated or unsupported weight file. The message names the file and, where known, the tensor. */
export class ModelFormatError extends Error {
  constructor(
    message: string,
    readonly file?: string,
    readonly tensor?: string,
  ) {
    super(message);
    this.name = "ModelFormatError";
  }
}

/** Builds a ModelFormatError whose message starts with `[format] file (tensor)`. */
export function formatError(format: string, file: string, detail: string, tensor?: string): ModelFormatError {
  const where = tensor === undefined ? file : `${file} (tensor "${tensor}")`;
  return new ModelFormatError(`[${format}] ${where}: ${detail}`, file, tensor);
}
