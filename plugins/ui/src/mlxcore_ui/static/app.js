// The page's entry point: the three views (chat, dashboard, models), the API key
// dialog, start-up.

import { AuthError, apiKey, setApiKey } from "./api.js";
import { initChat, loadModels } from "./chat.js";
import { initDashboard, refresh, startDashboard, stopDashboard } from "./dashboard.js";

const $ = (id) => document.getElementById(id);

const VIEWS = ["chat", "dashboard", "models"];

function show(view) {
  for (const name of VIEWS) {
    $(`view-${name}`).hidden = name !== view;
    $(`tab-${name}`).setAttribute("aria-pressed", String(name === view));
  }
  // the dashboard and the models view read the same polled sources
  if (view === "chat") stopDashboard();
  else startDashboard();
  history.replaceState(null, "", `#${view}`);
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
$("tab-models").addEventListener("click", () => show("models"));
$("key-button").addEventListener("click", askForKey);
$("key-form").addEventListener("submit", (event) => {
  event.preventDefault();
  setApiKey($("key-input").value.trim());
  $("key-dialog").close();
  start();
  if ($("view-chat").hidden) {
    startDashboard();
    refresh();
  }
});
$("key-cancel").addEventListener("click", () => $("key-dialog").close());
show(VIEWS.includes(location.hash.slice(1)) ? location.hash.slice(1) : "chat");
start();
