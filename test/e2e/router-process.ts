// A real `kiln router` child process in front of worker URLs, for end-to-end tests through the `openai` client.
import OpenAI from "openai";
import { launchKiln, type KilnProcess } from "./kiln-process.js";

export interface KilnRouter extends Omit<KilnProcess, "pid"> {
  client(): OpenAI;
}

/** Starts `bin/kiln router --worker-urls ...urls --port 0 ...extraArgs` and waits for its banner. */
export async function startRouter(urls: string[], extraArgs: string[] = []): Promise<KilnRouter> {
  const p = await launchKiln(["router", "--worker-urls", ...urls, "--port", "0", ...extraArgs], /Kiln router at (http:\/\/\S+)\/v1/, 20_000);
  return { ...p, client: () => new OpenAI({ baseURL: `${p.url}/v1`, apiKey: "unused", maxRetries: 0, timeout: 60_000 }) };
}
