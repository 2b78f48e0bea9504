// Whether the outside oracle node-llama-cpp (an optional dependency) is installed: tests against it skip otherwise.
import { createRequire } from "node:module";

export const hasLlamaCpp = ((): boolean => {
  try {
    createRequire(import.meta.url).resolve("node-llama-cpp");
    return true;
  } catch {
    return false;
  }
})();
