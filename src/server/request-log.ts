// vLLM's request logger (--enable-log-requests, --max-log-len, --enable-log-outputs): a line when a request reaches
// the engine (its prompt, sampling params, prompt token ids and adapter) and, with outputs on, a line per choice when
// it finishes (its text, token ids and finish reason). Prompts, texts and id lists are cut to --max-log-len.
import type { LoraRequest } from "../engine/lora-manager.js";
import type { SamplingParams } from "../engine/types.js";

export interface RequestLogOptions {
  /** vLLM --max-log-len: characters of a prompt or output, and ids of a token list, kept (null: all). */
  maxLen: number | null;
  /** vLLM --enable-log-outputs: also log what each request generated. */
  outputs: boolean;
  /** vLLM --enable-log-deltas (default on): a streamed request's outputs are logged delta by delta, then whole. */
  deltas?: boolean;
  /** Where lines go (default: stdout, as vLLM's logger). */
  write?: (line: string) => void;
}

export class RequestLog {
  private readonly write: (line: string) => void;

  constructor(private readonly options: RequestLogOptions) {
    this.write = options.write ?? ((line) => process.stdout.write(`${line}\n`));
  }

  get logsOutputs(): boolean {
    return this.options.outputs;
  }

  get logsDeltas(): boolean {
    return this.options.outputs && this.options.deltas !== false;
  }

  private cut<T extends string | readonly number[]>(x: T): T {
    const n = this.options.maxLen;
    return (n === null ? x : x.slice(0, n)) as T;
  }

  received(requestId: string, prompt: string | undefined, promptTokenIds: readonly number[], params: Partial<SamplingParams>, lora: LoraRequest | null | undefined): void {
    const text = prompt === undefined ? "None" : JSON.stringify(this.cut(prompt));
    this.write(
      `INFO Received request ${requestId}: prompt: ${text}, params: ${JSON.stringify(params)}, ` +
        `prompt_token_ids: [${this.cut(promptTokenIds).join(", ")}], lora_request: ${lora ? JSON.stringify(lora.name) : "None"}.`,
    );
  }

  /**
   * One choice's output: a finished request's whole (`stream` null), or a streamed one's delta or, when it finished,
   * its whole text with finish_reason streaming_complete (as vLLM logs them).
   */
  generated(requestId: string, index: number, choices: number, text: string, tokenIds: readonly number[], finishReason: string | null, stream: "delta" | "complete" | null = null): void {
    const which = (choices > 1 ? ` (choice ${index})` : "") + (stream === null ? "" : ` (streaming ${stream})`);
    if (stream === "complete") finishReason = "streaming_complete";
    this.write(
      `INFO Generated response ${requestId}${which}: output: ${JSON.stringify(this.cut(text))}, ` +
        `output_token_ids: [${this.cut(tokenIds).join(", ")}], finish_reason: ${finishReason ?? "None"}`,
    );
  }
}
