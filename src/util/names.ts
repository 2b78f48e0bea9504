// Hints for option and parameter names a user spelled wrong.

/**
 * " (did you mean fooBar?)" when `key` is a snake_case spelling of a camelCase name `isKnown` accepts, else "":
 * the hint for vLLM users who write Python's names (max_tokens) where Kiln takes camelCase (maxTokens).
 */
export function camelCaseHint(key: string, isKnown: (name: string) => boolean): string {
  const camel = key.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
  return camel !== key && isKnown(camel) ? ` (did you mean ${camel}?)` : "";
}
