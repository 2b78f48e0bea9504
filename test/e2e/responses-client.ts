// The official `openai` client's view of a `kiln serve` for the Responses API e2e tests: whole responses, streamed
// event lists, the chat completions endpoint and /tokenize counts to check them against, and shared fixtures.
import assert from "node:assert/strict";
import type OpenAI from "openai";
import { postRaw, type KilnServer } from "./kiln-process.js";

export type Body = Record<string, unknown>;
type Response = OpenAI.Responses.Response;
export type Event = OpenAI.Responses.ResponseStreamEvent;
export const USER = "Tell me a story about the river.";
// renders tool calls and tool results (the tiny model's ChatML template drops them), so that prompts show them
export const TOOL_TEMPLATE =
  "{% for m in messages %}{{ m.role }}: {{ m.content or '' }}{% for c in m.tool_calls or [] %} [call {{ c.id }} " +
  "{{ c.function.name }} {{ c.function.arguments | tojson }}]{% endfor %}{% if m.tool_call_id %} [result of {{ m.tool_call_id }}]{% endif %}\n" +
  "{% endfor %}assistant:";
export const WEATHER = {
  type: "object",
  properties: {
    city: { type: "string", enum: ["Paris", "Oslo"] },
    unit: { type: "string", enum: ["C", "F"] },
    days: { type: "integer", enum: [1, 2, 3] },
  },
  required: ["city", "unit", "days"],
};
export const checkWeather = (args: unknown): void => {
  const a = args as Record<string, unknown>;
  assert.deepEqual(Object.keys(a), ["city", "unit", "days"]);
  assert.ok(["Paris", "Oslo"].includes(a.city as string) && ["C", "F"].includes(a.unit as string) && [1, 2, 3].includes(a.days as number));
};

/** The client for `server`: whole responses, event lists of streamed ones, chat completions, /tokenize counts. */
export function api(server: KilnServer) {
  const client = server.client();
  const model = server.model;
  return {
    create: (body: Body) => client.responses.create({ model, ...body } as OpenAI.Responses.ResponseCreateParamsNonStreaming),
    events: async (body: Body): Promise<Event[]> => {
      const events: Event[] = [];
      for await (const ev of await client.responses.create({
        model,
        ...body,
        stream: true,
      } as OpenAI.Responses.ResponseCreateParamsStreaming))
        events.push(ev);
      return events;
    },
    chat: (body: Body) => client.chat.completions.create({ model, ...body } as OpenAI.ChatCompletionCreateParamsNonStreaming),
    promptTokens: async (body: Body): Promise<number> =>
      ((await postRaw(server.url, "/tokenize", { add_generation_prompt: true, ...body })).body as { count: number }).count,
    client,
  };
}

/** Output items without their random ids, to compare two replies. */
export const withoutIds = (items: readonly object[]) => items.map((i) => ({ ...i, id: undefined, call_id: undefined }));
export const final = (events: Event[]) => (events.at(-1) as { response: Response }).response;
