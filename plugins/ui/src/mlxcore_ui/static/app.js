// The page's entry point: the two views, the API key dialog, start-up.

import { AuthError, apiKey, setApiKey } from "./api.js";
import { initChat, loadModels } from "./chat.js";
import { initDashboard, refresh, startDashboard, stopDashboard } from "./dashboard.js";

const $ = (id) => document.getElementById(id);

function show(view) {
  const chat = view === "chat";
  $("view-chat").hidden = !chat;
  $("view-dashboard").hidden = chat;
  $("tab-chat").setAttribute("aria-pressed", String(chat));
  $("tab-dashboard").setAttribute("aria-pressed", String(!chat));
  if (chat) stopDashboard();
  else startDashboard();
  history.replaceState(null, "", chat ? "#chat" : "#dashboard");
}

function askForKey() {
  const dialog = $("key-dialog");
  if (dialog.open) return;
  $("key-input").value = apiKey();
  dialog.showModal();
  $("key-input").focus();
}

async function start() {
  try {
    await loadModels();
  } catch (error) {
    if (error instanceof AuthError) askForKey();
  }
}

initChat(askForKey);
initDashboard(askForKey);
$("tab-chat").addEventListener("click", () => show("chat"));
$("tab-dashboard").addEventListener("click", () => show("dashboard"));
$("key-button").addEventListener("click", askForKey);
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setApiKey($("key-input").value.trim());
  $("key-dialog").close();
  start();
  if (!$("view-dashboard").hidden) {
    startDashboard();
    refresh();
  }
});
$("key-cancel").addEventListener("click", () => $("key-dialog").close());
show(location.hash === "#dashboard" ? "dashboard" : "chat");
start();
