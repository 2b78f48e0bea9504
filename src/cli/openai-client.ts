// `kiln chat --url` and `kiln complete`: vLLM's `vllm chat` / `vllm complete`, terminal clients of a running
// OpenAI-compatible server (Kiln's or any other). The model is --model-name or the server's first listed one;
// replies stream as they come. Chat keeps the conversation (the system prompt first); `--quick` sends one message
// or prompt and exits; `--stats` prints time to first token and tokens/s after each reply, as vLLM's do.
import { createInterface } from "node:readline";

export interface ClientArgs {
  /** The server's OpenAI base URL, ending in /v1 (vLLM's --url). */
  url: string;
  /** null: the first model /v1/models lists. */
  modelName: string | null;
  /** --api-key, else OPENAI_API_KEY, else none. */
  apiKey: string | null;
  /** One message (chat) or prompt (complete), then exit; null: read lines from standard input. */
  quick: string | null;
  stats: boolean;
  /** Request fields set on the command line (max_tokens, temperature, ...): the server's defaults otherwise. */
  sampling: Record<string, number>;
}

/** A server that answered with an error, or could not be reached: `kiln` prints the message and exits with 1. */
export class ClientError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "ClientError";
  }
}

/** The payloads of a server-sent event stream's `data:` lines, up to `[DONE]`. */
export async function* sseData(body: AsyncIterable<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffer = "";
  for await (const bytes of body) {
    buffer += decoder.decode(bytes, { stream: true });
    let cut: number;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, cut).trim();
      buffer = buffer.slice(cut + 2);
      if (!event.startsWith("data:")) continue;
      const data = event.slice(5).trim();
      if (data === "[DONE]") return;
      yield data;
    }
  }
}

interface Output {
  write(s: string): void;
}

class Client {
  constructor(
    private readonly args: ClientArgs,
    private readonly out: Output,
  ) {}

  private headers(): Record<string, string> {
    return { "content-type": "application/json", ...(this.args.apiKey ? { authorization: `Bearer ${this.args.apiKey}` } : {}) };
  }

  private async fetch(route: string, body?: object): Promise<Response> {
    const url = `${this.args.url.replace(/\/+$/, "")}${route}`;
    let res: Response;
    try {
      res = await fetch(url, body === undefined ? { headers: this.headers() } : { method: "POST", headers: this.headers(), body: JSON.stringify(body) });
    } catch (e) {
      const cause = (e as { cause?: { code?: string; message?: string } }).cause;
      throw new ClientError(`cannot reach ${url}: ${cause?.code ?? cause?.message ?? (e as Error).message} (is the server running? --url names it)`);
    }
    if (!res.ok) throw new ClientError(`${url} answered ${res.status}: ${errorMessage(await res.text())}`);
    return res;
  }

  async model(): Promise<string> {
    if (this.args.modelName !== null) return this.args.modelName;
    const list = (await (await this.fetch("/models")).json()) as { data?: { id?: unknown }[] };
    const id = list.data?.[0]?.id;
    if (typeof id !== "string") throw new ClientError(`${this.args.url}/models lists no model: name one with --model-name`);
    return id;
  }

  /** Streams one reply to the output; returns its text. `text` picks a chunk's text out of its first choice. */
  async stream(route: string, body: object, text: (choice: Record<string, unknown>) => unknown): Promise<string> {
    const start = performance.now();
    const res = await this.fetch(route, { ...body, ...this.args.sampling, stream: true, ...(this.args.stats ? { stream_options: { include_usage: true } } : {}) });
    let output = "";
    let ttft: number | null = null;
    let tokens = 0;
    for await (const data of sseData(res.body as unknown as AsyncIterable<Uint8Array>)) {
      const chunk = JSON.parse(data) as { choices?: Record<string, unknown>[]; usage?: { completion_tokens?: number } | null; error?: { message?: string } };
      if (chunk.error) {
        this.out.write("\n");
        throw new ClientError(`the server failed the request: ${chunk.error.message ?? JSON.stringify(chunk.error)}`);
      }
      if (chunk.usage?.completion_tokens !== undefined) tokens = chunk.usage.completion_tokens;
      const piece = chunk.choices?.[0] === undefined ? undefined : text(chunk.choices[0]);
      if (typeof piece !== "string" || piece === "") continue;
      ttft ??= performance.now() - start;
      output += piece;
      this.out.write(piece);
    }
    this.out.write("\n");
    const total = (performance.now() - start) / 1000;
    // (as vLLM: nothing when no text came back)
    if (this.args.stats && ttft !== null && total > 0)
      this.out.write(`TTFT: ${ttft.toFixed(2)} ms\nTPS:  ${(tokens / total).toFixed(2)} tokens/s (${tokens} tokens in ${total.toFixed(2)}s)\n`);
    return output;
  }
}

/** The message of an OpenAI error object (or the body as it came). */
function errorMessage(body: string): string {
  try {
    const e = (JSON.parse(body) as { error?: { message?: unknown } | string; message?: unknown }).error;
    if (typeof e === "string") return e;
    if (typeof e?.message === "string") return e.message;
  } catch {
    // not JSON
  }
  return body.trim() || "(no body)";
}

/**
 * Lines from standard input until it ends (or `/exit`); each is handed to `turn`, the prompt `> ` printed before
 * each. A turn that fails prints its error and the loop goes on (a quick one ends the command with it instead).
 */
async function eachLine(out: Output, greeting: string, turn: (line: string) => Promise<void>, reset?: () => void): Promise<void> {
  const rl = createInterface({ input: process.stdin, terminal: Boolean(process.stdin.isTTY) });
  rl.on("SIGINT", () => rl.close()); // Ctrl-C at the prompt quits, as Ctrl-D (end of input) does
  out.write(`${greeting}\n> `);
  try {
    for await (const line of rl) {
      const input = line.trim();
      if (input === "/exit" || input === "/quit") break;
      if (input === "/reset" && reset) reset();
      else if (input) {
        try {
          await turn(line); // (as typed: a completion's prompt keeps its spaces)
        } catch (e) {
          if (!(e instanceof ClientError)) throw e;
          process.stderr.write(`kiln: error: ${e.message}\n`);
        }
      }
      out.write("> ");
    }
    out.write("\n");
  } finally {
    rl.close();
  }
}

/** `kiln chat --url ...`: a conversation with the server's chat completions endpoint. */
export async function runClientChat(args: ClientArgs & { systemPrompt: string | null }, out: Output = process.stdout): Promise<void> {
  const client = new Client(args, out);
  const model = await client.model();
  out.write(`Using model: ${model}\n`);
  const system = args.systemPrompt === null ? [] : [{ role: "system", content: args.systemPrompt }];
  const conversation: { role: string; content: string }[] = [...system];
  const turn = async (message: string): Promise<void> => {
    const messages = [...conversation, { role: "user", content: message }];
    const reply = await client.stream("/chat/completions", { model, messages }, (c) => (c.delta as { content?: unknown } | undefined)?.content);
    // (a failed turn leaves the conversation as it was)
    conversation.push(messages.at(-1)!, { role: "assistant", content: reply });
  };
  if (args.quick !== null) return turn(args.quick);
  await eachLine(out, "Please enter a message for the chat model (/reset clears the conversation, /exit or Ctrl-D quits):", turn, () => {
    conversation.length = system.length;
  });
}

/** `kiln complete`: completions of each prompt from the server's completions endpoint. */
export async function runClientComplete(args: ClientArgs, out: Output = process.stdout): Promise<void> {
  const client = new Client(args, out);
  const model = await client.model();
  out.write(`Using model: ${model}\n`);
  const turn = async (prompt: string): Promise<void> => {
    await client.stream("/completions", { model, prompt }, (c) => c.text);
  };
  if (args.quick !== null) return turn(args.quick);
  await eachLine(out, "Please enter prompt to complete (/exit or Ctrl-D quits):", turn);
}
