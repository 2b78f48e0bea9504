// GET /load and vLLM's --enable-server-load-tracking: the number of requests in flight on the endpoints that run the
// engine (vLLM's load_aware_call routes), for a load balancer to read. Without the flag /load still answers, 0.
import type { FastifyInstance } from "fastify";

/**
 * The routes whose requests count, as fastify names them: those vLLM decorates with load_aware_call (generation,
 * Responses, Anthropic's Messages, pooling, score and rerank), and /invocations, which vLLM counts through the
 * endpoint it dispatches to.
 */
export const LOAD_TRACKED_ROUTES: ReadonlySet<string> = new Set([
  "/v1/chat/completions", "/v1/completions",
  "/v1/responses", "/v1/responses/:responseId", "/v1/responses/:responseId/cancel",
  "/v1/messages", "/v1/messages/count_tokens",
  "/v1/embeddings", "/pooling", "/classify", "/v1/classify",
  "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank",
  "/invocations",
]);

/** The in-flight count: a request counts from its handler's start until its response ends or its connection closes. */
export class ServerLoad {
  private inFlight = 0;
  constructor(readonly enabled: boolean) {}

  /** vLLM's server_load_metrics: always 0 when tracking is off. */
  get value(): number {
    return this.inFlight;
  }

  /**
   * Registers GET /load and the counting hook. preHandler: after authentication and body parsing, as vLLM counts from
   * its handler's start; the raw response's "close" (sent, errored, streamed to its end, or the client gone) uncounts.
   */
  install(app: FastifyInstance): void {
    app.get("/load", async () => ({ server_load: this.value }));
    if (!this.enabled) return;
    app.addHook("preHandler", async (request, reply) => {
      if (!LOAD_TRACKED_ROUTES.has(request.routeOptions.url ?? "")) return;
      const res = reply.raw;
      if (res.destroyed || res.writableEnded) return; // the client left while the body was read: "close" has fired
      this.inFlight++;
      res.once("close", () => this.inFlight--);
    });
  }
}
