// Talking to the server: the API key (kept for this tab), JSON requests, and the
// server-sent events of a streamed chat completion.

const KEY = "mlxcore-api-key";

export class AuthError extends Error {}

/** The API key this tab uses ("" for none). */
export function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

function headers(extra) {
  const out = { ...extra };
  const key = apiKey();
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

/** The error message of a failed response, in OpenAI's or Anthropic's shape. */
async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    if (body && body.error && typeof body.error.message === "string") message = body.error.message;
    else if (body && typeof body.error === "string") message = body.error; // Ollama's routes
  } catch (_) {
    // not JSON: keep the status line
  }
  if (response.status === 401) return new AuthError(message);
  return new Error(message);
}

/** Send JSON and call onLine(object) for each line of the NDJSON answer (Ollama's
 * streams, e.g. /api/pull's progress); a line with an `error` ends it with that error. */
export async function streamLines(path, { method = "POST", body, signal } = {}, onLine) {
  const response = await fetch(path, {
    method,
    headers: headers({ "Content-Type": "application/json" }),
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (value) buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf("\n")) >= 0) {
      const text = buffer.slice(0, cut).trim();
      buffer = buffer.slice(cut + 1);
      if (!text) continue;
      const line = JSON.parse(text);
      if (line.error) throw new Error(line.error);
      onLine(line);
    }
    if (done) return;
  }
}

/** GET or POST JSON; throws AuthError on 401 and Error with the server's message otherwise. */
export async function api(path, { method = "GET", body, signal } = {}) {
  const init = { method, headers: headers(body ? { "Content-Type": "application/json" } : {}), signal };
  if (body) init.body = JSON.stringify(body);
  const response = await fetch(path, init);
  if (!response.ok) throw await failure(response);
  return response.json();
}

/**
 * POST a streamed chat completion and call onChunk(chunk) for every JSON event until the
 * stream ends. Aborting `signal` closes the connection, which cancels the request on the
 * server. Resolves with the last chunk's finish reason (or null when the stream ended
 * without one).
 */
export async function streamChat(body, signal, onChunk) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST",
    headers: headers({ "Content-Type": "application/json", Accept: "text/event-stream" }),
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  let finish = null;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = block
        .split(/\r?\n/)
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).replace(/^ /, ""))
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return finish;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "the server ended the stream with an error");
      for (const choice of chunk.choices || []) {
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      onChunk(chunk);
    }
  }
  return finish;
}
