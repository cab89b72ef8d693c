// The chat playground: conversations in local storage, streamed answers, stop, images.

import { AuthError, api, streamChat } from "./api.js";
import { renderMarkdown } from "./markdown.js";

const STORE = "mlxcore-conversations";
const $ = (id) => document.getElementById(id);

let conversations = load();
let current = null; // the open conversation
let running = null; // AbortController of the answer being streamed
let attachments = []; // data: URLs of images for the next message
let onAuth = () => {};

function load() {
  try {
    const saved = JSON.parse(localStorage.getItem(STORE) || "[]");
    return Array.isArray(saved) ? saved : [];
  } catch (_) {
    return [];
  }
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(conversations));
  } catch (_) {
    // storage full or disabled: the conversation stays in this page only
  }
}

function el(tag, text, className) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = text;
  if (className) node.className = className;
  return node;
}

function newConversation() {
  current = { id: crypto.randomUUID(), title: "New chat", created: Date.now(), messages: [] };
  conversations.unshift(current);
  save();
  renderList();
  renderMessages();
}

function renderList() {
  const list = $("conversations");
  list.replaceChildren();
  for (const conversation of conversations) {
    const item = el("li");
    const open = el("button", conversation.title, "conversation");
    open.type = "button";
    open.setAttribute("aria-current", conversation === current ? "true" : "false");
    open.addEventListener("click", () => {
      if (running) return;
      current = conversation;
      renderList();
      renderMessages();
    });
    const remove = el("button", "Delete", "quiet small");
    remove.type = "button";
    remove.setAttribute("aria-label", `Delete conversation ${conversation.title}`);
    remove.addEventListener("click", () => {
      if (running && conversation === current) return;
      conversations = conversations.filter((c) => c !== conversation);
      if (conversation === current) current = conversations[0] || null;
      save();
      if (!current) newConversation();
      renderList();
      renderMessages();
    });
    item.append(open, remove);
    list.append(item);
  }
}

/** One message's element: role, images, reasoning (collapsed), content, tool calls, status. */
function messageView(message) {
  const box = el("article", null, `message ${message.role}`);
  box.append(el("h3", message.role === "user" ? "You" : message.model || "Assistant", "role"));
  for (const url of message.images || []) {
    const img = el("img", null, "attached");
    img.src = url;
    img.alt = "attached image";
    box.append(img);
  }
  if (message.reasoning) {
    const details = el("details", null, "reasoning");
    details.append(el("summary", "Reasoning"));
    details.append(el("div", message.reasoning, "reasoning-text"));
    box.append(details);
  }
  const body = el("div", null, "content");
  if (message.role === "assistant") body.append(renderMarkdown(message.content || ""));
  else body.textContent = message.content;
  box.append(body);
  for (const call of message.tool_calls || []) {
    const block = el("div", null, "tool-call");
    block.append(el("span", `Tool call: ${call.name || "?"}`, "tool-name"));
    block.append(el("pre", call.arguments || ""));
    box.append(block);
  }
  if (message.error) box.append(el("p", message.error, "error"));
  if (message.status) box.append(el("p", message.status, "meta"));
  return box;
}

function renderMessages() {
  const view = $("messages");
  view.replaceChildren(...(current ? current.messages.map(messageView) : []));
  view.scrollTop = view.scrollHeight;
}

function replaceLast(message) {
  const view = $("messages");
  const node = messageView(message);
  if (view.lastElementChild) view.lastElementChild.replaceWith(node);
  else view.append(node);
  view.scrollTop = view.scrollHeight;
}

/** The request's messages: the system prompt, then each turn (images as content parts). */
function requestMessages() {
  const out = [];
  const system = $("system").value.trim();
  if (system) out.push({ role: "system", content: system });
  for (const m of current.messages) {
    if (m.role === "user" && m.images && m.images.length) {
      out.push({
        role: "user",
        content: [
          { type: "text", text: m.content },
          ...m.images.map((url) => ({ type: "image_url", image_url: { url } })),
        ],
      });
    } else if (m.role === "user" || (m.role === "assistant" && m.content)) {
      out.push({ role: m.role, content: m.content });
    }
  }
  return out;
}

function parameters() {
  const body = {};
  const temperature = parseFloat($("temperature").value);
  if (Number.isFinite(temperature)) body.temperature = temperature;
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (Number.isFinite(maxTokens) && maxTokens > 0) body.max_tokens = maxTokens;
  const thinking = $("thinking").value;
  if (thinking) body.chat_template_kwargs = { enable_thinking: thinking === "on" };
  const budget = parseInt($("thinking-budget").value, 10);
  if (Number.isFinite(budget) && budget >= 0) body.thinking_token_budget = budget;
  return body;
}

function setRunning(controller) {
  running = controller;
  $("send").disabled = Boolean(controller);
  $("stop").disabled = !controller;
  $("model").disabled = Boolean(controller);
}

async function send() {
  const text = $("prompt").value;
  if (running || (!text.trim() && !attachments.length)) return;
  if (!current) newConversation();
  const model = $("model").value;
  current.messages.push({ role: "user", content: text, images: attachments });
  if (current.title === "New chat") current.title = text.trim().slice(0, 40) || "Image";
  $("prompt").value = "";
  attachments = [];
  $("attachments").textContent = "";
  $("image").value = "";
  const answer = { role: "assistant", model, content: "", reasoning: "", tool_calls: [] };
  const body = { model, messages: requestMessages(), ...parameters() };
  current.messages.push(answer);
  save();
  renderList();
  renderMessages();

  const controller = new AbortController();
  setRunning(controller);
  const started = performance.now();
  let firstAt = null;
  let usage = null;
  let pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      replaceLast(answer);
    });
  };
  try {
    const finish = await streamChat(body, controller.signal, (chunk) => {
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if ((delta.content || delta.reasoning_content) && firstAt === null) firstAt = performance.now();
        if (delta.content) answer.content += delta.content;
        if (delta.reasoning_content) answer.reasoning += delta.reasoning_content;
        for (const call of delta.tool_calls || []) {
          const slot = (answer.tool_calls[call.index ?? 0] ||= { name: "", arguments: "" });
          if (call.function && call.function.name) slot.name = call.function.name;
          if (call.function && call.function.arguments) slot.arguments += call.function.arguments;
        }
      }
      redraw();
    });
    answer.status = describe(finish, usage, started, firstAt);
  } catch (error) {
    if (controller.signal.aborted) {
      answer.status = "stopped";
    } else {
      answer.error = error.message;
      if (error instanceof AuthError) onAuth();
    }
  } finally {
    setRunning(null);
    save();
    replaceLast(answer);
  }
}

function describe(finish, usage, started, firstAt) {
  const parts = [finish ? `finish: ${finish}` : "the stream ended without a finish reason"];
  if (usage) {
    parts.push(`${usage.completion_tokens} tokens`);
    const cached = usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens;
    if (cached) parts.push(`${cached} of ${usage.prompt_tokens} prompt tokens cached`);
  }
  if (firstAt !== null) {
    parts.push(`first token ${((firstAt - started) / 1000).toFixed(2)} s`);
    const seconds = (performance.now() - firstAt) / 1000;
    if (usage && usage.completion_tokens > 1 && seconds > 0)
      parts.push(`${((usage.completion_tokens - 1) / seconds).toFixed(1)} tokens/s`);
  }
  return parts.join(" · ");
}

function exportConversations() {
  const blob = new Blob([JSON.stringify(conversations, null, 2)], { type: "application/json" });
  const link = document.createElement("a");
  link.href = URL.createObjectURL(blob);
  link.download = `mlxcore-conversations-${new Date().toISOString().slice(0, 19)}.json`;
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

function readImages(files) {
  for (const file of files) {
    const reader = new FileReader();
    reader.addEventListener("load", () => {
      attachments.push(reader.result);
      $("attachments").textContent = `${attachments.length} image(s) attached`;
    });
    reader.readAsDataURL(file);
  }
}

/** Fill the model picker from /v1/models (generation models, with their state). */
export async function loadModels() {
  const select = $("model");
  const chosen = select.value;
  const { data } = await api("/v1/models");
  select.replaceChildren();
  for (const model of data) {
    if (model.task && model.task !== "generate") continue;
    const option = el("option", `${model.id} (${(model.state || "").replace("_", " ")})`);
    option.value = model.id;
    select.append(option);
  }
  if (chosen && [...select.options].some((o) => o.value === chosen)) select.value = chosen;
}

export function initChat(authNeeded) {
  onAuth = authNeeded;
  current = conversations[0] || null;
  if (!current) newConversation();
  renderList();
  renderMessages();
  $("new-chat").addEventListener("click", () => running || newConversation());
  $("export").addEventListener("click", exportConversations);
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    send();
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  $("stop").addEventListener("click", () => running && running.abort());
  $("image").addEventListener("change", (event) => readImages(event.target.files));
}
