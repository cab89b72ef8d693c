// "Get a model" on the dashboard: a Hugging Face repo pulled through the server's model
// manager (the ollama plugin's /api/pull: the files land in the server's Hugging Face
// cache and the model is served from then on), with the download's progress as it goes;
// and the Remove button of a pulled model (/api/delete).

import { AuthError, api, streamLines } from "./api.js";

const $ = (id) => document.getElementById(id);

function megabytes(n) {
  return `${(n / 1e6).toFixed(1)} MB`;
}

/** Pull `repo`, showing each file's progress; then `done()` (the dashboard's refresh). */
async function pull(repo, done, onAuth) {
  const bar = $("pull-progress");
  const status = $("pull-status");
  const button = $("pull-button");
  button.disabled = true;
  bar.hidden = false;
  bar.value = 0;
  status.textContent = `pulling ${repo}…`;
  try {
    await streamLines("/api/pull", { body: { model: repo, stream: true } }, (line) => {
      if (line.total) {
        bar.value = line.completed / line.total;
        status.textContent = `${line.status}: ${megabytes(line.completed)} of ${megabytes(line.total)}`;
      } else {
        status.textContent = line.status;
      }
    });
    bar.value = 1;
    status.textContent = `${repo}: pulled and served`;
    done();
  } catch (error) {
    status.textContent = `${repo}: ${error.message}`;
    if (error instanceof AuthError) onAuth();
  } finally {
    button.disabled = false;
  }
}

/** The Remove button of a pulled model (its files are deleted on the server). */
export function removeButton(model, done, onAuth) {
  const button = document.createElement("button");
  button.type = "button";
  button.className = "small";
  button.textContent = "Remove";
  button.setAttribute("aria-label", `Remove ${model.id}`);
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      await api("/api/delete", { method: "DELETE", body: { model: model.id } });
      $("pull-status").textContent = `${model.id}: removed`;
    } catch (error) {
      $("pull-status").textContent = `remove ${model.id}: ${error.message}`;
      if (error instanceof AuthError) onAuth();
    }
    done();
  });
  return button;
}

export function initPulls(done, onAuth) {
  $("pull-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const repo = $("pull-repo").value.trim();
    if (repo) pull(repo, done, onAuth);
  });
}
