// The methods each route of a Fastify app answers, for the 405 with Allow that vLLM's Starlette router gives a known
// path asked with another method (the server's and the router's not-found handlers).
import type { FastifyInstance } from "fastify";

/** A URL whose path loses its trailing slashes ("/v1/models/?a=1" is "/v1/models?a=1"; "/" and the query stay). */
export const withoutTrailingSlash = (url: string): string => url.replace(/^([^?]*?[^/?])\/+(?=\?|$)/, "$1");

/**
 * Records the routes `app` registers from now on; the returned lookup gives the methods (HEAD and OPTIONS aside) a
 * path answers, a trailing slash ignored, as the apps route it: empty for an unknown path.
 */
export function routeMethods(app: FastifyInstance): (path: string) => string[] {
  const byPath = new Map<string, Set<string>>();
  app.addHook("onRoute", (route) => {
    const methods = byPath.get(route.url) ?? new Set<string>();
    for (const m of Array.isArray(route.method) ? route.method : [route.method]) if (m !== "HEAD" && m !== "OPTIONS") methods.add(m);
    byPath.set(route.url, methods);
  });
  return (path) => [...(byPath.get(withoutTrailingSlash(path)) ?? [])];
}
